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

/// Files below this size are "small": a consumer plans from them (config, index, tokenizer).
const SMALL_FILE: u64 = 16 << 20;

/// How long a large file waits, at most, for an undecided consumer's wish
/// ([`FetchProgress::wanted_first`] is `None`).
const WISH_WAIT: Duration = Duration::from_secs(3);

/// The blobs still waiting (indices into the fetch's order), as a stream of the next one to
/// start: a file the consumer wants first jumps the queue; while the consumer is undecided a
/// large file waits (up to `undecided_until`). Polled by `buffer_unordered` whenever a slot frees.
struct Picks<'a> {
    waiting: std::collections::VecDeque<(usize, u64, &'a [String])>,
    progress: &'a dyn FetchProgress,
    undecided_until: Instant,
    sleep: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl Picks<'_> {
    /// The next index to start; `Err(())` to wait a moment for the consumer.
    fn pick(&mut self) -> Result<Option<usize>, ()> {
        let Some(&(_, size, _)) = self.waiting.front() else {
            return Ok(None);
        };
        let at = match self.progress.wanted_first() {
            Some(wanted) => wanted
                .iter()
                .find_map(|p| {
                    self.waiting
                        .iter()
                        .position(|(_, _, paths)| paths.contains(p))
                })
                .unwrap_or(0),
            None if size < SMALL_FILE || Instant::now() >= self.undecided_until => 0,
            None => return Err(()),
        };
        Ok(self.waiting.remove(at).map(|(i, _, _)| i))
    }
}

impl futures::Stream for Picks<'_> {
    type Item = usize;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<usize>> {
        loop {
            if let Some(sleep) = self.sleep.as_mut() {
                std::task::ready!(sleep.as_mut().poll(cx));
                self.sleep = None;
            }
            match self.pick() {
                Ok(next) => return std::task::Poll::Ready(next),
                Err(()) => {
                    self.sleep = Some(Box::pin(tokio::time::sleep(Duration::from_millis(20))));
                }
            }
        }
    }
}

/// The order blobs are fetched in: the small files first, smallest first (a consumer plans from
/// them, so they should be final early), then the large ones by name: a checkpoint's shards in
/// index order, so the shards that hold the start of a rank file land first and the file's
/// finished prefix (hashed, and sent to its worker, while the rest downloads) grows early
/// rather than all at the end.
fn download_order(size: u64, paths: &[String]) -> (bool, u64, &[String]) {
    let large = size >= SMALL_FILE;
    (large, if large { 0 } else { size }, paths)
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
    ) -> Result<(String, FileOutcome), FetchError> {
        let o = self.fetch_blob(r, job, tally).await?;
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
        //    when a slot frees.
        let tally_ref = &tally;
        let mut order: Vec<&Job> = jobs.values().collect();
        order.sort_by(|a, b| {
            download_order(a.size, &a.paths).cmp(&download_order(b.size, &b.paths))
        });
        let picks = Picks {
            waiting: order
                .iter()
                .enumerate()
                .map(|(i, j)| (i, j.size, j.paths.as_slice()))
                .collect(),
            progress,
            undecided_until: Instant::now() + WISH_WAIT,
            sleep: None,
        };
        let outcomes: Vec<Result<(String, FileOutcome), FetchError>> = picks
            .map(|i| self.fetch_and_link(r, order[i], tally_ref))
            .buffer_unordered(self.cfg.max_streams.max(1))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_files_first_by_size_then_large_ones_by_name() {
        let files = [
            ("model-00002-of-00003.safetensors", 300 << 20),
            ("tokenizer.json", 9 << 20),
            ("model-00001-of-00003.safetensors", 310 << 20),
            ("config.json", 2 << 10),
            ("model-00003-of-00003.safetensors", 100 << 20),
            ("model.safetensors.index.json", 40 << 10),
        ];
        let mut jobs: Vec<(u64, Vec<String>)> = files
            .iter()
            .map(|(p, s)| (*s, vec![(*p).to_owned()]))
            .collect();
        jobs.sort_by(|a, b| download_order(a.0, &a.1).cmp(&download_order(b.0, &b.1)));
        let order: Vec<&str> = jobs.iter().map(|j| j.1[0].as_str()).collect();
        assert_eq!(
            order,
            [
                "config.json",
                "model.safetensors.index.json",
                "tokenizer.json",
                "model-00001-of-00003.safetensors",
                "model-00002-of-00003.safetensors",
                "model-00003-of-00003.safetensors",
            ]
        );
    }
}
