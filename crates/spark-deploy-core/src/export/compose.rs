//! One compose file per node reproducing that node's rank container exactly (image, argv,
//! environment, mounts, network, IPC, GPU, devices, ulimits, capabilities, OOM score, logging,
//! labels): for owners who want to see or run the containers by hand. Not group-safe: compose
//! knows one node, so nothing stops the other ranks when one dies.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{ExportError, yaml};
use crate::config::ValidatedConfig;
use crate::container::ContainerSpec;
use crate::engine::Engine;
use crate::facts::DeploymentFacts;

/// A compose file.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Compose {
    /// The rank's service.
    pub services: BTreeMap<String, Service>,
    /// Named volumes the service uses (created by spark-deploy, so external).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub volumes: BTreeMap<String, ExternalVolume>,
}

/// A volume compose must not create.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ExternalVolume {
    /// Always true.
    pub external: bool,
    /// The Docker volume's name.
    pub name: String,
}

/// One rank's service.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Service {
    /// Image reference.
    pub image: String,
    /// Container name (as spark-deploy names it).
    pub container_name: String,
    /// Empty: the image's entrypoint is cleared, the argv is the whole command.
    pub entrypoint: Vec<String>,
    /// The rank's argv.
    pub command: Vec<String>,
    /// Environment.
    pub environment: BTreeMap<String, String>,
    /// Mounts.
    pub volumes: Vec<ServiceVolume>,
    /// `host` or `container:<name>`.
    pub network_mode: String,
    /// IPC namespace.
    pub ipc: String,
    /// Host devices.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<String>,
    /// Resource limits.
    pub ulimits: BTreeMap<String, UlimitValue>,
    /// Added capabilities.
    pub cap_add: Vec<String>,
    /// OOM score adjustment.
    pub oom_score_adj: i64,
    /// Restart policy.
    pub restart: String,
    /// Log driver and options.
    pub logging: Logging,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// GPU reservation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deploy: Option<Deploy>,
}

/// A mount in compose's long syntax.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ServiceVolume {
    /// `bind` or `volume`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Host path or volume name.
    pub source: String,
    /// Path in the container.
    pub target: String,
    /// Read-only.
    pub read_only: bool,
}

/// `soft`/`hard`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct UlimitValue {
    /// Soft limit.
    pub soft: i64,
    /// Hard limit.
    pub hard: i64,
}

/// `logging`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Logging {
    /// Always `json-file`.
    pub driver: String,
    /// Its options.
    pub options: BTreeMap<String, String>,
}

/// `deploy.resources.reservations.devices` for the GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Deploy {
    /// Resources.
    pub resources: Resources,
}

/// `resources`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Resources {
    /// Reservations.
    pub reservations: Reservations,
}

/// `reservations`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Reservations {
    /// Devices.
    pub devices: Vec<DeviceRequest>,
}

/// One device request (`--gpus all`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceRequest {
    /// `nvidia`.
    pub driver: String,
    /// `all`.
    pub count: String,
    /// `[gpu]`.
    pub capabilities: Vec<String>,
}

/// One node's compose file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComposeFile {
    /// Node name.
    pub node: String,
    /// Rank on it.
    pub rank: usize,
    /// Suggested file name (`<node>.compose.yaml`).
    pub file_name: String,
    /// The file's text.
    pub yaml: String,
}

/// Compose interpolates `$`: a literal is written `$$`.
fn lit(s: &str) -> String {
    s.replace('$', "$$")
}

/// The compose file of one rank's container.
#[must_use]
pub fn compose_of(spec: &ContainerSpec) -> Compose {
    let mut volumes = BTreeMap::new();
    let mounts = spec
        .mounts
        .iter()
        .map(|m| {
            if m.volume {
                volumes.insert(
                    m.source.clone(),
                    ExternalVolume {
                        external: true,
                        name: m.source.clone(),
                    },
                );
            }
            ServiceVolume {
                kind: if m.volume { "volume" } else { "bind" }.to_owned(),
                source: lit(&m.source),
                target: m.target.clone(),
                read_only: m.read_only,
            }
        })
        .collect();
    let service = Service {
        image: spec.image.clone(),
        container_name: spec.name.clone(),
        entrypoint: Vec::new(),
        command: spec.argv.iter().map(|a| lit(a)).collect(),
        environment: spec.env.iter().map(|(k, v)| (k.clone(), lit(v))).collect(),
        volumes: mounts,
        network_mode: spec.network_mode.clone(),
        ipc: spec.ipc_mode.clone(),
        devices: spec.devices.clone(),
        ulimits: spec
            .ulimits
            .iter()
            .map(|u| {
                (
                    u.name.clone(),
                    UlimitValue {
                        soft: u.soft,
                        hard: u.hard,
                    },
                )
            })
            .collect(),
        cap_add: spec.cap_add.clone(),
        oom_score_adj: spec.oom_score_adj,
        restart: spec.restart.clone(),
        logging: Logging {
            driver: "json-file".into(),
            options: spec.log_opts.clone(),
        },
        labels: spec
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), lit(v)))
            .collect(),
        deploy: (spec.gpus == "all").then(|| Deploy {
            resources: Resources {
                reservations: Reservations {
                    devices: vec![DeviceRequest {
                        driver: "nvidia".into(),
                        count: "all".into(),
                        capabilities: vec!["gpu".into()],
                    }],
                },
            },
        }),
    };
    Compose {
        services: BTreeMap::from([(format!("rank{}", spec.rank), service)]),
        volumes,
    }
}

/// Every node's compose file, in start order (followers first, rank 0 last).
///
/// # Errors
///
/// [`ExportError::UnresolvedFacts`] while a fact is a placeholder; [`ExportError::Yaml`].
pub fn compose_files(
    config: &ValidatedConfig,
    engine: &dyn Engine,
    facts: &DeploymentFacts,
) -> Result<Vec<ComposeFile>, ExportError> {
    let pending = facts.unresolved(config);
    if !pending.is_empty() {
        return Err(ExportError::UnresolvedFacts { pending });
    }
    let c = config.config();
    let world = c.nodes.len();
    engine
        .rank_containers(config, facts)
        .iter()
        .map(|spec| {
            let file_name = format!("{}.compose.yaml", spec.node);
            let text = yaml::to_string("compose file", &compose_of(spec))?;
            let header = format!(
                "NOT GROUP-SAFE. Rank {rank} of {world} on {node}, exactly as spark-deploy \
                 starts it. Compose knows this node only: when any rank dies nothing stops the \
                 others, and a rank cannot rejoin a running group. Start the followers first and \
                 rank 0 last, stop rank 0 first, and restart all ranks together. \
                 `spark-deploy up` does all of that and checks the ranks' inputs and settings \
                 match; use this file to read or reproduce one container by hand:\n\
                 $ docker compose -p {deployment}-{node} -f {file} up -d",
                rank = spec.rank,
                node = spec.node,
                deployment = c.deployment.name,
                file = file_name,
            );
            Ok(ComposeFile {
                node: spec.node.clone(),
                rank: spec.rank,
                file_name,
                yaml: yaml::with_comments(&text, &header, &[]),
            })
        })
        .collect()
}
