//! The ranks' containers: argv, env and mounts exactly as the engine takes them (docs/engine-contract.md, "Launch lines").
//!
//! A follower (`tf-dsv41-lanes`) takes positional `MODEL CACHE RANK WORLD MASTER PORT KIT` then
//! `--key value` pairs; rank 0 (`tensorfold-native serve`) takes its inputs from the environment.
//! Every value the ranks must agree on is computed once in `Shared` and rendered into every
//! rank, so they cannot drift. The TP=4 branch adds its own settings ([`Tp4`]): the shared pool
//! `TF_DS_WINDOW`, rows per round and streams in every rank's environment, and the followers'
//! `--round-rows/--streams/--context`.

use std::collections::BTreeMap;

use super::{FOLLOWER_BIN, SERVER_BIN, TOKEN_MAP_FILE};
use crate::config::ValidatedConfig;
use crate::container::{ContainerSpec, Mount, Ulimit, labels};
use crate::facts::{DeploymentFacts, NodeFacts};
use crate::layout::NodeLayout;

/// Where the inputs appear inside a rank's container.
pub mod paths {
    /// Engine binaries.
    pub const ENGINE: &str = "/engine";
    /// Kernel kit.
    pub const KIT: &str = "/kit";
    /// The node's HF cache (read-only); the checkpoint snapshot is below it, so the cache's
    /// relative blob symlinks resolve inside the mount.
    pub const HF: &str = "/hf";
    /// Engram tables.
    pub const ENGRAM: &str = "/engram";
    /// Per-checkpoint inputs (`rank-cache/`, token map).
    pub const CACHE: &str = "/cache";
    /// Rank weight files.
    pub const RANK_CACHE: &str = "/cache/rank-cache";
    /// API key file of rank 0.
    pub const API_KEY: &str = "/run/spark-deploy/api-key";
}

fn flag(on: bool) -> String {
    if on { "1" } else { "0" }.to_owned()
}

/// The TP=4 branch's settings, identical on every rank.
struct Tp4 {
    /// Rows per round (`TF_DS_ROUND_ROWS`, `--round-rows`): `engine.env`'s, else the engine's 16.
    round_rows: String,
    /// Pool streams (`TF_DS_STREAMS`, `--streams`): `engine.env`'s, else the engine's 4 or
    /// `serving.parallel` when larger.
    streams: String,
}

impl Tp4 {
    fn new(config: &ValidatedConfig) -> Option<Self> {
        if !config.limits().tp4_branch {
            return None;
        }
        let c = config.config();
        let env = |k: &str| c.engine.env.get(k).cloned();
        Some(Self {
            round_rows: env("TF_DS_ROUND_ROWS").unwrap_or_else(|| "16".to_owned()),
            streams: env("TF_DS_STREAMS").unwrap_or_else(|| c.serving.parallel.max(4).to_string()),
        })
    }
}

/// Values every rank must carry identically (the engine never compares them).
struct Shared {
    model_dir: String,
    master: String,
    port: String,
    world: String,
    pool: String,
    token_map: String,
    /// Environment identical on every rank: replay floor, opaque switches, user pass-through,
    /// the TP=4 settings.
    common_env: BTreeMap<String, String>,
    tp4: Option<Tp4>,
}

impl Shared {
    fn new(config: &ValidatedConfig, facts: &DeploymentFacts) -> Self {
        let c = config.config();
        let mut common_env = BTreeMap::new();
        if c.engine.replay_floor {
            common_env.insert("TF_DS_REPLAY_FLOOR".to_owned(), "1".to_owned());
        }
        common_env.extend(
            c.engine
                .switches
                .iter()
                .map(|(k, v)| (k.clone(), v.clone())),
        );
        common_env.extend(c.engine.env.iter().map(|(k, v)| (k.clone(), v.clone())));
        let pool = facts.context(config);
        let tp4 = Tp4::new(config);
        if let Some(t) = &tp4 {
            // The TP=4 branch separates the pool (`TF_DS_WINDOW`) from a request's positions
            // (`--context`); spark-deploy gives both `serving.context`.
            common_env.insert("TF_DS_WINDOW".to_owned(), pool.clone());
            common_env.insert("TF_DS_ROUND_ROWS".to_owned(), t.round_rows.clone());
            common_env.insert("TF_DS_STREAMS".to_owned(), t.streams.clone());
        }
        Self {
            model_dir: NodeLayout::snapshot_under(
                paths::HF,
                &c.model.id,
                &facts.model_commit.to_string(),
            ),
            master: facts.nodes[0].fabric_addr.to_string(),
            port: c.engine.rendezvous_port.to_string(),
            world: c.nodes.len().to_string(),
            pool,
            token_map: format!("{}/{TOKEN_MAP_FILE}", paths::CACHE),
            common_env,
            tp4,
        }
    }
}

/// Per-node fabric environment (netdev, RoCE devices, GID index): these legitimately differ between nodes.
fn fabric_env(f: &NodeFacts, env: &mut BTreeMap<String, String>) {
    env.insert("NCCL_SOCKET_IFNAME".to_owned(), f.netdev.to_string());
    if let Some(devs) = f.rdma_devices.text() {
        env.insert("NCCL_IB_HCA".to_owned(), devs);
    }
    if let Some(gid) = f.gid_index.text() {
        env.insert("NCCL_IB_GID_INDEX".to_owned(), gid.clone());
        env.insert("TF_RDMA_GID_INDEX".to_owned(), gid.clone());
    }
}

fn base_spec(
    config: &ValidatedConfig,
    rank: usize,
    facts: &NodeFacts,
    argv: Vec<String>,
    env: BTreeMap<String, String>,
) -> ContainerSpec {
    let c = config.config();
    let node = &c.nodes[rank];
    let layout = NodeLayout::of(config, node);
    let mut mounts = vec![
        Mount {
            source: layout.engine_dir,
            target: paths::ENGINE.into(),
            read_only: true,
            volume: false,
        },
        Mount {
            source: layout.kit_dir,
            target: paths::KIT.into(),
            read_only: true,
            volume: false,
        },
        hf_mount(config, rank, &layout.hf_cache),
        Mount {
            source: layout.engram_dir,
            target: paths::ENGRAM.into(),
            read_only: true,
            volume: false,
        },
        Mount {
            source: layout.inputs_dir,
            target: paths::CACHE.into(),
            read_only: true,
            volume: false,
        },
    ];
    if rank == 0 && c.serving.auth == crate::config::ApiAuth::Key {
        mounts.push(Mount {
            source: c.serving.api_key_file.clone(),
            target: paths::API_KEY.into(),
            read_only: true,
            volume: false,
        });
    }
    let name = crate::container::rank_container_name(&c.deployment.name, rank);
    ContainerSpec {
        node: node.name.clone(),
        rank,
        name,
        image: layout.image.clone(),
        argv,
        env,
        mounts,
        network_mode: node.network_mode.clone(),
        ipc_mode: "host".into(),
        runtime: c.engine.runtime.clone(),
        gpus: if facts.gpu {
            "all".into()
        } else {
            "none".into()
        },
        devices: facts.infiniband_device.iter().cloned().collect(),
        // A daemon that refuses the memlock limit is detected at start (see `steps::ranks`).
        ulimits: [("memlock", -1), ("stack", 67_108_864)]
            .into_iter()
            .map(|(n, v)| Ulimit {
                name: n.into(),
                soft: v,
                hard: v,
            })
            .collect(),
        cap_add: vec!["IPC_LOCK".into()],
        oom_score_adj: 1000,
        restart: "no".into(),
        log_opts: BTreeMap::from([
            ("max-size".into(), "200m".into()),
            ("max-file".into(), "3".into()),
        ]),
        labels: BTreeMap::from([
            (labels::DEPLOYMENT.into(), c.deployment.name.clone()),
            (labels::RANK.into(), rank.to_string()),
            (labels::NODE.into(), node.name.clone()),
        ]),
    }
}

/// In `nfs` mode a worker reads the head's cache through the Docker NFS volume; in `local` mode
/// its own tree.
fn hf_mount(config: &ValidatedConfig, rank: usize, hf_cache: &str) -> Mount {
    use crate::config::WorkerStorage;
    let c = config.config();
    if rank > 0 && c.deployment.worker_storage == WorkerStorage::Nfs {
        Mount {
            source: c.storage.nfs_volume.clone(),
            target: paths::HF.into(),
            read_only: true,
            volume: true,
        }
    } else if rank > 0 && c.deployment.worker_storage == WorkerStorage::Local {
        Mount {
            source: c.storage.worker_tree.clone(),
            target: paths::HF.into(),
            read_only: true,
            volume: false,
        }
    } else {
        Mount {
            source: hf_cache.to_owned(),
            target: paths::HF.into(),
            read_only: true,
            volume: false,
        }
    }
}

/// Rank 0: `tensorfold-native serve` with its inputs in the environment.
fn rank0(config: &ValidatedConfig, facts: &DeploymentFacts, shared: &Shared) -> ContainerSpec {
    let c = config.config();
    let s = &c.serving;
    let f = &facts.nodes[0];
    let mut env = shared.common_env.clone();
    for (k, v) in [
        ("TF_TP_WORLD", shared.world.clone()),
        ("TF_TP_MASTER", shared.master.clone()),
        ("TF_TP_PORT", shared.port.clone()),
        ("TF_DS_RANK_CACHE", paths::RANK_CACHE.to_owned()),
        ("TF_DS_KIT", paths::KIT.to_owned()),
        ("TENSORFOLD_CUDA_KERNELS", format!("{}/aot", paths::KIT)),
        ("TF_DS_ENGRAM", paths::ENGRAM.to_owned()),
        ("TF_DS_TOKEN_MAP", shared.token_map.clone()),
        ("TF_DS_GRAPHS", flag(c.engine.graphs)),
        ("TF_DS_HC_SIDE", flag(c.engine.hc_side)),
        ("TF_DS_L2_PREFETCH", flag(c.engine.l2_prefetch)),
        ("TF_DS_ENGRAM_AIO", flag(c.engine.engram_aio)),
    ] {
        env.insert(k.to_owned(), v);
    }
    if let Some(devs) = f.rdma_devices.text() {
        env.insert("TF_RDMA_DEVICES".to_owned(), devs);
    }
    fabric_env(f, &mut env);
    let mut argv: Vec<String> = [SERVER_BIN, "serve", &shared.model_dir]
        .map(str::to_owned)
        .to_vec();
    let pairs = [
        ("--host", s.host.clone()),
        ("--port", s.port.to_string()),
        ("--name", c.model.served_name.clone()),
        ("--api-key-file", paths::API_KEY.to_owned()),
        ("--context", shared.pool.clone()),
        ("--parallel", s.parallel.to_string()),
    ];
    // With `serving.auth = "none"` rank 0 gets no key file (and no mount of it).
    let keyed = s.auth == crate::config::ApiAuth::Key;
    for (k, v) in pairs
        .into_iter()
        .filter(|(k, _)| keyed || *k != "--api-key-file")
    {
        argv.push(k.to_owned());
        argv.push(v);
    }
    argv.push(
        if s.thinking {
            "--thinking"
        } else {
            "--no-thinking"
        }
        .to_owned(),
    );
    if !s.drafts {
        argv.push("--no-drafts".to_owned());
    }
    for (k, v) in [
        ("--max-tokens", s.max_tokens.to_string()),
        ("--temperature", s.temperature.to_string()),
        ("--top-p", s.top_p.to_string()),
        ("--top-k", s.top_k.to_string()),
        ("--backend", "cuda".to_owned()),
    ] {
        argv.push(k.to_owned());
        argv.push(v);
    }
    base_spec(config, 0, f, argv, env)
}

/// The argv position of a follower's own rank (`tf-dsv41-lanes MODEL CACHE RANK ...`).
pub const FOLLOWER_RANK_ARG: usize = 3;

/// Rank r ≥ 1: `tf-dsv41-lanes MODEL CACHE RANK WORLD MASTER PORT KIT --key value ...`.
fn follower(
    config: &ValidatedConfig,
    facts: &DeploymentFacts,
    shared: &Shared,
    rank: usize,
) -> ContainerSpec {
    let c = config.config();
    let f = &facts.nodes[rank];
    let mut env = shared.common_env.clone();
    fabric_env(f, &mut env);
    let mut argv: Vec<String> = vec![
        FOLLOWER_BIN.to_owned(),
        shared.model_dir.clone(),
        paths::RANK_CACHE.to_owned(),
        rank.to_string(),
        shared.world.clone(),
        shared.master.clone(),
        shared.port.clone(),
        paths::KIT.to_owned(),
    ];
    let mut pairs = vec![
        ("--engram", paths::ENGRAM.to_owned()),
        ("--token-map", shared.token_map.clone()),
        ("--pool", shared.pool.clone()),
        ("--drafts", flag(c.serving.drafts)),
    ];
    if let Some(devs) = f.rdma_devices.text() {
        pairs.push(("--rdma", devs));
    }
    pairs.extend([
        ("--graphs", flag(c.engine.graphs)),
        ("--side", flag(c.engine.hc_side)),
        ("--prefetch", flag(c.engine.l2_prefetch)),
        ("--aio", flag(c.engine.engram_aio)),
    ]);
    if let Some(t) = &shared.tp4 {
        pairs.extend([
            ("--round-rows", t.round_rows.clone()),
            ("--streams", t.streams.clone()),
            ("--context", shared.pool.clone()),
        ]);
    }
    for (k, v) in pairs {
        argv.push(k.to_owned());
        argv.push(v);
    }
    base_spec(config, rank, f, argv, env)
}

/// The port on the head's fabric address follower `rank` joins: `engine.rendezvous_port` + rank − 1
/// (one listener of rank 0 per follower; at world 2 the port itself). Every follower is given the
/// base port and derives its own.
#[must_use]
pub fn rendezvous_port(config: &ValidatedConfig, rank: usize) -> u16 {
    let base = config.config().engine.rendezvous_port;
    base.saturating_add(u16::try_from(rank.saturating_sub(1)).unwrap_or(u16::MAX))
}

/// Every rank's container in start order: followers from the highest rank down, rank 0 last.
#[must_use]
pub fn rank_specs(config: &ValidatedConfig, facts: &DeploymentFacts) -> Vec<ContainerSpec> {
    let shared = Shared::new(config, facts);
    let world = config.config().nodes.len();
    let mut specs: Vec<_> = (1..world)
        .rev()
        .map(|r| follower(config, facts, &shared, r))
        .collect();
    specs.push(rank0(config, facts, &shared));
    specs
}
