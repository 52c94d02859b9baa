//! What the rank files are built from: the checkpoint at its commit and, with `ABLIT=1`, the
//! abliterated overlay at its commit. The rank file's index holds no content hash (an overlay
//! replaces tensors with others of the same shapes, so the file name is the same), so this
//! identity is recorded in the sidecar of every rank file BuildRankCache writes (`source`), checked
//! before a verified file is kept, and compared at launch with what the config asks for.

use std::path::{Path, PathBuf};

use crate::config::ValidatedConfig;
use crate::facts::{DeploymentFacts, is_commit};
use crate::hub::cache::HfCache;
use crate::layout::{hub_dir, snapshot_dir};

/// Separates the checkpoint from the overlay in a recorded source label.
const ABLIT_MARK: &str = " +ablit ";

/// The overlay part of a source: its repo and, when known, its commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Overlay {
    /// `owner/name` of the overlay repo.
    pub repo: String,
    /// Its commit, when fetch recorded it, the config pins it, or the ABLIT cache's `refs/`
    /// resolves the configured branch.
    pub commit: Option<String>,
}

/// The rank files' source as the config and the facts learned so far describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InputsSource {
    /// `owner/name@commit` of the checkpoint.
    pub model: String,
    /// The overlay (`ABLIT=1`), or none.
    pub ablit: Option<Overlay>,
}

impl InputsSource {
    /// The source `config` asks for, with the commits in `facts`.
    pub(crate) fn of(config: &ValidatedConfig, facts: &DeploymentFacts) -> Self {
        let c = config.config();
        let m = &c.model;
        let ablit = m.ablit.then(|| Overlay {
            repo: m.ablit_id.clone(),
            commit: facts
                .commits
                .get(&m.ablit_id)
                .cloned()
                .or_else(|| is_commit(&m.ablit_revision).then(|| m.ablit_revision.clone()))
                .or_else(|| {
                    HfCache::new(hub_dir(&c.hub.ablit_cache))
                        .read_ref(&m.ablit_id, &m.ablit_revision)
                        .ok()
                        .flatten()
                        .filter(|r| is_commit(r))
                }),
        });
        Self {
            model: format!("{}@{}", m.id, facts.model_commit),
            ablit,
        }
    }

    /// The label recorded in the sidecar (`owner/name@commit`, then ` +ablit owner/name@commit`).
    pub(crate) fn label(&self) -> String {
        match &self.ablit {
            None => self.model.clone(),
            Some(o) => format!(
                "{}{ABLIT_MARK}{}@{}",
                self.model,
                o.repo,
                o.commit.as_deref().unwrap_or("<unknown commit>")
            ),
        }
    }

    /// The overlay's snapshot directory in the ABLIT cache, when `ABLIT=1` and its commit is known.
    pub(crate) fn overlay_dir(&self, config: &ValidatedConfig) -> Option<PathBuf> {
        let o = self.ablit.as_ref()?;
        let commit = o.commit.as_ref()?;
        Some(snapshot_dir(
            &config.config().hub.ablit_cache,
            &o.repo,
            commit,
        ))
    }

    /// `ABLIT=0` or `ABLIT=1`, as the recipe spells the switch.
    pub(crate) fn ablit_setting(&self) -> &'static str {
        if self.ablit.is_some() {
            "ABLIT=1"
        } else {
            "ABLIT=0"
        }
    }

    /// Compares a recorded label with this source. `None` when they agree; otherwise what differs,
    /// for people.
    pub(crate) fn differs_from(&self, recorded: &str) -> Option<String> {
        let (model, overlay) = match recorded.split_once(ABLIT_MARK) {
            Some((m, o)) => (m, Some(o)),
            None => (recorded, None),
        };
        match (&self.ablit, overlay) {
            (None, Some(o)) => {
                return Some(format!(
                    "they were prepared with ABLIT=1 (overlay {o}), this start has ABLIT=0"
                ));
            }
            (Some(want), None) => {
                return Some(format!(
                    "they were prepared with ABLIT=0 (the genuine weights of {model}), this start has ABLIT=1 (overlay {})",
                    want.repo
                ));
            }
            (Some(want), Some(o)) => {
                let (repo, commit) = o.rsplit_once('@').unwrap_or((o, ""));
                let commit_differs = want.commit.as_deref().is_some_and(|c| c != commit);
                if repo != want.repo || commit_differs {
                    return Some(format!(
                        "they carry the overlay {o}, this start wants {}@{}",
                        want.repo,
                        want.commit.as_deref().unwrap_or("<any commit>")
                    ));
                }
            }
            (None, None) => {}
        }
        (model != self.model).then(|| {
            format!(
                "they were built from {model}, this start serves {}",
                self.model
            )
        })
    }
}

/// The `source` recorded in the sidecar of `rank_file`, if any.
pub(crate) fn recorded(rank_file: &Path) -> Option<String> {
    super::super::inputs::rank_cache::read_sidecar(rank_file)
        .and_then(|v| v.get("source").and_then(|s| s.as_str()).map(str::to_owned))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src(ablit: Option<(&str, Option<&str>)>) -> InputsSource {
        InputsSource {
            model: "o/m@c1".into(),
            ablit: ablit.map(|(r, c)| Overlay {
                repo: r.into(),
                commit: c.map(str::to_owned),
            }),
        }
    }

    #[test]
    fn labels_round_trip_and_differences_name_ablit() {
        let genuine = src(None);
        let ablit = src(Some(("o/ov", Some("c2"))));
        assert_eq!(genuine.label(), "o/m@c1");
        assert_eq!(ablit.label(), "o/m@c1 +ablit o/ov@c2");
        assert_eq!(genuine.differs_from(&genuine.label()), None);
        assert_eq!(ablit.differs_from(&ablit.label()), None);
        let d = ablit.differs_from(&genuine.label()).unwrap();
        assert!(
            d.contains("prepared with ABLIT=0") && d.contains("ABLIT=1"),
            "{d}"
        );
        let d = genuine.differs_from(&ablit.label()).unwrap();
        assert!(
            d.contains("prepared with ABLIT=1") && d.contains("ABLIT=0"),
            "{d}"
        );
        // another overlay commit, another checkpoint commit
        assert!(ablit.differs_from("o/m@c1 +ablit o/ov@c9").is_some());
        assert!(genuine.differs_from("o/m@c0").is_some());
        // an overlay whose commit is not known here matches any commit of that repo
        assert_eq!(src(Some(("o/ov", None))).differs_from(&ablit.label()), None);
        assert_eq!(genuine.ablit_setting(), "ABLIT=0");
        assert_eq!(ablit.ablit_setting(), "ABLIT=1");
    }
}
