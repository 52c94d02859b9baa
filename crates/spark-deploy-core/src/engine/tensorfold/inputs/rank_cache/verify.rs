//! Checking an existing rank file against its plan and the checkpoint.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::checksum::{BlockChecksums, verify_checksums};
use super::copy::for_each_chunk;
use super::plan::RankCachePlan;
use super::{ProgressFn, RankCacheError, RankCacheOptions, RankCachePhase};
use crate::engine::tensorfold::inputs::rank_file;

/// How deep [`verify_rank_cache`] looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VerifyLevel {
    /// Footer, magic, name and every index row (key, dtype, shape, offset, bytes). Blind to the
    /// data bytes.
    Index,
    /// The above, plus every data block against the CRC-32 the build recorded in the sidecar:
    /// one read of the rank file, not of the checkpoint (see `checksum`). A file whose sidecar
    /// records no checksums (built by an older version) is checked at [`VerifyLevel::Bytes`].
    Checksums,
    /// The index, plus every data byte against the checkpoint.
    Bytes,
}

/// Checks an existing rank file against the plan. `file` may be the rank file or the cache
/// directory (which must then hold exactly one file for the rank, as the engine requires).
/// Returns the file checked.
///
/// # Errors
/// [`RankCacheError::RankFile`] when the file is missing, several, or breaks a reader rule;
/// [`RankCacheError::Mismatch`] naming the first entry that differs from the plan (at
/// [`VerifyLevel::Checksums`], the first block whose CRC-32 differs from the one recorded at build;
/// at [`VerifyLevel::Bytes`], the first byte that differs from the checkpoint); I/O errors;
/// [`RankCacheError::Cancelled`].
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
                format!("row {i} is {got}, the plan wants {}", want.row),
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
    let level = match level {
        VerifyLevel::Checksums => {
            match super::read_sidecar(&path)
                .and_then(|side| BlockChecksums::from_sidecar(&side, plan.data_bytes))
            {
                Some(sums) => {
                    verify_checksums(plan, &path, &sums, opts.threads, progress)?;
                    return Ok(path);
                }
                None => VerifyLevel::Bytes,
            }
        }
        other => other,
    };
    if level == VerifyLevel::Bytes {
        let f = crate::safe_fs::open_regular(&path).map_err(|source| RankCacheError::Io {
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
