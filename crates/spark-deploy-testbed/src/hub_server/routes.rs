//! HTTP handlers: the subset of the Hub API that `hf-hub` 1.0 and `huggingface_hub` use.
//!
//! | Route | Purpose |
//! |---|---|
//! | `GET /api/models/{owner}/{name}[/revision/{rev}]` | repo info: `sha`, `siblings` (`?blobs=true` adds size/blobId/lfs) |
//! | `GET /api/models/{owner}/{name}/tree/{rev}[/{path}]` | file listing (`?recursive=true`) |
//! | `POST /api/models/{owner}/{name}/paths-info/{rev}` | info for named paths |
//! | `HEAD/GET /{owner}/{name}/resolve/{rev}/{path}` | metadata headers and bytes, ranges |
//! | `HEAD/GET /_lfs/{owner}/{name}/{sha256}` | redirect target when `lfs_redirect` is on |

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncSeekExt};

use super::fault::{Fault, FaultRule, LiveRecord, RequestRecord};
use super::range::{RangeOutcome, parse_range};
use super::repo::{Repo, RepoFile};

const CREATED: &str = "2026-01-01T00:00:00.000Z";
const CHUNK: usize = 64 * 1024;

pub(crate) struct HubState {
    pub(crate) repos: BTreeMap<String, Repo>,
    pub(crate) gated: HashMap<String, String>,
    pub(crate) private: HashMap<String, String>,
    pub(crate) lfs_redirect: bool,
    pub(crate) base_url: String,
    pub(crate) faults: Mutex<Vec<FaultRule>>,
    pub(crate) log: Mutex<Vec<LiveRecord>>,
    /// File transfers whose body is being sent right now, and the most ever seen at once.
    pub(crate) active: Arc<ActiveTransfers>,
}

#[derive(Debug, Default)]
pub(crate) struct ActiveTransfers {
    pub(crate) now: AtomicU64,
    pub(crate) peak: AtomicU64,
}

/// Counts one transfer as active for as long as its body lives.
struct ActiveGuard(Arc<ActiveTransfers>);

impl ActiveGuard {
    fn new(a: Arc<ActiveTransfers>) -> Self {
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

type Shared = Arc<HubState>;

pub(crate) fn router(state: Shared) -> Router {
    Router::new()
        .route("/api/models/{owner}/{name}", get(info_main))
        .route("/api/models/{owner}/{name}/revision/{*rev}", get(info_rev))
        .route("/api/models/{owner}/{name}/tree/{rev}", get(tree_root))
        .route(
            "/api/models/{owner}/{name}/tree/{rev}/{*path}",
            get(tree_path),
        )
        .route(
            "/api/models/{owner}/{name}/paths-info/{rev}",
            post(paths_info),
        )
        .route(
            "/{owner}/{name}/resolve/{rev}/{*path}",
            get(resolve).head(resolve),
        )
        .route("/_lfs/{owner}/{name}/{sha}", get(lfs_blob).head(lfs_blob))
        .with_state(state)
}

fn hub_error(status: StatusCode, code: &str, message: &str) -> Response {
    let mut r = (status, axum::Json(json!({ "error": message }))).into_response();
    if let Ok(v) = HeaderValue::from_str(code) {
        r.headers_mut().insert("X-Error-Code", v);
    }
    if let Ok(v) = HeaderValue::from_str(message) {
        r.headers_mut().insert("X-Error-Message", v);
    }
    r
}

fn repo_not_found(id: &str) -> Response {
    hub_error(
        StatusCode::NOT_FOUND,
        "RepoNotFound",
        &format!("Repository Not Found for url: model {id}."),
    )
}

fn revision_not_found(rev: &str) -> Response {
    hub_error(
        StatusCode::NOT_FOUND,
        "RevisionNotFound",
        &format!("Invalid rev id: {rev}"),
    )
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
}

/// `None` when access is allowed, else the 401/403 response.
fn check_gate(state: &HubState, id: &str, headers: &HeaderMap) -> Option<Response> {
    let want = state.gated.get(id)?;
    match bearer(headers) {
        Some(t) if t == want => None,
        None => Some(hub_error(
            StatusCode::UNAUTHORIZED,
            "GatedRepo",
            &format!(
                "Access to model {id} is restricted. You must have access to it and be authenticated to access it. Please log in."
            ),
        )),
        Some(_) => Some(hub_error(
            StatusCode::FORBIDDEN,
            "GatedRepo",
            &format!(
                "Access to model {id} is restricted and you are not in the authorized list. Ask for access on the model page."
            ),
        )),
    }
}

#[allow(clippy::result_large_err)] // handlers return the error response as is
fn lookup<'a>(state: &'a HubState, owner: &str, name: &str) -> Result<&'a Repo, Response> {
    let id = format!("{owner}/{name}");
    state.repos.get(&id).ok_or_else(|| repo_not_found(&id))
}

/// Like [`lookup`], but a private repository is invisible without its token, as on the Hub:
/// 401 `RepoNotFound` without a token, 404 `RepoNotFound` with a wrong one.
#[allow(clippy::result_large_err)] // handlers return the error response as is
fn lookup_auth<'a>(
    state: &'a HubState,
    owner: &str,
    name: &str,
    headers: &HeaderMap,
) -> Result<&'a Repo, Response> {
    let repo = lookup(state, owner, name)?;
    match (state.private.get(&repo.id), bearer(headers)) {
        (None, _) => Ok(repo),
        (Some(want), Some(t)) if t == want => Ok(repo),
        (Some(_), None) => {
            let mut r = repo_not_found(&repo.id);
            *r.status_mut() = StatusCode::UNAUTHORIZED;
            Err(r)
        }
        (Some(_), Some(_)) => Err(repo_not_found(&repo.id)),
    }
}

fn rev_ok(repo: &Repo, rev: &str) -> bool {
    rev == "main" || rev == repo.commit
}

fn log(state: &HubState, rec: RequestRecord) -> Arc<AtomicU64> {
    let sent = Arc::new(AtomicU64::new(0));
    if let Ok(mut l) = state.log.lock() {
        l.push(LiveRecord {
            rec,
            sent: sent.clone(),
        });
    }
    sent
}

fn record(method: &Method, path: &str, headers: &HeaderMap, status: StatusCode) -> RequestRecord {
    RequestRecord {
        method: method.to_string(),
        path: path.to_owned(),
        range: headers
            .get(header::RANGE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        range_start: None,
        status: status.as_u16(),
        had_token: bearer(headers).is_some(),
        body_bytes: 0,
    }
}

fn info_json(state: &HubState, repo: &Repo, blobs: bool) -> Value {
    let siblings: Vec<Value> = repo
        .files
        .values()
        .map(|f| {
            let mut s = json!({ "rfilename": f.path });
            if blobs {
                s["size"] = json!(f.size);
                s["blobId"] = json!(f.git_oid);
                if let Some(sha) = &f.lfs_sha256 {
                    s["lfs"] =
                        json!({ "sha256": sha, "size": f.size, "pointerSize": f.lfs_pointer_size });
                }
            }
            s
        })
        .collect();
    let (owner, _) = repo.id.split_once('/').unwrap_or((&repo.id, ""));
    let gated = if state.gated.contains_key(&repo.id) {
        json!("manual")
    } else {
        json!(false)
    };
    json!({
        "_id": &repo.commit[..24],
        "id": repo.id,
        "modelId": repo.id,
        "author": owner,
        "sha": repo.commit,
        "lastModified": CREATED,
        "createdAt": CREATED,
        "private": state.private.contains_key(&repo.id),
        "disabled": false,
        "gated": gated,
        "downloads": 0,
        "likes": 0,
        "tags": [],
        "siblings": siblings,
    })
}

fn wants_blobs(q: &HashMap<String, String>) -> bool {
    q.get("blobs")
        .is_some_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

async fn info_main(
    State(state): State<Shared>,
    Path((owner, name)): Path<(String, String)>,
    Query(q): Query<HashMap<String, String>>,
    req: Request,
) -> Response {
    info_common(&state, &owner, &name, "main", &q, &req)
}

async fn info_rev(
    State(state): State<Shared>,
    Path((owner, name, rev)): Path<(String, String, String)>,
    Query(q): Query<HashMap<String, String>>,
    req: Request,
) -> Response {
    info_common(&state, &owner, &name, &rev, &q, &req)
}

fn info_common(
    state: &HubState,
    owner: &str,
    name: &str,
    rev: &str,
    q: &HashMap<String, String>,
    req: &Request,
) -> Response {
    let resp = match lookup_auth(state, owner, name, req.headers()) {
        Err(r) => r,
        Ok(repo) if !rev_ok(repo, rev) => revision_not_found(rev),
        Ok(repo) => axum::Json(info_json(state, repo, wants_blobs(q))).into_response(),
    };
    log(
        state,
        record(req.method(), req.uri().path(), req.headers(), resp.status()),
    );
    resp
}

fn file_entry(f: &RepoFile) -> Value {
    let mut e = json!({ "type": "file", "oid": f.git_oid, "size": f.size, "path": f.path });
    if let Some(sha) = &f.lfs_sha256 {
        // The Hub's tree endpoint names the LFS sha256 `oid` (the siblings list calls it `sha256`).
        e["lfs"] = json!({ "oid": sha, "size": f.size, "pointerSize": f.lfs_pointer_size });
    }
    e
}

fn dir_entry(repo: &Repo, d: &str) -> Value {
    let oid = super::repo::git_blob_sha1(format!("tree {} {d}", repo.commit).as_bytes());
    json!({ "type": "directory", "oid": oid, "size": 0, "path": d })
}

fn tree_listing(repo: &Repo, base: &str, recursive: bool) -> Option<Vec<Value>> {
    let base = base.trim_matches('/');
    let prefix = if base.is_empty() {
        String::new()
    } else {
        format!("{base}/")
    };
    let dirs = repo.directories();
    if !base.is_empty() && !dirs.iter().any(|d| d == base) {
        return None;
    }
    let direct = |p: &str| !p[prefix.len()..].contains('/');
    let mut out = Vec::new();
    for d in dirs
        .iter()
        .filter(|d| d.starts_with(&prefix) && d.len() > prefix.len())
    {
        if recursive || direct(d) {
            out.push(dir_entry(repo, d));
        }
    }
    for f in repo.files.values().filter(|f| f.path.starts_with(&prefix)) {
        if recursive || direct(&f.path) {
            out.push(file_entry(f));
        }
    }
    Some(out)
}

async fn tree_root(
    State(state): State<Shared>,
    Path((owner, name, rev)): Path<(String, String, String)>,
    Query(q): Query<HashMap<String, String>>,
    req: Request,
) -> Response {
    tree_common(&state, &owner, &name, &rev, "", &q, &req)
}

async fn tree_path(
    State(state): State<Shared>,
    Path((owner, name, rev, path)): Path<(String, String, String, String)>,
    Query(q): Query<HashMap<String, String>>,
    req: Request,
) -> Response {
    tree_common(&state, &owner, &name, &rev, &path, &q, &req)
}

fn tree_common(
    state: &HubState,
    owner: &str,
    name: &str,
    rev: &str,
    path: &str,
    q: &HashMap<String, String>,
    req: &Request,
) -> Response {
    let recursive = q
        .get("recursive")
        .is_some_and(|v| v.eq_ignore_ascii_case("true") || v == "1");
    let resp = match lookup_auth(state, owner, name, req.headers()) {
        Err(r) => r,
        Ok(repo) if !rev_ok(repo, rev) => revision_not_found(rev),
        Ok(repo) => match tree_listing(repo, path, recursive) {
            Some(list) => axum::Json(Value::Array(list)).into_response(),
            None => hub_error(
                StatusCode::NOT_FOUND,
                "EntryNotFound",
                &format!("{path} does not exist on \"{rev}\""),
            ),
        },
    };
    log(
        state,
        record(req.method(), req.uri().path(), req.headers(), resp.status()),
    );
    resp
}

#[derive(serde::Deserialize)]
struct PathsInfoBody {
    paths: Vec<String>,
}

async fn paths_info(
    State(state): State<Shared>,
    Path((owner, name, rev)): Path<(String, String, String)>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let resp = match lookup_auth(&state, &owner, &name, &headers) {
        Err(r) => r,
        Ok(repo) if !rev_ok(repo, &rev) => revision_not_found(&rev),
        Ok(repo) => {
            // Accepts JSON, and the form encoding the Python client uses (`paths=a&paths=b`).
            let paths: Vec<String> = serde_json::from_slice::<PathsInfoBody>(&body)
                .map(|b| b.paths)
                .unwrap_or_else(|_| {
                    String::from_utf8_lossy(&body)
                        .split('&')
                        .filter_map(|kv| kv.strip_prefix("paths="))
                        .map(|v| v.replace('+', " ").replace("%2F", "/"))
                        .collect()
                });
            let dirs = repo.directories();
            let list: Vec<Value> = paths
                .iter()
                .filter_map(|p| {
                    let p = p.trim_matches('/');
                    repo.files
                        .get(p)
                        .map(file_entry)
                        .or_else(|| dirs.iter().any(|d| d == p).then(|| dir_entry(repo, p)))
                })
                .collect();
            axum::Json(Value::Array(list)).into_response()
        }
    };
    let path = format!("/api/models/{owner}/{name}/paths-info/{rev}");
    log(
        &state,
        record(&Method::POST, &path, &headers, resp.status()),
    );
    resp
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

async fn resolve(
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

async fn lfs_blob(
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
        fault,
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

struct BodyState {
    file: Option<tokio::fs::File>,
    path: std::path::PathBuf,
    pos: u64,
    left: u64,
    sent: u64,
    fault: Fault,
    counter: Arc<AtomicU64>,
    active: Option<ActiveGuard>,
}

fn body_stream(
    path: std::path::PathBuf,
    start: u64,
    len: u64,
    fault: Fault,
    counter: Arc<AtomicU64>,
    active: Arc<ActiveTransfers>,
) -> Body {
    let st = BodyState {
        file: None,
        path,
        pos: start,
        left: len,
        sent: 0,
        fault,
        counter,
        active: Some(ActiveGuard::new(active)),
    };
    let stream = futures::stream::try_unfold(st, |mut st| async move {
        if st.left == 0 {
            return Ok(None);
        }
        if st.file.is_none() {
            let mut f = tokio::fs::File::open(&st.path).await?;
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
                    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
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
