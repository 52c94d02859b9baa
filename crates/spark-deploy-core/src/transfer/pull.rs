//! The worker side: pull, resume, verify, record — driven through the worker's Exec port.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use futures::StreamExt as _;

use super::server::FileServer;
use super::session::{Lane, Pulled, Queue, Shared};
use super::{FileJob, TransferError};
use crate::ports::exec::{Cmd, Exec};

/// The script each pull runs on the worker. Reads the token from stdin (never argv), resumes a
/// `.partial`, checks size and sha256, renames, records the file in the manifest (so a run that
/// ends early never sends it again) and prints the final mtime.
///
/// One pass over the bytes: each block received is hashed and appended to the partial at once (a
/// resumed partial's prefix is read once, ahead of the stream: `receive_shell!`), so the file is
/// never read back after it was written. A stream that moves nothing for 30 s fails the attempt. A partial that already has the file's size is not read at all
/// when the caller passes the sum the worker took of it as it arrived (`$7`, `<size>:<sha256>`,
/// from following the file: see [`super::prefix`]); a partial whose sum is not the file's is sent
/// again. A failed attempt (the stream, the prefix or the
/// write: marked by a `.failed` file beside the destination, since `sh` has no pipefail) that moved
/// bytes resumes from what landed, up to 4 attempts; one that moved none (the server gone) fails at
/// once. Hashing: see `sha256_shell!`.
const PULL: &str = concat!(
    "set -u\n",
    sha256_shell!(),
    receive_shell!(),
    r#"IFS= read -r token
url="$1"; dest="$2"; size="$3"; sha="$4"; mode="$5"; manifest="$6"; part="$dest.partial"; failed="$dest.failed"
mkdir -p -- "$(dirname -- "$dest")" "$(dirname -- "$manifest")" || exit 10
have=0; [ -f "$part" ] && have=$(stat -c %s -- "$part")
if [ "$have" -gt "$size" ]; then rm -f -- "$part"; have=0; fi
sum=; tries=0; claim="${7:-}"
if [ -n "$claim" ] && [ "$have" = "$size" ] && [ "${claim%%:*}" = "$have" ]; then
  if [ "${claim#*:}" = "$sha" ]; then sum=$sha; else rm -f -- "$part"; have=0; fi
fi
while [ "$have" -lt "$size" ]; do
  tries=$((tries + 1)); rm -f -- "$failed"
  sum=$(receive 30)
  [ -f "$part" ] || : > "$part"
  before=$have; have=$(stat -c %s -- "$part")
  [ -e "$failed" ] || break
  rm -f -- "$failed"; sum=
  [ "$have" -gt "$before" ] && [ "$tries" -lt 4 ] || exit 11
  sleep 1
done
[ -f "$part" ] || : > "$part"
got=$(stat -c %s -- "$part")
[ "$got" = "$size" ] || { echo "size $got, expected $size" >&2; exit 12; }
[ -n "$sum" ] || sum=$(h "$part" | cut -d' ' -f1)
[ "$sum" = "$sha" ] || { rm -f -- "$part"; echo "sha256 $sum, expected $sha (partial removed)" >&2; exit 13; }
chmod "$mode" -- "$part" && mv -f -- "$part" "$dest" || exit 14
mtime=$(stat -c %.9Y -- "$dest") || exit 14
printf '%s\t%s\t%s\t%s\n' "$dest" "$size" "$mtime" "$sha" >> "$manifest" || exit 14
echo "$mtime""#
);

/// Prints `<size> <mtime> <path>` for every existing argument.
const STAT: &str =
    r#"for f in "$@"; do [ -f "$f" ] && [ ! -L "$f" ] && stat -c '%s %.9Y %n' -- "$f"; done; true"#;

/// What a transfer did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct TransferStats {
    /// Files considered.
    pub files: usize,
    /// Files sent (missing, partial or different on the worker).
    pub sent: usize,
    /// Bytes of the files sent.
    pub bytes_sent: u64,
}

/// The sha256 a path's name claims when it is an HF cache blob (`.../blobs/<64 hex>`).
fn lfs_blob_name(path: &Path) -> Option<String> {
    let name = path.file_name()?.to_str()?;
    let in_blobs = path.parent()?.file_name()? == "blobs";
    (in_blobs
        && name.len() == 64
        && name
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
    .then(|| name.to_owned())
}

/// sha256 of a head file: the name of an HF cache blob, the sum a rank file's sidecar records,
/// else read and cached by (path, size, mtime) in `cache` so re-runs do not re-hash.
fn head_sha(path: &Path, cache: &mut HashMap<String, String>) -> Result<String, TransferError> {
    let err = |source| TransferError::Source {
        path: path.to_owned(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(err)?;
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    // An HF cache blob is named by its sha256 (the Hub's LFS oid, verified at fetch): no need
    // to read it; the worker's check on arrival still catches a blob damaged since.
    if let Some(name) = lfs_blob_name(path) {
        return Ok(name);
    }
    // A rank file records its own sha256 in its sidecar, taken by the build from the bytes it
    // wrote and valid while the file's stamp (inode, size, mtime, ctime) is the recorded one: the
    // head never reads a rank file again to ship it.
    if let Some(sum) = crate::engine::tensorfold::inputs::rank_cache::content::recorded_sha256(path)
    {
        return Ok(sum);
    }
    let key = format!("{}\t{}\t{mtime}", path.display(), meta.len());
    if let Some(s) = cache.get(&key) {
        return Ok(s.clone());
    }
    let s = crate::digest::sha256_file(path).map_err(err)?;
    cache.insert(key, s.clone());
    Ok(s)
}

fn load_cache(path: &Path) -> HashMap<String, String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            l.rsplit_once('\t')
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
        })
        .collect()
}

fn save_cache(path: &Path, cache: &HashMap<String, String>) {
    let text: String = cache.iter().map(|(k, v)| format!("{k}\t{v}\n")).collect();
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    // Transfers to several workers run at once: each writes its own partial file (created
    // exclusively, never through a planted link), and the last rename wins with a complete cache.
    static WRITER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = WRITER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = path.with_extension(format!("{}.{n}.partial", std::process::id()));
    if crate::safe_fs::write_exclusive(&tmp, text).is_ok() {
        let _ = std::fs::rename(&tmp, path);
    }
}

/// Where a transfer stands: the bytes of the files to send (done and in all), and the file that
/// moved with its own bytes.
#[derive(Debug, Clone, Copy)]
pub struct TransferProgress<'a> {
    /// Bytes of every file to send that arrived (files that landed, and the parts of those in
    /// flight that the head has sent).
    pub done: u64,
    /// Bytes of every file to send.
    pub total: u64,
    /// The file that moved (its destination).
    pub file: &'a Path,
    /// That file's bytes on their way or landed (a resumed pull starts at its partial's size).
    pub file_done: u64,
    /// Its size.
    pub file_total: u64,
}

/// The sha256 of every head file in `sources`, in order, from `hash_cache` (by path, size and
/// mtime) or read now and recorded there; computed off the async threads. Warming the cache once
/// for the files several transfers share spares each of them the reading.
///
/// # Errors
///
/// [`TransferError::Source`] naming a file that cannot be read.
pub async fn source_hashes(
    sources: Vec<PathBuf>,
    hash_cache: &Path,
) -> Result<Vec<String>, TransferError> {
    let cache_path = hash_cache.to_owned();
    tokio::task::spawn_blocking(move || {
        let mut cache = load_cache(&cache_path);
        let r: Result<Vec<String>, TransferError> =
            sources.iter().map(|p| head_sha(p, &mut cache)).collect();
        save_cache(&cache_path, &cache);
        r
    })
    .await
    .map_err(|e| TransferError::Source {
        path: hash_cache.to_owned(),
        source: std::io::Error::other(e),
    })?
}

/// How often files in flight are reported.
const IN_FLIGHT_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

/// Moves `jobs` to the worker behind `exec`, pulling from `server` with `streams` parallel pulls.
/// `manifest` (on the worker) records verified files as `path\tsize\tmtime\tsha256` (each pull
/// appends its line as its file lands; the end of the transfer rewrites it compacted); `hash_cache`
/// (on the head) remembers source hashes. `progress` is called as each file lands, and every
/// half second for each file in flight.
///
/// # Errors
///
/// [`TransferError`] naming the file and the node.
pub async fn transfer(
    exec: &Exec,
    server: &FileServer,
    jobs: &[FileJob],
    manifest: &Path,
    hash_cache: &Path,
    streams: usize,
    progress: &(dyn Fn(&TransferProgress<'_>) + Send + Sync),
) -> Result<TransferStats, TransferError> {
    let how = Streams {
        count: streams,
        interpreter: "python3",
    };
    transfer_with(exec, server, jobs, manifest, hash_cache, how, progress).await
}

/// How a transfer's streams run: how many, and the interpreter of their sessions on the worker.
#[derive(Debug, Clone, Copy)]
pub(super) struct Streams<'s> {
    /// Parallel pulls.
    pub(super) count: usize,
    /// The program that runs `receive.py --session` on the worker.
    pub(super) interpreter: &'s str,
}

/// [`transfer`], with the sessions' interpreter named (a test names one the worker lacks).
pub(super) async fn transfer_with(
    exec: &Exec,
    server: &FileServer,
    jobs: &[FileJob],
    manifest: &Path,
    hash_cache: &Path,
    Streams {
        count: streams,
        interpreter,
    }: Streams<'_>,
    progress: &(dyn Fn(&TransferProgress<'_>) + Send + Sync),
) -> Result<TransferStats, TransferError> {
    let node = exec.node().to_owned();
    let pull_err = |file: &Path, detail: String| TransferError::Pull {
        node: node.clone(),
        file: file.display().to_string(),
        detail,
    };
    // Head hashes (cached), computed off the async threads.
    let hashes = source_hashes(jobs.iter().map(|j| j.from.clone()).collect(), hash_cache).await?;
    // What the worker already holds, verified (pulls append, so a later line for a path wins).
    let recorded: HashMap<String, (u64, String, String)> = match exec.read_file(manifest).await {
        Ok(b) => String::from_utf8_lossy(&b)
            .lines()
            .filter_map(|l| {
                let v: Vec<&str> = l.split('\t').collect();
                (v.len() == 4).then(|| {
                    (
                        v[0].to_owned(),
                        (v[1].parse().unwrap_or(0), v[2].to_owned(), v[3].to_owned()),
                    )
                })
            })
            .collect(),
        Err(_) => HashMap::new(),
    };
    let stat_out = exec
        .run(
            &Cmd::shell(STAT)
                .arg("sh")
                .args(jobs.iter().map(|j| j.to.display().to_string())),
        )
        .await
        .map_err(|e| pull_err(manifest, e.to_string()))?;
    let present: HashMap<String, (u64, String)> = String::from_utf8_lossy(&stat_out.stdout)
        .lines()
        .filter_map(|l| {
            let mut w = l.splitn(3, ' ');
            let (s, m, p) = (w.next()?.parse().ok()?, w.next()?.to_owned(), w.next()?);
            Some((p.to_owned(), (s, m)))
        })
        .collect();
    let mut entries: HashMap<String, (u64, String, String)> = HashMap::new();
    let mut todo = Vec::new();
    for (j, sha) in jobs.iter().zip(&hashes) {
        let dest = j.to.display().to_string();
        let up_to_date = match (present.get(&dest), recorded.get(&dest)) {
            (Some((size, mtime)), Some((rs, rm, rsha))) => {
                *size == j.size && size == rs && mtime == rm && rsha == sha
            }
            _ => false,
        };
        if up_to_date {
            entries.insert(dest, recorded[&j.to.display().to_string()].clone());
        } else {
            todo.push((j, sha.clone()));
        }
    }
    let total: u64 = todo.iter().map(|(j, _)| j.size).sum();
    let mut stats = TransferStats {
        files: jobs.len(),
        sent: 0,
        bytes_sent: 0,
    };
    let urls: Vec<String> = todo
        .iter()
        .map(|(j, _)| server.allow(j.from.clone()))
        .collect();
    let shared = Shared {
        exec,
        queue: Queue::new(todo.iter().zip(urls).map(|((j, sha), url)| (*j, sha, url))),
        token_line: format!("{}\n", server.token().expose()),
        manifest: manifest.display().to_string(),
        interpreter,
        script: PULL,
    };
    let lanes = (0..streams.clamp(1, todo.len().max(1))).map(|_| {
        futures::stream::unfold(Lane::new(&shared), |mut lane| async move {
            lane.next().await.map(|item| (item, lane))
        })
        .boxed()
    });
    let mut results = futures::stream::select_all(lanes);
    let mut done = 0u64;
    let by_source: HashMap<&Path, &FileJob> =
        todo.iter().map(|(j, _)| (j.from.as_path(), *j)).collect();
    let mut landed: std::collections::HashSet<&Path> = std::collections::HashSet::new();
    let mut tick = tokio::time::interval(IN_FLIGHT_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let next = tokio::select! {
            n = results.next() => n,
            _ = tick.tick() => {
                let moving: Vec<(&FileJob, u64)> = server
                    .positions()
                    .into_iter()
                    .filter_map(|(from, at)| {
                        let j = *by_source.get(from.as_path())?;
                        (!landed.contains(j.from.as_path())).then_some((j, at.min(j.size)))
                    })
                    .collect();
                let in_flight: u64 = moving.iter().map(|(_, at)| at).sum();
                for (j, at) in moving {
                    progress(&TransferProgress {
                        done: done + in_flight,
                        total,
                        file: &j.to,
                        file_done: at,
                        file_total: j.size,
                    });
                }
                continue;
            }
        };
        let Some(((j, sha, _), out)) = next else {
            break;
        };
        let mtime = match out.map_err(|e| pull_err(&j.to, e.to_string()))? {
            Pulled::Landed(mtime) => mtime,
            Pulled::Failed(detail) => return Err(pull_err(&j.to, detail)),
        };
        entries.insert(j.to.display().to_string(), (j.size, mtime, sha.clone()));
        done += j.size;
        stats.sent += 1;
        stats.bytes_sent += j.size;
        landed.insert(j.from.as_path());
        progress(&TransferProgress {
            done,
            total,
            file: &j.to,
            file_done: j.size,
            file_total: j.size,
        });
    }
    drop(results);
    let mut text: Vec<String> = recorded
        .iter()
        .filter(|(k, _)| !entries.contains_key(*k))
        .chain(entries.iter())
        .map(|(p, (s, m, h))| format!("{p}\t{s}\t{m}\t{h}"))
        .collect();
    text.sort();
    exec.write_file(manifest, (text.join("\n") + "\n").as_bytes())
        .await
        .map_err(|e| pull_err(manifest, e.to_string()))?;
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tools every worker script uses, besides the receivers (`curl`, `python3`).
    const TOOLS: &[&str] = &[
        "cat", "chmod", "cut", "dirname", "mkdir", "mv", "openssl", "rm", "sleep", "stat", "tee",
    ];

    /// A `PATH` of one directory holding [`TOOLS`] and `extra` (found on this machine's `PATH`;
    /// `python3` as the interpreter itself, not a version manager's shim that needs more tools).
    fn worker_path(dir: &Path, extra: &[&str]) -> std::ffi::OsString {
        std::fs::create_dir_all(dir).unwrap();
        for tool in TOOLS.iter().chain(extra) {
            let found = if *tool == "python3" {
                let out = std::process::Command::new("python3")
                    .args(["-c", "import sys; print(sys.executable)"])
                    .output()
                    .expect("python3 is needed on this machine for the test");
                PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
            } else {
                std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
                    .map(|d| d.join(tool))
                    .find(|p| p.is_file())
                    .unwrap_or_else(|| panic!("{tool} is needed on this machine for the test"))
            };
            std::os::unix::fs::symlink(found, dir.join(tool)).unwrap();
        }
        dir.as_os_str().to_owned()
    }

    /// Runs the pull script for `file` towards `dest` with `path` as the worker's `PATH`.
    async fn pull_with_path(
        path: &std::ffi::OsStr,
        server: &FileServer,
        file: &Path,
        dest: &Path,
    ) -> std::process::Output {
        use tokio::io::AsyncWriteExt as _;
        let size = std::fs::metadata(file).unwrap().len();
        let sha = crate::digest::sha256_file(file).unwrap();
        let manifest = dest.with_file_name("manifest.tsv");
        let mut child = tokio::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(PULL)
            .arg("sh")
            .arg(server.allow(file.to_owned()))
            .arg(dest)
            .arg(size.to_string())
            .arg(sha)
            .arg("644")
            .arg(manifest)
            .env("PATH", path)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        stdin
            .write_all(format!("{}\n", server.token().expose()).as_bytes())
            .await
            .unwrap();
        drop(stdin);
        child.wait_with_output().await.unwrap()
    }

    /// A file of `len` bytes (a pattern no block repeats at a power-of-two stride).
    fn pattern(len: u32) -> Vec<u8> {
        (0..len).map(|i| (i * 11 % 253) as u8).collect()
    }

    /// Resumes `dest`'s partial (its first `had` bytes of `file`) with `path`: the whole file
    /// arrives and only the rest is sent; then a damaged partial is refused and removed.
    async fn resumes_and_refuses_a_damaged_partial(
        path: &std::ffi::OsStr,
        server: &FileServer,
        file: &Path,
        dest: &Path,
        had: usize,
    ) {
        let data = std::fs::read(file).unwrap();
        let partial = dest.with_file_name("big.bin.partial");
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::write(&partial, &data[..had]).unwrap();
        let out = pull_with_path(path, server, file, dest).await;
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            std::fs::read(dest).unwrap() == data,
            "the file arrived whole"
        );
        assert_eq!(
            server.bytes_served(),
            (data.len() - had) as u64,
            "only the rest was sent"
        );
        // A damaged partial: its bytes are hashed ahead of the stream, the sum disagrees, and
        // the partial goes.
        std::fs::remove_file(dest).unwrap();
        let mut damaged = data[..had].to_vec();
        damaged[4321] ^= 0x01;
        std::fs::write(&partial, &damaged).unwrap();
        let out = pull_with_path(path, server, file, dest).await;
        assert_eq!(
            out.status.code(),
            Some(13),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("sha256"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!dest.exists() && !partial.exists());
    }

    /// With 32 MiB or more to receive, the worker's `python3` receives (here the worker has no
    /// `curl`, so nothing else could): resume, one-pass sum and refusal as with `curl`. A small
    /// file is left to `curl` (without it, that pull fails).
    #[tokio::test]
    async fn python3_receives_a_large_file_and_curl_a_small_one() {
        let d = tempfile::tempdir().unwrap();
        let path = worker_path(&d.path().join("bin"), &["python3"]);
        let server = FileServer::start("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        // Neither the partial's end nor the file's is on a 4 KiB boundary: the receiver reads the
        // partial's last unaligned bytes back and writes its last bytes through the page cache.
        let big = d.path().join("big.bin");
        std::fs::write(&big, pattern((40 << 20) + 777)).unwrap();
        let dest = d.path().join("dst/big.bin");
        resumes_and_refuses_a_damaged_partial(&path, &server, &big, &dest, (4 << 20) + 1234).await;
        let small = d.path().join("small.bin");
        std::fs::write(&small, pattern(3_000_000)).unwrap();
        let out = pull_with_path(&path, &server, &small, &d.path().join("dst/small.bin")).await;
        assert!(!out.status.success());
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("curl"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A stream that breaks off, at its end (the head closed) or by a stall past the limit:
    /// `receive.py` writes the block it held before it exits, so the partial holds every byte
    /// that arrived (no more), and it says why it stopped.
    #[tokio::test]
    async fn a_broken_stream_leaves_every_byte_that_arrived_in_the_partial() {
        for stall in [false, true] {
            let d = tempfile::tempdir().unwrap();
            let data = pattern(20 << 20);
            let (had, sent) = (3 * 4096 + 10, (9 << 20) + 333);
            let partial = d.path().join("big.bin.partial");
            std::fs::write(&partial, &data[..had]).unwrap();
            let (out, req) = receive_from_a_test_head("", &partial, &data, had, sent, stall).await;
            assert!(req.contains(&format!("bytes={had}-")), "{req}");
            assert!(!out.status.success());
            let err = String::from_utf8_lossy(&out.stderr);
            let why = if stall {
                "timed out".to_owned()
            } else {
                format!("ended after {sent} of {} bytes", data.len() - had)
            };
            assert!(err.contains(&why), "{err}");
            let kept = std::fs::read(&partial).unwrap();
            assert_eq!(kept.len(), had + sent, "stall {stall}: {err}");
            assert!(
                kept == data[..had + sent],
                "the partial holds exactly what arrived"
            );
        }
    }

    /// Python run ahead of `receive.py`: counts the writes made through a descriptor opened with
    /// `O_DIRECT` and, with `refuse` set to `"open"` or `"write"`, answers `EINVAL` there, as a
    /// file system without direct I/O does. The count goes to stderr at exit.
    fn direct_io_prelude(refuse: &str) -> String {
        format!(
            r#"import atexit, os, sys
_open, _pwrite, _direct, _count = os.open, os.pwrite, set(), [0]
def _open_(path, flags, mode=0o777, **kw):
    if flags & os.O_DIRECT and "{refuse}" == "open":
        raise OSError(22, "Invalid argument")
    fd = _open(path, flags, mode, **kw)
    if flags & os.O_DIRECT:
        _direct.add(fd)
    return fd
def _pwrite_(fd, data, at):
    if fd in _direct:
        if "{refuse}" == "write":
            raise OSError(22, "Invalid argument")
        _count[0] += 1
    return _pwrite(fd, data, at)
os.open, os.pwrite = _open_, _pwrite_
atexit.register(lambda: sys.stderr.write("direct writes: %d\n" % _count[0]))
"#
        )
    }

    /// The receiver writes whole blocks with `O_DIRECT` where the file system takes it (this
    /// machine's), and where it is refused, at open or at the first write, every byte goes
    /// through the page cache instead: the same file and the same sum either way.
    #[tokio::test]
    async fn blocks_go_past_the_page_cache_and_a_refusal_of_o_direct_costs_nothing_but_that() {
        for refuse in ["", "open", "write"] {
            let d = tempfile::tempdir().unwrap();
            let data = pattern((12 << 20) + 99);
            let src = d.path().join("src.bin");
            std::fs::write(&src, &data).unwrap();
            let had = 5000;
            let partial = d.path().join("big.bin.partial");
            std::fs::write(&partial, &data[..had]).unwrap();
            let prelude = direct_io_prelude(refuse);
            let (out, _) =
                receive_from_a_test_head(&prelude, &partial, &data, had, data.len() - had, false)
                    .await;
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "refuse {refuse:?}: {err}");
            assert_eq!(
                String::from_utf8_lossy(&out.stdout).trim(),
                crate::digest::sha256_file(&src).unwrap(),
                "refuse {refuse:?}"
            );
            assert!(
                std::fs::read(&partial).unwrap() == data,
                "refuse {refuse:?}"
            );
            let direct = if refuse.is_empty() {
                "direct writes: 3"
            } else {
                "direct writes: 0"
            };
            assert!(err.contains(direct), "refuse {refuse:?}: {err}");
        }
    }

    /// Runs `prelude` then `receive.py` for `partial` (holding `data`'s first `had` bytes)
    /// against a test head that answers 206 for the rest, sends `sent` bytes of it, then closes
    /// or (`stall`) goes silent past the receiver's 1 s limit. Returns the receiver's output and
    /// the request it sent.
    async fn receive_from_a_test_head(
        prelude: &str,
        partial: &Path,
        data: &[u8],
        had: usize,
        sent: usize,
        stall: bool,
    ) -> (std::process::Output, String) {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let body = data[had..had + sent].to_vec();
        let total = data.len() - had;
        let head = tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.unwrap();
            let mut req = vec![0u8; 4096];
            let n = sock.read(&mut req).await.unwrap();
            let req = String::from_utf8_lossy(&req[..n]).into_owned();
            let reply = format!("HTTP/1.1 206 Partial Content\r\nContent-Length: {total}\r\n\r\n");
            sock.write_all(reply.as_bytes()).await.unwrap();
            sock.write_all(&body).await.unwrap();
            if stall {
                // Silent until the receiver gives up and closes.
                let _ = sock.read(&mut [0u8; 1]).await;
            }
            req
        });
        let receive = Cmd::new("python3")
            .arg("-c")
            .arg(format!("{prelude}{}", include_str!("receive.py")))
            .arg(format!("http://127.0.0.1:{port}/f/x"))
            .arg(partial.display().to_string())
            .arg(had.to_string())
            .arg("1")
            .stdin(b"tok\n".to_vec());
        let out = Exec::local("worker").output(&receive).await.unwrap();
        (out, head.await.unwrap())
    }

    /// Without `python3` the worker receives a large file with `curl | tee | openssl`: the same
    /// resume from a partial, the same one-pass sum, and a damaged partial is refused and removed
    /// the same way.
    #[tokio::test]
    async fn a_worker_without_python3_receives_with_curl_and_the_same_checks() {
        let d = tempfile::tempdir().unwrap();
        let path = worker_path(&d.path().join("bin"), &["curl"]);
        let server = FileServer::start("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let big = d.path().join("big.bin");
        std::fs::write(&big, pattern(40 << 20)).unwrap();
        let dest = d.path().join("dst/big.bin");
        resumes_and_refuses_a_damaged_partial(&path, &server, &big, &dest, 4 << 20).await;
    }
}
