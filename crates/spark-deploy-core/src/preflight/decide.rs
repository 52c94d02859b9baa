//! The preflight decisions as one pure function: [`decide`] turns the raw facts of every node
//! ([`NodeFacts`]: command outputs as text, a [`Sysfs`] view, probe results) and the settings drawn
//! from the configuration ([`Settings`]) into the table's rows. Collection lives in
//! `steps::preflight`; nothing here touches a node, so every failing case is tested on built facts.

use std::error::Error as StdError;
use std::fmt::Write as _;
use std::net::Ipv4Addr;

use super::report::CheckResult;
use super::roce::{self, RoceFacts, Route, Sysfs};
use super::{budget, clocks, meminfo, smi};
use crate::config::ValidatedConfig;

const GIB: u64 = 1 << 30;

/// Rank weights assumed by the memory budget: the rank file is "about 106 GB" = 98.7 GiB, the
/// "~99 GiB a rank with DSpark" of the run report (ENGINE-CONTRACT.md §13.4; the design figure is
/// ~97 GiB, so this errs on the safe side). The native server counts the rank file's size
/// (§13.6, `native.weightBytes`), which is why the file size and not the design figure is used.
pub const RANK_WEIGHT_BYTES: u64 = 106_000_000_000;

/// Memory kept free on top of weights, arena, KV and RoPE: 4 GiB.
///
/// Chosen from ENGINE-CONTRACT.md: §13.6 upstream's CUDA floor is at least 4 GiB (and
/// `TENSORFOLD_MEMORY_RESERVE_GIB` ≥ 2), §13.7 peers use a 4 GiB hard `MemAvailable` floor while
/// serving, and §13.5 measured 5 GiB left on the head at `--context 1048576 --parallel 4`. It also
/// covers what the formula leaves out (SWA and DSpark rings, rank 1's frame buffer, §13.2/§13.3).
/// With it the seed config (CONTEXT 1,048,576, ~99 GiB a rank) needs
/// 98.7 + 16 + 0.9 + 0.5 + 4 = 120.1 GiB: it fits 125 GiB available, does not fit 110 GiB (where
/// the largest pool that fits is 299,008), and on 100 GiB not even the smallest pool fits
/// (98.7 + 3 + 4 > 100).
pub const RESERVE_BYTES: u64 = 4 * GIB;

/// What [`decide`] needs from the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The nodes are the testbed: no GPU, RDMA or memory budget is required.
    pub testbed: bool,
    /// `MemAvailable` floor, GiB.
    pub min_avail_gib: u32,
    /// The CONTEXT pool (`serving.context`).
    pub context: u64,
    /// The engine's largest pool.
    pub max_pool: u64,
    /// Rank weight bytes for the budget.
    pub rank_weights: u64,
    /// Reserve bytes for the budget.
    pub reserve: u64,
}

impl Settings {
    /// The settings of `config`.
    #[must_use]
    pub fn of(config: &ValidatedConfig) -> Self {
        let c = config.config();
        Self {
            testbed: c.deployment.testbed,
            min_avail_gib: c.lifecycle.min_avail_gib,
            context: c.serving.context,
            max_pool: config.limits().max_pool,
            rank_weights: if c.deployment.testbed {
                0
            } else {
                RANK_WEIGHT_BYTES
            },
            reserve: RESERVE_BYTES,
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

/// Something still missing on a node that needs disk space there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Missing {
    /// What it is (`rank file 1`, `checkpoint: model-00003.safetensors`).
    pub what: String,
    /// Its size in bytes (an estimate where the exact size is not known yet).
    pub bytes: u64,
}

/// A directory that receives data on a node: `df -Pk <dir or its nearest existing parent> | tail -1`
/// and what still has to land there. Directories on the same filesystem share its free space.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskFacts {
    /// The directory (`data_dir`, the HF cache).
    pub dir: String,
    /// The `df` line, or why it could not be taken.
    pub df: Result<String, String>,
    /// What is still missing there.
    pub missing: Vec<Missing>,
}

/// A TCP port that must be free.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortProbe {
    /// Check name (`port.api`, `port.rendezvous`).
    pub check: String,
    /// `addr:port`.
    pub addr: String,
    /// Binding it succeeded.
    pub free: bool,
    /// What to do when it is in use.
    pub remedy: String,
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
    /// Where the GPU and RoCE facts below come from when they are not the node's own (a testbed
    /// fixture directory); every row they decide says so.
    pub fixture: Option<String>,
    /// `nvidia-smi -q -d CLOCK` (`None` on a testbed without fixtures).
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
    /// The directories that receive data, each with its `df` and what still has to land there.
    pub disks: Vec<DiskFacts>,
    /// `ip -o -4 route get <peer>` (`None` when the peer is unknown).
    pub route: Option<Result<String, String>>,
    /// `/sys/class/net/<route dev>/mtu` (`None` when there is no route).
    pub mtu: Option<Result<String, String>>,
    /// The node's sysfs (`None` on the testbed or without a route).
    pub sysfs: Option<Result<Box<dyn Sysfs + Send + Sync>, String>>,
    /// `/dev/infiniband` exists.
    pub infiniband: bool,
    /// Ports that must be free on this node.
    pub ports: Vec<PortProbe>,
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
            fixture: None,
            smi: None,
            gpu_model: None,
            gpu_processes: None,
            runtimes: None,
            gpu_containers: None,
            own_rank_running: false,
            meminfo: missing(),
            disks: Vec::new(),
            route: None,
            mtu: None,
            sysfs: None,
            infiniband: false,
            ports: Vec::new(),
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
}

/// The rows of the table and what was detected per node (in `nodes` order).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decision {
    /// Rows: each node's checks, then the cross-node checks, then the ports.
    pub results: Vec<CheckResult>,
    /// Per node.
    pub detected: Vec<Detected>,
}

/// An error and its sources on one line (`a: b: c`), so the underlying cause (ssh's stderr) is
/// visible to [`ssh_remedy`].
#[must_use]
pub fn error_chain(e: &dyn StdError) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.contains(&t) {
            let _ = write!(s, ": {t}");
        }
        cur = c.source();
    }
    s
}

/// The remedy for a failed SSH login, classified from the error text.
#[must_use]
pub fn ssh_remedy(error: &str, ssh: &str) -> String {
    let e = error.to_ascii_lowercase();
    let host = ssh.rsplit('@').next().unwrap_or(ssh);
    if e.contains("host key verification failed")
        || e.contains("host key is known")
        || e.contains("remote host identification has changed")
        || e.contains("host key for")
    {
        format!(
            "the host key of {host} is not in known_hosts (or changed): verify its fingerprint on the node \
             (`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub`), then add it with \
             `ssh-keyscan -H {host} >> ~/.ssh/known_hosts` (or the node's known_hosts file); host keys are always checked"
        )
    } else if e.contains("connection refused") {
        format!(
            "{host} refuses SSH connections: start sshd there (`sudo systemctl enable --now ssh`) or set the node's ssh_port"
        )
    } else if e.contains("permission denied") {
        format!(
            "{host} refused the key (BatchMode, no password): install it with `ssh-copy-id {ssh}` or set the node's identity_file"
        )
    } else if e.contains("could not resolve hostname") || e.contains("name or service not known") {
        format!(
            "{host} does not resolve: use its management IP or add it to /etc/hosts / ~/.ssh/config"
        )
    } else if e.contains("timed out") || e.contains("no route to host") {
        format!("{host} is unreachable: check the management network and the node's power")
    } else {
        format!(
            "check that `ssh -o BatchMode=yes {ssh} true` works with the configured key and known_hosts"
        )
    }
}

fn gib(b: u64) -> String {
    format!("{:.1}", b as f64 / GIB as f64)
}

/// Splits a `...; remedy: ...` message into the observation and the remedy.
fn split_remedy(msg: &str) -> (String, String) {
    match msg.split_once("; remedy: ") {
        Some((o, r)) => (o.to_owned(), r.to_owned()),
        None => (msg.to_owned(), "see the message".to_owned()),
    }
}

/// The memory budget rows of one node: the arithmetic in the observed text; on failure the
/// largest CONTEXT that fits there, or that none does.
#[must_use]
pub fn memory_budget(settings: &Settings, node: &str, available: u64) -> CheckResult {
    let b = budget::RankBudget::new(settings.rank_weights, settings.context, settings.reserve);
    let observed = format!(
        "weights {} + arena {} + KV {} + RoPE {} + reserve {} = {} GiB vs MemAvailable {} GiB (CONTEXT {})",
        gib(b.weights),
        gib(b.arena),
        gib(b.kv),
        gib(b.rope),
        gib(b.reserve),
        gib(b.total()),
        gib(available),
        settings.context
    );
    if settings.testbed || b.total() <= available {
        return CheckResult::ok("memory.budget", node, observed);
    }
    let remedy = budget::largest_pool(
        settings.rank_weights,
        settings.reserve,
        available,
        settings.max_pool,
    )
    .map_or_else(
        || {
            format!(
                "no CONTEXT fits: even the smallest pool (2048) needs more than {} GiB; free memory on this node (stop other GPU work, drop caches)",
                gib(available)
            )
        },
        |p| {
            let fit = budget::RankBudget::new(settings.rank_weights, p, settings.reserve);
            format!(
                "set CONTEXT ≤ {p}, the largest pool that fits here ({} GiB), or free memory",
                gib(fit.total())
            )
        },
    );
    CheckResult::fail("memory.budget", node, observed, remedy)
}

/// Parses `df -Pk ... | tail -1` output into (mount point, free bytes).
#[must_use]
pub fn df_free_bytes(text: &str) -> Option<(String, u64)> {
    let line = text.lines().rev().find(|l| !l.trim().is_empty())?;
    let fields: Vec<&str> = line.split_whitespace().collect();
    let free = fields.get(3)?.parse::<u64>().ok()? * 1024;
    let mount = fields.get(5..).map(|m| m.join(" ")).unwrap_or_default();
    Some((mount, free))
}

fn decide_node(s: &Settings, f: &NodeFacts, out: &mut Vec<CheckResult>) -> Detected {
    let n = f.name.as_str();
    let mut d = Detected {
        infiniband: f.infiniband,
        ..Detected::default()
    };
    match &f.reach {
        Ok(()) => out.push(CheckResult::ok(
            if f.index == 0 { "exec" } else { "ssh" },
            n,
            if f.index == 0 {
                "local".to_owned()
            } else {
                format!("BatchMode login to {} with host key checking", f.ssh)
            },
        )),
        Err(e) => {
            out.push(CheckResult::fail(
                "ssh",
                n,
                e.clone(),
                ssh_remedy(e, &f.ssh),
            ));
            return d;
        }
    }
    out.push(if f.sudo {
        CheckResult::ok("sudo", n, "sudo -n available")
    } else {
        CheckResult::ok("sudo", n, "no passwordless sudo: non-sudo paths are used")
    });
    out.push(match &f.docker {
        DockerProbe::Reachable => CheckResult::ok("docker", n, "daemon reachable"),
        DockerProbe::PingFailed(e) => CheckResult::fail(
            "docker",
            n,
            e.clone(),
            "start the Docker daemon and add the user to the docker group",
        ),
        DockerProbe::Unreachable(e) => CheckResult::fail(
            "docker",
            n,
            e.clone(),
            "the Docker socket must be reachable (through SSH for workers)",
        ),
    });
    decide_gpu(s, f, out);
    decide_memory(s, f, out);
    decide_disk(f, out);
    decide_fabric(s, f, out, &mut d);
    d
}

/// Docker's GPU runtime, the driver, and nothing else holding the GPU.
fn decide_gpu(s: &Settings, f: &NodeFacts, out: &mut Vec<CheckResult>) {
    let n = f.name.as_str();
    match &f.runtimes {
        Some(Ok(runtimes)) => {
            let observed = format!("runtimes: {}", runtimes.join(", "));
            out.push(if runtimes.iter().any(|r| r == "nvidia") {
                CheckResult::ok("docker.gpu", n, observed)
            } else if s.testbed {
                CheckResult::ok("docker.gpu", n, format!("{observed} (testbed: the stand-in needs no GPU runtime)"))
            } else {
                CheckResult::fail(
                    "docker.gpu",
                    n,
                    observed,
                    "install the NVIDIA Container Toolkit and register it: `sudo nvidia-ctk runtime configure --runtime=docker && sudo systemctl restart docker`",
                )
            });
        }
        Some(Err(e)) => out.push(CheckResult::fail(
            "docker.gpu",
            n,
            e.clone(),
            "`docker info` must answer on the node",
        )),
        None => {}
    }
    match &f.gpu_containers {
        Some(Ok(names)) if names.is_empty() => {
            out.push(CheckResult::ok(
                "gpu.containers",
                n,
                "no other GPU container",
            ));
        }
        Some(Ok(names)) => out.push(CheckResult::fail(
            "gpu.containers",
            n,
            format!("running GPU containers: {}", names.join(", ")),
            format!(
                "stop them first: `docker stop {}` (on {n})",
                names.join(" ")
            ),
        )),
        Some(Err(e)) => out.push(CheckResult::fail(
            "gpu.containers",
            n,
            e.clone(),
            "the Docker daemon must list and inspect containers",
        )),
        None => {}
    }
    if s.testbed && f.smi.is_none() {
        out.push(CheckResult::ok("gpu", n, "testbed: no GPU required"));
        return;
    }
    match &f.smi {
        Some(Err(e)) => out.push(CheckResult::fail(
            "gpu",
            n,
            e.clone(),
            "install the NVIDIA driver; `nvidia-smi` must work on every node",
        )),
        Some(Ok(_)) => out.push(match &f.gpu_model {
            Some(Ok(names)) => {
                let names: Vec<&str> = names.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
                let observed = match names.first() {
                    Some(first) if names.iter().all(|m| m == first) => format!("{} × {first}", names.len()),
                    _ => names.join(", "),
                };
                if !names.is_empty() && names.iter().all(|m| m.contains("GB10")) {
                    CheckResult::ok("gpu", n, observed)
                } else {
                    CheckResult::warn(
                        "gpu",
                        n,
                        observed,
                        "the engine profile and memory budget are made for the DGX Spark's GB10 (one GPU per node); expect other limits elsewhere",
                    )
                }
            }
            Some(Err(e)) => CheckResult::fail(
                "gpu",
                n,
                e.clone(),
                "`nvidia-smi --query-gpu=name` must work on every node",
            ),
            None => CheckResult::ok("gpu", n, "nvidia-smi answers"),
        }),
        None => {}
    }
    match &f.gpu_processes {
        Some(Ok(csv)) => {
            let procs: Vec<&str> = csv
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect();
            out.push(if procs.is_empty() {
                CheckResult::ok("gpu.processes", n, "no compute process on the GPU")
            } else if f.own_rank_running {
                CheckResult::ok(
                    "gpu.processes",
                    n,
                    format!("{} (this deployment's rank, restarted by the launch)", procs.join("; ")),
                )
            } else {
                CheckResult::fail(
                    "gpu.processes",
                    n,
                    procs.join("; "),
                    format!("stop the processes holding the GPU on {n} (`nvidia-smi` lists them; `kill <pid>` or stop their container)"),
                )
            });
        }
        Some(Err(e)) => out.push(CheckResult::warn(
            "gpu.processes",
            n,
            e.clone(),
            "`nvidia-smi --query-compute-apps` failed; check by hand that nothing holds the GPU",
        )),
        None => {}
    }
}

fn decide_memory(s: &Settings, f: &NodeFacts, out: &mut Vec<CheckResult>) {
    let n = f.name.as_str();
    let minimum = u64::from(s.min_avail_gib) * GIB;
    match &f.meminfo {
        Ok(m) => match meminfo::mem_available(m) {
            Some(avail) => {
                let shown = format!(
                    "MemAvailable {} GiB (floor {} GiB)",
                    gib(avail),
                    s.min_avail_gib
                );
                out.push(if avail >= minimum {
                    CheckResult::ok("memory.available", n, shown)
                } else {
                    CheckResult::fail(
                        "memory.available",
                        n,
                        shown,
                        format!(
                            "free memory to reach {} GiB: stop other GPU work, `sync; echo 3 | sudo tee /proc/sys/vm/drop_caches`, wait for the page cache to drop",
                            s.min_avail_gib
                        ),
                    )
                });
                out.push(memory_budget(s, n, avail));
            }
            None => out.push(CheckResult::fail(
                "memory.available",
                n,
                "no MemAvailable in /proc/meminfo",
                "a Linux kernel ≥ 3.14 reports it",
            )),
        },
        Err(e) => out.push(CheckResult::fail(
            "memory.available",
            n,
            e.clone(),
            "/proc/meminfo must be readable",
        )),
    }
}

fn decide_disk(f: &NodeFacts, out: &mut Vec<CheckResult>) {
    let n = f.name.as_str();
    // (mount, free, dirs, missing) per filesystem, in first-seen order.
    let mut fs: Vec<(String, u64, Vec<&str>, Vec<&Missing>)> = Vec::new();
    for d in &f.disks {
        let dir = d.dir.as_str();
        let parsed = match &d.df {
            Ok(t) => df_free_bytes(t).ok_or_else(|| format!("unreadable df output {t:?}")),
            Err(e) => Err(e.clone()),
        };
        match parsed {
            Ok((mount, free)) => match fs.iter_mut().find(|g| g.0 == mount) {
                Some(g) => {
                    g.2.push(dir);
                    g.3.extend(&d.missing);
                }
                None => fs.push((mount, free, vec![dir], d.missing.iter().collect())),
            },
            Err(e) => out.push(CheckResult::fail(
                "disk",
                n,
                e,
                format!("{dir} must be creatable by the SSH user and `df -Pk {dir}` must work"),
            )),
        }
    }
    for (mount, free, dirs, missing) in fs {
        let need: u64 = missing.iter().map(|m| m.bytes).sum();
        let parts = if missing.is_empty() {
            "nothing missing".to_owned()
        } else {
            missing
                .iter()
                .map(|m| format!("{} {} GiB", m.what, gib(m.bytes)))
                .collect::<Vec<_>>()
                .join(" + ")
        };
        let dirs = dirs.join(", ");
        let observed = format!(
            "need {} GiB ({parts}), {} GiB free on {mount} ({dirs})",
            gib(need),
            gib(free)
        );
        out.push(if need <= free {
            CheckResult::ok("disk", n, observed)
        } else {
            CheckResult::fail(
                "disk",
                n,
                observed,
                format!(
                    "free {} GiB on {mount} (or point the node's data_dir / hub.cache at a larger filesystem)",
                    gib(need - free)
                ),
            )
        });
    }
}

fn decide_fabric(s: &Settings, f: &NodeFacts, out: &mut Vec<CheckResult>, d: &mut Detected) {
    let n = f.name.as_str();
    let (Some(peer), Some(route_text)) = (f.peer, &f.route) else {
        out.push(CheckResult::fail(
            "fabric.addr",
            n,
            "the peer's fabric address is unknown",
            "set nodes[1].fabric_addr (FABRIC_PEER) to the worker's ConnectX-7 address",
        ));
        return;
    };
    let Some(route) = route_text.as_ref().ok().and_then(|t| roce::parse_route(t)) else {
        out.push(CheckResult::fail(
            "fabric.route",
            n,
            format!("no route to {peer}"),
            "connect the fabric link and configure its address",
        ));
        return;
    };
    match f.fabric_addr {
        Some(expected) if expected != route.src => out.push(CheckResult::fail(
            "fabric.addr",
            n,
            format!("route to {peer} leaves from {} via {}, not from the fabric address {expected}", route.src, route.dev),
            format!(
                "the peer is reachable only over another network (management?): nodes[{}].fabric_addr {expected} must be configured on the ConnectX-7 netdev and the peer's fabric address must be on its subnet (`ip -4 addr`, `ip route get {peer}`)",
                f.index
            ),
        )),
        _ => out.push(CheckResult::ok(
            "fabric.addr",
            n,
            format!("{} on {} reaches {peer}", route.src, route.dev),
        )),
    }
    if !s.testbed || f.sysfs.is_some() {
        match &f.sysfs {
            Some(Ok(sys)) => match roce::detect(sys.as_ref(), &route) {
                Ok(r) => {
                    for w in &r.warnings {
                        out.push(CheckResult::warn(
                            "fabric.roce",
                            n,
                            format!("{} GID {}", r.devices.join(","), r.gid_index),
                            w.clone(),
                        ));
                    }
                    out.push(CheckResult::ok(
                        "fabric.roce",
                        n,
                        format!(
                            "{} ACTIVE, RoCE v2 GID index {}",
                            r.devices.join(","),
                            r.gid_index
                        ),
                    ));
                    d.roce = Some(r);
                }
                Err(e) => {
                    let (o, r) = split_remedy(&e.to_string());
                    out.push(CheckResult::fail("fabric.roce", n, o, r));
                }
            },
            Some(Err(e)) => out.push(CheckResult::fail(
                "fabric.roce",
                n,
                e.clone(),
                "the sysfs dump must run on the node (sh, ls, head)",
            )),
            None => out.push(CheckResult::fail(
                "fabric.roce",
                n,
                "sysfs not collected",
                "the sysfs dump must run on the node",
            )),
        }
    }
    d.route = Some(route);
}

/// Fabric MTU across nodes: every node's fabric netdev must have the same MTU (a mismatch drops
/// jumbo frames on the larger side).
fn compare_mtu(facts: &[NodeFacts], detected: &[Detected]) -> Option<CheckResult> {
    let mtus: Vec<(&str, &str, u32)> = facts
        .iter()
        .zip(detected)
        .filter_map(|(f, d)| {
            let route = d.route.as_ref()?;
            let mtu = f.mtu.as_ref()?.as_ref().ok()?.trim().parse().ok()?;
            Some((f.name.as_str(), route.dev.as_str(), mtu))
        })
        .collect();
    if mtus.len() < 2 {
        return None;
    }
    let observed = mtus
        .iter()
        .map(|(n, dev, m)| format!("{n} {dev} {m}"))
        .collect::<Vec<_>>()
        .join("; ");
    let max = mtus.iter().map(|m| m.2).max().unwrap_or(0);
    if mtus.iter().all(|m| m.2 == max) {
        return Some(CheckResult::ok("fabric.mtu", "all", observed));
    }
    let fixes = mtus
        .iter()
        .filter(|m| m.2 != max)
        .map(|(n, dev, _)| format!("on {n}: `sudo ip link set {dev} mtu {max}`"))
        .collect::<Vec<_>>()
        .join("; ");
    Some(CheckResult::fail(
        "fabric.mtu",
        "all",
        observed,
        format!(
            "the fabric MTU must be the same on both ends; {fixes} (and persist it in netplan)"
        ),
    ))
}

/// Decides every check over the collected facts (`facts` in `nodes` order, head first).
#[must_use]
pub fn decide(settings: &Settings, facts: &[NodeFacts]) -> Decision {
    let mut results = Vec::new();
    let detected: Vec<Detected> = facts
        .iter()
        .map(|f| decide_node(settings, f, &mut results))
        .collect();
    if !settings.testbed || facts.iter().any(|f| f.smi.is_some()) {
        // A node whose nvidia-smi failed already has its row; compare the ones that answered.
        let answered: Vec<(String, Vec<smi::GpuClocks>)> = facts
            .iter()
            .filter(|f| f.reach.is_ok() && !matches!(f.smi, Some(Err(_))))
            .map(|f| {
                let g = match &f.smi {
                    Some(Ok(t)) => smi::parse_clocks(t),
                    _ => Vec::new(),
                };
                (f.name.clone(), g)
            })
            .collect();
        if !answered.is_empty() {
            results.extend(clocks::compare(&answered));
        }
    }
    results.extend(compare_mtu(facts, &detected));
    for f in facts {
        for p in &f.ports {
            results.push(if p.free {
                CheckResult::ok(&p.check, &f.name, format!("{} free", p.addr))
            } else {
                CheckResult::fail(
                    &p.check,
                    &f.name,
                    format!("{} in use", p.addr),
                    p.remedy.clone(),
                )
            });
        }
    }
    label_fixture_rows(facts, &mut results);
    Decision { results, detected }
}

/// Prefixes the GPU and RoCE rows decided on fixture facts with where they came from, so a
/// testbed's table never passes fixture data off as the node's own.
fn label_fixture_rows(facts: &[NodeFacts], results: &mut [CheckResult]) {
    let from_fixture = |node: &str| {
        facts
            .iter()
            .filter(|f| node == "all" || f.name == node)
            .filter_map(|f| f.fixture.as_deref())
            .next()
    };
    for r in results.iter_mut() {
        let fixture_check =
            r.check == "gpu" || r.check.starts_with("gpu.") || r.check == "fabric.roce";
        if r.check == "gpu.containers" || !fixture_check {
            continue;
        }
        if let Some(dir) = from_fixture(&r.node) {
            r.observed = format!("[testbed fixture {dir}] {}", r.observed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preflight::report::Verdict;
    use crate::preflight::roce::DirSysfs;

    const SMI: &str =
        include_str!("../../../../tests/fixtures/host-facts/h200x2/nvidia-smi-q-clock.txt");
    const SEED_CONTEXT: u64 = 1_048_576;

    fn seed() -> Settings {
        Settings {
            testbed: false,
            min_avail_gib: 100,
            context: SEED_CONTEXT,
            max_pool: 1_114_063,
            rank_weights: RANK_WEIGHT_BYTES,
            reserve: RESERVE_BYTES,
        }
    }

    fn ip(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

    /// A Spark-like sysfs tree (see [`crate::preflight::fixture::write_tree`]): per device
    /// `(hca, netdev, port state, v2)`, MTU 9000.
    fn tree(addr: Ipv4Addr, devs: &[(&str, &str, &str, bool)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        let rails: Vec<_> = devs
            .iter()
            .map(
                |&(hca, netdev, state, v2)| crate::preflight::fixture::Rail {
                    hca,
                    netdev,
                    state,
                    v2,
                    mtu: 9000,
                },
            )
            .collect();
        crate::preflight::fixture::write_tree(d.path(), addr, &rails).unwrap();
        d
    }

    const RAILS: [(&str, &str, &str, bool); 2] = [
        ("rocep1s0f1", "enp1s0f1np1", "4: ACTIVE", true),
        ("roceP2p1s0f1", "enP2p1s0f1np1", "4: ACTIVE", true),
    ];

    /// A healthy node; `tree` must outlive the facts' use (the sysfs reads it lazily).
    fn healthy(index: usize, t: &tempfile::TempDir) -> NodeFacts {
        let (name, ssh, me, peer) = if index == 0 {
            ("head", "local", "198.18.0.1", "198.18.0.2")
        } else {
            ("worker-1", "me@spark-2", "198.18.0.2", "198.18.0.1")
        };
        let mut f = NodeFacts::new(name, index, ssh);
        f.fabric_addr = Some(ip(me));
        f.peer = Some(ip(peer));
        f.reach = Ok(());
        f.sudo = true;
        f.docker = DockerProbe::Reachable;
        f.smi = Some(Ok(SMI.to_owned()));
        f.gpu_model = Some(Ok("NVIDIA GB10\n".to_owned()));
        f.gpu_processes = Some(Ok(String::new()));
        f.runtimes = Some(Ok(vec![
            "io.containerd.runc.v2".into(),
            "nvidia".into(),
            "runc".into(),
        ]));
        f.gpu_containers = Some(Ok(Vec::new()));
        f.meminfo = Ok(format!(
            "MemTotal: 130000000 kB\nMemAvailable: {} kB\n",
            125 * 1024 * 1024
        ));
        f.disks = vec![DiskFacts {
            dir: "/data/spark-deploy".into(),
            df: Ok(format!(
                "/dev/nvme0n1p2 3000000000 1000000000 {} 34% /",
                500 * 1024 * 1024
            )),
            missing: Vec::new(),
        }];
        f.route = Some(Ok(format!(
            "{peer} dev enp1s0f1np1 src {me} uid 1000 \\    cache "
        )));
        f.mtu = Some(Ok("9000\n".to_owned()));
        f.sysfs = Some(Ok(Box::new(DirSysfs::new(t.path()))));
        f.infiniband = true;
        f
    }

    fn pair() -> (tempfile::TempDir, tempfile::TempDir) {
        (
            tree(ip("198.18.0.1"), &RAILS),
            tree(ip("198.18.0.2"), &RAILS),
        )
    }

    fn row<'a>(d: &'a Decision, check: &str, node: &str) -> &'a CheckResult {
        d.results
            .iter()
            .find(|r| r.check == check && r.node == node)
            .unwrap_or_else(|| panic!("no {check} row for {node}: {:#?}", d.results))
    }

    fn remedy(r: &CheckResult) -> &str {
        r.remedy.as_deref().unwrap_or("")
    }

    #[test]
    fn a_healthy_pair_has_no_failure_and_detects_the_gid() {
        let (a, b) = pair();
        let d = decide(&seed(), &[healthy(0, &a), healthy(1, &b)]);
        assert!(
            d.results.iter().all(|r| r.verdict != Verdict::Fail),
            "{:#?}",
            d.results
        );
        let roce = d.detected[0].roce.as_ref().unwrap();
        assert_eq!(roce.gid_index, 3);
        assert_eq!(roce.devices, ["rocep1s0f1", "roceP2p1s0f1"]);
        assert_eq!(row(&d, "fabric.mtu", "all").verdict, Verdict::Ok);
    }

    #[test]
    fn clock_caps_differ_fails_with_the_lgc_command() {
        let (a, b) = pair();
        let mut w = healthy(1, &b);
        w.smi = Some(Ok(SMI.replace("1980 MHz", "1830 MHz")));
        let d = decide(&seed(), &[healthy(0, &a), w]);
        let r = row(&d, "gpu.clocks", "all");
        assert_eq!(r.verdict, Verdict::Fail, "{r:?}");
        assert!(
            remedy(r).contains("sudo nvidia-smi -lgc 1830,1830"),
            "{r:?}"
        );
    }

    #[test]
    fn mem_available_below_the_floor_fails() {
        let (a, b) = pair();
        let s = Settings {
            min_avail_gib: 200, // above the machine's memory
            ..seed()
        };
        let d = decide(&s, &[healthy(0, &a), healthy(1, &b)]);
        let r = row(&d, "memory.available", "worker-1");
        assert_eq!(r.verdict, Verdict::Fail);
        assert!(r.observed.contains("MemAvailable 125.0 GiB"), "{r:?}");
        assert!(remedy(r).contains("drop_caches"), "{r:?}");
    }

    #[test]
    fn disk_need_from_what_is_missing_above_free_space_fails() {
        let (a, b) = pair();
        let mut h = healthy(0, &a);
        let df = |mount: &str, gib_free: u64| {
            Ok(format!(
                "Filesystem 1024-blocks Used Available Capacity Mounted on\n/dev/x 3000000 1000000 {} 34% {mount}\n",
                gib_free * 1024 * 1024
            ))
        };
        h.disks = vec![
            DiskFacts {
                dir: "/data/spark-deploy".into(),
                df: df("/", 60),
                missing: vec![Missing {
                    what: "rank file 0".into(),
                    bytes: RANK_WEIGHT_BYTES,
                }],
            },
            DiskFacts {
                dir: "/root/.cache/huggingface".into(),
                df: df("/", 60),
                missing: vec![Missing {
                    what: "checkpoint: 1 of 40 shards".into(),
                    bytes: 5 * GIB,
                }],
            },
            DiskFacts {
                dir: "/scratch/huggingface".into(),
                df: df("/scratch", 900),
                missing: vec![Missing {
                    what: "overlay".into(),
                    bytes: 100 * GIB,
                }],
            },
        ];
        let d = decide(&seed(), &[h, healthy(1, &b)]);
        let rows: Vec<&CheckResult> = d
            .results
            .iter()
            .filter(|r| r.check == "disk" && r.node == "head")
            .collect();
        assert_eq!(rows.len(), 2, "one row per filesystem: {rows:#?}");
        let r = rows[0];
        assert_eq!(r.verdict, Verdict::Fail, "{r:?}");
        assert_eq!(
            r.observed,
            "need 103.7 GiB (rank file 0 98.7 GiB + checkpoint: 1 of 40 shards 5.0 GiB), 60.0 GiB free on / (/data/spark-deploy, /root/.cache/huggingface)"
        );
        assert!(remedy(r).contains("free 43.7 GiB on /"), "{r:?}");
        assert_eq!(rows[1].verdict, Verdict::Ok, "{:?}", rows[1]);
        // Nothing missing: any free space is enough.
        assert_eq!(row(&d, "disk", "worker-1").verdict, Verdict::Ok);
    }

    #[test]
    fn peer_reachable_only_over_the_management_address_fails() {
        let (a, b) = pair();
        let mut h = healthy(0, &a);
        h.route = Some(Ok(
            "198.18.0.2 via 10.0.0.1 dev eno1 src 10.0.0.5 uid 1000 \\    cache ".into(),
        ));
        let d = decide(&seed(), &[h, healthy(1, &b)]);
        let r = row(&d, "fabric.addr", "head");
        assert_eq!(r.verdict, Verdict::Fail, "{r:?}");
        assert!(r.observed.contains("10.0.0.5 via eno1"), "{r:?}");
        assert!(remedy(r).contains("management"), "{r:?}");
    }

    #[test]
    fn mtu_mismatch_between_the_nodes_fails() {
        let (a, b) = pair();
        let mut w = healthy(1, &b);
        w.mtu = Some(Ok("1500".into()));
        let d = decide(&seed(), &[healthy(0, &a), w]);
        let r = row(&d, "fabric.mtu", "all");
        assert_eq!(r.verdict, Verdict::Fail, "{r:?}");
        assert!(r.observed.contains("worker-1 enp1s0f1np1 1500"), "{r:?}");
        assert!(
            remedy(r).contains("on worker-1: `sudo ip link set enp1s0f1np1 mtu 9000`"),
            "{r:?}"
        );
    }

    #[test]
    fn a_gid_table_without_a_roce_v2_ipv4_entry_fails() {
        let a = tree(
            ip("198.18.0.1"),
            &[("rocep1s0f1", "enp1s0f1np1", "4: ACTIVE", false)],
        );
        let b = tree(ip("198.18.0.2"), &RAILS);
        let d = decide(&seed(), &[healthy(0, &a), healthy(1, &b)]);
        let r = row(&d, "fabric.roce", "head");
        assert_eq!(r.verdict, Verdict::Fail, "{r:?}");
        assert!(
            r.observed.contains("no RoCE v2 GID for 198.18.0.1"),
            "{r:?}"
        );
        assert!(remedy(r).contains("RoCE v1"), "{r:?}");
        assert!(d.detected[0].roce.is_none());
    }

    #[test]
    fn a_second_rail_down_fails_naming_it() {
        let a = tree(
            ip("198.18.0.1"),
            &[RAILS[0], ("roceP2p1s0f1", "enP2p1s0f1np1", "1: DOWN", true)],
        );
        let b = tree(ip("198.18.0.2"), &RAILS);
        let d = decide(&seed(), &[healthy(0, &a), healthy(1, &b)]);
        let r = row(&d, "fabric.roce", "head");
        assert_eq!(r.verdict, Verdict::Fail, "{r:?}");
        assert!(
            r.observed.contains("roceP2p1s0f1 port 1 is \"1: DOWN\""),
            "{r:?}"
        );
        assert!(remedy(r).contains("ibv_devinfo -d roceP2p1s0f1"), "{r:?}");
    }

    #[test]
    fn no_nvidia_runtime_fails_with_the_toolkit_command() {
        let (a, b) = pair();
        let mut w = healthy(1, &b);
        w.runtimes = Some(Ok(vec!["runc".into()]));
        let d = decide(&seed(), &[healthy(0, &a), w]);
        assert_eq!(row(&d, "docker.gpu", "head").verdict, Verdict::Ok);
        let r = row(&d, "docker.gpu", "worker-1");
        assert_eq!(r.verdict, Verdict::Fail);
        assert_eq!(r.observed, "runtimes: runc");
        assert!(remedy(r).contains("nvidia-ctk runtime configure"), "{r:?}");
    }

    #[test]
    fn another_gpu_container_or_process_fails_naming_it() {
        let (a, b) = pair();
        let mut h = healthy(0, &a);
        h.gpu_containers = Some(Ok(vec!["vllm-old".into()]));
        let mut w = healthy(1, &b);
        w.gpu_processes = Some(Ok("4242, python3, 81920 MiB\n".into()));
        let d = decide(&seed(), &[h, w]);
        let r = row(&d, "gpu.containers", "head");
        assert_eq!(r.verdict, Verdict::Fail);
        assert!(remedy(r).contains("docker stop vllm-old"), "{r:?}");
        let r = row(&d, "gpu.processes", "worker-1");
        assert_eq!(r.verdict, Verdict::Fail);
        assert!(r.observed.contains("4242, python3"), "{r:?}");
        // This deployment's own running rank is not a conflict (the launch restarts it).
        let mut w = healthy(1, &b);
        w.gpu_processes = Some(Ok("4242, tf-dsv41-lanes, 99000 MiB\n".into()));
        w.own_rank_running = true;
        let d = decide(&seed(), &[healthy(0, &a), w]);
        assert_eq!(row(&d, "gpu.processes", "worker-1").verdict, Verdict::Ok);
    }

    #[test]
    fn the_gpu_model_is_reported_and_a_non_spark_gpu_warns() {
        let (a, b) = pair();
        let d = decide(&seed(), &[healthy(0, &a), healthy(1, &b)]);
        let r = row(&d, "gpu", "head");
        assert_eq!(
            (r.verdict, r.observed.as_str()),
            (Verdict::Ok, "1 × NVIDIA GB10")
        );
        let mut w = healthy(1, &b);
        w.gpu_model = Some(Ok("NVIDIA H200\nNVIDIA H200\n".into()));
        let d = decide(&seed(), &[healthy(0, &a), w]);
        let r = row(&d, "gpu", "worker-1");
        assert_eq!(
            (r.verdict, r.observed.as_str()),
            (Verdict::Warn, "2 × NVIDIA H200")
        );
    }

    #[test]
    fn testbed_fixture_facts_are_decided_and_labelled() {
        let s = Settings {
            testbed: true,
            rank_weights: 0,
            ..seed()
        };
        let (a, b) = pair();
        let mut facts = [healthy(0, &a), healthy(1, &b)];
        for f in &mut facts {
            f.fixture = Some(format!("/data/{}/testbed-facts", f.name));
            f.runtimes = Some(Ok(vec!["runc".into()]));
        }
        let d = decide(&s, &facts);
        let roce = row(&d, "fabric.roce", "worker-1");
        assert_eq!(roce.verdict, Verdict::Ok);
        assert!(
            roce.observed
                .starts_with("[testbed fixture /data/worker-1/testbed-facts] rocep1s0f1"),
            "{roce:?}"
        );
        assert_eq!(d.detected[1].roce.as_ref().map(|r| r.gid_index), Some(3));
        for check in ["gpu", "gpu.processes"] {
            assert!(
                row(&d, check, "head")
                    .observed
                    .starts_with("[testbed fixture /data/head/")
            );
        }
        assert!(
            row(&d, "gpu.clocks", "all")
                .observed
                .starts_with("[testbed fixture")
        );
        // Real facts are not labelled, and the testbed needs no GPU runtime.
        let r = row(&d, "docker.gpu", "head");
        assert_eq!(r.verdict, Verdict::Ok);
        assert!(r.observed.starts_with("runtimes: runc (testbed"), "{r:?}");
        assert!(!row(&d, "fabric.addr", "head").observed.contains("fixture"));
        // A fixture that breaks a check fails it on the testbed too.
        let bad = tree(
            ip("198.18.0.2"),
            &[("rocep1s0f1", "enp1s0f1np1", "4: ACTIVE", false)],
        );
        facts[1].sysfs = Some(Ok(Box::new(DirSysfs::new(bad.path()))));
        let d = decide(&s, &facts);
        assert_eq!(row(&d, "fabric.roce", "worker-1").verdict, Verdict::Fail);
    }

    #[test]
    fn a_port_in_use_fails_with_its_remedy() {
        let (a, b) = pair();
        let mut h = healthy(0, &a);
        h.ports.push(PortProbe {
            check: "port.api".into(),
            addr: "0.0.0.0:8888".into(),
            free: false,
            remedy: "stop what listens there or change serving.port".into(),
        });
        let d = decide(&seed(), &[h, healthy(1, &b)]);
        let r = row(&d, "port.api", "head");
        assert_eq!(r.verdict, Verdict::Fail);
        assert_eq!(r.observed, "0.0.0.0:8888 in use");
        assert!(remedy(r).contains("serving.port"));
    }

    #[test]
    fn worker_ssh_refused_or_unknown_host_key_gets_a_clear_remedy() {
        let (a, b) = pair();
        let cases = [
            (
                "worker-1: cannot connect for remote commands: ssh: connect to host spark-2 port 22: Connection refused",
                "sudo systemctl enable --now ssh",
            ),
            (
                "worker-1: cannot connect for remote commands: No ED25519 host key is known for spark-2 and you have requested strict checking.\r\nHost key verification failed.",
                "ssh-keyscan -H spark-2 >> ~/.ssh/known_hosts",
            ),
            (
                "me@spark-2: Permission denied (publickey).",
                "ssh-copy-id me@spark-2",
            ),
        ];
        for (err, want) in cases {
            let mut w = healthy(1, &b);
            w.reach = Err(err.into());
            let d = decide(&seed(), &[healthy(0, &a), w]);
            let r = row(&d, "ssh", "worker-1");
            assert_eq!(r.verdict, Verdict::Fail);
            assert!(remedy(r).contains(want), "{err}: {r:?}");
            assert!(
                !d.results
                    .iter()
                    .any(|r| r.node == "worker-1" && r.check == "docker"),
                "nothing else is decided for an unreachable node"
            );
        }
    }

    #[test]
    fn the_exec_ports_error_chain_carries_sshs_reason() {
        use crate::ports::exec::ExecError;
        use crate::ports::ssh::SshError;
        let chain = |stderr: &str| {
            let e = ExecError::Connect {
                node: "worker-1".into(),
                source: Box::new(SshError::Connect {
                    node: "worker-1".into(),
                    destination: "me@spark-2".into(),
                    resolved: "me@spark-2 port 22".into(),
                    reason: "failed to connect to the remote host".into(),
                    source: openssh::Error::Connect(std::io::Error::other(stderr.to_owned())),
                }),
            };
            error_chain(&e)
        };
        let refused = chain("ssh: connect to host spark-2 port 22: Connection refused");
        assert!(refused.contains("Connection refused"), "{refused}");
        assert!(ssh_remedy(&refused, "me@spark-2").contains("start sshd"));
        let unknown = chain(
            "No ED25519 host key is known for spark-2 and you have requested strict checking.\r\nHost key verification failed.",
        );
        assert!(ssh_remedy(&unknown, "me@spark-2").contains("ssh-keyscan -H spark-2"));
    }

    #[test]
    fn seed_budget_passes_on_125_gib() {
        let r = memory_budget(&seed(), "n", 125 * GIB);
        assert_eq!(r.verdict, Verdict::Ok, "{r:?}");
        assert_eq!(
            r.observed,
            "weights 98.7 + arena 16.0 + KV 0.9 + RoPE 0.5 + reserve 4.0 = 120.1 GiB vs MemAvailable 125.0 GiB (CONTEXT 1048576)"
        );
    }

    #[test]
    fn seed_budget_fails_on_110_gib_naming_the_largest_context() {
        let r = memory_budget(&seed(), "n", 110 * GIB);
        assert_eq!(r.verdict, Verdict::Fail, "{r:?}");
        assert!(
            r.observed.contains("= 120.1 GiB vs MemAvailable 110.0 GiB"),
            "{r:?}"
        );
        let p =
            budget::largest_pool(RANK_WEIGHT_BYTES, RESERVE_BYTES, 110 * GIB, 1_114_063).unwrap();
        assert_eq!(p, 299_008, "arena 6 GiB is the last step that fits 7.3 GiB");
        assert!(remedy(&r).contains(&format!("set CONTEXT ≤ {p},")), "{r:?}");
        let over = budget::RankBudget::new(RANK_WEIGHT_BYTES, p + 2048, RESERVE_BYTES);
        assert!(over.total() > 110 * GIB, "{p} is the boundary");
    }

    #[test]
    fn seed_budget_on_100_gib_says_no_context_fits() {
        let r = memory_budget(&seed(), "n", 100 * GIB);
        assert_eq!(r.verdict, Verdict::Fail, "{r:?}");
        assert!(remedy(&r).starts_with("no CONTEXT fits"), "{r:?}");
    }

    #[test]
    fn the_testbed_needs_no_gpu_roce_or_budget() {
        let s = Settings {
            testbed: true,
            rank_weights: 0,
            ..seed()
        };
        let mut h = healthy(0, &tempfile::tempdir().unwrap());
        h.smi = None;
        h.sysfs = None;
        let d = decide(&s, &[h]);
        assert!(
            d.results.iter().all(|r| r.verdict != Verdict::Fail),
            "{:#?}",
            d.results
        );
        assert!(
            !d.results
                .iter()
                .any(|r| r.check == "fabric.roce" || r.check == "gpu.clocks")
        );
    }
}
