//! File endpoints: `resolve` (HEAD/GET, ranges, 304, LFS redirects) and the `/_lfs` blob store,
//! with the fault switch applied to the bytes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tokio::io::{AsyncReadExt, AsyncSeekExt};

use super::fault::Fault;
use super::range::{RangeOutcome, parse_range};
use super::repo::{Repo, RepoFile};
use super::routes::{
    HubState, Shared, check_gate, hub_error, log, lookup_auth, record, rev_ok, revision_not_found,
};

const CHUNK: usize = 64 * 1024;

#[derive(Debug, Default)]
pub(crate) struct ActiveTransfers {
    pub(crate) now: AtomicU64,
    pub(crate) peak: AtomicU64,
}

/// Counts one transfer as active for as long as its body lives.
pub(super) struct ActiveGuard(Arc<ActiveTransfers>);

impl ActiveGuard {
    pub(super) fn new(a: Arc<ActiveTransfers>) -> Self {
        let n = a.now.fetch_add(1, Ordering::SeqCst) + 1;
        a.peak.fetch_max(n, Ordering::SeqCst);
        Self(a)
    }
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::SeqCst);
    }
}

fn set(h: &mut HeaderMap, k: &'static str, v: &str) {
    if let Ok(v) = HeaderValue::from_str(v) {
        h.insert(k, v);
    }
}

fn etag_matches(headers: &HeaderMap, etag: &str) -> bool {
    headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(',').any(|t| {
                let t = t.trim();
                let t = t.strip_prefix("W/").unwrap_or(t);
                t == "*" || t.trim_matches('"') == etag
            })
        })
}

pub(super) async fn resolve(
    State(state): State<Shared>,
    Path((owner, name, rev, path)): Path<(String, String, String, String)>,
    req: Request,
) -> Response {
    let method = req.method().clone();
    let headers = req.headers().clone();
    let uri_path = req.uri().path().to_owned();
    let repo = match lookup_auth(&state, &owner, &name, &headers) {
        Ok(r) => r,
        Err(resp) => {
            log(&state, record(&method, &uri_path, &headers, resp.status()));
            return resp;
        }
    };
    if !rev_ok(repo, &rev) {
        let resp = revision_not_found(&rev);
        log(&state, record(&method, &uri_path, &headers, resp.status()));
        return resp;
    }
    if let Some(resp) = check_gate(&state, &repo.id, &headers) {
        log(&state, record(&method, &uri_path, &headers, resp.status()));
        return resp;
    }
    let Some(file) = repo.files.get(&path) else {
        let mut resp = hub_error(
            StatusCode::NOT_FOUND,
            "EntryNotFound",
            &format!("Entry not found: {path}"),
        );
        set(resp.headers_mut(), "X-Repo-Commit", &repo.commit);
        log(&state, record(&method, &uri_path, &headers, resp.status()));
        return resp;
    };

    if state.lfs_redirect
        && let Some(sha) = &file.lfs_sha256
    {
        // As the Hub does for LFS files: 302 to the blob store, metadata in X-Linked-* headers
        // (or 304 when the client already holds that blob).
        let status = if etag_matches(&headers, sha) {
            StatusCode::NOT_MODIFIED
        } else {
            StatusCode::FOUND
        };
        let mut resp = status.into_response();
        let h = resp.headers_mut();
        set(
            h,
            "Location",
            &format!("{}/_lfs/{}/{sha}", state.base_url, repo.id),
        );
        set(h, "X-Repo-Commit", &repo.commit);
        set(h, "X-Linked-Etag", &format!("\"{sha}\""));
        set(h, "X-Linked-Size", &file.size.to_string());
        set(h, "ETag", &format!("\"{}\"", file.git_oid));
        log(&state, record(&method, &uri_path, &headers, resp.status()));
        return resp;
    }
    serve_file(&state, repo, file, &method, &headers, &uri_path).await
}

pub(super) async fn lfs_blob(
    State(state): State<Shared>,
    Path((owner, name, sha)): Path<(String, String, String)>,
    req: Request,
) -> Response {
    let method = req.method().clone();
    let headers = req.headers().clone();
    let uri_path = req.uri().path().to_owned();
    let found = lookup_auth(&state, &owner, &name, &headers)
        .ok()
        .and_then(|repo| {
            repo.files
                .values()
                .find(|f| f.lfs_sha256.as_deref() == Some(sha.as_str()))
                .map(|f| (repo, f))
        });
    match found {
        Some((repo, file)) => serve_file(&state, repo, file, &method, &headers, &uri_path).await,
        None => {
            let resp = StatusCode::NOT_FOUND.into_response();
            log(&state, record(&method, &uri_path, &headers, resp.status()));
            resp
        }
    }
}

async fn serve_file(
    state: &Shared,
    repo: &Repo,
    file: &RepoFile,
    method: &Method,
    headers: &HeaderMap,
    uri_path: &str,
) -> Response {
    let etag = file.etag().to_owned();
    let mut base = HeaderMap::new();
    set(&mut base, "ETag", &format!("\"{etag}\""));
    set(&mut base, "X-Repo-Commit", &repo.commit);
    set(&mut base, "Accept-Ranges", "bytes");
    if file.lfs_sha256.is_some() {
        set(&mut base, "X-Linked-Etag", &format!("\"{etag}\""));
        set(&mut base, "X-Linked-Size", &file.size.to_string());
    }
    set(&mut base, "Content-Type", "application/octet-stream");

    if etag_matches(headers, &etag) {
        let mut resp = StatusCode::NOT_MODIFIED.into_response();
        resp.headers_mut().extend(base);
        log(state, record(method, uri_path, headers, resp.status()));
        return resp;
    }

    let range_h = headers.get(header::RANGE).and_then(|v| v.to_str().ok());
    let (status, start, end_incl) = match parse_range(range_h, file.size) {
        RangeOutcome::Full => (StatusCode::OK, 0, file.size.checked_sub(1)),
        RangeOutcome::Partial { start, end } => (StatusCode::PARTIAL_CONTENT, start, Some(end)),
        RangeOutcome::Unsatisfiable => {
            let mut resp = StatusCode::RANGE_NOT_SATISFIABLE.into_response();
            resp.headers_mut().extend(base);
            set(
                resp.headers_mut(),
                "Content-Range",
                &format!("bytes */{}", file.size),
            );
            log(state, record(method, uri_path, headers, resp.status()));
            return resp;
        }
    };
    let len = end_incl.map_or(0, |e| e + 1 - start);
    let mut rec = record(method, uri_path, headers, status);
    rec.range_start = Some(start);
    let sent = log(state, rec);

    let mut builder = Response::builder().status(status);
    if let Some(h) = builder.headers_mut() {
        h.extend(base);
        set(h, "Content-Length", &len.to_string());
        if status == StatusCode::PARTIAL_CONTENT
            && let Some(e) = end_incl
        {
            set(
                h,
                "Content-Range",
                &format!("bytes {start}-{e}/{}", file.size),
            );
        }
    }
    if *method == Method::HEAD {
        return builder
            .body(Body::empty())
            .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response());
    }
    let fault = take_fault(state, &file.path);
    let body = body_stream(
        file.disk_path.clone(),
        start,
        len,
        Pacing {
            fault,
            rate_limit: state.rate_limit,
            link: state.link.clone(),
        },
        sent,
        state.active.clone(),
    );
    builder
        .body(body)
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

fn take_fault(state: &HubState, path: &str) -> Fault {
    let Ok(mut rules) = state.faults.lock() else {
        return Fault::None;
    };
    for r in rules.iter_mut() {
        if r.matches(path) {
            if let Some(n) = r.remaining.as_mut() {
                *n -= 1;
            }
            return r.fault;
        }
    }
    Fault::None
}

/// How a body's bytes are handed over: the fault of this transfer, its rate limit and the link.
struct Pacing {
    fault: Fault,
    rate_limit: Option<std::num::NonZeroU64>,
    link: Option<Arc<Link>>,
}

/// One link shared by every transfer: each chunk reserves its time on it, in turn.
pub(crate) struct Link {
    rate: f64,
    next_free: std::sync::Mutex<Option<tokio::time::Instant>>,
    /// Nanoseconds the link sat unused between its first byte and its last reservation: no
    /// transfer had a chunk ready when it came free, nor within [`Link::SLACK`] of it.
    idle_ns: std::sync::atomic::AtomicU64,
    /// The unused stretches of at least [`Link::GAP`]: when each ended (from the last reset) and
    /// how long it was.
    gaps: std::sync::Mutex<(tokio::time::Instant, Vec<(Duration, Duration)>)>,
}

impl Link {
    pub(crate) fn new(rate: std::num::NonZeroU64) -> Self {
        Self {
            rate: rate.get() as f64,
            next_free: std::sync::Mutex::new(None),
            idle_ns: std::sync::atomic::AtomicU64::new(0),
            gaps: std::sync::Mutex::new((tokio::time::Instant::now(), Vec::new())),
        }
    }

    /// How far behind the link a chunk may start without the link losing that time: the data a
    /// real sender keeps queued in its socket (20 ms of a 75 MB/s link is 1.5 MB; a server's send
    /// buffer holds several). The hub runs in the benchmark's process, on the machine's cores:
    /// without it, each of its wake-ups that a busy core delays by a few milliseconds is link time
    /// lost that a Hub across the Internet, with its own cores, would not lose.
    const SLACK: Duration = Duration::from_millis(20);

    /// The shortest unused stretch [`Link::gaps`] lists.
    const GAP: Duration = Duration::from_millis(20);

    /// The unused stretches of at least [`Link::GAP`] since the last reset: when each ended,
    /// from the reset, and how long it was.
    pub(crate) fn gaps(&self) -> Vec<(Duration, Duration)> {
        self.gaps
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .1
            .clone()
    }

    /// Starts counting afresh: the next byte is the link's first.
    pub(crate) fn reset_idle(&self) {
        *self
            .next_free
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
        self.idle_ns.store(0, std::sync::atomic::Ordering::Relaxed);
        *self
            .gaps
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            (tokio::time::Instant::now(), Vec::new());
    }

    /// How long the link has sat unused since its first byte (see [`Link::pass`]).
    pub(crate) fn idle(&self) -> Duration {
        Duration::from_nanos(self.idle_ns.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Bytes per chunk on this link: about 1/32 s of it, at most 128 KiB (a chunk is counted as
    /// sent when it is handed over, so small chunks keep the count close to what arrived).
    fn chunk(&self) -> u64 {
        (self.rate as u64 / 32).clamp(1, 128 << 10)
    }

    /// Waits until `n` bytes may go: after every byte reserved before them.
    async fn pass(&self, n: u64) {
        let start = {
            let mut next = self
                .next_free
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let now = tokio::time::Instant::now();
            if let Some(free) = *next {
                let gap = now.saturating_duration_since(free + Self::SLACK);
                if gap >= Self::GAP {
                    let mut gaps = self
                        .gaps
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    let since = now.saturating_duration_since(gaps.0);
                    gaps.1.push((since, gap));
                }
                let unused = u64::try_from(gap.as_nanos());
                self.idle_ns.fetch_add(
                    unused.unwrap_or(u64::MAX),
                    std::sync::atomic::Ordering::Relaxed,
                );
            }
            // A transfer that comes back to the link up to `SLACK` late (the hub's own task woken
            // late on a busy machine) sends as if it had queued its chunk in time.
            let start = next.map_or(now, |t| t.max(now.checked_sub(Self::SLACK).unwrap_or(now)));
            *next = Some(start + Duration::from_secs_f64(n as f64 / self.rate));
            start
        };
        tokio::time::sleep_until(start).await;
    }
}

struct BodyState {
    file: Option<fs_err::tokio::File>,
    path: std::path::PathBuf,
    pos: u64,
    left: u64,
    sent: u64,
    fault: Fault,
    rate_limit: Option<std::num::NonZeroU64>,
    link: Option<Arc<Link>>,
    started: tokio::time::Instant,
    counter: Arc<AtomicU64>,
    active: Option<ActiveGuard>,
}

fn body_stream(
    path: std::path::PathBuf,
    start: u64,
    len: u64,
    pacing: Pacing,
    counter: Arc<AtomicU64>,
    active: Arc<ActiveTransfers>,
) -> Body {
    let st = BodyState {
        file: None,
        path,
        pos: start,
        left: len,
        sent: 0,
        fault: pacing.fault,
        rate_limit: pacing.rate_limit,
        link: pacing.link,
        started: tokio::time::Instant::now(),
        counter,
        active: Some(ActiveGuard::new(active)),
    };
    let stream = futures::stream::try_unfold(st, |mut st| async move {
        if st.left == 0 {
            return Ok(None);
        }
        if st.file.is_none() {
            let mut f = fs_err::tokio::File::open(&st.path).await?;
            f.seek(std::io::SeekFrom::Start(st.pos)).await?;
            st.file = Some(f);
        }
        let mut want = st.left.min(CHUNK as u64);
        match st.fault {
            Fault::None | Fault::FlipByte { .. } => {}
            Fault::CutAfter { bytes } => {
                if st.sent >= bytes {
                    // Let the bytes already handed over reach the client, then drop the connection
                    // (so "bytes sent" means "bytes delivered" for the tests' accounting).
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::ConnectionAborted,
                        "fault injection: transfer cut",
                    ));
                }
                want = want.min(bytes - st.sent);
            }
            Fault::StallAfter { bytes, dur } => {
                if st.sent >= bytes {
                    tokio::time::sleep(dur).await;
                    st.fault = Fault::None;
                } else {
                    want = want.min(bytes - st.sent);
                }
            }
        }
        if let Some(rate) = st.rate_limit {
            // Chunks of about 1/8 s, each sent when the bytes before it are due at `rate`.
            want = want.min((rate.get() / 8).max(1));
            let due = Duration::from_secs_f64(st.sent as f64 / rate.get() as f64);
            tokio::time::sleep_until(st.started + due).await;
        }
        if let Some(link) = &st.link {
            want = want.min(link.chunk());
            link.pass(want).await;
        }
        let mut buf = vec![0u8; usize::try_from(want).unwrap_or(CHUNK)];
        let Some(f) = st.file.as_mut() else {
            return Ok(None);
        };
        f.read_exact(&mut buf).await?;
        if let Fault::FlipByte { offset } = st.fault
            && (st.pos..st.pos + want).contains(&offset)
        {
            let i = usize::try_from(offset - st.pos).unwrap_or(0);
            buf[i] ^= 0xFF;
        }
        st.pos += want;
        st.left -= want;
        st.sent += want;
        st.counter.fetch_add(want, Ordering::Relaxed);
        if st.left == 0 {
            // Not active any more once the last chunk is handed over (before the client sees it).
            st.active = None;
        }
        Ok::<_, std::io::Error>(Some((bytes::Bytes::from(buf), st)))
    });
    Body::from_stream(stream)
}
