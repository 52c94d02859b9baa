//! A second engine profile, defined here and nowhere else, runs the standard plan on the testbed
//! to a passing Smoke: the steps reach the engine only through the `Engine` trait.
//!
//! The "engine" is bash from the testbed's engine image: every rank prints that it is ready and
//! waits; rank 0 also computes 17*23 with bash arithmetic, which the profile's generation probe
//! reads from its log. It needs no inputs, ships nothing to the workers and no engine files.

// An integration test: a failed unwrap or expect is the test failure, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use sha2::{Digest, Sha256};
use spark_deploy_core::config::{ValidatedConfig, validate};
use spark_deploy_core::container::{ContainerSpec, labels, rank_container_name};
use spark_deploy_core::context::{Context, Outcome, StepFailure};
use spark_deploy_core::describe::{Action, ActionDetail, Transfer};
use spark_deploy_core::engine::{
    ApiEndpoint, Engine, EngineLimits, FingerprintError, MemoryModel, ProbeError, Readiness,
    ServingSignals, StepPlan,
};
use spark_deploy_core::event::{Event, Recorder, Source, StepKind};
use spark_deploy_core::facts::DeploymentFacts;
use spark_deploy_core::hub::HfToken;
use spark_deploy_core::layout::NodeLayout;
use spark_deploy_core::plan::Plan;
use spark_deploy_core::run::StepStatus;
use spark_deploy_core::transfer::FileJob;

use common::testbed::{R, on_testbed};

/// Bash ranks that report readiness in their logs.
#[derive(Debug)]
struct BashPair;

const READY: &str = "bash-pair ready";

#[async_trait]
impl Engine for BashPair {
    fn name(&self) -> &str {
        "bash-pair"
    }

    fn limits(&self) -> EngineLimits {
        EngineLimits {
            min_pool: 1,
            max_pool: u64::MAX,
            max_parallel: 1,
            max_round_rows: 16,
            tp4_branch: false,
            world_sizes: &[2],
            memory_warn_context: u64::MAX,
            memory: MemoryModel {
                rank_weights_estimate: 0,
                estimate_for_model: "",
                arena_base_gib: 0,
                arena_gib_per_step: 0,
                kv_bytes_per_position: 0,
                rope_bytes_per_row: 0,
                rope_extra_rows: 0,
                reserve: 0,
            },
        }
    }

    fn rank_containers(
        &self,
        config: &ValidatedConfig,
        _facts: &DeploymentFacts,
    ) -> Vec<ContainerSpec> {
        let c = config.config();
        let world = c.nodes.len();
        (0..world)
            .rev()
            .map(|rank| {
                let node = &c.nodes[rank];
                let work = if rank == 0 {
                    "echo \"17*23 = $((17*23))\"; "
                } else {
                    ""
                };
                let script = format!(
                    "trap 'exit 0' TERM; echo \"{READY}: rank {rank} of {world}\"; {work}while :; do read -r -t 3600 <> <(:) || :; done"
                );
                ContainerSpec {
                    node: node.name.clone(),
                    rank,
                    name: rank_container_name(&c.deployment.name, rank),
                    image: NodeLayout::of(config, node).image,
                    argv: vec!["/usr/bin/bash".into(), "-c".into(), script],
                    env: BTreeMap::new(),
                    mounts: Vec::new(),
                    network_mode: node.network_mode.clone(),
                    ipc_mode: "private".into(),
                    runtime: c.engine.runtime.clone(),
                    gpus: "none".into(),
                    devices: Vec::new(),
                    ulimits: Vec::new(),
                    cap_add: Vec::new(),
                    oom_score_adj: 0,
                    restart: "no".into(),
                    log_opts: BTreeMap::new(),
                    labels: BTreeMap::from([
                        (labels::DEPLOYMENT.into(), c.deployment.name.clone()),
                        (labels::RANK.into(), rank.to_string()),
                        (labels::NODE.into(), node.name.clone()),
                    ]),
                }
            })
            .collect()
    }

    fn binaries(&self) -> Vec<String> {
        Vec::new()
    }

    fn memory(&self, _config: &ValidatedConfig) -> MemoryModel {
        self.limits().memory
    }

    fn plan_inputs(&self, _config: &ValidatedConfig) -> StepPlan {
        StepPlan {
            summary: "bash needs no inputs".into(),
            actions: Vec::new(),
            data: serde_json::Map::new(),
        }
    }

    async fn build_inputs(&self, _ctx: &Context) -> Result<Outcome, StepFailure> {
        Ok(Outcome::Skipped {
            reason: "bash needs no inputs".into(),
        })
    }

    async fn fetch_extras(
        &self,
        _ctx: &Context,
        _endpoint: Option<String>,
        _token: Option<HfToken>,
    ) -> Result<Option<u64>, StepFailure> {
        Ok(None)
    }

    fn plan_worker_inputs(
        &self,
        _config: &ValidatedConfig,
        _facts: &DeploymentFacts,
        _rank: usize,
    ) -> Vec<Transfer> {
        Vec::new()
    }

    async fn worker_jobs(
        &self,
        _ctx: &Context,
        _rank: usize,
    ) -> Result<Vec<FileJob>, Box<dyn std::error::Error + Send + Sync>> {
        Ok(Vec::new())
    }

    async fn fingerprint(
        &self,
        _ctx: &Context,
        specs: &[ContainerSpec],
    ) -> Result<String, FingerprintError> {
        let mut h = Sha256::new();
        for s in specs {
            h.update(s.image.as_bytes());
            h.update(s.argv.join("\0").as_bytes());
        }
        Ok(hex::encode(h.finalize()))
    }

    fn plan_smoke(&self, config: &ValidatedConfig, _api: &ApiEndpoint) -> Vec<Action> {
        vec![Action::with(
            &config.config().nodes[0].name,
            "every rank's log says it is ready; rank 0's says 17*23 = 391",
            ActionDetail::Outputs { files: Vec::new() },
        )]
    }

    async fn probe_ready(
        &self,
        ctx: &Context,
        _api: &ApiEndpoint,
    ) -> Result<Readiness, ProbeError> {
        let c = ctx.config().config();
        for (rank, node) in c.nodes.iter().enumerate() {
            let name = rank_container_name(&c.deployment.name, rank);
            let state =
                ctx.rank_state(rank, &name)
                    .await
                    .map_err(|e| ProbeError::DockerUnavailable {
                        node: node.name.clone(),
                        detail: e.to_string(),
                    })?;
            if !state.running {
                return Err(ProbeError::RankExited {
                    rank,
                    node: node.name.clone(),
                    tail: ctx.log_tail(rank, &name, 10).await,
                    container: name,
                    exit_code: state.exit_code,
                });
            }
            if !ctx.log_tail(rank, &name, 10).await.contains(READY) {
                return Ok(Readiness::Waiting(format!(
                    "rank {rank} has not said it is ready"
                )));
            }
        }
        Ok(Readiness::Ready)
    }

    async fn probe_generation(
        &self,
        ctx: &Context,
        _api: &ApiEndpoint,
    ) -> Result<String, ProbeError> {
        let c = ctx.config().config();
        let log = ctx
            .log_tail(0, &rank_container_name(&c.deployment.name, 0), 10)
            .await;
        log.lines()
            .find(|l| l.trim() == "17*23 = 391")
            .map(|l| format!("bash-pair rank 0: {}", l.trim()))
            .ok_or_else(|| ProbeError::Generation(format!("rank 0 printed {log:?}")))
    }

    fn serving_signals(&self) -> ServingSignals {
        ServingSignals {
            metrics_path: "",
            running_requests: "",
            generated_tokens: "",
            health_path: "",
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn testbed_a_second_engine_profile_runs_the_standard_plan() {
    on_testbed(|info, home| async move {
        let (hub, config) = spark_deploy_testbed::demo::prepare(&info, &home).await?;
        let v = validate(config, &home)?;
        let rec = Recorder::default();
        let ctx = Context::new(v.clone(), Arc::new(rec.clone()));
        let plan = Plan::standard_with_engine(&v, Arc::new(BashPair));
        let described = plan.describe();
        let launch = described
            .steps
            .iter()
            .find(|s| s.step == StepKind::LaunchRank)
            .ok_or("no LaunchRank in the plan")?;
        let text = serde_json::to_string(launch)?;
        assert!(
            text.contains("/usr/bin/bash") && !text.contains("tensorfold-native"),
            "{text}"
        );
        let report = plan.run(&ctx).await.map_err(|e| {
            format!(
                "{e}\n{:#?}",
                rec.events().iter().rev().take(10).collect::<Vec<_>>()
            )
        });
        let result: R<()> = async {
            let report = report?;
            let statuses: Vec<_> = report.steps.iter().map(|s| (s.step, s.status)).collect();
            assert!(
                statuses.iter().all(|(_, st)| *st != StepStatus::Failed) && statuses.len() == 7,
                "{statuses:?}"
            );
            let smoke_lines: Vec<String> = rec
                .events()
                .into_iter()
                .filter_map(|e| match e {
                    Event::Log {
                        source: Source::Step(StepKind::Smoke),
                        line,
                        ..
                    } => Some(line),
                    _ => None,
                })
                .collect();
            assert!(
                smoke_lines
                    .iter()
                    .any(|l| l == "bash-pair rank 0: 17*23 = 391"),
                "{smoke_lines:?}"
            );
            Ok(())
        }
        .await;
        // Both ranks stop whatever happened.
        let stop = Plan::teardown(&v)
            .run(&Context::new(v.clone(), Arc::new(Recorder::default())))
            .await;
        drop(hub);
        result?;
        stop.map_err(|e| e.failure.chain())?;
        Ok(())
    })
    .await;
}
