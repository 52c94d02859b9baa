use std::net::Ipv4Addr;
use std::path::Path;

use serde::Serialize;

use crate::config::ValidatedConfig;
use crate::event::Level;
use crate::layout::NodeLayout;
use crate::plan::StepKind;
use crate::plan::describe::{Action, ActionDetail};
use crate::ports::exec::{Cmd, Exec};
use crate::preflight::report::{CheckResult, PreflightReport, Verdict};
use crate::preflight::roce::{self, Route};
use crate::preflight::sysfs_dump::{self, SysfsDump};
use crate::preflight::{budget, clocks, meminfo, smi};
use crate::run::{Context, Outcome, StepFailure};

/// Checks every node before anything changes: SSH, Docker, GPU and clocks, memory, disk, fabric,
/// ports. Runs on all nodes in parallel (head locally, workers through the Exec port).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Preflight {
    /// Nodes checked, head first.
    pub nodes: Vec<String>,
    /// `MemAvailable` floor, GiB.
    pub min_avail_gib: u32,
    /// API port that must be free on the head.
    pub api_port: u16,
    /// Rendezvous port that must be free on the head's fabric address.
    pub rendezvous_port: u16,
}

impl Preflight {
    /// The preflight of `config`.
    #[must_use]
    pub fn new(config: &ValidatedConfig) -> Self {
        let c = config.config();
        Self {
            nodes: c.nodes.iter().map(|n| n.name.clone()).collect(),
            min_avail_gib: c.lifecycle.min_avail_gib,
            api_port: c.serving.port,
            rendezvous_port: c.engine.rendezvous_port,
        }
    }

    pub(crate) fn describe(&self) -> (String, Vec<Action>) {
        let actions = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, node)| {
                let mut checks = vec![
                    if i == 0 { "exec: local".to_owned() } else { "ssh: BatchMode key login, host key known; sudo -n".to_owned() },
                    "docker: daemon reachable, GPU device requests available, no other GPU container".to_owned(),
                    "gpu: nvidia-smi, model, clock caps equal on every node".to_owned(),
                    format!("memory: MemAvailable >= {} GiB; budget of weights + arena + KV for the pool", self.min_avail_gib),
                    "disk: space for what is still missing".to_owned(),
                    "fabric: address local on its netdev, peer reachable, RoCE devices ACTIVE, RoCE v2 GID index".to_owned(),
                ];
                if i == 0 {
                    checks.push(format!("ports: {} (API) and {} (rendezvous) free", self.api_port, self.rendezvous_port));
                }
                Action::with(node, "collect facts and decide", ActionDetail::Checks { checks })
            })
            .collect();
        (
            "check every node before anything changes".to_owned(),
            actions,
        )
    }
}

/// Why preflight stopped the deployment.
#[derive(Debug, thiserror::Error)]
#[error("preflight failed ({} check(s)); nothing was changed:\n{}", .report.failures().len(), .report.to_table())]
pub struct PreflightFailed {
    /// The whole table.
    pub report: PreflightReport,
}

/// Rank weights assumed by the memory budget before the rank file exists (ENGINE-CONTRACT.md §13.4).
const REAL_RANK_BYTES: u64 = 106_000_000_000;
const GIB: u64 = 1 << 30;

/// Facts of one node gathered by [`gather`].
struct NodeFindings {
    results: Vec<CheckResult>,
    gpus: Vec<smi::GpuClocks>,
    route: Option<Route>,
    roce: Option<roce::RoceFacts>,
    infiniband: bool,
}

async fn text(exec: &Exec, cmd: &Cmd) -> Result<String, String> {
    exec.run(cmd)
        .await
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .map_err(|e| e.to_string())
}

async fn gather(ctx: &Context, index: usize, peer: Option<Ipv4Addr>) -> NodeFindings {
    let c = ctx.config().config();
    let node = &c.nodes[index];
    let n = node.name.as_str();
    let testbed = c.deployment.testbed;
    let mut f = NodeFindings {
        results: Vec::new(),
        gpus: Vec::new(),
        route: None,
        roce: None,
        infiniband: false,
    };
    let exec = match ctx.exec(index).await {
        Ok(e) => e,
        Err(e) => {
            f.results.push(CheckResult::fail(
                "ssh",
                n,
                e.to_string(),
                format!(
                    "check `ssh -o BatchMode=yes {}` works with the configured key and known_hosts",
                    node.ssh
                ),
            ));
            return f;
        }
    };
    match exec.run(&Cmd::new("true")).await {
        Ok(_) => f.results.push(CheckResult::ok(
            if index == 0 { "exec" } else { "ssh" },
            n,
            if index == 0 {
                "local".to_owned()
            } else {
                format!("BatchMode login to {} with host key checking", node.ssh)
            },
        )),
        Err(e) => f.results.push(CheckResult::fail(
            "ssh",
            n,
            e.to_string(),
            "fix SSH access before anything else",
        )),
    }
    let sudo = exec
        .output(&Cmd::new("sudo").args(["-n", "true"]))
        .await
        .is_ok_and(|o| o.status.success());
    f.results.push(if sudo {
        CheckResult::ok("sudo", n, "sudo -n available")
    } else {
        CheckResult::ok("sudo", n, "no passwordless sudo: non-sudo paths are used")
    });
    match ctx.docker(index).await {
        Ok(d) => match d.ping().await {
            Ok(()) => f
                .results
                .push(CheckResult::ok("docker", n, "daemon reachable")),
            Err(e) => f.results.push(CheckResult::fail(
                "docker",
                n,
                e.to_string(),
                "start the Docker daemon and add the user to the docker group",
            )),
        },
        Err(e) => f.results.push(CheckResult::fail(
            "docker",
            n,
            e.to_string(),
            "the Docker socket must be reachable (through SSH for workers)",
        )),
    }
    // GPU clocks.
    if testbed {
        f.results
            .push(CheckResult::ok("gpu", n, "testbed: no GPU required"));
    } else {
        match text(exec, &Cmd::new("nvidia-smi").args(["-q", "-d", "CLOCK"])).await {
            Ok(t) => f.gpus = smi::parse_clocks(&t),
            Err(e) => f.results.push(CheckResult::fail(
                "gpu",
                n,
                e,
                "install the NVIDIA driver; `nvidia-smi` must work on every node",
            )),
        }
    }
    // Memory.
    let minimum = u64::from(c.lifecycle.min_avail_gib) * GIB;
    match exec
        .read_file(Path::new("/proc/meminfo"))
        .await
        .map(|b| String::from_utf8_lossy(&b).into_owned())
    {
        Ok(m) => match meminfo::mem_available(&m) {
            Some(avail) => {
                let shown = format!("MemAvailable {:.1} GiB", avail as f64 / GIB as f64);
                f.results.push(if testbed || avail >= minimum {
                    CheckResult::ok("memory.available", n, shown)
                } else {
                    CheckResult::fail("memory.available", n, shown, format!("free memory to reach {} GiB: stop other GPU work, `sync; echo 3 | sudo tee /proc/sys/vm/drop_caches`", c.lifecycle.min_avail_gib))
                });
                let weights = if testbed { 0 } else { REAL_RANK_BYTES };
                let b = budget::RankBudget::new(weights, c.serving.context, 2 * GIB);
                let need = format!(
                    "budget {:.1} GiB (weights + arena + KV + RoPE + 2 GiB) for context {}",
                    b.total() as f64 / GIB as f64,
                    c.serving.context
                );
                if testbed || b.total() <= avail {
                    f.results.push(CheckResult::ok("memory.budget", n, need));
                } else {
                    let remedy = budget::largest_pool(
                        weights,
                        2 * GIB,
                        avail,
                        ctx.config().limits().max_pool,
                    )
                    .map_or_else(
                        || "no context fits this node's available memory".to_owned(),
                        |p| format!("set CONTEXT ≤ {p} (the largest pool that fits)"),
                    );
                    f.results
                        .push(CheckResult::fail("memory.budget", n, need, remedy));
                }
            }
            None => f.results.push(CheckResult::fail(
                "memory.available",
                n,
                "no MemAvailable in /proc/meminfo",
                "a Linux kernel ≥ 3.14 reports it",
            )),
        },
        Err(e) => f.results.push(CheckResult::fail(
            "memory.available",
            n,
            e.to_string(),
            "/proc/meminfo must be readable",
        )),
    }
    // Disk under the data directory.
    let data_dir = &node.data_dir;
    match text(
        exec,
        &Cmd::shell("mkdir -p -- \"$1\" && df -Pk -- \"$1\" | tail -1").args(["sh", data_dir]),
    )
    .await
    {
        Ok(t) => {
            let avail_kib: u64 = t
                .split_whitespace()
                .nth(3)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            f.results.push(CheckResult::ok(
                "disk",
                n,
                format!(
                    "{:.1} GiB free under {data_dir}",
                    (avail_kib * 1024) as f64 / GIB as f64
                ),
            ));
        }
        Err(e) => f.results.push(CheckResult::fail(
            "disk",
            n,
            e,
            format!("{data_dir} must be creatable by the SSH user"),
        )),
    }
    // Fabric.
    if let Some(peer) = peer {
        match text(
            exec,
            &Cmd::new("ip").args(["-o", "-4", "route", "get", &peer.to_string()]),
        )
        .await
        .map(|t| roce::parse_route(&t))
        {
            Ok(Some(route)) => {
                let expected = node.fabric_addr;
                if expected.is_some_and(|a| a != route.src) {
                    f.results.push(CheckResult::fail("fabric.addr", n, format!("route to {peer} leaves from {} via {}", route.src, route.dev), format!("nodes[{index}].fabric_addr is {}: the fabric address must be local to the fabric netdev (management and fabric addresses mixed up?)", expected.unwrap_or(route.src))));
                } else {
                    f.results.push(CheckResult::ok(
                        "fabric.addr",
                        n,
                        format!("{} on {} reaches {peer}", route.src, route.dev),
                    ));
                }
                if !testbed {
                    let dump = text(exec, &Cmd::shell(sysfs_dump::SCRIPT))
                        .await
                        .map(|t| SysfsDump::parse(&t));
                    match dump
                        .map_err(|e| e.clone())
                        .and_then(|d| roce::detect(&d, &route).map_err(|e| e.to_string()))
                    {
                        Ok(r) => {
                            for w in &r.warnings {
                                f.results.push(CheckResult::warn(
                                    "fabric.roce",
                                    n,
                                    format!("{} GID {}", r.devices.join(","), r.gid_index),
                                    w.clone(),
                                ));
                            }
                            f.results.push(CheckResult::ok(
                                "fabric.roce",
                                n,
                                format!(
                                    "{} ACTIVE, RoCE v2 GID index {}",
                                    r.devices.join(","),
                                    r.gid_index
                                ),
                            ));
                            f.roce = Some(r);
                        }
                        Err(e) => f.results.push(CheckResult::fail(
                            "fabric.roce",
                            n,
                            e,
                            "see the message",
                        )),
                    }
                }
                f.route = Some(route);
            }
            Ok(None) | Err(_) => f.results.push(CheckResult::fail(
                "fabric.route",
                n,
                format!("no route to {peer}"),
                "connect the fabric link and configure its address",
            )),
        }
    } else {
        f.results.push(CheckResult::fail(
            "fabric.addr",
            n,
            "the peer's fabric address is unknown",
            "set nodes[1].fabric_addr (FABRIC_PEER) to the worker's ConnectX-7 address",
        ));
    }
    f.infiniband = exec
        .path_exists(Path::new("/dev/infiniband"))
        .await
        .unwrap_or(false);
    let _ = NodeLayout::of(ctx.config(), node);
    f
}

fn port_free(addr: &str) -> bool {
    std::net::TcpListener::bind(addr).is_ok()
}

impl Preflight {
    /// Checks every node in parallel, records the detected facts, and fails with the table when
    /// any check fails.
    pub(crate) async fn run(&self, ctx: &Context) -> Result<Outcome, StepFailure> {
        let c = ctx.config().config();
        let addrs: Vec<Option<Ipv4Addr>> = c.nodes.iter().map(|n| n.fabric_addr).collect();
        let peers: Vec<Option<Ipv4Addr>> = (0..c.nodes.len())
            .map(|i| {
                if i == 0 {
                    addrs.get(1).copied().flatten()
                } else {
                    addrs[0]
                }
            })
            .collect();
        let findings =
            futures::future::join_all((0..c.nodes.len()).map(|i| gather(ctx, i, peers[i]))).await;
        let mut report = PreflightReport::default();
        for f in &findings {
            report.results.extend(f.results.iter().cloned());
        }
        if !c.deployment.testbed {
            let gpus: Vec<(String, Vec<smi::GpuClocks>)> = c
                .nodes
                .iter()
                .zip(&findings)
                .map(|(n, f)| (n.name.clone(), f.gpus.clone()))
                .collect();
            report.results.extend(clocks::compare(&gpus));
        }
        let head_addr = findings[0].route.as_ref().map(|r| r.src);
        let api = format!("{}:{}", c.serving.host, c.serving.port);
        let ours = match ctx.docker(0).await {
            Ok(d) => d
                .inspect_container(&crate::engine::tensorfold::launch::container_name(
                    &c.deployment.name,
                    0,
                ))
                .await
                .ok()
                .flatten()
                .and_then(|i| i.state)
                .and_then(|s| s.running)
                .unwrap_or(false),
            Err(_) => false,
        };
        report.results.push(if ours {
            CheckResult::ok("port.api", &c.nodes[0].name, format!("{api} served by this deployment's rank 0"))
        } else if port_free(&api) { CheckResult::ok("port.api", &c.nodes[0].name, format!("{api} free")) } else { CheckResult::fail("port.api", &c.nodes[0].name, format!("{api} in use"), "stop what listens there (`spark-deploy down` if it is an old deployment) or change serving.port") });
        if let Some(a) = head_addr {
            let rdv = format!("{a}:{}", c.engine.rendezvous_port);
            report.results.push(if ours || port_free(&rdv) {
                CheckResult::ok("port.rendezvous", &c.nodes[0].name, format!("{rdv} free"))
            } else {
                CheckResult::fail(
                    "port.rendezvous",
                    &c.nodes[0].name,
                    format!("{rdv} in use"),
                    "stop the old rank 0 or change engine.rendezvous_port",
                )
            });
        }
        for r in &report.results {
            let level = match r.verdict {
                Verdict::Ok => Level::Info,
                Verdict::Warn => Level::Warn,
                Verdict::Fail => Level::Error,
            };
            let remedy = r
                .remedy
                .as_ref()
                .map_or_else(String::new, |m| format!(" — {m}"));
            ctx.log(
                StepKind::Preflight,
                Some(&r.node),
                level,
                format!("{}: {}{remedy}", r.check, r.observed),
            );
        }
        if report.verdict() == Verdict::Fail {
            return Err(StepFailure::new(
                StepKind::Preflight,
                PreflightFailed { report },
                Some("fix the failed checks; nothing was changed".into()),
            ));
        }
        let testbed = c.deployment.testbed;
        ctx.update_facts(|facts| {
            for (nf, f) in facts.nodes.iter_mut().zip(&findings) {
                if let Some(r) = &f.route {
                    nf.fabric_addr = r.src.to_string();
                    nf.netdev = r.dev.clone();
                }
                nf.rdma_devices = f.roce.as_ref().map(|r| r.devices.join(","));
                nf.gid_index = f.roce.as_ref().map(|r| r.gid_index.to_string());
                nf.infiniband_device = f.infiniband.then(|| "/dev/infiniband".to_owned());
                nf.gpu = !testbed;
            }
        });
        Ok(Outcome::Done { bytes: None })
    }
}
