//! The real `hf-hub` 1.0 client downloads from the testbed hub (loopback only).

// An integration test: a failed unwrap or expect is the test failure, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use futures::StreamExt as _;
use hf_hub::HFClient;

fn client(
    server: &spark_deploy_testbed::hub_server::HubServer,
    cache: &std::path::Path,
    token: Option<&str>,
) -> HFClient {
    let mut b = HFClient::builder()
        .endpoint(server.endpoint())
        .cache_dir(cache)
        .retry_max_attempts(1);
    if let Some(t) = token {
        b = b.token(t);
    }
    b.build().unwrap()
}

#[tokio::test]
async fn hf_hub_downloads_files_and_snapshots_byte_identically() {
    for redirect in [false, true] {
        let tree = make_tree();
        let server = start(&tree, redirect);
        let cache = tempfile::tempdir().unwrap();
        let c = client(&server, cache.path(), None);
        let repo = c.model("testorg", "tiny");
        let sha = server.commit(TINY).unwrap();

        let info = repo
            .info()
            .revision("main".to_owned())
            .send()
            .await
            .unwrap();
        assert_eq!(info.sha.as_deref(), Some(sha.as_str()));
        assert_eq!(info.siblings.unwrap().len(), tree.files[TINY].len());

        // One file by branch name: written under snapshots/<sha>, refs/main recorded.
        let p = repo
            .download_file()
            .filename("nested/deeper/extra.bin".to_owned())
            .revision("main".to_owned())
            .send()
            .await
            .unwrap();
        assert_eq!(
            std::fs::read(&p).unwrap(),
            tree.file(TINY, "nested/deeper/extra.bin")
        );
        assert!(
            p.starts_with(
                cache
                    .path()
                    .join("models--testorg--tiny/snapshots")
                    .join(&sha)
            )
        );
        assert_eq!(
            std::fs::read_to_string(cache.path().join("models--testorg--tiny/refs/main")).unwrap(),
            sha
        );

        // Again by branch: hf-hub revalidates its cached ETag with If-None-Match and gets a 304.
        let again = repo
            .download_file()
            .filename("nested/deeper/extra.bin".to_owned())
            .revision("main".to_owned())
            .send()
            .await
            .unwrap();
        assert_eq!(again, p);
        assert!(
            server.requests().iter().any(|q| q.status == 304),
            "{:?}",
            server.requests()
        );

        // The whole snapshot at the pinned commit.
        let dir = repo
            .snapshot_download()
            .revision(sha.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(read_tree(&dir), tree.files[TINY], "redirect={redirect}");
        let link = std::fs::read_link(dir.join(SHARD)).unwrap();
        assert_eq!(
            link.file_name().unwrap().to_string_lossy(),
            sha256_hex(tree.file(TINY, SHARD))
        );

        // File metadata: ETag = sha256 for LFS files, size and commit from headers.
        let meta = repo
            .get_file_metadata()
            .filepath(SHARD.to_owned())
            .revision(&sha)
            .send()
            .await
            .unwrap();
        assert_eq!(meta.etag, sha256_hex(tree.file(TINY, SHARD)));
        assert_eq!(meta.commit_hash, sha);
        assert_eq!(meta.file_size, tree.file(TINY, SHARD).len() as u64);

        // A byte-range stream.
        let (_, mut stream) = repo
            .download_file_stream()
            .filename(SHARD.to_owned())
            .revision(sha.clone())
            .range(1000..5000)
            .send()
            .await
            .unwrap();
        let mut got = Vec::new();
        while let Some(chunk) = stream.next().await {
            got.extend_from_slice(&chunk.unwrap());
        }
        assert_eq!(got, &tree.file(TINY, SHARD)[1000..5000]);
    }
}

#[tokio::test]
async fn hf_hub_is_refused_a_gated_repo_without_the_token() {
    let tree = make_tree();
    let server = start(&tree, false);
    let cache = tempfile::tempdir().unwrap();
    let sha = server.commit(GATED).unwrap();

    let anon = client(&server, cache.path(), None).model("testorg", "gated");
    let err = anon
        .download_file()
        .filename("config.json".to_owned())
        .revision(sha.clone())
        .send()
        .await
        .unwrap_err();
    match &err {
        hf_hub::HFError::AuthRequired { context } => {
            assert_eq!(context.error_code.as_deref(), Some("GatedRepo"));
        }
        other => panic!("expected AuthRequired, got {other:?}"),
    }

    let wrong = client(&server, cache.path(), Some("hf_wrong")).model("testorg", "gated");
    let err = wrong
        .download_file()
        .filename("config.json".to_owned())
        .revision(sha.clone())
        .send()
        .await
        .unwrap_err();
    assert!(matches!(err, hf_hub::HFError::Forbidden { .. }), "{err:?}");

    let ok = client(&server, cache.path(), Some(GATED_TOKEN)).model("testorg", "gated");
    let dir = ok.snapshot_download().revision(sha).send().await.unwrap();
    assert_eq!(read_tree(&dir), tree.files[GATED]);
}
