//! The recipe's `PREPARE` and `DRY_RUN` on the testbed, for real:
//!
//! - `DRY_RUN`: the plan with what read-only checks detected (both fabric addresses, though the
//!   config gives neither), and nothing changed — no download from the hub, no container, no
//!   directory created;
//! - `PREPARE=0` on empty caches is refused at FetchCheckpoint with no download;
//!   `spark-deploy prepare` still prepares; then `PREPARE=0 up` serves without downloading,
//!   building, shipping or imaging anything;
//! - a flipped data byte in a rank file passes `PREPARE=auto`'s index check and is found and
//!   rebuilt by `PREPARE=1`, which compares every byte with the checkpoint;
//! - `PREPARE=0` with the token map gone fails naming it, and starts nothing;
//! - `NFS_VOLUME=<absolute path>`: local mode serves from the worker's own tree, bind-mounted
//!   read-only; a tree without the checkpoint is refused naming the worker and the path.

// An integration test: a failed unwrap or expect is the test failure, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use spark_deploy_core::config::{PreparePolicy, ValidatedConfig, validate};
use spark_deploy_core::event::{Event, Recorder};
use spark_deploy_core::layout::NodeLayout;
use spark_deploy_core::plan::{Plan, Step, StepKind};
use spark_deploy_core::run::{Context, RunError};
use spark_deploy_core::steps::{BuildRankCache, FetchCheckpoint};
use spark_deploy_testbed::cluster::TestbedInfo;
use spark_deploy_testbed::hub_server::HubServer;

use common::testbed::{R, any_rank_container, on_testbed_removing_ranks, steps};

fn with(
    config: &spark_deploy_core::config::DeploymentConfig,
    p: PreparePolicy,
    home: &Path,
) -> R<ValidatedConfig> {
    let mut c = config.clone();
    c.lifecycle.prepare = p;
    Ok(validate(c, home)?)
}

async fn run(plan: &Plan, v: &ValidatedConfig) -> (Result<(), RunError>, Vec<Event>) {
    let rec = Recorder::default();
    let r = plan
        .run(&Context::new(v.clone(), Arc::new(rec.clone())))
        .await
        .map(|_| ());
    (r, rec.events())
}

fn logged(ev: &[Event], needle: &str) -> bool {
    ev.iter()
        .any(|e| matches!(e, Event::Log { line, .. } if line.contains(needle)))
}

fn rank_file(v: &ValidatedConfig, rank: usize) -> R<PathBuf> {
    let dir = Path::new(&NodeLayout::of(v, &v.config().nodes[0]).inputs_dir).join("rank-cache");
    for e in std::fs::read_dir(&dir)? {
        let p = e?.path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with(&format!("rank{rank}")) && name.ends_with(".bin") {
            return Ok(p);
        }
    }
    Err(format!("no rank {rank} file in {}", dir.display()).into())
}

/// No file was downloaded from the hub (metadata — a revision, a listing — may be read: the
/// memory budget is decided on the checkpoint's real size).
fn nothing_downloaded(hub: &HubServer, when: &str) {
    let r: Vec<_> = hub
        .requests()
        .into_iter()
        .filter(|r| r.path.contains("/resolve/"))
        .collect();
    assert!(r.is_empty(), "{when}: files were downloaded {r:?}");
}

async fn scenario(info: &TestbedInfo, home: &Path) -> R<()> {
    let (hub, mut config) = spark_deploy_testbed::demo::prepare(info, home).await?;
    // The recipe's empty FABRIC_PEER: both fabric addresses are left to detection.
    for n in &mut config.nodes {
        n.fabric_addr = None;
    }
    // A data directory that does not exist yet on the worker: nothing may create it.
    let fresh = format!("{}/dry-run-data", info.state_dir.display());
    config.nodes[1].data_dir.clone_from(&fresh);

    // DRY_RUN: the detected addresses fill the plan; nothing changes.
    let auto = with(&config, PreparePolicy::Auto, home)?;
    hub.clear_requests();
    let ctx = Context::new(auto.clone(), Arc::new(Recorder::default()));
    let shown = Plan::standard(&auto).dry_run(&ctx).await;
    let json = shown.plan.to_json();
    for addr in [info.head_fabric_addr, info.worker().fabric_addr] {
        assert!(
            json.contains(&addr.to_string()),
            "{addr} not in the dry run's plan:\n{json}"
        );
    }
    assert!(shown.preflight.is_some(), "the dry run shows the checks");
    nothing_downloaded(&hub, "dry run");
    assert!(!any_rank_container()?, "the dry run started a container");
    let (code, _) = spark_deploy_testbed::cluster::worker::docker_exec(
        &info.head_docker()?,
        &info.worker().container,
        &["test", "-e", &fresh],
    )
    .await?;
    assert_ne!(code, 0, "the dry run created {fresh} on the worker");
    config.nodes[1].data_dir = spark_deploy_testbed::deployment::deployment_config(info).nodes[1]
        .data_dir
        .clone();

    // PREPARE=0 on empty caches: refused at the fetch, nothing downloaded.
    let never = with(&config, PreparePolicy::Never, home)?;
    hub.clear_requests();
    let (r, _) = run(&Plan::standard(&never), &never).await;
    let e = r.expect_err("PREPARE=0 with nothing cached");
    assert_eq!(e.failure.step, StepKind::FetchCheckpoint, "{e}");
    let remedy = e.failure.remedy.clone().unwrap_or_default();
    assert!(
        remedy.contains("PREPARE=0") && remedy.contains("spark-deploy prepare"),
        "{remedy}"
    );
    nothing_downloaded(&hub, "PREPARE=0");
    assert!(!any_rank_container()?);

    // `spark-deploy prepare` prepares even under PREPARE=0 (asked for by name).
    let (r, ev) = run(&Plan::prepare(&never), &never).await;
    r.map_err(|e| format!("prepare: {e}"))?;
    assert!(
        steps(&ev).contains(&(StepKind::BuildRankCache, "ran")),
        "{:?}",
        steps(&ev)
    );

    // PREPARE=0 up: nothing downloaded, built, shipped or imaged; it serves.
    hub.clear_requests();
    let (r, ev) = run(&Plan::standard(&never), &never).await;
    r.map_err(|e| format!("PREPARE=0 up: {e}"))?;
    let s = steps(&ev);
    for (kind, want) in [
        (StepKind::BuildRankCache, "skipped"),
        (StepKind::ConfigureWorkerStorage, "skipped"),
        (StepKind::BuildImage, "skipped"),
        (StepKind::LaunchRank, "ran"),
        (StepKind::Smoke, "ran"),
    ] {
        assert!(s.contains(&(kind, want)), "{kind:?} {want}: {s:?}");
    }
    assert!(logged(&ev, "PREPARE=0: nothing is downloaded"));
    nothing_downloaded(&hub, "PREPARE=0 up");
    run(&Plan::teardown(&never), &never).await.0?;

    // A flipped data byte in rank 1's file. PREPARE=auto: the file changed since its last full
    // check (its stamp moved), so every block is compared with the CRC-32 its build recorded, the
    // flip is found and the file rebuilt. PREPARE=1 compares every byte with the checkpoint.
    let file = rank_file(&auto, 1)?;
    let good = std::fs::read(&file)?;
    let flip = |file: &Path| -> R<()> {
        let mut bad = good.clone();
        let at = bad.len() / 2;
        bad[at] ^= 0x40;
        std::fs::write(file, &bad)?;
        Ok(())
    };
    let inputs_only = |v: &ValidatedConfig| {
        Plan::from_steps(
            v,
            vec![
                Step::FetchCheckpoint(FetchCheckpoint::new(v)),
                Step::BuildRankCache(BuildRankCache::new(Plan::standard(v).engine().as_ref(), v)),
            ],
        )
    };
    for (v, name, why) in [
        (&auto, "PREPARE=auto", "CRC-32"),
        (
            &with(&config, PreparePolicy::Always, home)?,
            "PREPARE=1",
            "does not verify",
        ),
    ] {
        flip(&file)?;
        let (r, ev) = run(&inputs_only(v), v).await;
        r?;
        assert!(
            steps(&ev).contains(&(StepKind::BuildRankCache, "ran")),
            "{name}: {:?}",
            steps(&ev)
        );
        assert!(logged(&ev, why), "{name} says why it rebuilt");
        assert!(
            std::fs::read(&rank_file(v, 1)?)? == good,
            "{name} rebuilt the genuine bytes"
        );
    }

    // PREPARE=0 with the token map gone: named, nothing started.
    let tm = Path::new(&NodeLayout::of(&never, &never.config().nodes[0]).inputs_dir)
        .join(spark_deploy_core::engine::tensorfold::TOKEN_MAP_FILE);
    let kept = std::fs::read(&tm).map_err(|e| format!("{}: {e}", tm.display()))?;
    std::fs::remove_file(&tm)?;
    let (r, _) = run(&Plan::standard(&never), &never).await;
    std::fs::write(&tm, kept)?;
    let e = r.expect_err("PREPARE=0 without the token map");
    assert_eq!(e.failure.step, StepKind::BuildRankCache, "{e}");
    assert!(
        e.to_string().contains("token map") && e.to_string().contains("PREPARE=0"),
        "{e}"
    );
    assert!(!any_rank_container()?);

    // NFS_VOLUME=<absolute path>: the worker's own tree (here the one copy mode filled) is the
    // rank's HF cache, bind-mounted read-only; nothing of the checkpoint is copied.
    let tree = NodeLayout::of(&auto, &auto.config().nodes[1]).hf_cache;
    let local = |t: &str| {
        let mut c = config.clone();
        c.deployment.worker_storage = spark_deploy_core::config::WorkerStorage::Local;
        c.storage.worker_tree = t.to_owned();
        validate(c, home)
    };
    let v = local(&tree)?;
    let (r, ev) = run(&Plan::standard(&v), &v).await;
    r.map_err(|e| format!("local mode up: {e}"))?;
    assert!(
        logged(&ev, "holds config.json, tokenizer.json"),
        "the tree was checked"
    );
    let mounts = std::process::Command::new("docker")
        .args([
            "inspect",
            "-f",
            "{{range .Mounts}}{{.Type}}:{{.Source}}:{{.RW}} {{end}}",
            &spark_deploy_core::container::rank_container_name(&v.config().deployment.name, 1),
        ])
        .output()?;
    let mounts = String::from_utf8_lossy(&mounts.stdout).into_owned();
    assert!(mounts.contains(&format!("bind:{tree}:false")), "{mounts}");
    run(&Plan::teardown(&v), &v).await.0?;
    let v = local("/nonexistent-tree")?;
    let (r, _) = run(&Plan::standard(&v), &v).await;
    let e = r.expect_err("a tree without the checkpoint");
    assert_eq!(e.failure.step, StepKind::ConfigureWorkerStorage, "{e}");
    assert!(
        e.to_string().contains("/nonexistent-tree")
            && e.failure.node.as_deref() == Some("worker-1"),
        "{e} {:?}",
        e.failure.node
    );
    assert!(!any_rank_container()?);
    drop(hub);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn testbed_recipe_knobs_prepare_dry_run_fabric_peer_and_local_tree() {
    on_testbed_removing_ranks(|info, home| async move { scenario(&info, &home).await }).await;
}
