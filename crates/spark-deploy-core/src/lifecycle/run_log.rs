//! What the last run left behind for a support bundle: its events as JSON lines
//! (`<state_dir>/last-run.events.jsonl`) and the last preflight report with the facts known after
//! the run (`<state_dir>/preflight.json`, written by `bundle::keep_preflight`). The callers that
//! run plans (the command line, Python) write both; a dry run writes neither.
//!
//! Both are written atomically: the events go to a `.partial` file named after the process while
//! the run goes on, which [`EventLog::finish`] renames to the final name (a run that never started
//! its steps, e.g. one refused by the deployment lock, calls [`EventLog::discard`] and leaves the
//! previous run's events in place). Events reach the log after the context's redaction, so no
//! known secret is written.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::Serialize;

use crate::event::{Event, EventSink};

/// The last run's events in the state directory.
pub const EVENTS_FILE: &str = "last-run.events.jsonl";
/// The last preflight report (with the facts) in the state directory.
pub const PREFLIGHT_FILE: &str = "preflight.json";

/// Errors of the run's state files.
#[derive(Debug, thiserror::Error)]
pub enum RunLogError {
    /// A file could not be written, renamed or removed.
    #[error("{path}: {source}; remedy: check that deployment.state_dir is writable")]
    Io {
        /// The file.
        path: PathBuf,
        /// Underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The value could not be serialised.
    #[error("{path}: {source}")]
    Serialize {
        /// The file.
        path: PathBuf,
        /// Underlying error.
        #[source]
        source: serde_json::Error,
    },
}

/// An event sink writing one JSON line per event (the schema of [`Event::to_json_line`]).
/// A line that cannot be written is dropped: the log must never fail a run.
pub struct EventLog {
    partial: PathBuf,
    path: PathBuf,
    file: Mutex<Option<std::io::BufWriter<std::fs::File>>>,
}

impl EventLog {
    /// Starts the log of a run in `state_dir`.
    ///
    /// # Errors
    ///
    /// [`RunLogError::Io`] when the state directory or the partial file cannot be created.
    pub fn create(state_dir: &Path) -> Result<Self, RunLogError> {
        let path = state_dir.join(EVENTS_FILE);
        let partial = state_dir.join(format!(".{EVENTS_FILE}.{}.partial", std::process::id()));
        let io = |source| RunLogError::Io {
            path: partial.clone(),
            source,
        };
        std::fs::create_dir_all(state_dir).map_err(io)?;
        let file = crate::safe_fs::create_exclusive(&partial, 0o644).map_err(io)?;
        Ok(Self {
            partial: partial.clone(),
            path,
            file: Mutex::new(Some(std::io::BufWriter::new(file))),
        })
    }

    fn close(&self) -> Option<std::io::BufWriter<std::fs::File>> {
        self.file.lock().ok().and_then(|mut f| f.take())
    }

    /// Ends the log: the run's events replace the previous run's under [`EVENTS_FILE`].
    ///
    /// # Errors
    ///
    /// [`RunLogError::Io`] when the file cannot be flushed or renamed.
    pub fn finish(&self) -> Result<PathBuf, RunLogError> {
        let io = |source| RunLogError::Io {
            path: self.path.clone(),
            source,
        };
        if let Some(mut f) = self.close() {
            f.flush().map_err(io)?;
        }
        std::fs::rename(&self.partial, &self.path).map_err(io)?;
        Ok(self.path.clone())
    }

    /// Drops the log, keeping the previous run's events.
    pub fn discard(&self) {
        drop(self.close());
        let _ = std::fs::remove_file(&self.partial);
    }
}

impl EventSink for EventLog {
    fn emit(&self, event: Event) {
        if let Ok(mut guard) = self.file.lock()
            && let Some(f) = guard.as_mut()
        {
            let _ = writeln!(f, "{}", event.to_json_line());
        }
    }
}

impl Drop for EventLog {
    fn drop(&mut self) {
        // Neither finished nor discarded (a panic, an early return): no partial file stays.
        if self.close().is_some() {
            let _ = std::fs::remove_file(&self.partial);
        }
    }
}

/// Writes `value` as pretty JSON to `<state_dir>/<file>` (temporary file, then rename).
///
/// # Errors
///
/// [`RunLogError`] when the directory is not writable.
pub fn write_json(state_dir: &Path, file: &str, value: &impl Serialize) -> Result<(), RunLogError> {
    let path = state_dir.join(file);
    let json = serde_json::to_vec_pretty(value).map_err(|source| RunLogError::Serialize {
        path: path.clone(),
        source,
    })?;
    let io = |source| RunLogError::Io {
        path: path.clone(),
        source,
    };
    std::fs::create_dir_all(state_dir).map_err(io)?;
    let tmp = state_dir.join(format!(".{file}.partial"));
    crate::safe_fs::write_exclusive(&tmp, json).map_err(io)?;
    std::fs::rename(&tmp, &path).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Level, StepKind};

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    }

    fn line(text: &str) -> Event {
        Event::Log {
            source: StepKind::Preflight.into(),
            node: None,
            level: Level::Info,
            line: text.into(),
        }
    }

    #[test]
    fn a_finished_log_replaces_the_last_and_a_discarded_one_leaves_it() {
        let d = tempfile::tempdir().unwrap();
        let log = EventLog::create(d.path()).unwrap();
        log.emit(line("first run"));
        assert!(
            !d.path().join(EVENTS_FILE).exists(),
            "no final file mid-run"
        );
        log.finish().unwrap();
        let text = std::fs::read_to_string(d.path().join(EVENTS_FILE)).unwrap();
        assert!(text.contains("first run") && text.contains(crate::event::EVENT_SCHEMA));
        assert_eq!(names(d.path()), [EVENTS_FILE]);

        let refused = EventLog::create(d.path()).unwrap();
        refused.emit(line("second run"));
        refused.discard();
        assert_eq!(names(d.path()), [EVENTS_FILE]);
        let kept = std::fs::read_to_string(d.path().join(EVENTS_FILE)).unwrap();
        assert!(kept.contains("first run"), "{kept}");

        drop(EventLog::create(d.path()).unwrap());
        assert_eq!(names(d.path()), [EVENTS_FILE], "dropped: no partial file");

        write_json(d.path(), PREFLIGHT_FILE, &serde_json::json!({"a": 1})).unwrap();
        assert_eq!(names(d.path()), [EVENTS_FILE, PREFLIGHT_FILE]);
    }
}
