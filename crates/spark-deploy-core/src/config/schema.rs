//! The TOML schema of a deployment: plain serde types with the seed deployment's defaults.
//!
//! Unknown keys are refused (`deny_unknown_fields`); values are checked by
//! [`super::validate()`]. Secrets are never read from the file: they come from the environment
//! (`HF_TOKEN`, `SPARK_DEPLOY_API_KEY`) or from files the config points at.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};

use crate::secret::Secret;

/// The default model: the seed deployment's EXL3 checkpoint.
pub const DEFAULT_MODEL_ID: &str = "Mia-AiLab/DeepSeek-V4.1-Flash-1017-EXL3-EAQ-v1-2.9-bpw";
/// The served model name of the seed deployment.
pub const DEFAULT_SERVED_NAME: &str = "DeepSeek-V4.1-Flash-1017";
/// The repository holding the Engram tables and `bias_vl` tensors (the original model).
pub const DEFAULT_ENGRAM_REPO: &str = "deepseek-ai/DeepSeek-V4.1-Flash";
/// The pinned revision of the original model (the Engram tables and `bias_vl` tensors come from
/// it).
pub const DEFAULT_ENGRAM_REVISION: &str = "dba1be0a40aa45a94ad051997016db3960a90277";
/// The repository publishing the TP=2 kernel kit (folder `kit/`).
pub const DEFAULT_KIT_REPO: &str = "bertholomus/DeepSeek-V4.1-Flash-TensorFold-TP2-2xGB10";
/// The gated abliterated overlay.
pub const DEFAULT_ABLIT_ID: &str = "drowzeys/keys-DeepSeek-V4.1-Flash-1017-Abliterated";
/// The container image the kit was qualified in.
pub const DEFAULT_IMAGE: &str = "nvcr.io/nvidia/pytorch:26.07-py3";
/// Default tag of the image BuildImage makes from [`DEFAULT_IMAGE`].
pub const DEFAULT_ENGINE_IMAGE: &str = "spark-deploy/tensorfold-dsv41:local";

/// A whole deployment: what to serve, how, and on which nodes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DeploymentConfig {
    /// Name, engine profile and storage mode.
    pub deployment: DeploymentSection,
    /// The checkpoint and its companions on the Hub.
    pub model: ModelSection,
    /// Hub endpoint, caches and token.
    pub hub: HubSection,
    /// The API and the engine's serving flags.
    pub serving: ServingSection,
    /// Engine image, rendezvous and switches.
    pub engine: EngineSection,
    /// Worker storage (NFS volume) settings.
    pub storage: StorageSection,
    /// Memory, logs, timeouts and the prepare policy.
    pub lifecycle: LifecycleSection,
    /// What `spark-deploy watch` samples, when it acts and how.
    pub watch: WatchSection,
    /// The nodes, head first; one tensor-parallel rank per node.
    pub nodes: Vec<NodeConfig>,
}

impl DeploymentConfig {
    /// Every secret the configuration holds: the HF token, the API key and credentials embedded
    /// in `hub.endpoint` (`https://user:pass@host`); what event sinks, logs and bundles redact.
    #[must_use]
    pub fn secrets(&self) -> Vec<Secret> {
        self.hub
            .token
            .iter()
            .chain(self.serving.api_key.iter())
            .cloned()
            .chain(crate::secret::url_credentials(&self.hub.endpoint))
            .collect()
    }
}

impl Default for DeploymentConfig {
    fn default() -> Self {
        Self {
            deployment: DeploymentSection::default(),
            model: ModelSection::default(),
            hub: HubSection::default(),
            serving: ServingSection::default(),
            engine: EngineSection::default(),
            storage: StorageSection::default(),
            lifecycle: LifecycleSection::default(),
            watch: WatchSection::default(),
            nodes: vec![
                NodeConfig::head(),
                NodeConfig::worker("worker-1", "spark-2"),
            ],
        }
    }
}

/// `[deployment]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DeploymentSection {
    /// Deployment name: container names and labels derive from it (`[a-z0-9-]`, 1–40 chars).
    pub name: String,
    /// Engine profile.
    pub engine: EngineProfileName,
    /// How rank 1 gets the checkpoint: `nfs` (head's cache over a read-only NFS volume) or `copy`.
    pub worker_storage: WorkerStorage,
    /// Local state: lock, API key, recorded revisions (`~` is the head's home).
    pub state_dir: String,
}

impl Default for DeploymentSection {
    fn default() -> Self {
        Self {
            name: "dsv41".into(),
            engine: EngineProfileName::TensorfoldDsv41,
            worker_storage: WorkerStorage::Nfs,
            state_dir: "~/.local/state/spark-deploy".into(),
        }
    }
}

/// Engine profiles spark-deploy knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EngineProfileName {
    /// TensorFold's native Zig `dsv41` engine, TP=2 (docs/engine-contract.md).
    #[serde(rename = "tensorfold-dsv41")]
    TensorfoldDsv41,
    /// The same engine from its TP=4 branch: two or four nodes (docs/engine-contract.md, the TP=4
    /// notes).
    #[serde(rename = "tensorfold-dsv41-tp4")]
    TensorfoldDsv41Tp4,
}

impl EngineProfileName {
    /// The name as the configuration writes it.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::TensorfoldDsv41 => "tensorfold-dsv41",
            Self::TensorfoldDsv41Tp4 => "tensorfold-dsv41-tp4",
        }
    }
}

/// Worker storage mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkerStorage {
    /// The head's HF cache mounted read-only on the worker through a Docker NFS volume.
    Nfs,
    /// Exactly the required files copied to the worker's local cache over the fabric.
    Copy,
    /// A tree already on the worker (`storage.worker_tree`: its own copy of the HF cache, or a
    /// filesystem it mounts itself) bind-mounted read-only as the worker's HF cache; nothing of
    /// the checkpoint is copied (the recipe's `NFS_VOLUME=<absolute path>`).
    Local,
}

/// Whether the API asks for a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ApiAuth {
    /// No key: anyone who reaches the port may call the API.
    None,
    /// Every request carries the key of `serving.api_key_file` as a bearer token.
    Key,
}

/// `[model]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelSection {
    /// HF repo of the EXL3 checkpoint (`MODEL_ID`).
    pub id: String,
    /// Pinned revision: a 40-hex commit; a branch is resolved once at fetch and recorded (`MODEL_REVISION`).
    pub revision: String,
    /// Served model id (`--name`).
    pub served_name: String,
    /// Original model repo holding the Engram tables and `bias_vl` tensors.
    pub engram_repo: String,
    /// Pinned revision of the original model.
    pub engram_revision: String,
    /// Engram source shards in the original model.
    pub engram_files: Vec<String>,
    /// Hub repo publishing the kernel kit (folder `kit/`).
    pub kit_repo: String,
    /// Revision of the kit repo.
    pub kit_revision: String,
    /// Serve the gated abliterated overlay (`ABLIT`).
    pub ablit: bool,
    /// Overlay repo (`ABLIT_ID`).
    pub ablit_id: String,
    /// Overlay revision (`ABLIT_REVISION`).
    pub ablit_revision: String,
}

impl Default for ModelSection {
    fn default() -> Self {
        Self {
            id: DEFAULT_MODEL_ID.into(),
            revision: "main".into(),
            served_name: DEFAULT_SERVED_NAME.into(),
            engram_repo: DEFAULT_ENGRAM_REPO.into(),
            engram_revision: DEFAULT_ENGRAM_REVISION.into(),
            engram_files: vec![
                "model-00047-of-00048.safetensors".into(),
                "model-00048-of-00048.safetensors".into(),
            ],
            kit_repo: DEFAULT_KIT_REPO.into(),
            kit_revision: "main".into(),
            ablit: false,
            ablit_id: DEFAULT_ABLIT_ID.into(),
            ablit_revision: "main".into(),
        }
    }
}

/// `[hub]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HubSection {
    /// HF-compatible endpoint, an `http(s)://` URL (credentials in it are redacted as secrets);
    /// empty means the Hugging Face Hub (`HF_ENDPOINT`).
    pub endpoint: String,
    /// Head's HF cache root, `HF_HOME`-style (the hub cache is its `hub/`); empty = as
    /// `huggingface_hub` (see [`super::hf_env`] for the variables that set it).
    pub cache: String,
    /// Separate cache for the ABLIT overlay, so genuine and abliterated data never mix.
    pub ablit_cache: String,
    /// File holding the HF token (as written by `hf auth login`); empty = as `huggingface_hub`
    /// (`HF_TOKEN_PATH`, `$HF_HOME/token`); `HF_TOKEN` wins.
    pub token_file: String,
    /// No network at all: the fetch stands on the verified cache (`HF_HUB_OFFLINE`).
    pub offline: bool,
    /// The token itself: from `HF_TOKEN` only, never from the file.
    #[serde(skip)]
    pub token: Option<Secret>,
}

impl Default for HubSection {
    fn default() -> Self {
        Self {
            endpoint: String::new(),
            cache: String::new(),
            ablit_cache: "~/.cache/huggingface-ablit".into(),
            token_file: String::new(),
            offline: false,
            token: None,
        }
    }
}

/// `[serving]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServingSection {
    /// Shared KV pool for all streams together (`CONTEXT`; rank 0 `--context`, rank 1 `--pool`);
    /// 0 for the largest that fits every node, computed by preflight.
    pub context: u64,
    /// Concurrent streams (`PARALLEL`; `--parallel`).
    pub parallel: u32,
    /// API bind address on the head.
    pub host: String,
    /// API port on the head.
    pub port: u16,
    /// Default reply budget (`--max-tokens`); counts against the pool.
    pub max_tokens: u64,
    /// Thinking on by default (`--thinking` / `--no-thinking`).
    pub thinking: bool,
    /// DSpark speculative decoding (`--no-drafts` / rank 1 `--drafts 0` when off).
    pub drafts: bool,
    /// Sampling temperature default.
    pub temperature: f64,
    /// Nucleus sampling default.
    pub top_p: f64,
    /// Top-k sampling default.
    pub top_k: u32,
    /// Whether the API asks for a key: `key` (rank 0 gets the key file) or `none` (open API).
    pub auth: ApiAuth,
    /// API key file on the head (mode 0600, generated on first `up`); relative to `state_dir` when relative.
    pub api_key_file: String,
    /// API key from `SPARK_DEPLOY_API_KEY`, never from the file.
    #[serde(skip)]
    pub api_key: Option<Secret>,
}

impl Default for ServingSection {
    fn default() -> Self {
        Self {
            context: 1_048_576,
            parallel: 4,
            host: "0.0.0.0".into(),
            port: 8888,
            max_tokens: 32_768,
            thinking: true,
            drafts: true,
            temperature: 1.0,
            top_p: 0.95,
            top_k: 20,
            auth: ApiAuth::Key,
            api_key_file: "api-key".into(),
            api_key: None,
        }
    }
}

/// Whether `engine.repo` names a remote repository (a URL or scp-like `host:path`) rather than a
/// path on the head.
#[must_use]
pub fn repo_is_remote(repo: &str) -> bool {
    repo.contains("://")
        || (!repo.starts_with('/') && repo.split('/').next().is_some_and(|h| h.contains(':')))
}

/// `[engine]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineSection {
    /// The image both ranks run: built by BuildImage `FROM base_image` and identified by its
    /// content label (engine commit, patch hashes, Dockerfile hash).
    pub image: String,
    /// The qualified base the image is built from (the container the kit was captured in); never
    /// pulled by spark-deploy: it must be present on the head.
    pub base_image: String,
    /// Patch files (paths on the head), applied in order to the engine's checkout before the build
    /// (with `repo`), carried into the image and hashed into its content label.
    pub patches: Vec<String>,
    /// Engine commit the binaries are built from (label and cache key).
    pub commit: String,
    /// Where BuildImage gets the engine's source: a git URL or a local path (a repository holding
    /// `commit`). Empty: the binaries must already be in the head's engine directory.
    pub repo: String,
    /// Rendezvous TCP port on the head's fabric address (`TF_TP_PORT`).
    pub rendezvous_port: u16,
    /// The container runtime both ranks run under (`--runtime`); preflight checks that every
    /// node's Docker daemon has it registered.
    pub runtime: String,
    /// `TF_DS_REPLAY_FLOOR=1` on both ranks.
    pub replay_floor: bool,
    /// `TF_DS_GRAPHS` / `--graphs`.
    pub graphs: bool,
    /// `TF_DS_HC_SIDE` / `--side`.
    pub hc_side: bool,
    /// `TF_DS_L2_PREFETCH` / `--prefetch`.
    pub l2_prefetch: bool,
    /// `TF_DS_ENGRAM_AIO` / `--aio`.
    pub engram_aio: bool,
    /// Refuse checkpoints whose dimensions differ from those the engine's kernels are built for
    /// (before hours of rank-file building). Off only for an engine build that accepts other
    /// shapes (the testbed's stand-in serves a test-scale checkpoint).
    pub shape_guard: bool,
    /// Recipe switches with no public engine source (`TF_DS_ENGRAM_LANES`, `TF_DS_IDX_SPLIT`,
    /// `PREFILL_INTERLEAVE_MS`, `TF_DS_IMAGE_CACHE`): opaque, passed identically to both ranks, only when set.
    pub switches: BTreeMap<String, String>,
    /// Extra `TF_*`, `NCCL_*`, `TENSORFOLD_*` variables passed identically to both ranks.
    pub env: BTreeMap<String, String>,
}

impl Default for EngineSection {
    fn default() -> Self {
        Self {
            image: DEFAULT_ENGINE_IMAGE.into(),
            base_image: DEFAULT_IMAGE.into(),
            patches: Vec::new(),
            commit: "59402086381a42c74d53053443224eec2790b4c5".into(),
            repo: String::new(),
            rendezvous_port: 29620,
            runtime: "nvidia".into(),
            replay_floor: true,
            graphs: true,
            hc_side: true,
            l2_prefetch: true,
            engram_aio: true,
            shape_guard: true,
            switches: BTreeMap::new(),
            env: BTreeMap::new(),
        }
    }
}

/// `[storage]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StorageSection {
    /// Docker volume created on the worker in `nfs` mode (`NFS_VOLUME`).
    pub nfs_volume: String,
    /// NFS server the worker mounts from, an IP address (`HEAD_NFS_SERVER`); empty = the head's
    /// fabric address.
    pub head_nfs_server: String,
    /// Exported path as the worker mounts it; empty = the head's HF cache path.
    pub nfs_path: String,
    /// In `local` mode, the worker's HF cache tree (an absolute path on the worker holding
    /// `hub/models--…/snapshots/<commit>`), bind-mounted read-only (`NFS_VOLUME=<absolute path>`).
    pub worker_tree: String,
}

impl Default for StorageSection {
    fn default() -> Self {
        Self {
            nfs_volume: "spark-deploy-hf".into(),
            head_nfs_server: String::new(),
            nfs_path: String::new(),
            worker_tree: String::new(),
        }
    }
}

/// `[lifecycle]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LifecycleSection {
    /// When to run the preparation steps (`PREPARE`: `auto`, `always` (1), `never` (0)).
    pub prepare: PreparePolicy,
    /// Minimum `MemAvailable` on every node before launch, GiB (`MIN_AVAIL_GIB`).
    pub min_avail_gib: u32,
    /// Newest gzipped logs kept per rank (`LOG_KEEP`; 0 saves none).
    pub log_keep: u32,
    /// Readiness timeout, seconds.
    pub ready_timeout_s: u64,
    /// Grace period when stopping a rank, seconds.
    pub stop_timeout_s: u64,
    /// Generations kept besides the serving one after an accepted upgrade (rollback targets);
    /// older ones lose their inputs and image tags.
    pub keep_generations: u32,
    /// Run FetchCheckpoint, BuildRankCache, ConfigureWorkerStorage and BuildImage at the same
    /// time: rank files are written as shards land and travel to the workers as soon as they are
    /// final. `false` runs them one after the other.
    pub overlap: bool,
}

impl Default for LifecycleSection {
    fn default() -> Self {
        Self {
            prepare: PreparePolicy::Auto,
            min_avail_gib: 112,
            log_keep: 10,
            ready_timeout_s: 1800,
            stop_timeout_s: 30,
            keep_generations: 1,
            overlap: true,
        }
    }
}

/// `[watch]`: the supervisor of a running pair (`spark-deploy watch`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WatchSection {
    /// Seconds between two samples.
    pub interval_s: f64,
    /// Seconds with requests running and the token counter frozen before a wedge is suspected
    /// (then confirmed by a failing 1-token probe).
    pub wedge_s: f64,
    /// Seconds without requests after which a 1-token probe is sent (then again as often).
    pub probe_idle_s: f64,
    /// Seconds a 1-token probe may take before it counts as failed.
    pub probe_timeout_s: f64,
    /// `MemAvailable` floor on any node, GiB: below it the pair is stopped before the node wedges.
    pub memory_floor_gib: f64,
    /// What a heal does after stopping both ranks: start them again, or stay down.
    pub heal: HealPolicy,
    /// Heals allowed within one hour; the next finding stops the pair and it stays down.
    pub max_heals_per_hour: u32,
    /// Seconds a heal gives each rank to stop before SIGKILL. Short: both logs are saved first,
    /// and a wedged or frozen rank never stops by itself (`lifecycle.stop_timeout_s` is the
    /// grace of a user's `down`).
    pub heal_stop_grace_s: u64,
}

impl Default for WatchSection {
    fn default() -> Self {
        Self {
            interval_s: 2.0,
            wedge_s: 30.0,
            probe_idle_s: 60.0,
            probe_timeout_s: 20.0,
            memory_floor_gib: 3.0,
            heal: HealPolicy::Restart,
            max_heals_per_hour: 3,
            heal_stop_grace_s: 2,
        }
    }
}

/// `watch.heal`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HealPolicy {
    /// Stop both ranks, then start rank 1, rank 0, and smoke.
    Restart,
    /// Stop both ranks and stay down.
    Stop,
}

/// `PREPARE`: how `up` and `restart` treat the preparation steps (FetchCheckpoint,
/// BuildRankCache, ConfigureWorkerStorage, BuildImage). `spark-deploy prepare` always prepares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PreparePolicy {
    /// `auto` (`PREPARE=auto`): each step's own check decides what is missing or stale (stamps,
    /// manifests, the rank files' index) and only that is prepared.
    Auto,
    /// `always` (`PREPARE=1`): every step checks in full instead of trusting stamps — rank files
    /// are compared byte for byte with the checkpoint and rebuilt when they differ.
    Always,
    /// `never` (`PREPARE=0`): nothing is downloaded, built, shipped or imaged; the fetch stands on
    /// the verified cache, the rank inputs must verify as they are, worker storage and image are
    /// left as they are (the launch's cross-rank checks still refuse what differs).
    Never,
}

impl PreparePolicy {
    /// The remedy of a failure that `never` caused.
    pub const NOT_PREPARED_REMEDY: &'static str = "PREPARE=0 (lifecycle.prepare = \"never\") prepares nothing: run `spark-deploy prepare` first, or `up` with PREPARE=auto";
}

/// One `[[nodes]]` entry; the first is the head (rank 0, API), the others are workers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    /// Node name used in plans, events and errors (`[a-z0-9-]`).
    pub name: String,
    /// `local` for the head; for a worker (`WORKER`) what `ssh` is given: `user@host`, `host`
    /// or a `Host` alias of `~/.ssh/config`.
    pub ssh: String,
    /// SSH port; unset = ssh's own (the ssh config's `Port`, else 22).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh_port: Option<u16>,
    /// SSH identity file, offered first (ssh-agent's other keys are then not offered);
    /// empty = ssh's own choice (ssh-agent, the ssh config's `IdentityFile`, the default
    /// identities).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub identity_file: String,
    /// known_hosts file; empty = ssh's own (the ssh config's `UserKnownHostsFile`, else
    /// `~/.ssh/known_hosts`). Host keys are always strictly checked.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub known_hosts: String,
    /// The node's ConnectX-7 IPv4 (`FABRIC_PEER` for the worker); absent = detected at preflight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric_addr: Option<Ipv4Addr>,
    /// Container network mode of this node's rank: `host` or `container:<name>`.
    #[serde(default = "default_network_mode")]
    pub network_mode: String,
    /// Docker socket on the node.
    #[serde(default = "default_docker_socket")]
    pub docker_socket: String,
    /// The node's HF cache; empty = the head's `hub.cache` (`WORKER_HF_CACHE`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub hf_cache: String,
    /// Root of spark-deploy's data on the node (rank cache, kit, Engram, engine, logs).
    #[serde(default = "default_data_dir")]
    pub data_dir: String,
    /// The engine image's reference on this node; empty = `engine.image`. The content label,
    /// not the reference, identifies the image.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image: String,
    /// Directories searched before the default PATH for the host tools preflight runs on the
    /// node (`nvidia-smi`, ...), e.g. `/usr/local/nvidia/bin`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub path: Vec<String>,
    /// Where the node's sysfs is read (fabric netdev MTU, RoCE devices and GID tables).
    #[serde(default = "default_sysfs_root")]
    pub sysfs_root: String,
    /// Where the node's procfs is read (`meminfo` for preflight, `status` and `watch`).
    #[serde(default = "default_proc_root")]
    pub proc_root: String,
}

fn default_network_mode() -> String {
    "host".into()
}
fn default_docker_socket() -> String {
    "/var/run/docker.sock".into()
}
fn default_data_dir() -> String {
    "~/.cache/spark-deploy".into()
}
fn default_sysfs_root() -> String {
    "/sys".into()
}
fn default_proc_root() -> String {
    "/proc".into()
}

impl NodeConfig {
    /// The head node with defaults.
    #[must_use]
    pub fn head() -> Self {
        Self::new("head", "local")
    }

    /// A worker reached by `ssh` with defaults.
    #[must_use]
    pub fn worker(name: &str, ssh: &str) -> Self {
        Self::new(name, ssh)
    }

    fn new(name: &str, ssh: &str) -> Self {
        Self {
            name: name.into(),
            ssh: ssh.into(),
            ssh_port: None,
            identity_file: String::new(),
            known_hosts: String::new(),
            fabric_addr: None,
            network_mode: default_network_mode(),
            docker_socket: default_docker_socket(),
            hf_cache: String::new(),
            data_dir: default_data_dir(),
            image: String::new(),
            path: Vec::new(),
            sysfs_root: default_sysfs_root(),
            proc_root: default_proc_root(),
        }
    }

    /// The node's `meminfo` file (below its `proc_root`).
    #[must_use]
    pub fn meminfo_path(&self) -> std::path::PathBuf {
        std::path::Path::new(self.proc_root.trim_end_matches('/')).join("meminfo")
    }

    /// Whether this node is the machine the tool runs on.
    #[must_use]
    pub fn is_local(&self) -> bool {
        self.ssh == "local"
    }
}
