//! Verifying one downloaded or cached file (no network); whole snapshots are checked in
//! [`super::snapshot`].
//!
//! A file is verified when its size is the expected one, its content hashes to the expected
//! sha256 (the Hub's LFS oid) or git blob sha1 (the ETag of a small file), and — for
//! `.safetensors` — its header parses and the data section ends exactly at the file size.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha1::{Digest as _, Sha1};
use sha2::{Digest as _, Sha256};

use crate::safetensors_header::ReadError;

/// A problem found while verifying one file.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// The file is not in the cache (or its snapshot entry points nowhere).
    #[error("{repo}@{revision}: {file} is missing from the cache")]
    Missing {
        /// Repository id.
        repo: String,
        /// Commit.
        revision: String,
        /// Repository-relative path.
        file: String,
    },
    /// Wrong size.
    #[error("{file}: size is {actual} bytes, expected {expected}")]
    Size {
        /// Repository-relative path.
        file: String,
        /// Expected size.
        expected: u64,
        /// Size on disk.
        actual: u64,
    },
    /// Content does not hash to the expected value.
    #[error("{file}: {algo} is {actual}, expected {expected}")]
    Hash {
        /// Repository-relative path.
        file: String,
        /// `sha256` or `git-sha1`.
        algo: &'static str,
        /// Expected hex digest.
        expected: String,
        /// Digest of the content on disk.
        actual: String,
    },
    /// A `.safetensors` file whose header does not parse or whose data does not end at the file end.
    #[error("{file}: not a complete safetensors file: {reason}")]
    Safetensors {
        /// Repository-relative path.
        file: String,
        /// What is wrong.
        reason: String,
    },
    /// The snapshot to verify does not exist.
    #[error("{repo}@{revision}: no snapshot in the cache at {path}")]
    NoSnapshot {
        /// Repository id.
        repo: String,
        /// Revision asked for.
        revision: String,
        /// Where it was looked for.
        path: PathBuf,
    },
    /// Reading the file failed.
    #[error("cannot read {path}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// What a file must be.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Expected {
    /// Size in bytes.
    pub size: Option<u64>,
    /// Lower-case hex sha256 of the content.
    pub sha256: Option<String>,
    /// Lower-case hex git blob sha1 of the content.
    pub git_sha1: Option<String>,
}

impl Expected {
    /// What a blob named `etag` must hash to: a 64-hex ETag is a sha256, a 40-hex one a git sha1.
    #[must_use]
    pub fn from_etag(etag: &str) -> Self {
        let hex = etag.bytes().all(|b| b.is_ascii_hexdigit());
        match (hex, etag.len()) {
            (true, 64) => Self {
                sha256: Some(etag.to_ascii_lowercase()),
                ..Self::default()
            },
            (true, 40) => Self {
                git_sha1: Some(etag.to_ascii_lowercase()),
                ..Self::default()
            },
            _ => Self::default(),
        }
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> VerifyError + '_ {
    move |source| VerifyError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Digests of a whole file, computed in one read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Digests {
    /// Size in bytes.
    pub size: u64,
    /// sha256 (hex), if asked for.
    pub sha256: Option<String>,
    /// git blob sha1 (hex), if asked for.
    pub git_sha1: Option<String>,
}

/// The digests asked for, fed the bytes of one file in order.
#[derive(Clone)]
struct Hashers {
    sha256: Option<Sha256>,
    git_sha1: Option<Sha1>,
}

impl Hashers {
    /// Hashers for a file of `size` bytes (the git blob sha1 starts with a header naming it).
    fn new(sha256: bool, git_sha1: bool, size: u64) -> Self {
        Self {
            sha256: sha256.then(Sha256::new),
            git_sha1: git_sha1.then(|| {
                let mut h = Sha1::new();
                h.update(format!("blob {size}\0").as_bytes());
                h
            }),
        }
    }

    fn update(&mut self, b: &[u8]) {
        if let Some(h) = self.sha256.as_mut() {
            h.update(b);
        }
        if let Some(h) = self.git_sha1.as_mut() {
            h.update(b);
        }
    }

    /// `(sha256, git sha1)` as lowercase hex, for those asked for.
    fn finish(self) -> (Option<String>, Option<String>) {
        (
            self.sha256.map(|h| hex::encode(h.finalize())),
            self.git_sha1.map(|h| hex::encode(h.finalize())),
        )
    }
}

/// Hash a file (blocking; run it on a blocking thread for big files).
///
/// # Errors
/// [`VerifyError::Io`] if the file cannot be read.
pub fn digest_file(path: &Path, sha256: bool, git_sha1: bool) -> Result<Digests, VerifyError> {
    let size = std::fs::metadata(path).map_err(io_err(path))?.len();
    let mut h = Hashers::new(sha256, git_sha1, size);
    crate::digest::stream_file(path, 0, None, |b| h.update(b)).map_err(io_err(path))?;
    let (sha256, git_sha1) = h.finish();
    Ok(Digests {
        size,
        sha256,
        git_sha1,
    })
}

/// Compare computed digests with the expected ones.
fn compare(
    file: &str,
    exp: &Expected,
    sha256: Option<String>,
    git_sha1: Option<String>,
) -> Result<(), VerifyError> {
    for (algo, want, got) in [
        ("sha256", &exp.sha256, sha256),
        ("git-sha1", &exp.git_sha1, git_sha1),
    ] {
        if let (Some(w), Some(g)) = (want, got)
            && !w.eq_ignore_ascii_case(&g)
        {
            return Err(VerifyError::Hash {
                file: file.to_owned(),
                algo,
                expected: w.clone(),
                actual: g,
            });
        }
    }
    Ok(())
}

/// Check that a `.safetensors` file is complete: the header parses and validates (see
/// [`crate::safetensors_header`]) and `8 + N + data_len` equals the file size.
///
/// # Errors
/// [`VerifyError::Safetensors`] naming `file`, or [`VerifyError::Io`].
pub fn check_safetensors(path: &Path, file: &str) -> Result<(), VerifyError> {
    match crate::safetensors_header::read(path) {
        Ok(_) => Ok(()),
        Err(ReadError::Io { path, source }) => Err(VerifyError::Io { path, source }),
        Err(ReadError::Header { problem, .. }) => Err(VerifyError::Safetensors {
            file: file.to_owned(),
            reason: problem.to_string(),
        }),
    }
}

/// The file's size, when it is the expected one.
fn checked_size(path: &Path, file: &str, exp: &Expected) -> Result<u64, VerifyError> {
    let size = std::fs::metadata(path).map_err(io_err(path))?.len();
    match exp.size {
        Some(expected) if expected != size => Err(VerifyError::Size {
            file: file.to_owned(),
            expected,
            actual: size,
        }),
        _ => Ok(size),
    }
}

/// Verify one file against `exp` (and the safetensors rule when `file` ends in `.safetensors`).
///
/// # Errors
/// The first problem found, as a [`VerifyError`] naming `file`.
pub fn verify_file(path: &Path, file: &str, exp: &Expected) -> Result<(), VerifyError> {
    checked_size(path, file, exp)?;
    if file.ends_with(".safetensors") {
        check_safetensors(path, file)?;
    }
    let d = digest_file(path, exp.sha256.is_some(), exp.git_sha1.is_some())?;
    compare(file, exp, d.sha256, d.git_sha1)
}

/// Digests computed while bytes are written, so a download needs no second read pass.
/// Only the digests `Expected` asks for are computed.
#[derive(Clone)]
pub(crate) struct StreamHasher {
    size: u64,
    hashers: Hashers,
    len: u64,
}

impl StreamHasher {
    /// Hashers for a file of `size` bytes.
    pub(crate) fn new(exp: &Expected, size: u64) -> Self {
        Self {
            size,
            hashers: Hashers::new(exp.sha256.is_some(), exp.git_sha1.is_some(), size),
            len: 0,
        }
    }

    /// Hash the next bytes of the file.
    pub(crate) fn update(&mut self, b: &[u8]) {
        self.hashers.update(b);
        self.len += b.len() as u64;
    }

    /// Bring the digests to the first `to` bytes of `path` (re-hashing from 0 if the file shrank
    /// below what was hashed). Blocking.
    pub(crate) fn catch_up(&mut self, path: &Path, to: u64, exp: &Expected) -> std::io::Result<()> {
        if to < self.len {
            *self = Self::new(exp, self.size);
        }
        let from = self.len;
        let hashers = &mut self.hashers;
        let fed = crate::digest::stream_file(path, from, Some(to), |b| hashers.update(b))?;
        self.len += fed;
        Ok(())
    }

    /// Compare the digests of the `len` bytes hashed with `exp`.
    pub(crate) fn check(self, file: &str, exp: &Expected) -> Result<(), VerifyError> {
        let (sha256, git_sha1) = self.hashers.finish();
        compare(file, exp, sha256, git_sha1)
    }
}

/// Verify a freshly downloaded file whose content was hashed while it was written: size,
/// digests from `hasher`, and the safetensors structure (header read only).
///
/// # Errors
/// The first problem found, naming `file`.
pub(crate) fn verify_streamed(
    path: &Path,
    file: &str,
    exp: &Expected,
    mut hasher: StreamHasher,
) -> Result<(), VerifyError> {
    let size = checked_size(path, file, exp)?;
    // Normally a no-op: the hasher saw every byte written.
    hasher.catch_up(path, size, exp).map_err(io_err(path))?;
    if file.ends_with(".safetensors") {
        check_safetensors(path, file)?;
    }
    hasher.check(file, exp)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st_bytes(data_len: usize) -> Vec<u8> {
        let hdr = format!(
            r#"{{"t":{{"dtype":"U8","shape":[{data_len}],"data_offsets":[0,{data_len}]}}}}"#
        );
        let mut h = hdr.into_bytes();
        while h.len() % 8 != 0 {
            h.push(b' ');
        }
        let mut out = (h.len() as u64).to_le_bytes().to_vec();
        out.extend(h);
        out.extend(std::iter::repeat_n(7u8, data_len));
        out
    }

    #[test]
    fn safetensors_truncation_is_found() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("m.safetensors");
        let b = st_bytes(100);
        std::fs::write(&p, &b).unwrap();
        check_safetensors(&p, "m.safetensors").unwrap();
        std::fs::write(&p, &b[..b.len() - 1]).unwrap();
        let e = check_safetensors(&p, "m.safetensors").unwrap_err();
        assert!(e.to_string().contains("m.safetensors"), "{e}");
        std::fs::write(&p, b"garbage!garbage!").unwrap();
        assert!(check_safetensors(&p, "m.safetensors").is_err());
    }

    #[test]
    fn streamed_digests_equal_file_digests_across_resumes() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let full = Expected {
            size: Some(data.len() as u64),
            sha256: Some(crate::digest::sha256_hex(&data)),
            git_sha1: digest_file_bytes(&data),
        };
        // Written in three goes, hashed partly while writing, partly by catching up from disk.
        std::fs::write(&p, &data[..1_000_000]).unwrap();
        let mut h = StreamHasher::new(&full, data.len() as u64);
        h.catch_up(&p, 1_000_000, &full).unwrap();
        h.update(&data[1_000_000..2_000_000]);
        std::fs::write(&p, &data[..2_500_000]).unwrap();
        h.catch_up(&p, 2_500_000, &full).unwrap();
        std::fs::write(&p, &data).unwrap();
        h.update(&data[2_500_000..]);
        verify_streamed(&p, "f", &full, h.clone()).unwrap();
        // A truncation below what was hashed restarts the digests.
        h.catch_up(&p, 10, &full).unwrap();
        assert!(verify_streamed(&p, "f", &full, h).is_ok());
        let mut bad = data.clone();
        bad[2_999_999] ^= 1;
        std::fs::write(&p, &bad).unwrap();
        let mut h = StreamHasher::new(&full, data.len() as u64);
        h.update(&bad);
        assert!(matches!(
            verify_streamed(&p, "f", &full, h),
            Err(VerifyError::Hash { .. })
        ));
    }

    fn digest_file_bytes(data: &[u8]) -> Option<String> {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x");
        std::fs::write(&p, data).unwrap();
        digest_file(&p, false, true).unwrap().git_sha1
    }

    #[test]
    fn hashes_are_checked() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, b"hello\n").unwrap();
        let good = Expected::from_etag("ce013625030ba8dba906f756967f9e9ca394464a");
        verify_file(&p, "f", &good).unwrap();
        let sha = "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03";
        verify_file(&p, "f", &Expected::from_etag(sha)).unwrap();
        std::fs::write(&p, b"hellO\n").unwrap();
        assert!(matches!(
            verify_file(&p, "f", &good),
            Err(VerifyError::Hash { .. })
        ));
        let sized = Expected {
            size: Some(5),
            ..Expected::default()
        };
        assert!(matches!(
            verify_file(&p, "f", &sized),
            Err(VerifyError::Size { .. })
        ));
    }
}
