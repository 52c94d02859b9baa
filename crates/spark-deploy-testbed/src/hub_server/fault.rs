//! Fault injection for file transfers and the request log tests assert on.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// What happens to a file transfer (the body of a `GET …/resolve/…`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fault {
    /// Serve normally.
    #[default]
    None,
    /// Send `bytes` bytes of the response body, then abort the connection.
    CutAfter {
        /// Body bytes sent before the cut (counted per response, not per file offset).
        bytes: u64,
    },
    /// Deliver the byte at file offset `offset` with its bits flipped (silent corruption).
    FlipByte {
        /// Absolute offset in the file.
        offset: u64,
    },
    /// Send `bytes` bytes of the response body, then send nothing for `dur`, then continue.
    StallAfter {
        /// Body bytes sent before the stall.
        bytes: u64,
        /// How long the stall lasts.
        dur: Duration,
    },
}

/// A fault and the transfers it applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultRule {
    /// Repository-relative path the rule applies to; `None` = every file.
    pub file: Option<String>,
    /// The fault.
    pub fault: Fault,
    /// How many more transfers it applies to; `None` = every transfer until replaced.
    pub remaining: Option<u32>,
}

impl FaultRule {
    /// A rule for every transfer of every file.
    #[must_use]
    pub fn all(fault: Fault) -> Self {
        Self {
            file: None,
            fault,
            remaining: None,
        }
    }

    /// A rule for every transfer of one file (repository-relative path).
    #[must_use]
    pub fn file(path: impl Into<String>, fault: Fault) -> Self {
        Self {
            file: Some(path.into()),
            fault,
            remaining: None,
        }
    }

    /// Limit the rule to the next `n` matching transfers.
    #[must_use]
    pub fn times(mut self, n: u32) -> Self {
        self.remaining = Some(n);
        self
    }

    /// Whether the rule is used up.
    pub(crate) fn exhausted(&self) -> bool {
        self.remaining == Some(0)
    }

    pub(crate) fn matches(&self, path: &str) -> bool {
        !self.exhausted() && self.file.as_deref().is_none_or(|f| f == path)
    }
}

impl From<Fault> for FaultRule {
    /// A rule for every transfer of every file.
    fn from(fault: Fault) -> Self {
        Self::all(fault)
    }
}

/// One request the server answered. Never holds the `Authorization` header.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RequestRecord {
    /// `GET`, `HEAD`, …
    pub method: String,
    /// Decoded request path.
    pub path: String,
    /// The `Range` header as sent, if any.
    pub range: Option<String>,
    /// Start offset of the served range (0 for a full body), for file transfers.
    pub range_start: Option<u64>,
    /// Response status.
    pub status: u16,
    /// Whether the request carried a bearer token (never the token itself).
    pub had_token: bool,
    /// Body bytes actually sent (file transfers only).
    pub body_bytes: u64,
}

#[derive(Debug)]
pub(crate) struct LiveRecord {
    pub(crate) rec: RequestRecord,
    pub(crate) sent: Arc<AtomicU64>,
}

impl LiveRecord {
    pub(crate) fn snapshot(&self) -> RequestRecord {
        let mut r = self.rec.clone();
        r.body_bytes = self.sent.load(Ordering::Relaxed);
        r
    }
}
