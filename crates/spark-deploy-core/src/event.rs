//! The event stream: what steps report instead of printing.
//!
//! The CLI renders events (progress bars, or JSON lines with `--json`), Python receives them in a
//! callback. Every event is serialisable as one JSON object carrying [`EVENT_SCHEMA`]. Sinks see
//! events after [`RedactingSink`] has replaced every known secret by `***`.

use std::sync::{Arc, Mutex};

use serde::Serialize;

use crate::plan::StepKind;
use crate::secret::Secret;

/// Schema id of serialised events; bumped on any incompatible change.
pub const EVENT_SCHEMA: &str = "spark-deploy.event/v1";

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

/// One thing that happened.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// A step began.
    Started {
        /// Step.
        step: StepKind,
        /// What it will do.
        message: String,
    },
    /// Bytes moved (download, copy, rank file).
    Progress {
        /// Step.
        step: StepKind,
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
    },
    /// A log line (engine output, a decision).
    Log {
        /// Step.
        step: StepKind,
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
        /// Step.
        step: StepKind,
        /// Why (e.g. "all 43 files present and verified").
        reason: String,
    },
    /// A step completed.
    Finished {
        /// Step.
        step: StepKind,
        /// Wall time.
        duration_ms: u64,
        /// Bytes moved, when any.
        #[serde(skip_serializing_if = "Option::is_none")]
        bytes: Option<u64>,
    },
    /// A step failed.
    Failed {
        /// Step.
        step: StepKind,
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

    fn redact(self, secrets: &[Secret]) -> Self {
        let r = |s: String| secrets.iter().fold(s, |acc, sec| sec.redact_in(&acc));
        match self {
            Self::Started { step, message } => Self::Started {
                step,
                message: r(message),
            },
            Self::Log {
                step,
                node,
                level,
                line,
            } => Self::Log {
                step,
                node,
                level,
                line: r(line),
            },
            Self::Skipped { step, reason } => Self::Skipped {
                step,
                reason: r(reason),
            },
            Self::Failed {
                step,
                error,
                remedy,
            } => Self::Failed {
                step,
                error: r(error),
                remedy: remedy.map(r),
            },
            Self::Progress {
                step,
                node,
                label,
                bytes_done,
                bytes_total,
                rate_bps,
                eta_s,
            } => Self::Progress {
                step,
                node,
                label: r(label),
                bytes_done,
                bytes_total,
                rate_bps,
                eta_s,
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
            step: StepKind::FetchCheckpoint,
            node: None,
            level: Level::Info,
            line: "Bearer hf_secretvalue".into(),
        });
        sink.emit(Event::Failed {
            step: StepKind::FetchCheckpoint,
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
        assert_eq!(v["step"], "fetch_checkpoint");
    }
}
