use serde::Serialize;

use crate::config::ValidatedConfig;
use crate::plan::describe::{Action, ActionDetail};

/// One repository to fetch at a pinned revision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RepoFetch {
    /// What it is for.
    pub role: String,
    /// `owner/name`.
    pub repo: String,
    /// Pinned revision.
    pub revision: String,
    /// File names or patterns resolved against the Hub's file list.
    pub files: Vec<String>,
    /// Cache root.
    pub cache: String,
    /// Needs a token.
    pub gated: bool,
}

/// Downloads the checkpoint, the Engram shards, the `bias_vl` byte ranges, the kit and (with
/// ABLIT) the overlay into the head's HF cache: pinned, resumable, verified.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FetchCheckpoint {
    /// Node that downloads (the head).
    pub node: String,
    /// Repositories in order.
    pub repos: Vec<RepoFetch>,
}

impl FetchCheckpoint {
    /// The fetch of `config`.
    #[must_use]
    pub fn new(config: &ValidatedConfig) -> Self {
        let c = config.config();
        let m = &c.model;
        let mut repos = vec![
            RepoFetch {
                role: "EXL3 checkpoint".into(),
                repo: m.id.clone(),
                revision: m.revision.clone(),
                files: [
                    "config.json",
                    "generation_config.json",
                    "tokenizer.json",
                    "tokenizer_config.json",
                    "model.safetensors.index.json",
                    "every shard the index lists (*.safetensors), the vision shard included",
                ]
                .map(str::to_owned)
                .to_vec(),
                cache: c.hub.cache.clone(),
                gated: false,
            },
            RepoFetch {
                role: "Engram tables and image routing bias (original model)".into(),
                repo: m.engram_repo.clone(),
                revision: m.engram_revision.clone(),
                files: [
                    "config.json".to_owned(),
                    "model.safetensors.index.json".to_owned(),
                ]
                .into_iter()
                .chain(m.engram_files.iter().cloned())
                .chain([
                    "*.ffn.gate.bias_vl tensors: byte ranges only, read through the shard headers"
                        .to_owned(),
                ])
                .collect(),
                cache: c.hub.cache.clone(),
                gated: false,
            },
            RepoFetch {
                role: "kernel kit".into(),
                repo: m.kit_repo.clone(),
                revision: m.kit_revision.clone(),
                files: vec!["kit/** (verified against kit/MANIFEST)".into()],
                cache: c.hub.cache.clone(),
                gated: false,
            },
        ];
        if m.ablit {
            repos.push(RepoFetch {
                role: "abliterated overlay (ABLIT=1)".into(),
                repo: m.ablit_id.clone(),
                revision: m.ablit_revision.clone(),
                files: vec!["*.safetensors".into(), "*.json".into()],
                cache: c.hub.ablit_cache.clone(),
                gated: true,
            });
        }
        Self {
            node: c.nodes[0].name.clone(),
            repos,
        }
    }

    pub(crate) fn describe(&self) -> (String, Vec<Action>) {
        let actions = self
            .repos
            .iter()
            .map(|r| {
                Action::with(
                    &self.node,
                    format!("fetch the {}", r.role),
                    ActionDetail::Fetch {
                        repo: r.repo.clone(),
                        revision: r.revision.clone(),
                        files: r.files.clone(),
                        cache: r.cache.clone(),
                        gated: r.gated,
                    },
                )
            })
            .collect();
        (
            "download pinned, resumable and verified into the standard HF cache".to_owned(),
            actions,
        )
    }
}

impl FetchCheckpoint {
    /// Runs the step.
    pub(crate) async fn run(
        &self,
        ctx: &crate::run::Context,
    ) -> Result<crate::run::Outcome, crate::run::StepFailure> {
        let _ = ctx;
        Err(crate::run::StepFailure::new(
            crate::plan::StepKind::FetchCheckpoint,
            "this step's runner is being integrated",
            None,
        ))
    }
}
