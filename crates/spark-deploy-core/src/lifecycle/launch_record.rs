//! What the last successful launch ran with: a hash of the config, the facts preflight detected,
//! and the rank containers it started. A re-run of `up` on that same, still-running pair uses the
//! record to skip Preflight (whose checks would only find our own ranks holding the ports and the
//! GPU) while keeping the facts the running ranks were launched with.
//!
//! The record lives in the head's state directory; it is written atomically (temporary file, then
//! rename) so a crash never leaves half a record under the final name.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::config::ValidatedConfig;
use crate::facts::NodeFacts;

/// File name in the state directory.
pub const FILE: &str = "launched.json";

/// One rank container of the launch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchedRank {
    /// Node index in the config.
    pub node: usize,
    /// Container name.
    pub name: String,
    /// Container ID (a container re-created under the same name does not match).
    pub id: String,
}

/// The record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchRecord {
    /// [`config_sha256`] of the config launched.
    pub config_sha256: String,
    /// The cross-rank fingerprint the containers carry.
    pub fingerprint: String,
    /// The checkpoint commit served.
    pub model_commit: String,
    /// The per-node facts the ranks were launched with.
    pub nodes: Vec<NodeFacts>,
    /// The CONTEXT preflight computed when the config asked for the largest that fits (0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<u64>,
    /// The rank containers.
    pub ranks: Vec<LaunchedRank>,
    /// The GPU clocks preflight observed on every node (its `gpu.clocks` row), when it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_clocks: Option<String>,
    /// When the launch finished, seconds since the Unix epoch.
    pub at_unix: u64,
}

/// Errors of reading or writing the record.
#[derive(Debug, thiserror::Error)]
pub enum LaunchRecordError {
    /// The file could not be read or written.
    #[error("launch record {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a record (written by another version, or damaged).
    #[error(
        "launch record {path} is unreadable ({source}); remedy: delete it, the next `up` runs preflight and writes it again"
    )]
    Parse {
        /// The file.
        path: PathBuf,
        /// Underlying error.
        #[source]
        source: serde_json::Error,
    },
}

/// SHA-256 of the config as serialized (secrets are never serialized, so changing a token or key
/// does not change it; every other setting does).
#[must_use]
pub fn config_sha256(config: &ValidatedConfig) -> String {
    let bytes = serde_json::to_vec(config.config()).unwrap_or_default();
    hex::encode(Sha256::digest(bytes))
}

/// The record's path in `state_dir`.
#[must_use]
pub fn path(state_dir: &Path) -> PathBuf {
    state_dir.join(FILE)
}

/// Reads the record; `None` when there is none.
///
/// # Errors
///
/// [`LaunchRecordError`] when the file exists but cannot be read or parsed.
pub fn read(state_dir: &Path) -> Result<Option<LaunchRecord>, LaunchRecordError> {
    let path = path(state_dir);
    let bytes = match crate::safe_fs::read_capped(&path, crate::safe_fs::JSON_CAP) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(LaunchRecordError::Io { path, source }),
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|source| LaunchRecordError::Parse { path, source })
}

/// Writes the record atomically.
///
/// # Errors
///
/// [`LaunchRecordError::Io`] when the state directory is not writable.
pub fn write(state_dir: &Path, record: &LaunchRecord) -> Result<(), LaunchRecordError> {
    let path = path(state_dir);
    let io = |source| LaunchRecordError::Io {
        path: path.clone(),
        source,
    };
    std::fs::create_dir_all(state_dir).map_err(io)?;
    let tmp = state_dir.join(format!(".{FILE}.partial"));
    let bytes = serde_json::to_vec_pretty(record).unwrap_or_default();
    crate::safe_fs::write_exclusive(&tmp, bytes).map_err(io)?;
    std::fs::rename(&tmp, &path).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{DeploymentConfig, validate};
    use crate::facts::DeploymentFacts;

    fn config(context: u64) -> ValidatedConfig {
        let mut raw = DeploymentConfig::default();
        raw.serving.context = context;
        validate(raw, Path::new("/home/u")).unwrap()
    }

    #[test]
    fn the_record_round_trips_and_no_partial_file_stays() {
        let t = tempfile::tempdir().unwrap();
        assert_eq!(read(t.path()).unwrap(), None);
        let c = config(131_072);
        let facts = DeploymentFacts::placeholders(&c);
        let r = LaunchRecord {
            config_sha256: config_sha256(&c),
            fingerprint: "f".repeat(64),
            model_commit: facts.model_commit.to_string(),
            nodes: facts.nodes,
            context: None,
            ranks: vec![LaunchedRank {
                node: 1,
                name: "x-rank1".into(),
                id: "abc".into(),
            }],
            gpu_clocks: None,
            at_unix: 1_796_000_000,
        };
        write(t.path(), &r).unwrap();
        assert_eq!(read(t.path()).unwrap(), Some(r));
        let names: Vec<_> = std::fs::read_dir(t.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, [FILE]);
        std::fs::write(path(t.path()), b"{").unwrap();
        let e = read(t.path()).unwrap_err().to_string();
        assert!(
            e.contains("launched.json") && e.contains("delete it"),
            "{e}"
        );
    }

    #[test]
    fn the_config_hash_follows_settings_but_not_secrets() {
        let a = config(131_072);
        assert_eq!(config_sha256(&a), config_sha256(&config(131_072)));
        assert_ne!(config_sha256(&a), config_sha256(&config(262_144)));
        let mut raw = a.config().clone();
        raw.hub.token = Some(crate::secret::Secret::new("hf_one".to_owned()));
        let mut raw2 = a.config().clone();
        raw2.hub.token = Some(crate::secret::Secret::new("hf_two".to_owned()));
        let (x, y) = (
            validate(raw, Path::new("/home/u")).unwrap(),
            validate(raw2, Path::new("/home/u")).unwrap(),
        );
        assert_eq!(config_sha256(&x), config_sha256(&y));
    }
}
