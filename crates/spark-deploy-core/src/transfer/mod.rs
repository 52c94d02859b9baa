//! Moving exactly the required files from the head to a worker over the fabric.
//!
//! The head serves an allow-list of files over plain HTTP bound to its **fabric** address only,
//! behind a per-run random token ([`server`]); each worker pulls with `curl` through its Exec port,
//! several files in parallel, resuming `.partial` files, and verifies size and sha256 before the
//! rename ([`pull`]). A manifest of verified files on the worker makes an up-to-date re-run move
//! nothing. The token travels on the SSH session's stdin, never in argv. Several workers are fed at
//! once ([`fan_out`]). A file still being written on the head is followed by its worker as it
//! grows, so its pull finds it there whole ([`prefix`]).

/// The shell function `h` both worker scripts hash with: `openssl dgst` when the worker has it
/// (SHA extensions: ~1 GB/s here, where coreutils' `sha256sum` does ~0.2 GB/s and would cap the
/// copy), else `sha256sum`.
macro_rules! sha256_shell {
    () => {
        "if command -v openssl >/dev/null 2>&1; then h() { openssl dgst -sha256 -r \"$@\"; }; else h() { sha256sum \"$@\"; }; fi\n"
    };
}

/// The shell function `receive <stall seconds, 0 for none>` both worker scripts fetch with: it
/// appends the rest of `$url` past the `$have` bytes `$part` holds (of `$size`) and prints the
/// sha256 of the whole partial, taken in the same pass; on failure it creates `$failed` (what
/// arrived stays in the partial). When 32 MiB or more remain and the worker has `python3`, one
/// process receives, hashes and writes each block from one buffer (`receive.py`); else
/// `curl | tee | h`, whose pipes cost about twice the CPU per byte but which starts in a fraction
/// of Python's start-up, the better trade for a small file (see docs/first-deploy.md). The
/// caller sets `token`, `url`, `part`, `have`, `size` and `failed`, and defines `h`
/// ([`sha256_shell`]).
macro_rules! receive_shell {
    () => {
        concat!(
            "recv_py='",
            include_str!("receive.py"),
            r#"'
receive() {
  if [ $((size - have)) -ge 33554432 ] && command -v python3 >/dev/null 2>&1; then
    printf '%s\n' "$token" | python3 -S -c "$recv_py" "$url" "$part" "$have" "$1" || : > "$failed"
    return 0
  fi
  if [ "$1" -gt 0 ]; then set -- --speed-limit 1024 --speed-time "$1"; else set --; fi
  { [ "$have" -eq 0 ] || cat -- "$part" || : > "$failed"
    { printf 'Authorization: Bearer %s\n' "$token" | curl -fsSN "$@" -H @- -r "$have-" -o - -- "$url" || : > "$failed"; } | { tee -a -- "$part" || : > "$failed"; }
  } | h | cut -d' ' -f1
}
"#
        )
    };
}

/// Whether `text` can sit inside a shell's single quotes as it is.
const fn has_no_single_quote(text: &str) -> bool {
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\'' {
            return false;
        }
        i += 1;
    }
    true
}
const _: () = assert!(
    has_no_single_quote(include_str!("receive.py")),
    "receive.py is quoted with single quotes in receive_shell!: it must hold none"
);

pub mod fan_out;
pub mod ownership;
pub mod prefix;
pub mod pull;
pub mod server;
mod session;

use std::path::{Path, PathBuf};

use serde::Serialize;

/// One file to move.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FileJob {
    /// Source path on the head (a regular file; symlinks resolved).
    pub from: PathBuf,
    /// Destination path on the worker.
    pub to: PathBuf,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits to apply on arrival (engine binaries stay executable).
    pub mode: u32,
    /// The sha256 the worker took of its whole `<to>.partial` as it received it (the file was
    /// followed while it was written: [`prefix`]); the pull uses it instead of reading the
    /// partial again when the partial still has the file's size.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partial_sum: Option<String>,
}

/// Errors of planning a transfer on the head.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    /// A source could not be listed or read.
    #[error("cannot read {path} on the head: {source}")]
    Source {
        /// The path.
        path: PathBuf,
        /// Underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The file server could not bind.
    #[error(
        "cannot serve files on {addr}: {source} (remedy: the head's fabric address must be local; see preflight)"
    )]
    Bind {
        /// Address.
        addr: String,
        /// Underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A worker-side pull failed.
    #[error("{node}: pulling {file} failed: {detail}")]
    Pull {
        /// Worker.
        node: String,
        /// Destination file.
        file: String,
        /// What went wrong (curl's or the verifier's message).
        detail: String,
    },
}

/// Expands `from` (a file or a directory, followed through symlinks) into jobs towards `to`.
///
/// # Errors
///
/// [`TransferError::Source`] when a path cannot be read.
pub fn expand(from: &Path, to: &Path) -> Result<Vec<FileJob>, TransferError> {
    let err = |path: &Path| {
        let path = path.to_owned();
        move |source| TransferError::Source { path, source }
    };
    let meta = std::fs::metadata(from).map_err(err(from))?;
    if meta.is_file() {
        return Ok(vec![FileJob {
            from: std::fs::canonicalize(from).map_err(err(from))?,
            to: to.to_owned(),
            size: meta.len(),
            mode: std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777,
            partial_sum: None,
        }]);
    }
    let mut out = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(from)
        .map_err(err(from))?
        .collect::<Result<_, _>>()
        .map_err(err(from))?;
    entries.sort_by_key(std::fs::DirEntry::file_name);
    for e in entries {
        let name = e.file_name();
        if name.to_string_lossy().starts_with('.') {
            continue; // partial files, superseded rank files, caches
        }
        out.extend(expand(&from.join(&name), &to.join(&name))?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ports::exec::Exec;

    /// The whole mechanism on loopback with a local Exec (the testbed runs it across the fabric),
    /// through one session per stream.
    #[tokio::test]
    async fn pulls_resumes_verifies_and_skips_what_is_up_to_date() {
        the_whole_mechanism("python3").await;
    }

    /// A worker without the session's interpreter: every file goes by the pull script, with the
    /// same resume, checks and records.
    #[tokio::test]
    async fn without_python3_each_file_goes_by_the_script_with_the_same_results() {
        the_whole_mechanism("no-such-python3").await;
    }

    /// A session that ends without answering fails the transfer with the file it was given and
    /// what the receiver said; nothing lands under the final name.
    #[tokio::test]
    async fn a_session_that_dies_fails_the_file_it_held() {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("src");
        std::fs::create_dir_all(&src).unwrap();
        std::fs::write(src.join("a.bin"), vec![7u8; 100_000]).unwrap();
        let dst = d.path().join("dst");
        let jobs = expand(&src, &dst).unwrap();
        let server = server::FileServer::start("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let how = pull::Streams {
            count: 2,
            interpreter: "false",
        };
        let (manifest, cache) = (dst.join("m.tsv"), d.path().join("hashes.tsv"));
        let err = pull::transfer_with(
            &Exec::local("worker-test"),
            &server,
            &jobs,
            &manifest,
            &cache,
            how,
            &|_| {},
        )
        .await
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("a.bin") && err.contains("the receiver on the worker ended"),
            "{err}"
        );
        assert!(!dst.join("a.bin").exists());
    }

    async fn the_whole_mechanism(interpreter: &str) {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("src");
        std::fs::create_dir_all(src.join("sub")).unwrap();
        let big: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(src.join("big.bin"), &big).unwrap();
        std::fs::write(src.join("sub/small.json"), b"{\"a\":1}").unwrap();
        std::fs::write(src.join(".rank0of2.partial"), b"skip me").unwrap();
        let dst = d.path().join("dst");
        let jobs = expand(&src, &dst).unwrap();
        assert_eq!(jobs.len(), 2, "dot files are not shipped");
        // A partial from an earlier, interrupted run: the pull must continue it.
        std::fs::create_dir_all(&dst).unwrap();
        std::fs::write(dst.join("big.bin.partial"), &big[..1_000_000]).unwrap();
        let server = server::FileServer::start("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let exec = Exec::local("worker-test");
        let manifest = dst.join(".spark-deploy-received.tsv");
        let cache = d.path().join("state/hashes.tsv");
        let how = pull::Streams {
            count: 2,
            interpreter,
        };
        let seen = std::sync::Mutex::new(Vec::new());
        let progress = |p: &pull::TransferProgress<'_>| {
            if p.file_done == p.file_total {
                seen.lock().unwrap().push((p.done, p.total));
            }
        };
        let s = pull::transfer_with(&exec, &server, &jobs, &manifest, &cache, how, &progress)
            .await
            .unwrap();
        assert_eq!((s.files, s.sent, s.bytes_sent), (2, 2, 3_000_007));
        assert_eq!(std::fs::read(dst.join("big.bin")).unwrap(), big);
        assert!(!dst.join("big.bin.partial").exists());
        assert_eq!(
            seen.lock().unwrap().last().copied(),
            Some((3_000_007, 3_000_007))
        );
        // Up to date: nothing moves.
        let s = pull::transfer_with(&exec, &server, &jobs, &manifest, &cache, how, &progress)
            .await
            .unwrap();
        assert_eq!(s.sent, 0);
        // A changed destination is re-sent.
        std::fs::write(dst.join("sub/small.json"), b"{\"a\":2}").unwrap();
        let s = pull::transfer_with(&exec, &server, &jobs, &manifest, &cache, how, &progress)
            .await
            .unwrap();
        assert_eq!((s.sent, s.bytes_sent), (1, 7));
        // A damaged partial: the bytes it holds are hashed ahead of the rest of the stream, the
        // sum disagrees, the partial is removed (never renamed), and the next run sends it all.
        std::fs::remove_file(dst.join("big.bin")).unwrap();
        let mut damaged = big[..1_500_000].to_vec();
        damaged[1234] ^= 0x40;
        std::fs::write(dst.join("big.bin.partial"), &damaged).unwrap();
        let err = pull::transfer_with(&exec, &server, &jobs, &manifest, &cache, how, &progress)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("sha256"), "{err}");
        assert!(!dst.join("big.bin").exists() && !dst.join("big.bin.partial").exists());
        let s = pull::transfer_with(&exec, &server, &jobs, &manifest, &cache, how, &progress)
            .await
            .unwrap();
        assert_eq!((s.sent, s.bytes_sent), (1, 3_000_000));
        assert_eq!(std::fs::read(dst.join("big.bin")).unwrap(), big);
        assert!(
            std::fs::read_dir(&dst).unwrap().all(|e| !e
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".failed")),
            "no attempt marker is left behind"
        );
        // No token, no file.
        let url = server.allow(src.join("big.bin"));
        let code = tokio::process::Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", &url])
            .output()
            .await
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&code.stdout), "401");
    }

    /// A rank file whose sidecar records its sha256 (as the build leaves it) is not read on the
    /// head: the recorded sum is used while the file is unchanged, and the file is hashed again
    /// once it changed.
    #[tokio::test]
    async fn a_recorded_sum_spares_the_head_reading_the_file() {
        use crate::engine::tensorfold::inputs::rank_cache::content;
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("rank1of4-0123.bin");
        std::fs::write(&f, b"rank bytes").unwrap();
        // Not the bytes' sum: only a head that takes the record without reading returns it.
        let recorded = "ab".repeat(32);
        content::record_sha256(&f, &recorded).unwrap();
        let cache = d.path().join("hashes.tsv");
        let got = pull::source_hashes(vec![f.clone()], &cache).await.unwrap();
        assert_eq!(got, vec![recorded]);
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&f, b"rank bytez").unwrap();
        let got = pull::source_hashes(vec![f.clone()], &cache).await.unwrap();
        assert_eq!(got, vec![crate::digest::sha256_hex(b"rank bytez")]);
    }

    /// A transfer that ends early (here: one file fails) has already recorded the files that
    /// arrived whole, so the next run sends only the rest.
    #[tokio::test]
    async fn files_that_arrived_are_recorded_even_when_the_transfer_fails() {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("src");
        std::fs::create_dir_all(&src).unwrap();
        for (name, n) in [
            ("a.bin", 200_000u32),
            ("b.bin", 300_000),
            ("c.bin", 400_000),
        ] {
            let data: Vec<u8> = (0..n).map(|i| (i * 13 % 251) as u8).collect();
            std::fs::write(src.join(name), data).unwrap();
        }
        let dst = d.path().join("dst");
        let jobs = expand(&src, &dst).unwrap();
        let mut broken = jobs.clone();
        broken[2].size += 1; // c.bin cannot verify
        let server = server::FileServer::start("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let exec = Exec::local("worker-test");
        let manifest = d.path().join("data/.spark-deploy-received.tsv");
        let cache = d.path().join("state/hashes.tsv");
        let none = |_: &pull::TransferProgress<'_>| {};
        // One stream: a.bin and b.bin land before c.bin fails.
        let err = pull::transfer(&exec, &server, &broken, &manifest, &cache, 1, &none)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("c.bin"), "{err}");
        let recorded = std::fs::read_to_string(&manifest).unwrap();
        assert_eq!(recorded.lines().count(), 2, "{recorded}");
        let s = pull::transfer(&exec, &server, &jobs, &manifest, &cache, 1, &none)
            .await
            .unwrap();
        assert_eq!((s.files, s.sent, s.bytes_sent), (3, 1, 400_000));
        assert_eq!(
            std::fs::read(dst.join("c.bin")).unwrap(),
            std::fs::read(src.join("c.bin")).unwrap()
        );
    }

    /// `stop_transfers` resets a response in flight: the client gets what its socket already
    /// held, then an error, instead of the rest of a pull that belongs to a cancelled run; new
    /// requests are refused.
    #[tokio::test]
    async fn stopping_the_server_resets_a_pull_in_flight() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        const SIZE: usize = 64 << 20;
        let d = tempfile::tempdir().unwrap();
        let big = d.path().join("big.bin");
        std::fs::write(&big, vec![7u8; SIZE]).unwrap();
        let server = server::FileServer::start("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let url = server.allow(big.clone());
        let path = url
            .split_once(&server.addr().to_string())
            .unwrap()
            .1
            .to_owned();
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\n\r\n",
            server.addr(),
            server.token().expose()
        );
        let mut conn = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
        conn.write_all(request.as_bytes()).await.unwrap();
        // A slow reader first (the socket buffers fill up), then as fast as possible.
        let mut buf = vec![0u8; 64 << 10];
        let mut got = 0;
        for _ in 0..10 {
            got += conn.read(&mut buf).await.unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let t = std::time::Instant::now();
        server.stop_transfers();
        let rest = async {
            loop {
                match conn.read(&mut buf).await {
                    Ok(0) => break None,
                    Ok(n) => got += n,
                    Err(e) => break Some(e.kind()),
                }
            }
        };
        // Without the reset the whole file arrives and the connection then idles (keep-alive).
        let end = tokio::time::timeout(std::time::Duration::from_secs(5), rest)
            .await
            .expect("the connection neither failed nor ended within 5 s of the stop");
        assert_eq!(
            end,
            Some(std::io::ErrorKind::ConnectionReset),
            "after {got} bytes"
        );
        assert!(got < SIZE, "{got}");
        // Prompt: well inside the 5 s an idling connection would take, with room for a loaded
        // host.
        assert!(
            t.elapsed() < std::time::Duration::from_secs(3),
            "reset {:?} after the stop",
            t.elapsed()
        );
        let again = tokio::process::Command::new("curl")
            .args(["-fsS", "-o", "/dev/null", "-H"])
            .arg(format!("Authorization: Bearer {}", server.token().expose()))
            .arg(&url)
            .status()
            .await
            .unwrap();
        assert!(!again.success());
    }
}
