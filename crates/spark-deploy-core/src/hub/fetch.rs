//! Resumable, verified downloads into the HF cache.
//!
//! # Expected flow
//! 1. `HEAD` every selected file (bounded concurrency) for its ETag (= blob name), size and commit.
//! 2. Files with the same ETag are fetched once.
//! 3. Per blob: a cached blob that verifies is kept (never fetched again); a corrupt one is removed
//!    and fetched again. Otherwise bytes go to `blobs/<etag>.incomplete`, continuing from its
//!    length with `Range: bytes=<len>-`. A transfer that stalls (no byte for
//!    [`HubConfig::stall_timeout`](super::HubConfig)) or breaks is retried with exponential
//!    backoff; [`HubConfig::max_retries`](super::HubConfig) consecutive failures *without
//!    progress* end the fetch.
//! 4. The complete file is verified (size, sha256 / git sha1, safetensors structure), then renamed
//!    to `blobs/<etag>`, and `snapshots/<commit>/<path>` is linked to it. A partial file never sits
//!    under a final name.
//! 5. A branch revision is recorded in `refs/<branch>`.
//!
//! Steps 3 and 4 for one blob (resume, retry, hash while writing, verify, rename) are in the
//! download module.
//!
//! A fetch given a cancel signal ([`HubConfig::cancel`](super::HubConfig)) ends with
//! [`FetchError::Cancelled`] once it turns `true`: the bytes each transfer received are written
//! and synced to its `.incomplete` file first, so the next fetch continues from there.
//!
//! # Caveats
//! No cross-process lock is taken: do not run two fetches of the same repository into one cache at
//! the same time (the Python client's `.locks` are not honoured either).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt as _;

use super::cache::CacheError;
use super::client::{FileMeta, Hub, RemoteFile, ResolvedRepo};
use super::error::HubError;
use super::order::{Picks, download_order};
use super::patterns::{AllowPatterns, PatternError};
use super::progress::{FetchEvent, FetchProgress, FileOutcome};
use super::snapshot::{self, ManifestEntry, VerifyReport};
use super::verify::{Expected, VerifyError};

/// Errors of a fetch.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The Hub refused or failed (access, not found, bad response).
    #[error(transparent)]
    Hub(#[from] HubError),
    /// A file pattern cannot be used.
    #[error(transparent)]
    Pattern(#[from] PatternError),
    /// A file kept failing without progress.
    #[error(
        "{file} of {repo} at {commit}: gave up after {attempts} consecutive failed attempts; last: {last}"
    )]
    GaveUp {
        /// Repository id.
        repo: String,
        /// Commit.
        commit: String,
        /// Repository-relative path.
        file: String,
        /// Attempts made.
        attempts: u32,
        /// The last failure.
        last: String,
    },
    /// A complete download did not verify, twice.
    #[error("{file} of {repo} at {commit}: the downloaded file does not verify")]
    Verify {
        /// Repository id.
        repo: String,
        /// Commit.
        commit: String,
        /// Repository-relative path.
        file: String,
        /// What is wrong.
        #[source]
        source: Box<VerifyError>,
    },
    /// The listing and the file's metadata disagree.
    #[error("{file} of {repo} at {commit}: {what}")]
    Inconsistent {
        /// Repository id.
        repo: String,
        /// Commit.
        commit: String,
        /// Repository-relative path.
        file: String,
        /// What disagrees.
        what: String,
    },
    /// A cache file operation failed.
    #[error("{file} of {repo}: cache I/O failed on {path}")]
    Io {
        /// Repository id.
        repo: String,
        /// Repository-relative path.
        file: String,
        /// Path involved.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Linking the snapshot or writing a ref failed.
    #[error(transparent)]
    Cache(#[from] CacheError),
    /// Offline mode: the cache lacks (or holds corrupt) files the fetch wants.
    #[error(
        "{repo} at {revision}: offline (HF_HUB_OFFLINE or hub.offline), and the cache {cache} \
         does not hold what the fetch needs: {}", problems.join("; ")
    )]
    Offline {
        /// Repository id.
        repo: String,
        /// Revision asked for.
        revision: String,
        /// The hub cache directory looked in.
        cache: PathBuf,
        /// One line per missing or bad file.
        problems: Vec<String>,
    },
    /// The cancel signal was raised; partial files are kept, resumable.
    #[error("{repo} at {commit}: cancelled; the partial files are kept and resumed next time")]
    Cancelled {
        /// Repository id.
        repo: String,
        /// Commit.
        commit: String,
    },
}

impl FetchError {
    /// Whether the Hub could not be reached at all (connection refused, DNS, TLS, timeout), as
    /// opposed to refusing or answering wrongly: a pinned, fully verified cache may then stand in.
    #[must_use]
    pub fn is_unreachable(&self) -> bool {
        matches!(
            self,
            Self::Hub(HubError::Api { .. } | HubError::Transport { .. })
        )
    }

    /// Whether offline mode stopped the fetch (nothing was requested).
    #[must_use]
    pub fn is_offline(&self) -> bool {
        matches!(
            self,
            Self::Offline { .. } | Self::Hub(HubError::Offline { .. })
        )
    }

    /// What the user can do about an offline stop (`None` for other errors).
    #[must_use]
    pub fn remedy(&self) -> Option<String> {
        match self {
            Self::Offline { cache, .. } => Some(format!(
                "run `spark-deploy fetch` with HF_HUB_OFFLINE unset (and hub.offline = false) \
                 where the Hub is reachable, or copy a complete cache into {}",
                cache.display()
            )),
            Self::Hub(HubError::Offline { .. }) => {
                Some("unset HF_HUB_OFFLINE (and hub.offline) where the Hub is reachable".to_owned())
            }
            _ => None,
        }
    }
}

/// One file of a finished fetch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchedFile {
    /// Repository-relative path.
    pub path: String,
    /// Blob name.
    pub etag: String,
    /// Size.
    pub size: u64,
    /// Where it is: `snapshots/<commit>/<path>`.
    pub local: PathBuf,
    /// How it got there.
    pub outcome: FileOutcome,
}

/// Result of a fetch.
#[derive(Debug, Clone)]
pub struct FetchReport {
    /// The pinned repository.
    pub repo: ResolvedRepo,
    /// `snapshots/<commit>`.
    pub snapshot_dir: PathBuf,
    /// Every selected file, present and verified.
    pub files: Vec<FetchedFile>,
    /// Bytes received over the network.
    pub transferred: u64,
}

impl FetchReport {
    /// "all N files present and verified".
    #[must_use]
    pub fn summary(&self) -> String {
        let fetched = self
            .files
            .iter()
            .filter(|f| f.outcome != FileOutcome::AlreadyVerified)
            .count();
        format!(
            "all {} files present and verified ({fetched} fetched, {} bytes transferred)",
            self.files.len(),
            self.transferred
        )
    }
}

pub(super) struct Tally<'a> {
    /// The download slots on the link: a transfer holds one from its request until 250 ms before
    /// its last byte at its rate so far (the next file's request and first byte overlap that
    /// tail), not while its file is synced, verified and linked.
    pub(super) slots: std::sync::Arc<tokio::sync::Semaphore>,
    pub(super) total: u64,
    pub(super) done: AtomicU64,
    pub(super) transferred: AtomicU64,
    pub(super) start: Instant,
    pub(super) progress: &'a dyn FetchProgress,
}

impl Tally<'_> {
    pub(super) fn progress(&self, file: &str, file_done: u64, file_total: u64) {
        let done = self.done.load(Ordering::Relaxed);
        let tr = self.transferred.load(Ordering::Relaxed);
        let secs = self.start.elapsed().as_secs_f64().max(1e-3);
        let rate = tr as f64 / secs;
        let eta = (rate > 0.0)
            .then(|| Duration::from_secs_f64(self.total.saturating_sub(done) as f64 / rate));
        self.progress.on_event(&FetchEvent::Progress {
            file: file.to_owned(),
            file_done,
            file_total,
            done,
            total: self.total,
            rate_bps: rate,
            eta,
        });
    }
}

/// One blob to bring into the cache, and the paths that point to it.
pub(super) struct Job {
    pub(super) etag: String,
    pub(super) paths: Vec<String>,
    pub(super) size: u64,
    pub(super) expected: Expected,
}

/// The files matching any of `patterns`, read as `huggingface_hub`'s `allow_patterns` (see
/// [`AllowPatterns`]: `*` crosses folders, a trailing `/` names a folder); no pattern selects
/// every file.
///
/// # Errors
/// [`PatternError`] for a pattern that cannot be compiled.
pub fn select<'a>(
    files: &'a [RemoteFile],
    patterns: &[String],
) -> Result<Vec<&'a RemoteFile>, PatternError> {
    if patterns.is_empty() {
        return Ok(files.iter().collect());
    }
    let allow = AllowPatterns::new(patterns)?;
    Ok(files.iter().filter(|f| allow.is_match(&f.path)).collect())
}

/// Resolves once `cancel` is `true`; never without a signal.
pub(super) async fn cancelled(cancel: Option<&tokio::sync::watch::Receiver<bool>>) {
    match cancel {
        Some(rx) => {
            let mut rx = rx.clone();
            if rx.wait_for(|c| *c).await.is_err() {
                // The sender is gone: no cancellation can come any more.
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}

impl Hub {
    pub(super) fn is_cancelled(&self) -> bool {
        self.cfg.cancel.as_ref().is_some_and(|rx| *rx.borrow())
    }

    pub(super) fn cancelled_error(r: &ResolvedRepo) -> FetchError {
        FetchError::Cancelled {
            repo: r.repo.clone(),
            commit: r.commit.clone(),
        }
    }

    /// Verify-only mode: check the cached snapshot of `repo` at `revision` (a commit, or a branch
    /// recorded in `refs/`) with **no network**; see [`snapshot::verify_snapshot`]. `wanted` limits
    /// the check to these paths (and reports any of them missing).
    ///
    /// # Errors
    /// [`VerifyError::NoSnapshot`] when nothing is cached for that revision; per-file problems
    /// are listed in the report.
    pub fn verify_only(
        &self,
        repo: &str,
        revision: &str,
        wanted: Option<&[String]>,
    ) -> Result<VerifyReport, VerifyError> {
        snapshot::verify_snapshot(&self.cache, repo, revision, wanted)
    }

    /// Resolve `repo` at `revision`, list it, and [`fetch`](Hub::fetch) the files matching
    /// `patterns` (see [`select`]; empty = all files). In offline mode
    /// ([`HubConfig::offline`](super::HubConfig)) no request is made: the files come from the
    /// verified cache (see [`super::offline`]).
    ///
    /// # Errors
    /// As [`Hub::resolve`], [`Hub::list_files`] and [`Hub::fetch`]; offline,
    /// [`FetchError::Offline`] naming every missing or bad file.
    pub async fn fetch_repo(
        &self,
        repo: &str,
        revision: &str,
        patterns: &[String],
        progress: &dyn FetchProgress,
    ) -> Result<FetchReport, FetchError> {
        if self.cfg.offline {
            return self.fetch_offline(repo, revision, patterns);
        }
        let pinned = self.resolve(repo, revision).await?;
        let files = self.list_files(&pinned).await?;
        let wanted: Vec<RemoteFile> = select(&files, patterns)?.into_iter().cloned().collect();
        self.fetch(&pinned, &wanted, progress).await
    }

    /// Downloads and verifies one blob, then links every path it serves into the snapshot.
    async fn fetch_and_link(
        &self,
        r: &ResolvedRepo,
        job: &Job,
        tally: &Tally<'_>,
        slot: tokio::sync::OwnedSemaphorePermit,
    ) -> Result<(String, FileOutcome), FetchError> {
        let o = self.fetch_blob(r, job, tally, slot).await?;
        for path in &job.paths {
            self.cache
                .link_snapshot(&r.repo, &r.commit, path, &job.etag)?;
            tally.progress.on_event(&FetchEvent::FileDone {
                file: path.clone(),
                outcome: o,
            });
        }
        Ok((job.etag.clone(), o))
    }

    /// Bring `files` of the pinned repository into the cache, resuming partial downloads and
    /// verifying every file. See the module docs for the flow.
    ///
    /// # Errors
    /// [`FetchError::Hub`] when the Hub refuses (e.g. [`HubError::Access`] for a gated repository
    /// without a good token) or answers wrongly; [`FetchError::GaveUp`] after repeated stalls or
    /// broken transfers without progress; [`FetchError::Verify`] when a fresh download does not
    /// verify twice; [`FetchError::Io`] / [`FetchError::Cache`] on local file-system failures.
    pub async fn fetch(
        &self,
        r: &ResolvedRepo,
        files: &[RemoteFile],
        progress: &dyn FetchProgress,
    ) -> Result<FetchReport, FetchError> {
        // 1. Metadata.
        let metas: Vec<(RemoteFile, Result<FileMeta, HubError>)> =
            // Futures are built first (not in `StreamExt::map`) so the whole fetch stays `Send`.
            futures::stream::iter(
                files
                    .iter()
                    .cloned()
                    .map(|f| async move {
                        let m = self.file_meta(r, &f.path).await;
                        (f, m)
                    })
                    .collect::<Vec<_>>(),
            )
            .buffer_unordered(self.cfg.max_streams.max(1) * 2)
                .collect()
                .await;
        let mut jobs: BTreeMap<String, Job> = BTreeMap::new();
        let mut by_path: Vec<(String, String, u64)> = Vec::new();
        for (f, m) in metas {
            let m = m?;
            let inconsistent = |what: String| FetchError::Inconsistent {
                repo: r.repo.clone(),
                commit: r.commit.clone(),
                file: f.path.clone(),
                what,
            };
            if !m.commit.eq_ignore_ascii_case(&r.commit) {
                return Err(inconsistent(format!(
                    "served from commit {} instead of the pinned one",
                    m.commit
                )));
            }
            if m.size != f.size {
                return Err(inconsistent(format!(
                    "the listing says {} bytes, the file metadata {}",
                    f.size, m.size
                )));
            }
            let mut expected = Expected::from_etag(&m.etag);
            expected.size = Some(m.size);
            if f.is_lfs {
                // The LFS oid is the sha256; the Hub's ETag of an LFS file is that same sha256.
                expected.git_sha1 = None;
                if let Some(s) = &f.lfs_sha256 {
                    if expected.sha256.as_ref().is_some_and(|e| e != s) {
                        return Err(inconsistent(format!(
                            "LFS sha256 {s} differs from the ETag {}",
                            m.etag
                        )));
                    }
                    expected.sha256 = Some(s.clone());
                }
            } else {
                expected.sha256 = None;
            }
            by_path.push((f.path.clone(), m.etag.clone(), m.size));
            jobs.entry(m.etag.clone())
                .or_insert_with(|| Job {
                    etag: m.etag.clone(),
                    paths: Vec::new(),
                    size: m.size,
                    expected,
                })
                .paths
                .push(f.path.clone());
        }
        by_path.sort();

        let tally = Tally {
            slots: std::sync::Arc::new(tokio::sync::Semaphore::new(self.cfg.max_streams.max(1))),
            total: jobs.values().map(|j| j.size).sum(),
            done: AtomicU64::new(0),
            transferred: AtomicU64::new(0),
            start: Instant::now(),
            progress,
        };
        progress.on_event(&FetchEvent::Started {
            repo: r.repo.clone(),
            commit: r.commit.clone(),
            files: by_path.len(),
            total_bytes: tally.total,
        });

        // 2. Blobs, a bounded number at once, in `download_order`. Each blob's snapshot links
        //    are made as soon as it verifies, so a consumer running alongside (the pipelined
        //    `up`) can use a file the moment its link appears: a link only ever points to a
        //    verified blob.
        //    A file the consumer wants first ([`FetchProgress::wanted_first`]) jumps the queue
        //    when a slot frees: the next file is chosen only once a slot is free, and starts in
        //    it. Up to twice as many files as download slots are under way: while one is synced,
        //    verified and linked, the next one's transfer has its slot.
        let tally_ref = &tally;
        let mut order: Vec<&Job> = jobs.values().collect();
        order.sort_by(|a, b| download_order(a).cmp(&download_order(b)));
        let picks = Picks::new(&order, progress, std::sync::Arc::clone(&tally_ref.slots));
        let outcomes: Vec<Result<(String, FileOutcome), FetchError>> = picks
            .map(|(i, slot)| self.fetch_and_link(r, order[i], tally_ref, slot))
            .buffer_unordered(self.cfg.max_streams.max(1) * 2)
            .collect()
            .await;
        let mut outcome_of = BTreeMap::new();
        for o in outcomes {
            let (etag, outcome) = o?;
            outcome_of.insert(etag, outcome);
        }

        // 3. Ref and manifest.
        let mut report_files = Vec::new();
        let mut manifest = Vec::new();
        for (path, etag, size) in by_path {
            let local = self.cache.snapshot_path(&r.repo, &r.commit, &path)?;
            let outcome = outcome_of
                .get(&etag)
                .copied()
                .unwrap_or(FileOutcome::AlreadyVerified);
            manifest.push(ManifestEntry {
                path: path.clone(),
                etag: etag.clone(),
                expected: jobs
                    .get(&etag)
                    .map(|j| j.expected.clone())
                    .unwrap_or_default(),
            });
            report_files.push(FetchedFile {
                path,
                etag,
                size,
                local,
                outcome,
            });
        }
        if !crate::commit::is_commit_id(&r.requested) {
            self.cache.write_ref(&r.repo, &r.requested, &r.commit)?;
        }
        snapshot::update_manifest(&self.cache, &r.repo, &r.commit, &manifest);
        let transferred = tally.transferred.load(Ordering::Relaxed);
        progress.on_event(&FetchEvent::Finished {
            files: report_files.len(),
            transferred,
        });
        Ok(FetchReport {
            repo: r.clone(),
            snapshot_dir: self.cache.snapshot_dir(&r.repo, &r.commit),
            files: report_files,
            transferred,
        })
    }
}
