use serde::Serialize;

use std::path::Path;

use crate::config::ValidatedConfig;
use crate::event::Level;
use crate::layout::NodeLayout;
use crate::plan::StepKind;
use crate::plan::describe::{Action, ActionDetail};
use crate::run::{Context, Outcome, StepFailure};
use crate::transfer::expand;

/// Makes the same runtime image and engine binaries present on every node, identified by content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BuildImage {
    /// Image reference.
    pub image: String,
    /// Engine commit.
    pub commit: String,
    /// (node, engine dir) pairs.
    pub nodes: Vec<(String, String)>,
}

impl BuildImage {
    /// The image step of `config`.
    #[must_use]
    pub fn new(config: &ValidatedConfig) -> Self {
        let c = config.config();
        Self {
            image: c.engine.image.clone(),
            commit: c.engine.commit.clone(),
            nodes: c
                .nodes
                .iter()
                .map(|n| (n.name.clone(), NodeLayout::of(config, n).engine_dir))
                .collect(),
        }
    }

    pub(crate) fn describe(&self) -> (String, Vec<Action>) {
        let actions = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, (node, dir))| {
                let how = if i == 0 {
                    format!("ensure image {} present; build engine {} in a throwaway container of it", self.image, &self.commit[..self.commit.len().min(12)])
                } else {
                    format!("ensure image {} present with the head's image id (shipped by content when missing)", self.image)
                };
                Action::with(node, how, ActionDetail::Outputs { files: vec![format!("{dir}/tensorfold-native"), format!("{dir}/tf-dsv41-lanes")] })
            })
            .collect();
        (
            "the same image and engine binaries on every node".to_owned(),
            actions,
        )
    }
}

impl BuildImage {
    /// Checks the image is present with one content id on every node and ships the engine
    /// binaries from the head to the workers.
    pub(crate) async fn run(&self, ctx: &Context) -> Result<Outcome, StepFailure> {
        let fail = |e: Box<dyn std::error::Error + Send + Sync>, remedy: String| {
            StepFailure::new(StepKind::BuildImage, e, Some(remedy))
        };
        let (head_node, head_dir) = &self.nodes[0];
        for bin in ["tensorfold-native", "tf-dsv41-lanes"] {
            if !Path::new(head_dir).join(bin).is_file() {
                return Err(fail(
                    format!("{head_dir}/{bin} is missing on {head_node}").into(),
                    format!(
                        "build engine {} (ENGINE-CONTRACT.md §1: `zig build install native ...` in a throwaway container of {}) into {head_dir}",
                        self.commit, self.image
                    ),
                ));
            }
        }
        let mut ids = Vec::new();
        for (i, (node, _)) in self.nodes.iter().enumerate() {
            let docker = ctx
                .docker(i)
                .await
                .map_err(|e| fail(Box::new(e), format!("Docker on {node} must be reachable")))?;
            let id = docker
                .inspect_image(&self.image)
                .await
                .map_err(|e| fail(Box::new(e), format!("Docker on {node} must answer")))?
                .and_then(|img| img.id)
                .ok_or_else(|| fail(format!("image {} is not present on {node}", self.image).into(), format!("load it there (`docker save {} | ssh {node} docker load`) — no registry is assumed", self.image)))?;
            ids.push((node.clone(), id));
        }
        if let Some((node, id)) = ids.iter().find(|(_, id)| *id != ids[0].1) {
            return Err(fail(
                format!(
                    "image {} differs: {} on {}, {id} on {node}",
                    self.image, ids[0].1, ids[0].0
                )
                .into(),
                "ship the head's image to every node so all ranks run identical bytes".into(),
            ));
        }
        let mut bytes = 0;
        for (i, (node, dir)) in self.nodes.iter().enumerate().skip(1) {
            let jobs = expand(Path::new(head_dir), Path::new(dir))
                .map_err(|e| fail(Box::new(e), "the engine dir must be readable".into()))?;
            let stats = super::storage::ship(ctx, StepKind::BuildImage, i, &jobs)
                .await
                .map_err(|e| fail(e, "a re-run resumes".into()))?;
            bytes += stats.bytes_sent;
            ctx.log(
                StepKind::BuildImage,
                Some(node),
                Level::Info,
                format!(
                    "image {} ({}) present; engine binaries: {} of {} files sent",
                    self.image, &ids[0].1, stats.sent, stats.files
                ),
            );
        }
        // `nfs` mode: the worker's volume is mounted from a container of this image.
        super::storage::verify_nfs_mounts(ctx)
            .await
            .map_err(|e| fail(e, "see the message".into()))?;
        if bytes == 0 {
            return Ok(Outcome::Skipped {
                reason: format!(
                    "image {} ({}) on every node, engine binaries present and verified",
                    self.image, ids[0].1
                ),
            });
        }
        Ok(Outcome::Done { bytes: Some(bytes) })
    }
}
