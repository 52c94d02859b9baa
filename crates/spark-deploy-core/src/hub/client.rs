//! The connection to a Hub: revision resolution and file listing through the `hf-hub` crate,
//! per-file metadata and byte transfers through our own `reqwest` calls.
//!
//! # Why not hf-hub for everything (read in `hf-hub-1.0.0/src`)
//! - No resume: `.incomplete` is recreated with `File::create` (hf-hub 1.0).
//! - `get_file_metadata` sends its `HEAD` with the redirect-following client, so for an LFS file
//!   the Hub 302s to a CDN it would read the CDN's headers instead of the Hub's `X-Linked-Etag`,
//!   `X-Linked-Size` and `X-Repo-Commit`. [`Hub::file_meta`] follows relative redirects only, as
//!   `huggingface_hub` does.
//! - Its cache-mode `GET` does not check the status code before streaming to the blob.
//! - `RepoTreeEntry::File.lfs.sha256` is read from a key `sha256`, but the Hub's tree listing (and
//!   `huggingface_hub`'s parser) names the LFS sha256 `oid`; when it is absent the fetch uses the
//!   ETag, which the Hub sets to that same sha256 for LFS files.
//! - A 404 from `/api/models/{repo}/revision/{rev}` is always `RevisionNotFound`, even for a
//!   missing repository; we look at `X-Error-Code` to tell them apart.

use std::path::PathBuf;
use std::time::Duration;

use futures::StreamExt as _;
use hf_hub::repository::RepoTreeEntry;
use reqwest::header::{self, HeaderMap, HeaderValue};

use super::cache::{HfCache, check_rel};
use super::error::HubError;
use super::token::{HfToken, default_cache_dir};
use crate::backoff::Backoff;
use crate::commit::is_commit_id;

/// How to reach the Hub and where the cache is.
#[derive(Debug, Clone)]
pub struct HubConfig {
    /// Hub endpoint; `None` = env `HF_ENDPOINT`, else the public Hub (as `hf-hub` decides).
    pub endpoint: Option<String>,
    /// The hub cache directory (the one holding `models--…`).
    pub cache_dir: PathBuf,
    /// Access token; see [`HfToken::from_env`].
    pub token: Option<HfToken>,
    /// Files transferred at once (download slots). A file in its last 250 ms, at its rate so
    /// far, has already given its slot to the next one, whose request and first byte overlap it.
    pub max_streams: usize,
    /// A transfer that delivers no byte for this long is abandoned and retried.
    pub stall_timeout: Duration,
    /// Consecutive failed attempts (without progress) allowed per file before giving up.
    pub max_retries: u32,
    /// First backoff; doubles per consecutive failure.
    pub backoff_base: Duration,
    /// Backoff ceiling.
    pub backoff_max: Duration,
    /// TCP connect timeout.
    pub connect_timeout: Duration,
    /// No network at all (`HF_HUB_OFFLINE`): every request fails with [`HubError::Offline`]
    /// before a socket is opened, and [`Hub::fetch_repo`] stands on the verified cache.
    pub offline: bool,
    /// When this turns `true`, transfers stop, write what they received to their `.incomplete`
    /// files and the fetch ends with [`FetchError::Cancelled`](super::FetchError::Cancelled).
    /// (Dropping the fetch future also stops it, but may lose the bytes still buffered.)
    pub cancel: Option<tokio::sync::watch::Receiver<bool>>,
}

impl HubConfig {
    /// Defaults for `cache_dir`, with the token from the environment; online.
    #[must_use]
    pub fn new(endpoint: Option<String>, cache_dir: impl Into<PathBuf>) -> Self {
        Self {
            endpoint,
            cache_dir: cache_dir.into(),
            token: HfToken::from_env(),
            max_streams: 4,
            stall_timeout: Duration::from_secs(30),
            max_retries: 6,
            backoff_base: Duration::from_millis(500),
            backoff_max: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(15),
            offline: false,
            cancel: None,
        }
    }

    /// Everything from the environment: `HF_ENDPOINT`, `HF_HUB_CACHE`/`HF_HOME`, `HF_TOKEN`/token
    /// file, `HF_HUB_OFFLINE`.
    #[must_use]
    pub fn from_env() -> Self {
        let mut cfg = Self::new(None, default_cache_dir());
        cfg.offline = offline_from_env();
        cfg
    }

    /// The retry policy of every request: [`HubConfig::backoff_base`],
    /// [`HubConfig::backoff_max`], [`HubConfig::max_retries`].
    #[must_use]
    pub fn backoff(&self) -> Backoff {
        Backoff {
            base: self.backoff_base,
            max: self.backoff_max,
            retries: self.max_retries,
        }
    }
}

/// `HF_HUB_OFFLINE`, else `TRANSFORMERS_OFFLINE`, read as `huggingface_hub` reads them.
fn offline_from_env() -> bool {
    ["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"]
        .iter()
        .find_map(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
        .is_some_and(|v| crate::config::hf_env::is_true(&v))
}

/// A repository pinned to a commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedRepo {
    /// `owner/name`.
    pub repo: String,
    /// The revision asked for (a branch, tag or commit).
    pub requested: String,
    /// The 40-hex commit it resolved to.
    pub commit: String,
}

/// A file of a repository at a commit, as listed by the Hub.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteFile {
    /// Repository-relative path.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// Whether the file is LFS-backed.
    pub is_lfs: bool,
    /// The LFS sha256, when the listing gave it.
    pub lfs_sha256: Option<String>,
}

impl RemoteFile {
    /// One entry of the Hub's tree listing of `repo`: `None` for a directory.
    ///
    /// # Errors
    /// [`HubError::Cache`] when the path is not a safe repository-relative path (`..`, absolute,
    /// empty, a backslash).
    pub fn from_listing(repo: &str, entry: RepoTreeEntry) -> Result<Option<Self>, HubError> {
        let RepoTreeEntry::File {
            path, size, lfs, ..
        } = entry
        else {
            return Ok(None);
        };
        check_rel(repo, &path)?;
        Ok(Some(RemoteFile {
            path,
            size,
            is_lfs: lfs.is_some(),
            lfs_sha256: lfs.and_then(|l| l.sha256).map(|s| s.to_ascii_lowercase()),
        }))
    }
}

/// What a `HEAD` on `resolve` says about a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileMeta {
    /// Normalised ETag (quotes and `W/` removed): the blob name in the cache.
    pub etag: String,
    /// `X-Repo-Commit`.
    pub commit: String,
    /// `X-Linked-Size`, else `Content-Length`.
    pub size: u64,
}

/// A Hub connection plus the local cache.
pub struct Hub {
    pub(crate) hf: hf_hub::HFClient,
    pub(crate) http: reqwest::Client,
    head_http: reqwest::Client,
    pub(crate) cache: HfCache,
    pub(crate) cfg: HubConfig,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub")
            .field("endpoint", &self.endpoint())
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

impl Hub {
    /// Build the clients. No network traffic.
    ///
    /// # Errors
    /// [`HubError::Build`] if the HTTP clients cannot be built or the endpoint is not a URL.
    pub fn new(cfg: HubConfig) -> Result<Self, HubError> {
        let build = |e: Box<dyn std::error::Error + Send + Sync>| HubError::Build(e);
        let ua = format!("spark-deploy/{}", env!("CARGO_PKG_VERSION"));
        // hf-hub's own client has no timeouts: give it one, so a hung Hub cannot hang resolution.
        let api_http = reqwest::Client::builder()
            .user_agent(ua.clone())
            .connect_timeout(cfg.connect_timeout)
            .timeout(Duration::from_secs(120))
            .build()
            .map_err(|e| build(Box::new(e)))?;
        let mut b = hf_hub::HFClient::builder()
            .client(api_http)
            .cache_dir(cfg.cache_dir.clone())
            .retry_max_attempts(3);
        if let Some(e) = &cfg.endpoint {
            b = b.endpoint(e.clone());
        }
        if let Some(t) = &cfg.token {
            b = b.token(t.expose());
        }
        let hf = b.build().map_err(|e| build(Box::new(e)))?;
        let mut headers = HeaderMap::new();
        if let Some(t) = &cfg.token {
            let mut v = HeaderValue::from_str(&format!("Bearer {}", t.expose()))
                .map_err(|_| build("the token is not a valid header value".into()))?;
            v.set_sensitive(true);
            headers.insert(header::AUTHORIZATION, v);
        }
        let http = reqwest::Client::builder()
            .default_headers(headers.clone())
            .user_agent(ua.clone())
            .connect_timeout(cfg.connect_timeout)
            .build()
            .map_err(|e| build(Box::new(e)))?;
        let head_http = reqwest::Client::builder()
            .default_headers(headers)
            .user_agent(ua)
            .connect_timeout(cfg.connect_timeout)
            .timeout(Duration::from_secs(60))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| build(Box::new(e)))?;
        Ok(Self {
            hf,
            http,
            head_http,
            cache: HfCache::new(cfg.cache_dir.clone()),
            cfg,
        })
    }

    /// The endpoint in use.
    #[must_use]
    pub fn endpoint(&self) -> &str {
        self.hf.endpoint()
    }

    /// The cache in use.
    #[must_use]
    pub fn cache(&self) -> &HfCache {
        &self.cache
    }

    /// The configuration.
    #[must_use]
    pub fn config(&self) -> &HubConfig {
        &self.cfg
    }

    fn model(
        &self,
        repo: &str,
    ) -> hf_hub::repository::HFRepository<hf_hub::repository::RepoTypeModel> {
        let (owner, name) = hf_hub::split_id(repo);
        self.hf.model(owner, name)
    }

    /// Pin `repo` (`owner/name`) at `revision`: a commit is checked and kept, a branch or tag is
    /// resolved to its commit once (and recorded under `refs/` when files are fetched).
    ///
    /// # Errors
    /// [`HubError::RepoNotFound`], [`HubError::RevisionNotFound`], [`HubError::Access`] (private or
    /// gated with a missing or refused token), [`HubError::Api`] otherwise.
    pub async fn resolve(&self, repo: &str, revision: &str) -> Result<ResolvedRepo, HubError> {
        self.ensure_online("revision resolution", repo, revision)?;
        let info = self
            .model(repo)
            .info()
            .revision(revision.to_owned())
            .send()
            .await
            .map_err(|e| self.map_hf("revision resolution", repo, revision, e))?;
        let commit = info
            .sha
            .filter(|s| is_commit_id(s))
            .ok_or_else(|| HubError::Malformed {
                repo: repo.to_owned(),
                revision: revision.to_owned(),
                file: String::new(),
                what: "repo info has no 40-hex `sha`".into(),
            })?;
        if is_commit_id(revision) && commit != *revision {
            return Err(HubError::Malformed {
                repo: repo.to_owned(),
                revision: revision.to_owned(),
                file: String::new(),
                what: format!("asked for commit {revision}, the Hub answered {commit}"),
            });
        }
        Ok(ResolvedRepo {
            repo: repo.to_owned(),
            requested: revision.to_owned(),
            commit,
        })
    }

    /// Every file of the pinned revision, with sizes and (where the listing gives it) the LFS sha256.
    ///
    /// # Errors
    /// As [`Hub::resolve`]; [`HubError::Cache`] if a path is unsafe.
    pub async fn list_files(&self, r: &ResolvedRepo) -> Result<Vec<RemoteFile>, HubError> {
        self.ensure_online("file listing", &r.repo, &r.commit)?;
        let model = self.model(&r.repo);
        let stream = model
            .list_tree()
            .revision(r.commit.clone())
            .recursive(true)
            .send()
            .map_err(|e| self.map_hf("file listing", &r.repo, &r.commit, e))?;
        futures::pin_mut!(stream);
        let mut out = Vec::new();
        while let Some(entry) = stream.next().await {
            let entry = entry.map_err(|e| self.map_hf("file listing", &r.repo, &r.commit, e))?;
            if let Some(f) = RemoteFile::from_listing(&r.repo, entry)? {
                out.push(f);
            }
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    /// Every request of ours builds its URL here, so offline mode stops them all before a socket.
    pub(crate) fn resolve_url(
        &self,
        r: &ResolvedRepo,
        file: &str,
    ) -> Result<reqwest::Url, HubError> {
        self.ensure_online(file, &r.repo, &r.commit)?;
        let malformed = |what: String| HubError::Malformed {
            repo: r.repo.clone(),
            revision: r.commit.clone(),
            file: file.to_owned(),
            what,
        };
        let mut url = reqwest::Url::parse(self.endpoint()).map_err(|e| malformed(e.to_string()))?;
        {
            let mut seg = url
                .path_segments_mut()
                .map_err(|()| malformed("endpoint cannot be a base URL".into()))?;
            seg.pop_if_empty();
            seg.extend(r.repo.split('/'));
            seg.push("resolve");
            seg.push(&r.commit);
            seg.extend(file.split('/'));
        }
        Ok(url)
    }

    /// `HEAD` the file at the pinned commit as `huggingface_hub` does: follow relative redirects
    /// only, and read `X-Linked-Etag`/`ETag`, `X-Linked-Size`/`Content-Length`, `X-Repo-Commit`.
    ///
    /// # Errors
    /// [`HubError::Access`] for a gated/private repository without a good token,
    /// [`HubError::EntryNotFound`], [`HubError::Transport`], [`HubError::Status`],
    /// [`HubError::Malformed`] when a required header is missing. Transport failures and
    /// 408/429/5xx answers are retried first ([`HubConfig::max_retries`], exponential backoff).
    pub async fn file_meta(&self, r: &ResolvedRepo, file: &str) -> Result<FileMeta, HubError> {
        self.cfg
            .backoff()
            .retry(|| self.file_meta_once(r, file), HubError::is_transient)
            .await
    }

    async fn file_meta_once(&self, r: &ResolvedRepo, file: &str) -> Result<FileMeta, HubError> {
        let mut url = self.resolve_url(r, file)?;
        let mut resp = None;
        for _ in 0..=10 {
            let res = self
                .head_http
                .head(url.clone())
                .header(header::ACCEPT_ENCODING, "identity")
                .send()
                .await
                .map_err(|source| self.transport(r, file, source))?;
            let relative = res
                .headers()
                .get(header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .filter(|l| res.status().is_redirection() && !l.contains("://"))
                .map(str::to_owned);
            match relative {
                Some(loc) => {
                    url = url.join(&loc).map_err(|e| HubError::Malformed {
                        repo: r.repo.clone(),
                        revision: r.commit.clone(),
                        file: file.to_owned(),
                        what: format!("bad redirect: {e}"),
                    })?;
                }
                None => {
                    resp = Some(res);
                    break;
                }
            }
        }
        let malformed = |what: &str| HubError::Malformed {
            repo: r.repo.clone(),
            revision: r.commit.clone(),
            file: file.to_owned(),
            what: what.to_owned(),
        };
        let resp = resp.ok_or_else(|| malformed("too many relative redirects"))?;
        let status = resp.status();
        if !status.is_success() && !status.is_redirection() {
            return Err(self.status_error(r, file, &resp));
        }
        let h = resp.headers();
        let get = |k: &str| h.get(k).and_then(|v| v.to_str().ok());
        let etag = get("x-linked-etag")
            .or_else(|| get("etag"))
            .map(normalize_etag)
            .filter(|e| !e.is_empty())
            .ok_or_else(|| malformed("no ETag"))?;
        let commit = get("x-repo-commit")
            .map(str::to_owned)
            .ok_or_else(|| malformed("no X-Repo-Commit"))?;
        let size = get("x-linked-size")
            .or_else(|| {
                (!status.is_redirection())
                    .then(|| get("content-length"))
                    .flatten()
            })
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| malformed("no X-Linked-Size or Content-Length"))?;
        // The blob name must be a single safe path component.
        if etag.contains('/') || etag.contains('\\') || etag.starts_with('.') {
            return Err(malformed("unsafe ETag"));
        }
        Ok(FileMeta { etag, commit, size })
    }
}

/// Strip `W/` and quotes from an ETag.
#[must_use]
pub fn normalize_etag(raw: &str) -> String {
    let t = raw.trim();
    let t = t.strip_prefix("W/").unwrap_or(t);
    t.trim_matches('"').to_owned()
}
