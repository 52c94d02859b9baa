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
use host::{gather_docker_gpu, gather_fabric, gather_gpu, gather_memory};

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
    let exec = match ctx.exec(index).await {
        Ok(e) => e,
        Err(e) => {
            f.reach = Err(error_chain(&e));
            return (f, None);
        }
    };
    f.reach = exec
        .run(&Cmd::new("true"))
        .await
        .map(|_| ())
        .map_err(|e| error_chain(&e));
    if f.reach.is_err() {
        return (f, None);
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
    gather_gpu(exec, node, &mut f).await;
    gather_memory(ctx, exec, node, &mut f).await;
    f.disks.push(disk_of(exec, &node.data_dir).await);
    if let Some(peer) = peer {
        gather_fabric(exec, node, peer, &mut f).await;
    }
    f.infiniband = exec
        .path_exists(Path::new("/dev/infiniband"))
        .await
        .unwrap_or(false);
    let head = if index == 0 {
        Some(gather_head_inputs(ctx, exec).await)
    } else {
        None
    };
    (f, head)
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
