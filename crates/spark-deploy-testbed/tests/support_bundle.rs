//! The support bundle of a real deployment on the testbed, deployed with an HF token and an API
//! key set: every member's bytes are scanned for both secrets (none found), and the expected
//! members are there — with the pair serving (current logs of both ranks) and after `down`
//! (the saved logs of both nodes).

// An integration test: a failed unwrap or expect is the test failure, with its location; the
// measured lines go to stderr (shown with --no-capture).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::collections::BTreeMap;
use std::io::Read as _;
use std::path::Path;
use std::sync::Arc;

use spark_deploy_core::bundle::{self, BundleReport};
use spark_deploy_core::config::validate;
use spark_deploy_core::event::EventSink;
use spark_deploy_core::lifecycle::run_log::EventLog;
use spark_deploy_core::plan::{Plan, Verb};
use spark_deploy_core::run::Context;
use spark_deploy_core::secret::Secret;

mod common;

use common::testbed::{R, on_testbed};

const HF_TOKEN: &str = "hf_bundle_test_token_0b5e11a7c9";
const API_KEY: &str = "sk-bundle-test-key-7f3d2e91aa";

/// Every member of the archive by its path below the top directory.
fn members(report: &BundleReport) -> R<BTreeMap<String, Vec<u8>>> {
    let mut out = BTreeMap::new();
    let f = std::fs::File::open(&report.path)?;
    let mut ar = tar::Archive::new(flate2::read::GzDecoder::new(f));
    for e in ar.entries()? {
        let mut e = e?;
        let name = e.path()?.display().to_string();
        let rel = name
            .strip_prefix(&format!("{}/", report.top))
            .ok_or_else(|| format!("{name} outside the top directory"))?
            .to_owned();
        let mut b = Vec::new();
        e.read_to_end(&mut b)?;
        out.insert(rel, b);
    }
    Ok(out)
}

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// Runs `plan` with its events and preflight report kept as the CLI keeps them.
async fn run_logged(v: &spark_deploy_core::config::ValidatedConfig, plan: &Plan) -> R<()> {
    let log = Arc::new(EventLog::create(Path::new(
        &v.config().deployment.state_dir,
    ))?);
    let sink: Arc<dyn EventSink> = log.clone();
    let ctx = Context::new(v.clone(), sink);
    let r = plan.run(&ctx).await;
    log.finish()?;
    bundle::keep_preflight(&ctx)?;
    r?;
    Ok(())
}

fn scan(report: &BundleReport, m: &BTreeMap<String, Vec<u8>>) {
    assert!(
        !Path::new(&format!("{}.partial", report.path.display())).exists(),
        "no partial file stays"
    );
    for (name, bytes) in m {
        assert!(!contains(bytes, HF_TOKEN), "{name} holds the HF token");
        assert!(!contains(bytes, API_KEY), "{name} holds the API key");
    }
    let index: serde_json::Value = serde_json::from_slice(&m["index.json"]).unwrap();
    assert_eq!(index["schema"], bundle::INDEX_SCHEMA);
    for node in ["head", "worker-1"] {
        for f in ["meminfo.txt", "ip-s-link.txt", "fabric-counters.txt"] {
            let name = format!("nodes/{node}/{f}");
            assert!(m.contains_key(&name), "{name} missing: {:?}", report.absent);
        }
        // The kernel log when the node lets us read it, else named as absent with why.
        for f in ["dmesg.txt", "nvrm.txt"] {
            let name = format!("nodes/{node}/{f}");
            assert!(
                m.contains_key(&name) || report.absent.iter().any(|a| a.name == name),
                "{name}: neither a member nor absent"
            );
        }
    }
    let mem = String::from_utf8_lossy(&m["nodes/worker-1/meminfo.txt"]);
    assert!(mem.contains("MemAvailable:"), "{mem}");
}

async fn scenario(
    info: spark_deploy_testbed::cluster::TestbedInfo,
    home: std::path::PathBuf,
) -> R<()> {
    let (hub, mut config) = spark_deploy_testbed::demo::prepare(&info, &home).await?;
    config.hub.token = Some(Secret::new(HF_TOKEN));
    config.serving.api_key = Some(Secret::new(API_KEY));
    let v = validate(config, &home)?;
    let state = Path::new(&v.config().deployment.state_dir).to_owned();
    let _ = std::fs::remove_file(&v.config().serving.api_key_file);
    run_logged(&v, &Plan::standard(&v)).await?;
    let key =
        spark_deploy_core::lifecycle::api_key::read(Path::new(&v.config().serving.api_key_file))?;
    assert_eq!(
        key.expose(),
        API_KEY,
        "the deployment serves with the key set"
    );

    // A heal's saved log that echoed both secrets (as an engine or a proxy might): scrubbed.
    let heal = state.join("watch/heals/20261201-101500");
    std::fs::create_dir_all(&heal)?;
    std::fs::write(
        heal.join("rank1.log"),
        format!("Authorization: Bearer {API_KEY}\nHF_TOKEN={HF_TOKEN}\n"),
    )?;
    std::fs::write(
        state.join("watch/samples.jsonl"),
        "{\"mem_available_gib\": [100.0, 99.0]}\n",
    )?;

    // 1. Serving: both ranks' current logs.
    let ctx = Context::new(
        v.clone(),
        Arc::new(spark_deploy_core::event::Recorder::default()),
    );
    let t = std::time::Instant::now();
    let out = state.join("bundles/serving.tar.gz");
    let r = bundle::write(&ctx, Some(&out)).await?;
    eprintln!(
        "bundle (serving): {} members, {} bytes, {:.2} s; absent: {:?}",
        r.members.len(),
        std::fs::metadata(&r.path)?.len(),
        t.elapsed().as_secs_f64(),
        r.absent
    );
    let m = members(&r)?;
    scan(&r, &m);
    for name in [
        "index.json",
        "config.toml",
        "plan.json",
        "plan.txt",
        "status.json",
        "state/launched.json",
        "state/preflight.json",
        "state/startup.json",
        "state/last-run.events.jsonl",
        "watch/samples.jsonl",
        "watch/heals/20261201-101500/rank1.log",
        "ranks/rank0.log",
        "ranks/rank1.log",
    ] {
        assert!(
            m.contains_key(name),
            "{name} missing; absent: {:?}",
            r.absent
        );
    }
    let heal_log = String::from_utf8_lossy(&m["watch/heals/20261201-101500/rank1.log"]);
    assert!(
        heal_log.contains("Bearer ***") && heal_log.contains("HF_TOKEN=***"),
        "{heal_log}"
    );
    let cfg = String::from_utf8_lossy(&m["config.toml"]);
    assert!(cfg.contains("name = \"sd-testbed\""), "{cfg}");
    let status: serde_json::Value = serde_json::from_slice(&m["status.json"])?;
    assert_eq!(status["overall"], "running", "{status}");
    let preflight: serde_json::Value = serde_json::from_slice(&m["state/preflight.json"])?;
    assert_eq!(
        preflight["facts"]["nodes"][1]["fabric_addr"], "198.18.0.2",
        "{preflight}"
    );
    let events = String::from_utf8_lossy(&m["state/last-run.events.jsonl"]);
    assert!(
        events.lines().count() > 5 && events.contains("\"smoke\""),
        "{events}"
    );
    assert!(!String::from_utf8_lossy(&m["ranks/rank1.log"]).is_empty());
    assert!(
        r.absent.iter().all(|a| !a.name.starts_with("ranks/")),
        "{:?}",
        r.absent
    );

    // 2. After `down`: no current logs, the saved logs of both nodes instead.
    run_logged(&v, &Plan::for_verb(&v, Verb::Down)).await?;
    let r = bundle::write(&ctx, None).await?;
    assert!(
        r.path.starts_with(state.join("bundles")),
        "{}",
        r.path.display()
    );
    let m = members(&r)?;
    scan(&r, &m);
    for (node, rank) in [("head", 0), ("worker-1", 1)] {
        assert!(
            m.keys()
                .any(|k| k.starts_with(&format!("nodes/{node}/saved-logs/"))
                    && k.ends_with(&format!("-sd-testbed-rank{rank}.log"))),
            "saved log of rank {rank} on {node}: {:?}",
            m.keys().collect::<Vec<_>>()
        );
        assert!(
            r.absent
                .iter()
                .any(|a| a.name == format!("ranks/rank{rank}.log")),
            "{:?}",
            r.absent
        );
    }
    let index: serde_json::Value = serde_json::from_slice(&m["index.json"])?;
    assert!(
        index["absent"]
            .to_string()
            .contains("no container sd-testbed-rank0"),
        "{index}"
    );
    drop(hub);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn testbed_support_bundle_holds_no_secret_and_every_expected_member() {
    on_testbed(|info, home| async move {
        let r = scenario(info, home).await;
        let _ = std::process::Command::new("sh")
            .args([
                "-c",
                "docker rm -f sd-testbed-rank0 sd-testbed-rank1 >/dev/null 2>&1",
            ])
            .status();
        r
    })
    .await;
}
