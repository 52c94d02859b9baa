//! Following a file that is still being written on the head.
//!
//! A rank file built while the checkpoint arrives is final from its first byte up to a frontier
//! that grows as shards land (see the rank-cache build). Its worker need not wait for the whole
//! file: [`follow`] has the worker request the rest of the file past what its
//! `<dest>.partial` holds, in one request, and the head's server ([`allow_growing`]) sends each
//! byte the moment it is final, so the copy keeps pace with the build. On the worker the bytes go
//! into the partial and into the hash at once, as a pull's do (`receive_shell!`): when the file is
//! complete, the worker holds it whole and knows its sha256 without reading it again. The file's
//! own pull then finds the partial complete and takes that sum ([`FileJob::partial_sum`]) instead
//! of reading the file back, and checks it against the head's sum as always: a follow that went
//! wrong is caught there and the file sent again. A follow that breaks off leaves a partial that
//! the pull resumes, exactly what an interrupted pull leaves.
//!
//! [`FileJob::partial_sum`]: super::FileJob::partial_sum
//! [`allow_growing`]: super::server::FileServer::allow_growing

use std::path::PathBuf;

use super::TransferError;
use crate::ports::exec::{Cmd, Exec};
use crate::secret::Secret;

/// A file still being written on the head whose first `ready` bytes are final.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrowingFile {
    /// The partial file on the head.
    pub from: PathBuf,
    /// Its final path on the worker (the bytes go to `<to>.partial`).
    pub to: PathBuf,
    /// The file's final size.
    pub size: u64,
    /// Bytes from the start that are final and will not change.
    pub ready: u64,
}

/// Receives the rest of the served file past what `<dest>.partial` holds, hashing the whole
/// partial as it goes (its start read once, ahead of the stream); prints `<had> <size> <sha256>`.
/// The token comes on stdin. Prints nothing when the file is final on the worker already (its
/// pull and manifest decide about it). No stall limit: the stream waits while the file grows; each
/// block is written as it arrives: what arrived is in the partial.
const FOLLOW: &str = concat!(
    "set -u\n",
    sha256_shell!(),
    receive_shell!(),
    r#"IFS= read -r token
url="$1"; dest="$2"; size="$3"; part="$dest.partial"; failed="$dest.failed"
[ -e "$dest" ] && exit 0
mkdir -p -- "$(dirname -- "$dest")" || exit 10
have=0; [ -f "$part" ] && have=$(stat -c %s -- "$part")
if [ "$have" -gt "$size" ]; then rm -f -- "$part"; have=0; fi
rm -f -- "$failed"
if [ "$have" -lt "$size" ]; then sum=$(receive 0); else sum=$(h "$part" | cut -d' ' -f1); fi
if [ -e "$failed" ]; then rm -f -- "$failed"; echo "the stream broke off at $(stat -c %s -- "$part" 2>/dev/null || echo 0) of $size bytes" >&2; exit 11; fi
got=$(stat -c %s -- "$part")
[ "$got" = "$size" ] || { echo "size $got, expected $size" >&2; exit 12; }
printf '%s %s %s\n' "$have" "$got" "$sum""#
);

/// What a follow left on the worker: its partial holds the whole file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Followed {
    /// Bytes the partial held before (an earlier run's).
    pub had: u64,
    /// The sha256 of the whole partial, taken as it arrived.
    pub sha256: String,
}

/// Has the worker behind `exec` receive the rest of `file` past what its partial holds, from
/// `url` (`file.from` allowed with [`allow_growing`] on the server whose `token` it
/// is), until the file is complete. `None` when the file is final on the worker already.
///
/// # Errors
///
/// [`TransferError::Pull`] naming the destination: the worker could not fetch or write, or the
/// stream broke off (what arrived stays in the partial, for the file's pull to resume).
///
/// [`allow_growing`]: super::server::FileServer::allow_growing
pub async fn follow(
    exec: &Exec,
    token: &Secret,
    url: &str,
    file: &GrowingFile,
) -> Result<Option<Followed>, TransferError> {
    let dest = file.to.display().to_string();
    let cmd = Cmd::shell(FOLLOW)
        .args(["sh", url, dest.as_str(), file.size.to_string().as_str()])
        .stdin(format!("{}\n", token.expose()).into_bytes());
    let fail = |detail: String| TransferError::Pull {
        node: exec.node().to_owned(),
        file: dest.clone(),
        detail,
    };
    let out = exec.output(&cmd).await.map_err(|e| fail(e.to_string()))?;
    if !out.status.success() {
        return Err(fail(format!(
            "following the file as it is written: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut words = text.split_whitespace();
    let Some(had) = words.next() else {
        return Ok(None);
    };
    let parsed = (|| {
        let had = had.parse().ok()?;
        let _size: u64 = words.next()?.parse().ok()?;
        let sha = words.next()?;
        (sha.len() == 64).then(|| Followed {
            had,
            sha256: sha.to_owned(),
        })
    })();
    parsed
        .map(Some)
        .ok_or_else(|| fail(format!("the worker answered {:?}", text.trim())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transfer::server::FileServer;
    use crate::transfer::{FileJob, expand, pull::transfer};

    fn pattern(n: u32) -> Vec<u8> {
        (0..n).map(|i| (i * 7 % 253) as u8).collect()
    }

    fn sha(b: &[u8]) -> String {
        use sha2::Digest as _;
        hex::encode(sha2::Sha256::digest(b))
    }

    /// Waits (up to 10 s) for `path` to hold `len` bytes.
    async fn holds(path: &std::path::Path, len: u64) -> bool {
        for _ in 0..200 {
            if std::fs::metadata(path).is_ok_and(|m| m.len() == len) {
                return true;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        false
    }

    /// The pull of `from` to `dest` with the follow's claim; what its server sent.
    async fn pull_with(
        exec: &Exec,
        from: &std::path::Path,
        dest: &std::path::Path,
        claim: Option<String>,
    ) -> (usize, u64) {
        let server = FileServer::start("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let jobs: Vec<FileJob> = expand(from, dest)
            .unwrap()
            .into_iter()
            .map(|j| FileJob {
                partial_sum: claim.clone(),
                ..j
            })
            .collect();
        let d = dest.parent().unwrap();
        let stats = transfer(
            exec,
            &server,
            &jobs,
            &d.join(".received.tsv"),
            &d.join("hashes.tsv"),
            1,
            &|_| {},
        )
        .await
        .unwrap();
        (stats.sent, server.bytes_served())
    }

    /// A file followed while it grows: the worker holds each final part before the file is
    /// complete, ends with the whole file and its sum, and the pull then moves and reads nothing.
    #[tokio::test]
    async fn a_followed_file_arrives_as_it_grows_and_its_pull_moves_nothing() {
        let d = tempfile::tempdir().unwrap();
        let bytes = pattern(3_000_000);
        let head = d.path().join("head.partial");
        std::fs::write(&head, &bytes[..1_000_000]).unwrap();
        let dest = d.path().join("worker/rank-cache/rank1of2.bin");
        let partial = d.path().join("worker/rank-cache/rank1of2.bin.partial");
        let exec = Exec::local("worker-1");
        let (server, tx, url) = serving_growing(&head, bytes.len() as u64, 1_000_000).await;
        let g = GrowingFile {
            from: head.clone(),
            to: dest.clone(),
            size: bytes.len() as u64,
            ready: 1_000_000,
        };
        let followed = {
            let (exec, token, url, g) = (
                Exec::local("worker-1"),
                server.token().clone(),
                url.clone(),
                g,
            );
            tokio::spawn(async move { follow(&exec, &token, &url, &g).await })
        };
        assert!(holds(&partial, 1_000_000).await, "the final start arrived");
        // The file grows: each final part follows.
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&head)
            .unwrap();
        std::io::Write::write_all(&mut f, &bytes[1_000_000..]).unwrap();
        tx.send_replace(2_000_000);
        assert!(holds(&partial, 2_000_000).await);
        assert!(!followed.is_finished(), "the follow waits for the rest");
        tx.send_replace(3_000_000);
        let got = followed.await.unwrap().unwrap().unwrap();
        assert_eq!(
            got,
            Followed {
                had: 0,
                sha256: sha(&bytes)
            }
        );
        assert_eq!(std::fs::read(&partial).unwrap(), bytes);
        assert_eq!(server.bytes_served(), 3_000_000);

        // Final on the head: the pull takes the follow's sum and moves nothing.
        let done = d.path().join("rank1of2.bin");
        std::fs::rename(&head, &done).unwrap();
        assert_eq!(
            pull_with(&exec, &done, &dest, Some(got.sha256)).await,
            (1, 0)
        );
        assert_eq!(std::fs::read(&dest).unwrap(), bytes);
        assert!(!partial.exists());
        // Final on the worker: a follow does nothing.
        assert_eq!(
            follow(&exec, server.token(), &url, &g_of(&done, &dest, 3_000_000))
                .await
                .unwrap(),
            None
        );
    }

    /// The worker's request arrives only after the head finished the file and renamed its
    /// partial (a loaded head or a slow worker): the follow is still answered, from the file as
    /// it was opened when allowed, whole and with its sum.
    #[tokio::test]
    async fn a_follow_asked_after_the_head_renamed_the_file_still_gets_it() {
        let d = tempfile::tempdir().unwrap();
        let bytes = pattern(1_500_000);
        let head = d.path().join("rank1of2.bin.partial");
        std::fs::write(&head, &bytes[..500_000]).unwrap();
        let (server, tx, url) = serving_growing(&head, bytes.len() as u64, 500_000).await;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&head)
            .unwrap();
        std::io::Write::write_all(&mut f, &bytes[500_000..]).unwrap();
        let done = d.path().join("rank1of2.bin");
        std::fs::rename(&head, &done).unwrap();
        tx.send_replace(bytes.len() as u64);
        let dest = d.path().join("worker/rank1of2.bin");
        let g = g_of(&head, &dest, bytes.len() as u64);
        let got = follow(&Exec::local("worker-1"), server.token(), &url, &g)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got.sha256, sha(&bytes));
        assert_eq!(
            std::fs::read(d.path().join("worker/rank1of2.bin.partial")).unwrap(),
            bytes
        );
        // A file that is not there cannot be allowed: the error names it.
        let (_tx, rx) = tokio::sync::watch::channel(0u64);
        let e = server
            .allow_growing(d.path().join("gone.partial"), 10, rx)
            .unwrap_err()
            .to_string();
        assert!(e.contains("gone.partial"), "{e}");
    }

    /// A server on loopback with `head` allowed as a growing file of `size` bytes, `ready` of
    /// them final: the server, the sender of the final start, the file's URL.
    async fn serving_growing(
        head: &std::path::Path,
        size: u64,
        ready: u64,
    ) -> (FileServer, tokio::sync::watch::Sender<u64>, String) {
        let server = FileServer::start("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let (tx, rx) = tokio::sync::watch::channel(ready);
        let url = server.allow_growing(head.to_owned(), size, rx).unwrap();
        (server, tx, url)
    }

    fn g_of(from: &std::path::Path, to: &std::path::Path, size: u64) -> GrowingFile {
        GrowingFile {
            from: from.to_owned(),
            to: to.to_owned(),
            size,
            ready: size,
        }
    }

    /// A build that ends before the file is complete breaks the follow off: the worker keeps what
    /// arrived, and the pull resumes after it. A wrong claim is never trusted: the file is sent
    /// again, whole.
    #[tokio::test]
    async fn a_broken_off_follow_is_resumed_and_a_wrong_sum_is_sent_again() {
        let d = tempfile::tempdir().unwrap();
        let bytes = pattern(2_000_000);
        let head = d.path().join("head.bin");
        std::fs::write(&head, &bytes).unwrap();
        let dest = d.path().join("worker/a.bin");
        let exec = Exec::local("worker-1");
        let (server, tx, url) = serving_growing(&head, 2_000_000, 700_000).await;
        let followed = {
            let (exec, token, url, g) = (
                Exec::local("worker-1"),
                server.token().clone(),
                url.clone(),
                g_of(&head, &dest, 2_000_000),
            );
            tokio::spawn(async move { follow(&exec, &token, &url, &g).await })
        };
        let partial = d.path().join("worker/a.bin.partial");
        assert!(holds(&partial, 700_000).await);
        drop(tx);
        let e = followed.await.unwrap().unwrap_err().to_string();
        assert!(e.contains("broke off at 700000 of 2000000"), "{e}");
        assert_eq!(pull_with(&exec, &head, &dest, None).await, (1, 1_300_000));
        assert_eq!(std::fs::read(&dest).unwrap(), bytes);

        // A complete partial with a claim that is not the file's sum: sent again, whole.
        std::fs::remove_file(&dest).unwrap();
        std::fs::write(&partial, &pattern(2_000_001)[1..]).unwrap();
        let wrong = sha(&pattern(2_000_001)[1..]);
        assert_eq!(
            pull_with(&exec, &head, &dest, Some(wrong)).await,
            (1, 2_000_000)
        );
        assert_eq!(std::fs::read(&dest).unwrap(), bytes);
    }
}
