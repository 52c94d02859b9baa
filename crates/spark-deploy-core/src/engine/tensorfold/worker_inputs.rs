//! What a worker's rank reads, shipped from the head: the Engram tables, the kit, the token map
//! and its rank file in both storage modes, and in copy mode the checkpoint's small files
//! (`config.json`, `tokenizer.json`; `tokenizer_config.json` and the index are shipped too, being
//! small and in doubt). No shard: a follower's weights are its rank file, and the vision tower
//! runs on rank 0, which reads `MODEL_DIR` on the head.

use std::path::Path;

use super::TOKEN_MAP_FILE;
use crate::config::{ValidatedConfig, WorkerStorage};
use crate::context::Context;
use crate::describe::Transfer;
use crate::facts::DeploymentFacts;
use crate::layout::{NodeLayout, repo_folder};
use crate::ports::exec::Cmd;
use crate::transfer::{FileJob, expand};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The transfers worker `r` receives, for the plan.
pub(crate) fn plan(config: &ValidatedConfig, facts: &DeploymentFacts, r: usize) -> Vec<Transfer> {
    let c = config.config();
    let head = NodeLayout::of(config, &c.nodes[0]);
    let w = NodeLayout::of(config, &c.nodes[r]);
    let world = c.nodes.len();
    let mut transfers = Vec::new();
    if c.deployment.worker_storage == WorkerStorage::Copy {
        let snap = format!("hub/{}", repo_folder(&c.model.id));
        transfers.push(Transfer {
            what: format!(
                "the checkpoint's small files at {} (config, tokenizer, index: every file but the *.safetensors shards, which a follower never reads — its weights are its rank file, and the vision tower runs on rank 0)",
                facts.model_commit
            ),
            from: format!("{}/{snap}/snapshots/{}/<every file but *.safetensors>", head.hf_cache, facts.model_commit),
            to: format!("{}/{snap}/snapshots/{}/", w.hf_cache, facts.model_commit),
        });
    }
    transfers.extend([
        Transfer {
            what: "Engram tables (local disk, never NFS)".into(),
            from: head.engram_dir.clone(),
            to: w.engram_dir.clone(),
        },
        Transfer {
            what: "kernel kit (identical bytes)".into(),
            from: head.kit_dir.clone(),
            to: w.kit_dir.clone(),
        },
        Transfer {
            what: format!("rank {r} weight file"),
            from: format!("{}/rank-cache/rank{r}of{world}-<hash>.bin", head.inputs_dir),
            to: format!("{}/rank-cache/", w.inputs_dir),
        },
        Transfer {
            what: "token map".into(),
            from: format!("{}/{TOKEN_MAP_FILE}", head.inputs_dir),
            to: format!("{}/{TOKEN_MAP_FILE}", w.inputs_dir),
        },
    ]);
    transfers
}

/// Whether `path` is a weight shard of the checkpoint (never read by a follower).
fn is_shard(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "safetensors")
}

/// The files worker `i` needs now, after moving superseded rank files aside on it.
pub(crate) async fn jobs(ctx: &Context, i: usize) -> Result<Vec<FileJob>, BoxError> {
    let c = ctx.config().config();
    let head = NodeLayout::of(ctx.config(), &c.nodes[0]);
    let wl = NodeLayout::of(ctx.config(), &c.nodes[i]);
    let mut jobs = small_files_jobs(ctx, i)?;
    jobs.extend(
        expand(Path::new(&head.engram_dir), Path::new(&wl.engram_dir))
            .map_err(|e| Box::new(e) as BoxError)?,
    );
    jobs.extend(side_jobs(ctx, i)?);
    jobs.extend(rank_file_jobs(ctx, i).await?);
    Ok(jobs)
}

/// In copy mode, the checkpoint's files in its snapshot on the head but the shards; nothing in
/// the other modes (the worker reads its own tree or the head's over NFS).
fn small_files_jobs(ctx: &Context, i: usize) -> Result<Vec<FileJob>, BoxError> {
    let c = ctx.config().config();
    if c.deployment.worker_storage != WorkerStorage::Copy {
        return Ok(Vec::new());
    }
    let commit = ctx.facts().model_commit.to_string();
    let wl = NodeLayout::of(ctx.config(), &c.nodes[i]);
    let snap = crate::layout::snapshot_dir(&c.hub.cache, &c.model.id, &commit);
    let to = crate::layout::snapshot_dir(&wl.hf_cache, &c.model.id, &commit);
    Ok(expand(&snap, &to)
        .map_err(|e| Box::new(e) as BoxError)?
        .into_iter()
        .filter(|j| !is_shard(&j.to))
        .collect())
}

/// The kit and the token map (BuildRankCache's inputs besides the rank files and the Engram
/// tables).
fn side_jobs(ctx: &Context, i: usize) -> Result<Vec<FileJob>, BoxError> {
    let c = ctx.config().config();
    let head = NodeLayout::of(ctx.config(), &c.nodes[0]);
    let wl = NodeLayout::of(ctx.config(), &c.nodes[i]);
    let mut jobs = expand(Path::new(&head.kit_dir), Path::new(&wl.kit_dir))
        .map_err(|e| Box::new(e) as BoxError)?;
    let tm = TOKEN_MAP_FILE;
    jobs.extend(
        expand(
            &Path::new(&head.inputs_dir).join(tm),
            &Path::new(&wl.inputs_dir).join(tm),
        )
        .map_err(|e| Box::new(e) as BoxError)?,
    );
    Ok(jobs)
}

/// What an overlapped `up` can ship worker `i` now, before BuildRankCache is done: every Engram
/// shard already final in the original model's snapshot (to where the worker's tables go; the
/// head links the same blobs into its tables directory later, so the final copy finds them
/// there); once the kit and the token map are final on the head (`Stages::side_inputs`), them
/// and in copy mode the checkpoint's small files that have landed; and with `rank_file` its rank
/// file (every rank file is final).
pub(crate) async fn early_jobs(
    ctx: &Context,
    i: usize,
    rank_file: bool,
) -> Result<Vec<FileJob>, BoxError> {
    let c = ctx.config().config();
    let wl = NodeLayout::of(ctx.config(), &c.nodes[i]);
    let mut jobs = Vec::new();
    if let Some(commit) = ctx.facts().commits.get(&c.model.engram_repo) {
        let snap = crate::layout::snapshot_dir(&c.hub.cache, &c.model.engram_repo, commit);
        if snap.is_dir() {
            jobs.extend(
                expand(&snap, Path::new(&wl.engram_dir))
                    .map_err(|e| Box::new(e) as BoxError)?
                    .into_iter()
                    .filter(|j| is_shard(&j.to)),
            );
        }
    }
    if ctx.stages().side_inputs {
        jobs.extend(small_files_jobs(ctx, i)?);
        jobs.extend(side_jobs(ctx, i)?);
    }
    if rank_file {
        jobs.extend(rank_file_jobs(ctx, i).await?);
    }
    Ok(jobs)
}

/// Where worker `i` keeps its rank file.
pub(crate) fn worker_rank_dir(ctx: &Context, i: usize) -> String {
    let c = ctx.config().config();
    format!(
        "{}/rank-cache",
        NodeLayout::of(ctx.config(), &c.nodes[i]).inputs_dir
    )
}

/// Worker `i`'s rank file (after moving superseded ones aside on it).
pub(crate) async fn rank_file_jobs(ctx: &Context, i: usize) -> Result<Vec<FileJob>, BoxError> {
    let c = ctx.config().config();
    let head = NodeLayout::of(ctx.config(), &c.nodes[0]);
    let world = c.nodes.len();
    let mut jobs = Vec::new();
    let prefix = format!("rank{i}of{world}-");
    let rank_dir = Path::new(&head.inputs_dir).join("rank-cache");
    let rank_file = fs_err::read_dir(&rank_dir)
        .map_err(|e| Box::new(e) as BoxError)?
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with(&prefix) && n.ends_with(".bin"))
        .ok_or_else(|| {
            format!(
                "no {prefix}*.bin in {}: run BuildRankCache first",
                rank_dir.display()
            )
        })?;
    let worker_rank_dir = worker_rank_dir(ctx, i);
    move_aside_stale(ctx, i, &worker_rank_dir, &prefix, &rank_file).await?;
    jobs.extend(
        expand(
            &rank_dir.join(&rank_file),
            &Path::new(&worker_rank_dir).join(&rank_file),
        )
        .map_err(|e| Box::new(e) as BoxError)?,
    );
    Ok(jobs)
}

/// Moves other `rank{R}of{W}-*.bin` files of the worker's rank-cache directory aside, so the
/// engine's one-file rule holds after a rebuild.
async fn move_aside_stale(
    ctx: &Context,
    index: usize,
    dir: &str,
    prefix: &str,
    keep: &str,
) -> Result<(), BoxError> {
    let script = r#"cd "$1" 2>/dev/null || exit 0; for f in "$2"*.bin; do [ -f "$f" ] && [ "$f" != "$3" ] && mkdir -p superseded && mv -f -- "$f" superseded/; done; true"#;
    ctx.exec(index)
        .await?
        .run(&Cmd::shell(script).args(["sh", dir, prefix, keep]))
        .await?;
    Ok(())
}
