//! BuildRankCache while FetchCheckpoint still downloads (the overlapped `up`): the shard headers
//! are read ahead by byte range, every rank file is planned from them, and each shard's entries
//! are written the moment its snapshot link appears (a link only ever points to a verified
//! blob). What this leaves to the rest of the step (the token map, the kit, the Engram links, and
//! any rank an overlay or an existing file decides) runs once the fetch has finished.

use std::path::{Path, PathBuf};

use futures::StreamExt as _;

use crate::config::PreparePolicy;
use crate::context::{Context, StepFailure};
use crate::engine::tensorfold::inputs::rank_cache::{
    Cancelled, RankCachePlan, RankCacheProgress, StreamedRank, VerifyLevel,
    build_rank_caches_streaming, plan_rank_cache_from, verify_rank_cache,
};
use crate::engine::tensorfold::inputs::rank_file;
use crate::engine::tensorfold::inputs::safetensors_index::{
    Checkpoint, read_index_json, shard_header,
};
use crate::engine::tensorfold::worker_inputs::worker_rank_dir;
use crate::event::{Event, StepKind};
use crate::hub::{HfToken, Hub, HubConfig};
use crate::layout::{hub_dir, snapshot_dir};
use crate::transfer::prefix::GrowingFile;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// On drop, tells the fetch the build wants nothing in particular, unless it said otherwise.
struct WishDecided<'a>(&'a Context);

impl Drop for WishDecided<'_> {
    fn drop(&mut self) {
        if self.0.wanted_first().is_none() {
            self.0.want_first(Vec::new());
        }
    }
}

/// Ends the publishing of growing rank files when the build ends, however it ends (a follow of a
/// file that never became complete then breaks off rather than waiting).
struct GrowingEnded<'a>(&'a Context);

impl Drop for GrowingEnded<'_> {
    fn drop(&mut self) {
        self.0.end_growing();
    }
}

/// What the build's thread tells the step.
enum Note {
    /// An event to emit.
    Event(Event),
    /// Rank `rank`'s partial file is final up to `prefix`.
    Final { rank: usize, prefix: u64 },
}

/// How often the build looks for the next shard's link.
const SHARD_POLL: std::time::Duration = std::time::Duration::from_millis(50);

/// Header reads in flight at once: one or two small range requests each, and the large
/// downloads wait for the plan they feed (the real checkpoint's 39 shards in 3 rounds).
const HEADER_READS: usize = 16;

/// The checkpoint as its shards will be, from headers read by byte range; `None` when every
/// shard is already on the head (nothing to overlap).
async fn checkpoint_ahead(
    ctx: &Context,
    model_dir: &Path,
    commit: &str,
) -> Result<Option<Checkpoint>, BoxError> {
    let c = ctx.config().config();
    // Every shard the index names is here already (a re-run): nothing to read ahead.
    let index = model_dir.join("model.safetensors.index.json");
    if let Ok(ix) = read_index_json(&index)
        && ix
            .weight_map
            .values()
            .all(|shard| model_dir.join(shard).exists())
    {
        return Ok(None);
    }
    let endpoint = (!c.hub.endpoint.is_empty()).then(|| c.hub.endpoint.clone());
    let mut cfg = HubConfig::new(endpoint, hub_dir(&c.hub.cache));
    cfg.token = HfToken::configured(&c.hub).0;
    cfg.offline = c.hub.offline;
    let hub = Hub::new(cfg)?;
    let resolved = hub.resolve(&c.model.id, commit).await?;
    let shards: Vec<_> = hub
        .list_files(&resolved)
        .await?
        .into_iter()
        .filter(|f| f.path.ends_with(".safetensors") && !f.path.contains('/'))
        .collect();
    if shards.iter().all(|f| model_dir.join(&f.path).exists()) {
        return Ok(None);
    }
    let (hub, resolved) = (&hub, &resolved);
    let headers = futures::stream::iter(shards.into_iter().map(|f| async move {
        let (_, header) = hub.read_header(resolved, &f.path).await?;
        Ok::<_, BoxError>(shard_header(&model_dir.join(&f.path), header, f.size)?)
    }))
    .buffered(HEADER_READS)
    .collect::<Vec<_>>()
    .await
    .into_iter()
    .collect::<Result<Vec<_>, _>>()?;
    let index = if index.exists() {
        Some(read_index_json(&index)?)
    } else {
        None
    };
    Ok(Some(Checkpoint::from_headers(
        model_dir,
        headers,
        index.as_ref(),
    )?))
}

/// Builds the rank files as the checkpoint arrives. Returns the ranks it built (the rest of the
/// step leaves them be); nothing when there is nothing to overlap: an ABLIT overlay (its shards
/// come after the checkpoint's), `PREPARE=0`, every shard already here, or rank files that
/// verify.
///
/// # Errors
/// The headers cannot be read or planned, a shard's header differs from the one read ahead,
/// a write fails, or the run is cancelled (the partial files and their journals stay, and the
/// next run resumes them).
pub(crate) async fn stream_rank_files(
    ctx: &Context,
    node: &str,
    out: &Path,
    opts: &crate::engine::tensorfold::inputs::rank_cache::RankCacheOptions,
    label: &str,
) -> Result<Vec<StreamedRank>, StepFailure> {
    // Whatever happens below, the fetch learns what the build wants first (nothing, unless the
    // plans say so) and stops waiting for it.
    let _decided = WishDecided(ctx);
    let c = ctx.config().config();
    if c.model.ablit || ctx.prepare_policy() == PreparePolicy::Never {
        return Ok(Vec::new());
    }
    let commit = ctx.facts().model_commit.to_string();
    let model_dir = snapshot_dir(&c.hub.cache, &c.model.id, &commit);
    // config.json is among the first files to land (the fetch takes the small files first).
    ctx.wait_for(StepKind::BuildRankCache, |c| {
        model_dir.join("config.json").exists() || c.stages().fetched
    })
    .await?;
    let fail = |e: BoxError| {
        StepFailure::new(
            StepKind::BuildRankCache,
            e,
            Some("check the Hub endpoint and the checkpoint; `spark-deploy up` again resumes what was written".into()),
        )
        .at(Some(node.to_owned()), None)
    };
    let Some(checkpoint) = checkpoint_ahead(ctx, &model_dir, &commit)
        .await
        .map_err(fail)?
    else {
        return Ok(Vec::new());
    };
    let world = c.nodes.len();
    let mut plans: Vec<RankCachePlan> = Vec::new();
    for rank in 0..world {
        let plan = plan_rank_cache_from(&model_dir, checkpoint.clone(), rank, world, opts)
            .map_err(|e| fail(Box::new(e)))?;
        let mut quiet = |_: &RankCacheProgress| Ok(());
        let current = verify_rank_cache(&plan, out, VerifyLevel::Stamped, opts, &mut quiet)
            .ok()
            .and_then(|f| super::source::recorded(&f))
            .is_some_and(|s| s == label);
        if !current {
            plans.push(plan);
        }
    }
    if plans.is_empty() {
        return Ok(Vec::new());
    }
    // The shards in the order the rank files' starts need them (the last shard holds the head
    // and the final norm, which a rank file puts first): the fetch takes them in that order, so
    // the final start of every file, hashed and sent ahead, grows with the download.
    let mut first_use: Vec<(u64, usize)> = (0..checkpoint.shards.len())
        .filter_map(|s| {
            plans
                .iter()
                .flat_map(|p| p.entries.iter())
                .filter(|e| e.source.shard() == s)
                .map(|e| e.row.offset)
                .min()
                .map(|at| (at, s))
        })
        .collect();
    first_use.sort_unstable();
    ctx.want_first(
        first_use
            .iter()
            .filter_map(|(_, s)| checkpoint.shards[*s].path.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .collect(),
    );
    // Each worker's rank file: its partial here, its final path there. As its final start grows,
    // the storage step has it follow to the worker (see `transfer::prefix`).
    let growing: Vec<(usize, GrowingFile)> = plans
        .iter()
        .filter(|p| p.rank > 0)
        .map(|p| {
            let g = GrowingFile {
                from: out.join(rank_file::partial_name(p.rank, world)),
                to: Path::new(&worker_rank_dir(ctx, p.rank)).join(&p.file_name),
                size: p.file_len(),
                ready: 0,
            };
            (p.rank, g)
        })
        .collect();
    let _ended = GrowingEnded(ctx);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Note>();
    let cancel = ctx.cancel_signal();
    let (out, opts, node_name) = (out.to_path_buf(), opts.clone(), node.to_owned());
    let paths: Vec<PathBuf> = checkpoint.shards.iter().map(|s| s.path.clone()).collect();
    let work = tokio::task::spawn_blocking(move || {
        let mut next = |pending: &[usize]| loop {
            if let Some(&s) = pending.iter().find(|&&s| paths[s].exists()) {
                return Ok(s);
            }
            if *cancel.borrow() {
                return Err(Cancelled);
            }
            std::thread::sleep(SHARD_POLL);
        };
        let started = std::time::Instant::now();
        let mut progress = |p: &RankCacheProgress| {
            let _ = tx.send(Note::Event(super::progress_event(
                &node_name, world, p, started,
            )));
            let _ = tx.send(Note::Final {
                rank: p.rank,
                prefix: p.final_prefix,
            });
            Ok(())
        };
        build_rank_caches_streaming(&plans, &out, &opts, &mut next, &mut progress)
    });
    let mut published = std::collections::HashSet::new();
    while let Some(note) = rx.recv().await {
        match note {
            Note::Event(ev) => ctx.emit(ev),
            Note::Final { rank, prefix } => {
                // Published from the first report on, while its final start may still be empty:
                // the follow's start on the worker (its session, its receiver) then overlaps the
                // wait for the first final bytes instead of following it.
                if let Some((_, g)) = growing.iter().find(|(r, _)| *r == rank) {
                    published.insert(rank);
                    ctx.publish_growing(
                        rank,
                        GrowingFile {
                            ready: prefix,
                            ..g.clone()
                        },
                    );
                }
            }
        }
    }
    let built = work
        .await
        .map_err(|e| fail(Box::new(e)))?
        .map_err(|e| fail(Box::new(e)))?;
    // Complete: the trailer after the data (the index) is final too. A file followed so far is
    // followed to its end (the follow holds the file open: its rename does not matter).
    for (rank, g) in growing.into_iter().filter(|(r, _)| published.contains(r)) {
        ctx.publish_growing(rank, GrowingFile { ready: g.size, ..g });
    }
    Ok(built)
}
