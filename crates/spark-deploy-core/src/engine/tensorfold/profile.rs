//! [`TensorfoldDsv41`]: the [`Engine`] implementation for TensorFold's dsv41 pair.

use async_trait::async_trait;

use super::{
    FOLLOWER_BIN, SERVER_BIN, bias_fetch, identity, launch, probes, rank_inputs, worker_inputs,
};
use crate::config::{EngineProfileName, ValidatedConfig};
use crate::container::ContainerSpec;
use crate::context::{Context, Outcome, StepFailure};
use crate::describe::{Action, ActionDetail, Transfer};
use crate::engine::{
    ApiEndpoint, BuildRecipe, Engine, EngineLimits, FingerprintError, MemoryModel, ProbeError,
    Readiness, ServingSignals, StepPlan,
};
use crate::event::StepKind;
use crate::facts::DeploymentFacts;
use crate::hub::HfToken;
use crate::transfer::FileJob;

/// TensorFold's native Zig `dsv41` engine: rank 0 `tensorfold-native serve` with the API, the
/// followers `tf-dsv41-lanes`, each reading its own TFDSRK01 rank file.
#[derive(Debug, Clone, Copy, Default)]
pub struct TensorfoldDsv41 {
    /// The engine's branch.
    pub branch: Branch,
}

/// Which branch of the engine the profile builds and drives.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Branch {
    /// `deepseek-v41-zig`: two ranks.
    #[default]
    Tp2,
    /// `deepseek-v41-zig-tp4`: two or four ranks, with the TP=4-only settings.
    Tp4,
}

impl TensorfoldDsv41 {
    /// The TP=2 profile (`tensorfold-dsv41`).
    pub const TP2: Self = Self {
        branch: Branch::Tp2,
    };
    /// The TP=4 profile (`tensorfold-dsv41-tp4`).
    pub const TP4: Self = Self {
        branch: Branch::Tp4,
    };

    fn profile_name(self) -> EngineProfileName {
        match self.branch {
            Branch::Tp2 => EngineProfileName::TensorfoldDsv41,
            Branch::Tp4 => EngineProfileName::TensorfoldDsv41Tp4,
        }
    }
}

fn binary_name(path: &str) -> String {
    path.rsplit('/').next().unwrap_or(path).to_owned()
}

/// The branch's build (docs/engine-contract.md, "Building the engine"): the native target for the
/// Spark's GB10 (aarch64, `sm_121`) with CUDA's `nvcc` of the base image, installed under
/// [`BuildRecipe::OUT`]. The TP=2 branch installs both binaries in `bin/`; the TP=4 branch builds
/// `ReleaseFast` against glibc 2.28 and installs the server in `native/bin/`. Zig's global cache
/// is kept between builds.
#[must_use]
pub(crate) fn build_recipe(branch: Branch) -> BuildRecipe {
    let out = BuildRecipe::OUT;
    let (target, optimize, server_dir) = match branch {
        Branch::Tp2 => (
            "-Dtarget=aarch64-linux-gnu",
            "-Doptimize=ReleaseSafe",
            "bin",
        ),
        Branch::Tp4 => (
            "-Dtarget=aarch64-linux-gnu.2.28",
            "-Doptimize=ReleaseFast",
            "native/bin",
        ),
    };
    BuildRecipe {
        command: [
            "zig",
            "build",
            "install",
            "native",
            target,
            optimize,
            "-Dnvcc=/usr/local/cuda/bin/nvcc",
            "-Dsm=121",
            "--prefix",
            out,
        ]
        .map(str::to_owned)
        .to_vec(),
        env: vec![(
            "ZIG_GLOBAL_CACHE_DIR".to_owned(),
            format!("{}/zig", BuildRecipe::CACHE),
        )],
        outputs: [(SERVER_BIN, server_dir), (FOLLOWER_BIN, "bin")]
            .iter()
            .map(|(b, dir)| {
                let name = binary_name(b);
                (format!("{dir}/{name}"), name)
            })
            .collect(),
    }
}

#[async_trait]
impl Engine for TensorfoldDsv41 {
    fn name(&self) -> &str {
        self.profile_name().as_str()
    }

    fn limits(&self) -> EngineLimits {
        // Per-rank figures of the widest world the branch serves; `memory` gives the
        // configured world's.
        let widest = match self.branch {
            Branch::Tp2 => 2,
            Branch::Tp4 => 4,
        };
        EngineLimits::of(self.profile_name(), widest)
    }

    fn rank_containers(
        &self,
        config: &ValidatedConfig,
        facts: &DeploymentFacts,
    ) -> Vec<ContainerSpec> {
        launch::rank_specs(config, facts)
    }

    fn binaries(&self) -> Vec<String> {
        vec![binary_name(SERVER_BIN), binary_name(FOLLOWER_BIN)]
    }

    fn build_recipe(&self, _config: &ValidatedConfig) -> Option<BuildRecipe> {
        Some(build_recipe(self.branch))
    }

    fn memory(&self, config: &ValidatedConfig) -> MemoryModel {
        config.limits().memory
    }

    fn rendezvous_ports(&self, config: &ValidatedConfig) -> Vec<(usize, u16)> {
        (1..config.config().nodes.len())
            .map(|rank| (rank, launch::rendezvous_port(config, rank)))
            .collect()
    }

    fn plan_inputs(&self, config: &ValidatedConfig) -> StepPlan {
        let inputs = rank_inputs::RankInputs::new(config);
        let (summary, actions) = inputs.describe();
        let data = match serde_json::to_value(&inputs) {
            Ok(serde_json::Value::Object(m)) => m,
            _ => serde_json::Map::new(),
        };
        StepPlan {
            summary,
            actions,
            data,
        }
    }

    async fn build_inputs(&self, ctx: &Context) -> Result<Outcome, StepFailure> {
        rank_inputs::RankInputs::new(ctx.config()).build(ctx).await
    }

    fn plan_worker_inputs(
        &self,
        config: &ValidatedConfig,
        facts: &DeploymentFacts,
        rank: usize,
    ) -> Vec<Transfer> {
        worker_inputs::plan(config, facts, rank)
    }

    async fn worker_jobs(
        &self,
        ctx: &Context,
        rank: usize,
    ) -> Result<Vec<FileJob>, Box<dyn std::error::Error + Send + Sync>> {
        worker_inputs::jobs(ctx, rank).await
    }

    fn builds_while_fetching(&self) -> bool {
        true
    }

    async fn worker_jobs_early(
        &self,
        ctx: &Context,
        rank: usize,
        rank_file: bool,
    ) -> Result<Vec<FileJob>, Box<dyn std::error::Error + Send + Sync>> {
        worker_inputs::early_jobs(ctx, rank, rank_file).await
    }

    async fn fetch_extras(
        &self,
        ctx: &Context,
        endpoint: Option<String>,
        token: Option<HfToken>,
    ) -> Result<Option<u64>, StepFailure> {
        let c = ctx.config().config();
        bias_fetch::fetch_bias_vl(ctx, endpoint, token)
            .await
            .map_err(|e| {
                StepFailure::new(
                    StepKind::FetchCheckpoint,
                    e,
                    Some(format!(
                        "{} must hold the *.ffn.gate.bias_vl tensors (or the kit must publish vision/gate_bias_vl.safetensors)",
                        c.model.engram_repo
                    )),
                )
            })
    }

    async fn fingerprint(
        &self,
        ctx: &Context,
        specs: &[ContainerSpec],
    ) -> Result<String, FingerprintError> {
        identity::fingerprint(ctx, specs).await
    }

    fn plan_smoke(&self, config: &ValidatedConfig, api: &ApiEndpoint) -> Vec<Action> {
        let c = config.config();
        let head = &c.nodes[0].name;
        vec![
            Action::with(
                head,
                format!(
                    "wait up to {} s for readiness, stop every rank if any exits",
                    c.lifecycle.ready_timeout_s
                ),
                ActionDetail::Http {
                    method: "GET".into(),
                    url: format!("{}/v1/models", api.base_url),
                    expect: format!("200 listing {}", api.served_name),
                },
            ),
            Action::with(
                head,
                "one greedy chat completion, thinking off",
                ActionDetail::Http {
                    method: "POST".into(),
                    url: format!("{}/v1/chat/completions", api.base_url),
                    expect: "\"What is 17*23?\" answered with 391".into(),
                },
            ),
        ]
    }

    async fn probe_ready(&self, ctx: &Context, api: &ApiEndpoint) -> Result<Readiness, ProbeError> {
        probes::ready(ctx, api).await
    }

    async fn probe_generation(
        &self,
        _ctx: &Context,
        api: &ApiEndpoint,
    ) -> Result<String, ProbeError> {
        probes::generation(api).await
    }

    fn serving_signals(&self) -> ServingSignals {
        ServingSignals {
            metrics_path: "/metrics",
            running_requests: "vllm:num_requests_running",
            generated_tokens: "vllm:generation_tokens_total",
            health_path: "/health",
        }
    }

    fn verify_inputs_command(
        &self,
        config: &ValidatedConfig,
        facts: &DeploymentFacts,
        rank: &str,
    ) -> Option<Vec<String>> {
        // `spark-deploy rank-cache verify MODEL_DIR OUT_DIR RANK WORLD --checksums`, as
        // BuildRankCache checks before a launch (every data block against its build-time CRC-32).
        let c = config.config();
        let mut argv = vec![
            "rank-cache".to_owned(),
            "verify".to_owned(),
            crate::layout::NodeLayout::snapshot_under(
                launch::paths::HF,
                &c.model.id,
                &facts.model_commit.to_string(),
            ),
            launch::paths::RANK_CACHE.to_owned(),
            rank.to_owned(),
            c.nodes.len().to_string(),
            "--checksums".to_owned(),
        ];
        if !c.engine.shape_guard {
            argv.push("--test-scale".to_owned());
        }
        Some(argv)
    }

    fn follower_rank_slots(&self) -> Option<crate::engine::RankSlots> {
        Some(crate::engine::RankSlots {
            argv: vec![launch::FOLLOWER_RANK_ARG],
            env: Vec::new(),
        })
    }
}
