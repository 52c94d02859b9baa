//! The startup timings of the last launch: seconds from the first rank's start to the API port
//! accepting connections, to the engine answering as ready, and to the first generated token.
//! Smoke measures them; `bench` reports them next to its throughput (`<state_dir>/startup.json`).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The file in the state directory.
pub const FILE: &str = "startup.json";

/// Seconds from the first rank's start (the launch) to each milestone.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct StartupTimings {
    /// When the launch began, seconds since the Unix epoch.
    pub at_unix: u64,
    /// The API port accepted a TCP connection.
    pub port_open_s: f64,
    /// The engine answered as ready (every rank running and loaded, the model listed).
    pub http_ready_s: f64,
    /// The smoke generation returned: the first token served end to end.
    pub first_token_s: f64,
}

/// Errors of reading or writing the timings.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    /// The file could not be read or written.
    #[error("startup timings {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not the timings' JSON.
    #[error("startup timings {path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Underlying error.
        #[source]
        source: serde_json::Error,
    },
}

/// Writes `t` as `<state_dir>/startup.json` (temporary file, then rename).
///
/// # Errors
///
/// [`StartupError::Io`].
pub fn write(state_dir: &Path, t: &StartupTimings) -> Result<(), StartupError> {
    let path = state_dir.join(FILE);
    let io = |source| StartupError::Io {
        path: path.clone(),
        source,
    };
    std::fs::create_dir_all(state_dir).map_err(io)?;
    let tmp = state_dir.join(format!(".{FILE}.partial"));
    let json = serde_json::to_vec_pretty(t).map_err(|e| StartupError::Parse {
        path: path.clone(),
        source: e,
    })?;
    crate::safe_fs::write_exclusive(&tmp, json).map_err(io)?;
    std::fs::rename(&tmp, &path).map_err(io)
}

/// The timings of the last launch, `None` when none was measured.
///
/// # Errors
///
/// [`StartupError`] when the file exists but cannot be read or parsed.
pub fn read(state_dir: &Path) -> Result<Option<StartupTimings>, StartupError> {
    let path = state_dir.join(FILE);
    match crate::safe_fs::read_capped(&path, crate::safe_fs::JSON_CAP) {
        Ok(b) => serde_json::from_slice(&b)
            .map(Some)
            .map_err(|source| StartupError::Parse { path, source }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(StartupError::Io { path, source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_absent_is_none() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(read(d.path()).unwrap(), None);
        let t = StartupTimings {
            at_unix: 1,
            port_open_s: 0.5,
            http_ready_s: 1.25,
            first_token_s: 1.5,
        };
        write(d.path(), &t).unwrap();
        assert_eq!(read(d.path()).unwrap(), Some(t));
        std::fs::write(d.path().join(FILE), "not json").unwrap();
        assert!(matches!(read(d.path()), Err(StartupError::Parse { .. })));
    }
}
