//! The sha256 of a whole rank file, taken by the build from the very chunks it writes and recorded
//! in the sidecar together with the file's [`Stamp`] (device, inode, size, mtime, ctime), so that
//! shipping the file to a worker never reads it again on the head (for the real checkpoint that is
//! about 106 GB a rank: minutes of reading and hashing saved on every fresh deployment).
//!
//! The build's copy threads finish their chunks out of order; sha256 needs the bytes in order.
//! [`InOrderSha256`] keeps a bounded reorder buffer: a thread whose chunk is next hands it (and
//! every buffered successor) to one hashing thread; a thread that is ahead buffers a copy of its
//! chunk; a thread more than `window` chunks ahead waits. Extra memory is bounded by
//! `window + 3` chunks, whatever the order the chunks complete in.
//!
//! The recorded sum is trusted only while the file's stamp is the one recorded: any write (even
//! with the mtime set back), a rename, a link or a copy elsewhere changes it, and the head then
//! hashes the file as it does any other. The worker checks the sum of what it receives in any case.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{SyncSender, sync_channel};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::Duration;

use serde_json::Value;
use sha2::{Digest as _, Sha256};

use super::stamp::Stamp;

/// The sidecar key holding the file's sha256 and the stamp it was taken at.
pub const SIDECAR_KEY: &str = "file_sha256";

/// The sidecar value recording `sha256` for a file whose metadata is `meta`:
/// `{"sha256": "<64 hex>", "stamp": "<dev ino size mtime_ns ctime_ns>"}`.
#[must_use]
pub fn to_json(sha256: &str, meta: &std::fs::Metadata) -> Value {
    serde_json::json!({
        "sha256": sha256,
        "stamp": Stamp::of(meta).line().trim_end(),
    })
}

/// The sha256 recorded for `file` in its sidecar, if the sidecar records one and the file's
/// stamp is still the recorded one (else `None`: hash the file).
#[must_use]
pub fn recorded_sha256(file: &Path) -> Option<String> {
    let side = super::read_sidecar(file)?;
    let v = side.get(SIDECAR_KEY)?;
    let sha = v.get("sha256")?.as_str()?;
    let recorded = Stamp::parse(v.get("stamp")?.as_str()?)?;
    let well_formed = sha.len() == 64
        && sha
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    let now = Stamp::of(&crate::safe_fs::open_regular(file).ok()?.metadata().ok()?);
    (well_formed && now == recorded).then(|| sha.to_owned())
}

/// Records `sha256` as the content of `file` (stamped now) in its sidecar, keeping what the
/// sidecar already holds; for a file written whole by other means than [`super::build_rank_cache`]
/// (which records it itself), whose writer hashed the bytes as it wrote them.
///
/// # Errors
///
/// The I/O error of reading `file`'s metadata or writing the sidecar (through a fresh partial
/// file, renamed).
pub fn record_sha256(file: &Path, sha256: &str) -> std::io::Result<()> {
    let meta = crate::safe_fs::open_regular(file)?.metadata()?;
    let mut side = super::read_sidecar(file)
        .filter(Value::is_object)
        .unwrap_or_else(|| serde_json::json!({}));
    side[SIDECAR_KEY] = to_json(sha256, &meta);
    let path = super::sidecar_path(file);
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = path.with_file_name(format!(".{name}.{}.partial", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    crate::safe_fs::write_atomic(&tmp, &path, side.to_string().as_bytes(), 0o644)
}

struct Frontier {
    /// The index of the next chunk to hash.
    next: u64,
    /// Copies of chunks that completed ahead of `next`.
    pending: BTreeMap<u64, Vec<u8>>,
    /// To the hashing thread; `None` once it is gone (then no sum is recorded).
    tx: Option<SyncSender<Vec<u8>>>,
}

/// A sha256 fed chunk by chunk in any order, hashed in order on a thread of its own.
pub(super) struct InOrderSha256 {
    frontier: Mutex<Frontier>,
    moved: Condvar,
    window: u64,
    hasher: Option<std::thread::JoinHandle<String>>,
}

impl InOrderSha256 {
    /// A hasher whose callers may run at most `window` chunks ahead of the next one to hash.
    /// `None` when no thread can be started (then the build records no sum).
    pub(super) fn start(window: usize) -> Option<Self> {
        let (tx, rx) = sync_channel::<Vec<u8>>(2);
        let hasher = std::thread::Builder::new()
            .name("rank-file-sha256".into())
            .spawn(move || {
                let mut h = Sha256::new();
                for chunk in rx {
                    h.update(&chunk);
                }
                hex::encode(h.finalize())
            })
            .ok()?;
        Some(Self {
            frontier: Mutex::new(Frontier {
                next: 0,
                pending: BTreeMap::new(),
                tx: Some(tx),
            }),
            moved: Condvar::new(),
            window: window.max(1) as u64,
            hasher: Some(hasher),
        })
    }

    /// Feeds chunk `index` (chunks are numbered from 0, each fed once). Waits while `index` is
    /// `window` or more ahead of the next chunk to hash; returns `false` without feeding when
    /// `stop` is set meanwhile (the build failed elsewhere, so the next chunk may never come).
    pub(super) fn feed(&self, index: u64, bytes: &[u8], stop: &AtomicBool) -> bool {
        let mut f = self.frontier.lock().unwrap_or_else(PoisonError::into_inner);
        while index >= f.next + self.window {
            if stop.load(Ordering::Relaxed) {
                return false;
            }
            f = self
                .moved
                .wait_timeout(f, Duration::from_millis(50))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        if index != f.next {
            f.pending.insert(index, bytes.to_vec());
            return true;
        }
        let mut chunk = bytes.to_vec();
        loop {
            // Sent under the lock, so chunks reach the hasher in order; the channel is short, so
            // a hasher slower than the writers holds them back instead of buffering.
            if let Some(tx) = &f.tx
                && tx.send(chunk).is_err()
            {
                f.tx = None;
            }
            f.next += 1;
            let next = f.next;
            match f.pending.remove(&next) {
                Some(c) => chunk = c,
                None => break,
            }
        }
        self.moved.notify_all();
        true
    }

    /// Feeds `tail` after every chunk (which must all have been fed) and returns the sum; `None`
    /// when chunks are missing or the hashing thread failed.
    pub(super) fn finish(mut self, tail: &[u8]) -> Option<String> {
        let tx = {
            let mut f = self.frontier.lock().unwrap_or_else(PoisonError::into_inner);
            if !f.pending.is_empty() {
                f.tx = None;
            }
            f.tx.take()
        };
        let whole = tx.is_some_and(|tx| tx.send(tail.to_vec()).is_ok());
        let sum = self.hasher.take()?.join().ok()?;
        whole.then_some(sum)
    }
}

impl Drop for InOrderSha256 {
    fn drop(&mut self) {
        // An abandoned build: close the channel so the hashing thread ends.
        self.frontier
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .tx = None;
        if let Some(h) = self.hasher.take() {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Chunks fed from several threads in a scrambled order, some far ahead of the others, hash
    /// to the sum of the bytes in order.
    #[test]
    fn chunks_out_of_order_hash_in_order() {
        let data: Vec<u8> = (0..1_000_003u32).map(|i| (i * 31 % 253) as u8).collect();
        let chunk = 4096;
        let n = data.len().div_ceil(chunk) as u64;
        let h = InOrderSha256::start(3).unwrap();
        let stop = AtomicBool::new(false);
        let next = std::sync::atomic::AtomicU64::new(0);
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let (h, stop, next, data) = (&h, &stop, &next, &data);
                s.spawn(move || {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= n {
                            return;
                        }
                        if (i + t) % 5 == 0 {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        let a = i as usize * chunk;
                        let b = (a + chunk).min(data.len() - 10);
                        assert!(h.feed(i, &data[a..b.max(a)], stop));
                    }
                });
            }
        });
        let sum = h.finish(&data[data.len() - 10..]).unwrap();
        assert_eq!(sum, hex::encode(Sha256::digest(&data)));
    }

    /// A chunk that never comes: the threads ahead stop waiting once `stop` is set, and no sum is
    /// given for the incomplete stream.
    #[test]
    fn a_missing_chunk_stops_the_waiters_and_gives_no_sum() {
        let h = InOrderSha256::start(2).unwrap();
        let stop = AtomicBool::new(false);
        assert!(h.feed(1, b"b", &stop));
        std::thread::scope(|s| {
            let w = s.spawn(|| h.feed(5, b"f", &stop));
            std::thread::sleep(Duration::from_millis(100));
            stop.store(true, Ordering::Relaxed);
            assert!(!w.join().unwrap());
        });
        assert_eq!(h.finish(b""), None);
    }

    #[test]
    fn a_recorded_sum_holds_only_while_the_file_is_unchanged() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("rank1of4-abc.bin");
        std::fs::write(&f, b"0123456789").unwrap();
        assert_eq!(recorded_sha256(&f), None, "no sidecar");
        std::fs::write(super::super::sidecar_path(&f), r#"{"rank": 1}"#).unwrap();
        let sum = hex::encode(Sha256::digest(b"0123456789"));
        record_sha256(&f, &sum).unwrap();
        assert_eq!(recorded_sha256(&f).as_deref(), Some(sum.as_str()));
        let side = super::super::read_sidecar(&f).unwrap();
        assert_eq!(side["rank"], 1, "what the sidecar held is kept: {side}");
        // Rewritten with the same length and its mtime set back: the ctime moved.
        let mtime = std::fs::metadata(&f).unwrap().modified().unwrap();
        std::thread::sleep(Duration::from_millis(20));
        std::fs::write(&f, b"0123456788").unwrap();
        std::fs::File::options()
            .write(true)
            .open(&f)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
        assert_eq!(recorded_sha256(&f), None);
        // A malformed record counts as none.
        std::fs::write(
            super::super::sidecar_path(&f),
            r#"{"file_sha256": {"sha256": "xyz", "stamp": "1 2 3 4 5"}}"#,
        )
        .unwrap();
        assert_eq!(recorded_sha256(&f), None);
    }
}
