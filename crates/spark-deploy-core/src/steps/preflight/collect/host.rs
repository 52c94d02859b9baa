//! The node's own facts: the GPU through `nvidia-smi`, the GPU containers in its Docker, its
//! memory (waiting for page cache to drop), and the route, MTU and RoCE sysfs toward its peer.

use std::net::Ipv4Addr;

use crate::config::NodeConfig;
use crate::context::Context;
use crate::event::Level;
use crate::event::StepKind;
use crate::ports::exec::{Cmd, Exec};
use crate::preflight::decide::error_chain;
use crate::preflight::roce::{self, Sysfs};
use crate::preflight::sysfs_dump::{self, SysfsDump};

use super::text;

/// `program args...` on `node`, its `path` directories searched first.
pub(super) fn tool(node: &NodeConfig, program: &str, args: &[&str]) -> Cmd {
    if node.path.is_empty() {
        return Cmd::new(program).args(args.iter().copied());
    }
    Cmd::shell(r#"PATH="$1:$PATH"; shift; exec "$@""#)
        .args(["sh", &node.path.join(":"), program])
        .args(args.iter().copied())
}

/// How long preflight waits for `MemAvailable` to reach the floor, and how often it looks.
const MEM_WAIT: std::time::Duration = std::time::Duration::from_secs(60);
const MEM_POLL: std::time::Duration = std::time::Duration::from_secs(5);

async fn read_meminfo(exec: &Exec, node: &NodeConfig) -> Result<String, String> {
    exec.read_file(&node.meminfo_path())
        .await
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .map_err(|e| error_chain(&e))
}

/// `MemAvailable` when it is readable and below `floor`, and the floor is reachable at all
/// (`MemTotal` reaches it): worth waiting for.
pub(super) fn below_floor(meminfo: &Result<String, String>, floor: u64) -> Option<u64> {
    use crate::preflight::meminfo::{mem_available, mem_total};
    let m = meminfo.as_ref().ok()?;
    if mem_total(m).is_some_and(|t| t < floor) {
        return None;
    }
    mem_available(m).filter(|a| *a < floor)
}

/// The driver's view through `nvidia-smi`: its clocks report, the GPU's name and its compute
/// processes.
pub(super) struct GpuView {
    pub(super) smi: Result<String, String>,
    pub(super) model: Result<String, String>,
    pub(super) processes: Result<String, String>,
}

/// The driver's view through `nvidia-smi` on the node (its `path` searched first), one query
/// after the other (preflight runs its other questions beside these: see `gather`).
pub(super) async fn gather_gpu(exec: &Exec, node: &NodeConfig) -> GpuView {
    let smi = |args: &[&str]| tool(node, "nvidia-smi", args);
    GpuView {
        smi: text(exec, &smi(&["-q", "-d", "CLOCK"])).await,
        model: text(exec, &smi(&["--query-gpu=name", "--format=csv,noheader"])).await,
        processes: text(
            exec,
            &smi(&[
                "--query-compute-apps=pid,process_name,used_memory",
                "--format=csv,noheader",
            ]),
        )
        .await,
    }
}

/// The daemon's runtimes, the running GPU containers that are not this deployment's, and whether
/// this deployment's own rank runs there.
pub(super) struct DockerView {
    pub(super) runtimes: Result<Vec<String>, String>,
    pub(super) gpu_containers: Result<Vec<String>, String>,
    pub(super) own_rank_running: bool,
}

/// [`DockerView`] of node `index` through its daemon `d`, the three questions at once.
pub(super) async fn gather_docker_gpu(
    ctx: &Context,
    d: &crate::ports::docker::DockerNode,
    index: usize,
) -> DockerView {
    let c = ctx.config().config();
    let own = crate::container::rank_container_name(&c.deployment.name, index);
    let (info, gpu, mine) = tokio::join!(d.info(), d.gpu_containers(), d.inspect_container(&own));
    DockerView {
        runtimes: info
            .map(|i| {
                let mut r: Vec<String> = i.runtimes.unwrap_or_default().into_keys().collect();
                r.sort();
                r
            })
            .map_err(|e| error_chain(&e)),
        gpu_containers: gpu
            .map(|all| {
                all.into_iter()
                    .filter(|(_, labels)| {
                        labels.get(crate::container::labels::DEPLOYMENT) != Some(&c.deployment.name)
                    })
                    .map(|(name, _)| name)
                    .collect()
            })
            .map_err(|e| error_chain(&e)),
        own_rank_running: mine
            .ok()
            .flatten()
            .and_then(|i| i.state)
            .and_then(|s| s.running)
            .unwrap_or(false),
    }
}

/// `MemAvailable`, waiting up to [`MEM_WAIT`] for it to reach the floor while page cache may
/// still be dropping (a fragmented host can take long to free memory after the last run).
pub(super) async fn gather_memory(
    ctx: &Context,
    exec: &Exec,
    node: &NodeConfig,
) -> Result<String, String> {
    let min_gib = ctx.config().config().lifecycle.min_avail_gib;
    let floor = u64::from(min_gib) << 30;
    let mut meminfo = read_meminfo(exec, node).await;
    let started = std::time::Instant::now();
    while let Some(avail) = below_floor(&meminfo, floor) {
        if started.elapsed() >= MEM_WAIT || ctx.is_cancelled() || ctx.is_dry_run() {
            break;
        }
        ctx.log(
            StepKind::Preflight,
            Some(&node.name),
            Level::Info,
            format!(
                "MemAvailable {:.1} GiB, waiting up to {} s for {min_gib} GiB (page cache may be dropping)",
                avail as f64 / f64::from(1u32 << 30),
                MEM_WAIT.saturating_sub(started.elapsed()).as_secs(),
            ),
        );
        tokio::select! {
            () = tokio::time::sleep(MEM_POLL) => {}
            () = ctx.cancelled() => break,
        }
        meminfo = read_meminfo(exec, node).await;
    }
    meminfo
}

/// The route to the peer, the MTU of its netdev and the RoCE part of the node's sysfs.
pub(super) struct FabricView {
    pub(super) route: Result<String, String>,
    pub(super) mtu: Option<Result<String, String>>,
    pub(super) sysfs: Option<Result<Box<dyn Sysfs + Send + Sync>, String>>,
}

/// [`FabricView`] of the node, read below its `sysfs_root` (the MTU and the RoCE part at once,
/// once the route names the netdev).
pub(super) async fn gather_fabric(exec: &Exec, node: &NodeConfig, peer: Ipv4Addr) -> FabricView {
    let route = text(
        exec,
        &Cmd::new("ip").args(["-o", "-4", "route", "get", &peer.to_string()]),
    )
    .await;
    let (mut mtu, mut sysfs) = (None, None);
    if let Some(r) = route.as_ref().ok().and_then(|t| roce::parse_route(t)) {
        let root = node.sysfs_root.trim_end_matches('/');
        let mtu_cmd = Cmd::new("cat").arg(format!("{root}/class/net/{}/mtu", r.dev));
        let dump_cmd = Cmd::shell(sysfs_dump::SCRIPT).args(["sh", root]);
        let (m, dump) = tokio::join!(text(exec, &mtu_cmd), text(exec, &dump_cmd));
        mtu = Some(m);
        sysfs = Some(dump.map(|t| Box::new(SysfsDump::parse(&t)) as Box<dyn Sysfs + Send + Sync>));
    }
    FabricView { route, mtu, sysfs }
}
