//! Planning a rank file: its index and where each entry's bytes come from.

use std::path::{Path, PathBuf};

use super::checksum::{self, BlockChecksums};
use super::{RankCacheError, RankCacheOptions};
use crate::engine::tensorfold::inputs::dtype::DType;
use crate::engine::tensorfold::inputs::model_config::ModelConfig;
use crate::engine::tensorfold::inputs::rank_file::{self, IndexRow};
use crate::engine::tensorfold::inputs::safetensors_index::{Checkpoint, TensorInfo};
use crate::engine::tensorfold::inputs::split_plan::{self, Part, Want, WantKind};

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

impl SourceRange {
    /// The shard the bytes come from (an index into the plan's checkpoint).
    #[must_use]
    pub fn shard(&self) -> usize {
        match *self {
            Self::Contiguous { shard, .. }
            | Self::Strided { shard, .. }
            | Self::WidenF16 { shard, .. } => shard,
        }
    }
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
    /// `source_label`, the data section's block checksums, and `content`: the whole file's sha256
    /// with the stamp it was taken at ([`super::content::to_json`]).
    #[must_use]
    pub fn sidecar_json(
        &self,
        source_label: Option<&str>,
        overlay: Option<&Path>,
        checksums: Option<&BlockChecksums>,
        content: Option<serde_json::Value>,
    ) -> String {
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
            checksum::SIDECAR_KEY: checksums.map(BlockChecksums::to_json),
            super::content::SIDECAR_KEY: content,
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
    plan_rank_cache_from(
        model_dir,
        open_checkpoint(model_dir, opts)?,
        rank,
        world,
        opts,
    )
}

/// The checkpoint in `model_dir` (every shard's header read), with `opts.overlay` applied: what
/// [`plan_rank_cache_from`] plans over. Planning every rank of a world over one opening (cloned
/// per rank) reads and parses the headers once instead of once per rank.
///
/// # Errors
/// Unreadable shard headers, or an overlay that does not fit the checkpoint.
pub fn open_checkpoint(
    model_dir: &Path,
    opts: &RankCacheOptions,
) -> Result<Checkpoint, RankCacheError> {
    let checkpoint = Checkpoint::open_dir(model_dir)?;
    Ok(match &opts.overlay {
        Some(ov) => checkpoint.with_overlay(ov)?,
        None => checkpoint,
    })
}

/// As [`plan_rank_cache`], over a checkpoint opened elsewhere (from shard headers read by byte
/// range before the shards arrive, for a build that writes each shard's entries as it lands);
/// `model_dir` holds `config.json`. `opts.overlay` is not applied here: apply it to `checkpoint`.
///
/// # Errors
/// As [`plan_rank_cache`].
pub fn plan_rank_cache_from(
    model_dir: &Path,
    checkpoint: Checkpoint,
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
        let layout = |problem| RankCacheError::Layout {
            rank,
            key: w.key.clone(),
            tensor: w.tensor.clone(),
            problem,
        };
        let (dtype, shape, source) = resolve(&w, t, &checkpoint).map_err(layout)?;
        let bytes =
            crate::safetensors_header::tensor_bytes(&shape, dtype.size() * 8).map_err(layout)?;
        let end = at
            .checked_add(bytes)
            .ok_or_else(|| layout(format!("the data section passes 2^64 bytes at {at}")))?;
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
        at = end;
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

/// `a × b + c` in checked 64-bit arithmetic (offsets and lengths from shard headers).
fn mul_add(a: u64, b: u64, c: u64) -> Result<u64, String> {
    a.checked_mul(b)
        .and_then(|p| p.checked_add(c))
        .ok_or_else(|| format!("{a} × {b} + {c} passes 2^64"))
}

/// The written dtype, shape and source range of one wanted entry, or why the source cannot give it:
/// its dtype and shape must be what `config.json` makes them (a tensor whose dtype or shape was
/// changed, even consistently with its byte length, is refused), and an EXL3 trellis must agree
/// with its own `suh` and `svh`.
fn resolve(
    w: &Want,
    t: &TensorInfo,
    checkpoint: &Checkpoint,
) -> Result<(DType, Vec<usize>, SourceRange), String> {
    let stored = t.dtype.ok_or_else(|| {
        format!(
            "has dtype {}, which the rank file cannot hold",
            t.dtype_name
        )
    })?;
    let shard = t.shard;
    match &w.kind {
        WantKind::Plain { target, shape } => {
            if t.shape != *shape {
                return Err(format!(
                    "is {stored} {:?}; config.json makes it {shape:?}",
                    t.shape
                ));
            }
            if target.is_none() && stored != DType::Bf16 {
                return Err(format!(
                    "is stored as {stored}; the engine reads this tensor as stored and expects {}",
                    DType::Bf16
                ));
            }
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
            k,
            n,
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
                    if !words.is_multiple_of(16) || !(16..=128).contains(&words) {
                        return Err(format!(
                            "has {words} words per tile; an EXL3 trellis has 16·bits, bits 1 to 8"
                        ));
                    }
                    for (what, tiles, want) in [("K", kt_all, k), ("N", nt_all, n)] {
                        if let Some(want) = want
                            && tiles.checked_mul(16) != Some(*want)
                        {
                            return Err(format!(
                                "is [{kt_all}, {nt_all}, {words}]: {what}/16 is {tiles}, config.json makes {what} {want}"
                            ));
                        }
                    }
                    check_scales(w, kt_all, nt_all, checkpoint)?;
                    let es = 2u64;
                    let row = mul_add(nt_all as u64, words as u64 * es, 0)?;
                    let (k0, kt) = match rows {
                        Some((a, b)) => (a / 16, (b - a) / 16),
                        None => (0, kt_all),
                    };
                    if k0.checked_add(kt).is_none_or(|end| end > kt_all) {
                        return Err(format!(
                            "rows reach K-tile {} but the trellis has {kt_all}",
                            k0.saturating_add(kt)
                        ));
                    }
                    let (n0, nt) = match cols {
                        Some((a, b)) => (a / 16, (b - a) / 16),
                        None => (0, nt_all),
                    };
                    if n0.checked_add(nt).is_none_or(|end| end > nt_all) {
                        return Err(format!(
                            "columns reach N-tile {} but the trellis has {nt_all}",
                            n0.saturating_add(nt)
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
                    let base = mul_add(k0 as u64, row, t.offset)?;
                    let source = if nt == nt_all {
                        SourceRange::Contiguous {
                            shard,
                            offset: base,
                        }
                    } else {
                        SourceRange::Strided {
                            shard,
                            offset: mul_add(n0 as u64, words as u64 * es, base)?,
                            run: mul_add(nt as u64, words as u64 * es, 0)?,
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
                    let (sel, whole) = if *part == Part::Suh {
                        (rows, k)
                    } else {
                        (cols, n)
                    };
                    if let Some(whole) = whole
                        && t.shape[0] != *whole
                    {
                        return Err(format!(
                            "has {} values; config.json makes it {whole}",
                            t.shape[0]
                        ));
                    }
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
                            offset: mul_add(a as u64, 2, t.offset)?,
                        },
                    ))
                }
            }
        }
    }
}

/// A trellis of `kt × nt` tiles agrees with its linear's `suh` (K values) and `svh` (N values)
/// when the checkpoint holds them (a missing one is reported by its own entry).
fn check_scales(w: &Want, kt: usize, nt: usize, checkpoint: &Checkpoint) -> Result<(), String> {
    let prefix = w.tensor.strip_suffix(".trellis").unwrap_or(&w.tensor);
    for (part, tiles) in [("suh", kt), ("svh", nt)] {
        if let Some(v) = checkpoint.get(&format!("{prefix}.{part}"))
            && v.shape.len() == 1
            && Some(v.shape[0]) != tiles.checked_mul(16)
        {
            return Err(format!(
                "has {tiles} tiles of 16 but `{prefix}.{part}` has {} values",
                v.shape[0]
            ));
        }
    }
    Ok(())
}
