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
