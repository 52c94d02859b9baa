//! `spark-deploy rank-cache build|verify|index-only MODEL_DIR OUT_DIR RANK WORLD`: the TFDSRK01
//! rank weight file of the dsv41 engine, built natively (docs/engine-contract.md, "The rank
//! file (TFDSRK01)"). A TensorFold tool by nature, so it names the profile's inputs directly.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::PathBuf;

use spark_deploy_core::engine::tensorfold::inputs::{
    ExistingRankFile, RankCacheOptions, RankCachePhase, RankCacheProgress, VerifyLevel,
    build_rank_cache, plan_rank_cache, verify_rank_cache,
};

/// Build, verify or plan a rank weight file.
#[derive(Debug, clap::Args)]
pub(crate) struct RankCacheArgs {
    #[command(subcommand)]
    pub(crate) command: RankCacheCommand,
}

/// The rank-cache operations.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum RankCacheCommand {
    /// Write OUT_DIR/rank{R}of{W}-<hash>.bin (via .rank{R}of{W}.partial, fsync, rename).
    Build {
        #[command(flatten)]
        target: Target,
        /// Move an existing rank file for this rank aside (OUT_DIR/superseded/) instead of refusing.
        #[arg(long)]
        move_aside: bool,
    },
    /// Check the rank file in OUT_DIR (or the file itself) against the plan.
    Verify {
        #[command(flatten)]
        target: Target,
        /// Also compare every data byte with the checkpoint.
        #[arg(long)]
        bytes: bool,
        /// Also check every data block against the CRC-32 its build recorded in
        /// `<file>.source.json` (one read of the rank file; byte for byte when none is recorded).
        #[arg(long, conflicts_with = "bytes")]
        checksums: bool,
    },
    /// Print the index JSON and the expected file name; write nothing.
    IndexOnly {
        #[command(flatten)]
        target: Target,
    },
}

/// The checkpoint, the output and the split.
#[derive(Debug, clap::Args)]
pub(crate) struct Target {
    /// The EXL3 checkpoint directory (config.json, *.safetensors).
    pub(crate) model_dir: PathBuf,
    /// The cache directory (for verify: the directory or the rank file).
    pub(crate) out_dir: PathBuf,
    /// This node's rank.
    pub(crate) rank: usize,
    /// Number of ranks (2 for two Sparks).
    pub(crate) world: usize,
    /// Leave out the DSpark blocks (`mtp.*`).
    #[arg(long)]
    pub(crate) no_dspark: bool,
    /// ABLIT overlay: a safetensors file (or directory) whose tensors replace the base ones.
    #[arg(long)]
    pub(crate) overlay: Option<PathBuf>,
    /// Skip the engine's shape guard (test-scale checkpoints only).
    #[arg(long)]
    pub(crate) test_scale: bool,
    /// Copy threads.
    #[arg(long, default_value_t = 4)]
    pub(crate) threads: usize,
    /// What the checkpoint is (e.g. `repo@revision`), recorded in `<file>.source.json`.
    #[arg(long)]
    pub(crate) source_label: Option<String>,
}

impl Target {
    fn options(&self) -> RankCacheOptions {
        RankCacheOptions {
            dspark: !self.no_dspark,
            engine_shape_guard: !self.test_scale,
            overlay: self.overlay.clone(),
            threads: self.threads,
            source_label: self.source_label.clone(),
            ..RankCacheOptions::default()
        }
    }
}

/// Progress on stderr at every tenth of the data.
fn reporter()
-> impl FnMut(&RankCacheProgress) -> Result<(), spark_deploy_core::engine::tensorfold::inputs::Cancelled>
{
    let mut last = 0u64;
    move |p| {
        let tenth = p.bytes_done * 10 / p.bytes_total.max(1);
        if tenth > last || p.bytes_done == p.bytes_total {
            last = tenth;
            let what = match p.phase {
                RankCachePhase::Write => "written",
                RankCachePhase::Verify => "verified",
            };
            crate::render::note(&format!(
                "rank {}: {:.1} / {:.1} GiB {what}",
                p.rank,
                p.bytes_done as f64 / f64::from(1u32 << 30),
                p.bytes_total as f64 / f64::from(1u32 << 30)
            ));
        }
        Ok(())
    }
}

/// Runs the command and prints its result: `build` prints the reference writer's summary line
/// (`{"file", "entries", "data_bytes", "index_bytes", "rank", "world", "parity", "dspark"}`),
/// `index-only` the index JSON then the file name, `verify` the file checked; with `json`, one JSON
/// document each.
///
/// # Errors
/// Every [`spark_deploy_core::engine::tensorfold::inputs::RankCacheError`], boxed; its message
/// carries the remedy.
pub(crate) fn run(args: RankCacheArgs, json: bool) -> Result<(), Box<dyn std::error::Error>> {
    match args.command {
        RankCacheCommand::Build { target, move_aside } => {
            let mut opts = target.options();
            if move_aside {
                opts.existing = ExistingRankFile::MoveAside;
            }
            let plan = plan_rank_cache(&target.model_dir, target.rank, target.world, &opts)?;
            let file = build_rank_cache(&plan, &target.out_dir, &opts, &mut reporter())?;
            crate::render::out(&plan.summary_json(&file));
        }
        RankCacheCommand::Verify {
            target,
            bytes,
            checksums,
        } => {
            let opts = target.options();
            let plan = plan_rank_cache(&target.model_dir, target.rank, target.world, &opts)?;
            let level = match (bytes, checksums) {
                (true, _) => VerifyLevel::Bytes,
                (false, true) => VerifyLevel::Checksums,
                (false, false) => VerifyLevel::Index,
            };
            let file = verify_rank_cache(&plan, &target.out_dir, level, &opts, &mut reporter())?;
            if json {
                let v = serde_json::json!({
                    "file": file,
                    "ok": true,
                    "entries": plan.entries.len(),
                    "data_bytes": plan.data_bytes,
                    "every_byte_compared": bytes,
                });
                crate::render::out(&v.to_string());
            } else {
                crate::render::out(&format!(
                    "{}: OK ({} entries, {} data bytes{})",
                    file.display(),
                    plan.entries.len(),
                    plan.data_bytes,
                    if bytes { ", every byte compared" } else { "" }
                ));
            }
        }
        RankCacheCommand::IndexOnly { target } => {
            let plan = plan_rank_cache(
                &target.model_dir,
                target.rank,
                target.world,
                &target.options(),
            )?;
            if json {
                let index: serde_json::Value = serde_json::from_str(&plan.index_json)?;
                crate::render::out(
                    &serde_json::json!({ "index": index, "file_name": plan.file_name }).to_string(),
                );
            } else {
                crate::render::out(&plan.index_json);
                crate::render::out(&plan.file_name);
            }
        }
    }
    Ok(())
}
