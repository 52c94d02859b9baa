//! Progress events of a fetch. The core never prints: front ends render these.

use std::time::Duration;

/// What happened to one file in a fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileOutcome {
    /// Already in the cache and verified (nothing transferred).
    AlreadyVerified,
    /// Downloaded (possibly resuming a partial file) and verified.
    Downloaded,
    /// The cached copy was corrupt; fetched again and verified.
    Refetched,
}

/// A progress event. Byte counts are totals so far, never deltas.
#[derive(Debug, Clone, PartialEq)]
pub enum FetchEvent {
    /// The fetch starts: how many files and bytes it covers.
    Started {
        /// Repository id.
        repo: String,
        /// Commit.
        commit: String,
        /// Number of files.
        files: usize,
        /// Sum of their sizes.
        total_bytes: u64,
    },
    /// A file transfer starts (or restarts after a retry) at `offset`.
    FileStarted {
        /// Repository-relative path.
        file: String,
        /// Bytes already on disk (resume point).
        offset: u64,
        /// File size.
        size: u64,
    },
    /// Bytes arrived.
    Progress {
        /// Repository-relative path of the file that advanced.
        file: String,
        /// Bytes of that file on disk.
        file_done: u64,
        /// Its size.
        file_total: u64,
        /// Bytes of all files done (including cached and resumed bytes).
        done: u64,
        /// Sum of all file sizes.
        total: u64,
        /// Transfer rate over this fetch, bytes per second.
        rate_bps: f64,
        /// Estimated time left at that rate (`None` before any byte arrived).
        eta: Option<Duration>,
    },
    /// A transfer failed or stalled; it will be retried after `backoff`.
    Retrying {
        /// Repository-relative path.
        file: String,
        /// Consecutive failed attempts so far.
        attempt: u32,
        /// Why (no secret in it).
        reason: String,
        /// Wait before the next attempt.
        backoff: Duration,
    },
    /// A file is done.
    FileDone {
        /// Repository-relative path.
        file: String,
        /// How it ended.
        outcome: FileOutcome,
    },
    /// The fetch finished; every file is present and verified.
    Finished {
        /// Number of files.
        files: usize,
        /// Bytes transferred over the network in this fetch.
        transferred: u64,
    },
}

/// Receives progress events. Called from download tasks: it must not block.
pub trait FetchProgress: Send + Sync {
    /// One event.
    fn on_event(&self, event: &FetchEvent);

    /// Paths a consumer running alongside wants first, most wanted first (a rank-file build that
    /// needs the shard holding the start of its files). Asked each time a download slot frees;
    /// the files it names that are still waiting start before the others. `None`: the consumer
    /// has not decided yet, and a large file waits for its decision (a few seconds at most:
    /// small files go on meanwhile). Nothing wanted by default.
    fn wanted_first(&self) -> Option<Vec<String>> {
        Some(Vec::new())
    }
}

/// Ignores every event.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProgress;

impl FetchProgress for NoProgress {
    fn on_event(&self, _event: &FetchEvent) {}
}

impl<F: Fn(&FetchEvent) + Send + Sync> FetchProgress for F {
    fn on_event(&self, event: &FetchEvent) {
        self(event);
    }
}

impl std::fmt::Display for FileOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::AlreadyVerified => "already in the cache and verified",
            Self::Downloaded => "downloaded and verified",
            Self::Refetched => "the cached copy was corrupt; fetched again and verified",
        })
    }
}

/// One line for a log, in plain words.
impl std::fmt::Display for FetchEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Started {
                repo,
                commit,
                files,
                total_bytes,
            } => write!(
                f,
                "fetching {files} file(s), {total_bytes} bytes, of {repo} at {commit}"
            ),
            Self::FileStarted { file, offset, size } if *offset > 0 => {
                write!(f, "{file}: resuming at byte {offset} of {size}")
            }
            Self::FileStarted { file, size, .. } => write!(f, "{file}: starting, {size} bytes"),
            Self::Progress {
                file,
                file_done,
                file_total,
                done,
                total,
                ..
            } => write!(
                f,
                "{file}: {file_done} of {file_total} bytes ({done} of {total} in all)"
            ),
            Self::Retrying {
                file,
                attempt,
                reason,
                backoff,
            } => write!(
                f,
                "{file}: {reason}; retrying in {} s (failed attempt {attempt} in a row)",
                backoff.as_secs_f64()
            ),
            Self::FileDone { file, outcome } => write!(f, "{file}: {outcome}"),
            Self::Finished { files, transferred } => write!(
                f,
                "fetched: {files} file(s) present and verified, {transferred} bytes transferred"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retry_reads_as_a_sentence_without_rust_syntax() {
        let line = FetchEvent::Retrying {
            file: "model-00001-of-00002.safetensors".into(),
            attempt: 2,
            reason: "stalled: no byte for 30 s".into(),
            backoff: Duration::from_millis(1_500),
        }
        .to_string();
        assert_eq!(
            line,
            "model-00001-of-00002.safetensors: stalled: no byte for 30 s; retrying in 1.5 s (failed attempt 2 in a row)"
        );
        assert!(!line.contains('{') && !line.contains("Retrying"));
    }
}
