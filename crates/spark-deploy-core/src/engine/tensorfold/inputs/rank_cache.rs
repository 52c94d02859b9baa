//! BuildRankCache for the dsv41 engine: plan a rank file from the checkpoint (index only), stream it
//! to disk, and verify one that exists (ENGINE-CONTRACT.md §4, §5).
//!
//! The whole index is computed first from `config.json`, the shard headers and the split plan; the
//! file name follows from it. Bytes are then copied by positioned reads of the source byte ranges
//! into bounded per-thread buffers and written with positioned writes to
//! `.rank{R}of{W}.partial`, which is fsync'd and renamed. Peak memory is
//! `threads × (chunk + scratch)`, independent of the checkpoint's size.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;

use super::dtype::{DType, f16_to_f32_bits};
use super::model_config::{ModelConfig, ModelConfigError};
use super::rank_file::{self, IndexRow, RankFileError};
use super::safetensors_index::{Checkpoint, SafetensorsError, TensorInfo};
use super::split_plan::{self, Part, SplitPlanError, Want, WantKind};

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
}

/// Returned by a progress callback to stop the operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cancelled;

/// The progress callback: called from the calling thread after every chunk; `Err(Cancelled)` stops.
pub type ProgressFn<'a> = &'a mut dyn FnMut(&RankCacheProgress) -> Result<(), Cancelled>;

/// Where an entry's bytes come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceRange {
    /// One contiguous byte range.
    Contiguous {
        /// Shard index.
        shard: usize,
        /// Absolute offset.
        offset: u64,
    },
    /// `count` runs of `run` bytes, `stride` apart (a trellis column slice).
    Strided {
        /// Shard index.
        shard: usize,
        /// Absolute offset of the first run.
        offset: u64,
        /// Bytes per run.
        run: u64,
        /// Distance between runs.
        stride: u64,
        /// Number of runs.
        count: u64,
    },
    /// f16 values widened to f32 (the entry is twice the source's size).
    WidenF16 {
        /// Shard index.
        shard: usize,
        /// Absolute offset.
        offset: u64,
    },
}

/// One entry of the planned rank file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedEntry {
    /// The index row.
    pub row: IndexRow,
    /// The source tensor's name.
    pub tensor: String,
    /// Where its bytes come from.
    pub source: SourceRange,
}

/// A rank file computed from the checkpoint, before any byte is written (`--index-only`).
#[derive(Debug, Clone)]
pub struct RankCachePlan {
    /// The rank.
    pub rank: usize,
    /// The world.
    pub world: usize,
    /// Whether the DSpark entries are included.
    pub dspark: bool,
    /// The checkpoint directory.
    pub model_dir: PathBuf,
    /// The parsed config.
    pub config: ModelConfig,
    /// Entries in file order.
    pub entries: Vec<PlannedEntry>,
    /// The index JSON text, byte-exact.
    pub index_json: String,
    /// `rank{R}of{W}-{hash20}.bin`.
    pub file_name: String,
    /// Length of the data section.
    pub data_bytes: u64,
    /// The opened checkpoint (with the overlay applied).
    pub checkpoint: Checkpoint,
}

impl RankCachePlan {
    /// Length of the whole file.
    #[must_use]
    pub fn file_len(&self) -> u64 {
        self.data_bytes + self.index_json.len() as u64 + 16
    }

    /// The sidecar written next to a built file (`<file>.source.json`): the index hash, the split,
    /// and `source_label`.
    #[must_use]
    pub fn sidecar_json(&self, source_label: Option<&str>, overlay: Option<&Path>) -> String {
        serde_json::json!({
            "file": self.file_name,
            "index_sha256": crate::digest::sha256_hex(&self.index_json),
            "entries": self.entries.len(),
            "data_bytes": self.data_bytes,
            "rank": self.rank,
            "world": self.world,
            "dspark": self.dspark,
            "overlay": overlay.map(|p| p.display().to_string()),
            "source": source_label,
        })
        .to_string()
    }

    /// The summary line the reference writer prints (`{"file", "entries", ...}`), for this plan
    /// written to `file`.
    #[must_use]
    pub fn summary_json(&self, file: &Path) -> String {
        serde_json::json!({
            "file": file.display().to_string(),
            "entries": self.entries.len(),
            "data_bytes": self.data_bytes,
            "index_bytes": self.index_json.len(),
            "rank": self.rank,
            "world": self.world,
            "parity": false,
            "dspark": self.dspark,
        })
        .to_string()
    }
}

/// Computes the rank file for `rank` of `world` from `model_dir` without writing anything: the
/// index JSON, the expected file name, and each entry's source byte ranges.
///
/// # Errors
/// A refused `config.json` (and, with `engine_shape_guard`, shapes other than the real
/// checkpoint's), unreadable shard headers, an invalid rank/world, a missing tensor, or a source
/// tensor whose dtype or shape disagrees with the plan (checked for every entry before any byte
/// is written).
pub fn plan_rank_cache(
    model_dir: &Path,
    rank: usize,
    world: usize,
    opts: &RankCacheOptions,
) -> Result<RankCachePlan, RankCacheError> {
    let config = ModelConfig::read(model_dir)?;
    config.check_model_kind(&model_dir.join("config.json"))?;
    if opts.engine_shape_guard {
        config.check_engine_shapes(&model_dir.join("config.json"))?;
    }
    let wants = split_plan::plan(&config, rank, world, opts.dspark)?;
    let mut checkpoint = Checkpoint::open_dir(model_dir)?;
    if let Some(ov) = &opts.overlay {
        checkpoint = checkpoint.with_overlay(ov)?;
    }
    let mut entries = Vec::with_capacity(wants.len());
    let mut at = 0u64;
    for w in wants {
        let t = checkpoint
            .get(&w.tensor)
            .ok_or_else(|| RankCacheError::MissingTensor {
                rank,
                key: w.key.clone(),
                tensor: w.tensor.clone(),
                model_dir: model_dir.to_path_buf(),
            })?;
        let (dtype, shape, source) = resolve(&w, t).map_err(|problem| RankCacheError::Layout {
            rank,
            key: w.key.clone(),
            tensor: w.tensor.clone(),
            problem,
        })?;
        let bytes = shape.iter().product::<usize>() as u64 * dtype.size() as u64;
        entries.push(PlannedEntry {
            row: IndexRow {
                key: w.key,
                dtype,
                shape,
                offset: at,
                bytes,
            },
            tensor: w.tensor,
            source,
        });
        at += bytes;
    }
    let index_json = rank_file::index_json(entries.iter().map(|e| &e.row))?;
    let file_name = rank_file::file_name(rank, world, index_json.as_bytes());
    Ok(RankCachePlan {
        rank,
        world,
        dspark: opts.dspark,
        model_dir: model_dir.to_path_buf(),
        config,
        entries,
        index_json,
        file_name,
        data_bytes: at,
        checkpoint,
    })
}

/// The written dtype, shape and source range of one wanted entry, or why the source cannot give it.
fn resolve(w: &Want, t: &TensorInfo) -> Result<(DType, Vec<usize>, SourceRange), String> {
    let stored = t.dtype.ok_or_else(|| {
        format!(
            "has dtype {}, which the rank file cannot hold",
            t.dtype_name
        )
    })?;
    let shard = t.shard;
    match &w.kind {
        WantKind::Plain { target } => {
            let target = target.unwrap_or(stored);
            if target.torch_name().is_none() {
                return Err(format!(
                    "has dtype {stored}, which the rank file cannot hold"
                ));
            }
            if target == stored {
                Ok((
                    stored,
                    t.shape.clone(),
                    SourceRange::Contiguous {
                        shard,
                        offset: t.offset,
                    },
                ))
            } else if stored == DType::F16 && target == DType::F32 {
                Ok((
                    target,
                    t.shape.clone(),
                    SourceRange::WidenF16 {
                        shard,
                        offset: t.offset,
                    },
                ))
            } else {
                Err(format!(
                    "is stored as {stored}; the key asks for {target} and only F16 → F32 widening is defined"
                ))
            }
        }
        WantKind::Exl3 {
            part,
            cols,
            rows,
            k16,
            n16,
        } => {
            let tile_ok =
                |r: &(usize, usize)| r.0.is_multiple_of(16) && r.1.is_multiple_of(16) && r.0 < r.1;
            for r in cols.iter().chain(rows.iter()) {
                if !tile_ok(r) {
                    return Err(format!(
                        "range ({}, {}) is not on 16-element tiles",
                        r.0, r.1
                    ));
                }
            }
            match part {
                Part::Tr => {
                    if stored != DType::I16 || t.shape.len() != 3 {
                        return Err(format!(
                            "is {stored} {:?}; a trellis is int16 [K/16, N/16, 16·bits]",
                            t.shape
                        ));
                    }
                    let (kt_all, nt_all, words) = (t.shape[0], t.shape[1], t.shape[2]);
                    let es = 2u64;
                    let row = (nt_all * words) as u64 * es;
                    let (k0, kt) = match rows {
                        Some((a, b)) => (a / 16, (b - a) / 16),
                        None => (0, kt_all),
                    };
                    if k0 + kt > kt_all {
                        return Err(format!(
                            "rows reach K-tile {} but the trellis has {kt_all}",
                            k0 + kt
                        ));
                    }
                    let (n0, nt) = match cols {
                        Some((a, b)) => (a / 16, (b - a) / 16),
                        None => (0, nt_all),
                    };
                    if n0 + nt > nt_all {
                        return Err(format!(
                            "columns reach N-tile {} but the trellis has {nt_all}",
                            n0 + nt
                        ));
                    }
                    if let Some(k) = k16
                        && *k != kt
                    {
                        return Err(format!("K/16 is {kt}, the plan expects {k}"));
                    }
                    if let Some(n) = n16
                        && *n != nt
                    {
                        return Err(format!("N/16 is {nt}, the plan expects {n}"));
                    }
                    let shape = vec![kt, nt, words];
                    let base = t.offset + k0 as u64 * row;
                    let source = if nt == nt_all {
                        SourceRange::Contiguous {
                            shard,
                            offset: base,
                        }
                    } else {
                        SourceRange::Strided {
                            shard,
                            offset: base + (n0 * words) as u64 * es,
                            run: (nt * words) as u64 * es,
                            stride: row,
                            count: kt as u64,
                        }
                    };
                    Ok((DType::I16, shape, source))
                }
                Part::Suh | Part::Svh => {
                    if stored != DType::F16 || t.shape.len() != 1 {
                        return Err(format!(
                            "is {stored} {:?}; suh/svh are float16 vectors",
                            t.shape
                        ));
                    }
                    let sel = if *part == Part::Suh { rows } else { cols };
                    let (a, b) = sel.unwrap_or((0, t.shape[0]));
                    if b > t.shape[0] {
                        return Err(format!(
                            "range ends at {b} but the vector has {}",
                            t.shape[0]
                        ));
                    }
                    Ok((
                        DType::F16,
                        vec![b - a],
                        SourceRange::Contiguous {
                            shard,
                            offset: t.offset + a as u64 * 2,
                        },
                    ))
                }
            }
        }
    }
}

/// Copies entry bytes `[p0, p1)` of `e` into `dst`.
fn copy_piece(
    e: &PlannedEntry,
    files: &[File],
    p0: u64,
    p1: u64,
    dst: &mut [u8],
    scratch: &mut Vec<u8>,
) -> std::io::Result<()> {
    match e.source {
        SourceRange::Contiguous { shard, offset } => files[shard].read_exact_at(dst, offset + p0),
        SourceRange::WidenF16 { shard, offset } => {
            let (e0, e1) = (p0 / 4, p1.div_ceil(4));
            let n = (e1 - e0) as usize;
            scratch.resize(n * 6, 0);
            let (half, wide) = scratch.split_at_mut(n * 2);
            files[shard].read_exact_at(half, offset + e0 * 2)?;
            for (h, w) in half.chunks_exact(2).zip(wide.chunks_exact_mut(4)) {
                let bits = f16_to_f32_bits(u16::from_le_bytes([h[0], h[1]]));
                w.copy_from_slice(&bits.to_le_bytes());
            }
            let skip = (p0 - e0 * 4) as usize;
            dst.copy_from_slice(&wide[skip..skip + dst.len()]);
            Ok(())
        }
        SourceRange::Strided {
            shard,
            offset,
            run,
            stride,
            ..
        } => {
            let (r0, r1) = (p0 / run, (p1 - 1) / run);
            let src_of = |p: u64| offset + (p / run) * stride + p % run;
            if r0 == r1 {
                return files[shard].read_exact_at(dst, src_of(p0));
            }
            let span0 = src_of(p0);
            let span1 = offset + r1 * stride + (p1 - r1 * run);
            let span = span1 - span0;
            // one read covering every run when that reads at most about twice what is kept
            // (column halves); otherwise a read a run
            if span <= dst.len() as u64 * 2 + 2 * stride {
                scratch.resize(span as usize, 0);
                files[shard].read_exact_at(scratch, span0)?;
                let mut p = p0;
                while p < p1 {
                    let end = ((p / run) + 1) * run;
                    let end = end.min(p1);
                    let s = (src_of(p) - span0) as usize;
                    let d = (p - p0) as usize;
                    let n = (end - p) as usize;
                    dst[d..d + n].copy_from_slice(&scratch[s..s + n]);
                    p = end;
                }
            } else {
                let mut p = p0;
                while p < p1 {
                    let end = (((p / run) + 1) * run).min(p1);
                    let d = (p - p0) as usize;
                    files[shard].read_exact_at(&mut dst[d..d + (end - p) as usize], src_of(p))?;
                    p = end;
                }
            }
            Ok(())
        }
    }
}

/// Fills `buf` with data bytes `[start, start + buf.len())` of the planned file.
fn fill_chunk(
    plan: &RankCachePlan,
    files: &[File],
    start: u64,
    buf: &mut [u8],
    scratch: &mut Vec<u8>,
) -> Result<(), RankCacheError> {
    let end = start + buf.len() as u64;
    let entries = &plan.entries;
    let mut i = entries.partition_point(|e| e.row.offset + e.row.bytes <= start);
    while i < entries.len() && entries[i].row.offset < end {
        let e = &entries[i];
        let (o, n) = (e.row.offset, e.row.bytes);
        if n > 0 {
            let p0 = start.max(o) - o;
            let p1 = end.min(o + n) - o;
            let dst = &mut buf[(o + p0 - start) as usize..(o + p1 - start) as usize];
            let shard = match e.source {
                SourceRange::Contiguous { shard, .. }
                | SourceRange::Strided { shard, .. }
                | SourceRange::WidenF16 { shard, .. } => shard,
            };
            copy_piece(e, files, p0, p1, dst, scratch).map_err(|source| {
                RankCacheError::ReadSource {
                    rank: plan.rank,
                    key: e.row.key.clone(),
                    path: plan.checkpoint.shards[shard].path.clone(),
                    source,
                }
            })?;
        }
        i += 1;
    }
    Ok(())
}

/// Receives each filled chunk with its data offset (write it, or compare it).
type ChunkSink<'a> = dyn Fn(u64, &[u8]) -> Result<(), RankCacheError> + Sync + 'a;

/// Runs `sink` on every chunk of the data section, chunks filled in parallel from the checkpoint.
fn for_each_chunk(
    plan: &RankCachePlan,
    opts: &RankCacheOptions,
    phase: RankCachePhase,
    progress: ProgressFn<'_>,
    sink: &ChunkSink<'_>,
) -> Result<(), RankCacheError> {
    let files = plan
        .checkpoint
        .shards
        .iter()
        .map(|s| {
            File::open(&s.path).map_err(|source| RankCacheError::Io {
                rank: plan.rank,
                op: "open",
                path: s.path.clone(),
                source,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let chunk = opts.chunk_bytes.max(4096) as u64 / 4 * 4;
    let total = plan.data_bytes;
    let n_chunks = total.div_ceil(chunk);
    let next = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let threads = opts.threads.clamp(1, 64).min(n_chunks.max(1) as usize);
    let (tx, rx) = mpsc::sync_channel::<Result<u64, RankCacheError>>(threads * 2);
    let mut first_err: Option<RankCacheError> = None;
    let mut done = 0u64;
    let mut cancelled = false;
    let panicked = std::thread::scope(|scope| {
        let mut handles = Vec::with_capacity(threads);
        for _ in 0..threads {
            let tx = tx.clone();
            let (files, next, stop) = (&files, &next, &stop);
            handles.push(scope.spawn(move || {
                let mut buf = Vec::new();
                let mut scratch = Vec::new();
                loop {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n_chunks {
                        return;
                    }
                    let start = i * chunk;
                    let len = chunk.min(total - start) as usize;
                    buf.resize(len, 0);
                    let r = fill_chunk(plan, files, start, &mut buf, &mut scratch)
                        .and_then(|()| sink(start, &buf))
                        .map(|()| len as u64);
                    let failed = r.is_err();
                    if tx.send(r).is_err() || failed {
                        return;
                    }
                }
            }));
        }
        drop(tx);
        for r in rx.iter() {
            match r {
                Ok(n) => {
                    done += n;
                    if !cancelled && first_err.is_none() {
                        let p = RankCacheProgress {
                            rank: plan.rank,
                            phase,
                            bytes_done: done,
                            bytes_total: total,
                        };
                        if progress(&p).is_err() {
                            cancelled = true;
                            stop.store(true, Ordering::Relaxed);
                        }
                    }
                }
                Err(e) => {
                    stop.store(true, Ordering::Relaxed);
                    if first_err.is_none() {
                        first_err = Some(e);
                    }
                }
            }
        }
        handles.into_iter().any(|h| h.join().is_err())
    });
    if panicked {
        return Err(RankCacheError::WorkerPanicked { rank: plan.rank });
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    if cancelled {
        return Err(RankCacheError::Cancelled { rank: plan.rank });
    }
    if total == 0 {
        let p = RankCacheProgress {
            rank: plan.rank,
            phase,
            bytes_done: 0,
            bytes_total: 0,
        };
        progress(&p).map_err(|Cancelled| RankCacheError::Cancelled { rank: plan.rank })?;
    }
    Ok(())
}

/// Writes the planned rank file into `out_dir`: `.rank{R}of{W}.partial`, fsync, rename to
/// [`RankCachePlan::file_name`], fsync of the directory. Returns the final path.
///
/// # Errors
/// [`RankCacheError::Exists`] when `out_dir` already holds a `rank{R}of{W}-*.bin` (unless
/// [`ExistingRankFile::MoveAside`]); read or write failures; [`RankCacheError::Cancelled`] when
/// the progress callback stops the build. On any error the partial file is removed, and no file
/// is ever left under a final name.
pub fn build_rank_cache(
    plan: &RankCachePlan,
    out_dir: &Path,
    opts: &RankCacheOptions,
    progress: ProgressFn<'_>,
) -> Result<PathBuf, RankCacheError> {
    let io = |op: &'static str, path: &Path| {
        let path = path.to_path_buf();
        let rank = plan.rank;
        move |source| RankCacheError::Io {
            rank,
            op,
            path,
            source,
        }
    };
    std::fs::create_dir_all(out_dir).map_err(io("create", out_dir))?;
    let existing = rank_file::rank_files(out_dir, plan.rank, plan.world)?;
    if !existing.is_empty() && opts.existing == ExistingRankFile::Refuse {
        return Err(RankCacheError::Exists {
            dir: out_dir.to_path_buf(),
            rank: plan.rank,
            world: plan.world,
            existing,
        });
    }
    let partial = out_dir.join(rank_file::partial_name(plan.rank, plan.world));
    let out = File::create(&partial).map_err(io("create", &partial))?;
    let result = (|| {
        out.set_len(plan.file_len()).map_err(io("size", &partial))?;
        let sink = |start: u64, buf: &[u8]| {
            out.write_all_at(buf, start)
                .map_err(|source| RankCacheError::Io {
                    rank: plan.rank,
                    op: "write",
                    path: partial.clone(),
                    source,
                })
        };
        for_each_chunk(plan, opts, RankCachePhase::Write, progress, &sink)?;
        let trailer = rank_file::trailer(plan.index_json.as_bytes(), plan.data_bytes);
        out.write_all_at(&trailer, plan.data_bytes)
            .map_err(io("write", &partial))?;
        out.sync_all().map_err(io("fsync", &partial))?;
        Ok(())
    })();
    drop(out);
    if let Err(e) = result {
        let _ = std::fs::remove_file(&partial);
        return Err(e);
    }
    // The directory may have gained a file while we wrote: check again.
    let existing = rank_file::rank_files(out_dir, plan.rank, plan.world)?;
    if !existing.is_empty() {
        if opts.existing == ExistingRankFile::Refuse {
            let _ = std::fs::remove_file(&partial);
            return Err(RankCacheError::Exists {
                dir: out_dir.to_path_buf(),
                rank: plan.rank,
                world: plan.world,
                existing,
            });
        }
        let aside = out_dir.join("superseded");
        std::fs::create_dir_all(&aside).map_err(io("create", &aside))?;
        for old in existing {
            let to = aside.join(old.file_name().unwrap_or_default());
            std::fs::rename(&old, &to).map_err(io("move aside", &old))?;
            let side = sidecar_path(&old);
            if side.exists() {
                let to = aside.join(side.file_name().unwrap_or_default());
                std::fs::rename(&side, &to).map_err(io("move aside", &side))?;
            }
        }
    }
    let dest = out_dir.join(&plan.file_name);
    std::fs::rename(&partial, &dest).map_err(io("rename", &partial))?;
    let side = sidecar_path(&dest);
    let side_tmp = out_dir.join(format!(
        ".{}.partial",
        side.file_name().unwrap_or_default().to_string_lossy()
    ));
    std::fs::write(
        &side_tmp,
        plan.sidecar_json(opts.source_label.as_deref(), opts.overlay.as_deref()),
    )
    .map_err(io("write", &side_tmp))?;
    std::fs::rename(&side_tmp, &side).map_err(io("rename", &side_tmp))?;
    File::open(out_dir)
        .and_then(|d| d.sync_all())
        .map_err(io("fsync", out_dir))?;
    Ok(dest)
}

/// `<rank file>.source.json`: the sidecar a build leaves next to the rank file (the engine only
/// looks at `*.bin`).
#[must_use]
pub fn sidecar_path(rank_file: &Path) -> PathBuf {
    let mut name = rank_file.file_name().unwrap_or_default().to_os_string();
    name.push(".source.json");
    rank_file.with_file_name(name)
}

/// The sidecar of a rank file, if present and readable.
#[must_use]
pub fn read_sidecar(rank_file: &Path) -> Option<serde_json::Value> {
    let text = std::fs::read(sidecar_path(rank_file)).ok()?;
    serde_json::from_slice(&text).ok()
}

/// How deep [`verify_rank_cache`] looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VerifyLevel {
    /// Footer, magic, name and every index row (key, dtype, shape, offset, bytes).
    Index,
    /// The above, plus every data byte against the checkpoint.
    Bytes,
}

/// Checks an existing rank file against the plan. `file` may be the rank file or the cache
/// directory (which must then hold exactly one file for the rank, as the engine requires).
/// Returns the file checked.
///
/// # Errors
/// [`RankCacheError::RankFile`] when the file is missing, several, or breaks a reader rule;
/// [`RankCacheError::Mismatch`] naming the first entry that differs from the plan (or, at
/// [`VerifyLevel::Bytes`], from the checkpoint); I/O errors; [`RankCacheError::Cancelled`].
pub fn verify_rank_cache(
    plan: &RankCachePlan,
    file: &Path,
    level: VerifyLevel,
    opts: &RankCacheOptions,
    progress: ProgressFn<'_>,
) -> Result<PathBuf, RankCacheError> {
    let path = if file.is_dir() {
        rank_file::find_rank_file(file, plan.rank, plan.world)?
    } else {
        file.to_path_buf()
    };
    let mismatch = |key: &str, problem: String| RankCacheError::Mismatch {
        file: path.clone(),
        key: key.to_owned(),
        problem,
    };
    let ix = rank_file::read_index(&path)?;
    for (i, want) in plan.entries.iter().enumerate() {
        let Some(got) = ix.rows.get(i) else {
            return Err(mismatch(
                &want.row.key,
                format!(
                    "the file has {} entries, the plan {}",
                    ix.rows.len(),
                    plan.entries.len()
                ),
            ));
        };
        if got != &want.row {
            return Err(mismatch(
                &want.row.key,
                format!("row {i} is {got:?}, the plan wants {:?}", want.row),
            ));
        }
    }
    if ix.rows.len() != plan.entries.len() {
        return Err(mismatch(
            &ix.rows[plan.entries.len()].key,
            format!(
                "the file has {} entries, the plan {}",
                ix.rows.len(),
                plan.entries.len()
            ),
        ));
    }
    if ix.json != plan.index_json.as_bytes() {
        return Err(mismatch(
            "-",
            "the index rows match but their JSON text differs".into(),
        ));
    }
    if ix.data_bytes != plan.data_bytes || ix.file_len != plan.file_len() {
        return Err(mismatch(
            "-",
            format!(
                "data section {} / file {} bytes, the plan wants {} / {}",
                ix.data_bytes,
                ix.file_len,
                plan.data_bytes,
                plan.file_len()
            ),
        ));
    }
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    if name != plan.file_name {
        return Err(mismatch(
            "-",
            format!(
                "the file is named {name}, its index hashes to {}",
                plan.file_name
            ),
        ));
    }
    if level == VerifyLevel::Bytes {
        let f = File::open(&path).map_err(|source| RankCacheError::Io {
            rank: plan.rank,
            op: "open",
            path: path.clone(),
            source,
        })?;
        let sink = |start: u64, want: &[u8]| {
            let mut got = vec![0u8; want.len()];
            f.read_exact_at(&mut got, start)
                .map_err(|source| RankCacheError::Io {
                    rank: plan.rank,
                    op: "read",
                    path: path.clone(),
                    source,
                })?;
            if got != want {
                let k = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0) as u64 + start;
                let i = plan
                    .entries
                    .partition_point(|e| e.row.offset + e.row.bytes <= k);
                let key = plan.entries.get(i).map_or("-", |e| e.row.key.as_str());
                return Err(RankCacheError::Mismatch {
                    file: path.clone(),
                    key: key.to_owned(),
                    problem: format!("data byte {k} differs from the checkpoint"),
                });
            }
            Ok(())
        };
        for_each_chunk(plan, opts, RankCachePhase::Verify, progress, &sink)?;
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(source: SourceRange, bytes: u64) -> PlannedEntry {
        PlannedEntry {
            row: IndexRow {
                key: "k".into(),
                dtype: DType::U8,
                shape: vec![bytes as usize],
                offset: 0,
                bytes,
            },
            tensor: "t".into(),
            source,
        }
    }

    #[test]
    fn strided_pieces_by_one_read_and_by_runs() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("src");
        let data: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&p, &data).unwrap();
        let files = vec![File::open(&p).unwrap()];
        // (run, stride): dense runs (one covering read) and sparse runs (a read a run)
        for (run, stride) in [(8u64, 12u64), (8, 64), (5, 40)] {
            let count = 4000 / stride;
            let e = entry(
                SourceRange::Strided {
                    shard: 0,
                    offset: 16,
                    run,
                    stride,
                    count,
                },
                run * count,
            );
            let want: Vec<u8> = (0..count)
                .flat_map(|r| {
                    data[(16 + r * stride) as usize..(16 + r * stride + run) as usize].to_vec()
                })
                .collect();
            let mut scratch = Vec::new();
            for (p0, p1) in [
                (0, run * count),
                (3, 3 + run),
                (run - 1, run * 7 + 2),
                (run * 2, run * 3),
            ] {
                let mut dst = vec![0u8; (p1 - p0) as usize];
                copy_piece(&e, &files, p0, p1, &mut dst, &mut scratch).unwrap();
                assert_eq!(
                    dst,
                    want[p0 as usize..p1 as usize],
                    "run {run} stride {stride} [{p0}, {p1})"
                );
            }
        }
    }

    #[test]
    fn widening_pieces_start_and_end_inside_values() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("src");
        let halves: Vec<u16> = vec![0x3c00, 0xc000, 0x0001, 0x7bff, 0x8400, 0x3555];
        let data: Vec<u8> = halves.iter().flat_map(|h| h.to_le_bytes()).collect();
        std::fs::write(&p, &data).unwrap();
        let files = vec![File::open(&p).unwrap()];
        let e = entry(
            SourceRange::WidenF16 {
                shard: 0,
                offset: 0,
            },
            24,
        );
        let want: Vec<u8> = halves
            .iter()
            .flat_map(|h| f16_to_f32_bits(*h).to_le_bytes())
            .collect();
        assert_eq!(f32::from_le_bytes(want[0..4].try_into().unwrap()), 1.0);
        assert_eq!(f32::from_le_bytes(want[4..8].try_into().unwrap()), -2.0);
        let mut scratch = Vec::new();
        for (p0, p1) in [(0u64, 24u64), (1, 23), (5, 6), (7, 13)] {
            let mut dst = vec![0u8; (p1 - p0) as usize];
            copy_piece(&e, &files, p0, p1, &mut dst, &mut scratch).unwrap();
            assert_eq!(dst, want[p0 as usize..p1 as usize], "[{p0}, {p1})");
        }
    }
}
