//! The [`Engine`] trait: what a step needs to know about the engine it deploys.

use std::fmt::Debug;

use async_trait::async_trait;
use serde::Serialize;

use super::EngineLimits;
use super::limits::MemoryModel;
use crate::config::ValidatedConfig;
use crate::container::ContainerSpec;
use crate::context::{Context, Outcome, StepFailure};
use crate::describe::{Action, Transfer};
use crate::facts::DeploymentFacts;
use crate::hub::HfToken;
use crate::secret::Secret;
use crate::transfer::FileJob;

/// A step's description as an engine computes it: a one-line summary, the actions per node, and
/// the data the plan's JSON carries for it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepPlan {
    /// One line: what the step does.
    #[serde(skip)]
    pub summary: String,
    /// What it does on which node.
    #[serde(skip)]
    pub actions: Vec<Action>,
    /// The step's data as plan JSON shows it (an object).
    #[serde(flatten)]
    pub data: serde_json::Map<String, serde_json::Value>,
}

/// Where rank 0's API answers, and with which key.
#[derive(Debug, Clone)]
pub struct ApiEndpoint {
    /// Base URL as seen from the head (`http://127.0.0.1:8888`).
    pub base_url: String,
    /// The served model id.
    pub served_name: String,
    /// The API key, when the API requires one.
    pub key: Option<Secret>,
}

/// One readiness observation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// The pair serves.
    Ready,
    /// Not yet, and why (e.g. "rank 1 has not printed its loaded line yet").
    Waiting(String),
}

/// A probe that could not conclude, or concluded that the pair is broken.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// A rank's container is no longer running.
    #[error("rank {rank} ({container} on {node}) exited{}; its log ends with:\n{tail}", exit_code.map_or_else(String::new, |c| format!(" with code {c}")))]
    RankExited {
        /// Rank.
        rank: usize,
        /// Node.
        node: String,
        /// Container.
        container: String,
        /// Exit code, when known.
        exit_code: Option<i64>,
        /// Last log lines.
        tail: String,
    },
    /// A rank reported an error while following rank 0.
    #[error("rank {rank} on {node} reported a follow error: {line}")]
    FollowError {
        /// Rank.
        rank: usize,
        /// Node.
        node: String,
        /// The rank's line.
        line: String,
    },
    /// The engine answered, but wrongly.
    #[error("the smoke generation failed: {0}")]
    Generation(String),
    /// A node's Docker did not answer: nothing is known about the rank, so the probe is retried;
    /// this alone never stops a pair.
    #[error("{node}'s Docker did not answer ({detail}); retrying")]
    DockerUnavailable {
        /// Node.
        node: String,
        /// What failed.
        detail: String,
    },
}

impl ProbeError {
    /// Whether the probe should simply be retried (nothing says the pair is broken).
    #[must_use]
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::DockerUnavailable { .. })
    }
}

/// The cross-rank fingerprint could not be computed, or the ranks disagree.
#[derive(Debug, thiserror::Error)]
pub enum FingerprintError {
    /// Reading a node's input identities failed.
    #[error("reading the inputs of rank {rank} on {node}: {detail}")]
    Inputs {
        /// Rank.
        rank: usize,
        /// Node.
        node: String,
        /// What failed.
        detail: String,
    },
    /// The ranks disagree on settings that must match.
    #[error("the ranks' settings differ, refusing to launch any: {}", .0.join("; "))]
    Mismatch(Vec<String>),
    /// The inputs on a node were prepared for another source than this start's (another `ABLIT`
    /// value, overlay or checkpoint), or for none.
    #[error("rank {rank} on {node}: the inputs in {dir} do not fit this start: {detail}")]
    Prepared {
        /// Rank.
        rank: usize,
        /// Node.
        node: String,
        /// The inputs directory.
        dir: String,
        /// What differs.
        detail: String,
        /// What to run.
        remedy: String,
    },
}

impl FingerprintError {
    /// What the user should do, when the error knows.
    #[must_use]
    pub fn remedy(&self) -> Option<String> {
        match self {
            Self::Inputs { .. } => None,
            Self::Mismatch(_) => Some("rebuild the inputs on both nodes from the same plan (`spark-deploy up` re-runs BuildRankCache and ConfigureWorkerStorage)".to_owned()),
            Self::Prepared { remedy, .. } => Some(remedy.clone()),
        }
    }
}

/// What a supervisor reads from a serving pair.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ServingSignals {
    /// Path of the Prometheus metrics on rank 0 (needs the API key).
    pub metrics_path: &'static str,
    /// Gauge of requests running now.
    pub running_requests: &'static str,
    /// Counter of generated tokens.
    pub generated_tokens: &'static str,
    /// Path that answers while rank 0's process lives (not a pair liveness signal).
    pub health_path: &'static str,
}

/// Where a follower's container (rank >= 1) carries its own rank number, so that one pod template
/// can serve every follower with the rank taken from the pod's index (`export lws`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct RankSlots {
    /// Positions in the argv whose value is the rank.
    pub argv: Vec<usize>,
    /// Environment variables whose value is the rank.
    pub env: Vec<String>,
}

/// How a profile builds its binaries from source (BuildImage, with `engine.repo` set): a command run
/// in a throwaway container of `engine.base_image` with the patched checkout mounted at
/// [`BuildRecipe::SRC`] (the working directory), an empty output directory at [`BuildRecipe::OUT`]
/// and a cache directory kept between builds at [`BuildRecipe::CACHE`] (also `HOME`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BuildRecipe {
    /// The argv, run as is (no shell).
    pub command: Vec<String>,
    /// Extra environment of the build container.
    pub env: Vec<(String, String)>,
    /// What to collect: a path under [`BuildRecipe::OUT`] → the engine file name it becomes (one
    /// of [`Engine::binaries`]).
    pub outputs: Vec<(String, String)>,
}

impl BuildRecipe {
    /// Where the patched checkout is mounted (the working directory).
    pub const SRC: &'static str = "/src";
    /// The empty output directory the command installs into.
    pub const OUT: &'static str = "/out";
    /// A directory kept between builds (tool caches); `HOME` points here.
    pub const CACHE: &'static str = "/cache";
}

/// An engine profile. Steps call these; nothing outside `engine/` names an implementation but
/// [`super::registry`].
///
/// Methods named `plan_*` or returning descriptions are pure (the plan is data); the `async`
/// ones act through the [`Context`]'s ports.
#[async_trait]
pub trait Engine: Send + Sync + Debug {
    /// The profile's name as the configuration writes it (`tensorfold-dsv41`).
    fn name(&self) -> &str;

    /// What the engine accepts (pool, streams, world sizes).
    fn limits(&self) -> EngineLimits;

    /// Every rank's container in start order: followers first, rank 0 last.
    fn rank_containers(
        &self,
        config: &ValidatedConfig,
        facts: &DeploymentFacts,
    ) -> Vec<ContainerSpec>;

    /// Engine files (names in the head's engine directory) every node must hold identically.
    fn binaries(&self) -> Vec<String>;

    /// How the binaries are built from `engine.repo`; `None` (the default) when the profile has no
    /// build, and the binaries must be put in the head's engine directory by hand.
    fn build_recipe(&self, _config: &ValidatedConfig) -> Option<BuildRecipe> {
        None
    }

    /// The memory one rank needs, for preflight's budget.
    fn memory(&self, config: &ValidatedConfig) -> MemoryModel;

    /// The TCP ports on the head's fabric address the followers join, as (follower rank, port);
    /// preflight checks that each is free. The default: every follower joins
    /// `engine.rendezvous_port`.
    fn rendezvous_ports(&self, config: &ValidatedConfig) -> Vec<(usize, u16)> {
        let c = config.config();
        (1..c.nodes.len())
            .map(|rank| (rank, c.engine.rendezvous_port))
            .collect()
    }

    /// BuildRankCache's description: the per-rank inputs built on the head.
    fn plan_inputs(&self, config: &ValidatedConfig) -> StepPlan;

    /// Builds (or verifies and skips) every rank's inputs on the head.
    ///
    /// # Errors
    ///
    /// The step's failure, with its remedy.
    async fn build_inputs(&self, ctx: &Context) -> Result<Outcome, StepFailure>;

    /// Engine inputs read from the Hub beyond the fetched snapshots (e.g. tensors read by byte
    /// range); the bytes read, or `None` when nothing was needed.
    ///
    /// # Errors
    ///
    /// The step's failure, with its remedy.
    async fn fetch_extras(
        &self,
        ctx: &Context,
        endpoint: Option<String>,
        token: Option<HfToken>,
    ) -> Result<Option<u64>, StepFailure>;

    /// What worker `rank` receives (for the plan's description).
    fn plan_worker_inputs(
        &self,
        config: &ValidatedConfig,
        facts: &DeploymentFacts,
        rank: usize,
    ) -> Vec<Transfer>;

    /// The files to ship to worker `rank` now (head path → worker path), after making room for
    /// them on the worker.
    ///
    /// # Errors
    ///
    /// A missing input on the head or a failed command on the worker.
    async fn worker_jobs(
        &self,
        ctx: &Context,
        rank: usize,
    ) -> Result<Vec<FileJob>, Box<dyn std::error::Error + Send + Sync>>;

    /// Whether [`Engine::build_inputs`] waits for each checkpoint file itself in an overlapped
    /// `up` (see [`Context::stages`]); otherwise BuildRankCache calls it once the fetch has
    /// finished. `false` by default.
    fn builds_while_fetching(&self) -> bool {
        false
    }

    /// In an overlapped `up`, the files worker `rank` can receive now, while the rest is still
    /// being fetched or built (asked again until the fetch has finished and its rank inputs have
    /// gone; what was shipped is skipped), its rank inputs only when `rank_inputs` says they are
    /// final (asked once); nothing by default.
    ///
    /// # Errors
    ///
    /// As [`Engine::worker_jobs`].
    async fn worker_jobs_early(
        &self,
        _ctx: &Context,
        _rank: usize,
        _rank_inputs: bool,
    ) -> Result<Vec<FileJob>, Box<dyn std::error::Error + Send + Sync>> {
        Ok(Vec::new())
    }

    /// The cross-rank fingerprint of `specs` with the inputs each node holds now; an error
    /// names what differs.
    ///
    /// # Errors
    ///
    /// [`FingerprintError`].
    async fn fingerprint(
        &self,
        ctx: &Context,
        specs: &[ContainerSpec],
    ) -> Result<String, FingerprintError>;

    /// Smoke's actions for `api` (for the plan's description).
    fn plan_smoke(&self, config: &ValidatedConfig, api: &ApiEndpoint) -> Vec<Action>;

    /// One readiness observation of the running ranks.
    ///
    /// # Errors
    ///
    /// [`ProbeError`]: a rank died (stop the pair) or Docker did not answer (retry).
    async fn probe_ready(&self, ctx: &Context, api: &ApiEndpoint) -> Result<Readiness, ProbeError>;

    /// One real generation through rank 0; returns a line for the log (`17*23 = 391`).
    ///
    /// # Errors
    ///
    /// [`ProbeError::Generation`] when the answer is wrong or missing.
    async fn probe_generation(
        &self,
        ctx: &Context,
        api: &ApiEndpoint,
    ) -> Result<String, ProbeError>;

    /// What a supervisor reads from the serving pair.
    fn serving_signals(&self) -> ServingSignals;

    /// Where a follower's container holds its rank; `None` (the default) when the followers'
    /// containers cannot be told apart by their rank number alone.
    fn follower_rank_slots(&self) -> Option<RankSlots> {
        None
    }

    /// The `spark-deploy` arguments that verify `rank`'s inputs as the rank's container sees
    /// them (its mounts at their container paths); `rank` may be a reference such as
    /// `$(LWS_WORKER_INDEX)`. `None` (the default) when the profile has no such check.
    fn verify_inputs_command(
        &self,
        _config: &ValidatedConfig,
        _facts: &DeploymentFacts,
        _rank: &str,
    ) -> Option<Vec<String>> {
        None
    }
}
