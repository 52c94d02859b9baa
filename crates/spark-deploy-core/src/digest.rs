//! File hashing: one streamed reader with one buffer size, and the sha256 of a file or of bytes
//! as lowercase hex. Every file the deployment hashes (Hub downloads, kit entries, files shipped
//! to the worker) goes through [`stream_file`].

use std::io::{Read as _, Seek as _, SeekFrom};
use std::path::Path;

use sha2::{Digest as _, Sha256};

/// Bytes read per call while hashing a file.
pub const READ_CHUNK: usize = 1 << 20;

/// Feed bytes `from..to` of the file at `path` to `each`, [`READ_CHUNK`] bytes at a time;
/// `to = None` reads to the end of the file. Returns the number of bytes fed. Blocking: run it on
/// a blocking thread for big files.
///
/// # Errors
/// The file cannot be opened or read, or (with `to`) it ends before `to`
/// ([`std::io::ErrorKind::UnexpectedEof`]).
pub fn stream_file(
    path: &Path,
    from: u64,
    to: Option<u64>,
    mut each: impl FnMut(&[u8]),
) -> std::io::Result<u64> {
    let mut f = crate::safe_fs::open_regular(path)?;
    if from > 0 {
        f.seek(SeekFrom::Start(from))?;
    }
    let mut buf = vec![0u8; READ_CHUNK];
    let mut fed = 0u64;
    loop {
        let want = match to {
            Some(to) => {
                let left = to.saturating_sub(from + fed);
                if left == 0 {
                    return Ok(fed);
                }
                usize::try_from(left).map_or(READ_CHUNK, |l| l.min(READ_CHUNK))
            }
            None => READ_CHUNK,
        };
        let n = f.read(&mut buf[..want])?;
        if n == 0 {
            return match to {
                Some(to) => Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("the file ends at byte {}, before byte {to}", from + fed),
                )),
                None => Ok(fed),
            };
        }
        each(&buf[..n]);
        fed += n as u64;
    }
}

/// The sha256 of a whole file, streamed, as lowercase hex.
///
/// # Errors
/// The file cannot be opened or read.
pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut h = Sha256::new();
    stream_file(path, 0, None, |b| h.update(b))?;
    Ok(hex::encode(h.finalize()))
}

/// The sha256 of `bytes` as lowercase hex.
#[must_use]
pub fn sha256_hex(bytes: impl AsRef<[u8]>) -> String {
    hex::encode(Sha256::digest(bytes.as_ref()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_hash_matches_in_memory_hash_across_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        // More than two chunks, not a multiple of the chunk size.
        let data: Vec<u8> = (0..(2 * READ_CHUNK + 12_345))
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        std::fs::write(&p, &data).unwrap();
        assert_eq!(sha256_file(&p).unwrap(), sha256_hex(&data));
        // The well-known digest of the empty input.
        std::fs::write(&p, b"").unwrap();
        assert_eq!(
            sha256_file(&p).unwrap(),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn ranges_are_fed_exactly_and_short_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let data: Vec<u8> = (0..(READ_CHUNK + 100)).map(|i| (i % 253) as u8).collect();
        std::fs::write(&p, &data).unwrap();
        let mut got = Vec::new();
        let n = stream_file(&p, 7, Some(READ_CHUNK as u64 + 50), |b| {
            got.extend_from_slice(b);
        })
        .unwrap();
        assert_eq!(n as usize, READ_CHUNK + 43);
        assert_eq!(got, data[7..READ_CHUNK + 50]);
        let e = stream_file(&p, 0, Some(data.len() as u64 + 1), |_| {}).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
        assert!(sha256_file(&dir.path().join("missing")).is_err());
    }
}
