use serde::Serialize;

use crate::config::ValidatedConfig;
use crate::engine::tensorfold::TOKEN_MAP_FILE;
use crate::layout::NodeLayout;
use crate::plan::describe::{Action, ActionDetail};

/// One rank's weight file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RankOutput {
    /// Rank.
    pub rank: u32,
    /// Node that serves it.
    pub node: String,
    /// Directory on the head the file is written to.
    pub dir: String,
    /// File name pattern (`rank{R}of{W}-<hash>.bin`).
    pub file: String,
}

/// Builds every rank's inputs on the head: rank weight files (TFDSRK01), the token map, RoPE tables
/// and the image routing bias, and verifies the kit against its MANIFEST.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BuildRankCache {
    /// Node that builds (the head).
    pub node: String,
    /// Head directory holding `rank-cache/` and the token map.
    pub inputs_dir: String,
    /// Kit directory on the head.
    pub kit_dir: String,
    /// One entry per rank.
    pub ranks: Vec<RankOutput>,
}

impl BuildRankCache {
    /// The rank-cache build of `config`.
    #[must_use]
    pub fn new(config: &ValidatedConfig) -> Self {
        let c = config.config();
        let head = NodeLayout::of(config, &c.nodes[0]);
        let world = c.nodes.len();
        let ranks = c
            .nodes
            .iter()
            .enumerate()
            .map(|(r, n)| RankOutput {
                rank: u32::try_from(r).unwrap_or(u32::MAX),
                node: n.name.clone(),
                dir: format!("{}/rank-cache", head.inputs_dir),
                file: format!("rank{r}of{world}-<first 20 hex of sha256 of its index, computed from the checkpoint headers>.bin"),
            })
            .collect();
        Self {
            node: c.nodes[0].name.clone(),
            inputs_dir: head.inputs_dir,
            kit_dir: head.kit_dir,
            ranks,
        }
    }

    pub(crate) fn describe(&self) -> (String, Vec<Action>) {
        let mut actions: Vec<Action> = self
            .ranks
            .iter()
            .map(|r| {
                Action::with(
                    &self.node,
                    format!(
                        "rank {} weight file for {} (skipped when verify passes)",
                        r.rank, r.node
                    ),
                    ActionDetail::Outputs {
                        files: vec![format!("{}/{}", r.dir, r.file)],
                    },
                )
            })
            .collect();
        actions.push(Action::with(
            &self.node,
            "token map from tokenizer.json (distinct ids = engram_compressed_vocab_size)",
            ActionDetail::Outputs {
                files: vec![format!("{}/{TOKEN_MAP_FILE}", self.inputs_dir)],
            },
        ));
        actions.push(Action::with(
            &self.node,
            "RoPE tables and image routing bias, then the kit against its MANIFEST",
            ActionDetail::Outputs {
                files: [
                    "rope-plain-cos.f32",
                    "rope-plain-sin.f32",
                    "rope-compressed-cos.f32",
                    "rope-compressed-sin.f32",
                    "vision/gate_bias_vl.safetensors",
                    "MANIFEST (sha256 of every entry)",
                ]
                .iter()
                .map(|f| format!("{}/{f}", self.kit_dir))
                .collect(),
            },
        ));
        (
            "build and verify every rank's inputs on the head".to_owned(),
            actions,
        )
    }
}

impl BuildRankCache {
    /// Runs the step.
    pub(crate) async fn run(
        &self,
        ctx: &crate::run::Context,
    ) -> Result<crate::run::Outcome, crate::run::StepFailure> {
        let _ = ctx;
        Err(crate::run::StepFailure::new(
            crate::plan::StepKind::BuildRankCache,
            "this step's runner is being integrated",
            None,
        ))
    }
}
