//! A rank file's stamp: its device, inode, size, mtime and ctime when every block was last checked
//! against its CRC-32. At [`super::VerifyLevel::Stamped`] (the level `up` uses) an unchanged
//! stamp means the file has not been written, replaced or touched since that full check, so only a
//! sample of blocks is read again: `up` stays constant-time in the checkpoint's size. Any write
//! moves the ctime (which no user can set back), so a changed file is always checked in full.
//!
//! The stamp lives beside the rank file as a dot file (`.<file name>.checked`): the engine looks
//! only at `rank<R>of<W>-*.bin`, and dot files are never shipped to a worker.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

/// Blocks a stamped check reads besides the first and the last.
pub const SAMPLE_BLOCKS: u64 = 14;

/// What a file's metadata was when it was last checked in full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl Stamp {
    /// The stamp of `meta` (the rank file's metadata).
    #[must_use]
    pub fn of(meta: &std::fs::Metadata) -> Self {
        let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime_ns: ns(meta.mtime(), meta.mtime_nsec()),
            ctime_ns: ns(meta.ctime(), meta.ctime_nsec()),
        }
    }

    pub(super) fn line(&self) -> String {
        format!(
            "{} {} {} {} {}\n",
            self.dev, self.ino, self.size, self.mtime_ns, self.ctime_ns
        )
    }

    pub(super) fn parse(text: &str) -> Option<Self> {
        let mut f = text.split_whitespace();
        let s = Self {
            dev: f.next()?.parse().ok()?,
            ino: f.next()?.parse().ok()?,
            size: f.next()?.parse().ok()?,
            mtime_ns: f.next()?.parse().ok()?,
            ctime_ns: f.next()?.parse().ok()?,
        };
        f.next().is_none().then_some(s)
    }
}

/// Where the stamp of `rank_file` is kept.
#[must_use]
pub fn path_for(rank_file: &Path) -> PathBuf {
    let name = rank_file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    rank_file.with_file_name(format!(".{name}.checked"))
}

/// The stamp recorded for `rank_file`, if any (an unreadable or malformed one counts as none).
#[must_use]
pub fn read(rank_file: &Path) -> Option<Stamp> {
    crate::safe_fs::read_to_string_capped(&path_for(rank_file), 4096)
        .ok()
        .and_then(|t| Stamp::parse(&t))
}

/// Records `stamp` for `rank_file` (written to a fresh partial, then renamed).
///
/// # Errors
///
/// The I/O error of the write or the rename.
pub fn write(rank_file: &Path, stamp: &Stamp) -> std::io::Result<()> {
    let path = path_for(rank_file);
    let tmp = path.with_extension(format!("checked.{}.partial", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    crate::safe_fs::write_atomic(&tmp, &path, stamp.line().as_bytes(), 0o644)
}

/// Forgets the stamp of `rank_file` (a failed check: the next one reads every block).
pub fn clear(rank_file: &Path) {
    let _ = std::fs::remove_file(path_for(rank_file));
}

/// The blocks a stamped check reads among `n`: the first, the last and [`SAMPLE_BLOCKS`] spread
/// evenly from an offset that `seed` moves, so successive checks cover different blocks.
#[must_use]
pub fn sample(n: u64, seed: u64) -> Vec<u64> {
    if n <= SAMPLE_BLOCKS + 2 {
        return (0..n).collect();
    }
    let step = n / SAMPLE_BLOCKS;
    let mut out: Vec<u64> = std::iter::once(0)
        .chain((0..SAMPLE_BLOCKS).map(|j| (seed % step + j * step) % n))
        .chain(std::iter::once(n - 1))
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamp_reads_back_and_moves_with_any_write() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("rank0of2-abc.bin");
        std::fs::write(&f, b"0123456789").unwrap();
        assert_eq!(read(&f), None);
        let s = Stamp::of(&std::fs::metadata(&f).unwrap());
        write(&f, &s).unwrap();
        assert_eq!(read(&f), Some(s));
        assert!(
            path_for(&f)
                .file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with('.')
        );
        // A write of the same length, even with the mtime set back, moves the ctime.
        std::thread::sleep(std::time::Duration::from_millis(20));
        let mtime = std::fs::metadata(&f).unwrap().modified().unwrap();
        std::fs::write(&f, b"0123456788").unwrap();
        std::fs::File::options()
            .write(true)
            .open(&f)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
        assert_ne!(Stamp::of(&std::fs::metadata(&f).unwrap()), s);
        clear(&f);
        assert_eq!(read(&f), None);
        std::fs::write(path_for(&f), "1 2 x").unwrap();
        assert_eq!(read(&f), None, "malformed: none");
    }

    #[test]
    fn the_sample_holds_the_ends_and_moves_with_the_seed() {
        assert_eq!(sample(5, 3), vec![0, 1, 2, 3, 4]);
        let a = sample(1000, 0);
        let b = sample(1000, 37);
        assert!(a.len() <= SAMPLE_BLOCKS as usize + 2 && a.len() >= SAMPLE_BLOCKS as usize);
        for s in [&a, &b] {
            assert_eq!(s.first(), Some(&0));
            assert_eq!(s.last(), Some(&999));
            assert!(s.iter().all(|&i| i < 1000));
        }
        assert_ne!(a, b);
    }
}
