//! Metadata endpoints: repo info (with siblings) and the file tree.

use std::collections::HashMap;

use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::repo::{Repo, RepoFile};
use super::routes::{
    HubState, Shared, hub_error, log, lookup_auth, record, rev_ok, revision_not_found,
};

const CREATED: &str = "2026-01-01T00:00:00.000Z";

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

pub(super) async fn info_main(
    State(state): State<Shared>,
    Path((owner, name)): Path<(String, String)>,
    Query(q): Query<HashMap<String, String>>,
    req: Request,
) -> Response {
    info_common(&state, &owner, &name, "main", &q, &req)
}

pub(super) async fn info_rev(
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

pub(super) async fn tree_root(
    State(state): State<Shared>,
    Path((owner, name, rev)): Path<(String, String, String)>,
    Query(q): Query<HashMap<String, String>>,
    req: Request,
) -> Response {
    tree_common(&state, &owner, &name, &rev, "", &q, &req)
}

pub(super) async fn tree_path(
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

pub(super) async fn paths_info(
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
