//! Opening files safely: the one place that reads input files and creates temporaries.
//!
//! - **Reading** a file that must be a regular file (a config, a recipe `.env`, a JSON document,
//!   a shard, an index, the API key file): [`open_regular`] opens it with `O_NONBLOCK`, so a FIFO
//!   or a device never blocks the open, then checks what was opened (`fstat` on the descriptor,
//!   so nothing can be swapped between the check and the read). FIFOs, sockets, devices and
//!   directories are refused with [`Refused::NotRegular`]. [`read_capped`] also refuses a file
//!   larger than a cap ([`Refused::TooLarge`]) before reading it, and stops at the cap if the
//!   file grows while it is read.
//! - **Creating** a temporary or `.partial` file: [`create_exclusive`] removes whatever sits at
//!   the path (a stale partial of an interrupted run, or a planted symlink: the link itself is
//!   removed, never its target; a directory is refused), then creates the file with
//!   `O_CREAT|O_EXCL|O_NOFOLLOW`: if anything reappears at the path in between, the create fails
//!   instead of writing through it. [`write_exclusive`] is `std::fs::write` on top of it, and
//!   [`write_atomic`] adds the rename to the final name.
//!
//! Every function returns [`std::io::Error`], so callers keep their own context (which file, which
//! field); a refusal is an `io::Error` whose inner error is a [`Refused`] naming the remedy.

use std::fs::{File, OpenOptions};
use std::io::{Read as _, Write as _};
use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _};
use std::path::Path;

/// Largest configuration or recipe file read (TOML, `.env`, `local.sh`): 1 MiB.
pub const TEXT_CAP: u64 = 1 << 20;
/// Largest JSON document read from a checkpoint or a state directory: 64 MiB.
pub const JSON_CAP: u64 = 64 << 20;

/// Largest patch file read (`engine.patches`): 64 MiB.
pub const PATCH_CAP: u64 = 64 << 20;

/// `custom_flags` for reopening a partial file to resume it (a download's `.incomplete`): never
/// through a symlink (`ELOOP`), never blocking on a FIFO (`ENXIO`).
pub const RESUME_FLAGS: i32 = libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC;

/// Why a file was not opened or read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// Not a regular file (a FIFO would block the read forever, a device never ends).
    #[error(
        "is {kind}, not a regular file (refused without reading it); remedy: give the path of a regular file"
    )]
    NotRegular {
        /// `a FIFO`, `a directory`, `a character device`, ...
        kind: &'static str,
    },
    /// Larger than what such a file can sensibly be.
    #[error(
        "is larger than {cap} bytes ({len} bytes), more than such a file can be; remedy: check that the path names the intended file"
    )]
    TooLarge {
        /// The size seen.
        len: u64,
        /// The cap.
        cap: u64,
    },
    /// A directory sits where a temporary file is to be created.
    #[error("is a directory where a temporary file is written; remedy: remove that directory")]
    DirectoryInTheWay,
}

impl From<Refused> for std::io::Error {
    fn from(r: Refused) -> Self {
        let kind = match r {
            Refused::TooLarge { .. } => std::io::ErrorKind::InvalidData,
            Refused::NotRegular { .. } | Refused::DirectoryInTheWay => {
                std::io::ErrorKind::InvalidInput
            }
        };
        Self::new(kind, r)
    }
}

/// The [`Refused`] inside an I/O error from this module, if it is one.
#[must_use]
pub fn refusal(e: &std::io::Error) -> Option<&Refused> {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<Refused>())
}

fn kind_of(ft: std::fs::FileType) -> &'static str {
    if ft.is_dir() {
        "a directory"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_char_device() {
        "a character device"
    } else if ft.is_block_device() {
        "a block device"
    } else if ft.is_symlink() {
        "a symbolic link"
    } else {
        "not a regular file"
    }
}

/// Opens `path` for reading if it is a regular file (symlinks to one are followed), never
/// blocking on a FIFO or a device.
///
/// # Errors
///
/// The open's I/O error, or [`Refused::NotRegular`] as an I/O error.
pub fn open_regular(path: &Path) -> std::io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(path)?;
    // `O_NONBLOCK` stays set: it changes nothing for a regular file.
    let ft = file.metadata()?.file_type();
    if !ft.is_file() {
        return Err(Refused::NotRegular { kind: kind_of(ft) }.into());
    }
    Ok(file)
}

/// Reads `path` whole, if it is a regular file of at most `cap` bytes.
///
/// # Errors
///
/// As [`open_regular`]; [`Refused::TooLarge`] as an I/O error.
pub fn read_capped(path: &Path, cap: u64) -> std::io::Result<Vec<u8>> {
    let file = open_regular(path)?;
    let len = file.metadata()?.len();
    if len > cap {
        return Err(Refused::TooLarge { len, cap }.into());
    }
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    file.take(cap.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > cap {
        return Err(Refused::TooLarge {
            len: bytes.len() as u64,
            cap,
        }
        .into());
    }
    Ok(bytes)
}

/// [`read_capped`] as UTF-8 text.
///
/// # Errors
///
/// As [`read_capped`]; `InvalidData` when the file is not UTF-8.
pub fn read_to_string_capped(path: &Path, cap: u64) -> std::io::Result<String> {
    String::from_utf8(read_capped(path, cap)?).map_err(|e| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "is not UTF-8 text (invalid byte at offset {})",
                e.utf8_error().valid_up_to()
            ),
        )
    })
}

/// Creates `path` for writing, mode `mode` (before the umask), exclusively and without following
/// a symlink: whatever sits at the path (a stale partial, a planted symlink) is unlinked first,
/// and the create fails rather than write through anything that reappears.
///
/// # Errors
///
/// The unlink's or the create's I/O error; [`Refused::DirectoryInTheWay`] as an I/O error.
pub fn create_exclusive(path: &Path, mode: u32) -> std::io::Result<File> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => return Err(Refused::DirectoryInTheWay.into()),
        Ok(_) => std::fs::remove_file(path)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// `std::fs::write` through [`create_exclusive`] (mode 0644 before the umask).
///
/// # Errors
///
/// As [`create_exclusive`], and the write's I/O error.
pub fn write_exclusive(path: &Path, bytes: impl AsRef<[u8]>) -> std::io::Result<()> {
    create_exclusive(path, 0o644)?.write_all(bytes.as_ref())
}

/// `std::fs::copy` into a temporary: `from` must be a regular file ([`open_regular`]), `tmp` is
/// created by [`create_exclusive`] with `mode`; returns the bytes copied.
///
/// # Errors
///
/// As [`open_regular`] and [`create_exclusive`], and the copy's I/O error.
pub fn copy_exclusive(from: &Path, tmp: &Path, mode: u32) -> std::io::Result<u64> {
    let mut src = open_regular(from)?;
    let mut dst = create_exclusive(tmp, mode)?;
    std::io::copy(&mut src, &mut dst)
}

/// Writes `bytes` to `tmp` (through [`create_exclusive`], mode `mode`), fsyncs it and renames it
/// to `path`: `path` holds the old content or the new one, never a part; a symlink at `path` is
/// replaced, not followed. On failure `tmp` is removed.
///
/// # Errors
///
/// The I/O error of the step that failed.
pub fn write_atomic(tmp: &Path, path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    let written = create_exclusive(tmp, mode).and_then(|mut f| {
        f.write_all(bytes)?;
        f.sync_all()
    });
    let done = written.and_then(|()| std::fs::rename(tmp, path));
    if done.is_err() {
        let _ = std::fs::remove_file(tmp);
    }
    done
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{PermissionsExt as _, symlink};
    use std::time::{Duration, Instant};

    use super::*;

    fn mkfifo(path: &Path) {
        let st = std::process::Command::new("mkfifo")
            .arg(path)
            .status()
            .unwrap();
        assert!(st.success());
    }

    #[test]
    fn a_fifo_a_directory_and_a_device_are_refused_without_blocking() {
        let d = tempfile::tempdir().unwrap();
        let fifo = d.path().join("fifo");
        mkfifo(&fifo);
        let t = Instant::now();
        for (p, kind) in [
            (fifo.as_path(), "a FIFO"),
            (d.path(), "a directory"),
            (Path::new("/dev/null"), "a character device"),
        ] {
            let e = read_capped(p, TEXT_CAP).unwrap_err();
            assert_eq!(refusal(&e), Some(&Refused::NotRegular { kind }), "{p:?}");
            assert!(e.to_string().contains("remedy"), "{e}");
        }
        assert!(t.elapsed() < Duration::from_secs(5), "nothing blocked");
    }

    #[test]
    fn a_symlink_to_a_regular_file_is_read_and_size_is_capped() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("f");
        std::fs::write(&f, b"hello").unwrap();
        let l = d.path().join("l");
        symlink(&f, &l).unwrap();
        assert_eq!(read_capped(&l, 5).unwrap(), b"hello");
        let e = read_capped(&f, 4).unwrap_err();
        assert_eq!(refusal(&e), Some(&Refused::TooLarge { len: 5, cap: 4 }));
        std::fs::write(&f, b"\xff\xfe").unwrap();
        let e = read_to_string_capped(&f, 4).unwrap_err();
        assert!(e.to_string().contains("not UTF-8"), "{e}");
    }

    #[test]
    fn a_planted_symlink_is_replaced_and_its_target_left_alone() {
        let d = tempfile::tempdir().unwrap();
        let victim = d.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let partial = d.path().join(".x.partial");
        symlink(&victim, &partial).unwrap();
        write_exclusive(&partial, b"new").unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert!(!std::fs::symlink_metadata(&partial).unwrap().is_symlink());
        assert_eq!(std::fs::read(&partial).unwrap(), b"new");
        // A dangling symlink too: its target is never created.
        let dangling = d.path().join(".y.partial");
        let nowhere = d.path().join("nowhere");
        symlink(&nowhere, &dangling).unwrap();
        write_exclusive(&dangling, b"x").unwrap();
        assert!(!nowhere.exists());
    }

    #[test]
    fn write_atomic_renames_over_a_symlink_and_sets_the_mode() {
        let d = tempfile::tempdir().unwrap();
        let victim = d.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let dest = d.path().join("key");
        symlink(&victim, &dest).unwrap();
        let tmp = d.path().join("key.partial");
        symlink(&victim, &tmp).unwrap();
        write_atomic(&tmp, &dest, b"secret", 0o600).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert_eq!(std::fs::read(&dest).unwrap(), b"secret");
        assert!(!tmp.exists());
        let mode = std::fs::metadata(&dest).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode & 0o077, 0, "{mode:o}");
    }

    #[test]
    fn copy_exclusive_never_writes_through_a_planted_symlink() {
        let d = tempfile::tempdir().unwrap();
        let (src, victim, tmp) = (d.path().join("s"), d.path().join("v"), d.path().join("t"));
        std::fs::write(&src, b"binary").unwrap();
        std::fs::write(&victim, b"precious").unwrap();
        symlink(&victim, &tmp).unwrap();
        assert_eq!(copy_exclusive(&src, &tmp, 0o755).unwrap(), 6);
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert_eq!(std::fs::read(&tmp).unwrap(), b"binary");
    }

    #[test]
    fn a_directory_at_the_partial_path_is_refused_and_kept() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("dir.partial");
        std::fs::create_dir(&p).unwrap();
        std::fs::write(p.join("inside"), b"x").unwrap();
        let e = write_exclusive(&p, b"y").unwrap_err();
        assert_eq!(refusal(&e), Some(&Refused::DirectoryInTheWay));
        assert!(p.join("inside").exists());
    }
}
