//! The split proof: each rank computes a partial product from **its** rank file, rank 1 ships its
//! partials over the link, rank 0 combines them (columns: concatenate in rank order; rows:
//! elementwise sum) and compares with the same product over the **full** tensor read from the
//! checkpoint in `MODEL_DIR` (the split of docs/engine-contract.md, "Which entries").
//!
//! A trellis `[K/16, N/16, 16·bits]` is read as an integer matrix `W` with `K/16` rows and
//! `N/16 · 16·bits` columns; the product is `y = xᵀW` with a fixed `x` of length `K/16`
//! ([`x_at`]), exact in i64. A column slice (N-tiles `[c0/16, c1/16)`) is a contiguous range of
//! `W`'s columns; a row slice (K-tiles `[r0/16, r1/16)`) a contiguous range of rows. The `suh`
//! (row) and `svh` (column) vectors must concatenate to the checkpoint's; the unsplit one must
//! equal it on both ranks.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::inputs::Checkpoint;
use super::rank_file::{Entry, Exl3Key, RankFile};

/// Why a rank could not compute its partials (a load error: the file lacks what the plan wants).
#[derive(Debug, thiserror::Error)]
pub enum SplitError {
    /// The rank file lacks a part, or its key's range is not this rank's half.
    #[error("error.MissingTensor: {path}: {problem}")]
    MissingTensor {
        /// The rank file.
        path: String,
        /// What is missing or wrong.
        problem: String,
    },
    /// Reading the rank file failed.
    #[error(transparent)]
    Read(#[from] super::rank_file::RankFileError),
}

/// How a tensor is split between the ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    /// Output columns (N-tiles).
    Column,
    /// Input rows (K-tiles).
    Row,
}

/// One rank's contribution for one EXL3 tensor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Partial {
    /// Tensor prefix.
    pub prefix: String,
    /// Split kind.
    pub split: Split,
    /// The rank.
    pub rank: u32,
    /// The key's range (`[c0, c1)` or `[r0, r1)`).
    pub range: (u64, u64),
    /// `xᵀW_rank`.
    pub y: Vec<i64>,
    /// The `suh` bytes (hex).
    pub suh: String,
    /// The `svh` bytes (hex).
    pub svh: String,
}

/// The tensors proven by default: a column-split and a row-split attention tensor, the LM head
/// (columns), expert 0's `w1` (columns) and `w2` (rows), and the first Engram layer's `wkv` (rows).
#[must_use]
pub fn default_tensors(engram_layers: &[u64]) -> Vec<String> {
    let mut v: Vec<String> = [
        "layers.0.attn.wq_b",
        "layers.0.attn.wo_b",
        "head",
        "layers.0.ffn.experts.0.w1",
        "layers.0.ffn.experts.0.w2",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    if let Some(l) = engram_layers.first() {
        v.push(format!("layers.{l}.engram.wkv"));
    }
    v
}

/// The tensors to prove: env `TF_STANDIN_PROOF` = `all` (every split EXL3 tensor in the rank
/// file), a comma list of prefixes, or unset for [`default_tensors`].
#[must_use]
pub fn tensors_from_env(v: Option<&str>, engram_layers: &[u64], rf: &RankFile) -> Vec<String> {
    match v.map(str::trim) {
        None | Some("") => default_tensors(engram_layers),
        Some("all") => rf
            .entries
            .iter()
            .filter_map(Entry::exl3)
            .filter(|k| k.part == "tr" && (k.cols.is_some() || k.rows.is_some()))
            .map(|k| k.prefix)
            .collect(),
        Some(list) => list
            .split(',')
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect(),
    }
}

/// The fixed input vector: `x[k]` for K-tile row `k` (values in `-30..=30`).
#[must_use]
pub fn x_at(k: u64) -> i64 {
    ((k.wrapping_mul(7919).wrapping_add(13)) % 61) as i64 - 30
}

/// `y[j] = Σ_k x[row0 + k] · W[k][j]` over a little-endian int16 matrix of `cols` columns.
fn xtw(data: &[u8], row0: u64, cols: usize) -> Vec<i64> {
    let mut y = vec![0i64; cols];
    if cols == 0 {
        return y;
    }
    for (k, row) in data.chunks_exact(cols * 2).enumerate() {
        let x = x_at(row0 + k as u64);
        for (j, w) in row.chunks_exact(2).enumerate() {
            y[j] += x * i64::from(i16::from_le_bytes([w[0], w[1]]));
        }
    }
    y
}

fn find_part<'a>(rf: &'a RankFile, prefix: &str, part: &str) -> Option<(&'a Entry, Exl3Key)> {
    rf.entries.iter().find_map(|e| {
        e.exl3()
            .filter(|k| k.prefix == prefix && k.part == part)
            .map(|k| (e, k))
    })
}

/// Computes this rank's partials from its rank file.
///
/// # Errors
/// [`SplitError::MissingTensor`] when a part is missing, the tensor is not split, or its range is
/// not this rank's equal share `[R·L, (R+1)·L)`.
pub fn rank_partials(
    rf: &RankFile,
    rank: u32,
    tensors: &[String],
) -> Result<Vec<Partial>, SplitError> {
    let missing = |problem: String| SplitError::MissingTensor {
        path: rf.path().display().to_string(),
        problem,
    };
    let mut out = Vec::new();
    for prefix in tensors {
        let (tr, key) = find_part(rf, prefix, "tr")
            .ok_or_else(|| missing(format!("no {prefix}|…|tr entry")))?;
        let (split, range) = match (key.cols, key.rows) {
            (Some(c), None) => (Split::Column, c),
            (None, Some(r)) => (Split::Row, r),
            _ => {
                return Err(missing(format!(
                    "{} is not split by exactly one of columns or rows",
                    tr.key
                )));
            }
        };
        let extent = range.1.saturating_sub(range.0);
        if extent == 0 || range.0 != u64::from(rank) * extent || range.0 % 16 != 0 {
            return Err(missing(format!(
                "{}: the range [{}, {}) is not rank {rank}'s share (want [{}, {}))",
                tr.key,
                range.0,
                range.1,
                u64::from(rank) * extent,
                u64::from(rank + 1) * extent
            )));
        }
        if tr.shape.len() != 3 || tr.dtype != "int16" {
            return Err(missing(format!(
                "{}: a trellis is int16 [K/16, N/16, 16·bits], got {} {:?}",
                tr.key, tr.dtype, tr.shape
            )));
        }
        let tiles = match split {
            Split::Column => tr.shape[1],
            Split::Row => tr.shape[0],
        };
        if tiles * 16 != extent {
            return Err(missing(format!(
                "{}: {} tiles do not cover the range's {extent}",
                tr.key, tiles
            )));
        }
        let cols = (tr.shape[1] * tr.shape[2]) as usize;
        let row0 = match split {
            Split::Column => 0,
            Split::Row => range.0 / 16,
        };
        let y = xtw(&rf.read(tr)?, row0, cols);
        let (suh, _) = find_part(rf, prefix, "suh")
            .ok_or_else(|| missing(format!("no {prefix}|…|suh entry")))?;
        let (svh, _) = find_part(rf, prefix, "svh")
            .ok_or_else(|| missing(format!("no {prefix}|…|svh entry")))?;
        out.push(Partial {
            prefix: prefix.clone(),
            split,
            rank,
            range,
            y,
            suh: hex::encode(rf.read(suh)?),
            svh: hex::encode(rf.read(svh)?),
        });
    }
    Ok(out)
}

/// The outcome for one tensor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorProof {
    /// Tensor prefix.
    pub tensor: String,
    /// Split kind (`None` when it could not be determined).
    pub split: Option<Split>,
    /// Whether the combined result equals the full computation.
    pub ok: bool,
    /// What differed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

/// The whole proof's outcome (shown in `/health` and every reply).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProofReport {
    /// Every tensor proved.
    pub ok: bool,
    /// Per tensor.
    pub tensors: Vec<TensorProof>,
    /// A failure outside any one tensor (e.g. the peer went down during the proof).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl ProofReport {
    /// A proof that could not run at all.
    #[must_use]
    pub fn failed(error: impl Into<String>) -> Self {
        Self {
            ok: false,
            tensors: Vec::new(),
            error: Some(error.into()),
        }
    }

    /// JSON for `/health` and replies.
    #[must_use]
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or_else(|_| json!({"ok": false}))
    }

    /// The first failure's message, naming the tensor.
    #[must_use]
    pub fn failure(&self) -> Option<String> {
        if self.ok {
            return None;
        }
        if let Some(t) = self.tensors.iter().find(|t| !t.ok) {
            return Some(format!(
                "split proof failed for tensor {}: {}",
                t.tensor,
                t.problem.as_deref().unwrap_or("mismatch")
            ));
        }
        Some(format!(
            "split proof failed: {}",
            self.error.as_deref().unwrap_or("unknown")
        ))
    }
}

fn first_diff(a: &[i64], b: &[i64]) -> String {
    if a.len() != b.len() {
        return format!("{} values, the full tensor gives {}", a.len(), b.len());
    }
    let i = a.iter().zip(b).position(|(x, y)| x != y).unwrap_or(0);
    let n = a.iter().zip(b).filter(|(x, y)| x != y).count();
    format!(
        "{n} of {} values differ; first at {i}: combined {} vs full {}",
        a.len(),
        a[i],
        b[i]
    )
}

fn prove_one(ckpt: &Checkpoint, prefix: &str, parts: &[&Partial]) -> Result<Split, String> {
    let split = parts[0].split;
    if parts.iter().any(|p| p.split != split) {
        return Err("the ranks disagree on the split kind".into());
    }
    let mut by_rank: Vec<&Partial> = parts.to_vec();
    by_rank.sort_by_key(|p| p.rank);
    let (tr_meta, tr) = ckpt.tensor(&format!("{prefix}.trellis"))?;
    let (_, suh_full) = ckpt.tensor(&format!("{prefix}.suh"))?;
    let (_, svh_full) = ckpt.tensor(&format!("{prefix}.svh"))?;
    if tr_meta.shape.len() != 3 {
        return Err(format!("checkpoint trellis shape {:?}", tr_meta.shape));
    }
    let cols = (tr_meta.shape[1] * tr_meta.shape[2]) as usize;
    let full = xtw(&tr, 0, cols);
    let hexcat = |f: &dyn Fn(&Partial) -> &str| -> String {
        by_rank.iter().map(|p| f(p)).collect::<Vec<_>>().concat()
    };
    let (combined, sliced, whole, sliced_name, whole_name, sliced_full, whole_full) = match split {
        Split::Column => (
            by_rank
                .iter()
                .flat_map(|p| p.y.iter().copied())
                .collect::<Vec<i64>>(),
            hexcat(&|p| &p.svh),
            by_rank.iter().map(|p| p.suh.as_str()).collect::<Vec<_>>(),
            "svh",
            "suh",
            &svh_full,
            &suh_full,
        ),
        Split::Row => {
            let mut sum = vec![0i64; by_rank[0].y.len()];
            for p in &by_rank {
                if p.y.len() != sum.len() {
                    return Err(format!(
                        "rank {} has {} partial values, rank {} has {}",
                        p.rank,
                        p.y.len(),
                        by_rank[0].rank,
                        sum.len()
                    ));
                }
                for (s, v) in sum.iter_mut().zip(&p.y) {
                    *s += v;
                }
            }
            (
                sum,
                hexcat(&|p| &p.suh),
                by_rank.iter().map(|p| p.svh.as_str()).collect::<Vec<_>>(),
                "suh",
                "svh",
                &suh_full,
                &svh_full,
            )
        }
    };
    if combined != full {
        return Err(format!(
            "{} trellis product: {}",
            match split {
                Split::Column => "concatenated column",
                Split::Row => "summed row",
            },
            first_diff(&combined, &full)
        ));
    }
    if sliced != hex::encode(sliced_full) {
        return Err(format!(
            "the {sliced_name} slices do not concatenate to the checkpoint's {sliced_name}"
        ));
    }
    let whole_hex = hex::encode(whole_full);
    if let Some(p) = by_rank.iter().zip(&whole).find(|(_, w)| **w != whole_hex) {
        return Err(format!(
            "rank {}'s {whole_name} is not the checkpoint's whole {whole_name}",
            p.0.rank
        ));
    }
    Ok(split)
}

/// Combines both ranks' partials and compares with the full computation from the checkpoint.
#[must_use]
pub fn prove(
    ckpt: &Checkpoint,
    tensors: &[String],
    partials: &[Partial],
    world: u32,
) -> ProofReport {
    let mut out = Vec::new();
    for prefix in tensors {
        let parts: Vec<&Partial> = partials.iter().filter(|p| &p.prefix == prefix).collect();
        let mut ranks: Vec<u32> = parts.iter().map(|p| p.rank).collect();
        ranks.sort_unstable();
        let result = if ranks != (0..world).collect::<Vec<_>>() {
            Err(format!(
                "partials from ranks {ranks:?}, want one from each of 0..{world}"
            ))
        } else {
            prove_one(ckpt, prefix, &parts)
        };
        out.push(match result {
            Ok(split) => TensorProof {
                tensor: prefix.clone(),
                split: Some(split),
                ok: true,
                problem: None,
            },
            Err(problem) => TensorProof {
                tensor: prefix.clone(),
                split: parts.first().map(|p| p.split),
                ok: false,
                problem: Some(problem),
            },
        });
    }
    ProofReport {
        ok: !out.is_empty() && out.iter().all(|t| t.ok),
        tensors: out,
        error: None,
    }
}
