//! A `FROM scratch`-style root filesystem for the stand-in image: the dynamic loader and every
//! library `ldd <binary>` lists, at their absolute paths, plus `/tmp` (1777), `/engine` and
//! `/etc/passwd`. The testbed `docker import`s the tar and mounts the engine dir (holding the
//! binary under both names) at `/engine`.

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The shared objects `ldd` lists for `binary` (absolute paths; `linux-vdso` skipped).
///
/// # Errors
/// `ldd` cannot run or fails (e.g. a static binary: "not a dynamic executable").
pub fn ldd_paths(binary: &Path) -> io::Result<Vec<PathBuf>> {
    let out = Command::new("ldd").arg(binary).output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "ldd {} failed: {}",
            binary.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let mut v = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)" or "/lib64/ld-linux-x86-64.so.2 (0x…)"
        let target = line.split_once("=>").map_or(line, |(_, r)| r).trim();
        let path = target.split_whitespace().next().unwrap_or("");
        if path.starts_with('/') && !v.iter().any(|p: &PathBuf| p == Path::new(path)) {
            v.push(PathBuf::from(path));
        }
        if line.contains("not found") {
            return Err(io::Error::other(format!("ldd: {}", line.trim())));
        }
    }
    if v.is_empty() {
        return Err(io::Error::other(format!(
            "ldd listed no libraries for {}",
            binary.display()
        )));
    }
    Ok(v)
}

fn octal(field: &mut [u8], v: u64) {
    let s = format!("{:0w$o}\0", v, w = field.len() - 1);
    field.copy_from_slice(s.as_bytes());
}

fn header(name: &str, size: u64, mode: u32, typeflag: u8) -> io::Result<[u8; 512]> {
    let mut h = [0u8; 512];
    let (prefix, base) = if name.len() <= 100 {
        ("", name)
    } else {
        let cut = name[..name.len().min(155)]
            .rfind('/')
            .ok_or_else(|| io::Error::other(format!("tar: path too long for ustar: {name}")))?;
        (&name[..cut], &name[cut + 1..])
    };
    if base.len() > 100 || prefix.len() > 155 {
        return Err(io::Error::other(format!(
            "tar: path too long for ustar: {name}"
        )));
    }
    h[..base.len()].copy_from_slice(base.as_bytes());
    octal(&mut h[100..108], u64::from(mode));
    octal(&mut h[108..116], 0);
    octal(&mut h[116..124], 0);
    octal(&mut h[124..136], size);
    octal(&mut h[136..148], 0);
    h[156] = typeflag;
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[345..345 + prefix.len()].copy_from_slice(prefix.as_bytes());
    h[148..156].copy_from_slice(b"        ");
    let sum: u64 = h.iter().map(|b| u64::from(*b)).sum();
    let s = format!("{sum:06o}\0 ");
    h[148..156].copy_from_slice(s.as_bytes());
    Ok(h)
}

/// A minimal ustar writer (directories and regular files, owner root).
#[derive(Debug, Default)]
pub struct TarBuilder {
    out: Vec<u8>,
    dirs: Vec<String>,
}

impl TarBuilder {
    /// Adds a directory (and its parents) once.
    ///
    /// # Errors
    /// A path too long for ustar.
    pub fn dir(&mut self, path: &str, mode: u32) -> io::Result<()> {
        let path = path.trim_matches('/');
        if path.is_empty() || self.dirs.iter().any(|d| d == path) {
            return Ok(());
        }
        if let Some((parent, _)) = path.rsplit_once('/') {
            self.dir(parent, 0o755)?;
        }
        self.out
            .extend_from_slice(&header(&format!("{path}/"), 0, mode, b'5')?);
        self.dirs.push(path.to_owned());
        Ok(())
    }

    /// Adds a regular file (and its parent directories).
    ///
    /// # Errors
    /// A path too long for ustar.
    pub fn file(&mut self, path: &str, mode: u32, data: &[u8]) -> io::Result<()> {
        let path = path.trim_start_matches('/');
        if let Some((parent, _)) = path.rsplit_once('/') {
            self.dir(parent, 0o755)?;
        }
        self.out
            .extend_from_slice(&header(path, data.len() as u64, mode, b'0')?);
        self.out.extend_from_slice(data);
        let pad = (512 - data.len() % 512) % 512;
        self.out.extend(std::iter::repeat_n(0u8, pad));
        Ok(())
    }

    /// The finished archive (two zero blocks appended).
    #[must_use]
    pub fn finish(mut self) -> Vec<u8> {
        self.out.extend(std::iter::repeat_n(0u8, 1024));
        self.out
    }
}

/// Builds the stand-in image's root filesystem as a tar: every library `ldd binary` lists (its
/// contents, symlinks resolved, stored at the listed absolute path), `/tmp` (1777), `/engine`,
/// and `/etc/passwd` + `/etc/group` for root. The binary itself is **not** included: the testbed
/// mounts the engine dir at `/engine`.
///
/// # Errors
/// `ldd` fails, or a library cannot be read.
pub fn rootfs_tar(binary: &Path) -> io::Result<Vec<u8>> {
    rootfs_tar_with(binary, &[])
}

/// The host programs that make the bash recipe's container command work unchanged:
/// `bash -c "( CMD ) 2>&1 | tee /logs/NAME.log"`.
pub const SHELL_PROGRAMS: &[&str] = &["/usr/bin/bash", "/usr/bin/tee"];

fn read(p: &Path) -> io::Result<Vec<u8>> {
    std::fs::read(p).map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", p.display())))
}

/// [`rootfs_tar`] plus host `programs` (e.g. [`SHELL_PROGRAMS`]), each stored at its absolute
/// path (symlinks resolved) together with the libraries `ldd` lists for it.
///
/// # Errors
/// `ldd` fails for the binary or a program, or a file cannot be read.
pub fn rootfs_tar_with(binary: &Path, programs: &[&Path]) -> io::Result<Vec<u8>> {
    let mut t = TarBuilder::default();
    t.dir("tmp", 0o1777)?;
    t.dir("engine", 0o755)?;
    t.file(
        "etc/passwd",
        0o644,
        b"root:x:0:0:root:/root:/engine/tf-dsv41-lanes\n",
    )?;
    t.file("etc/group", 0o644, b"root:x:0:\n")?;
    let mut libs: Vec<PathBuf> = ldd_paths(binary)?;
    for p in programs {
        for l in ldd_paths(p)? {
            if !libs.contains(&l) {
                libs.push(l);
            }
        }
        t.file(&p.to_string_lossy(), 0o755, &read(p)?)?;
    }
    for lib in libs {
        t.file(&lib.to_string_lossy(), 0o755, &read(&lib)?)?;
    }
    Ok(t.finish())
}

/// Writes [`rootfs_tar`] to `out`.
///
/// # Errors
/// As [`rootfs_tar`], or writing `out` fails.
pub fn write_rootfs_tar(binary: &Path, out: &Path) -> io::Result<()> {
    fs_err::write(out, rootfs_tar(binary)?)
}
