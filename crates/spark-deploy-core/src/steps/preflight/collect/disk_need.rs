//! What the nodes' disks hold and still need of the inputs: the head's rank files and cached
//! checkpoint, the Hub's listings when the head cannot tell, and every node's share of the Engram
//! tables, the kit, the engine binaries and image.

use std::collections::BTreeMap;
use std::path::Path;

use crate::config::WorkerStorage;
use crate::context::Context;
use crate::engine::Engine;
use crate::layout::NodeLayout;
use crate::ports::exec::{Cmd, Exec};
use crate::preflight::decide::{DiskFacts, Missing, NodeFacts};
use crate::preflight::inputs::{
    HOME_PATH, HeadInputs, RANK_FILES_SCRIPT, SNAPSHOT_SCRIPT, SNAPSHOT_SIZES_SCRIPT, Tree,
    parse_sizes,
};

use super::{df_nearest, sizes, text};

/// The rank files and the cached checkpoint on the head, and `df` of the cache root (or its
/// nearest existing parent: preflight creates nothing there).
pub(super) async fn gather_head_inputs(ctx: &Context, exec: &Exec) -> (HeadInputs, DiskFacts) {
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
        .fold(0u64, |n, (_, s)| n.saturating_add(*s));
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

/// Gives every node its rank's weight bytes, and the head what its disks still have to receive.
pub(in crate::steps::preflight) async fn settle_inputs(
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
    let whole = listed.or_else(|| estimate.map(|e| e.saturating_mul(world as u64)));
    if let Some(head) = facts.first_mut()
        && let Some(data) = head.disks.first_mut()
    {
        data.missing = inputs.missing_rank_files(&weights);
        cache.missing = inputs.missing_checkpoint(whole);
        head.disks.push(cache);
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
    let cached = select(snapshot_sizes(exec, &c.hub.cache, repo, revision).await);
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
/// What the head lists and what every worker holds are asked all at once.
pub(in crate::steps::preflight) async fn settle_shares(
    ctx: &Context,
    engine: &dyn Engine,
    facts: &mut [NodeFacts],
) {
    let c = ctx.config().config();
    let Some(head) = facts.first() else { return };
    if head.reach.is_err() {
        return;
    }
    let Ok(hx) = ctx.exec(0).await else { return };
    let reachable: Vec<usize> = facts
        .iter()
        .enumerate()
        .skip(1)
        .filter(|(_, f)| f.reach.is_ok())
        .map(|(i, _)| i)
        .collect();
    let (shares, held) = tokio::join!(
        head_shares(ctx, engine, hx),
        futures::future::join_all(reachable.iter().map(|&i| worker_holdings(ctx, i))),
    );
    // The head: the trees land in its cache, and are hard-linked into its data directory.
    let hl = NodeLayout::of(ctx.config(), &c.nodes[0]);
    if let Some(head) = facts.first_mut() {
        if let Some(cache) = head.disks.iter_mut().find(|d| d.dir == c.hub.cache) {
            cache.missing.extend(shares.engram.missing_in_cache());
            cache.missing.extend(shares.kit.missing_in_cache());
        }
        for ((tree, dir), (present, df)) in
            [(&shares.engram, &hl.engram_dir), (&shares.kit, &hl.kit_dir)]
                .into_iter()
                .zip(shares.linked)
        {
            head.disks.push(DiskFacts {
                dir: dir.clone(),
                df,
                missing: tree.missing_at(&present).into_iter().collect(),
                linked_from: Some(c.hub.cache.clone()),
            });
        }
    }
    let world = c.nodes.len();
    for (i, h) in reachable.into_iter().zip(held) {
        let Some(h) = h else { continue };
        let f = &mut facts[i];
        let wl = NodeLayout::of(ctx.config(), &c.nodes[i]);
        let mut need = Vec::new();
        let held = HeadInputs::parse(&h.rank_files, "", world)
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
        need.extend(shares.engram.missing_at(&h.engram));
        need.extend(shares.kit.missing_at(&h.kit));
        need.extend(shares.binaries.missing_at(&h.binaries));
        if let Some(data) = f.disks.first_mut() {
            data.missing.extend(need);
        }
        if let Some((mut present, df)) = h.snapshot {
            match &shares.small.files {
                Some(files) => present.retain(|p, _| files.contains_key(p)),
                None => present.clear(),
            }
            f.disks.push(DiskFacts {
                dir: wl.hf_cache.clone(),
                df,
                missing: shares.small.missing_at(&present).into_iter().collect(),
                linked_from: None,
            });
        }
        // The engine image, loaded through the worker's Docker into its data root.
        if let Some((root, df)) = h.image_root {
            f.disks.push(DiskFacts {
                df,
                dir: format!("{root} (Docker)"),
                missing: vec![Missing {
                    what: format!("engine image {}", wl.image),
                    bytes: shares.image_bytes.unwrap_or(0),
                }],
                linked_from: None,
            });
        }
    }
}

/// What every node's share is made of, as the head knows it.
struct HeadShares {
    engram: Tree,
    kit: Tree,
    /// The checkpoint's files but the shards (`copy` mode ships them).
    small: Tree,
    binaries: Tree,
    /// The engine image's size (else its base image's) in the head's Docker.
    image_bytes: Option<u64>,
    /// What the head's Engram and kit directories hold, and their `df`, in that order.
    linked: [(BTreeMap<String, u64>, Result<String, String>); 2],
}

/// [`HeadShares`]: the head's listings (the Hub's when its cache is incomplete), all at once.
async fn head_shares(ctx: &Context, engine: &dyn Engine, hx: &Exec) -> HeadShares {
    let c = ctx.config().config();
    let m = &c.model;
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
    );
    let kit = cached_tree(
        ctx,
        hx,
        "kit",
        (&m.kit_repo, &m.kit_revision),
        "kit/",
        &|p: &str| p.starts_with("kit/"),
        &|t: &BTreeMap<String, u64>| t.contains_key("MANIFEST"),
    );
    let small = async {
        let listing = snapshot_sizes(hx, &c.hub.cache, &m.id, &m.revision).await;
        let files: BTreeMap<String, u64> = listing
            .into_iter()
            .filter(|(p, _)| !p.ends_with(".safetensors"))
            .collect();
        Tree {
            what: "checkpoint's small files".into(),
            files: (!files.is_empty()).then_some(files),
            cached: BTreeMap::new(),
        }
    };
    let binaries = async {
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
    let image_bytes = async {
        let d = ctx.docker(0).await.ok()?;
        let size = |i: Option<bollard::models::ImageInspect>| {
            i.and_then(|i| i.size).and_then(|s| u64::try_from(s).ok())
        };
        match size(d.inspect_image(&hl.image).await.ok().flatten()) {
            Some(s) => Some(s),
            None => size(d.inspect_image(&c.engine.base_image).await.ok().flatten()),
        }
    };
    let dir = |d: &str| {
        let d = d.to_owned();
        async move { tokio::join!(sizes(hx, &d), df_nearest(hx, &d)) }
    };
    let (engram, kit, small, binaries, image_bytes, engram_dir, kit_dir) = tokio::join!(
        engram,
        kit,
        small,
        binaries,
        image_bytes,
        dir(&hl.engram_dir),
        dir(&hl.kit_dir),
    );
    HeadShares {
        engram,
        kit,
        small,
        binaries,
        image_bytes,
        linked: [engram_dir, kit_dir],
    }
}

/// What a worker holds of its share.
struct WorkerHoldings {
    /// [`RANK_FILES_SCRIPT`]'s output in its inputs directory.
    rank_files: String,
    engram: BTreeMap<String, u64>,
    kit: BTreeMap<String, u64>,
    binaries: BTreeMap<String, u64>,
    /// `copy` mode: its snapshot of the checkpoint (at the commit fetch resolves) and `df` there.
    snapshot: Option<(BTreeMap<String, u64>, Result<String, String>)>,
    /// Its Docker data root and `df` there, when the engine image is not loaded yet.
    image_root: Option<(String, Result<String, String>)>,
}

/// Worker `i`'s [`WorkerHoldings`], all asked at once; `None` when it cannot be reached.
async fn worker_holdings(ctx: &Context, i: usize) -> Option<WorkerHoldings> {
    let c = ctx.config().config();
    let wx = ctx.exec(i).await.ok()?;
    let wl = NodeLayout::of(ctx.config(), &c.nodes[i]);
    let rank_files = async {
        text(
            wx,
            &Cmd::shell(format!("{HOME_PATH}{RANK_FILES_SCRIPT}")).args(["sh", &wl.inputs_dir]),
        )
        .await
        .unwrap_or_default()
    };
    let snapshot = async {
        if c.deployment.worker_storage != WorkerStorage::Copy {
            return None;
        }
        Some(tokio::join!(
            snapshot_sizes(wx, &wl.hf_cache, &c.model.id, &c.model.revision),
            df_nearest(wx, &wl.hf_cache),
        ))
    };
    let image_root = async {
        let d = ctx.docker(i).await.ok()?;
        if !matches!(d.inspect_image(&wl.image).await, Ok(None)) {
            return None;
        }
        let root = d
            .info()
            .await
            .ok()
            .and_then(|i| i.docker_root_dir)
            .unwrap_or_else(|| "/var/lib/docker".to_owned());
        let df = df_nearest(wx, &root).await;
        Some((root, df))
    };
    let (rank_files, engram, kit, binaries, snapshot, image_root) = tokio::join!(
        rank_files,
        sizes(wx, &wl.engram_dir),
        sizes(wx, &wl.kit_dir),
        sizes(wx, &wl.engine_dir),
        snapshot,
        image_root,
    );
    Some(WorkerHoldings {
        rank_files,
        engram,
        kit,
        binaries,
        snapshot,
        image_root,
    })
}

/// [`SNAPSHOT_SIZES_SCRIPT`] of `repo` at `revision` in the HF cache `cache` on a node: relative
/// path → bytes (nothing when it is not there).
async fn snapshot_sizes(
    exec: &Exec,
    cache: &str,
    repo: &str,
    revision: &str,
) -> BTreeMap<String, u64> {
    let listing = text(
        exec,
        &Cmd::shell(format!("{HOME_PATH}{SNAPSHOT_SIZES_SCRIPT}")).args([
            "sh",
            cache,
            &crate::layout::repo_folder(repo),
            revision,
        ]),
    )
    .await
    .unwrap_or_default();
    parse_sizes(&listing)
}
