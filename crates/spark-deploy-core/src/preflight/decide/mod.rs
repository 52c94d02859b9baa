//! The preflight decisions as one pure function: [`decide`] turns the raw facts of every node
//! ([`NodeFacts`]: command outputs as text, a [`Sysfs`] view, probe results) and the settings drawn
//! from the configuration ([`Settings`]) into the table's rows. Collection lives in
//! `steps::preflight`; nothing here touches a node, so every failing case is tested on built facts.
//!
//! One module per check family: [`access`] (SSH / local Exec, sudo, Docker), [`gpu`] (the
//! container runtime, other GPU users, the driver, clocks), [`memory`] (the floor and the
//! budget, and the largest CONTEXT that fits when it is 0), [`disk`], [`fabric`] (route, address,
//! RoCE, MTU), [`ports`], [`build`] (the engine binaries and the base image the image step needs),
//! [`engine_build`] (the engine's source, when BuildImage builds the engine) and [`storage`] (the
//! head's NFS export in `nfs` mode).

pub mod access;
pub mod build;
pub mod disk;
pub mod engine_build;
pub mod fabric;
pub mod gpu;
pub mod memory;
pub mod ports;
pub mod storage;
#[cfg(test)]
mod testing;

use std::net::Ipv4Addr;

pub use access::{error_chain, ssh_remedy};
pub use build::EngineFiles;
pub use disk::{DiskFacts, Missing, df_free_bytes};
pub use memory::memory_budget;
pub use ports::PortProbe;

use super::report::CheckResult;
use super::roce::{RoceFacts, Route, Sysfs};
use crate::config::{ValidatedConfig, WorkerStorage};

/// What [`decide`] needs from the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The container runtime the ranks run under (`engine.runtime`): it must be registered in
    /// every node's Docker daemon.
    pub runtime: String,
    /// `MemAvailable` floor, GiB.
    pub min_avail_gib: u32,
    /// The CONTEXT pool (`serving.context`); 0 asks for the largest that fits every node.
    pub context: u64,
    /// `serving.max_tokens`: a computed CONTEXT must hold one reply's extent.
    pub max_tokens: u64,
    /// The engine's largest pool.
    pub max_pool: u64,
    /// The engine's memory model (arena, KV, RoPE, reserve).
    pub memory: crate::engine::limits::MemoryModel,
    /// The engine commit the binaries must be built at (`engine.commit`).
    pub engine_commit: String,
    /// The image the engine image is built `FROM` (`engine.base_image`), never pulled.
    pub base_image: String,
    /// `nfs` mode: the head's path every worker mounts (`storage.nfs_path`, else the head's HF
    /// cache); `None` in `copy` mode.
    pub nfs_export: Option<String>,
}

impl Settings {
    /// The settings of `config`.
    #[must_use]
    pub fn of(config: &ValidatedConfig) -> Self {
        let c = config.config();
        Self {
            runtime: c.engine.runtime.clone(),
            min_avail_gib: c.lifecycle.min_avail_gib,
            context: c.serving.context,
            max_tokens: c.serving.max_tokens,
            max_pool: config.limits().max_pool,
            memory: config.limits().memory,
            engine_commit: c.engine.commit.clone(),
            base_image: c.engine.base_image.clone(),
            nfs_export: (c.deployment.worker_storage == WorkerStorage::Nfs).then(|| {
                if c.storage.nfs_path.is_empty() {
                    crate::layout::NodeLayout::of(config, &c.nodes[0]).hf_cache
                } else {
                    c.storage.nfs_path.clone()
                }
            }),
        }
    }
}

/// Why the Docker probe failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DockerProbe {
    /// The daemon answered a ping.
    Reachable,
    /// The socket could not be reached (through SSH for workers).
    Unreachable(String),
    /// The socket was reached but the ping failed.
    PingFailed(String),
}

/// Where a rank's weight bytes for the memory budget come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightsSource {
    /// The rank file already built on the head: its size, exactly what the engine counts.
    RankFile,
    /// The cached checkpoint's `total_size` split over the ranks.
    Checkpoint,
    /// The checkpoint listed at the Hub, its weight files' sizes split over the ranks.
    Hub,
    /// The engine profile's figure for the model it was made for (nothing measured yet).
    ProfileEstimate,
}

impl WeightsSource {
    fn describe(self) -> &'static str {
        match self {
            Self::RankFile => "rank file",
            Self::Checkpoint => "cached checkpoint / ranks",
            Self::Hub => "checkpoint at the Hub / ranks",
            Self::ProfileEstimate => "estimate for this model",
        }
    }
}

/// A rank's weight bytes and where they come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankWeights {
    /// Bytes.
    pub bytes: u64,
    /// Their source.
    pub source: WeightsSource,
}

/// The raw facts of one node, as collected; `Err` holds the failing command's error text.
pub struct NodeFacts {
    /// Node name.
    pub name: String,
    /// Position in `nodes` (0 = head).
    pub index: usize,
    /// SSH target (`local` for the head).
    pub ssh: String,
    /// The configured fabric address, if any.
    pub fabric_addr: Option<Ipv4Addr>,
    /// The peer's fabric address, if known.
    pub peer: Option<Ipv4Addr>,
    /// Opening the Exec port and running `true`: the full error chain on failure.
    pub reach: Result<(), String>,
    /// `sudo -n true` succeeded.
    pub sudo: bool,
    /// The Docker probe.
    pub docker: DockerProbe,
    /// `nvidia-smi -q -d CLOCK`.
    pub smi: Option<Result<String, String>>,
    /// `nvidia-smi --query-gpu=name --format=csv,noheader`: one model name per GPU.
    pub gpu_model: Option<Result<String, String>>,
    /// `nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader`.
    pub gpu_processes: Option<Result<String, String>>,
    /// The Docker daemon's runtimes (`docker info`).
    pub runtimes: Option<Result<Vec<String>, String>>,
    /// Running GPU containers that are not this deployment's ranks.
    pub gpu_containers: Option<Result<Vec<String>, String>>,
    /// This deployment's own rank runs on the node (it holds the GPU and its ports until the
    /// launch restarts it).
    pub own_rank_running: bool,
    /// `/proc/meminfo`.
    pub meminfo: Result<String, String>,
    /// The weight bytes of this node's rank, when known.
    pub rank_weights: Option<RankWeights>,
    /// The directories that receive data, each with its `df` and what still has to land there.
    pub disks: Vec<DiskFacts>,
    /// `ip -o -4 route get <peer>` (`None` when the peer is unknown).
    pub route: Option<Result<String, String>>,
    /// `<sysfs>/class/net/<route dev>/mtu` (`None` when there is no route).
    pub mtu: Option<Result<String, String>>,
    /// The node's sysfs (`None` without a route).
    pub sysfs: Option<Result<Box<dyn Sysfs + Send + Sync>, String>>,
    /// `/dev/infiniband` exists.
    pub infiniband: bool,
    /// Ports that must be free on this node.
    pub ports: Vec<PortProbe>,
    /// Head: the engine binaries the image step ships, found or not in its engine directory.
    pub engine_files: Option<EngineFiles>,
    /// Head: the base image in its Docker daemon: its size when present, `None` when absent.
    pub base_image: Option<Result<Option<u64>, String>>,
    /// Head, `nfs` mode: the text of its exports files (`/etc/exports`, `/etc/exports.d/*`).
    pub exports: Option<Result<String, String>>,
    /// Head, with `engine.repo` set: the base image and the source of the engine build.
    pub engine_build: Option<engine_build::EngineBuildFacts>,
}

impl NodeFacts {
    /// A node about which nothing was collected yet (every fact missing, unreached).
    #[must_use]
    pub fn new(name: &str, index: usize, ssh: &str) -> Self {
        let missing = || Err("not collected".to_owned());
        Self {
            name: name.to_owned(),
            index,
            ssh: ssh.to_owned(),
            fabric_addr: None,
            peer: None,
            reach: Err("not collected".to_owned()),
            sudo: false,
            docker: DockerProbe::Unreachable("not collected".to_owned()),
            smi: None,
            gpu_model: None,
            gpu_processes: None,
            runtimes: None,
            gpu_containers: None,
            own_rank_running: false,
            meminfo: missing(),
            rank_weights: None,
            disks: Vec::new(),
            route: None,
            mtu: None,
            sysfs: None,
            infiniband: false,
            ports: Vec::new(),
            engine_files: None,
            base_image: None,
            exports: None,
            engine_build: None,
        }
    }
}

/// What a node's decision detected, for the later steps.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Detected {
    /// The route towards the peer.
    pub route: Option<Route>,
    /// RoCE devices and GID index.
    pub roce: Option<RoceFacts>,
    /// `/dev/infiniband` exists.
    pub infiniband: bool,
    /// The driver lists at least one GPU and the daemon can hand it to a container: the rank
    /// gets a GPU device request.
    pub gpu: bool,
}

/// The rows of the table and what was detected per node (in `nodes` order).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decision {
    /// Rows: each node's checks, then the cross-node checks, then the ports.
    pub results: Vec<CheckResult>,
    /// Per node.
    pub detected: Vec<Detected>,
    /// The CONTEXT the ranks get when `serving.context` is 0: the largest that fits every node.
    pub context: Option<u64>,
}

fn gib(b: u64) -> String {
    format!("{:.1}", b as f64 / (1u64 << 30) as f64)
}

fn decide_node(s: &Settings, f: &NodeFacts, out: &mut Vec<CheckResult>) -> Detected {
    let mut d = Detected {
        infiniband: f.infiniband,
        ..Detected::default()
    };
    if !access::decide(f, out) {
        return d;
    }
    d.gpu = gpu::decide(s, f, out);
    memory::decide(s, f, out);
    disk::decide(f, out);
    build::decide(s, f, out);
    engine_build::decide(f, out);
    fabric::decide(f, out, &mut d);
    d
}

/// Decides every check over the collected facts (`facts` in `nodes` order, head first).
#[must_use]
pub fn decide(settings: &Settings, facts: &[NodeFacts]) -> Decision {
    let mut results = Vec::new();
    let mut context = None;
    let mut s = settings.clone();
    if settings.context == 0 {
        let (row, fits) = memory::largest_context(settings, facts);
        results.push(row);
        context = fits;
        s.context = fits.unwrap_or(0);
    }
    let detected: Vec<Detected> = facts
        .iter()
        .map(|f| decide_node(&s, f, &mut results))
        .collect();
    results.extend(gpu::compare_clocks(facts));
    results.extend(fabric::compare_mtu(facts, &detected));
    results.extend(storage::decide(&s, facts, &detected));
    for f in facts {
        results.extend(f.ports.iter().map(|p| ports::decide(&f.name, p)));
    }
    Decision {
        results,
        detected,
        context,
    }
}
