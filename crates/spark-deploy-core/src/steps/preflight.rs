use std::net::Ipv4Addr;
use std::path::Path;

use serde::Serialize;

use crate::config::ValidatedConfig;
use crate::context::{Context, Outcome, StepFailure};
use crate::describe::{Action, ActionDetail};
use crate::event::Level;
use crate::event::StepKind;
use crate::layout::NodeLayout;
use crate::ports::exec::{Cmd, Exec};
use crate::preflight::decide::{
    DiskFacts, DockerProbe, Missing, NodeFacts, PortProbe, RANK_WEIGHT_BYTES, Settings, decide,
    error_chain,
};
use crate::preflight::report::{PreflightReport, Verdict};
use crate::preflight::roce::{self, Sysfs};
use crate::preflight::sysfs_dump::{self, SysfsDump};

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
    /// Skip when the pair of the last launch still runs with this very config (its launch record
    /// matches): `up` on a running deployment. A launch that must restart ranks after all runs
    /// the deferred checks first.
    pub skip_when_running: bool,
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
            skip_when_running: false,
        }
    }

    /// The same checks, skipped while the recorded pair runs unchanged (the standard plan's
    /// preflight).
    #[must_use]
    pub fn skip_when_running(mut self) -> Self {
        self.skip_when_running = true;
        self
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
        let summary = if self.skip_when_running {
            "check every node before anything changes (skipped while the last launch's pair runs with this config)"
        } else {
            "check every node before anything changes"
        };
        (summary.to_owned(), actions)
    }
}

/// Why preflight stopped the deployment.
#[derive(Debug, thiserror::Error)]
#[error("preflight failed ({} check(s)); nothing was changed:\n{}", .report.failures().len(), .report.to_table())]
pub struct PreflightFailed {
    /// The whole table.
    pub report: PreflightReport,
}

/// A command's stdout as text; its error chain on failure.
async fn text(exec: &Exec, cmd: &Cmd) -> Result<String, String> {
    exec.run(cmd)
        .await
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .map_err(|e| error_chain(&e))
}

/// Expands a leading `~` of `$1` on the node (the other arguments kept), then runs the rest.
const HOME_PATH: &str =
    r#"case "$1" in "~/"*|"~") p1="$HOME${1#\~}"; shift; set -- "$p1" "$@";; esac; "#;

/// Rank files still to build on the head: `world` minus the `rank*of<world>-*.bin` files present,
/// each estimated at [`RANK_WEIGHT_BYTES`] (ENGINE-CONTRACT.md §13.4).
fn missing_rank_files(listing: &str, world: usize) -> Vec<Missing> {
    (0..world)
        .filter(|r| {
            let prefix = format!("rank{r}of{world}-");
            !listing.split_whitespace().any(|f| {
                f.rsplit('/')
                    .next()
                    .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".bin"))
            })
        })
        .map(|r| Missing {
            what: format!("rank file {r}"),
            bytes: RANK_WEIGHT_BYTES,
        })
        .collect()
}

/// Lists the newest (or the pinned) snapshot of a model in an HF cache: `$1` cache root, `$2` repo
/// folder, `$3` revision; prints the safetensors index, a marker line, then the snapshot's entries
/// (complete files only: the HF cache links a file into the snapshot once it is whole).
const SNAPSHOT_SCRIPT: &str = r#"d="$1/hub/$2/snapshots"; r="$3"
[ -d "$d" ] || exit 0
[ -d "$d/$r" ] || r=$(ls -1t "$d" 2>/dev/null | head -1)
[ -n "$r" ] || exit 0
cat "$d/$r/model.safetensors.index.json" 2>/dev/null
printf '\n@@FILES@@\n'
ls -1 "$d/$r""#;

/// Checkpoint bytes still to download, from [`SNAPSHOT_SCRIPT`]'s output: the shards the index
/// lists that the snapshot lacks, pro rata of the index's `total_size`. Without a cached index the
/// whole checkpoint is missing, estimated as the rank files together (`world` ×
/// [`RANK_WEIGHT_BYTES`], ENGINE-CONTRACT.md §13.4: the rank files split the checkpoint's weights).
fn missing_checkpoint(out: &str, world: usize) -> Vec<Missing> {
    let whole = || {
        vec![Missing {
            what: "checkpoint (not cached; estimated as the rank files together)".into(),
            bytes: RANK_WEIGHT_BYTES * world as u64,
        }]
    };
    let Some((index, files)) = out.split_once("@@FILES@@") else {
        return whole();
    };
    let Ok(index) = serde_json::from_str::<serde_json::Value>(index.trim()) else {
        return whole();
    };
    let shards: std::collections::BTreeSet<&str> = index["weight_map"]
        .as_object()
        .map(|m| m.values().filter_map(|v| v.as_str()).collect())
        .unwrap_or_default();
    let total = index["metadata"]["total_size"].as_u64();
    let (Some(total), false) = (total, shards.is_empty()) else {
        return whole();
    };
    let present: std::collections::BTreeSet<&str> = files.split_whitespace().collect();
    let missing = shards.iter().filter(|s| !present.contains(*s)).count();
    if missing == 0 {
        return Vec::new();
    }
    vec![Missing {
        what: format!("checkpoint: {missing} of {} shards", shards.len()),
        bytes: total / shards.len() as u64 * missing as u64,
    }]
}

/// How long preflight waits for `MemAvailable` to reach the floor, and how often it looks.
const MEM_WAIT: std::time::Duration = std::time::Duration::from_secs(60);
const MEM_POLL: std::time::Duration = std::time::Duration::from_secs(5);

async fn read_meminfo(exec: &Exec) -> Result<String, String> {
    exec.read_file(Path::new("/proc/meminfo"))
        .await
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .map_err(|e| error_chain(&e))
}

/// `MemAvailable` when it is readable and below `floor` (worth waiting for).
fn below_floor(meminfo: &Result<String, String>, floor: u64) -> Option<u64> {
    meminfo
        .as_ref()
        .ok()
        .and_then(|m| crate::preflight::meminfo::mem_available(m))
        .filter(|a| *a < floor)
}

/// The driver's view: on a real node `nvidia-smi`; on a testbed node the same outputs from its
/// fixture directory when there is one (the report says so), else nothing (no GPU required).
async fn gather_gpu(exec: &Exec, data_dir: &str, testbed: bool, f: &mut NodeFacts) {
    if testbed {
        let dir = format!(
            "{}/{}",
            data_dir.trim_end_matches('/'),
            crate::preflight::fixture::TESTBED_DIR
        );
        if !exec.path_exists(Path::new(&dir)).await.unwrap_or(false) {
            return;
        }
        let cat = |file: &str| Cmd::new("cat").arg(format!("{dir}/{file}"));
        f.smi = Some(text(exec, &cat("nvidia-smi-q-clock.txt")).await);
        f.gpu_model = Some(text(exec, &cat("gpu-names.txt")).await);
        f.gpu_processes = Some(text(exec, &cat("compute-apps.csv")).await);
        f.fixture = Some(dir);
        return;
    }
    let smi = |args: &[&str]| Cmd::new("nvidia-smi").args(args.iter().copied());
    f.smi = Some(text(exec, &smi(&["-q", "-d", "CLOCK"])).await);
    f.gpu_model = Some(text(exec, &smi(&["--query-gpu=name", "--format=csv,noheader"])).await);
    f.gpu_processes = Some(
        text(
            exec,
            &smi(&[
                "--query-compute-apps=pid,process_name,used_memory",
                "--format=csv,noheader",
            ]),
        )
        .await,
    );
}

/// The daemon's runtimes, the running GPU containers that are not this deployment's, and whether
/// this deployment's own rank runs there.
async fn gather_docker_gpu(ctx: &Context, d: &crate::ports::docker::DockerNode, f: &mut NodeFacts) {
    let c = ctx.config().config();
    f.runtimes = Some(
        d.info()
            .await
            .map(|i| {
                let mut r: Vec<String> = i.runtimes.unwrap_or_default().into_keys().collect();
                r.sort();
                r
            })
            .map_err(|e| error_chain(&e)),
    );
    f.gpu_containers = Some(
        d.gpu_containers()
            .await
            .map(|all| {
                all.into_iter()
                    .filter(|(_, labels)| {
                        labels.get(crate::container::labels::DEPLOYMENT) != Some(&c.deployment.name)
                    })
                    .map(|(name, _)| name)
                    .collect()
            })
            .map_err(|e| error_chain(&e)),
    );
    let own = crate::container::rank_container_name(&c.deployment.name, f.index);
    f.own_rank_running = d
        .inspect_container(&own)
        .await
        .ok()
        .flatten()
        .and_then(|i| i.state)
        .and_then(|s| s.running)
        .unwrap_or(false);
}

/// Collects the raw facts of node `index` (no decisions: see [`decide`]).
async fn gather(ctx: &Context, index: usize, peer: Option<Ipv4Addr>) -> NodeFacts {
    let c = ctx.config().config();
    let node = &c.nodes[index];
    let testbed = c.deployment.testbed;
    let mut f = NodeFacts::new(&node.name, index, &node.ssh);
    f.fabric_addr = node.fabric_addr;
    f.peer = peer;
    let exec = match ctx.exec(index).await {
        Ok(e) => e,
        Err(e) => {
            f.reach = Err(error_chain(&e));
            return f;
        }
    };
    f.reach = exec
        .run(&Cmd::new("true"))
        .await
        .map(|_| ())
        .map_err(|e| error_chain(&e));
    if f.reach.is_err() {
        return f;
    }
    f.sudo = exec
        .output(&Cmd::new("sudo").args(["-n", "true"]))
        .await
        .is_ok_and(|o| o.status.success());
    f.docker = match ctx.docker(index).await {
        Ok(d) => match d.ping().await {
            Ok(()) => DockerProbe::Reachable,
            Err(e) => DockerProbe::PingFailed(error_chain(&e)),
        },
        Err(e) => DockerProbe::Unreachable(error_chain(&e)),
    };
    if f.docker == DockerProbe::Reachable
        && let Ok(d) = ctx.docker(index).await
    {
        gather_docker_gpu(ctx, d, &mut f).await;
    }
    gather_gpu(exec, &node.data_dir, testbed, &mut f).await;
    f.meminfo = read_meminfo(exec).await;
    if !testbed {
        // Page cache may still be dropping: wait for the floor, printing the value
        // (ENGINE-CONTRACT.md §13.7, the recipes' memwait).
        let floor = u64::from(c.lifecycle.min_avail_gib) << 30;
        let started = std::time::Instant::now();
        while let Some(avail) = below_floor(&f.meminfo, floor) {
            if started.elapsed() >= MEM_WAIT || ctx.is_cancelled() {
                break;
            }
            ctx.log(
                StepKind::Preflight,
                Some(&node.name),
                Level::Info,
                format!(
                    "MemAvailable {:.1} GiB, waiting up to {} s for {} GiB (page cache may be dropping)",
                    avail as f64 / f64::from(1u32 << 30),
                    MEM_WAIT.saturating_sub(started.elapsed()).as_secs(),
                    c.lifecycle.min_avail_gib
                ),
            );
            tokio::select! {
                () = tokio::time::sleep(MEM_POLL) => {}
                () = ctx.cancelled() => break,
            }
            f.meminfo = read_meminfo(exec).await;
        }
    }
    let df = text(
        exec,
        &Cmd::shell(format!(
            "{HOME_PATH}mkdir -p -- \"$1\" && df -Pk -- \"$1\" | tail -1"
        ))
        .args(["sh", &node.data_dir]),
    )
    .await;
    let mut data = DiskFacts {
        dir: node.data_dir.clone(),
        df,
        missing: Vec::new(),
    };
    if !testbed && index == 0 {
        let world = c.nodes.len();
        let inputs = NodeLayout::of(ctx.config(), node).inputs_dir;
        let listing = text(
            exec,
            &Cmd::shell(format!(
                "{HOME_PATH}ls -1 -- \"$1\"/rank-cache 2>/dev/null; true"
            ))
            .args(["sh", &inputs]),
        )
        .await
        .unwrap_or_default();
        data.missing = missing_rank_files(&listing, world);
        f.disks.push(data);
        let cache = &c.hub.cache;
        let snapshot = text(
            exec,
            &Cmd::shell(format!("{HOME_PATH}{SNAPSHOT_SCRIPT}")).args([
                "sh",
                cache,
                &crate::layout::repo_folder(&c.model.id),
                &c.model.revision,
            ]),
        )
        .await
        .unwrap_or_default();
        // df of the cache root or its nearest existing parent (preflight creates nothing there).
        let df = text(
            exec,
            &Cmd::shell(format!(
                "{HOME_PATH}p=\"$1\"; while [ ! -e \"$p\" ]; do p=$(dirname -- \"$p\"); done; df -Pk -- \"$p\" | tail -1"
            ))
            .args(["sh", cache]),
        )
        .await;
        f.disks.push(DiskFacts {
            dir: cache.clone(),
            df,
            missing: missing_checkpoint(&snapshot, world),
        });
    } else {
        f.disks.push(data);
    }
    if let Some(peer) = peer {
        let route = text(
            exec,
            &Cmd::new("ip").args(["-o", "-4", "route", "get", &peer.to_string()]),
        )
        .await;
        if let Some(r) = route.as_ref().ok().and_then(|t| roce::parse_route(t)) {
            f.mtu = Some(
                text(
                    exec,
                    &Cmd::new("cat").arg(format!("/sys/class/net/{}/mtu", r.dev)),
                )
                .await,
            );
            let root = match (&f.fixture, testbed) {
                (Some(dir), _) => Some(format!("{dir}/sys")),
                (None, false) => Some("/sys".to_owned()),
                (None, true) => None,
            };
            if let Some(root) = root {
                f.sysfs = Some(
                    text(exec, &Cmd::shell(sysfs_dump::SCRIPT).args(["sh", &root]))
                        .await
                        .map(|t| Box::new(SysfsDump::parse(&t)) as Box<dyn Sysfs + Send + Sync>),
                );
            }
        }
        f.route = Some(route);
    }
    f.infiniband = exec
        .path_exists(Path::new("/dev/infiniband"))
        .await
        .unwrap_or(false);
    f
}

/// When the rank containers of the last launch all still run (same container IDs) and that launch
/// used this very config, restores the facts it was launched with, marks preflight deferred and
/// says why it is skipped. `None` (run the checks) in every other case, also when the record is
/// unreadable.
async fn unchanged_running_pair(ctx: &Context) -> Option<String> {
    use crate::lifecycle::launch_record;
    let state_dir = Path::new(&ctx.config().config().deployment.state_dir);
    let record = launch_record::read(state_dir).ok().flatten()?;
    if record.config_sha256 != launch_record::config_sha256(ctx.config())
        || record.ranks.len() != ctx.config().config().nodes.len()
        || record.nodes.len() != ctx.config().config().nodes.len()
    {
        return None;
    }
    for r in &record.ranks {
        let d = ctx.docker(r.node).await.ok()?;
        let info = d.inspect_container(&r.name).await.ok().flatten()?;
        let running = info.state.and_then(|s| s.running).unwrap_or(false);
        if !running || info.id.as_deref() != Some(r.id.as_str()) {
            return None;
        }
    }
    ctx.update_facts(|f| {
        f.model_commit.clone_from(&record.model_commit);
        f.nodes.clone_from(&record.nodes);
    });
    ctx.set_preflight_deferred(true);
    Some(format!(
        "both ranks run unchanged (fingerprint {}) since a launch that passed preflight with this config; `spark-deploy preflight` checks the nodes now",
        record.fingerprint.get(..12).unwrap_or(&record.fingerprint)
    ))
}

fn port_free(addr: &str) -> bool {
    std::net::TcpListener::bind(addr).is_ok()
}

impl Preflight {
    /// Checks every node in parallel, records the detected facts, and fails with the table when
    /// any check fails.
    pub(crate) async fn run(&self, ctx: &Context) -> Result<Outcome, StepFailure> {
        if self.skip_when_running
            && let Some(reason) = unchanged_running_pair(ctx).await
        {
            return Ok(Outcome::Skipped { reason });
        }
        self.check(ctx).await
    }

    /// Runs every check (also the deferred preflight of a launch that must restart the ranks).
    pub(crate) async fn check(&self, ctx: &Context) -> Result<Outcome, StepFailure> {
        ctx.set_preflight_deferred(false);
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
        let mut facts =
            futures::future::join_all((0..c.nodes.len()).map(|i| gather(ctx, i, peers[i]))).await;
        let api = format!("{}:{}", c.serving.host, c.serving.port);
        // A port held by this deployment's own running rank 0 is not a conflict (second `up`).
        let ours = match ctx.docker(0).await {
            Ok(d) => d
                .inspect_container(&crate::container::rank_container_name(
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
        let head_src = facts[0]
            .route
            .as_ref()
            .and_then(|r| r.as_ref().ok())
            .and_then(|t| roce::parse_route(t))
            .map(|r| r.src);
        facts[0].ports.push(PortProbe {
            check: "port.api".into(),
            free: ours || port_free(&api),
            addr: api,
            remedy: "stop what listens there (`spark-deploy down` if it is an old deployment) or change serving.port".into(),
        });
        if let Some(a) = head_src {
            let rdv = format!("{a}:{}", c.engine.rendezvous_port);
            facts[0].ports.push(PortProbe {
                check: "port.rendezvous".into(),
                free: ours || port_free(&rdv),
                addr: rdv,
                remedy: "stop the old rank 0 or change engine.rendezvous_port".into(),
            });
        }
        let decision = decide(&Settings::of(ctx.config()), &facts);
        let report = PreflightReport {
            results: decision.results,
        };
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
        ctx.set_preflight_report(report.clone());
        if report.verdict() == Verdict::Fail {
            return Err(StepFailure::new(
                StepKind::Preflight,
                PreflightFailed { report },
                Some("fix the failed checks; nothing was changed".into()),
            ));
        }
        let testbed = c.deployment.testbed;
        ctx.update_facts(|facts| {
            for (nf, f) in facts.nodes.iter_mut().zip(&decision.detected) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_rank_files_counts_what_is_not_built() {
        let listing = "rank0of2-0123456789abcdef0123.bin\nrank1of4-ffff.bin\nnotes.txt\n";
        let m = missing_rank_files(listing, 2);
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].what, "rank file 1");
        assert_eq!(m[0].bytes, RANK_WEIGHT_BYTES);
        assert_eq!(missing_rank_files("", 2).len(), 2);
    }

    #[test]
    fn missing_checkpoint_counts_the_shards_not_in_the_snapshot() {
        let index = r#"{"metadata": {"total_size": 400}, "weight_map": {
            "a.w": "model-00001-of-00004.safetensors", "b.w": "model-00002-of-00004.safetensors",
            "c.w": "model-00003-of-00004.safetensors", "d.w": "model-00004-of-00004.safetensors",
            "e.w": "model-00004-of-00004.safetensors"}}"#;
        let out = format!(
            "{index}\n@@FILES@@\nconfig.json\nmodel-00001-of-00004.safetensors\nmodel-00003-of-00004.safetensors\nmodel.safetensors.index.json\n"
        );
        let m = missing_checkpoint(&out, 2);
        assert_eq!(
            m,
            [Missing {
                what: "checkpoint: 2 of 4 shards".into(),
                bytes: 200
            }]
        );
        let all = format!(
            "{index}\n@@FILES@@\nmodel-00001-of-00004.safetensors\nmodel-00002-of-00004.safetensors\nmodel-00003-of-00004.safetensors\nmodel-00004-of-00004.safetensors\n"
        );
        assert!(missing_checkpoint(&all, 2).is_empty());
        // Nothing cached (or no index yet): the whole checkpoint, estimated.
        for out in ["", "\n@@FILES@@\nconfig.json\n"] {
            let m = missing_checkpoint(out, 2);
            assert_eq!(m.len(), 1);
            assert_eq!(m[0].bytes, 2 * RANK_WEIGHT_BYTES);
        }
    }

    #[test]
    fn the_snapshot_script_reads_a_real_cache_layout() {
        let t = tempfile::tempdir().unwrap();
        let snap = t.path().join("hub/models--o--m/snapshots/0123abcd");
        std::fs::create_dir_all(&snap).unwrap();
        std::fs::write(
            snap.join("model.safetensors.index.json"),
            r#"{"metadata": {"total_size": 90}, "weight_map": {"a": "s1.safetensors", "b": "s2.safetensors", "c": "s3.safetensors"}}"#,
        )
        .unwrap();
        std::fs::write(snap.join("s2.safetensors"), b"x").unwrap();
        let run = |cache: &str, rev: &str| {
            let o = std::process::Command::new("sh")
                .args(["-c", &format!("{HOME_PATH}{SNAPSHOT_SCRIPT}")])
                .args(["sh", cache, "models--o--m", rev])
                .output()
                .unwrap();
            assert!(o.status.success());
            String::from_utf8(o.stdout).unwrap()
        };
        let cache = t.path().to_str().unwrap();
        for rev in ["main", "0123abcd"] {
            let m = missing_checkpoint(&run(cache, rev), 2);
            assert_eq!(m[0].what, "checkpoint: 2 of 3 shards", "{rev}");
            assert_eq!(m[0].bytes, 60);
        }
        let empty = t.path().join("elsewhere");
        let m = missing_checkpoint(&run(empty.to_str().unwrap(), "main"), 2);
        assert_eq!(m[0].bytes, 2 * RANK_WEIGHT_BYTES);
    }

    #[test]
    fn only_a_readable_value_below_the_floor_is_waited_for() {
        let m = Ok("MemAvailable: 1048576 kB\n".to_owned());
        assert_eq!(below_floor(&m, 2 << 30), Some(1 << 30));
        assert_eq!(below_floor(&m, 1 << 30), None);
        assert_eq!(below_floor(&Err("x".into()), 2 << 30), None);
        assert_eq!(below_floor(&Ok("MemTotal: 5 kB".into()), 2 << 30), None);
    }

    #[test]
    fn a_port_in_use_is_seen_on_loopback() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        assert!(!port_free(&addr));
        drop(l);
        assert!(port_free(&addr));
    }
}
