//! Collecting the raw facts of each node through its Exec and Docker ports (no decisions: see
//! `preflight::decide`), and what the head's disk holds of the inputs.

use std::net::Ipv4Addr;
use std::path::Path;

use crate::config::NodeConfig;
use crate::context::Context;
use crate::event::Level;
use crate::event::StepKind;
use crate::layout::NodeLayout;
use crate::ports::exec::{Cmd, Exec};
use crate::preflight::decide::{DiskFacts, DockerProbe, NodeFacts, error_chain};
use crate::preflight::inputs::{HOME_PATH, HeadInputs, RANK_FILES_SCRIPT, SNAPSHOT_SCRIPT};
use crate::preflight::roce::{self, Sysfs};
use crate::preflight::sysfs_dump::{self, SysfsDump};

/// A command's stdout as text; its error chain on failure.
async fn text(exec: &Exec, cmd: &Cmd) -> Result<String, String> {
    exec.run(cmd)
        .await
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .map_err(|e| error_chain(&e))
}

/// `program args...` on `node`, its `path` directories searched first.
fn tool(node: &NodeConfig, program: &str, args: &[&str]) -> Cmd {
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
fn below_floor(meminfo: &Result<String, String>, floor: u64) -> Option<u64> {
    use crate::preflight::meminfo::{mem_available, mem_total};
    let m = meminfo.as_ref().ok()?;
    if mem_total(m).is_some_and(|t| t < floor) {
        return None;
    }
    mem_available(m).filter(|a| *a < floor)
}

/// The driver's view through `nvidia-smi` on the node (its `path` searched first).
async fn gather_gpu(exec: &Exec, node: &NodeConfig, f: &mut NodeFacts) {
    let smi = |args: &[&str]| tool(node, "nvidia-smi", args);
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

/// `MemAvailable`, waiting up to [`MEM_WAIT`] for it to reach the floor while page cache may
/// still be dropping (a fragmented host can take long to free memory after the last run).
async fn gather_memory(ctx: &Context, exec: &Exec, node: &NodeConfig, f: &mut NodeFacts) {
    let min_gib = ctx.config().config().lifecycle.min_avail_gib;
    let floor = u64::from(min_gib) << 30;
    f.meminfo = read_meminfo(exec, node).await;
    let started = std::time::Instant::now();
    while let Some(avail) = below_floor(&f.meminfo, floor) {
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
        f.meminfo = read_meminfo(exec, node).await;
    }
}

/// The route to the peer, the MTU of its netdev and the RoCE part of the node's sysfs, all read
/// below the node's `sysfs_root`.
async fn gather_fabric(exec: &Exec, node: &NodeConfig, peer: Ipv4Addr, f: &mut NodeFacts) {
    let route = text(
        exec,
        &Cmd::new("ip").args(["-o", "-4", "route", "get", &peer.to_string()]),
    )
    .await;
    if let Some(r) = route.as_ref().ok().and_then(|t| roce::parse_route(t)) {
        let root = node.sysfs_root.trim_end_matches('/');
        f.mtu = Some(
            text(
                exec,
                &Cmd::new("cat").arg(format!("{root}/class/net/{}/mtu", r.dev)),
            )
            .await,
        );
        f.sysfs = Some(
            text(exec, &Cmd::shell(sysfs_dump::SCRIPT).args(["sh", root]))
                .await
                .map(|t| Box::new(SysfsDump::parse(&t)) as Box<dyn Sysfs + Send + Sync>),
        );
    }
    f.route = Some(route);
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
    }
}

/// The rank files and the cached checkpoint on the head, and `df` of the cache root (or its
/// nearest existing parent: preflight creates nothing there).
async fn gather_head_inputs(ctx: &Context, exec: &Exec) -> (HeadInputs, DiskFacts) {
    let c = ctx.config().config();
    let inputs_dir = NodeLayout::of(ctx.config(), &c.nodes[0]).inputs_dir;
    let rank_files = text(
        exec,
        &Cmd::shell(format!("{HOME_PATH}{RANK_FILES_SCRIPT}")).args(["sh", &inputs_dir]),
    )
    .await
    .unwrap_or_default();
    let snapshot = text(
        exec,
        &Cmd::shell(format!("{HOME_PATH}{SNAPSHOT_SCRIPT}")).args([
            "sh",
            &c.hub.cache,
            &crate::layout::repo_folder(&c.model.id),
            &c.model.revision,
        ]),
    )
    .await
    .unwrap_or_default();
    let df = text(
        exec,
        &Cmd::shell(format!(
            "{HOME_PATH}p=\"$1\"; while [ ! -e \"$p\" ]; do p=$(dirname -- \"$p\"); done; df -Pk -- \"$p\" | tail -1"
        ))
        .args(["sh", &c.hub.cache]),
    )
    .await;
    let cache = DiskFacts {
        dir: c.hub.cache.clone(),
        df,
        missing: Vec::new(),
    };
    (
        HeadInputs::parse(&rank_files, &snapshot, c.nodes.len()),
        cache,
    )
}

/// The checkpoint's weight bytes as the Hub lists them (its `*.safetensors` files), asked only
/// when nothing on the head tells; `None` when the Hub does not answer within 20 s.
async fn listed_checkpoint_bytes(ctx: &Context) -> Option<u64> {
    use crate::hub::{Hub, HubConfig};
    let c = ctx.config().config();
    let endpoint = (!c.hub.endpoint.is_empty()).then(|| c.hub.endpoint.clone());
    let mut cfg = HubConfig::new(endpoint, crate::layout::hub_dir(&c.hub.cache));
    if let Some(t) = c.hub.token.as_ref() {
        cfg.token = Some(crate::hub::HfToken::new(t.expose()));
    } else if let Some(t) = crate::hub::HfToken::from_file(Path::new(&c.hub.token_file)) {
        cfg.token = Some(t);
    }
    cfg.max_retries = 1;
    cfg.connect_timeout = std::time::Duration::from_secs(5);
    let ask = async {
        let hub = Hub::new(cfg).ok()?;
        let repo = hub.resolve(&c.model.id, &c.model.revision).await.ok()?;
        let files = hub.list_files(&repo).await.ok()?;
        let total: u64 = files
            .iter()
            .filter(|f| f.path.ends_with(".safetensors"))
            .map(|f| f.size)
            .sum();
        (total > 0).then_some(total)
    };
    tokio::time::timeout(std::time::Duration::from_secs(20), ask)
        .await
        .ok()
        .flatten()
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

/// Gives every node its rank's weight bytes, and the head what its disks still have to receive.
pub(super) async fn settle_inputs(
    ctx: &Context,
    facts: &mut [NodeFacts],
    head: Option<(HeadInputs, DiskFacts)>,
) {
    let c = ctx.config().config();
    let world = c.nodes.len();
    let Some((inputs, mut cache)) = head else {
        return;
    };
    let estimate =
        crate::preflight::budget::profile_estimate(&c.model.id, &ctx.config().limits().memory);
    let needs_listing = inputs.checkpoint_total().is_none()
        && estimate.is_none()
        && (inputs.rank_files.len() < world || inputs.index.is_none());
    let listed = if needs_listing {
        listed_checkpoint_bytes(ctx).await
    } else {
        None
    };
    let weights = inputs.rank_weights(world, listed, estimate);
    for (f, w) in facts.iter_mut().zip(&weights) {
        f.rank_weights = *w;
    }
    let whole = listed.or_else(|| estimate.map(|e| e * world as u64));
    if let Some(head) = facts.first_mut()
        && let Some(data) = head.disks.first_mut()
    {
        data.missing = inputs.missing_rank_files(&weights);
        cache.missing = inputs.missing_checkpoint(whole);
        head.disks.push(cache);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_readable_value_below_the_floor_is_waited_for() {
        let m = Ok("MemAvailable: 1048576 kB\n".to_owned());
        assert_eq!(below_floor(&m, 2 << 30), Some(1 << 30));
        assert_eq!(below_floor(&m, 1 << 30), None);
        assert_eq!(below_floor(&Err("x".into()), 2 << 30), None);
        assert_eq!(below_floor(&Ok("MemTotal: 5 kB".into()), 2 << 30), None);
        // A floor above the machine's memory is never reached: no wait, the check fails at once.
        let small = Ok("MemTotal: 2097152 kB\nMemAvailable: 1048576 kB\n".to_owned());
        assert_eq!(below_floor(&small, 1 << 30), None);
        assert_eq!(below_floor(&small, 2 << 30), Some(1 << 30));
        assert_eq!(below_floor(&small, 3 << 30), None);
    }

    #[tokio::test]
    async fn a_nodes_path_is_searched_first_for_its_tools() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let bin = t.path().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let script = bin.join("nvidia-smi");
        std::fs::write(&script, "#!/bin/sh\necho \"found: $*\"\n").unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let exec = Exec::local("head");
        let mut node = NodeConfig::head();
        node.path = vec![bin.display().to_string()];
        let out = text(&exec, &tool(&node, "nvidia-smi", &["-q", "-d", "CLOCK"])).await;
        assert_eq!(out.as_deref(), Ok("found: -q -d CLOCK\n"));
        // The default PATH still serves everything else.
        let out = text(&exec, &tool(&node, "echo", &["a b"])).await;
        assert_eq!(out.as_deref(), Ok("a b\n"));
        // Without `path` the program is run as is.
        node.path.clear();
        assert!(text(&exec, &tool(&node, "true", &[])).await.is_ok());
    }
}
