//! Feeding several workers at once: one file server per worker on the head's fabric address,
//! every worker pulling its own jobs at the same time, the head's source hashes read once for the
//! files they share. On the testbed and on a Spark the head's disk and the fabric are shared, so
//! three workers take about as long as the slowest one, not three times one.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use futures::future::join_all;

use super::pull::{self, TransferProgress, TransferStats};
use super::server::FileServer;
use super::{FileJob, TransferError};
use crate::ports::exec::Exec;

/// One worker to feed.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    /// The worker's Exec port (its pulls run there).
    pub exec: &'a Exec,
    /// What it receives.
    pub jobs: &'a [FileJob],
    /// Its manifest of verified files (on the worker).
    pub manifest: &'a Path,
}

/// Moves every target's jobs at once, `streams` pulls in flight per worker. `progress` gets the
/// target's index with each report. When `cancelled` completes first, every server breaks its
/// pulls in flight and the transfers end (each worker keeps its `.partial` files and the files
/// that arrived whole are in its manifest, so the next run resumes).
///
/// Returns each target's outcome, in order: one worker's failure does not stop the others'
/// transfers.
///
/// # Errors
///
/// The outer error: a source that cannot be hashed or a server that cannot bind (nothing moved).
pub async fn feed(
    head: IpAddr,
    targets: &[Target<'_>],
    hash_cache: &Path,
    streams: usize,
    progress: &(dyn Fn(usize, &TransferProgress<'_>) + Send + Sync),
    cancelled: impl std::future::Future<Output = ()>,
) -> Result<Vec<Result<TransferStats, TransferError>>, TransferError> {
    // The shared files (kit, Engram tables, token map) are hashed once, not once per worker.
    let mut sources: Vec<PathBuf> = targets
        .iter()
        .flat_map(|t| t.jobs.iter().map(|j| j.from.clone()))
        .collect();
    sources.sort();
    sources.dedup();
    pull::source_hashes(sources, hash_cache).await?;
    let mut servers = Vec::with_capacity(targets.len());
    for _ in targets {
        servers.push(FileServer::start(SocketAddr::new(head, 0)).await?);
    }
    let transfers = join_all(
        targets
            .iter()
            .zip(&servers)
            .enumerate()
            .map(|(i, (t, server))| {
                let report = move |p: &TransferProgress<'_>| progress(i, p);
                async move {
                    pull::transfer(
                        t.exec, server, t.jobs, t.manifest, hash_cache, streams, &report,
                    )
                    .await
                }
            }),
    );
    let mut transfers = std::pin::pin!(transfers);
    let cancelled = std::pin::pin!(cancelled);
    tokio::select! {
        r = &mut transfers => Ok(r),
        () = cancelled => {
            for s in &servers {
                s.stop_transfers();
            }
            Ok(transfers.await)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transfer::expand;

    /// Three workers (local Execs on loopback) fed at once: each gets its own file and the shared
    /// one, whole; the shared file's hash is recorded once; a worker whose destination cannot be
    /// written fails alone, the others still get everything.
    #[tokio::test]
    async fn three_workers_fed_at_once_and_one_failure_stays_its_own() {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("src");
        std::fs::create_dir_all(&src).unwrap();
        let shared: Vec<u8> = (0..1_500_000u32).map(|i| (i * 13 % 251) as u8).collect();
        std::fs::write(src.join("shared.bin"), &shared).unwrap();
        let execs: Vec<Exec> = (1..=3)
            .map(|i| Exec::local(format!("worker-{i}")))
            .collect();
        let mut jobs = Vec::new();
        let mut manifests = Vec::new();
        for i in 1..=3 {
            let own = src.join(format!("rank{i}.bin"));
            std::fs::write(&own, vec![u8::try_from(i).unwrap(); 700_000]).unwrap();
            let dst = d.path().join(format!("worker-{i}"));
            let mut j = expand(&src.join("shared.bin"), &dst.join("shared.bin")).unwrap();
            j.extend(expand(&own, &dst.join("own.bin")).unwrap());
            jobs.push(j);
            manifests.push(dst.join(".received.tsv"));
        }
        // Worker 2's destination is a file where a directory must be.
        std::fs::write(d.path().join("worker-2"), b"not a directory").unwrap();
        let targets: Vec<Target<'_>> = (0..3)
            .map(|i| Target {
                exec: &execs[i],
                jobs: &jobs[i],
                manifest: &manifests[i],
            })
            .collect();
        let cache = d.path().join("hashes.tsv");
        let r = feed(
            "127.0.0.1".parse().unwrap(),
            &targets,
            &cache,
            2,
            &|_, _| {},
            std::future::pending(),
        )
        .await
        .unwrap();
        assert_eq!(r.len(), 3);
        assert!(r[1].is_err(), "{:?}", r[1]);
        for i in [0, 2] {
            let s = r[i].as_ref().unwrap();
            assert_eq!((s.files, s.sent), (2, 2));
            let dst = d.path().join(format!("worker-{}", i + 1));
            assert_eq!(std::fs::read(dst.join("shared.bin")).unwrap(), shared);
            assert_eq!(std::fs::read(dst.join("own.bin")).unwrap().len(), 700_000);
        }
        let recorded = std::fs::read_to_string(&cache).unwrap();
        assert_eq!(recorded.matches("shared.bin").count(), 1, "{recorded}");
        assert_eq!(recorded.lines().count(), 4, "{recorded}");
    }
}
