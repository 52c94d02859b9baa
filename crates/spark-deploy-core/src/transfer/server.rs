//! The head's file server: an allow-list of files, bound to one address, behind a bearer token.
//!
//! Stopping it ([`FileServer::stop_transfers`], or dropping it) resets every connection at once
//! (`SO_LINGER` 0: bytes still in the socket buffers are discarded, not delivered), so no pull
//! outlives the run that started it: the worker's `curl` fails immediately and its partial file
//! stays for the next run to resume.
//!
//! A whole allowed file is sent by the kernel ([`send_file`]); files still being written, and
//! everything else, go through the router.

mod send_file;

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::{Path as UrlPath, State};
use axum::http::{Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt as _;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tower::ServiceExt as _;
use tower_http::services::ServeFile;

use super::TransferError;
use crate::secret::Secret;

/// A file still being written: its final size, and its final start as it grows. It is held
/// open from the moment it is allowed: a request that arrives after the writer renamed it (a
/// slow worker, a loaded head) is still answered from the same file.
#[derive(Clone)]
struct Growing {
    path: PathBuf,
    file: Arc<std::fs::File>,
    size: u64,
    ready: tokio::sync::watch::Receiver<u64>,
}

struct Shared {
    token: Secret,
    files: std::sync::RwLock<HashMap<String, PathBuf>>,
    growing: std::sync::RwLock<HashMap<String, Growing>>,
    /// Per served file: the offset its last response started at, and the bytes sent since.
    sent: std::sync::Mutex<HashMap<PathBuf, (u64, Arc<std::sync::atomic::AtomicU64>)>>,
}

/// A running file server; stops when dropped.
pub struct FileServer {
    addr: SocketAddr,
    token: Secret,
    shared: Arc<Shared>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    stop_transfers: tokio::sync::watch::Sender<bool>,
}

impl FileServer {
    /// Serves nothing yet on `bind` (port 0 picks one) with a fresh random token; see [`Self::allow`].
    ///
    /// # Errors
    ///
    /// [`TransferError::Bind`].
    pub async fn start(bind: SocketAddr) -> Result<Self, TransferError> {
        let token = Secret::new(random_token());
        let listener = tokio::net::TcpListener::bind(bind)
            .await
            .map_err(|source| TransferError::Bind {
                addr: bind.to_string(),
                source,
            })?;
        let addr = listener
            .local_addr()
            .map_err(|source| TransferError::Bind {
                addr: bind.to_string(),
                source,
            })?;
        let (stop_transfers, stopped) = tokio::sync::watch::channel(false);
        let shared = Arc::new(Shared {
            token: token.clone(),
            files: std::sync::RwLock::new(HashMap::new()),
            growing: std::sync::RwLock::new(HashMap::new()),
            sent: std::sync::Mutex::new(HashMap::new()),
        });
        let app = axum::Router::new()
            .route("/f/{id}", axum::routing::get(serve))
            .route("/g/{id}", axum::routing::get(follow))
            .with_state(Arc::clone(&shared));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let (routed, conns) = tokio::sync::mpsc::channel(64);
        tokio::spawn(accept(
            listener,
            Arc::clone(&shared),
            stopped.clone(),
            routed,
        ));
        let listener = StoppableListener {
            conns,
            addr,
            stopped,
        };
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = rx.await;
                })
                .await;
        });
        Ok(Self {
            addr,
            token,
            shared,
            stop: Some(tx),
            stop_transfers,
        })
    }

    /// Resets every connection, including responses still being sent, and every new one (the
    /// listener closes when the server is dropped).
    pub fn stop_transfers(&self) {
        let _ = self.stop_transfers.send(true);
    }

    /// The bound address.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The per-run token.
    #[must_use]
    pub fn token(&self) -> &Secret {
        &self.token
    }

    /// How far each file served so far has gone: the offset of its last response (a resumed
    /// pull starts past 0) plus the bytes sent since — the receiver's position, within its socket
    /// buffers.
    #[must_use]
    pub fn positions(&self) -> Vec<(PathBuf, u64)> {
        self.shared
            .sent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|(p, (start, n))| {
                (
                    p.clone(),
                    start + n.load(std::sync::atomic::Ordering::Relaxed),
                )
            })
            .collect()
    }

    /// Bytes sent by the last response for each file served so far, summed (a resumed pull counts
    /// only what it moved).
    #[must_use]
    pub fn bytes_served(&self) -> u64 {
        self.shared
            .sent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .values()
            .map(|(_, n)| n.load(std::sync::atomic::Ordering::Relaxed))
            .sum()
    }

    /// Adds `path` to the allow-list; returns its URL. A file allowed again (a second transfer
    /// through the same server) has no position until it is requested again: the last one was
    /// the end of the earlier transfer, not where this one stands.
    #[must_use]
    pub fn allow(&self, path: PathBuf) -> String {
        self.shared
            .sent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&path);
        let id = register(&self.shared.files, path);
        format!("http://{}/f/{id}", self.addr)
    }

    /// Adds `path`, a file of `size` bytes still being written whose first `ready` bytes are
    /// final, to the allow-list; returns its URL. A request for it (from `Range: bytes=<start>-`,
    /// else 0) is answered with the whole rest of the file: each byte is sent once it is final,
    /// the response waiting as long as the file grows. When `ready`'s sender is dropped before the
    /// file reached its size, the response breaks off (the receiver keeps what arrived). The file
    /// is opened now and served from that opening, wherever the writer renames it meanwhile.
    ///
    /// # Errors
    ///
    /// [`TransferError::Source`] when `path` cannot be opened.
    pub fn allow_growing(
        &self,
        path: PathBuf,
        size: u64,
        ready: tokio::sync::watch::Receiver<u64>,
    ) -> Result<String, TransferError> {
        let file = match std::fs::File::open(&path) {
            Ok(f) => Arc::new(f),
            Err(source) => return Err(TransferError::Source { path, source }),
        };
        let id = register(
            &self.shared.growing,
            Growing {
                path,
                file,
                size,
                ready,
            },
        );
        Ok(format!("http://{}/g/{id}", self.addr))
    }
}

/// Adds `entry` to `table` under the next free id; the id.
fn register<T>(table: &std::sync::RwLock<HashMap<String, T>>, entry: T) -> String {
    let mut table = table
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let id = table.len().to_string();
    table.insert(id.clone(), entry);
    id
}

/// The entry of `table` that `id` names, when `req` carries the server's token; else the
/// status that refuses it (401, or 404 for an id never allowed).
fn lookup<T: Clone>(
    s: &Shared,
    req: &Request<Body>,
    table: &std::sync::RwLock<HashMap<String, T>>,
    id: &str,
) -> Result<T, StatusCode> {
    if !authorised(s, req) {
        return Err(StatusCode::UNAUTHORIZED);
    }
    table
        .read()
        .ok()
        .and_then(|t| t.get(id).cloned())
        .ok_or(StatusCode::NOT_FOUND)
}

impl Drop for FileServer {
    fn drop(&mut self) {
        self.stop_transfers();
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

fn random_token() -> String {
    let mut b = [0u8; 24];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .is_err()
    {
        // Still unguessable enough for a per-run token bound to a private link.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        b[..16].copy_from_slice(&t.to_le_bytes());
    }
    hex::encode(b)
}

/// Bytes per read of a served file.
const READ_CHUNK: usize = 1 << 20;

/// Whether `req` carries the server's token.
fn authorised(s: &Shared, req: &Request<Body>) -> bool {
    token_matches(
        s,
        req.headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok()),
    )
}

/// Whether an `Authorization` header's value is the server's bearer token.
fn token_matches(s: &Shared, authorization: Option<&str>) -> bool {
    authorization
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|t| t == s.token.expose())
}

/// A byte counter for `path`'s response starting at `start` (see [`FileServer::positions`]).
fn count_from(s: &Shared, path: PathBuf, start: u64) -> Arc<std::sync::atomic::AtomicU64> {
    let n = Arc::new(std::sync::atomic::AtomicU64::new(0));
    s.sent
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .insert(path, (start, Arc::clone(&n)));
    n
}

async fn serve(
    State(s): State<Arc<Shared>>,
    UrlPath(id): UrlPath<String>,
    req: Request<Body>,
) -> Response {
    let path = match lookup(&s, &req, &s.files, &id) {
        Ok(path) => path,
        Err(refused) => return refused.into_response(),
    };
    // 1 MiB reads (the default is 64 KiB): each read is a blocking-pool round trip, and with
    // several workers pulling at once their per-chunk cost is what the head's cores spend.
    match ServeFile::new(path.clone())
        .with_buf_chunk_size(READ_CHUNK)
        .oneshot(req)
        .await
    {
        Ok(r) => {
            let (parts, body) = r.into_parts();
            let start = range_start(&parts.headers);
            let n = count_from(&s, path, start);
            let counted = Body::new(body).into_data_stream().inspect(move |chunk| {
                if let Ok(c) = chunk {
                    n.fetch_add(c.len() as u64, std::sync::atomic::Ordering::Relaxed);
                }
            });
            Response::from_parts(parts, Body::from_stream(counted))
        }
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// Serves a growing file ([`FileServer::allow_growing`]) from the requested start to its end.
async fn follow(
    State(s): State<Arc<Shared>>,
    UrlPath(id): UrlPath<String>,
    req: Request<Body>,
) -> Response {
    let g = match lookup(&s, &req, &s.growing, &id) {
        Ok(g) => g,
        Err(refused) => return refused.into_response(),
    };
    let start = req
        .headers()
        .get(header::RANGE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("bytes="))
        .and_then(|v| v.strip_suffix('-'))
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    if start >= g.size {
        return (
            StatusCode::RANGE_NOT_SATISFIABLE,
            [(header::CONTENT_RANGE, format!("bytes */{}", g.size))],
        )
            .into_response();
    }
    let sent = count_from(&s, g.path.clone(), start);
    let (size, ready) = (g.size, g.ready);
    let body = futures::stream::unfold(
        Follower {
            file: g.file,
            pos: start,
            size,
            ready,
            sent,
        },
        Follower::next_chunk,
    );
    let status = if start > 0 {
        StatusCode::PARTIAL_CONTENT
    } else {
        StatusCode::OK
    };
    (
        status,
        [
            (header::CONTENT_LENGTH, (size - start).to_string()),
            (
                header::CONTENT_RANGE,
                format!("bytes {start}-{}/{size}", size - 1),
            ),
        ],
        Body::from_stream(body),
    )
        .into_response()
}

/// Where a growing file's response stands.
struct Follower {
    file: Arc<std::fs::File>,
    pos: u64,
    size: u64,
    ready: tokio::sync::watch::Receiver<u64>,
    sent: Arc<std::sync::atomic::AtomicU64>,
}

impl Follower {
    /// The next final bytes past `pos`, waiting for them as long as the file grows; `None` at
    /// the end. An error ends the response short (the file stopped growing, or a read failed).
    async fn next_chunk(mut self) -> Option<(std::io::Result<bytes::Bytes>, Self)> {
        loop {
            if self.pos >= self.size {
                return None;
            }
            let ready = (*self.ready.borrow_and_update()).min(self.size);
            if self.pos < ready {
                let want = usize::try_from((ready - self.pos).min(READ_CHUNK as u64))
                    .unwrap_or(READ_CHUNK);
                // Positioned reads off the async threads: several responses may share the file.
                let (file, at) = (Arc::clone(&self.file), self.pos);
                let read = tokio::task::spawn_blocking(move || {
                    let mut buf = vec![0u8; want];
                    std::os::unix::fs::FileExt::read_exact_at(&*file, &mut buf, at).map(|()| buf)
                })
                .await
                .unwrap_or_else(|e| Err(std::io::Error::other(e)));
                return Some(match read {
                    Ok(buf) => {
                        self.pos += want as u64;
                        self.sent
                            .fetch_add(want as u64, std::sync::atomic::Ordering::Relaxed);
                        (Ok(bytes::Bytes::from(buf)), self)
                    }
                    Err(e) => {
                        self.pos = self.size;
                        (Err(e), self)
                    }
                });
            }
            if self.ready.changed().await.is_err() {
                let e = std::io::Error::other(format!(
                    "the file stopped growing at {ready} of {} bytes",
                    self.size
                ));
                self.pos = self.size;
                return Some((Err(e), self));
            }
        }
    }
}

/// The first byte a response serves: `Content-Range: bytes <start>-<end>/<size>`, else 0.
fn range_start(headers: &axum::http::HeaderMap) -> u64 {
    headers
        .get(header::CONTENT_RANGE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("bytes "))
        .and_then(|v| v.split('-').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Accepts the server's connections until the router is gone: one whose first request is for a
/// whole allowed file is answered by [`send_file`], every other one goes to the router.
async fn accept(
    listener: tokio::net::TcpListener,
    shared: Arc<Shared>,
    stopped: tokio::sync::watch::Receiver<bool>,
    routed: tokio::sync::mpsc::Sender<(tokio::net::TcpStream, SocketAddr)>,
) {
    loop {
        let (stream, addr) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                // Out of file descriptors and the like: wait instead of spinning.
                Err(_) => {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = routed.closed() => return,
        };
        // The response's head, then the body: without this, the body's last short segment can
        // wait for the worker's delayed ACK (tens of ms per file; it shows on small files).
        let _ = stream.set_nodelay(true);
        let (shared, mut stopped, routed) = (Arc::clone(&shared), stopped.clone(), routed.clone());
        tokio::spawn(async move {
            let is_file = tokio::select! {
                f = send_file::is_file_request(&stream) => f,
                _ = stopped.wait_for(|s| *s) => return,
            };
            if is_file {
                send_file::respond(stream, shared, stopped).await;
            } else {
                let _ = routed.send((stream, addr)).await;
            }
        });
    }
}

/// The router's listener: the connections [`accept`] passes on; they reset once `stopped` is
/// `true`.
struct StoppableListener {
    conns: tokio::sync::mpsc::Receiver<(tokio::net::TcpStream, SocketAddr)>,
    addr: SocketAddr,
    stopped: tokio::sync::watch::Receiver<bool>,
}

impl axum::serve::Listener for StoppableListener {
    type Io = StoppableStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let Some((stream, addr)) = self.conns.recv().await else {
            // The accepting task is gone only with the server: nothing more comes.
            return std::future::pending().await;
        };
        let mut rx = self.stopped.clone();
        let stopped = Box::pin(async move {
            // A dropped sender means the server is gone: stop as well.
            let _ = rx.wait_for(|s| *s).await;
        });
        (
            StoppableStream {
                stream,
                stopped,
                is_stopped: false,
            },
            addr,
        )
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.addr)
    }
}

/// A connection that fails every read and write, and resets, once its server stopped. The stop
/// signal wakes the connection's task even while it waits for a full socket buffer to drain.
struct StoppableStream {
    stream: tokio::net::TcpStream,
    stopped: Pin<Box<dyn Future<Output = ()> + Send>>,
    /// `stopped` has completed (a completed future must not be polled again).
    is_stopped: bool,
}

impl StoppableStream {
    /// `Err` (after arranging a reset on close) once the server stopped.
    fn check(&mut self, cx: &mut Context<'_>) -> std::io::Result<()> {
        if !self.is_stopped && self.stopped.as_mut().poll(cx).is_pending() {
            return Ok(());
        }
        self.is_stopped = true;
        // Closing now sends RST and drops unsent bytes, rather than delivering the buffer.
        let _ = self.stream.set_zero_linger();
        Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionAborted,
            "the file server stopped",
        ))
    }
}

impl AsyncRead for StoppableStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        self.check(cx)?;
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for StoppableStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.check(cx)?;
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.check(cx)?;
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.check(cx)?;
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every read and write after the stop fails, however often the connection is polled (the
    /// stop signal, a completed future, is never polled again: that panicked).
    #[tokio::test]
    async fn a_stopped_connection_fails_every_poll_without_polling_the_stop_again() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = tokio::net::TcpStream::connect(listener.local_addr().unwrap());
        let ((stream, _), _client) =
            tokio::join!(async { listener.accept().await.unwrap() }, async {
                client.await.unwrap()
            });
        let mut conn = StoppableStream {
            stream,
            stopped: Box::pin(async {}),
            is_stopped: false,
        };
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        for _ in 0..3 {
            let e = conn.check(&mut cx).unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::ConnectionAborted);
        }
    }

    #[tokio::test]
    async fn positions_count_from_the_served_range_start() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("blob.bin");
        std::fs::write(&path, vec![7u8; 2_000_000]).unwrap();
        let server = FileServer::start("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let url = server.allow(path.clone());
        assert!(server.positions().is_empty(), "nothing served yet");
        let body = reqwest::Client::new()
            .get(&url)
            .bearer_auth(server.token().expose())
            .header("Range", "bytes=500000-")
            .send()
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        assert_eq!(body.len(), 1_500_000);
        // A resumed pull's position counts from where it resumed.
        assert_eq!(server.positions(), vec![(path.clone(), 2_000_000)]);
        // Allowed again for a second transfer, it has no position until it is requested again.
        let _ = server.allow(path);
        assert!(
            server.positions().is_empty(),
            "a file allowed again kept the end of the earlier transfer as its position"
        );
    }
}
