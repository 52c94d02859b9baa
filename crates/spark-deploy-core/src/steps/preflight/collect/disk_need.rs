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
pub(in crate::steps::preflight) async fn settle_shares(
    ctx: &Context,
    engine: &dyn Engine,
    facts: &mut [NodeFacts],
) {
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
