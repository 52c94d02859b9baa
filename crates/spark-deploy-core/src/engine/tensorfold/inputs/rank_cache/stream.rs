//! Building rank files while the checkpoint is still arriving: the plans are made from shard
//! headers read ahead (by byte range), and every entry is written to its final offset in the
//! partial file as soon as the shard holding it is final, in whatever order the shards land.
//!
//! # Resuming
//!
//! Beside each `.rank{R}of{W}.partial` a journal (`.rank{R}of{W}.partial.journal`) names the
//! planned file, then every shard whose entries are written and synced. A build that finds a
//! partial of the planned length and a journal for the same file name continues after the last
//! journalled shard; anything else is started afresh. A shard's entries are synced before its
//! journal line is written, so a crash at any point loses at most the shard being written.
//!
//! # Checksums
//!
//! The sidecar's block CRC-32s are taken as blocks complete: once every byte of an 8 MiB block is
//! written, the block is read back (it was just written, so from the page cache) and checksummed.
//!
//! The whole file's sha256 (recorded in the sidecar, so shipping the file never reads it again on
//! the head) needs the bytes in order: a frontier follows the complete blocks from the start of the
//! file. A block that completes at the frontier is hashed from the same read as its CRC-32; one
//! that completed ahead of it is read again when the frontier reaches it. What is left at the end
//! (blocks behind a late shard) is hashed as the file is finished, on the rank's own thread. A
//! resumed build starts the frontier over, reading the blocks its journal completed.
//!
//! # Trust
//!
//! The headers read ahead came from byte ranges nobody verified; each shard's own header is read
//! again once the shard is final (its bytes verified by sha256) and must match the plan's, or the
//! build stops before writing a byte of it.

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

use super::build::finalize;
use super::checksum::BlockChecksums;
use super::copy::{chunk_len, copy_piece};
use super::plan::RankCachePlan;
use super::{
    Cancelled, ProgressFn, RankCacheError, RankCacheOptions, RankCachePhase, RankCacheProgress,
};
use crate::engine::tensorfold::inputs::rank_file;
use crate::engine::tensorfold::inputs::safetensors_index::read_shard_header;

/// Blocks until one of the `pending` shards (indices into the plans' checkpoint) is final and
/// returns it; [`Cancelled`] to stop the build (its partial files stay, to be resumed).
pub type NextShard<'a> = &'a mut dyn FnMut(&[usize]) -> Result<usize, Cancelled>;

/// What a streaming build did, per rank: the final path and the shards already written by an
/// earlier, interrupted build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamedRank {
    /// The rank.
    pub rank: usize,
    /// The final rank file.
    pub path: PathBuf,
    /// Shards found written in the journal (0 for a fresh build).
    pub resumed_shards: usize,
}

fn journal_name(rank: usize, world: usize) -> String {
    format!("{}.journal", rank_file::partial_name(rank, world))
}

/// One rank file being written.
struct Partial<'a> {
    plan: &'a RankCachePlan,
    path: PathBuf,
    journal_path: PathBuf,
    file: File,
    journal: File,
    block: u64,
    /// Bytes written per block of the data section.
    filled: Vec<u64>,
    crcs: Vec<Option<u32>>,
    /// Entry indices per shard.
    by_shard: Vec<Vec<usize>>,
    /// Shards whose entries are written and journalled.
    done: Vec<bool>,
    resumed: usize,
    /// The whole file's sha256 over blocks `0..hashed` (see the module docs).
    sha: Sha256,
    hashed: usize,
}

impl<'a> Partial<'a> {
    fn io(
        &self,
        op: &'static str,
        path: &Path,
    ) -> impl FnOnce(std::io::Error) -> RankCacheError + use<> {
        RankCacheError::io(self.plan.rank, op, path)
    }

    /// Opens the partial of `plan` in `out_dir`, resuming what its journal records.
    fn open(
        plan: &'a RankCachePlan,
        out_dir: &Path,
        opts: &RankCacheOptions,
    ) -> Result<Self, RankCacheError> {
        let err = |op: &'static str, path: &Path| RankCacheError::io(plan.rank, op, path);
        std::fs::create_dir_all(out_dir).map_err(err("create", out_dir))?;
        let path = out_dir.join(rank_file::partial_name(plan.rank, plan.world));
        let journal_path = out_dir.join(journal_name(plan.rank, plan.world));
        let shards = plan.checkpoint.shards.len();
        let mut by_shard = vec![Vec::new(); shards];
        for (i, e) in plan.entries.iter().enumerate() {
            by_shard[e.source.shard()].push(i);
        }
        let names = |i: usize| {
            plan.checkpoint.shards[i]
                .path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        };
        let recorded = std::fs::read_to_string(&journal_path).ok();
        let regular_len = std::fs::symlink_metadata(&path)
            .ok()
            .filter(std::fs::Metadata::is_file)
            .map(|m| m.len());
        let mut done = vec![false; shards];
        let resume = match (&recorded, regular_len) {
            (Some(text), Some(len)) if len == plan.file_len() => {
                let mut lines = text.lines();
                if lines.next() == Some(plan.file_name.as_str()) {
                    for line in lines {
                        if let Some(i) = (0..shards).find(|&i| names(i) == line) {
                            done[i] = true;
                        }
                    }
                    true
                } else {
                    false
                }
            }
            _ => false,
        };
        let (file, journal) = if resume {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&path)
                .map_err(err("open", &path))?;
            let journal = OpenOptions::new()
                .append(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&journal_path)
                .map_err(err("open", &journal_path))?;
            (file, journal)
        } else {
            done.iter_mut().for_each(|d| *d = false);
            let file =
                crate::safe_fs::create_exclusive(&path, 0o644).map_err(err("create", &path))?;
            file.set_len(plan.file_len()).map_err(err("size", &path))?;
            let mut journal = crate::safe_fs::create_exclusive(&journal_path, 0o644)
                .map_err(err("create", &journal_path))?;
            writeln!(journal, "{}", plan.file_name).map_err(err("write", &journal_path))?;
            journal.sync_data().map_err(err("fsync", &journal_path))?;
            // Reopened for reading too: completed blocks are read back for their checksums.
            let file = {
                drop(file);
                OpenOptions::new()
                    .read(true)
                    .write(true)
                    .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                    .open(&path)
                    .map_err(err("open", &path))?
            };
            (file, journal)
        };
        let block = chunk_len(opts);
        let blocks = usize::try_from(plan.data_bytes.div_ceil(block)).unwrap_or(usize::MAX);
        let mut p = Partial {
            plan,
            path,
            journal_path,
            file,
            journal,
            block,
            filled: vec![0; blocks],
            crcs: vec![None; blocks],
            by_shard,
            resumed: done.iter().filter(|d| **d).count(),
            done,
            sha: Sha256::new(),
            hashed: 0,
        };
        // A shard no entry reads is done from the start.
        for s in 0..shards {
            if p.by_shard[s].is_empty() {
                p.done[s] = true;
            }
        }
        // What the journal says is written: count it, then checksum the blocks it completed.
        let mut complete = Vec::new();
        let written: Vec<usize> = (0..shards)
            .filter(|&s| p.done[s])
            .flat_map(|s| p.by_shard[s].clone())
            .collect();
        for i in written {
            let row = &plan.entries[i].row;
            p.mark(row.offset, row.offset + row.bytes, &mut complete);
        }
        p.checksum_blocks(&complete)?;
        Ok(p)
    }

    fn block_len(&self, k: usize) -> u64 {
        let start = k as u64 * self.block;
        self.block.min(self.plan.data_bytes - start)
    }

    /// Counts data bytes `[a, b)` as written; blocks that became complete go to `complete`.
    fn mark(&mut self, a: u64, b: u64, complete: &mut Vec<usize>) {
        if b <= a {
            return;
        }
        let first = usize::try_from(a / self.block).unwrap_or(usize::MAX);
        let last = usize::try_from((b - 1) / self.block).unwrap_or(usize::MAX);
        for k in first..=last.min(self.filled.len().saturating_sub(1)) {
            let start = k as u64 * self.block;
            let end = start + self.block_len(k);
            self.filled[k] += b.min(end) - a.max(start);
            if self.filled[k] == self.block_len(k) {
                complete.push(k);
            }
        }
    }

    /// Reads block `k` back into `buf`.
    fn read_block(&self, k: usize, buf: &mut Vec<u8>) -> Result<(), RankCacheError> {
        buf.resize(usize::try_from(self.block_len(k)).unwrap_or(usize::MAX), 0);
        self.file
            .read_exact_at(buf, k as u64 * self.block)
            .map_err(self.io("read back", &self.path))
    }

    /// Reads the given complete blocks back, records their CRC-32s and moves the sha256's
    /// frontier over every complete block it reaches.
    fn checksum_blocks(&mut self, blocks: &[usize]) -> Result<(), RankCacheError> {
        let mut blocks = blocks.to_vec();
        blocks.sort_unstable();
        let mut buf = Vec::new();
        for k in blocks {
            self.read_block(k, &mut buf)?;
            self.crcs[k] = Some(crc32fast::hash(&buf));
            if k == self.hashed {
                self.sha.update(&buf);
                self.hashed += 1;
            }
        }
        // Blocks that completed ahead of the frontier and are now at it.
        while self.crcs.get(self.hashed).is_some_and(Option::is_some) {
            self.read_block(self.hashed, &mut buf)?;
            self.sha.update(&buf);
            self.hashed += 1;
        }
        Ok(())
    }

    /// Bytes from the start of the file that are final: the sha256's frontier.
    fn final_prefix(&self) -> u64 {
        (self.hashed as u64 * self.block).min(self.plan.data_bytes)
    }

    fn bytes_done(&self) -> u64 {
        self.filled.iter().sum()
    }

    /// Writes every entry read from `shard` (open as `src`), syncs, journals it.
    fn write_shard(
        &mut self,
        shard: usize,
        src: &File,
        chunk: u64,
        buf: &mut Vec<u8>,
        scratch: &mut Vec<u8>,
    ) -> Result<(), RankCacheError> {
        let plan = self.plan;
        let mut complete = Vec::new();
        for i in self.by_shard[shard].clone() {
            let e = &plan.entries[i];
            let mut p0 = 0;
            while p0 < e.row.bytes {
                let p1 = (p0 + chunk).min(e.row.bytes);
                buf.resize(usize::try_from(p1 - p0).unwrap_or(usize::MAX), 0);
                copy_piece(e, src, p0, p1, buf, scratch)
                    .map_err(RankCacheError::read_source(plan, e))?;
                self.file
                    .write_all_at(buf, e.row.offset + p0)
                    .map_err(self.io("write", &self.path))?;
                self.mark(e.row.offset + p0, e.row.offset + p1, &mut complete);
                p0 = p1;
            }
        }
        self.checksum_blocks(&complete)?;
        self.file
            .sync_data()
            .map_err(self.io("fsync", &self.path))?;
        let name = plan.checkpoint.shards[shard]
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        writeln!(self.journal, "{name}").map_err(self.io("write", &self.journal_path))?;
        self.journal
            .sync_data()
            .map_err(self.io("fsync", &self.journal_path))?;
        self.done[shard] = true;
        Ok(())
    }

    /// Writes the trailer, syncs, and gives the file its final name.
    fn finish(
        mut self,
        out_dir: &Path,
        opts: &RankCacheOptions,
    ) -> Result<StreamedRank, RankCacheError> {
        let missing: Vec<usize> = (0..self.crcs.len())
            .filter(|&k| self.crcs[k].is_none())
            .collect();
        self.checksum_blocks(&missing)?;
        let plan = self.plan;
        let trailer = rank_file::trailer(plan.index_json.as_bytes(), plan.data_bytes);
        self.file
            .write_all_at(&trailer, plan.data_bytes)
            .map_err(self.io("write", &self.path))?;
        self.file.sync_all().map_err(self.io("fsync", &self.path))?;
        debug_assert_eq!(self.hashed, self.crcs.len(), "every block is hashed");
        self.sha.update(&trailer);
        let file_sha256 = hex::encode(std::mem::take(&mut self.sha).finalize());
        let sums = BlockChecksums {
            block_bytes: self.block,
            crc32: self.crcs.iter().map(|c| c.unwrap_or_default()).collect(),
        };
        let Partial {
            path,
            journal_path,
            file,
            journal,
            resumed,
            ..
        } = self;
        drop((file, journal));
        let dest = finalize(plan, out_dir, opts, &path, &sums, Some(&file_sha256))?;
        let _ = std::fs::remove_file(&journal_path);
        Ok(StreamedRank {
            rank: plan.rank,
            path: dest,
            resumed_shards: resumed,
        })
    }
}

/// Builds the rank files of `plans` (one checkpoint, planned from headers read ahead) into
/// `out_dir`, writing each shard's entries as `next` hands the shard over, and resuming a build
/// an earlier run left off (see the module docs).
///
/// # Errors
/// [`RankCacheError::Checkpoint`] or [`RankCacheError::Mismatch`] when a final shard's header is
/// not the one planned from; read, write and sync failures; [`RankCacheError::Cancelled`] when
/// `next` or `progress` stops it (the partial files and journals stay, for the next run).
pub fn build_rank_caches_streaming(
    plans: &[RankCachePlan],
    out_dir: &Path,
    opts: &RankCacheOptions,
    next: NextShard<'_>,
    progress: ProgressFn<'_>,
) -> Result<Vec<StreamedRank>, RankCacheError> {
    let Some(first) = plans.first() else {
        return Ok(Vec::new());
    };
    let shards = &first.checkpoint.shards;
    let mut partials = plans
        .iter()
        .map(|p| Partial::open(p, out_dir, opts))
        .collect::<Result<Vec<_>, _>>()?;
    let chunk = chunk_len(opts);
    let report = |partials: &[Partial<'_>],
                  progress: &mut dyn FnMut(&RankCacheProgress) -> Result<(), Cancelled>|
     -> Result<(), RankCacheError> {
        for p in partials {
            progress(&RankCacheProgress {
                rank: p.plan.rank,
                phase: RankCachePhase::Write,
                bytes_done: p.bytes_done(),
                bytes_total: p.plan.data_bytes,
                final_prefix: p.final_prefix(),
            })
            .map_err(|Cancelled| RankCacheError::Cancelled { rank: p.plan.rank })?;
        }
        Ok(())
    };
    report(&partials, progress)?;
    loop {
        let pending: Vec<usize> = (0..shards.len())
            .filter(|&s| partials.iter().any(|p| !p.done[s]))
            .collect();
        if pending.is_empty() {
            break;
        }
        let s =
            next(&pending).map_err(|Cancelled| RankCacheError::Cancelled { rank: first.rank })?;
        if !pending.contains(&s) {
            continue;
        }
        let shard_path = &shards[s].path;
        let local = read_shard_header(shard_path)?;
        if let Err(problem) = first.checkpoint.matches_header(s, &local) {
            return Err(RankCacheError::Mismatch {
                file: shard_path.clone(),
                key: "-".into(),
                problem: format!(
                    "the shard's header differs from the one read ahead by byte range ({problem})"
                ),
            });
        }
        let src =
            crate::safe_fs::open_regular(shard_path).map_err(|source| RankCacheError::Io {
                rank: first.rank,
                op: "open",
                path: shard_path.clone(),
                source,
            })?;
        // Each rank file on its own thread: a shard's entries go to every rank at once.
        let src = &src;
        on_threads(
            first.rank,
            partials.iter_mut().filter(|p| !p.done[s]).map(|p| {
                move || {
                    let (mut buf, mut scratch) = (Vec::new(), Vec::new());
                    p.write_shard(s, src, chunk, &mut buf, &mut scratch)
                }
            }),
        )?;
        report(&partials, progress)?;
    }
    // The trailers, syncs and final names, every rank at once too.
    on_threads(
        first.rank,
        partials
            .into_iter()
            .map(|p| move || p.finish(out_dir, opts)),
    )
}

/// Runs every job on its own scoped thread; their results in order, or the first error (a
/// panicked job as [`RankCacheError::WorkerPanicked`] for `rank`).
fn on_threads<T: Send, F: FnOnce() -> Result<T, RankCacheError> + Send>(
    rank: usize,
    jobs: impl Iterator<Item = F>,
) -> Result<Vec<T>, RankCacheError> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = jobs.map(|job| scope.spawn(job)).collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or(Err(RankCacheError::WorkerPanicked { rank }))
            })
            .collect()
    })
}
