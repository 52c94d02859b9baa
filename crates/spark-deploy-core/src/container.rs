//! The exact container a rank runs in, as data: what `plan` prints and what the Docker port creates.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A bind mount or named volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mount {
    /// Host path on the node, or a volume name when `volume` is true.
    pub source: String,
    /// Path inside the container.
    pub target: String,
    /// Mounted read-only.
    pub read_only: bool,
    /// `source` names a Docker volume rather than a host path.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub volume: bool,
}

/// A resource limit (`--ulimit name=soft:hard`; -1 is unlimited).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ulimit {
    /// `memlock`, `stack`, ...
    pub name: String,
    /// Soft limit.
    pub soft: i64,
    /// Hard limit.
    pub hard: i64,
}

/// Everything needed to create one rank's container on its node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContainerSpec {
    /// Node the container runs on.
    pub node: String,
    /// Tensor-parallel rank.
    pub rank: Rank,
    /// Container name.
    pub name: String,
    /// Image reference.
    pub image: String,
    /// The full command line (entrypoint cleared): the engine binary and its arguments.
    pub argv: Vec<String>,
    /// Environment, sorted by name.
    pub env: BTreeMap<String, String>,
    /// Mounts.
    pub mounts: Vec<Mount>,
    /// `host` or `container:<name>` (a node that is itself a container, the testbed's Spark:
    /// the rank joins its network and process namespaces, so the node's restart ends the rank as
    /// a reboot would).
    pub network_mode: String,
    /// IPC namespace mode.
    pub ipc_mode: String,
    /// GPU device request (`--gpus all`).
    pub gpus: String,
    /// The container runtime (`--runtime`; `engine.runtime`).
    pub runtime: String,
    /// Host devices passed through.
    pub devices: Vec<String>,
    /// Resource limits.
    pub ulimits: Vec<Ulimit>,
    /// Added capabilities.
    pub cap_add: Vec<String>,
    /// OOM score adjustment: the kernel kills the rank, not a host daemon.
    pub oom_score_adj: i64,
    /// Restart policy.
    pub restart: String,
    /// json-file log options.
    pub log_opts: BTreeMap<String, String>,
    /// Labels naming deployment, rank and node.
    pub labels: BTreeMap<String, String>,
}

/// Label keys spark-deploy puts on what it creates.
pub mod labels {
    /// The deployment name.
    pub const DEPLOYMENT: &str = "io.spark-deploy.deployment";
    /// The rank number.
    pub const RANK: &str = "io.spark-deploy.rank";
    /// The node name.
    pub const NODE: &str = "io.spark-deploy.node";
    /// The cross-rank fingerprint (set at launch).
    pub const FINGERPRINT: &str = "io.spark-deploy.fingerprint";
    /// An engine image's content identity: sha256 of its engine commit, patch hashes, Dockerfile
    /// hash and base (set by BuildImage; images are compared by it, never by image ID).
    pub const CONTENT: &str = "io.spark-deploy.content";
    /// The engine commit an image was built for.
    pub const ENGINE_COMMIT: &str = "io.spark-deploy.engine-commit";
}

/// A tensor-parallel rank: the index of its node in `nodes` (0 = the head, serving the API). One
/// type everywhere a rank is named (specs, plans, errors, events, Python).
pub type Rank = usize;

/// The container name of `rank` in deployment `name` (`dsv41-rank0`).
#[must_use]
pub fn rank_container_name(name: &str, rank: Rank) -> String {
    format!("{name}-rank{rank}")
}
