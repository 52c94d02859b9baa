//! Block checksums of a rank file's data section: a CRC-32 of every `block_bytes` block, computed
//! from the chunks a build writes (no second read) and recorded in the sidecar; checked before
//! launch by reading the rank file once (not the checkpoint).
//!
//! CRC-32 detects every error burst of up to 32 bits in a block (so every flipped byte, and every
//! run of flipped bits within four bytes), every odd number of flipped bits, and anything else
//! with probability 1 − 2⁻³², at memory speed (`crc32fast`: PCLMULQDQ on x86-64, the CRC
//! instructions on aarch64).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use serde_json::Value;

use super::plan::RankCachePlan;
use super::{Cancelled, ProgressFn, RankCacheError, RankCachePhase, RankCacheProgress};

/// The sidecar key holding the checksums.
pub const SIDECAR_KEY: &str = "checksums";

/// The CRC-32 of every block of a rank file's data section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockChecksums {
    /// Bytes per block (the last block may be shorter).
    pub block_bytes: u64,
    /// One CRC-32 per block, in order.
    pub crc32: Vec<u32>,
}

impl BlockChecksums {
    /// The sidecar's JSON value: `{"algorithm": "crc32", "block_bytes": …, "blocks": "<8 hex a
    /// block>"}`.
    #[must_use]
    pub fn to_json(&self) -> Value {
        let hex: String = self.crc32.iter().map(|c| format!("{c:08x}")).collect();
        serde_json::json!({
            "algorithm": "crc32",
            "block_bytes": self.block_bytes,
            "blocks": hex,
        })
    }

    /// The checksums a sidecar records for a data section of `data_bytes`, when it records them
    /// whole and well formed.
    #[must_use]
    pub fn from_sidecar(sidecar: &Value, data_bytes: u64) -> Option<Self> {
        let v = sidecar.get(SIDECAR_KEY)?;
        if v.get("algorithm")?.as_str()? != "crc32" {
            return None;
        }
        let block_bytes = v.get("block_bytes")?.as_u64().filter(|b| *b > 0)?;
        let hex = v.get("blocks")?.as_str()?;
        let blocks = usize::try_from(data_bytes.div_ceil(block_bytes)).ok()?;
        if hex.len() != blocks.checked_mul(8)? || !hex.is_ascii() {
            return None;
        }
        let crc32 = (0..blocks)
            .map(|i| u32::from_str_radix(&hex[i * 8..i * 8 + 8], 16).ok())
            .collect::<Option<Vec<u32>>>()?;
        Some(Self { block_bytes, crc32 })
    }
}

/// Reads the data section of the rank file at `path` once, on `threads` threads, and compares the
/// CRC-32 of every block with `sums`.
///
/// # Errors
/// [`RankCacheError::Mismatch`] naming the first block that differs (its byte range and the
/// entries it holds), I/O errors, [`RankCacheError::Cancelled`].
pub(super) fn verify_checksums(
    plan: &RankCachePlan,
    path: &Path,
    sums: &BlockChecksums,
    only: Option<&[u64]>,
    threads: usize,
    progress: ProgressFn<'_>,
) -> Result<(), RankCacheError> {
    let io = |op: &'static str| {
        move |source| RankCacheError::Io {
            rank: plan.rank,
            op,
            path: path.to_path_buf(),
            source,
        }
    };
    let f = File::open(path).map_err(io("open"))?;
    let total = plan.data_bytes;
    let block = sums.block_bytes;
    // The blocks to read: every one, or the given ones (a stamped check's sample).
    let all = sums.crc32.len() as u64;
    let n = only.map_or(all, |o| o.len() as u64);
    let block_at = |k: u64| only.map_or(Some(k), |o| o.get(k as usize).copied());
    let next = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let done = AtomicU64::new(0);
    let buf_len = usize::try_from(block.min(total.max(1))).unwrap_or(usize::MAX);
    let result: Result<(), RankCacheError> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads.clamp(1, 64))
            .map(|_| {
                let (f, next, stop, done) = (&f, &next, &stop, &done);
                scope.spawn(move || -> Result<(), RankCacheError> {
                    let mut buf = vec![0u8; buf_len];
                    loop {
                        let k = next.fetch_add(1, Ordering::Relaxed);
                        if k >= n || stop.load(Ordering::Relaxed) {
                            return Ok(());
                        }
                        let Some(i) = block_at(k).filter(|&i| i < all) else {
                            continue;
                        };
                        let start = i * block;
                        let len = usize::try_from(block.min(total - start)).unwrap_or(0);
                        f.read_exact_at(&mut buf[..len], start)
                            .map_err(io("read"))?;
                        if crc32fast::hash(&buf[..len]) != sums.crc32[i as usize] {
                            stop.store(true, Ordering::Relaxed);
                            return Err(block_mismatch(plan, path, start, start + len as u64));
                        }
                        done.fetch_add(len as u64, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        let mut cancelled = false;
        while !workers
            .iter()
            .all(std::thread::ScopedJoinHandle::is_finished)
        {
            std::thread::sleep(std::time::Duration::from_millis(20));
            if !cancelled && report(plan, done.load(Ordering::Relaxed), progress).is_err() {
                cancelled = true;
                stop.store(true, Ordering::Relaxed);
            }
        }
        let mut first = None;
        for w in workers {
            let r = w
                .join()
                .unwrap_or(Err(RankCacheError::WorkerPanicked { rank: plan.rank }));
            if let Err(e) = r {
                first.get_or_insert(e);
            }
        }
        match first {
            Some(e) => Err(e),
            None if cancelled => Err(RankCacheError::Cancelled { rank: plan.rank }),
            None => Ok(()),
        }
    });
    result?;
    report(plan, total, progress).map_err(|Cancelled| RankCacheError::Cancelled { rank: plan.rank })
}

fn report(plan: &RankCachePlan, done: u64, progress: ProgressFn<'_>) -> Result<(), Cancelled> {
    progress(&RankCacheProgress {
        rank: plan.rank,
        phase: RankCachePhase::Verify,
        bytes_done: done,
        bytes_total: plan.data_bytes,
        final_prefix: 0,
    })
}

/// The error for data bytes `[start, end)` whose CRC-32 differs: it names the entries the block
/// holds.
fn block_mismatch(plan: &RankCachePlan, path: &Path, start: u64, end: u64) -> RankCacheError {
    let first = plan
        .entries
        .partition_point(|e| e.row.offset.saturating_add(e.row.bytes) <= start);
    let last = plan.entries.partition_point(|e| e.row.offset < end);
    let name = |i: usize| plan.entries.get(i).map_or("-", |e| e.row.key.as_str());
    let key = if last > first + 1 {
        format!("{} … {}", name(first), name(last - 1))
    } else {
        name(first).to_owned()
    };
    RankCacheError::Mismatch {
        file: path.to_path_buf(),
        key,
        problem: format!(
            "data bytes [{start}, {end}) do not match the CRC-32 recorded when the file was built (flipped or overwritten bytes)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sidecar_round_trip_and_malformed_records_are_ignored() {
        let sums = BlockChecksums {
            block_bytes: 8,
            crc32: vec![0, 0xdead_beef, 7],
        };
        let side = serde_json::json!({ SIDECAR_KEY: sums.to_json() });
        assert_eq!(BlockChecksums::from_sidecar(&side, 20), Some(sums.clone()));
        // A data section of another length, a block size of 0, a short hex string, another
        // algorithm: no checksums (the caller verifies byte for byte instead).
        assert_eq!(BlockChecksums::from_sidecar(&side, 25), None);
        for broken in [
            serde_json::json!({"algorithm": "crc32", "block_bytes": 0, "blocks": ""}),
            serde_json::json!({"algorithm": "crc32", "block_bytes": 8, "blocks": "00"}),
            serde_json::json!({"algorithm": "md5", "block_bytes": 8, "blocks": "0000000000000000"}),
            serde_json::json!({"algorithm": "crc32", "block_bytes": 8, "blocks": "zzzzzzzzzzzzzzzz"}),
            serde_json::json!({"algorithm": "crc32", "block_bytes": 8, "blocks": "éééééééé"}),
        ] {
            let side = serde_json::json!({ SIDECAR_KEY: broken });
            assert_eq!(BlockChecksums::from_sidecar(&side, 16), None, "{side}");
        }
        assert_eq!(
            BlockChecksums::from_sidecar(&serde_json::json!({}), 16),
            None
        );
    }
}
