use serde::Serialize;

use crate::config::ValidatedConfig;
use crate::layout::NodeLayout;
use crate::plan::describe::{Action, ActionDetail};

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
    /// Runs the step.
    pub(crate) async fn run(
        &self,
        ctx: &crate::run::Context,
    ) -> Result<crate::run::Outcome, crate::run::StepFailure> {
        let _ = ctx;
        Err(crate::run::StepFailure::new(
            crate::plan::StepKind::BuildImage,
            "this step's runner is being integrated",
            None,
        ))
    }
}
