//! Collecting the raw facts of each node through its Exec and Docker ports (no decisions: see
//! `preflight::decide`), and what the head's disk holds of the inputs.
//!
//! The node's own facts (GPU, Docker, memory, fabric) are in `host`; what the disks hold and still
//! need of the inputs is in `disk_need`; this module runs them per node and reads `df` and sizes.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::Path;

use crate::config::WorkerStorage;
use crate::context::Context;
use crate::engine::Engine;
use crate::layout::NodeLayout;
use crate::ports::exec::{Cmd, Exec};
use crate::preflight::decide::{DiskFacts, DockerProbe, EngineFiles, NodeFacts, error_chain};
use crate::preflight::exports::EXPORTS_SCRIPT;
use crate::preflight::inputs::{HOME_PATH, HeadInputs, SIZES_SCRIPT, parse_sizes};

mod disk_need;
mod host;

use disk_need::gather_head_inputs;
pub(super) use disk_need::{settle_inputs, settle_shares};
use host::{FabricView, GpuView, gather_docker_gpu, gather_fabric, gather_gpu, gather_memory};

/// A command's stdout as text; its error chain on failure.
async fn text(exec: &Exec, cmd: &Cmd) -> Result<String, String> {
    exec.run(cmd)
        .await
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .map_err(|e| error_chain(&e))
}

/// `df` of `dir` (or of its nearest existing parent: preflight creates nothing) with nothing
/// known to be missing there yet.
async fn disk_of(exec: &Exec, dir: &str) -> DiskFacts {
    let df = text(
        exec,
        &Cmd::shell(format!(
            "{HOME_PATH}d=\"$1\"; while [ ! -e \"$d\" ] && [ \"$d\" != / ]; do d=$(dirname -- \"$d\"); done; df -Pk -- \"$d\" | tail -1"
        ))
        .args(["sh", dir]),
    )
    .await;
    DiskFacts {
        dir: dir.to_owned(),
        df,
        missing: Vec::new(),
        linked_from: None,
    }
}

/// `df` of `dir` or its nearest existing parent (creating nothing).
async fn df_nearest(exec: &Exec, dir: &str) -> Result<String, String> {
    text(
        exec,
        &Cmd::shell(format!(
            "{HOME_PATH}p=\"$1\"; while [ ! -e \"$p\" ]; do p=$(dirname -- \"$p\"); done; df -Pk -- \"$p\" | tail -1"
        ))
        .args(["sh", dir]),
    )
    .await
}

/// [`SIZES_SCRIPT`] of `dir` on a node: relative path → bytes (nothing when unreadable).
async fn sizes(exec: &Exec, dir: &str) -> BTreeMap<String, u64> {
    let out = text(
        exec,
        &Cmd::shell(format!("{HOME_PATH}{SIZES_SCRIPT}")).args(["sh", dir]),
    )
    .await
    .unwrap_or_default();
    parse_sizes(&out)
}

/// Collects the raw facts of node `index` (no decisions: see [`decide`]); for the head also what
/// its disk holds of the inputs.
pub(super) async fn gather(
    ctx: &Context,
    index: usize,
    peer: Option<Ipv4Addr>,
) -> (NodeFacts, Option<(HeadInputs, DiskFacts)>) {
    let c = ctx.config().config();
    let node = &c.nodes[index];
    let mut f = NodeFacts::new(&node.name, index, &node.ssh);
    f.fabric_addr = node.fabric_addr;
    f.peer = peer;
    // Docker has its own connection to the node (its socket forwarded over SSH): probed beside
    // everything else, from the start.
    let docker = async {
        match ctx.docker(index).await {
            Ok(d) => match d.ping().await {
                Ok(()) => (
                    DockerProbe::Reachable,
                    Some(gather_docker_gpu(ctx, d, index).await),
                ),
                Err(e) => (DockerProbe::PingFailed(error_chain(&e)), None),
            },
            Err(e) => (DockerProbe::Unreachable(error_chain(&e)), None),
        }
    };
    let ((docker, docker_view), host) = tokio::join!(docker, gather_host(ctx, index, peer));
    let host = match host {
        Ok(h) => h,
        Err(e) => {
            f.reach = Err(e);
            return (f, None);
        }
    };
    f.reach = Ok(());
    f.docker = docker;
    if let Some(v) = docker_view {
        f.runtimes = Some(v.runtimes);
        f.gpu_containers = Some(v.gpu_containers);
        f.own_rank_running = v.own_rank_running;
    }
    f.sudo = host.sudo;
    f.smi = Some(host.gpu.smi);
    f.gpu_model = Some(host.gpu.model);
    f.gpu_processes = Some(host.gpu.processes);
    f.meminfo = host.meminfo;
    f.disks.push(host.disk);
    if let Some(v) = host.fabric {
        f.route = Some(v.route);
        f.mtu = v.mtu;
        f.sysfs = v.sysfs;
    }
    f.infiniband = host.infiniband;
    (f, host.head)
}

/// What a node's commands tell of it (besides Docker).
struct HostFacts {
    sudo: bool,
    gpu: GpuView,
    meminfo: Result<String, String>,
    disk: DiskFacts,
    fabric: Option<FabricView>,
    infiniband: bool,
    head: Option<(HeadInputs, DiskFacts)>,
}

/// Node `index`'s [`HostFacts`] through its Exec port; the error chain when it cannot be
/// reached.
async fn gather_host(
    ctx: &Context,
    index: usize,
    peer: Option<Ipv4Addr>,
) -> Result<HostFacts, String> {
    let node = &ctx.config().config().nodes[index];
    let exec = ctx.exec(index).await.map_err(|e| error_chain(&e))?;
    exec.run(&Cmd::new("true"))
        .await
        .map_err(|e| error_chain(&e))?;
    // Everything else at once, none depending on another: at most 8 commands at a time (each a
    // session of the node's one SSH connection, of sshd's default 10). Each group runs its own
    // commands one after the other.
    let sudo = async {
        exec.output(&Cmd::new("sudo").args(["-n", "true"]))
            .await
            .is_ok_and(|o| o.status.success())
    };
    let fabric = async {
        match peer {
            Some(peer) => Some(gather_fabric(exec, node, peer).await),
            None => None,
        }
    };
    let infiniband = async {
        exec.path_exists(Path::new("/dev/infiniband"))
            .await
            .unwrap_or(false)
    };
    let head = async {
        if index == 0 {
            Some(gather_head_inputs(ctx, exec).await)
        } else {
            None
        }
    };
    let (sudo, gpu, meminfo, disk, fabric, infiniband, head) = tokio::join!(
        sudo,
        gather_gpu(exec, node),
        gather_memory(ctx, exec, node),
        disk_of(exec, &node.data_dir),
        fabric,
        infiniband,
        head,
    );
    Ok(HostFacts {
        sudo,
        gpu,
        meminfo,
        disk,
        fabric,
        infiniband,
        head,
    })
}

/// What the image step needs on the head (the engine binaries in its engine directory, the base
/// image in its Docker) and, in `nfs` mode, the head's exports: collected before anything is
/// downloaded, so a missing one stops the run at Preflight.
pub(super) async fn gather_prerequisites(ctx: &Context, engine: &dyn Engine, head: &mut NodeFacts) {
    if head.reach.is_err() {
        return;
    }
    let c = ctx.config().config();
    let Ok(exec) = ctx.exec(0).await else {
        return;
    };
    let dir = NodeLayout::of(ctx.config(), &c.nodes[0]).engine_dir;
    let present = sizes(exec, &dir).await;
    head.engine_files = Some(EngineFiles {
        found: Ok(engine
            .binaries()
            .into_iter()
            .map(|b| {
                let there = present.contains_key(&b);
                (b, there)
            })
            .collect()),
        dir,
    });
    if head.docker == DockerProbe::Reachable
        && let Ok(d) = ctx.docker(0).await
    {
        head.base_image = Some(
            d.inspect_image(&c.engine.base_image)
                .await
                .map(|i| i.map(|i| i.size.and_then(|s| u64::try_from(s).ok()).unwrap_or(0)))
                .map_err(|e| error_chain(&e)),
        );
    }
    if c.deployment.worker_storage == WorkerStorage::Nfs {
        head.exports = Some(text(exec, &Cmd::shell(EXPORTS_SCRIPT)).await);
    }
}

#[cfg(test)]
mod tests;
