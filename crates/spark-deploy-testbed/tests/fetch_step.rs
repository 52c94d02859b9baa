//! The FetchCheckpoint step against the testbed hub on loopback: the gated ABLIT overlay refuses
//! without a token (naming the repo, never the token) and lands in its own cache with it;
//! `verify-only` checks the cache with the hub stopped and finds a flipped byte (the Hub port's
//! own tests show a normal run re-fetching a corrupt blob); a normal run with the hub stopped
//! stands on the pinned cache while it verifies, and fails when it does not.

// An integration test: a failed unwrap or expect is the test failure, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::Arc;

use spark_deploy_core::config::{DeploymentConfig, NodeConfig, validate};
use spark_deploy_core::event::Recorder;
use spark_deploy_core::plan::{Plan, Step};
use spark_deploy_core::run::Context;
use spark_deploy_core::run::StepStatus;
use spark_deploy_core::secret::Secret;
use spark_deploy_core::steps::FetchCheckpoint;
use spark_deploy_testbed::demo::{KIT, MODEL, ORIGINAL, hub_tree};
use spark_deploy_testbed::hub_server::{HubOptions, HubServer};

const OVERLAY: &str = "testbed/dsv41-ablit";
const TOKEN: &str = "hf_ablit_gated_token_4242";

fn fetch_only(v: &spark_deploy_core::config::ValidatedConfig, verify_only: bool) -> Plan {
    let f = FetchCheckpoint::new(v);
    Plan::from_steps(
        v,
        vec![Step::FetchCheckpoint(if verify_only {
            f.verify_only()
        } else {
            f
        })],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ablit_overlay_gated_and_separate_and_verify_only_catches_a_flipped_byte() {
    let d = tempfile::tempdir().unwrap();
    let repos = d.path().join("repos");
    hub_tree(&repos, 9).unwrap();
    let overlay = repos.join(OVERLAY);
    std::fs::create_dir_all(&overlay).unwrap();
    let shard = std::fs::read_dir(repos.join(MODEL))
        .unwrap()
        .filter_map(Result::ok)
        .find(|e| e.file_name().to_string_lossy().ends_with(".safetensors"))
        .unwrap();
    std::fs::copy(shard.path(), overlay.join("overlay.safetensors")).unwrap();
    std::fs::write(overlay.join("config.json"), b"{\"overlay\": true}").unwrap();
    let hub = HubServer::start(
        &repos,
        "127.0.0.1:0".parse().unwrap(),
        HubOptions {
            gated: HashMap::from([(OVERLAY.to_owned(), TOKEN.to_owned())]),
            ..HubOptions::default()
        },
    )
    .unwrap();

    let mut c = DeploymentConfig::default();
    c.deployment.state_dir = d.path().join("state").display().to_string();
    c.hub.endpoint = hub.endpoint();
    c.hub.cache = d.path().join("hf").display().to_string();
    c.hub.ablit_cache = d.path().join("hf-ablit").display().to_string();
    c.hub.token_file = d.path().join("no-token").display().to_string();
    c.model.id = MODEL.into();
    c.model.revision = hub.commit(MODEL).unwrap();
    c.model.engram_repo = ORIGINAL.into();
    c.model.engram_revision = hub.commit(ORIGINAL).unwrap();
    c.model.engram_files = vec!["*.safetensors".into()];
    c.model.kit_repo = KIT.into();
    c.model.kit_revision = hub.commit(KIT).unwrap();
    c.model.ablit = true;
    c.model.ablit_id = OVERLAY.into();
    c.model.ablit_revision = hub.commit(OVERLAY).unwrap();
    c.nodes = vec![
        NodeConfig::head(),
        NodeConfig::worker("worker-1", "root@127.0.0.1"),
    ];

    // Without a token: the overlay is refused with the access message; the token never shows.
    let v = validate(c.clone(), d.path()).unwrap();
    let err = fetch_only(&v, false)
        .run(&Context::new(v.clone(), Arc::new(Recorder::default())))
        .await
        .expect_err("gated");
    let msg = format!("{err} {:?}", err.failure.remedy);
    assert!(msg.contains(OVERLAY), "{msg}");
    assert!(msg.to_lowercase().contains("token"), "{msg}");

    // With the token: the overlay lands in the ABLIT cache only.
    c.hub.token = Some(Secret::new(TOKEN));
    let v = validate(c, d.path()).unwrap();
    let rec = Recorder::default();
    fetch_only(&v, false)
        .run(&Context::new(v.clone(), Arc::new(rec.clone())))
        .await
        .unwrap();
    let folder = "models--testbed--dsv41-ablit";
    assert!(
        d.path().join("hf-ablit/hub").join(folder).is_dir(),
        "overlay in the ABLIT cache"
    );
    assert!(
        !d.path().join("hf/hub").join(folder).exists(),
        "never in the genuine cache"
    );
    for e in rec.events() {
        assert!(
            !format!("{e:?}").contains(TOKEN),
            "token leaked into an event"
        );
    }

    // verify-only: passes with no network (the hub is stopped), finds a flipped byte.
    drop(hub);
    let report = fetch_only(&v, true)
        .run(&Context::new(v.clone(), Arc::new(Recorder::default())))
        .await
        .unwrap();
    assert_eq!(report.steps[0].status, StepStatus::Skipped, "{report:?}");
    // A normal run with the Hub unreachable stands on the pinned, verified cache.
    let rec = Recorder::default();
    let report = fetch_only(&v, false)
        .run(&Context::new(v.clone(), Arc::new(rec.clone())))
        .await
        .unwrap();
    assert_eq!(report.steps[0].status, StepStatus::Skipped, "{report:?}");
    let detail = report.steps[0].detail.clone().unwrap_or_default();
    assert!(detail.contains("Hub unreachable"), "{detail}");
    let blobs = d.path().join("hf/hub/models--testbed--dsv41-exl3/blobs");
    let blob = std::fs::read_dir(&blobs)
        .unwrap()
        .filter_map(Result::ok)
        .max_by_key(|e| e.metadata().unwrap().len())
        .unwrap()
        .path();
    let mut bytes = std::fs::read(&blob).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x5a;
    std::fs::write(&blob, &bytes).unwrap();
    let err = fetch_only(&v, true)
        .run(&Context::new(v.clone(), Arc::new(Recorder::default())))
        .await
        .expect_err("corrupt");
    assert!(err.to_string().contains("testbed/dsv41-exl3"), "{err}");
    // ... but not on a cache that no longer verifies: the Hub's error stands.
    let err = fetch_only(&v, false)
        .run(&Context::new(v.clone(), Arc::new(Recorder::default())))
        .await
        .expect_err("unreachable hub and a corrupt cache");
    assert!(err.to_string().contains("failed"), "{err}");
}

/// The kit of this repo set does not publish `vision/gate_bias_vl.safetensors`, and the original
/// model's second shard is not among the Engram files: FetchCheckpoint reads the `bias_vl` tensors
/// by byte range (never the whole shard) and writes the same file the kit would have carried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bias_vl_is_fetched_by_byte_range_when_the_kit_lacks_it() {
    let d = tempfile::tempdir().unwrap();
    let repos = d.path().join("repos");
    hub_tree(&repos, 11).unwrap();
    let kit_bias = repos.join(KIT).join("kit/vision/gate_bias_vl.safetensors");
    let reference = std::fs::read(&kit_bias).unwrap();
    std::fs::remove_file(&kit_bias).unwrap();
    let hub = HubServer::start(
        &repos,
        "127.0.0.1:0".parse().unwrap(),
        HubOptions::default(),
    )
    .unwrap();
    let mut c = DeploymentConfig::default();
    c.deployment.state_dir = d.path().join("state").display().to_string();
    c.hub.endpoint = hub.endpoint();
    c.hub.cache = d.path().join("hf").display().to_string();
    c.hub.token_file = d.path().join("no-token").display().to_string();
    c.model.id = MODEL.into();
    c.model.revision = hub.commit(MODEL).unwrap();
    c.model.engram_repo = ORIGINAL.into();
    c.model.engram_revision = hub.commit(ORIGINAL).unwrap();
    // Only the first original shard is an "Engram file"; the second is read by range only.
    c.model.engram_files = vec!["model-00001-of-00002.safetensors".into()];
    c.model.kit_repo = KIT.into();
    c.model.kit_revision = hub.commit(KIT).unwrap();
    let mut head = NodeConfig::head();
    head.data_dir = d.path().join("data").display().to_string();
    c.nodes = vec![head, NodeConfig::worker("worker-1", "root@127.0.0.1")];
    let v = validate(c, d.path()).unwrap();
    let rec = Recorder::default();
    fetch_only(&v, false)
        .run(&Context::new(v.clone(), Arc::new(rec.clone())))
        .await
        .unwrap();
    let out = spark_deploy_core::layout::NodeLayout::of(&v, &v.config().nodes[0]).bias_vl_file;
    assert_eq!(
        std::fs::read(&out).unwrap(),
        reference,
        "byte-identical to the kit's file"
    );
    let shard = "model-00002-of-00002.safetensors";
    let size = std::fs::metadata(repos.join(ORIGINAL).join(shard))
        .unwrap()
        .len();
    let gets: Vec<_> = hub
        .requests()
        .into_iter()
        .filter(|r| r.method == "GET" && r.path.ends_with(&format!("/{shard}")))
        .collect();
    assert!(!gets.is_empty());
    assert!(
        gets.iter().all(|r| r.range.is_some() && r.status == 206),
        "{gets:?}"
    );
    let served: u64 = gets.iter().map(|r| r.body_bytes).sum();
    // The header probe (a 64 KiB window, as for the Hub port) plus the tensors' own ranges: on
    // a real 5 GB shard that is ~0.001 %, here on a 0.3 MB test shard it is about a fifth.
    assert!(
        served <= 64 * 1024 + reference.len() as u64 && served < size,
        "served {served} of {size} bytes of {shard} for the bias_vl ranges"
    );
    #[allow(clippy::print_stderr)]
    {
        eprintln!("bias_vl: {served} bytes served of the {size}-byte shard {shard}");
    }
    // A re-run finds the file and reads nothing.
    hub.clear_requests();
    fetch_only(&v, false)
        .run(&Context::new(v.clone(), Arc::new(Recorder::default())))
        .await
        .unwrap();
    assert!(!hub.requests().iter().any(|r| r.path.ends_with(shard)));
}
