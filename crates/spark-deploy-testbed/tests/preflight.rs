//! Preflight on the running testbed, for real: the worker is checked over SSH, the head locally,
//! and each failing case is produced on the nodes themselves — not on built facts — and caught
//! with its remedy:
//!
//! - the peer reachable only over the management network (the testbed's second network),
//! - an MTU mismatch (the worker's fabric netdev set to 1400 inside its network namespace),
//! - `MemAvailable` below the floor (the floor set above this machine's memory),
//! - the API port in use on the head,
//! - worker SSH refused (wrong port) and an unknown host key (empty known_hosts),
//! - and, on the fixture inputs the testbed's GPU and RoCE checks read through the Exec port:
//!   clock caps that differ, a GID table without a RoCE v2 IPv4 entry, a second rail down.
//!
//! The unit tests of `preflight::decide` cover the same cases (and the disk need, which this
//! machine's disk cannot be made to fail honestly) on built facts.

// An integration test: a failed unwrap or expect is the test failure, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use spark_deploy_core::config::{DeploymentConfig, validate};
use spark_deploy_core::event::Recorder;
use spark_deploy_core::plan::{Plan, Step};
use spark_deploy_core::preflight::fixture::{Rail, TESTBED_DIR, write_tree};
use spark_deploy_core::preflight::report::{CheckResult, PreflightReport, Verdict};
use spark_deploy_core::run::Context;
use spark_deploy_core::steps::Preflight;
use spark_deploy_testbed::cluster::TestbedInfo;

mod common;

use common::testbed::R;

/// Runs Preflight alone on `config`; the table whether it passed or failed.
async fn preflight(config: &DeploymentConfig, home: &Path) -> R<(bool, PreflightReport)> {
    let v = validate(config.clone(), home)?;
    let ctx = Context::new(v.clone(), Arc::new(Recorder::default()));
    let passed = Plan::from_steps(&v, vec![Step::Preflight(Preflight::new(&v))])
        .run(&ctx)
        .await
        .is_ok();
    Ok((passed, ctx.preflight_report().ok_or("no preflight table")?))
}

fn row<'a>(t: &'a PreflightReport, check: &str, node: &str) -> R<&'a CheckResult> {
    Ok(t.results
        .iter()
        .find(|r| r.check == check && r.node == node)
        .ok_or_else(|| format!("no {check} row for {node}:\n{}", t.to_table()))?)
}

/// Asserts `check` on `node` failed and its remedy mentions `remedy`.
fn failed(t: &PreflightReport, check: &str, node: &str, remedy: &str) -> R<()> {
    let r = row(t, check, node)?;
    assert_eq!(
        r.verdict,
        Verdict::Fail,
        "{check} on {node}:\n{}",
        t.to_table()
    );
    let got = r.remedy.as_deref().unwrap_or("");
    assert!(
        got.contains(remedy),
        "{check} on {node}: remedy {got:?} lacks {remedy:?}"
    );
    Ok(())
}

fn sh(script: &str) -> R<String> {
    let o = std::process::Command::new("sh")
        .args(["-c", script])
        .output()?;
    if !o.status.success() {
        return Err(format!("{script}: {}", String::from_utf8_lossy(&o.stderr)).into());
    }
    Ok(String::from_utf8_lossy(&o.stdout).trim().to_owned())
}

/// Runs `ip ...` in the worker container's network namespace.
fn worker_ip(info: &TestbedInfo, args: &str) -> R<String> {
    let pid = sh(&format!(
        "docker inspect -f '{{{{.State.Pid}}}}' {}",
        info.workers[0].container
    ))?;
    sh(&format!("nsenter -t {pid} -n ip {args}"))
}

async fn scenario(info: &TestbedInfo, home: &Path) -> R<()> {
    let good = spark_deploy_testbed::deployment::deployment_config(info);
    spark_deploy_testbed::host_facts::install(&good, home).await?;

    // The healthy testbed passes, every check reported.
    let (passed, t) = preflight(&good, home).await?;
    assert!(passed, "{}", t.to_table());
    assert_eq!(row(&t, "ssh", "worker-1")?.verdict, Verdict::Ok);

    // Peer reachable only over the management network: the worker's "fabric" address is its
    // management one, so the head's route to it leaves from the management bridge.
    let mut c = good.clone();
    c.nodes[1].fabric_addr = Some(info.workers[0].management_addr);
    let (passed, t) = preflight(&c, home).await?;
    assert!(!passed);
    failed(
        &t,
        "fabric.addr",
        "head",
        "must be configured on the ConnectX-7 netdev",
    )?;

    // MTU mismatch: the worker's fabric netdev at 1400, the head's bridge at 1500.
    let route = worker_ip(info, &format!("-o -4 route get {}", info.head_fabric_addr))?;
    let dev = route
        .split_whitespace()
        .skip_while(|w| *w != "dev")
        .nth(1)
        .ok_or("worker fabric dev")?
        .to_owned();
    worker_ip(info, &format!("link set {dev} mtu 1400"))?;
    let result = preflight(&good, home).await;
    worker_ip(info, &format!("link set {dev} mtu 1500"))?;
    let (passed, t) = result?;
    assert!(!passed);
    failed(&t, "fabric.mtu", "all", "mtu 1500")?;

    // MemAvailable below a floor above this machine's memory.
    let mut c = good.clone();
    c.lifecycle.min_avail_gib = 128; // the largest valid floor; this machine has 24 GiB
    let (passed, t) = preflight(&c, home).await?;
    assert!(!passed);
    failed(&t, "memory.available", "head", "")?;
    failed(&t, "memory.available", "worker-1", "")?;

    // The API port in use on the head.
    let listener = std::net::TcpListener::bind(("0.0.0.0", good.serving.port))?;
    let (passed, t) = preflight(&good, home).await?;
    drop(listener);
    assert!(!passed);
    failed(&t, "port.api", "head", "serving.port")?;

    // Worker SSH refused, then an unknown host key.
    let mut c = good.clone();
    c.nodes[1].ssh_port = Some(1);
    let (passed, t) = preflight(&c, home).await?;
    assert!(!passed);
    let r = row(&t, "ssh", "worker-1")?;
    assert_eq!(r.verdict, Verdict::Fail);
    assert!(r.remedy.as_deref().unwrap_or("").contains("sshd"), "{r:?}");
    let empty = info.state_dir.join("empty_known_hosts");
    std::fs::write(&empty, "")?;
    let mut c = good.clone();
    c.nodes[1].known_hosts = empty.display().to_string();
    let (passed, t) = preflight(&c, home).await?;
    assert!(!passed);
    failed(&t, "ssh", "worker-1", "ssh-keyscan")?;

    // The fixture inputs, broken on the worker: preflight reads them through SSH like the real
    // nvidia-smi and /sys, and fails with the remedies a Spark owner would get.
    let facts = PathBuf::from(&good.nodes[1].data_dir).join(TESTBED_DIR);
    let clock = facts.join("nvidia-smi-q-clock.txt");
    let original = std::fs::read_to_string(&clock)?;
    std::fs::write(&clock, original.replace(": 1980 MHz", ": 1500 MHz"))?;
    let result = preflight(&good, home).await;
    std::fs::write(&clock, &original)?;
    let (passed, t) = result?;
    assert!(!passed);
    failed(&t, "gpu.clocks", "all", "nvidia-smi -lgc 1500,1500")?;
    assert!(
        row(&t, "gpu.clocks", "all")?
            .observed
            .starts_with("[testbed fixture ")
    );

    let worker_addr: Ipv4Addr = info.workers[0].fabric_addr;
    let mtu: u32 = worker_ip(info, &format!("-o link show {dev}"))?
        .split_whitespace()
        .skip_while(|w| *w != "mtu")
        .nth(1)
        .ok_or("mtu")?
        .parse()?;
    let rail = |hca, netdev, state, v2| Rail {
        hca,
        netdev,
        state,
        v2,
        mtu,
    };
    let rebuild = |rails: &[Rail<'_>]| -> R<()> {
        let _ = std::fs::remove_dir_all(facts.join("sys"));
        write_tree(&facts, worker_addr, rails)?;
        Ok(())
    };
    // A GID table without a RoCE v2 IPv4 entry.
    rebuild(&[rail("rocep1s0f1", &dev, "4: ACTIVE", false)])?;
    let (passed, t) = preflight(&good, home).await?;
    assert!(!passed);
    let r = row(&t, "fabric.roce", "worker-1")?;
    assert_eq!(r.verdict, Verdict::Fail, "{}", t.to_table());
    assert!(r.observed.starts_with("[testbed fixture "), "{r:?}");
    // A second rail down.
    rebuild(&[
        rail("rocep1s0f1", &dev, "4: ACTIVE", true),
        rail("roceP2p1s0f1", &dev, "1: DOWN", true),
    ])?;
    let (passed, t) = preflight(&good, home).await?;
    assert!(!passed);
    let r = row(&t, "fabric.roce", "worker-1")?;
    assert_eq!(r.verdict, Verdict::Fail, "{}", t.to_table());
    assert!(r.observed.contains("roceP2p1s0f1"), "{r:?}");
    rebuild(&[rail("rocep1s0f1", &dev, "4: ACTIVE", true)])?;
    let (passed, t) = preflight(&good, home).await?;
    assert!(passed, "{}", t.to_table());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn testbed_preflight_catches_each_failure_for_real() {
    common::testbed::on_testbed(|info, home| async move { scenario(&info, &home).await }).await;
}
