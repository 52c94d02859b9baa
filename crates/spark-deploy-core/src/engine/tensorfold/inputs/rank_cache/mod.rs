//! The rank file of one rank (TFDSRK01): plan it from the checkpoint, build it, verify one that
//! exists. One module per stage:
//!
//! - `plan`: [`plan_rank_cache`] computes the whole index first, from `config.json`, the shard
//!   headers and the split plan, and each entry's source byte ranges; the file name follows from
//!   the index. Nothing is written.
//! - `copy`: positioned reads of the source ranges (contiguous, strided, or F16 widened to F32)
//!   into bounded per-thread chunks, shared by build and verify. Peak memory is
//!   `threads × (chunk + scratch)`, independent of the checkpoint's size.
//! - `build`: [`build_rank_cache`] writes the chunks with positioned writes to
//!   `.rank{R}of{W}.partial`, fsyncs it and renames it; the sidecar records what it was built from.
//! - `stream`: [`build_rank_caches_streaming`] writes every rank's entries shard by shard as the
//!   shards arrive (plans made from headers read ahead), journalled so an interrupted build
//!   resumes after the last shard it synced.
//! - `content`: the sha256 of the whole file, hashed in order from the chunks the build writes and
//!   recorded in the sidecar with the file's stamp, so shipping the file to a worker does not
//!   read it again on the head ([`content::recorded_sha256`]).
//! - `checksum`: the CRC-32 of every block of the data section, recorded in the sidecar by the
//!   build and checked at [`VerifyLevel::Checksums`] (the level `up` uses before launch).
//! - `verify`: [`verify_rank_cache`] checks an existing file's index and, at
//!   [`VerifyLevel::Checksums`], every data block against its recorded CRC-32 or, at
//!   [`VerifyLevel::Bytes`], every data byte against the checkpoint.

use std::path::PathBuf;

use super::model_config::ModelConfigError;
use super::rank_file::RankFileError;
use super::safetensors_index::SafetensorsError;
use super::split_plan::SplitPlanError;

mod build;
pub mod checksum;
pub mod content;
mod copy;
mod plan;
pub mod stamp;
mod stream;
mod verify;

pub use build::{build_rank_cache, read_sidecar, sidecar_path};
pub use plan::{
    PlannedEntry, RankCachePlan, SourceRange, open_checkpoint, plan_rank_cache,
    plan_rank_cache_from,
};
pub use stream::{NextShard, StreamedRank, build_rank_caches_streaming};
pub use verify::{VerifyLevel, verify_rank_cache};

/// Why a rank file could not be planned, built or verified.
#[derive(Debug, thiserror::Error)]
pub enum RankCacheError {
    /// `config.json` was refused.
    #[error(transparent)]
    Config(#[from] ModelConfigError),
    /// A shard header or the index json was refused.
    #[error(transparent)]
    Checkpoint(#[from] SafetensorsError),
    /// No split for this rank/world.
    #[error(transparent)]
    Plan(#[from] SplitPlanError),
    /// A rank-file format or discovery error.
    #[error(transparent)]
    RankFile(#[from] RankFileError),
    /// A tensor the plan needs is missing.
    #[error(
        "rank {rank}: entry `{key}` needs tensor `{tensor}`, which no shard in {model_dir} holds; the checkpoint is incomplete or not the dsv41 EXL3 export, re-download it"
    )]
    MissingTensor {
        /// The rank.
        rank: usize,
        /// The entry key.
        key: String,
        /// The source tensor.
        tensor: String,
        /// The checkpoint directory.
        model_dir: PathBuf,
    },
    /// A source tensor's dtype or shape is not what the plan needs.
    #[error(
        "rank {rank}: entry `{key}` from tensor `{tensor}`: {problem}; the checkpoint does not match its config.json, re-download it"
    )]
    Layout {
        /// The rank.
        rank: usize,
        /// The entry key.
        key: String,
        /// The source tensor.
        tensor: String,
        /// What is wrong.
        problem: String,
    },
    /// The output directory already holds a file for this rank and world.
    #[error("{dir} already holds {} for rank {rank} of {world}; verify it instead of rebuilding, or remove it (or build with ExistingRankFile::MoveAside)", existing.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "))]
    Exists {
        /// The output directory.
        dir: PathBuf,
        /// The rank.
        rank: usize,
        /// The world.
        world: usize,
        /// The files found.
        existing: Vec<PathBuf>,
    },
    /// Reading a source or writing the output failed.
    #[error("rank {rank}: cannot {op} {path}: {source}; check free space and permissions")]
    Io {
        /// The rank.
        rank: usize,
        /// What was being done.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Reading an entry's source bytes failed.
    #[error(
        "rank {rank}: cannot read entry `{key}` from {path}: {source}; the shard may be truncated or on a failing disk, re-download it"
    )]
    ReadSource {
        /// The rank.
        rank: usize,
        /// The entry being copied.
        key: String,
        /// The shard.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The progress callback asked to stop; no file was left under a final name.
    #[error("rank {rank}: the build was cancelled; no rank file was written, run it again")]
    Cancelled {
        /// The rank.
        rank: usize,
    },
    /// Verify found a difference.
    #[error("{file}: {problem} (entry `{key}`); delete the file and rebuild the rank cache")]
    Mismatch {
        /// The rank file.
        file: PathBuf,
        /// The first entry that differs (or `-` for the file as a whole).
        key: String,
        /// What differs.
        problem: String,
    },
    /// A worker thread panicked.
    #[error("rank {rank}: a copy thread panicked; this is a bug, please report it")]
    WorkerPanicked {
        /// The rank.
        rank: usize,
    },
}

impl RankCacheError {
    /// The error of `op` on `path` for `rank`, to map an I/O error with.
    pub(super) fn io(
        rank: usize,
        op: &'static str,
        path: &std::path::Path,
    ) -> impl FnOnce(std::io::Error) -> Self + use<> {
        let path = path.to_path_buf();
        move |source| Self::Io {
            rank,
            op,
            path,
            source,
        }
    }

    /// The error of reading entry `e`'s bytes from its shard for `plan`.
    pub(super) fn read_source(
        plan: &plan::RankCachePlan,
        e: &plan::PlannedEntry,
    ) -> impl FnOnce(std::io::Error) -> Self + use<> {
        let (rank, key) = (plan.rank, e.row.key.clone());
        let path = plan.checkpoint.shards[e.source.shard()].path.clone();
        move |source| Self::ReadSource {
            rank,
            key,
            path,
            source,
        }
    }
}

/// What to do when the output directory already holds a file for this rank and world.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExistingRankFile {
    /// Refuse to build (the default).
    #[default]
    Refuse,
    /// Move old files into `OUT_DIR/superseded/` before the new one gets its final name, so the
    /// directory ends with exactly one file for the rank.
    MoveAside,
}

/// Options of a rank-file build.
#[derive(Debug, Clone)]
pub struct RankCacheOptions {
    /// Include the DSpark blocks and heads (`mtp.*`), as the reference writer does by default.
    pub dspark: bool,
    /// Apply the engine's shape guard (the real profile). Test-scale checkpoints turn it off.
    pub engine_shape_guard: bool,
    /// `ABLIT`: a safetensors file (or a directory of them) whose tensors replace the base ones.
    pub overlay: Option<PathBuf>,
    /// Copy threads.
    pub threads: usize,
    /// Bytes per chunk (each thread holds one chunk and up to one scratch chunk at a time).
    pub chunk_bytes: usize,
    /// Behaviour when a file for this rank already exists.
    pub existing: ExistingRankFile,
    /// What the checkpoint is (e.g. `repo@revision`, plus the ABLIT overlay's identity), recorded
    /// in the sidecar. The file name alone cannot tell two revisions (or a base and an ABLIT
    /// build) with the same shapes apart: the index holds no content hash.
    pub source_label: Option<String>,
}

impl Default for RankCacheOptions {
    fn default() -> Self {
        Self {
            dspark: true,
            engine_shape_guard: true,
            overlay: None,
            threads: 4,
            chunk_bytes: 8 << 20,
            existing: ExistingRankFile::Refuse,
            source_label: None,
        }
    }
}

/// Which operation a progress report is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RankCachePhase {
    /// Writing the rank file.
    Write,
    /// Comparing the rank file with the checkpoint.
    Verify,
}

/// Progress of a build or a byte verification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankCacheProgress {
    /// The rank.
    pub rank: usize,
    /// Write or verify.
    pub phase: RankCachePhase,
    /// Data bytes done.
    pub bytes_done: u64,
    /// Data bytes in all.
    pub bytes_total: u64,
    /// Bytes from the start of the partial file that are final: written, and never written
    /// again by this build (a build that writes in any order promises its sha256 frontier; 0
    /// where nothing is promised). A worker may receive them ahead of the rest.
    pub final_prefix: u64,
}

/// Returned by a progress callback to stop the operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cancelled;

/// The progress callback: called from the calling thread after every chunk; `Err(Cancelled)` stops.
pub type ProgressFn<'a> = &'a mut dyn FnMut(&RankCacheProgress) -> Result<(), Cancelled>;
