//! HF-compatible hub server for the testbed.
//!
//! Serves repositories from a directory tree (`<root>/<owner>/<name>/`, the files of one commit)
//! at a pinned revision: a 40-hex commit sha computed from the content, plus the branch `main`.
//! It speaks the endpoints the Rust `hf-hub` 1.0 client and the Python `huggingface_hub` client use
//! (the route table is in `routes.rs`): repo info with siblings, the tree listing, and `resolve` with
//! `ETag` / `X-Linked-Etag` / `X-Linked-Size` / `X-Repo-Commit` headers, `Range` (206 with
//! `Content-Range`, 416), `If-None-Match` (304), and optionally the Hub's 302 redirect of LFS files
//! to a blob URL. Gated repositories answer 401/403 with `X-Error-Code: GatedRepo` on `resolve`
//! without the right bearer token (their info and file list stay public, as on the Hub). Private
//! repositories answer `X-Error-Code: RepoNotFound` everywhere without their token.
//!
//! A fault switch ([`HubServer::set_fault`]) cuts or stalls transfers, a rate limit
//! ([`HubOptions::rate_limit`]) makes every transfer take its time, a link rate
//! ([`HubOptions::link_rate`]) caps all of them together, and a request log
//! ([`HubServer::requests`], and `GET /_testbed/requests` for a hub in another process) lets tests
//! see which ranges were asked for and how many bytes were sent.
//!
//! The server runs on its own thread and runtime, so it works from sync and async tests alike, and
//! stops when [`HubServer::stop`] is called or the handle is dropped.

mod api;
mod fault;
mod files;
mod range;
pub mod repo;
mod routes;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::num::NonZeroU64;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use fault::{Fault, FaultRule, RequestRecord};
pub use repo::{Repo, RepoFile};

/// Errors of the hub server.
#[derive(Debug, thiserror::Error)]
pub enum HubServerError {
    /// A repository directory or file could not be read.
    #[error("cannot read repository tree at {path}")]
    Scan {
        /// The path that failed.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The listening socket could not be bound.
    #[error("cannot bind the hub server to {addr}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The server thread or runtime could not be started.
    #[error("cannot start the hub server runtime")]
    Runtime(#[source] std::io::Error),
}

/// Options of the hub server.
#[derive(Clone, Default)]
pub struct HubOptions {
    /// Gated repositories: `owner/name` → the bearer token that unlocks it.
    pub gated: HashMap<String, String>,
    /// Private repositories: `owner/name` → the bearer token that can see it. Without it every
    /// endpoint answers `RepoNotFound` (401 without a token, 404 with a wrong one), as the Hub does.
    pub private: HashMap<String, String>,
    /// Answer `resolve` of LFS files with a 302 to `/_lfs/…` like the Hub's CDN redirect.
    pub lfs_redirect: bool,
    /// Bytes per second of every file transfer's body (each transfer paced on its own, so `n`
    /// parallel transfers move `n` times as much); `None` = as fast as possible.
    pub rate_limit: Option<NonZeroU64>,
    /// Bytes per second of all transfers together, as one Internet link shared by every
    /// connection (each chunk of every body waits its turn on the link); `None` = no link limit.
    pub link_rate: Option<NonZeroU64>,
}

impl std::fmt::Debug for HubOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubOptions")
            .field("gated", &self.gated.keys().collect::<Vec<_>>())
            .field("private", &self.private.keys().collect::<Vec<_>>())
            .field("lfs_redirect", &self.lfs_redirect)
            .field("rate_limit", &self.rate_limit)
            .field("link_rate", &self.link_rate)
            .finish()
    }
}

/// A running hub server. Dropping it stops the server.
pub struct HubServer {
    addr: SocketAddr,
    state: Arc<routes::HubState>,
    shutdown: Option<tokio::sync::watch::Sender<bool>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for HubServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubServer")
            .field("addr", &self.addr)
            .field("repos", &self.state.repos.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl HubServer {
    /// Scan `root` and serve it on `addr` (use `127.0.0.1:0` for a free loopback port).
    ///
    /// # Errors
    /// [`HubServerError::Scan`] if the tree cannot be read, [`HubServerError::Bind`] if the address
    /// cannot be bound, [`HubServerError::Runtime`] if the server thread cannot start.
    pub fn start(
        root: impl AsRef<Path>,
        addr: SocketAddr,
        opts: HubOptions,
    ) -> Result<Self, HubServerError> {
        let repos = repo::scan_root(root.as_ref())?;
        let listener = std::net::TcpListener::bind(addr)
            .map_err(|source| HubServerError::Bind { addr, source })?;
        listener
            .set_nonblocking(true)
            .map_err(|source| HubServerError::Bind { addr, source })?;
        let local = listener
            .local_addr()
            .map_err(|source| HubServerError::Bind { addr, source })?;
        let state = Arc::new(routes::HubState {
            repos,
            gated: opts.gated,
            private: opts.private,
            lfs_redirect: opts.lfs_redirect,
            rate_limit: opts.rate_limit,
            link: opts.link_rate.map(|r| Arc::new(files::Link::new(r))),
            base_url: format!("http://{local}"),
            faults: Mutex::new(Vec::new()),
            log: Mutex::new(Vec::new()),
            active: Arc::default(),
        });
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("sd-hub")
            .enable_all()
            .build()
            .map_err(HubServerError::Runtime)?;
        let (tx, mut rx) = tokio::sync::watch::channel(false);
        let app = routes::router(state.clone());
        let thread = std::thread::Builder::new()
            .name("sd-hub-main".into())
            .spawn(move || {
                rt.block_on(async move {
                    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                        return;
                    };
                    let mut rx2 = rx.clone();
                    let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
                        let _ = rx2.wait_for(|v| *v).await;
                    });
                    // In-flight transfers (e.g. a stalled one) get a short grace period only.
                    let grace = async move {
                        let _ = rx.wait_for(|v| *v).await;
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    };
                    tokio::select! {
                        _ = serve => {}
                        () = grace => {}
                    }
                });
                rt.shutdown_timeout(Duration::from_millis(500));
            })
            .map_err(HubServerError::Runtime)?;
        Ok(Self {
            addr: local,
            state,
            shutdown: Some(tx),
            thread: Some(thread),
        })
    }

    /// Base URL to use as the Hub endpoint, e.g. `http://127.0.0.1:41234` (no trailing slash).
    #[must_use]
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// How long the link ([`HubOptions::link_rate`]) has sat unused since its first byte: the
    /// time no transfer had its next chunk ready when the link came free (a download that cannot
    /// keep the link busy). Zero without a link rate.
    #[must_use]
    pub fn link_idle(&self) -> Duration {
        self.state
            .link
            .as_ref()
            .map_or(Duration::ZERO, |l| l.idle())
    }

    /// The link's unused stretches of 20 ms or more since [`Self::reset_link_idle`]: when each
    /// ended (from the reset) and how long it was.
    #[must_use]
    pub fn link_gaps(&self) -> Vec<(Duration, Duration)> {
        self.state.link.as_ref().map_or_else(Vec::new, |l| l.gaps())
    }

    /// Restarts [`Self::link_idle`]'s count: the link's next byte is its first (call while no
    /// transfer runs).
    pub fn reset_link_idle(&self) {
        if let Some(l) = &self.state.link {
            l.reset_idle();
        }
    }

    /// The bound address.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The repositories served, by `owner/name`.
    #[must_use]
    pub fn repo(&self, id: &str) -> Option<&Repo> {
        self.state.repos.get(id)
    }

    /// The commit sha a repository is served at.
    #[must_use]
    pub fn commit(&self, id: &str) -> Option<String> {
        self.repo(id).map(|r| r.commit.clone())
    }

    /// Replace all fault rules by `rule`: a [`FaultRule`] (e.g. scoped to one file with
    /// [`FaultRule::file`]) or a bare [`Fault`] for every file. `Fault::None` clears them.
    pub fn set_fault(&self, rule: impl Into<FaultRule>) {
        let rule = rule.into();
        if let Ok(mut f) = self.state.faults.lock() {
            f.clear();
            if rule.fault != Fault::None {
                f.push(rule);
            }
        }
    }

    /// Add a fault rule; the first matching rule applies to a transfer.
    pub fn add_fault(&self, rule: impl Into<FaultRule>) {
        let rule = rule.into();
        if let Ok(mut f) = self.state.faults.lock() {
            f.push(rule);
        }
    }

    /// Remove every fault rule.
    pub fn clear_faults(&self) {
        if let Ok(mut f) = self.state.faults.lock() {
            f.clear();
        }
    }

    /// Every request answered so far, in arrival order.
    #[must_use]
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.state
            .log
            .lock()
            .map(|l| l.iter().map(fault::LiveRecord::snapshot).collect())
            .unwrap_or_default()
    }

    /// Forget the request log.
    pub fn clear_requests(&self) {
        if let Ok(mut l) = self.state.log.lock() {
            l.clear();
        }
    }

    /// Total body bytes sent for file transfers so far.
    #[must_use]
    pub fn bytes_served(&self) -> u64 {
        self.requests().iter().map(|r| r.body_bytes).sum()
    }

    /// The most file transfers that were ever in flight at the same time.
    #[must_use]
    pub fn peak_concurrent_transfers(&self) -> u64 {
        self.state
            .active
            .peak
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Stop the server and wait for its thread (in-flight transfers get ~0.5 s).
    pub fn stop(mut self) {
        self.shutdown_now();
    }

    fn shutdown_now(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(true);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for HubServer {
    fn drop(&mut self) {
        self.shutdown_now();
    }
}
