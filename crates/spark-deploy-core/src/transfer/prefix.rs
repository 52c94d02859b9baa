//! Sending the finished start of a file that is still being written on the head.
//!
//! A rank file built while the checkpoint arrives is final from its first byte up to a frontier
//! that grows as shards land (see the rank-cache build). Its worker need not wait for the whole
//! file: [`push_prefix`] appends the final bytes past what the worker holds to the worker's
//! `<dest>.partial`, which is exactly what an interrupted pull leaves. The file's own pull, once
//! the file is final on the head, then resumes after them ([`super::pull`]), and checks size and
//! sha256 of the whole file as always: a prefix that went wrong is caught there, removed, and the
//! file sent again.

use std::path::PathBuf;

use super::TransferError;
use super::server::FileServer;
use crate::ports::exec::{Cmd, Exec};

/// A file still being written on the head whose first `ready` bytes are final.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrowingFile {
    /// The partial file on the head.
    pub from: PathBuf,
    /// Its final path on the worker (the prefix goes to `<to>.partial`).
    pub to: PathBuf,
    /// The file's final size.
    pub size: u64,
    /// Bytes from the start that are final and will not change.
    pub ready: u64,
}

/// Appends bytes `[have, upto)` of the served file to `<dest>.partial`, `have` being that
/// partial's length; prints the partial's length after. The token comes on stdin. Nothing happens
/// when the file is final on the worker already (its pull and manifest decide about it).
const PUSH: &str = r#"set -u
IFS= read -r token
url="$1"; dest="$2"; upto="$3"; part="$dest.partial"
[ -e "$dest" ] && { echo 0; exit 0; }
mkdir -p -- "$(dirname -- "$dest")" || exit 10
have=0; [ -f "$part" ] && have=$(stat -c %s -- "$part")
if [ "$have" -lt "$upto" ]; then
  printf 'Authorization: Bearer %s\n' "$token" | curl -fsS --speed-limit 1024 --speed-time 30 -H @- -r "$have-$((upto - 1))" -o - -- "$url" >> "$part" || exit 11
fi
stat -c %s -- "$part""#;

/// Sends the worker behind `exec` the final bytes of `file` it does not hold yet, from `url`
/// (`file.from` on `server`'s allow-list). Returns the bytes it holds now (0 when the file is final
/// there already).
///
/// # Errors
///
/// [`TransferError::Pull`] naming the destination: the worker could not fetch or append.
pub async fn push_prefix(
    exec: &Exec,
    server: &FileServer,
    url: &str,
    file: &GrowingFile,
) -> Result<u64, TransferError> {
    let dest = file.to.display().to_string();
    let upto = file.ready.min(file.size);
    let cmd = Cmd::shell(PUSH)
        .args(["sh", url, dest.as_str(), upto.to_string().as_str()])
        .stdin(format!("{}\n", server.token().expose()).into_bytes());
    let fail = |detail: String| TransferError::Pull {
        node: exec.node().to_owned(),
        file: dest.clone(),
        detail,
    };
    let out = exec.output(&cmd).await.map_err(|e| fail(e.to_string()))?;
    if !out.status.success() {
        return Err(fail(format!(
            "sending the final start of the file: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .map_err(|_| fail("the worker did not report its partial's length".into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transfer::expand;
    use crate::transfer::pull::transfer;

    /// A file pushed in two steps while it "grows", then pulled whole: the worker's file is the
    /// head's, and the pull moved only the rest past the pushed prefix.
    #[tokio::test]
    async fn a_pushed_prefix_is_resumed_by_the_pull_and_never_sent_again() {
        let d = tempfile::tempdir().unwrap();
        let bytes: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 253) as u8).collect();
        let head = d.path().join("head.partial");
        std::fs::write(&head, &bytes).unwrap();
        let dest = d.path().join("worker/rank-cache/rank1of2.bin");
        let exec = Exec::local("worker-1");
        let server = FileServer::start("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let url = server.allow(head.clone());
        let mut g = GrowingFile {
            from: head.clone(),
            to: dest.clone(),
            size: bytes.len() as u64,
            ready: 1_000_000,
        };
        assert_eq!(
            push_prefix(&exec, &server, &url, &g).await.unwrap(),
            1_000_000
        );
        // Nothing new is final: nothing moves.
        assert_eq!(
            push_prefix(&exec, &server, &url, &g).await.unwrap(),
            1_000_000
        );
        g.ready = 2_000_000;
        assert_eq!(
            push_prefix(&exec, &server, &url, &g).await.unwrap(),
            2_000_000
        );
        let partial = d.path().join("worker/rank-cache/rank1of2.bin.partial");
        assert_eq!(std::fs::read(&partial).unwrap(), bytes[..2_000_000]);

        // The file is final on the head: its pull resumes after the prefix.
        let done = d.path().join("rank1of2.bin");
        std::fs::rename(&head, &done).unwrap();
        let jobs = expand(&done, &dest).unwrap();
        let pull_server = FileServer::start("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let manifest = d.path().join("worker/.received.tsv");
        let stats = transfer(
            &exec,
            &pull_server,
            &jobs,
            &manifest,
            &d.path().join("hashes.tsv"),
            1,
            &|_| {},
        )
        .await
        .unwrap();
        assert_eq!(stats.sent, 1);
        assert_eq!(std::fs::read(&dest).unwrap(), bytes);
        assert!(!partial.exists());
        // The pull resumed after the prefix: it moved only the last megabyte.
        assert_eq!(pull_server.bytes_served(), 1_000_000);

        // Final on the worker: a push does nothing.
        assert_eq!(push_prefix(&exec, &server, &url, &g).await.unwrap(), 0);
    }
}
