//! The files of `spark-deploy watch` under `<state_dir>/watch/` — the stop marker, the pause
//! lease, the watch state and the sample history — as `docs/operations.md` ("Watch files")
//! describes them. `down` writes the stop marker and `up` removes it (through [`Marker`] on a
//! plan), the supervisor reads and writes the rest, `status` and the support bundle read them.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::log_time::parse_rfc3339;
use super::logs::stamp;

/// Schema id of `state.json`.
pub const STATE_SCHEMA: &str = "spark-deploy.watch-state/v1";

/// How long `samples.jsonl` covers before it is rotated to `samples.prev.jsonl`.
pub const SAMPLE_HISTORY: Duration = Duration::from_secs(3600);

/// The reason `down` writes into the stop marker.
pub const USER_DOWN: &str = "stopped by the user (down)";

/// A watch file that could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum WatchFileError {
    /// I/O on one file.
    #[error("cannot {action} {path}: {source}")]
    Io {
        /// `read`, `write`, `remove`.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// Underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// What a plan does to the stop marker when it succeeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Marker {
    /// Leaves it as it is (a supervisor's own stop and start).
    #[default]
    Keep,
    /// Writes it: the user stopped the pair (`down`); watch never heals it.
    Write,
    /// Removes it: the user started the pair (`up`, `restart`).
    Clear,
}

/// The paths of the watch files of one deployment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchFiles {
    root: PathBuf,
}

impl WatchFiles {
    /// The watch files below `state_dir`.
    #[must_use]
    pub fn of(state_dir: &Path) -> Self {
        Self {
            root: state_dir.join("watch"),
        }
    }

    /// `<state_dir>/watch`.
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.root
    }

    /// `samples.jsonl`.
    #[must_use]
    pub fn samples(&self) -> PathBuf {
        self.root.join("samples.jsonl")
    }

    /// `samples.prev.jsonl` (the previous hour).
    #[must_use]
    pub fn samples_prev(&self) -> PathBuf {
        self.root.join("samples.prev.jsonl")
    }

    /// `state.json`.
    #[must_use]
    pub fn state(&self) -> PathBuf {
        self.root.join("state.json")
    }

    /// The stop marker.
    #[must_use]
    pub fn stop(&self) -> PathBuf {
        self.root.join("stop")
    }

    /// The pause lease.
    #[must_use]
    pub fn pause(&self) -> PathBuf {
        self.root.join("pause")
    }

    /// `heals/`.
    #[must_use]
    pub fn heals(&self) -> PathBuf {
        self.root.join("heals")
    }

    /// The output of `watch --detach`.
    #[must_use]
    pub fn log(&self) -> PathBuf {
        self.root.join("watch.log")
    }

    /// The pid of `watch --detach`.
    #[must_use]
    pub fn pid(&self) -> PathBuf {
        self.root.join("watch.pid")
    }

    fn write(&self, path: &Path, text: &str) -> Result<(), WatchFileError> {
        let io = |source| WatchFileError::Io {
            action: "write",
            path: path.to_path_buf(),
            source,
        };
        std::fs::create_dir_all(&self.root).map_err(io)?;
        let tmp = path.with_extension("tmp");
        crate::safe_fs::write_exclusive(&tmp, text).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    }

    fn remove(path: &Path) -> Result<(), WatchFileError> {
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(WatchFileError::Io {
                action: "remove",
                path: path.to_path_buf(),
                source: e,
            }),
            _ => Ok(()),
        }
    }

    /// Writes the stop marker with `reason`.
    ///
    /// # Errors
    ///
    /// [`WatchFileError`] when it cannot be written.
    pub fn write_stop(&self, reason: &str) -> Result<(), WatchFileError> {
        self.write(&self.stop(), &format!("{}\n", reason.trim()))
    }

    /// The stop marker's reason, when present.
    #[must_use]
    pub fn read_stop(&self) -> Option<String> {
        std::fs::read_to_string(self.stop())
            .ok()
            .map(|s| s.trim().to_owned())
    }

    /// Removes the stop marker.
    ///
    /// # Errors
    ///
    /// [`WatchFileError`] when it exists and cannot be removed.
    pub fn clear_stop(&self) -> Result<(), WatchFileError> {
        Self::remove(&self.stop())
    }

    /// Applies what a finished plan does to the stop marker.
    ///
    /// # Errors
    ///
    /// [`WatchFileError`].
    pub fn apply(&self, marker: Marker) -> Result<(), WatchFileError> {
        match marker {
            Marker::Keep => Ok(()),
            Marker::Write => self.write_stop(USER_DOWN),
            Marker::Clear => self.clear_stop(),
        }
    }

    /// Writes the pause lease, expiring at `until`.
    ///
    /// # Errors
    ///
    /// [`WatchFileError`].
    pub fn write_pause(&self, until: SystemTime) -> Result<(), WatchFileError> {
        self.write(&self.pause(), &format!("{}\n", rfc3339(until)))
    }

    /// The pause lease's expiry when it is still in force at `now`.
    #[must_use]
    pub fn read_pause(&self, now: SystemTime) -> Option<SystemTime> {
        let text = std::fs::read_to_string(self.pause()).ok()?;
        let (secs, _) = parse_rfc3339(text.trim())?;
        let until = UNIX_EPOCH + Duration::from_secs(u64::try_from(secs).ok()?);
        (until > now).then_some(until)
    }

    /// Removes the pause lease.
    ///
    /// # Errors
    ///
    /// [`WatchFileError`] when it exists and cannot be removed.
    pub fn clear_pause(&self) -> Result<(), WatchFileError> {
        Self::remove(&self.pause())
    }

    /// Writes `state.json`.
    ///
    /// # Errors
    ///
    /// [`WatchFileError`].
    pub fn write_state(&self, state: &WatchState) -> Result<(), WatchFileError> {
        let text = serde_json::to_string_pretty(state).unwrap_or_default();
        self.write(&self.state(), &format!("{text}\n"))
    }

    /// `state.json`, when present and readable.
    #[must_use]
    pub fn read_state(&self) -> Option<WatchState> {
        serde_json::from_str(&std::fs::read_to_string(self.state()).ok()?).ok()
    }

    /// Appends one sample line (`ts_ms` at `now`), first rotating `samples.jsonl` to
    /// `samples.prev.jsonl` when its first line is older than [`SAMPLE_HISTORY`].
    ///
    /// # Errors
    ///
    /// [`WatchFileError`].
    pub fn append_sample(&self, line: &str, now: SystemTime) -> Result<(), WatchFileError> {
        let path = self.samples();
        let io = |action, source| WatchFileError::Io {
            action,
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(&self.root).map_err(|e| io("write", e))?;
        if let Some(first) = first_ts_ms(&path) {
            let age_ms = unix_ms(now).saturating_sub(first);
            if u128::from(age_ms) > SAMPLE_HISTORY.as_millis() {
                std::fs::rename(&path, self.samples_prev()).map_err(|e| io("rotate", e))?;
            }
        }
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| io("write", e))?;
        writeln!(f, "{}", line.trim_end()).map_err(|e| io("write", e))
    }
}

fn first_ts_ms(path: &Path) -> Option<u64> {
    use std::io::BufRead as _;
    let f = std::fs::File::open(path).ok()?;
    let mut first = String::new();
    std::io::BufReader::new(f).read_line(&mut first).ok()?;
    serde_json::from_str::<serde_json::Value>(&first).ok()?["ts_ms"].as_u64()
}

/// Milliseconds since the Unix epoch.
#[must_use]
pub fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// `t` as RFC 3339 in UTC, whole seconds (`2026-12-01T10:15:00Z`).
#[must_use]
pub fn rfc3339(t: SystemTime) -> String {
    let s = stamp(t);
    // stamp: YYYYmmdd-HHMMSS
    if s.len() == 15 {
        format!(
            "{}-{}-{}T{}:{}:{}Z",
            &s[0..4],
            &s[4..6],
            &s[6..8],
            &s[9..11],
            &s[11..13],
            &s[13..15]
        )
    } else {
        s
    }
}

/// `t` as a directory name: `YYYYmmddTHHMMSSZ`.
#[must_use]
pub fn dir_stamp(t: SystemTime) -> String {
    format!("{}Z", stamp(t).replace('-', "T"))
}

/// What the supervisor is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WatchMode {
    /// Sampling, and acting on findings.
    Running,
    /// Sampling; not acting until the lease expires.
    Paused,
    /// The pair is down by the stop marker; sampling nothing until it is removed.
    Stopped,
    /// The supervisor ended (Ctrl-C, cancel).
    Exited,
}

/// `state.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchState {
    /// [`STATE_SCHEMA`].
    pub schema: String,
    /// What it does.
    pub state: WatchMode,
    /// Why (the last decision, the stop marker's text, the lease).
    pub reason: String,
    /// The pause lease's expiry (RFC 3339).
    pub paused_until: Option<String>,
    /// Heals in the last hour (RFC 3339).
    pub heals: Vec<String>,
    /// The supervisor's process.
    pub pid: u32,
    /// When this was written (RFC 3339).
    pub updated: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marker_lease_state_and_rotation() {
        let d = tempfile::tempdir().unwrap();
        let w = WatchFiles::of(d.path());
        assert_eq!(w.read_stop(), None);
        w.apply(Marker::Write).unwrap();
        assert_eq!(w.read_stop().as_deref(), Some(USER_DOWN));
        w.apply(Marker::Keep).unwrap();
        assert!(w.stop().exists());
        w.apply(Marker::Clear).unwrap();
        w.apply(Marker::Clear).unwrap();
        assert_eq!(w.read_stop(), None);

        let now = UNIX_EPOCH + Duration::from_secs(1_796_000_000);
        w.write_pause(now + Duration::from_secs(1800)).unwrap();
        assert_eq!(
            std::fs::read_to_string(w.pause()).unwrap().trim(),
            rfc3339(now + Duration::from_secs(1800))
        );
        assert_eq!(w.read_pause(now), Some(now + Duration::from_secs(1800)));
        assert_eq!(w.read_pause(now + Duration::from_secs(1801)), None);
        w.clear_pause().unwrap();
        assert_eq!(w.read_pause(now), None);

        let st = WatchState {
            schema: STATE_SCHEMA.into(),
            state: WatchMode::Paused,
            reason: "lease".into(),
            paused_until: Some(rfc3339(now)),
            heals: vec![],
            pid: 7,
            updated: rfc3339(now),
        };
        w.write_state(&st).unwrap();
        assert_eq!(w.read_state(), Some(st));
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(w.state()).unwrap()).unwrap();
        assert_eq!(v["state"], "paused");

        let line = |t: SystemTime| format!("{{\"ts_ms\":{}}}", unix_ms(t));
        w.append_sample(&line(now), now).unwrap();
        let later = now + Duration::from_secs(1000);
        w.append_sample(&line(later), later).unwrap();
        assert!(!w.samples_prev().exists());
        let much_later = now + Duration::from_secs(3700);
        w.append_sample(&line(much_later), much_later).unwrap();
        assert_eq!(
            std::fs::read_to_string(w.samples_prev())
                .unwrap()
                .lines()
                .count(),
            2
        );
        assert_eq!(
            std::fs::read_to_string(w.samples())
                .unwrap()
                .lines()
                .count(),
            1
        );
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(dir_stamp(UNIX_EPOCH), "19700101T000000Z");
    }
}
