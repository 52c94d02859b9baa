//! [`TensorfoldDsv41`]: the [`Engine`] implementation for TensorFold's dsv41 pair.

use async_trait::async_trait;

use super::{
    FOLLOWER_BIN, SERVER_BIN, bias_fetch, identity, launch, probes, rank_inputs, worker_inputs,
};
use crate::config::ValidatedConfig;
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
pub struct TensorfoldDsv41;

fn binary_name(path: &str) -> String {
    path.rsplit('/').next().unwrap_or(path).to_owned()
}

/// The TP=2 branch's build (docs/engine-contract.md, "Building the engine"): the native target for
/// the Spark's GB10 (aarch64, `sm_121`) with CUDA's `nvcc` of the base image, installed under
/// [`BuildRecipe::OUT`], whose `bin/` then holds both binaries. Zig's global cache is kept between
/// builds.
#[must_use]
pub(crate) fn build_recipe() -> BuildRecipe {
    let out = BuildRecipe::OUT;
    BuildRecipe {
        command: [
            "zig",
            "build",
            "install",
            "native",
            "-Dtarget=aarch64-linux-gnu",
            "-Doptimize=ReleaseSafe",
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
        outputs: [SERVER_BIN, FOLLOWER_BIN]
            .iter()
            .map(|b| {
                let name = binary_name(b);
                (format!("bin/{name}"), name)
            })
            .collect(),
    }
}

#[async_trait]
impl Engine for TensorfoldDsv41 {
    fn name(&self) -> &str {
        "tensorfold-dsv41"
    }

    fn limits(&self) -> EngineLimits {
        super::LIMITS
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
        Some(build_recipe())
    }

    fn memory(&self, _config: &ValidatedConfig) -> MemoryModel {
        super::LIMITS.memory
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
                    "wait up to {} s for readiness, stop both ranks if either exits",
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
