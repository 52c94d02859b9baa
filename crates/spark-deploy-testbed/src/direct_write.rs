//! The disk's own speed for the worker's write pattern: files written the way the worker's
//! receiver writes what it receives (4 MiB blocks with `O_DIRECT`, the last unaligned bytes
//! through the page cache, several files at once), with no network and no hash. `bench-storage`
//! runs it beside the copies as the `disk` way: a copy that keeps up with it runs at the disk's
//! speed, whatever a `cp` through the page cache does meanwhile.

use std::fs::{File, OpenOptions};
use std::io::Read as _;
use std::os::unix::fs::{FileExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The receiver's block: one write of this size per full buffer.
pub const BLOCK: usize = 4 << 20;
/// The alignment `O_DIRECT` asks of offsets, lengths and buffers.
const ALIGN: usize = 4096;

/// Why a file was not written.
#[derive(Debug, thiserror::Error)]
pub enum DirectWriteError {
    /// The source could not be opened or read.
    #[error("reading {path}: {source}")]
    Read {
        /// The source file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The destination (or its directory) could not be created or written.
    #[error("writing {path}: {source} (is the disk full, or the directory read-only?)")]
    Write {
        /// The destination file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

/// Writes each `(from, to)` pair's bytes to `to` (its directory created), `streams` files at a
/// time, each stream taking the next file when it is done with one, as the transfer's streams do.
///
/// # Errors
///
/// The first [`DirectWriteError`] of any stream; files already written stay.
pub fn copy_all(pairs: &[(PathBuf, PathBuf)], streams: usize) -> Result<(), DirectWriteError> {
    let next = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        let lanes: Vec<_> = (0..streams.max(1))
            .map(|_| {
                scope.spawn(|| {
                    let mut buf = vec![0u8; BLOCK + ALIGN];
                    let start = buf.as_ptr().align_offset(ALIGN);
                    let block = &mut buf[start..start + BLOCK];
                    while let Some((from, to)) = pairs.get(next.fetch_add(1, Ordering::Relaxed)) {
                        copy_one(from, to, block)?;
                    }
                    Ok(())
                })
            })
            .collect();
        lanes.into_iter().try_for_each(|lane| {
            lane.join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    })
}

/// One file through `block` (aligned, [`BLOCK`] bytes): whole aligned runs with `O_DIRECT`, the
/// tail (and everything, where the file system refuses `O_DIRECT`) through the page cache.
fn copy_one(from: &Path, to: &Path, block: &mut [u8]) -> Result<(), DirectWriteError> {
    let read_err = |source| DirectWriteError::Read {
        path: from.to_owned(),
        source,
    };
    let write_err = |source| DirectWriteError::Write {
        path: to.to_owned(),
        source,
    };
    let mut src = File::open(from).map_err(read_err)?;
    if let Some(dir) = to.parent() {
        std::fs::create_dir_all(dir).map_err(write_err)?;
    }
    let cached = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(to)
        .map_err(write_err)?;
    let direct = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(to)
        .ok();
    let mut at = 0u64;
    loop {
        let n = fill(&mut src, block).map_err(read_err)?;
        if n == 0 {
            return Ok(());
        }
        let whole = match &direct {
            Some(d) => {
                let whole = n - n % ALIGN;
                d.write_all_at(&block[..whole], at).map_err(write_err)?;
                whole
            }
            None => 0,
        };
        cached
            .write_all_at(&block[whole..n], at + whole as u64)
            .map_err(write_err)?;
        at += n as u64;
    }
}

/// Reads until `buf` is full or the source ends; the bytes read.
fn fill(src: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match src.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn writes_the_same_bytes_whatever_the_sizes() {
        let dir = tempfile::tempdir().unwrap();
        let sizes = [
            0,
            1,
            ALIGN - 1,
            ALIGN,
            BLOCK,
            BLOCK + 3 * ALIGN + 17,
            2 * BLOCK + 1,
        ];
        let pairs: Vec<_> = sizes
            .iter()
            .enumerate()
            .map(|(i, &size)| {
                let from = dir.path().join(format!("src-{i}"));
                let bytes: Vec<u8> = (0..size).map(|b| (b * 7 + i) as u8).collect();
                std::fs::write(&from, bytes).unwrap();
                (from, dir.path().join("out").join(format!("dst-{i}")))
            })
            .collect();
        copy_all(&pairs, 3).unwrap();
        for (from, to) in &pairs {
            assert_eq!(
                std::fs::read(from).unwrap(),
                std::fs::read(to).unwrap(),
                "{to:?}"
            );
        }
    }

    #[test]
    fn a_missing_source_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        let e = copy_all(&[(missing.clone(), dir.path().join("x"))], 1).unwrap_err();
        assert!(
            matches!(&e, DirectWriteError::Read { path, .. } if *path == missing),
            "{e}"
        );
    }
}
