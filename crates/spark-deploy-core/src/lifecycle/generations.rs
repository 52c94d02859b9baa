//! Generations: every configuration that served, in order — what `history` lists, what
//! `rollback` returns to and what `upgrade` measures a new one against.
//!
//! A generation is recorded when a launch of its configuration passes Smoke; launching the same
//! configuration again (the same config hash and fingerprint) marks that generation serving again
//! rather than adding one. Each generation keeps its config (secrets are never serialized) and,
//! per node, an image tag made when it started serving, so a later rollback starts exactly the
//! image it ran even after a new engine build took the image's name.
//!
//! The file lives in the head's state directory and is written atomically (temporary file, then
//! rename).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// File name in the state directory.
pub const FILE: &str = "generations.json";

/// Where a generation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GenerationState {
    /// It serves now.
    Serving,
    /// It served, and another one took over (a rollback may return to it).
    Superseded,
    /// An upgrade started it and refused it (it failed a check); never served as accepted.
    Rejected,
    /// It served, and retention removed its inputs and image tag: it cannot be returned to.
    Retired,
}

/// The figures an upgrade compares: decode per stream (one stream, prose) and cold prefill.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Figures {
    /// Median decode tok/s of one stream.
    pub decode_tps: f64,
    /// Median cold prefill tok/s of the shortest length measured, when measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_tps: Option<f64>,
}

/// One generation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Generation {
    /// 1, 2, … in the order they were first launched.
    pub id: u32,
    /// Its state.
    pub state: GenerationState,
    /// The config as serialized (no secrets).
    pub config: serde_json::Value,
    /// The config's hash (`launch_record::config_sha256`).
    pub config_sha256: String,
    /// The ranks' cross-rank fingerprint.
    pub fingerprint: String,
    /// The checkpoint commit it served.
    pub model_commit: String,
    /// Per node (config order), the image tag kept for it.
    pub images: Vec<String>,
    /// When it last started serving, Unix seconds.
    pub served_from: u64,
    /// When it last stopped serving, Unix seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served_until: Option<u64>,
    /// Its benchmark figures, when measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub figures: Option<Figures>,
    /// Why it was rejected, or how it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Every generation, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct History {
    /// The generations.
    pub generations: Vec<Generation>,
}

/// Errors of reading or writing the history.
#[derive(Debug, thiserror::Error)]
pub enum GenerationsError {
    /// The file could not be read or written.
    #[error("generation history {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a history.
    #[error(
        "generation history {path} is unreadable ({source}); remedy: move it aside, the next `up` starts a new history"
    )]
    Parse {
        /// The file.
        path: PathBuf,
        /// Underlying error.
        #[source]
        source: serde_json::Error,
    },
}

impl Generation {
    /// Its recorded config, validated, with the secrets of `current` (secrets are never
    /// recorded).
    ///
    /// # Errors
    ///
    /// Why it does not parse or validate, in words.
    pub fn validated(
        &self,
        current: &crate::config::ValidatedConfig,
    ) -> Result<crate::config::ValidatedConfig, String> {
        let mut raw: crate::config::DeploymentConfig =
            serde_json::from_value(self.config.clone()).map_err(|e| e.to_string())?;
        let now = current.config();
        raw.hub.token.clone_from(&now.hub.token);
        raw.serving.api_key.clone_from(&now.serving.api_key);
        let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/"), PathBuf::from);
        crate::config::validate(raw, &home).map_err(|e| e.to_string())
    }
}

impl History {
    /// The generation serving now, if any.
    #[must_use]
    pub fn serving(&self) -> Option<&Generation> {
        self.generations
            .iter()
            .rev()
            .find(|g| g.state == GenerationState::Serving)
    }

    /// The generation a rollback returns to: the one that served most recently before the
    /// serving one (rejected generations never count).
    #[must_use]
    pub fn previous(&self) -> Option<&Generation> {
        let now = self.serving().map(|g| g.id);
        self.generations
            .iter()
            .filter(|g| g.state == GenerationState::Superseded && Some(g.id) != now)
            .max_by_key(|g| (g.served_until.unwrap_or(0), g.id))
    }

    /// The generation of this config and fingerprint, if it was launched before.
    #[must_use]
    pub fn find(&self, config_sha256: &str, fingerprint: &str) -> Option<&Generation> {
        self.generations
            .iter()
            .find(|g| g.config_sha256 == config_sha256 && g.fingerprint == fingerprint)
    }

    /// Marks `generation` serving from `at` (added when new; its id is then the next one), and
    /// the one that served until now superseded. Returns its id.
    pub fn serve(&mut self, mut generation: Generation, at: u64) -> u32 {
        for g in &mut self.generations {
            if g.state == GenerationState::Serving {
                g.state = GenerationState::Superseded;
                g.served_until = Some(at);
            }
        }
        let existing = self.generations.iter_mut().find(|g| {
            g.config_sha256 == generation.config_sha256 && g.fingerprint == generation.fingerprint
        });
        if let Some(g) = existing {
            g.state = GenerationState::Serving;
            g.served_from = at;
            g.served_until = None;
            g.note = None;
            g.images = generation.images;
            return g.id;
        }
        generation.id = self.generations.iter().map(|g| g.id).max().unwrap_or(0) + 1;
        generation.state = GenerationState::Serving;
        generation.served_from = at;
        generation.served_until = None;
        let id = generation.id;
        self.generations.push(generation);
        id
    }

    /// Marks generation `id` rejected with `why` (an upgrade refused it), at `at`.
    pub fn reject(&mut self, id: u32, why: &str, at: u64) {
        if let Some(g) = self.generations.iter_mut().find(|g| g.id == id) {
            g.state = GenerationState::Rejected;
            g.served_until = Some(at);
            g.note = Some(why.to_owned());
        }
    }

    /// Superseded generations beyond the newest `keep`, oldest first: what retention removes.
    #[must_use]
    pub fn beyond(&self, keep: usize) -> Vec<&Generation> {
        let mut old: Vec<&Generation> = self
            .generations
            .iter()
            .filter(|g| g.state == GenerationState::Superseded)
            .collect();
        old.sort_by_key(|g| std::cmp::Reverse((g.served_until.unwrap_or(0), g.id)));
        let mut out: Vec<&Generation> = old.into_iter().skip(keep).collect();
        out.reverse();
        out
    }
}

/// The history's path in `state_dir`.
#[must_use]
pub fn path(state_dir: &Path) -> PathBuf {
    state_dir.join(FILE)
}

/// Reads the history (empty when there is none).
///
/// # Errors
///
/// [`GenerationsError`] when the file exists but cannot be read or parsed.
pub fn read(state_dir: &Path) -> Result<History, GenerationsError> {
    let path = path(state_dir);
    let bytes = match crate::safe_fs::read_capped(&path, crate::safe_fs::JSON_CAP) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(History::default()),
        Err(source) => return Err(GenerationsError::Io { path, source }),
    };
    serde_json::from_slice(&bytes).map_err(|source| GenerationsError::Parse { path, source })
}

/// Writes the history atomically.
///
/// # Errors
///
/// [`GenerationsError::Io`] when the state directory is not writable.
pub fn write(state_dir: &Path, history: &History) -> Result<(), GenerationsError> {
    let path = path(state_dir);
    let io = |source| GenerationsError::Io {
        path: path.clone(),
        source,
    };
    std::fs::create_dir_all(state_dir).map_err(io)?;
    let tmp = state_dir.join(format!(".{FILE}.partial"));
    let bytes = serde_json::to_vec_pretty(history).unwrap_or_default();
    crate::safe_fs::write_exclusive(&tmp, bytes).map_err(io)?;
    std::fs::rename(&tmp, &path).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn generation(config: &str, fp: &str) -> Generation {
        Generation {
            id: 0,
            state: GenerationState::Serving,
            config: serde_json::json!({ "c": config }),
            config_sha256: config.to_owned(),
            fingerprint: fp.to_owned(),
            model_commit: "c".repeat(40),
            images: vec!["img:gen".into()],
            served_from: 0,
            served_until: None,
            figures: None,
            note: None,
        }
    }

    #[test]
    fn serving_again_reuses_the_generation_and_rollback_finds_the_last_that_served() {
        let mut h = History::default();
        assert_eq!(h.serve(generation("a", "f1"), 10), 1);
        assert_eq!(h.serve(generation("b", "f2"), 20), 2);
        assert_eq!(h.serving().map(|g| g.id), Some(2));
        assert_eq!(h.previous().map(|g| g.id), Some(1));
        // An upgrade to c is refused: b serves again, c is never a rollback target.
        assert_eq!(h.serve(generation("c", "f3"), 30), 3);
        h.reject(3, "validate: wrong answer", 31);
        assert_eq!(h.serve(generation("b", "f2"), 32), 2);
        assert_eq!(h.generations.len(), 3);
        assert_eq!(h.serving().map(|g| g.id), Some(2));
        assert_eq!(h.previous().map(|g| g.id), Some(1));
        assert_eq!(h.generations[2].state, GenerationState::Rejected);
        // A rollback to a: b becomes the previous one.
        assert_eq!(h.serve(generation("a", "f1"), 40), 1);
        assert_eq!(h.previous().map(|g| g.id), Some(2));
    }

    #[test]
    fn retention_keeps_the_newest_that_do_not_serve() {
        let mut h = History::default();
        for (i, c) in ["a", "b", "c", "d"].iter().enumerate() {
            h.serve(generation(c, c), 10 * (i as u64 + 1));
        }
        let ids = |v: Vec<&Generation>| v.iter().map(|g| g.id).collect::<Vec<_>>();
        assert_eq!(ids(h.beyond(1)), vec![1, 2]);
        assert_eq!(ids(h.beyond(0)), vec![1, 2, 3]);
        assert!(h.beyond(5).is_empty());
    }

    #[test]
    fn the_file_round_trips_and_a_missing_one_is_empty() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(read(d.path()).unwrap(), History::default());
        let mut h = History::default();
        h.serve(generation("a", "f"), 1);
        write(d.path(), &h).unwrap();
        assert_eq!(read(d.path()).unwrap(), h);
        std::fs::write(path(d.path()), b"{").unwrap();
        assert!(
            read(d.path())
                .unwrap_err()
                .to_string()
                .contains("move it aside")
        );
    }
}
