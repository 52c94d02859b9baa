//! One rank's container as a Kubernetes pod template (`k8s-openapi` types): the same image,
//! argv, environment and inputs, on its own Spark, with the cluster's equivalents of Docker's
//! settings (host network and IPC, device plugins for the GPU and RDMA, IPC_LOCK, a Secret for
//! the API key, hostPath or NFS volumes for the staged inputs).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, Container, EnvVar, ExecAction, HostPathVolumeSource, KeyToPath,
    NFSVolumeSource, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    PodAffinityTerm, PodAntiAffinity, PodSpec, PodTemplateSpec, Probe, ResourceRequirements,
    SecretVolumeSource, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

use super::ExportError;
use super::lws::{CONTENT_ANNOTATION, LwsOptions, NODE_DEPLOYMENT_LABEL, NODE_RANK_LABEL};
use super::worker::{escape, index_ref};
use crate::config::{ValidatedConfig, WorkerStorage};
use crate::container::{ContainerSpec, Mount, labels};
use crate::engine::Engine;
use crate::facts::DeploymentFacts;
use crate::layout::NodeLayout;

/// Which pod of the group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    /// Index 0: rank 0.
    Leader,
    /// Indexes 1..N-1: the followers.
    Worker,
}

/// Everything a pod template is rendered from besides the rank's container.
pub(super) struct PodInputs<'a> {
    pub config: &'a ValidatedConfig,
    pub engine: &'a dyn Engine,
    pub facts: &'a DeploymentFacts,
    pub opts: &'a LwsOptions,
    /// Bytes the rank needs (the preflight budget).
    pub memory_request: u64,
    /// Ranks in the group.
    pub world: usize,
}

/// The Secret holding the API key (key `api-key`).
pub(super) fn api_key_secret(config: &ValidatedConfig) -> String {
    format!("{}-api-key", config.config().deployment.name)
}

/// Key of the API key inside its Secret.
const API_KEY_ITEM: &str = "api-key";
/// The engine's container name in both templates.
const ENGINE_CONTAINER: &str = "engine";
/// Where the node's spark-deploy binary appears in the init container.
const VERIFIER_PATH: &str = "/opt/spark-deploy/bin/spark-deploy";
/// Label LWS puts on every pod of a set, naming the set.
const LWS_NAME_LABEL: &str = "leaderworkerset.sigs.k8s.io/name";
/// GPU resource of the NVIDIA device plugin.
const GPU_RESOURCE: &str = "nvidia.com/gpu";
/// The device a rank with RoCE gets; the RDMA device plugin provides it in a pod.
const INFINIBAND: &str = "/dev/infiniband";

/// A DNS-label volume name for a mount target (`/cache/rank-cache` → `cache-rank-cache`).
fn volume_name(target: &str) -> String {
    let name: String = target
        .trim_matches('/')
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    let name = name.trim_matches('-');
    let name: String = name.chars().take(63).collect();
    if name.is_empty() {
        "root".to_owned()
    } else {
        name.trim_end_matches('-').to_owned()
    }
}

/// `shell` quoting: one single-quoted word.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

impl PodInputs<'_> {
    fn unsupported(&self, spec: &ContainerSpec, what: String, remedy: &str) -> ExportError {
        ExportError::Unsupported {
            rank: spec.rank,
            node: spec.node.clone(),
            what,
            remedy: remedy.to_owned(),
        }
    }

    /// The NFS source of the head's cache as the worker mounts it (the same server and path the
    /// Docker volume of `nfs` mode uses).
    fn nfs_source(&self) -> NFSVolumeSource {
        let c = self.config.config();
        let server = crate::layout::nfs_server(self.config, &self.facts.nodes[0].fabric_addr);
        let path = if c.storage.nfs_path.is_empty() {
            NodeLayout::of(self.config, &c.nodes[0]).hf_cache
        } else {
            c.storage.nfs_path.clone()
        };
        NFSVolumeSource {
            server,
            path,
            read_only: Some(true),
        }
    }

    /// One volume and its mount for `m`.
    fn volume(
        &self,
        spec: &ContainerSpec,
        m: &Mount,
    ) -> Result<(Volume, VolumeMount), ExportError> {
        let c = self.config.config();
        let name = volume_name(&m.target);
        let mut mount = VolumeMount {
            name: name.clone(),
            mount_path: m.target.clone(),
            read_only: Some(m.read_only),
            ..VolumeMount::default()
        };
        let mut volume = Volume {
            name,
            ..Volume::default()
        };
        if !m.volume && m.source == c.serving.api_key_file {
            mount.sub_path = Some(API_KEY_ITEM.to_owned());
            volume.secret = Some(SecretVolumeSource {
                secret_name: Some(api_key_secret(self.config)),
                items: Some(vec![KeyToPath {
                    key: API_KEY_ITEM.to_owned(),
                    path: API_KEY_ITEM.to_owned(),
                    mode: Some(0o400),
                }]),
                ..SecretVolumeSource::default()
            });
        } else if m.volume {
            if c.deployment.worker_storage != WorkerStorage::Nfs || m.source != c.storage.nfs_volume
            {
                return Err(self.unsupported(
                    spec,
                    format!("the Docker volume {}", m.source),
                    "only the NFS volume of deployment.worker_storage = \"nfs\" maps to a pod volume",
                ));
            }
            volume.nfs = Some(self.nfs_source());
        } else {
            volume.host_path = Some(HostPathVolumeSource {
                path: m.source.clone(),
                type_: Some("Directory".to_owned()),
            });
        }
        Ok((volume, mount))
    }

    /// The entry command: argv as is, behind a shell that sets the ulimits Docker set.
    fn command(&self, spec: &ContainerSpec, argv: Vec<String>) -> Result<Vec<String>, ExportError> {
        let mut limits = Vec::new();
        for u in &spec.ulimits {
            let value = |v: i64, scale: i64| {
                if v < 0 {
                    "unlimited".to_owned()
                } else {
                    (v / scale).to_string()
                }
            };
            match u.name.as_str() {
                "memlock" if spec.cap_add.iter().any(|c| c == "IPC_LOCK") => {}
                "stack" => limits.push(format!("ulimit -s {}", value(u.soft, 1024))),
                "nofile" => limits.push(format!("ulimit -n {}", value(u.soft, 1))),
                other => {
                    return Err(self.unsupported(
                        spec,
                        format!("the {other} ulimit"),
                        "set it in the container runtime's defaults, or remove it from the engine profile",
                    ));
                }
            }
        }
        if limits.is_empty() {
            return Ok(argv);
        }
        let script = format!("{} && exec \"$0\" \"$@\"", limits.join(" && "));
        Ok(["/bin/sh".to_owned(), "-c".to_owned(), escape(&script)]
            .into_iter()
            .chain(argv)
            .collect())
    }

    /// Requests (memory budget) and limits (GPU, RDMA) of a rank.
    fn resources(&self, spec: &ContainerSpec) -> Result<ResourceRequirements, ExportError> {
        let mib = self.memory_request.div_ceil(1 << 20);
        let mut limits = BTreeMap::new();
        match spec.gpus.as_str() {
            "all" => {
                limits.insert(GPU_RESOURCE.to_owned(), Quantity("1".to_owned()));
            }
            "none" | "" => {}
            other => {
                return Err(self.unsupported(
                    spec,
                    format!("the GPU request {other:?}"),
                    "request \"all\" (one GB10 per Spark) or none",
                ));
            }
        }
        for d in &spec.devices {
            if d == INFINIBAND {
                limits.insert(self.opts.rdma_resource.clone(), Quantity("1".to_owned()));
            } else {
                return Err(self.unsupported(
                    spec,
                    format!("the device {d}"),
                    "expose it through a device plugin and remove it from the container",
                ));
            }
        }
        Ok(ResourceRequirements {
            requests: Some(BTreeMap::from([(
                "memory".to_owned(),
                Quantity(format!("{mib}Mi")),
            )])),
            limits: (!limits.is_empty()).then_some(limits),
            ..ResourceRequirements::default()
        })
    }

    /// Rank 0's readiness: one token generated through the OpenAI-compatible API.
    fn generation_probe(&self, spec: &ContainerSpec) -> Probe {
        let c = self.config.config();
        let s = &c.serving;
        let host = match s.host.as_str() {
            "0.0.0.0" | "::" | "" => "127.0.0.1",
            h => h,
        };
        let body = serde_json::json!({
            "model": c.model.served_name,
            "messages": [{"role": "user", "content": "Say OK."}],
            "max_tokens": 1,
            "temperature": 0,
        });
        let curl = format!(
            "curl -sfS --max-time 50 -H 'Content-Type: application/json' --data-binary {} http://{host}:{}/v1/chat/completions | grep -q '\"choices\"'",
            sh_quote(&body.to_string()),
            s.port
        );
        let key_file = spec
            .mounts
            .iter()
            .find(|m| !m.volume && m.source == s.api_key_file)
            .map(|m| m.target.clone());
        let script = match key_file {
            // printf is a shell builtin: the key never appears in any process's argv.
            Some(f) => format!(
                "printf 'header = \"Authorization: Bearer %s\"\\n' \"$(cat {})\" | {}",
                sh_quote(&f),
                curl.replacen("curl -sfS", "curl -sfS -K -", 1)
            ),
            None => curl,
        };
        Probe {
            exec: Some(ExecAction {
                command: Some(vec!["/bin/sh".into(), "-c".into(), script]),
            }),
            period_seconds: Some(30),
            timeout_seconds: Some(60),
            failure_threshold: Some(3),
            ..Probe::default()
        }
    }

    /// The init container verifying the rank's inputs with spark-deploy itself.
    fn verify_container(
        &self,
        spec: &ContainerSpec,
        rank: &str,
        mounts: &[VolumeMount],
    ) -> Result<(Container, Volume), ExportError> {
        let args = self
            .engine
            .verify_inputs_command(self.config, self.facts, rank)
            .ok_or_else(|| ExportError::NoInputCheck {
                engine: self.engine.name().to_owned(),
            })?;
        let reference = index_ref();
        let command = std::iter::once(VERIFIER_PATH.to_owned())
            .chain(args.iter().map(|a| {
                if *a == reference {
                    a.clone()
                } else {
                    escape(a)
                }
            }))
            .collect();
        let volume = Volume {
            name: "spark-deploy-bin".into(),
            host_path: Some(HostPathVolumeSource {
                path: self.opts.verifier.clone(),
                type_: Some("File".into()),
            }),
            ..Volume::default()
        };
        let mut mounts: Vec<VolumeMount> = mounts
            .iter()
            .filter(|m| m.sub_path.is_none())
            .cloned()
            .collect();
        mounts.push(VolumeMount {
            name: volume.name.clone(),
            mount_path: VERIFIER_PATH.into(),
            read_only: Some(true),
            ..VolumeMount::default()
        });
        let container = Container {
            name: "verify-inputs".into(),
            image: Some(spec.image.clone()),
            image_pull_policy: Some("IfNotPresent".into()),
            command: Some(command),
            volume_mounts: Some(mounts),
            ..Container::default()
        };
        Ok((container, volume))
    }

    fn affinity(&self, role: Role) -> Affinity {
        let c = self.config.config();
        let ranks = match role {
            Role::Leader => vec!["0".to_owned()],
            Role::Worker => (1..self.world).map(|r| r.to_string()).collect(),
        };
        let requirement = |key: &str, values: Vec<String>| NodeSelectorRequirement {
            key: key.to_owned(),
            operator: "In".to_owned(),
            values: Some(values),
        };
        Affinity {
            node_affinity: Some(NodeAffinity {
                required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_expressions: Some(vec![
                            requirement(NODE_DEPLOYMENT_LABEL, vec![c.deployment.name.clone()]),
                            requirement(NODE_RANK_LABEL, ranks),
                        ]),
                        ..NodeSelectorTerm::default()
                    }],
                }),
                ..NodeAffinity::default()
            }),
            pod_anti_affinity: Some(PodAntiAffinity {
                required_during_scheduling_ignored_during_execution: Some(vec![PodAffinityTerm {
                    label_selector: Some(LabelSelector {
                        match_labels: Some(BTreeMap::from([(
                            LWS_NAME_LABEL.to_owned(),
                            c.deployment.name.clone(),
                        )])),
                        ..LabelSelector::default()
                    }),
                    topology_key: "kubernetes.io/hostname".to_owned(),
                    ..PodAffinityTerm::default()
                }]),
                ..PodAntiAffinity::default()
            }),
            ..Affinity::default()
        }
    }

    /// The pod template of `role` running `spec` with `argv` and `env` (already in
    /// Kubernetes' form: escaped, the worker's rank a reference to its index).
    pub(super) fn template(
        &self,
        role: Role,
        spec: &ContainerSpec,
        argv: Vec<String>,
        env: BTreeMap<String, String>,
    ) -> Result<PodTemplateSpec, ExportError> {
        let c = self.config.config();
        if spec.network_mode != "host" {
            return Err(self.unsupported(
                spec,
                format!("network mode {:?}", spec.network_mode),
                "set nodes[].network_mode = \"host\" (the default) for a cluster",
            ));
        }
        let mut volumes = Vec::new();
        let mut mounts = Vec::new();
        for m in &spec.mounts {
            let (v, vm) = self.volume(spec, m)?;
            volumes.push(v);
            mounts.push(vm);
        }
        let rank = match role {
            Role::Leader => "0".to_owned(),
            Role::Worker => index_ref(),
        };
        let (init, bin) = self.verify_container(spec, &rank, &mounts)?;
        volumes.push(bin);
        let container = Container {
            name: ENGINE_CONTAINER.into(),
            image: Some(spec.image.clone()),
            image_pull_policy: Some("IfNotPresent".into()),
            command: Some(self.command(spec, argv)?),
            env: Some(
                env.into_iter()
                    .map(|(name, value)| EnvVar {
                        name,
                        value: Some(value),
                        ..EnvVar::default()
                    })
                    .collect(),
            ),
            resources: Some(self.resources(spec)?),
            security_context: (!spec.cap_add.is_empty()).then(|| SecurityContext {
                capabilities: Some(Capabilities {
                    add: Some(spec.cap_add.clone()),
                    ..Capabilities::default()
                }),
                ..SecurityContext::default()
            }),
            readiness_probe: (role == Role::Leader).then(|| self.generation_probe(spec)),
            volume_mounts: Some(mounts),
            ..Container::default()
        };
        let mut pod_labels =
            BTreeMap::from([(labels::DEPLOYMENT.to_owned(), c.deployment.name.clone())]);
        if role == Role::Leader {
            pod_labels.insert(labels::RANK.to_owned(), "0".to_owned());
        }
        Ok(PodTemplateSpec {
            metadata: Some(ObjectMeta {
                labels: Some(pod_labels),
                annotations: Some(BTreeMap::from([(
                    CONTENT_ANNOTATION.to_owned(),
                    self.opts.image_content.clone(),
                )])),
                ..ObjectMeta::default()
            }),
            spec: Some(PodSpec {
                affinity: Some(self.affinity(role)),
                containers: vec![container],
                init_containers: Some(vec![init]),
                host_network: Some(true),
                dns_policy: Some("ClusterFirstWithHostNet".into()),
                host_ipc: Some(spec.ipc_mode == "host"),
                // No service variables in the rank's environment: it must be exactly the plan's.
                enable_service_links: Some(false),
                termination_grace_period_seconds: i64::try_from(c.lifecycle.stop_timeout_s).ok(),
                volumes: Some(volumes),
                ..PodSpec::default()
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volume_names_are_dns_labels() {
        assert_eq!(volume_name("/cache/rank-cache"), "cache-rank-cache");
        assert_eq!(
            volume_name("/run/spark-deploy/api-key"),
            "run-spark-deploy-api-key"
        );
        assert_eq!(volume_name("/HF_x"), "hf-x");
        assert_eq!(volume_name("/"), "root");
        assert!(volume_name(&format!("/{}", "a".repeat(80))).len() <= 63);
    }

    #[test]
    fn shell_quoting_survives_quotes() {
        assert_eq!(sh_quote("it's"), r"'it'\''s'");
    }
}
