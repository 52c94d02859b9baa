use serde::Serialize;

use crate::config::ValidatedConfig;
use crate::context::{Context, Outcome, StepFailure};
use crate::describe::Action;
use crate::engine::{Engine, StepPlan};
use crate::event::StepKind;

/// Builds every rank's inputs on the head, as the engine defines them (for TensorFold: the rank
/// weight files, token map, RoPE tables and routing bias, and the kit checked against its
/// MANIFEST); skipped when they verify.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BuildRankCache {
    /// The engine's plan of the inputs.
    #[serde(flatten)]
    pub inputs: StepPlan,
}

impl BuildRankCache {
    /// The inputs build of `config` for `engine`.
    #[must_use]
    pub fn new(engine: &dyn Engine, config: &ValidatedConfig) -> Self {
        Self {
            inputs: engine.plan_inputs(config),
        }
    }

    pub(crate) fn describe(&self) -> (String, Vec<Action>) {
        (self.inputs.summary.clone(), self.inputs.actions.clone())
    }

    /// Builds (or verifies and skips) every rank's inputs through the engine. Overlapped, an
    /// engine that does not build while the checkpoint arrives gets it whole first; the stages
    /// say when its inputs are ready, whatever the engine.
    pub(crate) async fn run(
        &self,
        ctx: &Context,
        engine: &dyn Engine,
    ) -> Result<Outcome, StepFailure> {
        if ctx.overlapped() && !engine.builds_while_fetching() {
            ctx.wait_for(StepKind::BuildRankCache, |c| c.stages().fetched)
                .await?;
        }
        let outcome = engine.build_inputs(ctx).await?;
        ctx.mark_stage(|s| {
            s.rank_files = true;
            s.built = true;
        });
        Ok(outcome)
    }
}
