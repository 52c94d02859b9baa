//! The link between the ranks (docs/engine-contract.md, "Rendezvous"): one TCP connection with
//! `TCP_NODELAY`, u32-LE length-prefixed frames `[kind u8][step u64 LE][fields]`.
//!
//! Rank 0 binds `TF_TP_MASTER:TF_TP_PORT`, accepts once with no timeout and closes the listener.
//! Rank 1 retries its connect every 250 ms for a bounded time (300 s, or
//! `TF_STANDIN_CONNECT_TIMEOUT_S`), then fails with `ConnectFailed`. Rank 1's receive limit is
//! `(pool + 1)·4 + 64 KiB`; rank 0's first frame carries `(context + 1)·4` bytes, so a rank 0 with
//! a larger pool makes rank 1 fail with `FrameTooLong` (the only "check" the engine has).

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Frame kinds (the engine's, plus the stand-in's own `init`, `partials` and `ack`).
pub mod kind {
    /// Prompt fill start.
    pub const FILL_BEGIN: u8 = 0;
    /// One decode pass (the stand-in sends one per request).
    pub const PASS: u8 = 3;
    /// Image span rows.
    pub const FILL_IMAGES: u8 = 7;
    /// Clean shutdown.
    pub const DONE: u8 = 8;
    /// Stand-in: rank 0's first frame (proof tensor list + pool-sized payload).
    pub const INIT: u8 = 0x10;
    /// Stand-in: rank 1's split-proof partials.
    pub const PARTIALS: u8 = 0x11;
    /// Stand-in: rank 1's acknowledgement of a primitive.
    pub const ACK: u8 = 0x80;
    /// Kinds rank 1 follows.
    pub const FOLLOWED: &[u8] = &[0, 1, 2, 3, 4, 5, 6, 7, 8, INIT];
}

/// A link failure, named as the engine names it.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The peer closed the connection or it broke.
    #[error("PeerDown")]
    PeerDown,
    /// A frame longer than the receive buffer.
    #[error("FrameTooLong")]
    FrameTooLong {
        /// The frame's length.
        len: u64,
        /// The limit.
        limit: u64,
    },
    /// A frame of an unknown kind, or too short.
    #[error("BadFrame")]
    BadFrame,
    /// A frame with an unexpected step.
    #[error("OutOfStep")]
    OutOfStep {
        /// The step expected.
        expected: u64,
        /// The step received.
        got: u64,
    },
    /// Rank 1 could not reach rank 0 in time.
    #[error("ConnectFailed")]
    ConnectFailed {
        /// The address.
        addr: SocketAddr,
        /// How long it tried.
        secs: u64,
    },
    /// The ranks use different numbers of RDMA devices (`rdma.zig connect`: `ri.devices != r.nd`).
    #[error("BadInfo")]
    BadInfo {
        /// This rank's device count.
        ours: usize,
        /// The peer's.
        theirs: usize,
    },
    /// Rank 0 could not bind its rendezvous address.
    #[error("BindFailed")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        source: std::io::Error,
    },
}

impl LinkError {
    /// The engine's name for the error (what rank 1 prints in its `follow` line).
    #[must_use]
    pub fn name(&self) -> &'static str {
        match self {
            Self::PeerDown => "PeerDown",
            Self::FrameTooLong { .. } => "FrameTooLong",
            Self::BadFrame => "BadFrame",
            Self::OutOfStep { .. } => "OutOfStep",
            Self::ConnectFailed { .. } => "ConnectFailed",
            Self::BadInfo { .. } => "BadInfo",
            Self::Bind { .. } => "BindFailed",
        }
    }

    /// A message with context.
    #[must_use]
    pub fn detail(&self) -> String {
        match self {
            Self::FrameTooLong { len, limit } => format!(
                "FrameTooLong: a {len}-byte frame exceeds the {limit}-byte receive buffer ((pool + 1)·4 + 64 KiB); rank 0's --context is larger than rank 1's --pool"
            ),
            Self::OutOfStep { expected, got } => {
                format!("OutOfStep: expected step {expected}, got {got}")
            }
            Self::ConnectFailed { addr, secs } => {
                format!("ConnectFailed: no rank 0 listening on {addr} within {secs} s")
            }
            Self::Bind { addr, source } => format!("BindFailed: cannot bind {addr}: {source}"),
            Self::BadInfo { ours, theirs } => format!(
                "BadInfo: this rank has {ours} RDMA devices, the peer {theirs} (TF_RDMA_DEVICES / --rdma must list the same count on both ranks)"
            ),
            other => other.name().to_owned(),
        }
    }
}

/// Rank 1's receive limit: `(pool + 1)·4 + 64 KiB`.
#[must_use]
pub fn rank1_limit(pool: u64) -> u64 {
    (pool + 1) * 4 + 64 * 1024
}

/// Encodes a frame payload `[kind][step][fields]`.
#[must_use]
pub fn payload(kind: u8, step: u64, fields: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(9 + fields.len());
    v.push(kind);
    v.extend_from_slice(&step.to_le_bytes());
    v.extend_from_slice(fields);
    v
}

/// Splits a payload into `(kind, step, fields)`.
///
/// # Errors
/// [`LinkError::BadFrame`] for a payload shorter than 9 bytes.
pub fn split_payload(p: &[u8]) -> Result<(u8, u64, &[u8]), LinkError> {
    if p.len() < 9 {
        return Err(LinkError::BadFrame);
    }
    let mut s = [0u8; 8];
    s.copy_from_slice(&p[1..9]);
    Ok((p[0], u64::from_le_bytes(s), &p[9..]))
}

fn io_down(_: std::io::Error) -> LinkError {
    LinkError::PeerDown
}

/// Rank 1's connect: retries every 250 ms until `timeout`.
///
/// # Errors
/// [`LinkError::ConnectFailed`].
pub fn connect(master: Ipv4Addr, port: u16, timeout: Duration) -> Result<TcpStream, LinkError> {
    let addr = SocketAddr::from((master, port));
    let start = Instant::now();
    loop {
        if let Ok(s) = TcpStream::connect_timeout(&addr, Duration::from_millis(1000)) {
            let _ = s.set_nodelay(true);
            return Ok(s);
        }
        if start.elapsed() >= timeout {
            return Err(LinkError::ConnectFailed {
                addr,
                secs: timeout.as_secs(),
            });
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Reads one frame (blocking), refusing frames longer than `limit` before reading them.
///
/// # Errors
/// [`LinkError::PeerDown`], [`LinkError::FrameTooLong`].
pub fn read_frame(s: &mut TcpStream, limit: u64) -> Result<Vec<u8>, LinkError> {
    let mut n = [0u8; 4];
    s.read_exact(&mut n).map_err(io_down)?;
    let len = u64::from(u32::from_le_bytes(n));
    if len > limit {
        return Err(LinkError::FrameTooLong { len, limit });
    }
    let mut buf = vec![0u8; len as usize];
    s.read_exact(&mut buf).map_err(io_down)?;
    Ok(buf)
}

/// Writes one frame (blocking).
///
/// # Errors
/// [`LinkError::PeerDown`].
pub fn write_frame(s: &mut TcpStream, payload: &[u8]) -> Result<(), LinkError> {
    let len = u32::try_from(payload.len()).map_err(|_| LinkError::BadFrame)?;
    s.write_all(&len.to_le_bytes()).map_err(io_down)?;
    s.write_all(payload).map_err(io_down)?;
    s.flush().map_err(io_down)
}

/// Rank 0's rendezvous: bind, accept once (no timeout), close the listener.
///
/// # Errors
/// [`LinkError::Bind`]; [`LinkError::PeerDown`] when accept fails.
pub async fn accept_once(master: Ipv4Addr, port: u16) -> Result<tokio::net::TcpStream, LinkError> {
    let addr = SocketAddr::from((master, port));
    let l = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| LinkError::Bind { addr, source })?;
    let (s, _) = l.accept().await.map_err(io_down)?;
    drop(l);
    let _ = s.set_nodelay(true);
    Ok(s)
}

/// Reads one frame (async).
///
/// # Errors
/// [`LinkError::PeerDown`], [`LinkError::FrameTooLong`].
pub async fn read_frame_async(
    s: &mut tokio::net::TcpStream,
    limit: u64,
) -> Result<Vec<u8>, LinkError> {
    let mut n = [0u8; 4];
    s.read_exact(&mut n).await.map_err(io_down)?;
    let len = u64::from(u32::from_le_bytes(n));
    if len > limit {
        return Err(LinkError::FrameTooLong { len, limit });
    }
    let mut buf = vec![0u8; len as usize];
    s.read_exact(&mut buf).await.map_err(io_down)?;
    Ok(buf)
}

/// Writes one frame (async).
///
/// # Errors
/// [`LinkError::PeerDown`].
pub async fn write_frame_async(
    s: &mut tokio::net::TcpStream,
    payload: &[u8],
) -> Result<(), LinkError> {
    let len = u32::try_from(payload.len()).map_err(|_| LinkError::BadFrame)?;
    s.write_all(&len.to_le_bytes()).await.map_err(io_down)?;
    s.write_all(payload).await.map_err(io_down)?;
    s.flush().await.map_err(io_down)
}
