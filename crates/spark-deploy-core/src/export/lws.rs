//! The `LeaderWorkerSet` resource (`leaderworkerset.x-k8s.io/v1`) as types, and the export of a
//! validated plan into one: rank 0 as the leader, ranks 1..N-1 as the workers, one group.
//!
//! The fields follow the LWS API (`LeaderWorkerSetSpec`, `LeaderWorkerTemplate`); only the ones
//! the export sets are modelled, with the API's enums as Rust enums and `size` as a non-zero
//! integer, so a manifest with an unknown policy or an empty group cannot be built. The pod
//! templates are `k8s-openapi`'s `PodTemplateSpec`.

use std::num::NonZeroU16;

use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

use super::pod::{PodInputs, Role};
use super::worker::{self, WorkerTemplate};
use super::{ExportError, yaml};
use crate::config::ValidatedConfig;
use crate::container::{ContainerSpec, labels};
use crate::engine::Engine;
use crate::facts::DeploymentFacts;
use crate::preflight::budget::RankBudget;

/// `apiVersion` of the resource.
pub const API_VERSION: &str = "leaderworkerset.x-k8s.io/v1";
/// `kind` of the resource.
pub const KIND: &str = "LeaderWorkerSet";

macro_rules! constant_string {
    ($name:ident, $value:expr, $doc:literal) => {
        #[doc = $doc]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
        pub struct $name;

        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str($value)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let v = String::deserialize(d)?;
                if v == $value {
                    Ok(Self)
                } else {
                    Err(serde::de::Error::custom(format!(
                        "expected {:?}, found {v:?}",
                        $value
                    )))
                }
            }
        }
    };
}

constant_string!(ApiVersion, API_VERSION, "`leaderworkerset.x-k8s.io/v1`.");
constant_string!(Kind, KIND, "`LeaderWorkerSet`.");

/// A `LeaderWorkerSet`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaderWorkerSet {
    /// Always `leaderworkerset.x-k8s.io/v1`.
    pub api_version: ApiVersion,
    /// Always `LeaderWorkerSet`.
    pub kind: Kind,
    /// Name, labels.
    pub metadata: ObjectMeta,
    /// The groups.
    pub spec: LeaderWorkerSetSpec,
}

/// `spec`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaderWorkerSetSpec {
    /// Number of groups (the API's default is 1).
    pub replicas: u16,
    /// When the workers are created.
    pub startup_policy: StartupPolicy,
    /// One group's pods.
    pub leader_worker_template: LeaderWorkerTemplate,
}

/// `spec.leaderWorkerTemplate`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaderWorkerTemplate {
    /// Pods per group, the leader included (at least 1).
    pub size: NonZeroU16,
    /// What a pod's restart does to its group.
    pub restart_policy: RestartPolicy,
    /// The leader's pod (index 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_template: Option<PodTemplateSpec>,
    /// Every worker's pod (indexes 1..size-1).
    pub worker_template: PodTemplateSpec,
}

/// `restartPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RestartPolicy {
    /// Any pod's or container's restart recreates every pod of the group.
    RecreateGroupOnPodRestart,
    /// Only the failed pod restarts.
    None,
}

/// `startupPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum StartupPolicy {
    /// Workers are created as soon as the leader pod is.
    LeaderCreated,
    /// Workers are created once the leader pod is ready.
    LeaderReady,
}

/// What the export needs beyond config and facts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LwsOptions {
    /// The engine image's `io.spark-deploy.content` label.
    pub image_content: String,
    /// Path of the `spark-deploy` binary on every node (the init containers' verifier).
    pub verifier: String,
    /// Extended resource the RDMA device plugin advertises (one per rank that needs
    /// `/dev/infiniband`).
    pub rdma_resource: String,
}

/// The default RDMA resource: the name the shared RDMA device plugin advertises by default.
pub const DEFAULT_RDMA_RESOURCE: &str = "rdma/rdma_shared_device_a";
/// The default path of the verifier on every node.
pub const DEFAULT_VERIFIER: &str = "/usr/local/bin/spark-deploy";

/// Node label naming the deployment a Spark serves.
pub const NODE_DEPLOYMENT_LABEL: &str = "spark-deploy.io/deployment";
/// Node label naming the rank a Spark runs.
pub const NODE_RANK_LABEL: &str = "spark-deploy.io/rank";
/// Pod annotation carrying the image's content label.
pub const CONTENT_ANNOTATION: &str = "spark-deploy.io/image-content";

/// The rank containers of `engine` for `config`, split into rank 0 and the followers (rank
/// order).
fn ranks(
    config: &ValidatedConfig,
    engine: &dyn Engine,
    facts: &DeploymentFacts,
) -> Result<(ContainerSpec, Vec<ContainerSpec>), ExportError> {
    let mut specs = engine.rank_containers(config, facts);
    specs.sort_by_key(|s| s.rank);
    if specs.first().map(|s| s.rank) != Some(0) {
        return Err(ExportError::Unsupported {
            rank: 0,
            node: config.config().nodes[0].name.clone(),
            what: format!("engine {} rendered no rank 0 container", engine.name()),
            remedy: "fix the engine profile's rank_containers".into(),
        });
    }
    let followers = specs.split_off(1);
    Ok((specs.remove(0), followers))
}

/// The group built from rank 0's container and the followers' (rank order); `facts` must be
/// resolved.
///
/// # Errors
///
/// [`ExportError::FollowersDiffer`] when one worker template cannot reproduce every follower,
/// [`ExportError::Unsupported`] for a container setting a pod cannot express,
/// [`ExportError::NoInputCheck`] when the engine cannot verify inputs in an init container.
pub fn from_specs(
    config: &ValidatedConfig,
    engine: &dyn Engine,
    facts: &DeploymentFacts,
    opts: &LwsOptions,
    leader: &ContainerSpec,
    followers: &[ContainerSpec],
) -> Result<LeaderWorkerSet, ExportError> {
    let c = config.config();
    let mem = engine.memory(config);
    let budget = RankBudget::of(&crate::preflight::budget::MemoryInputs {
        weights_per_rank: mem.rank_weights_estimate,
        context: c.serving.context,
        model: mem,
    })
    .total();
    let world = followers.len() + 1;
    let inputs = PodInputs {
        config,
        engine,
        facts,
        opts,
        memory_request: budget,
        world,
    };
    let (argv, env) = worker::literal(leader);
    let leader_template = inputs.template(Role::Leader, leader, argv, env)?;
    let worker_template = match followers.first() {
        Some(base) => {
            let t: WorkerTemplate = worker::derive(base, engine.follower_rank_slots().as_ref())?;
            worker::check_reproduces(&t, followers)?;
            inputs.template(Role::Worker, &t.base, t.argv.clone(), t.env.clone())?
        }
        // A group of one: the API still needs a worker template; LWS creates no worker pod.
        None => leader_template.clone(),
    };
    let size = u16::try_from(world)
        .ok()
        .and_then(NonZeroU16::new)
        .unwrap_or(NonZeroU16::MIN);
    Ok(LeaderWorkerSet {
        api_version: ApiVersion,
        kind: Kind,
        metadata: ObjectMeta {
            name: Some(c.deployment.name.clone()),
            labels: Some(std::collections::BTreeMap::from([(
                labels::DEPLOYMENT.to_owned(),
                c.deployment.name.clone(),
            )])),
            ..ObjectMeta::default()
        },
        spec: LeaderWorkerSetSpec {
            replicas: 1,
            startup_policy: StartupPolicy::LeaderCreated,
            leader_worker_template: LeaderWorkerTemplate {
                size,
                restart_policy: RestartPolicy::RecreateGroupOnPodRestart,
                leader_template: Some(leader_template),
                worker_template,
            },
        },
    })
}

/// The `LeaderWorkerSet` of `config` as `engine` runs it with `facts`.
///
/// # Errors
///
/// See [`from_specs`]; also [`ExportError::UnresolvedFacts`] while a fact is a placeholder.
pub fn leader_worker_set(
    config: &ValidatedConfig,
    engine: &dyn Engine,
    facts: &DeploymentFacts,
    opts: &LwsOptions,
) -> Result<LeaderWorkerSet, ExportError> {
    let pending = facts.unresolved(config);
    if !pending.is_empty() {
        return Err(ExportError::UnresolvedFacts { pending });
    }
    let (leader, followers) = ranks(config, engine, facts)?;
    from_specs(config, engine, facts, opts, &leader, &followers)
}

/// [`leader_worker_set`] as YAML with the comments that explain its choices.
///
/// # Errors
///
/// See [`leader_worker_set`]; [`ExportError::Yaml`].
pub fn lws_yaml(
    config: &ValidatedConfig,
    engine: &dyn Engine,
    facts: &DeploymentFacts,
    opts: &LwsOptions,
) -> Result<String, ExportError> {
    let lws = leader_worker_set(config, engine, facts, opts)?;
    render(config, &lws)
}

/// `lws` as commented YAML.
///
/// # Errors
///
/// [`ExportError::Yaml`].
pub fn render(config: &ValidatedConfig, lws: &LeaderWorkerSet) -> Result<String, ExportError> {
    let c = config.config();
    let text = yaml::to_string("LeaderWorkerSet", lws)?;
    let size = lws.spec.leader_worker_template.size.get();
    let ranks: Vec<String> = c
        .nodes
        .iter()
        .enumerate()
        .map(|(r, n)| format!("{} -> {NODE_RANK_LABEL}={r}", n.name))
        .collect();
    let secret = super::pod::api_key_secret(config);
    let workers = match size {
        1 => "no worker".to_owned(),
        2 => "rank 1 the worker".to_owned(),
        n => format!("ranks 1..{} the workers", n - 1),
    };
    let header = format!(
        "LeaderWorkerSet {name}: the validated spark-deploy plan as one group of {size} pods, rank 0 \
         the leader, {workers}. Rendered by `spark-deploy export lws`; see \
         docs/outgrowing-the-pair.md for what the cluster must provide. Before applying, label \
         each Spark ({ranks}, and {NODE_DEPLOYMENT_LABEL}={name} on each) and create the API key \
         Secret:\n\
         $ kubectl create secret generic {secret} --from-file=api-key={keyfile}",
        name = c.deployment.name,
        ranks = ranks.join(", "),
        keyfile = c.serving.api_key_file,
    );
    let pinning = if size > 2 {
        "Each rank on its Spark: the leader only on the node labelled rank 0; the workers on the \
         nodes labelled 1..N-1, one pod per node. With more than one worker, Kubernetes cannot \
         bind worker index i to the node labelled i from one template: a worker on the wrong \
         Spark fails its input check (that rank's file is not there) and the group is recreated."
    } else {
        "Each rank on its Spark: the leader only on the node labelled rank 0, the worker only on \
         the node labelled rank 1, never two ranks on one node."
    };
    Ok(yaml::with_comments(
        &text,
        &header,
        &[
            (
                "startupPolicy:",
                "LeaderCreated: the workers start with the leader. LeaderReady would deadlock: \
                 rank 0 becomes ready only after every follower has joined its rendezvous, so \
                 workers waiting for a ready leader would never be created.",
            ),
            (
                "restartPolicy: RecreateGroupOnPodRestart",
                "All ranks or none: no rank can rejoin a running group (a restarted follower \
                 finds rank 0's listener closed; a restarted rank 0 waits for followers that \
                 are not coming), so any restart recreates the whole group.",
            ),
            ("affinity:", pinning),
            (
                "command:",
                "The rank's exact argv (as `spark-deploy plan` shows it). A pod has no ulimits: \
                 the shell sets the stack limit the rank had under Docker, then execs the argv \
                 (memlock: the IPC_LOCK capability below lifts the locked-memory limit).",
            ),
            (
                "readinessProbe:",
                "Ready = one token generated through rank 0, which needs every rank; /health \
                 stays ok after a follower died. The key is read from the Secret's file, never \
                 put on a command line. Needs curl in the engine image.",
            ),
            (
                "resources:",
                "requests.memory = the per-rank memory budget preflight checks (weights, \
                 arena, KV, RoPE, reserve). No memory limit: on GB10's unified memory the GPU's \
                 allocations are host pages of the same cgroup, and a limit would kill the rank.",
            ),
            (
                "hostNetwork:",
                "The ranks rendezvous over the Sparks' fabric addresses (rank 0's fabric IPv4 \
                 is in every rank's argv or environment), so every pod uses its host's network.",
            ),
            (
                "initContainers:",
                "No rank starts on an unverified cache: spark-deploy (the node's own binary, \
                 mounted read-only) verifies this rank's inputs first.",
            ),
            (
                "annotations:",
                "The image by content: Kubernetes knows an image by its reference, spark-deploy \
                 by the io.spark-deploy.content label BuildImage puts on it (sha256 of base, \
                 engine commit, Dockerfile, patches, engine binaries). The annotation records the content the \
                 reference must hold (docker image inspect shows the label) and, being part of \
                 the pod template, changes the template's revision when the content changes, so \
                 LWS replaces the whole group even when the tag stays the same.",
            ),
        ],
    ))
}
