//! The head's inputs besides the rank files and the Engram tables: the token map (from the
//! checkpoint's tokenizer) and the kit (linked from its snapshot, its RoPE tables and image
//! routing bias generated when it does not publish them, every file checked against its
//! MANIFEST). In an overlapped `up` they are built as soon as the kit's repository and the
//! checkpoint's config and tokenizer have landed (the fetch takes the kit first), so the workers
//! receive them while the shards still arrive.

use std::path::{Path, PathBuf};

use super::super::TOKEN_MAP_FILE;
use super::super::inputs::{bias_vl, kit, model_config::ModelConfig, rope, token_map};
use super::{BoxError, RankInputs, link_tree};
use crate::config::PreparePolicy;
use crate::context::{Context, StepFailure};
use crate::event::StepKind;
use crate::layout::snapshot_dir;

/// A failure of the side inputs: what went wrong and its remedy.
pub(super) type SideFailure = (BoxError, &'static str);

/// Where the side inputs come from and go to, on the head.
#[derive(Debug, Clone)]
pub(super) struct SideInputs {
    /// The checkpoint's snapshot (config and tokenizer).
    model_dir: PathBuf,
    /// The kit's snapshot (`…/kit`).
    kit_src: PathBuf,
    /// The original model's snapshot (the image routing bias from its shards, last resort).
    original: PathBuf,
    /// The bias read by byte range at fetch when the kit does not publish it.
    fetched_bias: PathBuf,
    /// The head's kit directory.
    kit_dir: PathBuf,
    /// The head's token map.
    token_map: PathBuf,
    /// PREPARE=0: nothing is made, what is missing is named.
    never: bool,
}

impl SideInputs {
    /// The kit's published bias, or the one read by byte range at fetch: with either the side
    /// inputs need nothing of the original model's shards.
    fn bias_at_hand(&self) -> bool {
        self.kit_src
            .join("vision/gate_bias_vl.safetensors")
            .exists()
            || self
                .kit_dir
                .join("vision/gate_bias_vl.safetensors")
                .exists()
            || self.fetched_bias.exists()
    }

    /// Builds what is missing (PREPARE=0: names it instead), then checks every kit file against
    /// MANIFEST; notes of what was done.
    ///
    /// # Errors
    ///
    /// A [`SideFailure`]: a missing input under PREPARE=0, a tokenizer or config that does not
    /// yield the map or the tables, an unreadable kit, or a kit file that does not match MANIFEST.
    pub(super) fn build(&self) -> Result<Vec<String>, SideFailure> {
        let mut notes = Vec::new();
        let kit_dir = &self.kit_dir;
        let made_nothing = |path: &Path, what: &str| {
            if self.never && !path.exists() {
                return Err((
                    format!(
                        "{what} {} is missing, and PREPARE=0 builds nothing",
                        path.display()
                    )
                    .into(),
                    PreparePolicy::NOT_PREPARED_REMEDY,
                ));
            }
            Ok(())
        };
        made_nothing(&self.token_map, "the token map")?;
        made_nothing(&kit_dir.join("MANIFEST"), "the kit")?;
        made_nothing(&kit_dir.join("rope-plain-cos.f32"), "the RoPE table")?;
        made_nothing(
            &kit_dir.join("vision/gate_bias_vl.safetensors"),
            "the vision gate bias",
        )?;
        if !self.token_map.exists() {
            let m = token_map::write_token_map(&self.model_dir, &self.token_map).map_err(|e| {
                (
                    Box::new(e) as BoxError,
                    "the tokenizer must yield engram_compressed_vocab_size distinct ids",
                )
            })?;
            notes.push(format!(
                "token map: {} ids",
                m.to_json().matches(',').count() + 1
            ));
        }
        // The published files (hard-linked), generated RoPE tables and bias when missing.
        if self.kit_src.is_dir() && !self.never {
            link_tree(&self.kit_src, kit_dir, &|_| true)
                .map_err(|e| (Box::new(e) as BoxError, "the kit must be readable"))?;
        }
        if !kit_dir.join("rope-plain-cos.f32").exists() {
            let cfg = ModelConfig::read(&self.model_dir)
                .map_err(|e| (Box::new(e) as BoxError, "config.json must parse"))?;
            rope::write_rope_tables(&cfg, kit_dir, None).map_err(|e| {
                (
                    Box::new(e) as BoxError,
                    "download the kit's published RoPE tables",
                )
            })?;
        }
        let bias = kit_dir.join("vision/gate_bias_vl.safetensors");
        if !bias.exists() && self.fetched_bias.exists() {
            // Read by byte range from the Hub at fetch (the kit does not publish it).
            fs_err::create_dir_all(kit_dir.join("vision"))
                .and_then(|()| fs_err::copy(&self.fetched_bias, &bias).map(|_| ()))
                .map_err(|e| (Box::new(e) as BoxError, "the kit dir must be writable"))?;
        }
        if !bias.exists() {
            bias_vl::write_bias_vl(&self.original, &bias).map_err(|e| {
                (
                    Box::new(e) as BoxError,
                    "download the kit's gate_bias_vl.safetensors",
                )
            })?;
        }
        let files = kit::verify_kit(kit_dir).map_err(|e| {
            (
                Box::new(e) as BoxError,
                "download the kit again (its files must match MANIFEST)",
            )
        })?;
        notes.push(format!("kit OK: {files} files match MANIFEST"));
        Ok(notes)
    }
}

impl RankInputs {
    /// The side inputs of this deployment with the checkpoint at `model_commit` (the other
    /// repositories at the commits the fetch found, else at their configured revisions).
    pub(super) fn side_inputs(&self, ctx: &Context, model_commit: &str) -> SideInputs {
        let c = ctx.config().config();
        let facts = ctx.facts();
        let snapshot = |repo: &str, rev: &str| {
            let commit = facts
                .commits
                .get(repo)
                .cloned()
                .unwrap_or_else(|| rev.to_owned());
            snapshot_dir(&c.hub.cache, repo, &commit)
        };
        let layout = crate::layout::NodeLayout::of(ctx.config(), &c.nodes[0]);
        SideInputs {
            model_dir: snapshot_dir(&c.hub.cache, &c.model.id, model_commit),
            kit_src: snapshot(&c.model.kit_repo, &c.model.kit_revision).join("kit"),
            original: snapshot(&c.model.engram_repo, &c.model.engram_revision),
            fetched_bias: PathBuf::from(&layout.bias_vl_file),
            kit_dir: PathBuf::from(&self.kit_dir),
            token_map: PathBuf::from(&self.inputs_dir).join(TOKEN_MAP_FILE),
            never: ctx.prepare_policy() == PreparePolicy::Never,
        }
    }

    /// The overlapped part of the side inputs: built once the kit's repository is fetched, the
    /// checkpoint's config and tokenizer have landed and the rank files' plan has said which
    /// shards it wants first (or, when the bias must come from the
    /// original model, once the fetch has finished); `Stages::side_inputs` then lets the workers
    /// have them. `None` under PREPARE=0 (the build checks what is there after the fetch).
    ///
    /// # Errors
    ///
    /// A [`StepFailure`] of BuildRankCache: what [`SideInputs::build`] reports, or the run
    /// cancelled.
    pub(super) async fn side_inputs_while_fetching(
        &self,
        ctx: &Context,
    ) -> Result<Option<Vec<String>>, StepFailure> {
        if ctx.prepare_policy() == PreparePolicy::Never {
            return Ok(None);
        }
        let c = ctx.config().config();
        let landed = |c: &Context, file: &str| {
            c.facts().model_commit.known().is_some_and(|commit| {
                snapshot_dir(
                    &c.config().config().hub.cache,
                    &c.config().config().model.id,
                    commit,
                )
                .join(file)
                .exists()
            })
        };
        // After the rank files' plan has told the fetch which shards it wants first (the large
        // downloads wait for that wish): this work must not slow the planning down.
        ctx.wait_for(StepKind::BuildRankCache, |x| {
            x.stages().fetched
                || (x.repo_fetched(&c.model.kit_repo)
                    && landed(x, "config.json")
                    && landed(x, "tokenizer.json")
                    && x.wanted_first().is_some())
        })
        .await?;
        let Some(commit) = ctx.facts().model_commit.known().cloned() else {
            return Err(StepFailure::new(
                StepKind::BuildRankCache,
                "the checkpoint's commit is unknown",
                Some("run FetchCheckpoint first (`spark-deploy up` runs it)".into()),
            ));
        };
        let mut side = self.side_inputs(ctx, &commit);
        if !side.bias_at_hand() {
            // The bias comes from the fetch's last part, or from the original model's shards.
            ctx.wait_for(StepKind::BuildRankCache, |x| x.stages().fetched)
                .await?;
            side = self.side_inputs(ctx, &commit);
        }
        let notes = tokio::task::spawn_blocking(move || side.build())
            .await
            .map_err(|e| {
                StepFailure::new(StepKind::BuildRankCache, e, Some("internal error".into()))
            })?
            .map_err(|(e, remedy)| {
                StepFailure::new(StepKind::BuildRankCache, e, Some(remedy.to_owned()))
            })?;
        ctx.mark_stage(|s| s.side_inputs = true);
        Ok(Some(notes))
    }
}
