//! The event stream: what the core reports instead of printing.
//!
//! Anything may speak through it: a plan step, a command outside a plan (`status`, a benchmark)
//! or a supervisor. Every event names its [`Source`]. The CLI renders events (progress bars, or
//! JSON lines with `--json`), Python receives them in a callback. Every event is serialisable as
//! one JSON object carrying [`EVENT_SCHEMA`]. Sinks see events after [`RedactingSink`] has
//! replaced every known secret by `***`.
//!
//! # Schema `spark-deploy.event/v2` (changes from v1)
//!
//! - Every event carries `source` instead of `step`: `{"step": "fetch_checkpoint"}` for a plan
//!   step, `{"command": "status"}` for a command, `{"supervisor": "watch"}` for a supervisor. A
//!   v1 consumer reading `event["step"]` reads `event["source"]["step"]` (absent for the other
//!   sources).
//! - `started` may come from any source; `finished`, `skipped` and `failed` likewise.

use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::secret::Secret;

/// Schema id of serialised events; bumped on any incompatible change.
pub const EVENT_SCHEMA: &str = "spark-deploy.event/v2";

/// The kinds of plan step, as they appear in events and plan JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepKind {
    /// Check every node before anything changes.
    Preflight,
    /// Download the checkpoint, Engram shards, kit and overlay into the HF cache.
    FetchCheckpoint,
    /// Build every rank's inputs.
    BuildRankCache,
    /// Give the workers exactly the bytes their rank needs.
    ConfigureWorkerStorage,
    /// Make the same image present on every node.
    BuildImage,
    /// Start the ranks, followers first.
    LaunchRank,
    /// Wait for readiness and run one real generation.
    Smoke,
    /// Stop every rank, rank 0 first, saving logs.
    Stop,
}

impl StepKind {
    /// Every kind, in the standard plan's order (Stop last).
    pub const ALL: [Self; 8] = [
        Self::Preflight,
        Self::FetchCheckpoint,
        Self::BuildRankCache,
        Self::ConfigureWorkerStorage,
        Self::BuildImage,
        Self::LaunchRank,
        Self::Smoke,
        Self::Stop,
    ];

    /// The step's name as written in docs (`FetchCheckpoint`).
    #[must_use]
    pub fn title(self) -> &'static str {
        match self {
            Self::Preflight => "Preflight",
            Self::FetchCheckpoint => "FetchCheckpoint",
            Self::BuildRankCache => "BuildRankCache",
            Self::ConfigureWorkerStorage => "ConfigureWorkerStorage",
            Self::BuildImage => "BuildImage",
            Self::LaunchRank => "LaunchRank",
            Self::Smoke => "Smoke",
            Self::Stop => "Stop",
        }
    }

    /// The kind titled `title` (as [`StepKind::title`] writes it), if any.
    #[must_use]
    pub fn from_title(title: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.title() == title)
    }
}

/// Who an event comes from.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// A step of a plan.
    Step(StepKind),
    /// A command outside a plan (`status`, `logs`, a benchmark).
    Command(String),
    /// A long-running supervisor (`watch`).
    Supervisor(String),
}

impl Source {
    /// The plan step, when the source is one.
    #[must_use]
    pub fn step(&self) -> Option<StepKind> {
        match self {
            Self::Step(k) => Some(*k),
            Self::Command(_) | Self::Supervisor(_) => None,
        }
    }

    /// A short name for people: the step's title, the command or the supervisor.
    #[must_use]
    pub fn title(&self) -> &str {
        match self {
            Self::Step(k) => k.title(),
            Self::Command(c) | Self::Supervisor(c) => c,
        }
    }
}

impl From<StepKind> for Source {
    fn from(kind: StepKind) -> Self {
        Self::Step(kind)
    }
}

/// Severity of a log event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// Detail.
    Debug,
    /// Normal progress.
    Info,
    /// Accepted but risky.
    Warn,
    /// Failure detail.
    Error,
}

/// One file's own bytes within a step's progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileBytes {
    /// Bytes of the file done.
    pub done: u64,
    /// Its size.
    pub total: u64,
}

/// One thing that happened.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// A step began.
    Started {
        /// Who speaks.
        source: Source,
        /// What it will do.
        message: String,
    },
    /// Bytes moved (download, copy, rank file).
    Progress {
        /// Who speaks.
        source: Source,
        /// Node, when node-specific.
        #[serde(skip_serializing_if = "Option::is_none")]
        node: Option<String>,
        /// What is moving (file name).
        label: String,
        /// Bytes done so far.
        bytes_done: u64,
        /// Total bytes, when known.
        #[serde(skip_serializing_if = "Option::is_none")]
        bytes_total: Option<u64>,
        /// Current rate, bytes per second.
        #[serde(skip_serializing_if = "Option::is_none")]
        rate_bps: Option<f64>,
        /// Estimated seconds left.
        #[serde(skip_serializing_if = "Option::is_none")]
        eta_s: Option<f64>,
        /// When the figures above are the step's total (downloads, worker copies): the bytes of
        /// the file `label` names, done and in all.
        #[serde(skip_serializing_if = "Option::is_none")]
        file: Option<FileBytes>,
    },
    /// A log line (engine output, a decision).
    Log {
        /// Who speaks.
        source: Source,
        /// Node, when node-specific.
        #[serde(skip_serializing_if = "Option::is_none")]
        node: Option<String>,
        /// Severity.
        level: Level,
        /// The line.
        line: String,
    },
    /// A step had nothing to do.
    Skipped {
        /// Who speaks.
        source: Source,
        /// Why (e.g. "all 43 files present and verified").
        reason: String,
    },
    /// A step completed.
    Finished {
        /// Who speaks.
        source: Source,
        /// Wall time.
        duration_ms: u64,
        /// Bytes moved, when any.
        #[serde(skip_serializing_if = "Option::is_none")]
        bytes: Option<u64>,
    },
    /// A step failed.
    Failed {
        /// Who speaks.
        source: Source,
        /// The error chain.
        error: String,
        /// What to do about it.
        #[serde(skip_serializing_if = "Option::is_none")]
        remedy: Option<String>,
    },
}

/// An event as serialised: schema id plus the event's fields.
#[derive(Debug, Serialize)]
pub struct EventRecord<'a> {
    /// [`EVENT_SCHEMA`].
    pub schema: &'static str,
    /// Milliseconds since the Unix epoch.
    pub ts_ms: u128,
    /// The event.
    #[serde(flatten)]
    pub event: &'a Event,
}

/// The rate (bytes per second since `started`) and the seconds left at that rate, for a
/// progress event of `done` of `total` bytes; `None` before anything moved.
#[must_use]
pub fn rate_and_eta(
    done: u64,
    total: u64,
    started: std::time::Instant,
) -> (Option<f64>, Option<f64>) {
    let secs = started.elapsed().as_secs_f64();
    if done == 0 || secs <= 0.0 {
        return (None, None);
    }
    let rate = done as f64 / secs;
    (Some(rate), Some(total.saturating_sub(done) as f64 / rate))
}

impl Event {
    /// One JSON line (no trailing newline) with the schema id and a timestamp.
    #[must_use]
    pub fn to_json_line(&self) -> String {
        let ts_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        serde_json::to_string(&EventRecord { schema: EVENT_SCHEMA, ts_ms, event: self })
            .unwrap_or_else(|e| format!("{{\"schema\":\"{EVENT_SCHEMA}\",\"event\":\"failed\",\"error\":\"unserialisable event: {e}\"}}"))
    }

    /// Who the event comes from.
    #[must_use]
    pub fn source(&self) -> &Source {
        match self {
            Self::Started { source, .. }
            | Self::Progress { source, .. }
            | Self::Log { source, .. }
            | Self::Skipped { source, .. }
            | Self::Finished { source, .. }
            | Self::Failed { source, .. } => source,
        }
    }

    fn redact(self, secrets: &[Secret]) -> Self {
        let r = |s: String| secrets.iter().fold(s, |acc, sec| sec.redact_in(&acc));
        match self {
            Self::Started { source, message } => Self::Started {
                source,
                message: r(message),
            },
            Self::Log {
                source,
                node,
                level,
                line,
            } => Self::Log {
                source,
                node,
                level,
                line: r(line),
            },
            Self::Skipped { source, reason } => Self::Skipped {
                source,
                reason: r(reason),
            },
            Self::Failed {
                source,
                error,
                remedy,
            } => Self::Failed {
                source,
                error: r(error),
                remedy: remedy.map(r),
            },
            Self::Progress {
                source,
                node,
                label,
                bytes_done,
                bytes_total,
                rate_bps,
                eta_s,
                file,
            } => Self::Progress {
                source,
                node,
                label: r(label),
                bytes_done,
                bytes_total,
                rate_bps,
                eta_s,
                file,
            },
            e @ Self::Finished { .. } => e,
        }
    }
}

/// Receives events. Implementations must be cheap: steps emit progress often.
pub trait EventSink: Send + Sync {
    /// Handles one event.
    fn emit(&self, event: Event);
}

impl<F: Fn(Event) + Send + Sync> EventSink for F {
    fn emit(&self, event: Event) {
        self(event);
    }
}

/// Wraps a sink so that no known secret reaches it.
pub struct RedactingSink<S> {
    inner: S,
    secrets: Vec<Secret>,
}

impl<S: EventSink> RedactingSink<S> {
    /// Redacts `secrets` (empty ones are ignored) from every event before `inner` sees it.
    pub fn new(inner: S, secrets: impl IntoIterator<Item = Secret>) -> Self {
        Self {
            inner,
            secrets: secrets
                .into_iter()
                .filter(|s| !s.expose().is_empty())
                .collect(),
        }
    }
}

impl<S: EventSink> EventSink for RedactingSink<S> {
    fn emit(&self, event: Event) {
        self.inner.emit(event.redact(&self.secrets));
    }
}

/// A sink that keeps every event (tests, reports).
#[derive(Debug, Default, Clone)]
pub struct Recorder(Arc<Mutex<Vec<Event>>>);

impl Recorder {
    /// The events so far.
    #[must_use]
    pub fn events(&self) -> Vec<Event> {
        self.0.lock().map(|v| v.clone()).unwrap_or_default()
    }
}

impl EventSink for Recorder {
    fn emit(&self, event: Event) {
        if let Ok(mut v) = self.0.lock() {
            v.push(event);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_never_reach_the_sink_and_lines_carry_the_schema() {
        let rec = Recorder::default();
        let sink = RedactingSink::new(rec.clone(), [Secret::new("hf_secretvalue")]);
        sink.emit(Event::Log {
            source: StepKind::FetchCheckpoint.into(),
            node: None,
            level: Level::Info,
            line: "Bearer hf_secretvalue".into(),
        });
        sink.emit(Event::Failed {
            source: Source::Command("status".into()),
            error: "401 for hf_secretvalue".into(),
            remedy: Some("x hf_secretvalue".into()),
        });
        let lines: Vec<String> = rec.events().iter().map(Event::to_json_line).collect();
        for l in &lines {
            assert!(!l.contains("hf_secretvalue"), "{l}");
            assert!(l.contains("***") && l.contains(EVENT_SCHEMA), "{l}");
        }
        let v: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
        assert_eq!(v["event"], "log");
        assert_eq!(v["source"]["step"], "fetch_checkpoint");
        let v: serde_json::Value = serde_json::from_str(&lines[1]).unwrap();
        assert_eq!(v["source"]["command"], "status");
    }
}
