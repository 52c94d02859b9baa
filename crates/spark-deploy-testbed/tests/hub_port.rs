//! The Hub port of spark-deploy-core against the testbed hub (loopback only).
//!
//! Longer than the ~600-line rule on purpose: one test binary for the Hub port's behaviour
//! against the testbed hub (fetch, resume, stalls, verify, gating, pacing, cancellation), the
//! tests sharing the config and request-log helpers at the top (each binary in `tests/` links the
//! whole testbed again).

// An integration test: a failed unwrap or expect is the test failure, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use spark_deploy_core::hub::{
    FetchError, FetchEvent, FileOutcome, HfToken, Hub, HubConfig, HubError, NoProgress, RemoteFile,
    verify_snapshot,
};
use spark_deploy_testbed::hub_server::{Fault, FaultRule, HubServer};

fn config(server: &HubServer, cache: &std::path::Path) -> HubConfig {
    let mut c = HubConfig::new(Some(server.endpoint()), cache);
    c.token = None;
    c.stall_timeout = Duration::from_secs(5);
    c.backoff_base = Duration::from_millis(20);
    c.backoff_max = Duration::from_millis(200);
    c.max_retries = 4;
    c
}

#[derive(Default, Clone)]
struct Events(Arc<Mutex<Vec<FetchEvent>>>);

impl spark_deploy_core::hub::FetchProgress for Events {
    fn on_event(&self, e: &FetchEvent) {
        self.0.lock().unwrap().push(e.clone());
    }
}

impl Events {
    fn all(&self) -> Vec<FetchEvent> {
        self.0.lock().unwrap().clone()
    }
}

/// A hub client over `server` with an empty cache of its own and `streams` downloads at once.
fn hub_with_streams(server: &HubServer, streams: usize) -> (tempfile::TempDir, Hub) {
    let cache = tempfile::tempdir().unwrap();
    let mut cfg = config(server, cache.path());
    cfg.max_streams = streams;
    let hub = Hub::new(cfg).unwrap();
    (cache, hub)
}

async fn pinned_all(
    hub: &Hub,
    repo: &str,
    rev: &str,
) -> (spark_deploy_core::hub::ResolvedRepo, Vec<RemoteFile>) {
    let r = hub.resolve(repo, rev).await.unwrap();
    let files = hub.list_files(&r).await.unwrap();
    (r, files)
}

fn gets_of(server: &HubServer, file: &str) -> Vec<spark_deploy_testbed::hub_server::RequestRecord> {
    server
        .requests()
        .into_iter()
        .filter(|r| r.method == "GET" && r.path.ends_with(&format!("/{file}")))
        .collect()
}

#[tokio::test]
async fn fetch_into_empty_cache_gives_standard_layout_and_identical_bytes() {
    let tree = make_tree();
    let server = start(&tree, false);
    let cache = tempfile::tempdir().unwrap();
    let hub = Hub::new(config(&server, cache.path())).unwrap();
    let (r, files) = pinned_all(&hub, TINY, "main").await;
    assert_eq!(r.commit, server.commit(TINY).unwrap());
    assert_eq!(files.len(), tree.files[TINY].len());
    let shard = files.iter().find(|f| f.path == SHARD).unwrap();
    assert!(shard.is_lfs && shard.size > 10 * 1024 * 1024);

    let events = Events::default();
    let report = hub.fetch(&r, &files, &events).await.unwrap();
    assert!(
        report
            .files
            .iter()
            .all(|f| f.outcome == FileOutcome::Downloaded)
    );
    assert_eq!(
        report.snapshot_dir,
        cache
            .path()
            .join("models--testorg--tiny/snapshots")
            .join(&r.commit)
    );
    assert_eq!(read_tree(&report.snapshot_dir), tree.files[TINY]);

    // Layout: relative symlinks into blobs/, LFS blob named by sha256, small file by git sha1.
    let repo_dir = cache.path().join("models--testorg--tiny");
    let link = std::fs::read_link(report.snapshot_dir.join(SHARD)).unwrap();
    assert_eq!(
        link,
        std::path::PathBuf::from(format!(
            "../../blobs/{}",
            sha256_hex(tree.file(TINY, SHARD))
        ))
    );
    let nested = std::fs::read_link(report.snapshot_dir.join("nested/deeper/extra.bin")).unwrap();
    assert!(nested.starts_with("../../../../blobs"), "{nested:?}");
    let cfg_etag = std::fs::read_link(report.snapshot_dir.join("config.json")).unwrap();
    assert_eq!(cfg_etag.file_name().unwrap().len(), 40);
    assert_eq!(
        std::fs::read_to_string(repo_dir.join("refs/main")).unwrap(),
        r.commit
    );
    let leftovers: Vec<_> = std::fs::read_dir(repo_dir.join("blobs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains('.'))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    // Duplicate content is one blob.
    assert_eq!(
        std::fs::read_link(report.snapshot_dir.join("nested/copy-of-config.json"))
            .unwrap()
            .file_name(),
        cfg_etag.file_name()
    );

    // Progress: start, bytes with rate/ETA, finish.
    let ev = events.all();
    assert!(
        matches!(ev.first(), Some(FetchEvent::Started { files: 6, .. })),
        "{:?}",
        ev.first()
    );
    assert!(ev.iter().any(|e| matches!(e, FetchEvent::Progress { done, total, rate_bps, .. } if *done == *total && *rate_bps > 0.0)));
    assert!(matches!(
        ev.last(),
        Some(FetchEvent::Finished { files: 6, .. })
    ));

    // A second run fetches nothing: only metadata requests reach the server.
    server.clear_requests();
    let again = hub.fetch(&r, &files, &NoProgress).await.unwrap();
    assert!(
        again
            .files
            .iter()
            .all(|f| f.outcome == FileOutcome::AlreadyVerified)
    );
    assert_eq!(again.transferred, 0);
    assert!(
        server.requests().iter().all(|q| q.method == "HEAD"),
        "{:?}",
        server.requests()
    );
    assert!(
        again
            .summary()
            .starts_with("all 6 files present and verified")
    );
}

#[tokio::test]
async fn cut_transfer_resumes_from_the_partial_file() {
    let tree = make_tree();
    let server = start(&tree, false);
    let cache = tempfile::tempdir().unwrap();
    let hub = Hub::new(config(&server, cache.path())).unwrap();
    let (r, files) = pinned_all(&hub, TINY, &server.commit(TINY).unwrap()).await;
    let shard: Vec<RemoteFile> = files.into_iter().filter(|f| f.path == SHARD).collect();
    let size = shard[0].size;
    let cut = size / 2;
    server.set_fault(FaultRule::file(SHARD, Fault::CutAfter { bytes: cut }).times(1));
    let events = Events::default();
    let report = hub.fetch(&r, &shard, &events).await.unwrap();
    assert_eq!(
        std::fs::read(report.snapshot_dir.join(SHARD)).unwrap(),
        tree.file(TINY, SHARD)
    );

    let gets = gets_of(&server, SHARD);
    assert_eq!(gets.len(), 2, "{gets:?}");
    assert_eq!(gets[0].range, None);
    assert_eq!(gets[0].body_bytes, cut);
    let resumed_at = gets[1].range_start.unwrap();
    assert!(
        resumed_at > 0 && resumed_at <= cut,
        "resumed at {resumed_at}"
    );
    assert_eq!(
        gets[1].range.as_deref(),
        Some(format!("bytes={resumed_at}-").as_str())
    );
    let refetched = gets.iter().map(|g| g.body_bytes).sum::<u64>() - size;
    assert!(
        refetched * 100 <= size,
        "re-fetched {refetched} of {size} bytes"
    );
    assert!(
        events
            .all()
            .iter()
            .any(|e| matches!(e, FetchEvent::FileStarted { offset, .. } if *offset == resumed_at))
    );
}

#[tokio::test]
async fn an_existing_incomplete_file_is_continued_with_a_range_at_its_length() {
    let tree = make_tree();
    let server = start(&tree, false);
    let cache = tempfile::tempdir().unwrap();
    let hub = Hub::new(config(&server, cache.path())).unwrap();
    let (r, files) = pinned_all(&hub, TINY, "main").await;
    let shard: Vec<RemoteFile> = files.into_iter().filter(|f| f.path == SHARD).collect();
    let data = tree.file(TINY, SHARD);
    let blobs = blobs_dir(cache.path(), TINY);
    std::fs::create_dir_all(&blobs).unwrap();
    let partial = 3_000_017;
    std::fs::write(
        blobs.join(format!("{}.incomplete", sha256_hex(data))),
        &data[..partial],
    )
    .unwrap();
    hub.fetch(&r, &shard, &NoProgress).await.unwrap();
    let gets = gets_of(&server, SHARD);
    assert_eq!(gets.len(), 1, "{gets:?}");
    assert_eq!(
        gets[0].range.as_deref(),
        Some(format!("bytes={partial}-").as_str())
    );
    assert_eq!(gets[0].body_bytes, data.len() as u64 - partial as u64);
    assert_eq!(std::fs::read(blobs.join(sha256_hex(data))).unwrap(), data);
}

#[tokio::test]
async fn a_stall_is_detected_and_retried() {
    let tree = make_tree();
    let server = start(&tree, false);
    let cache = tempfile::tempdir().unwrap();
    let mut cfg = config(&server, cache.path());
    cfg.stall_timeout = Duration::from_millis(400);
    let hub = Hub::new(cfg).unwrap();
    let (r, files) = pinned_all(&hub, TINY, "main").await;
    let shard: Vec<RemoteFile> = files.into_iter().filter(|f| f.path == SHARD).collect();
    server.set_fault(
        FaultRule::file(
            SHARD,
            Fault::StallAfter {
                bytes: 1 << 20,
                dur: Duration::from_secs(20),
            },
        )
        .times(1),
    );
    let events = Events::default();
    let t0 = Instant::now();
    let report = hub.fetch(&r, &shard, &events).await.unwrap();
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "took {:?}",
        t0.elapsed()
    );
    assert_eq!(
        std::fs::read(report.snapshot_dir.join(SHARD)).unwrap(),
        tree.file(TINY, SHARD)
    );
    let retries: Vec<_> = events
        .all()
        .into_iter()
        .filter_map(|e| match e {
            FetchEvent::Retrying { reason, .. } => Some(reason),
            _ => None,
        })
        .collect();
    // One stall is injected; a loaded machine may add a spurious one, never fewer.
    assert!(!retries.is_empty(), "{retries:?}");
    assert!(retries[0].contains("stalled"), "{retries:?}");
    let gets = gets_of(&server, SHARD);
    assert!(gets.len() >= 2, "{gets:?}");
    assert_eq!(gets[1].range_start, Some(1 << 20));
}

#[tokio::test]
async fn a_stall_that_never_ends_gives_up_after_bounded_retries() {
    let tree = make_tree();
    let server = start(&tree, false);
    let cache = tempfile::tempdir().unwrap();
    let mut cfg = config(&server, cache.path());
    cfg.stall_timeout = Duration::from_millis(200);
    cfg.max_retries = 2;
    let hub = Hub::new(cfg).unwrap();
    let (r, files) = pinned_all(&hub, TINY, "main").await;
    let shard: Vec<RemoteFile> = files.into_iter().filter(|f| f.path == SHARD).collect();
    server.set_fault(FaultRule::file(
        SHARD,
        Fault::StallAfter {
            bytes: 0,
            dur: Duration::from_secs(30),
        },
    ));
    let err = hub.fetch(&r, &shard, &NoProgress).await.unwrap_err();
    assert!(
        matches!(err, FetchError::GaveUp { attempts: 3, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains(SHARD));
    assert_eq!(gets_of(&server, SHARD).len(), 3);
    // The partial file stays under its .incomplete name only.
    assert!(
        !blobs_dir(cache.path(), TINY)
            .join(sha256_hex(tree.file(TINY, SHARD)))
            .exists()
    );
}

#[tokio::test]
async fn a_corrupt_blob_is_found_by_verify_and_fetched_again() {
    let tree = make_tree();
    let server = start(&tree, false);
    let cache = tempfile::tempdir().unwrap();
    let hub = Hub::new(config(&server, cache.path())).unwrap();
    let (r, files) = pinned_all(&hub, TINY, "main").await;
    hub.fetch(&r, &files, &NoProgress).await.unwrap();
    let blob = blobs_dir(cache.path(), TINY).join(sha256_hex(tree.file(TINY, SHARD)));
    let mut bytes = std::fs::read(&blob).unwrap();
    bytes[5_000_000] ^= 0x01;
    std::fs::write(&blob, &bytes).unwrap();

    let check = verify_snapshot(hub.cache(), TINY, &r.commit, None).unwrap();
    assert_eq!(check.problems.len(), 1, "{:?}", check.problems);
    assert!(
        check.problems[0].to_string().contains(SHARD),
        "{}",
        check.problems[0]
    );
    assert_eq!(check.verified.len(), 5);

    server.clear_requests();
    let report = hub.fetch(&r, &files, &NoProgress).await.unwrap();
    let shard = report.files.iter().find(|f| f.path == SHARD).unwrap();
    assert_eq!(shard.outcome, FileOutcome::Refetched);
    assert!(
        report
            .files
            .iter()
            .filter(|f| f.path != SHARD)
            .all(|f| f.outcome == FileOutcome::AlreadyVerified)
    );
    assert_eq!(std::fs::read(&blob).unwrap(), tree.file(TINY, SHARD));
    assert_eq!(gets_of(&server, SHARD).len(), 1);
    assert!(
        verify_snapshot(hub.cache(), TINY, &r.commit, None)
            .unwrap()
            .is_ok()
    );
}

#[tokio::test]
async fn verify_only_works_with_the_server_stopped() {
    let tree = make_tree();
    let server = start(&tree, false);
    let cache = tempfile::tempdir().unwrap();
    let hub = Hub::new(config(&server, cache.path())).unwrap();
    let (r, files) = pinned_all(&hub, TINY, "main").await;
    hub.fetch(&r, &files, &NoProgress).await.unwrap();
    server.stop();

    let by_branch = verify_snapshot(hub.cache(), TINY, "main", None).unwrap();
    assert!(by_branch.is_ok(), "{:?}", by_branch.problems);
    assert_eq!(by_branch.verified.len(), 6);
    assert_eq!(by_branch.commit, r.commit);
    // A file missing from the snapshot is reported (the fetch manifest knows it should be there).
    std::fs::remove_file(
        cache
            .path()
            .join("models--testorg--tiny/snapshots")
            .join(&r.commit)
            .join("nested/deeper/extra.bin"),
    )
    .unwrap();
    let after = verify_snapshot(hub.cache(), TINY, &r.commit, None).unwrap();
    assert_eq!(after.problems.len(), 1);
    assert!(
        after.problems[0]
            .to_string()
            .contains("nested/deeper/extra.bin")
    );
    assert!(verify_snapshot(hub.cache(), "testorg/absent", "main", None).is_err());
    let only = hub
        .verify_only(TINY, &r.commit, Some(&["config.json".to_owned()]))
        .unwrap();
    assert!(only.is_ok() && only.verified == ["config.json"]);
}

#[tokio::test]
async fn a_gated_repo_error_names_the_repo_and_never_the_token() {
    let tree = make_tree();
    let server = start(&tree, false);
    let cache = tempfile::tempdir().unwrap();

    let hub = Hub::new(config(&server, cache.path())).unwrap();
    let (r, files) = pinned_all(&hub, GATED, "main").await;
    let err = hub.fetch(&r, &files, &NoProgress).await.unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(
            err,
            FetchError::Hub(HubError::Access {
                status: 401,
                gated: true,
                ..
            })
        ),
        "{err:?}"
    );
    for needle in [
        GATED,
        "read access",
        "HF_TOKEN",
        "hf auth login",
        "no token",
    ] {
        assert!(msg.contains(needle), "{needle:?} missing from: {msg}");
    }

    let wrong = "hf_wrong_secret_value_987";
    let mut cfg = config(&server, cache.path());
    cfg.token = Some(HfToken::new(wrong));
    assert!(!format!("{cfg:?}").contains(wrong));
    let hub = Hub::new(cfg).unwrap();
    assert!(!format!("{hub:?}").contains(wrong));
    let err = hub.fetch(&r, &files, &NoProgress).await.unwrap_err();
    assert!(
        matches!(err, FetchError::Hub(HubError::Access { status: 403, .. })),
        "{err:?}"
    );
    let all = format!("{err} {err:?} {:?}", std::error::Error::source(&err));
    assert!(all.contains("rejected") && all.contains(GATED), "{all}");
    assert!(!all.contains(wrong), "token leaked: {all}");
    assert!(server.requests().iter().any(|q| q.had_token));

    let mut cfg = config(&server, cache.path());
    cfg.token = Some(HfToken::new(GATED_TOKEN));
    let hub = Hub::new(cfg).unwrap();
    let report = hub.fetch(&r, &files, &NoProgress).await.unwrap();
    assert_eq!(read_tree(&report.snapshot_dir), tree.files[GATED]);
}

#[tokio::test]
async fn remote_tensors_are_read_by_byte_range_only() {
    let tree = make_tree();
    let server = start(&tree, false);
    let cache = tempfile::tempdir().unwrap();
    let hub = Hub::new(config(&server, cache.path())).unwrap();
    let r = hub.resolve(TINY, "main").await.unwrap();
    let header = hub.read_safetensors_header(&r, SHARD).await.unwrap();
    assert_eq!(header.tensors.len(), 5);
    server.clear_requests();
    let got = hub
        .read_tensors(&r, SHARD, &[BIAS_B, BIAS_A])
        .await
        .unwrap();
    let data = tree.file(TINY, SHARD);
    assert_eq!(got[0].name, BIAS_B);
    assert_eq!(&got[0].data[..], tree.tensor_bytes(data, BIAS_B));
    assert_eq!(&got[1].data[..], tree.tensor_bytes(data, BIAS_A));
    assert_eq!(got[1].entry.shape, vec![256]);
    let served = server.bytes_served();
    let tensors = 2 * 256 * 4;
    assert!(
        served <= 64 * 1024 + tensors,
        "served {served} bytes for {tensors} bytes of tensors"
    );
    assert!(
        server.requests().iter().all(|q| q.status == 206),
        "{:?}",
        server.requests()
    );
    let err = hub.read_tensors(&r, SHARD, &["nope"]).await.unwrap_err();
    assert!(err.to_string().contains("nope"));
}

#[tokio::test]
async fn fetch_works_through_the_hubs_lfs_redirects() {
    let tree = make_tree();
    let server = start(&tree, true);
    let cache = tempfile::tempdir().unwrap();
    let hub = Hub::new(config(&server, cache.path())).unwrap();
    let (r, files) = pinned_all(&hub, TINY, "main").await;
    server.set_fault(FaultRule::file(SHARD, Fault::CutAfter { bytes: 2_000_000 }).times(1));
    let report = hub.fetch(&r, &files, &NoProgress).await.unwrap();
    assert_eq!(read_tree(&report.snapshot_dir), tree.files[TINY]);
    let reqs = server.requests();
    assert!(reqs.iter().any(|q| q.status == 302), "{reqs:?}");
    assert!(
        reqs.iter()
            .any(|q| q.path.starts_with("/_lfs/") && q.status == 206),
        "{reqs:?}"
    );
}

#[tokio::test]
async fn unknown_repo_and_revision_are_named() {
    let tree = make_tree();
    let server = start(&tree, false);
    let cache = tempfile::tempdir().unwrap();
    let hub = Hub::new(config(&server, cache.path())).unwrap();
    let e = hub.resolve("testorg/absent", "main").await.unwrap_err();
    assert!(matches!(e, HubError::RepoNotFound { .. }), "{e:?}");
    assert!(e.to_string().contains("testorg/absent"));
    let e = hub.resolve(TINY, "no-such-branch").await.unwrap_err();
    assert!(matches!(e, HubError::RevisionNotFound { .. }), "{e:?}");
    assert!(e.to_string().contains("no-such-branch"));
}

#[tokio::test]
async fn files_download_in_parallel_with_a_bounded_number_of_streams() {
    let tree = make_tree();
    let server = start(&tree, false);
    let (_cache, hub) = hub_with_streams(&server, 2);
    let (r, files) = pinned_all(&hub, TINY, "main").await;
    // Every transfer waits a moment before its first byte, so transfers overlap.
    server.set_fault(FaultRule::all(Fault::StallAfter {
        bytes: 0,
        dur: Duration::from_millis(300),
    }));
    let report = hub.fetch(&r, &files, &NoProgress).await.unwrap();
    assert_eq!(read_tree(&report.snapshot_dir), tree.files[TINY]);
    assert_eq!(server.peak_concurrent_transfers(), 2);
}

/// The consumer names the file it wants first; the others go in the fetch's own order.
#[derive(Default, Clone)]
struct WantsFirst(Events, String);

impl spark_deploy_core::hub::FetchProgress for WantsFirst {
    fn on_event(&self, e: &FetchEvent) {
        self.0.on_event(e);
    }
    fn wanted_first(&self) -> Option<Vec<String>> {
        Some(vec!["no-such-file".into(), self.1.clone()])
    }
}

#[tokio::test]
async fn a_file_the_consumer_wants_first_jumps_the_queue() {
    let tree = make_tree();
    let server = start(&tree, false);
    let (_cache, hub) = hub_with_streams(&server, 1);
    let (r, files) = pinned_all(&hub, TINY, "main").await;
    // The order transfers start in (files finish in another order: a small file started after
    // the shard can be done while the shard is still being verified).
    let start_order = |events: &Events| -> Vec<String> {
        events
            .all()
            .into_iter()
            .filter_map(|e| match e {
                FetchEvent::FileStarted { file, .. } => Some(file),
                _ => None,
            })
            .collect()
    };
    let done = |events: &Events| {
        events
            .all()
            .into_iter()
            .filter(|e| matches!(e, FetchEvent::FileDone { .. }))
            .count()
    };
    // Alone, the shard (the largest file) starts last.
    let plain = Events::default();
    hub.fetch(&r, &files, &plain).await.unwrap();
    let order = start_order(&plain);
    assert_eq!(order.last().map(String::as_str), Some(SHARD), "{order:?}");
    // Wanted first, it starts first, and everything still arrives.
    let (_cache, hub) = hub_with_streams(&server, 1);
    let wants = WantsFirst(Events::default(), SHARD.to_owned());
    let report = hub.fetch(&r, &files, &wants).await.unwrap();
    let order = start_order(&wants.0);
    assert_eq!(order.first().map(String::as_str), Some(SHARD), "{order:?}");
    assert_eq!(done(&wants.0), files.len());
    assert_eq!(read_tree(&report.snapshot_dir), tree.files[TINY]);
}

#[tokio::test]
async fn a_rate_limited_hub_paces_every_transfer_and_logs_it_over_http() {
    let tree = make_tree();
    let rate = 4_000_000;
    let server = start_with(
        &tree,
        spark_deploy_testbed::hub_server::HubOptions {
            rate_limit: std::num::NonZeroU64::new(rate),
            ..Default::default()
        },
    );
    let cache = tempfile::tempdir().unwrap();
    let hub = Hub::new(config(&server, cache.path())).unwrap();
    let (r, files) = pinned_all(&hub, TINY, "main").await;
    let shard: Vec<RemoteFile> = files.into_iter().filter(|f| f.path == SHARD).collect();
    let size = shard[0].size;
    let t = Instant::now();
    let report = hub.fetch(&r, &shard, &NoProgress).await.unwrap();
    let took = t.elapsed().as_secs_f64();
    assert_eq!(report.transferred, size);
    // ~2.9 s at 4 MB/s; without the limit this takes well under a second on loopback.
    let ideal = size as f64 / rate as f64;
    assert!(
        took >= ideal * 0.9,
        "{size} bytes in {took:.2} s at {rate} B/s"
    );
    assert!(
        took <= ideal * 1.5 + 1.0,
        "{size} bytes in {took:.2} s at {rate} B/s"
    );
    // The request log over HTTP (for hubs run as `sd-hub`) matches the in-process one.
    let body = reqwest::get(format!("{}/_testbed/requests", server.endpoint()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let log: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
    let served: u64 = log.iter().filter_map(|r| r["body_bytes"].as_u64()).sum();
    assert_eq!(served, server.bytes_served());
    assert_eq!(served, size);
    assert!(
        log.iter()
            .any(|r| r["method"] == "GET" && r["path"].as_str().unwrap().ends_with(SHARD)),
        "{body}"
    );
}

#[tokio::test]
async fn a_cancelled_fetch_keeps_every_received_byte_and_the_next_fetch_continues_there() {
    let tree = make_tree();
    let paced = start_with(
        &tree,
        spark_deploy_testbed::hub_server::HubOptions {
            rate_limit: std::num::NonZeroU64::new(1_000_000),
            ..Default::default()
        },
    );
    let cache = tempfile::tempdir().unwrap();
    let (cancel, cancelled) = tokio::sync::watch::channel(false);
    let mut cfg = config(&paced, cache.path());
    cfg.cancel = Some(cancelled);
    let hub = Hub::new(cfg).unwrap();
    let (r, files) = pinned_all(&hub, TINY, "main").await;
    let shard: Vec<RemoteFile> = files.into_iter().filter(|f| f.path == SHARD).collect();
    let events = Events::default();
    let (result, since_cancel) = tokio::join!(hub.fetch(&r, &shard, &events), async {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        cancel.send(true).unwrap();
        Instant::now()
    });
    let took = since_cancel.elapsed();
    assert!(
        matches!(result, Err(FetchError::Cancelled { .. })),
        "{result:?}"
    );
    // The shard (12 MB at 1 MB/s) had about 10 s left when the cancel came: the bound tells a
    // fetch that stops at the cancel from one that runs on, with room for a loaded host.
    assert!(
        took < Duration::from_secs(3),
        "stopped {took:?} after the cancel"
    );
    // Everything that arrived (the last progress event says how much) is in the partial file.
    let partial = std::fs::read_dir(blobs_dir(cache.path(), TINY))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "incomplete"))
        .expect("a .incomplete file");
    let kept = std::fs::read(&partial).unwrap();
    let last = events.all().into_iter().rev().find_map(|e| match e {
        FetchEvent::Progress { file_done, .. } => Some(file_done),
        _ => None,
    });
    assert_eq!(last, Some(kept.len() as u64));
    assert!(kept.len() >= 1_000_000, "{} bytes kept", kept.len());
    assert!(tree.file(TINY, SHARD).starts_with(&kept));
    // The next fetch (an unpaced hub over the same tree) asks for the rest only.
    let server = start(&tree, false);
    let hub = Hub::new(config(&server, cache.path())).unwrap();
    let report = hub.fetch(&r, &shard, &NoProgress).await.unwrap();
    assert_eq!(
        std::fs::read(report.snapshot_dir.join(SHARD)).unwrap(),
        tree.file(TINY, SHARD)
    );
    let gets = gets_of(&server, SHARD);
    assert_eq!(gets.len(), 1, "{gets:?}");
    assert_eq!(gets[0].range_start, Some(kept.len() as u64));
    assert_eq!(report.transferred, shard[0].size - kept.len() as u64);
}

#[tokio::test]
async fn every_transfer_cut_at_half_still_completes_by_resuming() {
    let tree = make_tree();
    let server = start(&tree, false);
    let cache = tempfile::tempdir().unwrap();
    let hub = Hub::new(config(&server, cache.path())).unwrap();
    let (r, files) = pinned_all(&hub, TINY, "main").await;
    server.clear_faults();
    for f in &files {
        // Persistent: every response for the file is cut after half the file's size.
        server.add_fault(FaultRule::file(
            f.path.clone(),
            Fault::CutAfter { bytes: f.size / 2 },
        ));
    }
    let report = hub.fetch(&r, &files, &NoProgress).await.unwrap();
    assert_eq!(read_tree(&report.snapshot_dir), tree.files[TINY]);
    for f in files.iter().filter(|f| f.size > 1000) {
        let gets = gets_of(&server, &f.path);
        let served: u64 = gets.iter().map(|g| g.body_bytes).sum();
        assert!(gets.len() >= 2, "{}: {gets:?}", f.path);
        assert!(
            (served - f.size) * 100 <= f.size,
            "{}: served {served} for {} bytes",
            f.path,
            f.size
        );
    }
}

#[tokio::test]
async fn empty_files_and_unusual_names_round_trip() {
    let tree = make_tree();
    let server = start(&tree, false);
    let cache = tempfile::tempdir().unwrap();
    let hub = Hub::new(config(&server, cache.path())).unwrap();
    let report = hub
        .fetch_repo(EDGE, "main", &[], &NoProgress)
        .await
        .unwrap();
    assert_eq!(read_tree(&report.snapshot_dir), tree.files[EDGE]);
    assert!(
        verify_snapshot(hub.cache(), EDGE, "main", None)
            .unwrap()
            .is_ok()
    );
    let again = hub
        .fetch_repo(EDGE, "main", &["*.txt".into()], &NoProgress)
        .await
        .unwrap();
    assert_eq!(again.files.len(), 1);
    assert_eq!(again.files[0].outcome, FileOutcome::AlreadyVerified);
}

#[tokio::test]
async fn bytes_corrupted_in_transit_are_caught_and_fetched_again() {
    let tree = make_tree();
    let server = start(&tree, false);
    let cache = tempfile::tempdir().unwrap();
    let hub = Hub::new(config(&server, cache.path())).unwrap();
    let (r, files) = pinned_all(&hub, TINY, "main").await;
    let pick: Vec<RemoteFile> = files
        .into_iter()
        .filter(|f| f.path == SHARD || f.path == "README.md")
        .collect();
    // Once each: the sha256 (shard) and git-sha1 (small file) checks catch it, a re-fetch heals it.
    server.set_fault(FaultRule::file(SHARD, Fault::FlipByte { offset: 7_000_000 }).times(1));
    server.add_fault(FaultRule::file("README.md", Fault::FlipByte { offset: 2 }).times(1));
    let events = Events::default();
    let report = hub.fetch(&r, &pick, &events).await.unwrap();
    for f in &pick {
        assert_eq!(
            std::fs::read(report.snapshot_dir.join(&f.path)).unwrap(),
            tree.file(TINY, &f.path)
        );
        assert_eq!(gets_of(&server, &f.path).len(), 2, "{}", f.path);
    }
    let reasons: Vec<String> = events
        .all()
        .into_iter()
        .filter_map(|e| match e {
            FetchEvent::Retrying { reason, .. } => Some(reason),
            _ => None,
        })
        .collect();
    assert!(reasons.iter().any(|r| r.contains("sha256")), "{reasons:?}");
    assert!(
        reasons.iter().any(|r| r.contains("git-sha1")),
        "{reasons:?}"
    );

    // Always corrupt: the fetch fails with a verification error and leaves no final blob.
    let cache2 = tempfile::tempdir().unwrap();
    let hub2 = Hub::new(config(&server, cache2.path())).unwrap();
    server.set_fault(FaultRule::file(SHARD, Fault::FlipByte { offset: 100 }));
    let only_shard: Vec<RemoteFile> = pick.into_iter().filter(|f| f.path == SHARD).collect();
    let err = hub2.fetch(&r, &only_shard, &NoProgress).await.unwrap_err();
    assert!(matches!(err, FetchError::Verify { .. }), "{err:?}");
    assert!(err.to_string().contains(SHARD));
    let blobs = blobs_dir(cache2.path(), TINY);
    assert!(!blobs.join(sha256_hex(tree.file(TINY, SHARD))).exists());
}

#[tokio::test]
async fn a_private_repo_is_not_found_without_its_token() {
    let tree = make_tree();
    let server = start(&tree, false);
    let cache = tempfile::tempdir().unwrap();
    let hub = Hub::new(config(&server, cache.path())).unwrap();
    let err = hub.resolve(PRIVATE, "main").await.unwrap_err();
    assert!(matches!(err, HubError::RepoNotFound { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains(PRIVATE) && msg.contains("private") && msg.contains("HF_TOKEN"),
        "{msg}"
    );

    let mut cfg = config(&server, cache.path());
    cfg.token = Some(HfToken::new(GATED_TOKEN)); // a valid token, but not for this repo
    let err = Hub::new(cfg)
        .unwrap()
        .resolve(PRIVATE, "main")
        .await
        .unwrap_err();
    assert!(matches!(err, HubError::RepoNotFound { .. }), "{err:?}");
    assert!(!format!("{err} {err:?}").contains(GATED_TOKEN));

    let mut cfg = config(&server, cache.path());
    cfg.token = Some(HfToken::new(PRIVATE_TOKEN));
    let report = Hub::new(cfg)
        .unwrap()
        .fetch_repo(PRIVATE, "main", &[], &NoProgress)
        .await
        .unwrap();
    assert_eq!(read_tree(&report.snapshot_dir), tree.files[PRIVATE]);
}

/// The FetchCheckpoint step spawns these futures on a multi-thread runtime: they must be `Send`.
#[allow(dead_code)]
fn hub_futures_are_send(hub: &Hub, r: &spark_deploy_core::hub::ResolvedRepo, files: &[RemoteFile]) {
    fn send<T: Send>(_: T) {}
    send(hub.resolve(TINY, "main"));
    send(hub.list_files(r));
    send(hub.fetch(r, files, &NoProgress));
    send(hub.fetch_repo(TINY, "main", &[], &NoProgress));
    send(hub.read_tensors(r, SHARD, &[BIAS_A]));
    fn sync<T: Send + Sync>(_: &T) {}
    sync(hub);
}
