use serde::Serialize;

use std::path::{Path, PathBuf};

use super::TOKEN_MAP_FILE;
use super::inputs::rank_cache::{
    ExistingRankFile, RankCacheOptions, VerifyLevel, build_rank_cache, open_checkpoint,
    plan_rank_cache_from, verify_rank_cache,
};
use crate::config::{PreparePolicy, ValidatedConfig};
use crate::context::{Context, Outcome, StepFailure};
use crate::describe::{Action, ActionDetail};
use crate::event::StepKind;
use crate::event::{Event, Level};
use crate::layout::NodeLayout;
use crate::layout::snapshot_dir;

mod overlap;
mod side;
pub(crate) mod source;

use source::InputsSource;

/// One rank's weight file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RankOutput {
    /// Rank.
    pub rank: usize,
    /// Node that serves it.
    pub node: String,
    /// Directory on the head the file is written to.
    pub dir: String,
    /// File name pattern (`rank{R}of{W}-<hash>.bin`).
    pub file: String,
}

/// Every rank's inputs built on the head: rank weight files (TFDSRK01), the token map, RoPE
/// tables and the image routing bias, and the kit verified against its MANIFEST.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RankInputs {
    /// Node that builds (the head).
    pub node: String,
    /// Head directory holding `rank-cache/` and the token map.
    pub inputs_dir: String,
    /// Kit directory on the head.
    pub kit_dir: String,
    /// One entry per rank.
    pub ranks: Vec<RankOutput>,
    /// `ABLIT=1`: the overlay repo and revision whose tensors replace the checkpoint's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overlay: Option<String>,
}

impl RankInputs {
    /// The inputs of `config`.
    #[must_use]
    pub fn new(config: &ValidatedConfig) -> Self {
        let c = config.config();
        let head = NodeLayout::of(config, &c.nodes[0]);
        let world = c.nodes.len();
        let ranks = c
            .nodes
            .iter()
            .enumerate()
            .map(|(r, n)| RankOutput {
                rank: r,
                node: n.name.clone(),
                dir: format!("{}/rank-cache", head.inputs_dir),
                file: format!("rank{r}of{world}-<first 20 hex of sha256 of its index, computed from the checkpoint headers>.bin"),
            })
            .collect();
        Self {
            overlay: c
                .model
                .ablit
                .then(|| format!("{}@{}", c.model.ablit_id, c.model.ablit_revision)),
            node: c.nodes[0].name.clone(),
            inputs_dir: head.inputs_dir,
            kit_dir: head.kit_dir,
            ranks,
        }
    }

    pub(crate) fn describe(&self) -> (String, Vec<Action>) {
        let mut actions: Vec<Action> = self
            .ranks
            .iter()
            .map(|r| {
                Action::with(
                    &self.node,
                    match &self.overlay {
                        None => format!(
                            "rank {} weight file for {} (skipped when verify passes)",
                            r.rank, r.node
                        ),
                        Some(o) => format!(
                            "rank {} weight file for {} with the ABLIT overlay {o} replacing the checkpoint's tensors (skipped when verify passes and its sidecar names this source)",
                            r.rank, r.node
                        ),
                    },
                    ActionDetail::Outputs {
                        files: vec![format!("{}/{}", r.dir, r.file)],
                    },
                )
            })
            .collect();
        actions.push(Action::with(
            &self.node,
            "token map from tokenizer.json (distinct ids = engram_compressed_vocab_size)",
            ActionDetail::Outputs {
                files: vec![format!("{}/{TOKEN_MAP_FILE}", self.inputs_dir)],
            },
        ));
        actions.push(Action::with(
            &self.node,
            "RoPE tables and image routing bias, then the kit against its MANIFEST",
            ActionDetail::Outputs {
                files: [
                    "rope-plain-cos.f32",
                    "rope-plain-sin.f32",
                    "rope-compressed-cos.f32",
                    "rope-compressed-sin.f32",
                    "vision/gate_bias_vl.safetensors",
                    "MANIFEST (sha256 of every entry)",
                ]
                .iter()
                .map(|f| format!("{}/{f}", self.kit_dir))
                .collect(),
            },
        ));
        (
            "build and verify every rank's inputs on the head".to_owned(),
            actions,
        )
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Links (or, across file systems, copies) every regular file below `from` into `to`, following
/// symlinks (HF snapshots are symlinks into `blobs/`): the engine ignores symlinks and a container
/// cannot follow links out of its mount.
fn link_tree(from: &Path, to: &Path, keep: &dyn Fn(&Path) -> bool) -> std::io::Result<u64> {
    let mut n = 0;
    fs_err::create_dir_all(to)?;
    for e in fs_err::read_dir(from)? {
        let e = e?;
        let (src, dst) = (e.path(), to.join(e.file_name()));
        if fs_err::metadata(&src)?.is_dir() {
            n += link_tree(&src, &dst, keep)?;
        } else if keep(&src) && !dst.exists() {
            let real = fs_err::canonicalize(&src)?;
            if fs_err::hard_link(&real, &dst).is_err() {
                let tmp = dst.with_extension("partial");
                crate::safe_fs::copy_exclusive(&real, &tmp, 0o644).map_err(|e| {
                    std::io::Error::new(
                        e.kind(),
                        format!("copy {} to {}: {e}", real.display(), tmp.display()),
                    )
                })?;
                fs_err::rename(&tmp, &dst)?;
            }
            n += 1;
        }
    }
    Ok(n)
}

/// The progress event of a rank file's build on `node` (rate and ETA since `started`).
fn progress_event(
    node: &str,
    world: usize,
    p: &super::inputs::rank_cache::RankCacheProgress,
    started: std::time::Instant,
) -> Event {
    let (rate_bps, eta_s) = crate::event::rate_and_eta(p.bytes_done, p.bytes_total, started);
    Event::Progress {
        source: StepKind::BuildRankCache.into(),
        node: Some(node.to_owned()),
        label: format!("rank{}of{world}", p.rank),
        bytes_done: p.bytes_done,
        bytes_total: Some(p.bytes_total),
        rate_bps,
        eta_s,
        file: None,
    }
}

/// The options every rank file of a deployment is planned and built with.
fn rank_cache_options(
    shape_guard: bool,
    label: &str,
    overlay: Option<PathBuf>,
) -> RankCacheOptions {
    RankCacheOptions {
        engine_shape_guard: shape_guard,
        existing: ExistingRankFile::MoveAside,
        source_label: Some(label.to_owned()),
        overlay,
        ..RankCacheOptions::default()
    }
}

impl RankInputs {
    /// The overlapped part of the build (see `overlap`): once the checkpoint's commit is known,
    /// every rank file is written shard by shard as the shards land.
    async fn stream_while_fetching(
        &self,
        ctx: &Context,
    ) -> Result<Vec<super::inputs::rank_cache::StreamedRank>, StepFailure> {
        ctx.wait_for(StepKind::BuildRankCache, |c| {
            c.facts().model_commit.known().is_some()
        })
        .await?;
        let c = ctx.config().config();
        let label = InputsSource::of(ctx.config(), &ctx.facts()).label();
        let opts = rank_cache_options(c.engine.shape_guard, &label, None);
        let out = PathBuf::from(&self.inputs_dir).join("rank-cache");
        overlap::stream_rank_files(ctx, &self.node, &out, &opts, &label).await
    }
}

impl RankInputs {
    /// Builds (or verifies and skips) every rank's file, the token map, the kit and the Engram
    /// directory on the head.
    pub(crate) async fn build(&self, ctx: &Context) -> Result<Outcome, StepFailure> {
        let fail = |e: BoxError, remedy: &str| {
            StepFailure::new(StepKind::BuildRankCache, e, Some(remedy.to_owned()))
        };
        let c = ctx.config().config();
        let world = self.ranks.len();
        // Overlapped `up`: the rank files are written while the checkpoint arrives; the rest
        // below needs every repository, so it waits for the fetch.
        let (streamed, side_built) = if ctx.overlapped() {
            let (streamed, side_notes) = tokio::try_join!(
                async {
                    let streamed = self.stream_while_fetching(ctx).await?;
                    if streamed.len() == world {
                        ctx.mark_stage(|s| s.rank_files = true);
                    }
                    Ok(streamed)
                },
                self.side_inputs_while_fetching(ctx),
            )?;
            ctx.wait_for(StepKind::BuildRankCache, |c| c.stages().fetched)
                .await?;
            let built = side_notes.is_some();
            for n in side_notes.into_iter().flatten() {
                ctx.log(StepKind::BuildRankCache, Some(&self.node), Level::Info, n);
            }
            (streamed, built)
        } else {
            (Vec::new(), false)
        };
        let facts = ctx.facts();
        let Some(model_commit) = facts.model_commit.known() else {
            return Err(fail(
                "the checkpoint's commit is unknown".into(),
                "run FetchCheckpoint first (`spark-deploy up` runs it)",
            ));
        };
        let model_dir = snapshot_dir(&c.hub.cache, &c.model.id, model_commit);
        let commit_of = |repo: &str, rev: &str| {
            facts
                .commits
                .get(repo)
                .cloned()
                .unwrap_or_else(|| rev.to_owned())
        };
        let original = snapshot_dir(
            &c.hub.cache,
            &c.model.engram_repo,
            &commit_of(&c.model.engram_repo, &c.model.engram_revision),
        );
        let layout = crate::layout::NodeLayout::of(ctx.config(), &c.nodes[0]);
        // The token map and the kit, unless built while the checkpoint arrived.
        let side = (!side_built).then(|| self.side_inputs(ctx, model_commit));
        let shape_guard = c.engine.shape_guard;
        let never = ctx.prepare_policy() == PreparePolicy::Never;
        // Before every launch the data bytes are checked too: against the CRC-32 of each block
        // recorded when the file was built — every block when the file changed since its last
        // full check (its stamp), else a sample, so `up` stays constant-time in the checkpoint's
        // size — or with PREPARE=1 byte for byte against the checkpoint. The index alone misses
        // flipped data bytes.
        let level = if ctx.prepare_policy() == PreparePolicy::Always {
            VerifyLevel::Bytes
        } else {
            VerifyLevel::Stamped
        };
        let wanted = InputsSource::of(ctx.config(), &facts);
        let overlay = match wanted.overlay_dir(ctx.config()) {
            Some(dir) if dir.is_dir() => Some(dir),
            Some(dir) => {
                return Err(fail(
                    format!(
                        "ABLIT=1 but the overlay {} is not in the ABLIT cache ({} is missing)",
                        c.model.ablit_id,
                        dir.display()
                    )
                    .into(),
                    "run FetchCheckpoint first (`spark-deploy up` or `spark-deploy prepare` runs it; the gated overlay needs HF_TOKEN)",
                ));
            }
            None if wanted.ablit.is_some() => {
                return Err(fail(
                    format!(
                        "ABLIT=1 but the commit of the overlay {} at {} is unknown",
                        c.model.ablit_id, c.model.ablit_revision
                    )
                    .into(),
                    "run FetchCheckpoint first (`spark-deploy up` or `spark-deploy prepare` runs it; the gated overlay needs HF_TOKEN)",
                ));
            }
            None => None,
        };
        let label = wanted.label();
        let inputs = PathBuf::from(&self.inputs_dir);
        let engram_dir = PathBuf::from(&layout.engram_dir);
        let node = self.node.clone();
        let sink_ctx: &Context = ctx;
        // Everything below is blocking file work: run it off the async threads, reporting progress.
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Event>();
        let work = tokio::task::spawn_blocking(
            move || -> Result<(u64, Vec<String>), (BoxError, &'static str)> {
                let mut built = 0u64;
                let mut notes = Vec::new();
                let opts = rank_cache_options(shape_guard, &label, overlay);
                let out = inputs.join("rank-cache");
                let unplanned = |e| {
                    (
                        Box::new(e) as BoxError,
                        "the checkpoint does not match the split plan",
                    )
                };
                // Every rank is planned over one reading of the shards' headers.
                let checkpoint = open_checkpoint(&model_dir, &opts).map_err(unplanned)?;
                for rank in 0..world {
                    let plan =
                        plan_rank_cache_from(&model_dir, checkpoint.clone(), rank, world, &opts)
                            .map_err(unplanned)?;
                    if let Some(s) = streamed.iter().find(|s| s.rank == rank) {
                        built += plan.file_len();
                        notes.push(format!(
                            "rank {rank}: built {} while the checkpoint arrived{}",
                            s.path.display(),
                            if s.resumed_shards > 0 {
                                format!(
                                    " ({} shards were already written by an interrupted run)",
                                    s.resumed_shards
                                )
                            } else {
                                String::new()
                            }
                        ));
                        continue;
                    }
                    let mut quiet = |_: &_| Ok(());
                    // The index cannot tell a genuine file from an overlaid one (same shapes, same
                    // name): a verified file is kept only when its sidecar names this source.
                    match verify_rank_cache(&plan, &out, level, &opts, &mut quiet) {
                        Ok(f) => match source::recorded(&f) {
                            Some(s) if s == label => {
                                notes.push(format!(
                                    "rank {rank}: {} verified{}",
                                    plan.file_name,
                                    if level == VerifyLevel::Bytes {
                                        " byte for byte (PREPARE=1)"
                                    } else {
                                        " (build-time CRC-32s: every block if the file changed since its last full check, else a sample)"
                                    }
                                ));
                                continue;
                            }
                            s => notes.push(format!(
                                "rank {rank}: {} was built from {}, rebuilding from {label}",
                                plan.file_name,
                                s.as_deref().unwrap_or("an unrecorded source")
                            )),
                        },
                        Err(e) if out.join(&plan.file_name).exists() => notes.push(format!(
                            "rank {rank}: {} does not verify ({e}), rebuilding",
                            plan.file_name
                        )),
                        Err(_) => {}
                    }
                    if never {
                        return Err((
                            format!(
                                "rank {rank}: {} in {} is missing or does not verify, and PREPARE=0 builds nothing",
                                plan.file_name,
                                out.display()
                            )
                            .into(),
                            PreparePolicy::NOT_PREPARED_REMEDY,
                        ));
                    }
                    let tx2 = tx.clone();
                    let started = std::time::Instant::now();
                    let mut progress = |p: &super::inputs::rank_cache::RankCacheProgress| {
                        let _ = tx2.send(progress_event(&node, world, p, started));
                        Ok(())
                    };
                    let file = build_rank_cache(&plan, &out, &opts, &mut progress).map_err(|e| (Box::new(e) as BoxError, "check the disk space and permissions of the inputs directory on the head, then run `spark-deploy up` again (a partial file is never left under its final name)"))?;
                    built += plan.file_len();
                    notes.push(format!("rank {rank}: built {}", file.display()));
                }
                if let Some(side) = &side {
                    notes.extend(side.build()?);
                }
                if never && !engram_dir.exists() {
                    return Err((
                        format!(
                            "the Engram tables directory {} is missing, and PREPARE=0 builds nothing",
                            engram_dir.display()
                        )
                        .into(),
                        PreparePolicy::NOT_PREPARED_REMEDY,
                    ));
                }
                // Only the Engram shards: the engine reads the tables, nothing else of the
                // original model (its config and index stay in the HF cache).
                let is_shard = |p: &Path| p.extension().is_some_and(|e| e == "safetensors");
                let linked = if never {
                    Ok(0)
                } else {
                    link_tree(&original, &engram_dir, &is_shard)
                }
                .map_err(|e| {
                    (
                        Box::new(e) as BoxError,
                        "the Engram shards must be on the head's local disk",
                    )
                })?;
                if linked > 0 {
                    notes.push(format!("Engram tables: {linked} files linked"));
                }
                drop(tx);
                Ok((built, notes))
            },
        );
        while let Some(ev) = rx.recv().await {
            sink_ctx.emit(ev);
        }
        let (built, notes) = work
            .await
            .map_err(|e| fail(Box::new(e), "internal error"))?
            .map_err(|(e, r)| fail(e, r))?;
        ctx.mark_stage(|s| {
            s.rank_files = true;
            s.side_inputs = true;
            s.built = true;
        });
        for n in &notes {
            ctx.log(
                StepKind::BuildRankCache,
                Some(&self.node),
                Level::Info,
                n.clone(),
            );
        }
        if built == 0 {
            return Ok(Outcome::Skipped {
                reason: format!("every rank file verified: {}", notes.join("; ")),
            });
        }
        Ok(Outcome::Done { bytes: Some(built) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_tree_error_names_its_path() {
        let d = tempfile::tempdir().unwrap();
        let missing = d.path().join("no-such-snapshot");
        let e = link_tree(&missing, &d.path().join("out"), &|_| true).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
        let text = e.to_string();
        assert!(text.contains(&missing.display().to_string()), "{text}");
    }
}
