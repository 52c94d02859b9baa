//! Writing a planned rank file under its final name, and its sidecar.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::checksum::BlockChecksums;
use super::content::InOrderSha256;
use super::copy::{chunk_len, for_each_chunk_until};
use super::plan::RankCachePlan;
use super::{ExistingRankFile, ProgressFn, RankCacheError, RankCacheOptions, RankCachePhase};
use crate::engine::tensorfold::inputs::rank_file;

/// Writes the planned rank file into `out_dir`: `.rank{R}of{W}.partial`, fsync, rename to
/// [`RankCachePlan::file_name`], fsync of the directory. Returns the final path. The sidecar
/// records each block's CRC-32 and the whole file's sha256 (see [`super::content`]), both taken
/// from the bytes as they are written.
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
    let io = |op: &'static str, path: &Path| RankCacheError::io(plan.rank, op, path);
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
    // Every chunk's CRC-32, taken from the buffer it is written from (see `checksum`).
    let block = chunk_len(opts);
    let blocks = usize::try_from(plan.data_bytes.div_ceil(block)).unwrap_or(usize::MAX);
    let crcs = std::sync::Mutex::new(Vec::new());
    let partial = out_dir.join(rank_file::partial_name(plan.rank, plan.world));
    // The whole file's sha256, fed in order on a thread of its own (no second read); callers
    // run at most one chunk a thread ahead of it.
    let sha = InOrderSha256::start(opts.threads.clamp(1, 64) + 1);
    let stop = std::sync::atomic::AtomicBool::new(false);
    // Exclusive and never through a symlink planted at the partial's name.
    let out = crate::safe_fs::create_exclusive(&partial, 0o644).map_err(io("create", &partial))?;
    let result = (|| {
        out.set_len(plan.file_len()).map_err(io("size", &partial))?;
        crcs.lock()
            .map_err(|_| RankCacheError::WorkerPanicked { rank: plan.rank })?
            .resize(blocks, 0u32);
        let sink = |start: u64, buf: &[u8]| {
            out.write_all_at(buf, start)
                .map_err(|source| RankCacheError::Io {
                    rank: plan.rank,
                    op: "write",
                    path: partial.clone(),
                    source,
                })?;
            let crc = crc32fast::hash(buf);
            let mut all = crcs
                .lock()
                .map_err(|_| RankCacheError::WorkerPanicked { rank: plan.rank })?;
            if let Some(slot) = all.get_mut(usize::try_from(start / block).unwrap_or(usize::MAX)) {
                *slot = crc;
            }
            drop(all);
            if let Some(h) = &sha
                && !h.feed(start / block, buf, &stop)
            {
                // Another chunk failed and will never come: the build is ending with its error.
                return Err(RankCacheError::Cancelled { rank: plan.rank });
            }
            Ok(())
        };
        for_each_chunk_until(plan, opts, RankCachePhase::Write, progress, &sink, &stop)?;
        let trailer = rank_file::trailer(plan.index_json.as_bytes(), plan.data_bytes);
        out.write_all_at(&trailer, plan.data_bytes)
            .map_err(io("write", &partial))?;
        out.sync_all().map_err(io("fsync", &partial))?;
        Ok(trailer)
    })();
    drop(out);
    let trailer = match result {
        Ok(t) => t,
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            return Err(e);
        }
    };
    let file_sha256 = sha.and_then(|h| h.finish(&trailer));
    let sums = BlockChecksums {
        block_bytes: block,
        crc32: crcs.into_inner().unwrap_or_default(),
    };
    finalize(plan, out_dir, opts, &partial, &sums, file_sha256.as_deref())
}

/// Gives a written and synced `partial` its final name [`RankCachePlan::file_name`] in `out_dir`
/// (after moving older files for the rank aside, or refusing, as `opts.existing` says), writes
/// the sidecar with `sums` and, when known, the whole file's sha256, and syncs the directory.
/// Returns the final path.
///
/// # Errors
/// [`RankCacheError::Exists`] or an I/O failure; `partial` is removed when refused.
pub(super) fn finalize(
    plan: &RankCachePlan,
    out_dir: &Path,
    opts: &RankCacheOptions,
    partial: &Path,
    sums: &BlockChecksums,
    file_sha256: Option<&str>,
) -> Result<PathBuf, RankCacheError> {
    let io = |op: &'static str, path: &Path| RankCacheError::io(plan.rank, op, path);
    // The directory may have gained a file while we wrote: check again.
    let existing = rank_file::rank_files(out_dir, plan.rank, plan.world)?;
    if !existing.is_empty() {
        if opts.existing == ExistingRankFile::Refuse {
            let _ = std::fs::remove_file(partial);
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
    std::fs::rename(partial, &dest).map_err(io("rename", partial))?;
    // Stamped after the rename (which moves the ctime), as the head will find the file.
    let content = match file_sha256 {
        Some(sum) => Some(super::content::to_json(
            sum,
            &std::fs::metadata(&dest).map_err(io("stat", &dest))?,
        )),
        None => None,
    };
    let side = sidecar_path(&dest);
    let side_tmp = out_dir.join(format!(
        ".{}.partial",
        side.file_name().unwrap_or_default().to_string_lossy()
    ));
    crate::safe_fs::write_exclusive(
        &side_tmp,
        plan.sidecar_json(
            opts.source_label.as_deref(),
            opts.overlay.as_deref(),
            Some(sums),
            content,
        ),
    )
    .map_err(io("write", &side_tmp))?;
    std::fs::rename(&side_tmp, &side).map_err(io("rename", &side_tmp))?;
    // Every block's checksum was just taken from the bytes written: that counts as a full check,
    // so the next stamped check of this file reads a sample (see `stamp`).
    if let Ok(meta) = std::fs::metadata(&dest) {
        let _ = super::stamp::write(&dest, &super::stamp::Stamp::of(&meta));
    }
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
    let text =
        crate::safe_fs::read_capped(&sidecar_path(rank_file), crate::safe_fs::JSON_CAP).ok()?;
    serde_json::from_slice(&text).ok()
}
