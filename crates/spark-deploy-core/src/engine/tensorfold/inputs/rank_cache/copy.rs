//! Copying planned entries' bytes in bounded chunks: contiguous, strided and widened sources.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;

use super::plan::{PlannedEntry, RankCachePlan, SourceRange};
use super::{
    Cancelled, ProgressFn, RankCacheError, RankCacheOptions, RankCachePhase, RankCacheProgress,
};
use crate::engine::tensorfold::inputs::dtype::f16_to_f32_bits;

/// Copies entry bytes `[p0, p1)` of `e` into `dst`, reading `file` (the entry's shard).
pub(super) fn copy_piece(
    e: &PlannedEntry,
    file: &File,
    p0: u64,
    p1: u64,
    dst: &mut [u8],
    scratch: &mut Vec<u8>,
) -> std::io::Result<()> {
    match e.source {
        SourceRange::Contiguous { offset, .. } => file.read_exact_at(dst, offset + p0),
        SourceRange::WidenF16 { offset, .. } => {
            let (e0, e1) = (p0 / 4, p1.div_ceil(4));
            let n = (e1 - e0) as usize;
            scratch.resize(n * 6, 0);
            let (half, wide) = scratch.split_at_mut(n * 2);
            file.read_exact_at(half, offset + e0 * 2)?;
            for (h, w) in half.chunks_exact(2).zip(wide.chunks_exact_mut(4)) {
                let bits = f16_to_f32_bits(u16::from_le_bytes([h[0], h[1]]));
                w.copy_from_slice(&bits.to_le_bytes());
            }
            let skip = (p0 - e0 * 4) as usize;
            dst.copy_from_slice(&wide[skip..skip + dst.len()]);
            Ok(())
        }
        SourceRange::Strided {
            offset,
            run,
            stride,
            ..
        } => {
            let (r0, r1) = (p0 / run, (p1 - 1) / run);
            let src_of = |p: u64| offset + (p / run) * stride + p % run;
            if r0 == r1 {
                return file.read_exact_at(dst, src_of(p0));
            }
            let span0 = src_of(p0);
            let span1 = offset + r1 * stride + (p1 - r1 * run);
            let span = span1 - span0;
            // one read covering every run when that reads at most about twice what is kept
            // (column halves); otherwise a read a run
            if span <= dst.len() as u64 * 2 + 2 * stride {
                scratch.resize(span as usize, 0);
                file.read_exact_at(scratch, span0)?;
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
                    file.read_exact_at(&mut dst[d..d + (end - p) as usize], src_of(p))?;
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
            copy_piece(e, &files[e.source.shard()], p0, p1, dst, scratch)
                .map_err(RankCacheError::read_source(plan, e))?;
        }
        i += 1;
    }
    Ok(())
}

/// The data bytes of every chunk but the last: `opts.chunk_bytes`, at least 4096, a multiple of 4.
pub(super) fn chunk_len(opts: &RankCacheOptions) -> u64 {
    opts.chunk_bytes.max(4096) as u64 / 4 * 4
}

/// Receives each filled chunk with its data offset (write it, or compare it).
type ChunkSink<'a> = dyn Fn(u64, &[u8]) -> Result<(), RankCacheError> + Sync + 'a;

/// Runs `sink` on every chunk of the data section, chunks filled in parallel from the checkpoint.
pub(super) fn for_each_chunk(
    plan: &RankCachePlan,
    opts: &RankCacheOptions,
    phase: RankCachePhase,
    progress: ProgressFn<'_>,
    sink: &ChunkSink<'_>,
) -> Result<(), RankCacheError> {
    for_each_chunk_until(plan, opts, phase, progress, sink, &AtomicBool::new(false))
}

/// [`for_each_chunk`], with the flag it sets when it stops early (an error, a cancellation)
/// visible to `sink`: a sink that waits for another chunk gives up once `stop` is set.
pub(super) fn for_each_chunk_until(
    plan: &RankCachePlan,
    opts: &RankCacheOptions,
    phase: RankCachePhase,
    progress: ProgressFn<'_>,
    sink: &ChunkSink<'_>,
    stop: &AtomicBool,
) -> Result<(), RankCacheError> {
    let files = plan
        .checkpoint
        .shards
        .iter()
        .map(|s| {
            crate::safe_fs::open_regular(&s.path)
                .map_err(RankCacheError::io(plan.rank, "open", &s.path))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let chunk = chunk_len(opts);
    let total = plan.data_bytes;
    let n_chunks = total.div_ceil(chunk);
    let next = AtomicU64::new(0);
    let threads = opts.threads.clamp(1, 64).min(n_chunks.max(1) as usize);
    let (tx, rx) = mpsc::sync_channel::<Result<u64, RankCacheError>>(threads * 2);
    let mut first_err: Option<RankCacheError> = None;
    let mut done = 0u64;
    let mut cancelled = false;
    let panicked = std::thread::scope(|scope| {
        let mut handles = Vec::with_capacity(threads);
        for _ in 0..threads {
            let tx = tx.clone();
            let (files, next) = (&files, &next);
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
                            final_prefix: 0,
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
            final_prefix: 0,
        };
        progress(&p).map_err(|Cancelled| RankCacheError::Cancelled { rank: plan.rank })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::tensorfold::inputs::dtype::DType;
    use crate::engine::tensorfold::inputs::rank_file::IndexRow;

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
        let files = [File::open(&p).unwrap()];
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
                copy_piece(&e, &files[0], p0, p1, &mut dst, &mut scratch).unwrap();
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
        let files = [File::open(&p).unwrap()];
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
            copy_piece(&e, &files[0], p0, p1, &mut dst, &mut scratch).unwrap();
            assert_eq!(dst, want[p0 as usize..p1 as usize], "[{p0}, {p1})");
        }
    }
}
