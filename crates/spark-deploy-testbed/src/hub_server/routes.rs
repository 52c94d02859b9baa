//! HTTP handlers: the subset of the Hub API that `hf-hub` 1.0 and `huggingface_hub` use.
//!
//! | Route | Purpose |
//! |---|---|
//! | `GET /api/models/{owner}/{name}[/revision/{rev}]` | repo info: `sha`, `siblings` (`?blobs=true` adds size/blobId/lfs) |
//! | `GET /api/models/{owner}/{name}/tree/{rev}[/{path}]` | file listing (`?recursive=true`) |
//! | `POST /api/models/{owner}/{name}/paths-info/{rev}` | info for named paths |
//! | `HEAD/GET /{owner}/{name}/resolve/{rev}/{path}` | metadata headers and bytes, ranges |
//! | `HEAD/GET /_lfs/{owner}/{name}/{sha256}` | redirect target when `lfs_redirect` is on |
//! | `GET /_testbed/requests` | the request log as JSON (not a Hub endpoint: for tests driving `sd-hub`) |

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;

use super::api;
use super::fault::{FaultRule, LiveRecord, RequestRecord};
use super::files::{self, ActiveTransfers};
use super::repo::Repo;

pub(crate) struct HubState {
    pub(crate) repos: BTreeMap<String, Repo>,
    pub(crate) gated: HashMap<String, String>,
    pub(crate) private: HashMap<String, String>,
    pub(crate) lfs_redirect: bool,
    pub(crate) rate_limit: Option<std::num::NonZeroU64>,
    /// The shared link every body is paced on, when set.
    pub(crate) link: Option<Arc<super::files::Link>>,
    pub(crate) base_url: String,
    pub(crate) faults: Mutex<Vec<FaultRule>>,
    pub(crate) log: Mutex<Vec<LiveRecord>>,
    /// File transfers whose body is being sent right now, and the most ever seen at once.
    pub(crate) active: Arc<ActiveTransfers>,
}

pub(super) type Shared = Arc<HubState>;

pub(crate) fn router(state: Shared) -> Router {
    Router::new()
        .route("/api/models/{owner}/{name}", get(api::info_main))
        .route(
            "/api/models/{owner}/{name}/revision/{*rev}",
            get(api::info_rev),
        )
        .route("/api/models/{owner}/{name}/tree/{rev}", get(api::tree_root))
        .route(
            "/api/models/{owner}/{name}/tree/{rev}/{*path}",
            get(api::tree_path),
        )
        .route(
            "/api/models/{owner}/{name}/paths-info/{rev}",
            post(api::paths_info),
        )
        .route(
            "/{owner}/{name}/resolve/{rev}/{*path}",
            get(files::resolve).head(files::resolve),
        )
        .route(
            "/_lfs/{owner}/{name}/{sha}",
            get(files::lfs_blob).head(files::lfs_blob),
        )
        .route("/_testbed/requests", get(request_log))
        .with_state(state)
}

/// The request log (as [`super::HubServer::requests`]) for tests that run the hub as `sd-hub`.
async fn request_log(axum::extract::State(state): axum::extract::State<Shared>) -> Response {
    let log: Vec<RequestRecord> = state
        .log
        .lock()
        .map(|l| l.iter().map(LiveRecord::snapshot).collect())
        .unwrap_or_default();
    axum::Json(log).into_response()
}

pub(super) fn hub_error(status: StatusCode, code: &str, message: &str) -> Response {
    let mut r = (status, axum::Json(json!({ "error": message }))).into_response();
    if let Ok(v) = HeaderValue::from_str(code) {
        r.headers_mut().insert("X-Error-Code", v);
    }
    if let Ok(v) = HeaderValue::from_str(message) {
        r.headers_mut().insert("X-Error-Message", v);
    }
    r
}

pub(super) fn repo_not_found(id: &str) -> Response {
    hub_error(
        StatusCode::NOT_FOUND,
        "RepoNotFound",
        &format!("Repository Not Found for url: model {id}."),
    )
}

pub(super) fn revision_not_found(rev: &str) -> Response {
    hub_error(
        StatusCode::NOT_FOUND,
        "RevisionNotFound",
        &format!("Invalid rev id: {rev}"),
    )
}

pub(super) fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
}

/// `None` when access is allowed, else the 401/403 response.
pub(super) fn check_gate(state: &HubState, id: &str, headers: &HeaderMap) -> Option<Response> {
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
pub(super) fn lookup<'a>(
    state: &'a HubState,
    owner: &str,
    name: &str,
) -> Result<&'a Repo, Response> {
    let id = format!("{owner}/{name}");
    state.repos.get(&id).ok_or_else(|| repo_not_found(&id))
}

/// Like [`lookup`], but a private repository is invisible without its token, as on the Hub:
/// 401 `RepoNotFound` without a token, 404 `RepoNotFound` with a wrong one.
#[allow(clippy::result_large_err)] // handlers return the error response as is
pub(super) fn lookup_auth<'a>(
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

pub(super) fn rev_ok(repo: &Repo, rev: &str) -> bool {
    rev == "main" || rev == repo.commit
}

pub(super) fn log(state: &HubState, rec: RequestRecord) -> Arc<AtomicU64> {
    let sent = Arc::new(AtomicU64::new(0));
    if let Ok(mut l) = state.log.lock() {
        l.push(LiveRecord {
            rec,
            sent: sent.clone(),
        });
    }
    sent
}

pub(super) fn record(
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    status: StatusCode,
) -> RequestRecord {
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
