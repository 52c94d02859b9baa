//! Collecting the raw facts of each node through its Exec and Docker ports (no decisions: see
//! `preflight::decide`), and what the head's disk holds of the inputs.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::Path;

use crate::config::NodeConfig;
use crate::config::WorkerStorage;
use crate::context::Context;
use crate::engine::Engine;
use crate::event::Level;
use crate::event::StepKind;
use crate::layout::NodeLayout;
use crate::ports::exec::{Cmd, Exec};
use crate::preflight::decide::{
    DiskFacts, DockerProbe, EngineFiles, Missing, NodeFacts, error_chain,
};
use crate::preflight::exports::EXPORTS_SCRIPT;
use crate::preflight::inputs::{
    HOME_PATH, HeadInputs, RANK_FILES_SCRIPT, SIZES_SCRIPT, SNAPSHOT_SCRIPT, SNAPSHOT_SIZES_SCRIPT,
    Tree, parse_sizes,
};
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
    let df = df_nearest(exec, &c.hub.cache).await;
    let cache = DiskFacts {
        dir: c.hub.cache.clone(),
        df,
        missing: Vec::new(),
        linked_from: None,
    };
    (
        HeadInputs::parse(&rank_files, &snapshot, c.nodes.len()),
        cache,
    )
}

/// The checkpoint's weight bytes as the Hub lists them (its `*.safetensors` files), asked only
/// when nothing on the head tells; `None` when the Hub does not answer within 20 s.
async fn listed_checkpoint_bytes(ctx: &Context) -> Option<u64> {
    let c = ctx.config().config();
    let total: u64 = hub_listing(ctx, &c.model.id, &c.model.revision)
        .await?
        .iter()
        .filter(|(p, _)| p.ends_with(".safetensors"))
        .map(|(_, s)| s)
        .sum();
    (total > 0).then_some(total)
}

/// Every file of `repo` at `revision` with its size as the Hub lists it (metadata only, nothing
/// downloaded); `None` when the Hub does not answer within 20 s.
async fn hub_listing(ctx: &Context, repo: &str, revision: &str) -> Option<BTreeMap<String, u64>> {
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
        let repo = hub.resolve(repo, revision).await.ok()?;
        let files = hub.list_files(&repo).await.ok()?;
        Some(files.into_iter().map(|f| (f.path, f.size)).collect())
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

/// A tree of the head's HF cache (a repo's snapshot, `prefix` stripped, `keep` selecting): its
/// complete listing from the cache when `complete` says the cache holds it all, else from the
/// Hub's listing (metadata only), else unknown.
async fn cached_tree(
    ctx: &Context,
    exec: &Exec,
    what: &str,
    (repo, revision): (&str, &str),
    prefix: &str,
    keep: &(dyn Fn(&str) -> bool + Sync),
    complete: &(dyn Fn(&BTreeMap<String, u64>) -> bool + Sync),
) -> Tree {
    let c = ctx.config().config();
    let select = |all: BTreeMap<String, u64>| -> BTreeMap<String, u64> {
        all.into_iter()
            .filter(|(p, _)| keep(p))
            .filter_map(|(p, s)| p.strip_prefix(prefix).map(|p| (p.to_owned(), s)))
            .collect()
    };
    let listing = text(
        exec,
        &Cmd::shell(format!("{HOME_PATH}{SNAPSHOT_SIZES_SCRIPT}")).args([
            "sh",
            &c.hub.cache,
            &crate::layout::repo_folder(repo),
            revision,
        ]),
    )
    .await
    .unwrap_or_default();
    let cached = select(parse_sizes(&listing));
    let files = if complete(&cached) {
        Some(cached.clone())
    } else {
        hub_listing(ctx, repo, revision).await.map(select)
    };
    Tree {
        what: what.to_owned(),
        files,
        cached,
    }
}

/// Disk need on every node beyond the checkpoint and the head's rank files: the Engram tables and
/// the kit in the head's cache (hard-linked into its data directory), and each worker's own
/// share — its rank file, the Engram tables, the kit, the engine binaries, the engine image in
/// its Docker, and in `copy` mode the checkpoint's small files — less what it already holds.
pub(super) async fn settle_shares(ctx: &Context, engine: &dyn Engine, facts: &mut [NodeFacts]) {
    let c = ctx.config().config();
    let m = &c.model;
    let Some(head) = facts.first() else { return };
    if head.reach.is_err() {
        return;
    }
    let Ok(hx) = ctx.exec(0).await else { return };
    let hl = NodeLayout::of(ctx.config(), &c.nodes[0]);
    let engram_patterns = crate::hub::AllowPatterns::new(&m.engram_files).ok();
    let is_engram = |p: &str| {
        p.ends_with(".safetensors") && engram_patterns.as_ref().is_some_and(|a| a.is_match(p))
    };
    let engram_complete = |t: &BTreeMap<String, u64>| {
        m.engram_files.iter().all(|pat| {
            crate::hub::AllowPatterns::new(std::slice::from_ref(pat))
                .is_ok_and(|a| t.keys().any(|k| a.is_match(k)))
        })
    };
    let engram = cached_tree(
        ctx,
        hx,
        "Engram tables",
        (&m.engram_repo, &m.engram_revision),
        "",
        &is_engram,
        &engram_complete,
    )
    .await;
    let kit = cached_tree(
        ctx,
        hx,
        "kit",
        (&m.kit_repo, &m.kit_revision),
        "kit/",
        &|p: &str| p.starts_with("kit/"),
        &|t: &BTreeMap<String, u64>| t.contains_key("MANIFEST"),
    )
    .await;
    let small = {
        let listing = text(
            hx,
            &Cmd::shell(format!("{HOME_PATH}{SNAPSHOT_SIZES_SCRIPT}")).args([
                "sh",
                &c.hub.cache,
                &crate::layout::repo_folder(&m.id),
                &m.revision,
            ]),
        )
        .await
        .unwrap_or_default();
        let files: BTreeMap<String, u64> = parse_sizes(&listing)
            .into_iter()
            .filter(|(p, _)| !p.ends_with(".safetensors"))
            .collect();
        Tree {
            what: "checkpoint's small files".into(),
            files: (!files.is_empty()).then_some(files),
            cached: BTreeMap::new(),
        }
    };
    let binaries = {
        let names = engine.binaries();
        let files: BTreeMap<String, u64> = sizes(hx, &hl.engine_dir)
            .await
            .into_iter()
            .filter(|(p, _)| names.contains(p))
            .collect();
        Tree {
            what: "engine binaries".into(),
            files: Some(files),
            cached: BTreeMap::new(),
        }
    };
    let image_bytes = match ctx.docker(0).await {
        Ok(d) => {
            let size = |i: Option<bollard::models::ImageInspect>| {
                i.and_then(|i| i.size).and_then(|s| u64::try_from(s).ok())
            };
            match size(d.inspect_image(&hl.image).await.ok().flatten()) {
                Some(s) => Some(s),
                None => size(d.inspect_image(&c.engine.base_image).await.ok().flatten()),
            }
        }
        Err(_) => None,
    };
    // The head: the trees land in its cache, and are hard-linked into its data directory.
    if let Some(head) = facts.first_mut() {
        if let Some(cache) = head.disks.iter_mut().find(|d| d.dir == c.hub.cache) {
            cache.missing.extend(engram.missing_in_cache());
            cache.missing.extend(kit.missing_in_cache());
        }
        for (tree, dir) in [(&engram, &hl.engram_dir), (&kit, &hl.kit_dir)] {
            let present = sizes(hx, dir).await;
            head.disks.push(DiskFacts {
                dir: dir.clone(),
                df: df_nearest(hx, dir).await,
                missing: tree.missing_at(&present).into_iter().collect(),
                linked_from: Some(c.hub.cache.clone()),
            });
        }
    }
    let world = c.nodes.len();
    for (i, f) in facts.iter_mut().enumerate().skip(1) {
        if f.reach.is_err() {
            continue;
        }
        let Ok(wx) = ctx.exec(i).await else { continue };
        let wl = NodeLayout::of(ctx.config(), &c.nodes[i]);
        let mut need = Vec::new();
        let rank_files = text(
            wx,
            &Cmd::shell(format!("{HOME_PATH}{RANK_FILES_SCRIPT}")).args(["sh", &wl.inputs_dir]),
        )
        .await
        .unwrap_or_default();
        let held = HeadInputs::parse(&rank_files, "", world)
            .rank_files
            .get(&i)
            .copied();
        if let Some(w) = f.rank_weights
            && held != Some(w.bytes)
        {
            need.push(Missing {
                what: format!("rank file {i}"),
                bytes: w.bytes,
            });
        }
        need.extend(engram.missing_at(&sizes(wx, &wl.engram_dir).await));
        need.extend(kit.missing_at(&sizes(wx, &wl.kit_dir).await));
        need.extend(binaries.missing_at(&sizes(wx, &wl.engine_dir).await));
        if let Some(data) = f.disks.first_mut() {
            data.missing.extend(need);
        }
        if c.deployment.worker_storage == WorkerStorage::Copy {
            let mut present = BTreeMap::new();
            if let Some(files) = &small.files {
                // The worker's snapshot at the commit fetch resolves: measured by the same names.
                let listing = text(
                    wx,
                    &Cmd::shell(format!("{HOME_PATH}{SNAPSHOT_SIZES_SCRIPT}")).args([
                        "sh",
                        &wl.hf_cache,
                        &crate::layout::repo_folder(&m.id),
                        &m.revision,
                    ]),
                )
                .await
                .unwrap_or_default();
                present = parse_sizes(&listing);
                present.retain(|p, _| files.contains_key(p));
            }
            f.disks.push(DiskFacts {
                dir: wl.hf_cache.clone(),
                df: df_nearest(wx, &wl.hf_cache).await,
                missing: small.missing_at(&present).into_iter().collect(),
                linked_from: None,
            });
        }
        // The engine image, loaded through the worker's Docker into its data root.
        if let Ok(d) = ctx.docker(i).await
            && let Ok(None) = d.inspect_image(&wl.image).await
        {
            let root = d
                .info()
                .await
                .ok()
                .and_then(|i| i.docker_root_dir)
                .unwrap_or_else(|| "/var/lib/docker".to_owned());
            f.disks.push(DiskFacts {
                df: df_nearest(wx, &root).await,
                dir: format!("{root} (Docker)"),
                missing: vec![Missing {
                    what: format!("engine image {}", wl.image),
                    bytes: image_bytes.unwrap_or(0),
                }],
                linked_from: None,
            });
        }
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
