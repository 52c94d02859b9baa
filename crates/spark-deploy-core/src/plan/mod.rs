//! The plan is data: an ordered list of typed steps computed before any side effect.
//!
//! [`Plan::standard`] composes the whole deployment (docs/architecture.md): Preflight → FetchCheckpoint →
//! BuildRankCache → ConfigureWorkerStorage → BuildImage → LaunchRank → Smoke. Every step can
//! [`Step::describe`] what it will do on which node; `spark-deploy plan` prints exactly that and
//! touches nothing (no network, no Docker, no worker). Library users compose their own plans from the
//! same step types.

use serde::Serialize;

use std::sync::Arc;

use crate::config::{PreparePolicy, ValidatedConfig};
pub use crate::describe::{Action, PlanDescription, StepDescription, render};
use crate::engine::{self, Engine};
pub use crate::event::StepKind;
use crate::facts::DeploymentFacts;
use crate::lifecycle::watch_state::Marker;
use crate::steps::{
    BuildImage, BuildRankCache, ConfigureWorkerStorage, FetchCheckpoint, LaunchRank, Preflight,
    Smoke, Stop,
};

/// One typed step with the data it needs.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Step {
    /// See [`Preflight`].
    Preflight(Preflight),
    /// See [`FetchCheckpoint`].
    FetchCheckpoint(FetchCheckpoint),
    /// See [`BuildRankCache`].
    BuildRankCache(BuildRankCache),
    /// See [`ConfigureWorkerStorage`].
    ConfigureWorkerStorage(ConfigureWorkerStorage),
    /// See [`BuildImage`].
    BuildImage(BuildImage),
    /// See [`LaunchRank`].
    LaunchRank(LaunchRank),
    /// See [`Smoke`].
    Smoke(Smoke),
    /// See [`Stop`].
    Stop(Stop),
}

impl Step {
    /// The step's kind.
    #[must_use]
    pub fn kind(&self) -> StepKind {
        match self {
            Self::Preflight(_) => StepKind::Preflight,
            Self::FetchCheckpoint(_) => StepKind::FetchCheckpoint,
            Self::BuildRankCache(_) => StepKind::BuildRankCache,
            Self::ConfigureWorkerStorage(_) => StepKind::ConfigureWorkerStorage,
            Self::BuildImage(_) => StepKind::BuildImage,
            Self::LaunchRank(_) => StepKind::LaunchRank,
            Self::Smoke(_) => StepKind::Smoke,
            Self::Stop(_) => StepKind::Stop,
        }
    }

    /// What the step will do, per node.
    #[must_use]
    pub fn describe(&self) -> StepDescription {
        let (summary, actions) = match self {
            Self::Preflight(s) => s.describe(),
            Self::FetchCheckpoint(s) => s.describe(),
            Self::BuildRankCache(s) => s.describe(),
            Self::ConfigureWorkerStorage(s) => s.describe(),
            Self::BuildImage(s) => s.describe(),
            Self::LaunchRank(s) => s.describe(),
            Self::Smoke(s) => s.describe(),
            Self::Stop(s) => s.describe(),
        };
        StepDescription {
            step: self.kind(),
            summary,
            actions,
        }
    }
}

/// What a user asks for, by command (`spark-deploy <verb>`, `Deployment.<verb>()` in Python):
/// the one mapping from verbs to plans, [`Plan::for_verb`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verb {
    /// The standard plan, every step skipped whose work is done.
    Up,
    /// Stop every rank, rank 0 first, saving logs.
    Down,
    /// Everything before the launch, validated while a running pair keeps serving; then stop
    /// every rank, launch and smoke.
    Restart,
    /// Every step up to, not including, LaunchRank.
    Prepare,
    /// Every preflight check, also while the deployment runs.
    Preflight,
    /// Download the checkpoint, Engram shards and kit.
    Fetch,
    /// Check the cache only, with no network.
    FetchVerifyOnly,
}

/// An ordered list of steps for one deployment, and the engine they deploy.
#[derive(Debug, Clone)]
pub struct Plan {
    config: ValidatedConfig,
    engine: Arc<dyn Engine>,
    facts: DeploymentFacts,
    steps: Vec<Step>,
    prepare: PreparePolicy,
    marker: Marker,
}

impl Plan {
    /// The standard deployment with placeholders for what preflight and fetch will detect.
    #[must_use]
    pub fn standard(config: &ValidatedConfig) -> Self {
        Self::standard_with_engine(config, engine::for_config(config))
    }

    /// The standard deployment of `engine` (a profile of one's own, not in the registry).
    #[must_use]
    pub fn standard_with_engine(config: &ValidatedConfig, engine: Arc<dyn Engine>) -> Self {
        let facts = DeploymentFacts::placeholders(config);
        Self::standard_with_facts(config, engine, facts)
    }

    /// The standard deployment for known facts (after preflight and fetch).
    #[must_use]
    pub fn standard_with_facts(
        config: &ValidatedConfig,
        engine: Arc<dyn Engine>,
        facts: DeploymentFacts,
    ) -> Self {
        let e = engine.as_ref();
        let steps = vec![
            Step::Preflight(Preflight::new(config).skip_when_running()),
            Step::FetchCheckpoint(FetchCheckpoint::new(config)),
            Step::BuildRankCache(BuildRankCache::new(e, config)),
            Step::ConfigureWorkerStorage(ConfigureWorkerStorage::new(e, config, &facts)),
            Step::BuildImage(BuildImage::new(e, config)),
            Step::LaunchRank(LaunchRank::new(e, config, &facts)),
            Step::Smoke(Smoke::new(e, config)),
        ];
        Self {
            config: config.clone(),
            engine,
            facts,
            steps,
            prepare: config.config().lifecycle.prepare,
            marker: Marker::Keep,
        }
    }

    /// The step of `kind` for `config` and `engine`, with placeholders for what preflight and
    /// fetch will detect (Stop included).
    #[must_use]
    pub fn step(config: &ValidatedConfig, engine: &dyn Engine, kind: StepKind) -> Step {
        let facts = DeploymentFacts::placeholders(config);
        match kind {
            StepKind::Preflight => Step::Preflight(Preflight::new(config)),
            StepKind::FetchCheckpoint => Step::FetchCheckpoint(FetchCheckpoint::new(config)),
            StepKind::BuildRankCache => Step::BuildRankCache(BuildRankCache::new(engine, config)),
            StepKind::ConfigureWorkerStorage => {
                Step::ConfigureWorkerStorage(ConfigureWorkerStorage::new(engine, config, &facts))
            }
            StepKind::BuildImage => Step::BuildImage(BuildImage::new(engine, config)),
            StepKind::LaunchRank => Step::LaunchRank(LaunchRank::new(engine, config, &facts)),
            StepKind::Smoke => Step::Smoke(Smoke::new(engine, config)),
            StepKind::Stop => Step::Stop(Stop::new(config)),
        }
    }

    /// The plan of `verb` for `config` with the configured engine.
    #[must_use]
    ///
    /// `down` writes the watch stop marker when it succeeds (a pair the user stopped is never
    /// healed); `up` and `restart` remove it.
    pub fn for_verb(config: &ValidatedConfig, verb: Verb) -> Self {
        let marker = match verb {
            Verb::Down => Marker::Write,
            Verb::Up | Verb::Restart => Marker::Clear,
            Verb::Prepare | Verb::Preflight | Verb::Fetch | Verb::FetchVerifyOnly => Marker::Keep,
        };
        let mut plan = match verb {
            Verb::Up => Self::standard(config),
            Verb::Down => Self::teardown(config),
            Verb::Restart => Self::restart(config),
            Verb::Prepare => Self::prepare(config),
            Verb::Preflight => {
                Self::from_steps(config, vec![Step::Preflight(Preflight::new(config))])
            }
            Verb::Fetch => Self::from_steps(
                config,
                vec![Step::FetchCheckpoint(FetchCheckpoint::new(config))],
            ),
            Verb::FetchVerifyOnly => Self::from_steps(
                config,
                vec![Step::FetchCheckpoint(
                    FetchCheckpoint::new(config).verify_only(),
                )],
            ),
        };
        plan.marker = marker;
        plan
    }

    /// What the plan does to the watch stop marker when it succeeds.
    #[must_use]
    pub fn marker(&self) -> Marker {
        self.marker
    }

    /// The engine the plan deploys.
    #[must_use]
    pub fn engine(&self) -> &Arc<dyn Engine> {
        &self.engine
    }

    /// The teardown plan: stop every rank, rank 0 first, saving logs.
    #[must_use]
    pub fn teardown(config: &ValidatedConfig) -> Self {
        let facts = DeploymentFacts::placeholders(config);
        Self {
            config: config.clone(),
            engine: engine::for_config(config),
            facts,
            steps: vec![Step::Stop(Stop::new(config))],
            prepare: config.config().lifecycle.prepare,
            marker: Marker::Keep,
        }
    }

    /// The teardown of a heal: as [`Plan::teardown`], each rank given `grace_s` seconds (a heal
    /// has saved both logs already, and a wedged or frozen rank never stops by itself).
    #[must_use]
    pub fn teardown_with_grace(config: &ValidatedConfig, grace_s: u64) -> Self {
        let mut plan = Self::teardown(config);
        for step in &mut plan.steps {
            if let Step::Stop(stop) = step {
                stop.grace_s = grace_s;
            }
        }
        plan
    }

    /// Restart, validated before anything stops: Preflight (always run), FetchCheckpoint,
    /// BuildRankCache, ConfigureWorkerStorage and BuildImage first — while the running pair keeps
    /// serving — then Stop, LaunchRank and Smoke. A failure before Stop leaves the running pair
    /// untouched (the run stops only ranks it started itself).
    #[must_use]
    pub fn restart(config: &ValidatedConfig) -> Self {
        let mut plan = Self::standard(config);
        plan.steps[0] = Step::Preflight(Preflight::new(config));
        let launch = plan
            .steps
            .iter()
            .position(|s| s.kind() == StepKind::LaunchRank)
            .unwrap_or(plan.steps.len());
        plan.steps.insert(launch, Step::Stop(Stop::new(config)));
        plan
    }

    /// Everything up to, not including, LaunchRank: the inputs, worker storage and image are
    /// ready afterwards, and nothing was started or stopped.
    #[must_use]
    pub fn prepare(config: &ValidatedConfig) -> Self {
        let mut plan = Self::standard(config);
        plan.steps[0] = Step::Preflight(Preflight::new(config));
        plan.steps
            .retain(|s| !matches!(s.kind(), StepKind::LaunchRank | StepKind::Smoke));
        // Asked for by name: PREPARE=0 does not stop it.
        if plan.prepare == PreparePolicy::Never {
            plan.prepare = PreparePolicy::Auto;
        }
        plan
    }

    /// The same plan for `facts` (what preflight and fetch detected): the steps that depend on
    /// them are computed again.
    #[must_use]
    pub fn with_facts(&self, facts: DeploymentFacts) -> Self {
        let e = self.engine.as_ref();
        let steps = self
            .steps
            .iter()
            .map(|s| match s {
                Step::ConfigureWorkerStorage(_) => Step::ConfigureWorkerStorage(
                    ConfigureWorkerStorage::new(e, &self.config, &facts),
                ),
                Step::LaunchRank(_) => Step::LaunchRank(LaunchRank::new(e, &self.config, &facts)),
                other => other.clone(),
            })
            .collect();
        Self {
            config: self.config.clone(),
            engine: Arc::clone(&self.engine),
            facts,
            steps,
            prepare: self.prepare,
            marker: self.marker,
        }
    }

    /// How the preparation steps treat what they find (`PREPARE`; see [`PreparePolicy`]).
    #[must_use]
    pub fn prepare_policy(&self) -> PreparePolicy {
        self.prepare
    }

    /// A custom plan of the given steps.
    #[must_use]
    pub fn from_steps(config: &ValidatedConfig, steps: Vec<Step>) -> Self {
        Self {
            config: config.clone(),
            engine: engine::for_config(config),
            facts: DeploymentFacts::placeholders(config),
            steps,
            prepare: config.config().lifecycle.prepare,
            marker: Marker::Keep,
        }
    }

    /// The steps in order.
    #[must_use]
    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    /// The config the plan was computed from.
    #[must_use]
    pub fn config(&self) -> &ValidatedConfig {
        &self.config
    }

    /// The whole plan as data (what `spark-deploy plan --json` prints).
    #[must_use]
    pub fn describe(&self) -> PlanDescription {
        PlanDescription::new(
            &self.config,
            &self.facts,
            self.steps.iter().map(Step::describe).collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{DeploymentConfig, validate};

    #[test]
    fn down_writes_the_watch_stop_marker_up_and_restart_remove_it() {
        let v = validate(DeploymentConfig::default(), std::path::Path::new("/home/u")).unwrap();
        let m = |verb| Plan::for_verb(&v, verb).marker();
        assert_eq!(m(Verb::Down), Marker::Write);
        assert_eq!(m(Verb::Up), Marker::Clear);
        assert_eq!(m(Verb::Restart), Marker::Clear);
        for verb in [
            Verb::Prepare,
            Verb::Preflight,
            Verb::Fetch,
            Verb::FetchVerifyOnly,
        ] {
            assert_eq!(m(verb), Marker::Keep);
        }
        // The supervisor's own plans leave it alone.
        assert_eq!(Plan::teardown(&v).marker(), Marker::Keep);
        assert_eq!(Plan::standard(&v).marker(), Marker::Keep);
    }
}
