//! The plan is data: an ordered list of typed steps computed before any side effect.
//!
//! [`Plan::standard`] composes the deployment of ARCHITECTURE.md: Preflight → FetchCheckpoint →
//! BuildRankCache → ConfigureWorkerStorage → BuildImage → LaunchRank → Smoke. Every step can
//! [`Step::describe`] what it will do on which node; `spark-deploy plan` prints exactly that and
//! touches nothing (no network, no Docker, no worker). Library users compose their own plans from the
//! same step types.

pub mod describe;
pub mod render;

use serde::{Deserialize, Serialize};

use crate::config::ValidatedConfig;
use crate::facts::DeploymentFacts;
use crate::steps::{
    BuildImage, BuildRankCache, ConfigureWorkerStorage, FetchCheckpoint, LaunchRank, Preflight,
    Smoke, Stop,
};
pub use describe::{Action, PlanDescription, StepDescription};

/// The kinds of step, as they appear in events and plan JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepKind {
    /// Check every node before anything changes.
    Preflight,
    /// Download the checkpoint, Engram shards, kit and overlay into the HF cache.
    FetchCheckpoint,
    /// Build every rank's inputs.
    BuildRankCache,
    /// Give the workers exactly the bytes their rank needs.
    ConfigureWorkerStorage,
    /// Make the same image present on every node.
    BuildImage,
    /// Start the ranks, followers first.
    LaunchRank,
    /// Wait for readiness and run one real generation.
    Smoke,
    /// Stop every rank, rank 0 first, saving logs.
    Stop,
}

impl StepKind {
    /// The step's name as written in docs (`FetchCheckpoint`).
    #[must_use]
    pub fn title(self) -> &'static str {
        match self {
            Self::Preflight => "Preflight",
            Self::FetchCheckpoint => "FetchCheckpoint",
            Self::BuildRankCache => "BuildRankCache",
            Self::ConfigureWorkerStorage => "ConfigureWorkerStorage",
            Self::BuildImage => "BuildImage",
            Self::LaunchRank => "LaunchRank",
            Self::Smoke => "Smoke",
            Self::Stop => "Stop",
        }
    }
}

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

/// An ordered list of steps for one deployment.
#[derive(Debug, Clone)]
pub struct Plan {
    config: ValidatedConfig,
    facts: DeploymentFacts,
    steps: Vec<Step>,
}

impl Plan {
    /// The standard deployment with placeholders for what preflight and fetch will detect.
    #[must_use]
    pub fn standard(config: &ValidatedConfig) -> Self {
        Self::standard_with_facts(config, DeploymentFacts::placeholders(config))
    }

    /// The standard deployment for known facts (after preflight and fetch).
    #[must_use]
    pub fn standard_with_facts(config: &ValidatedConfig, facts: DeploymentFacts) -> Self {
        let steps = vec![
            Step::Preflight(Preflight::new(config).skip_when_running()),
            Step::FetchCheckpoint(FetchCheckpoint::new(config)),
            Step::BuildRankCache(BuildRankCache::new(config)),
            Step::ConfigureWorkerStorage(ConfigureWorkerStorage::new(config, &facts)),
            Step::BuildImage(BuildImage::new(config)),
            Step::LaunchRank(LaunchRank::new(config, &facts)),
            Step::Smoke(Smoke::new(config)),
        ];
        Self {
            config: config.clone(),
            facts,
            steps,
        }
    }

    /// The teardown plan: stop every rank, rank 0 first, saving logs.
    #[must_use]
    pub fn teardown(config: &ValidatedConfig) -> Self {
        let facts = DeploymentFacts::placeholders(config);
        Self {
            config: config.clone(),
            facts,
            steps: vec![Step::Stop(Stop::new(config))],
        }
    }

    /// Restart: the teardown's Stop followed by the standard plan (whose launch compares the
    /// fingerprint anew). The config was validated before this plan exists, so nothing is
    /// stopped for an invalid config.
    #[must_use]
    pub fn restart(config: &ValidatedConfig) -> Self {
        let mut plan = Self::standard(config);
        plan.steps.insert(0, Step::Stop(Stop::new(config)));
        plan
    }

    /// A custom plan of the given steps.
    #[must_use]
    pub fn from_steps(config: &ValidatedConfig, steps: Vec<Step>) -> Self {
        Self {
            config: config.clone(),
            facts: DeploymentFacts::placeholders(config),
            steps,
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
