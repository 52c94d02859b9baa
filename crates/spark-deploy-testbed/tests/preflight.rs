//! Preflight on the running testbed, for real: the worker is checked over SSH, the head locally,
//! and each failing case is produced on the nodes themselves — not on built facts — and caught
//! with its remedy:
//!
//! - the peer reachable only over the management network (the testbed's second network),
//! - an MTU mismatch (the worker's fabric netdev set to 1400 inside its network namespace),
//! - `MemAvailable` below the floor (the floor set above this machine's memory),
//! - a rank's weights larger than this machine (a sparse 24 GiB rank file on the head),
//! - the API port in use on the head,
//! - worker SSH refused (wrong port) and an unknown host key (empty known_hosts),
//! - ranks meant to run under the NVIDIA runtime, which the testbed's daemon does not have,
//! - a worker without `nvidia-smi`,
//! - and, on the GPU and RoCE facts the testbed's hosts present (their `nvidia-smi` and sysfs
//!   tree, read through the Exec port as on a Spark): clock caps that differ, a GID table without
//!   a RoCE v2 IPv4 entry, a second rail down;
//! - what would otherwise fail only after the download: in `nfs` mode no export of the head's
//!   cache to the worker (a real exports file on this machine), an engine binary missing from the
//!   head's engine directory, the base image at a tag the head's Docker lacks, and too little disk
//!   (the head's HF cache on a 1 MiB tmpfs, the worker's data directory on its own `/dev/shm`
//!   filled to 1 MiB free); `up` with the base image missing stops at Preflight with no file
//!   fetched from the hub and the HF cache empty;
//! - `CONTEXT=0`: the largest pool that fits, printed and recorded, and rank 0's `--context`.
//!
//! The memory budget is decided on the test-scale checkpoint's real size, as the testbed hub
//! lists it. The unit tests of `preflight::decide` cover the same cases on built facts.
//!
//! Cohesion: longer than the ~600-line rule on purpose. It is one scenario on one running
//! testbed (bringing one up is the expensive part): each failure is set up on the nodes, caught,
//! and undone before the next, so the cases share the testbed, the demo config and the helpers
//! in this file, and a later case relies on the earlier ones having been undone. One test binary
//! (each binary in `tests/` links the whole testbed again).

// An integration test: a failed unwrap or expect is the test failure, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;

use spark_deploy_core::config::{DeploymentConfig, validate};
use spark_deploy_core::event::Recorder;
use spark_deploy_core::plan::{Plan, Step};
use spark_deploy_core::preflight::report::{Check, CheckResult, PreflightReport, Verdict};
use spark_deploy_core::run::Context;
use spark_deploy_core::steps::Preflight;
use spark_deploy_testbed::cluster::TestbedInfo;
use spark_deploy_testbed::cluster::worker::docker_exec;
use spark_deploy_testbed::host_facts::{self, CLOCK_FILE, Rail, write_tree};
use spark_deploy_testbed::hub_server::HubServer;

mod common;

use common::testbed::R;

/// Runs Preflight alone on `config`; the table whether it passed or failed.
async fn preflight(config: &DeploymentConfig, home: &Path) -> R<(bool, PreflightReport)> {
    let v = validate(config.clone(), home)?;
    let ctx = Context::new(v.clone(), Arc::new(Recorder::default()));
    // Boxed: the plan's future is large for the test thread's stack in a debug build.
    let passed =
        Box::pin(Plan::from_steps(&v, vec![Step::Preflight(Preflight::new(&v))]).run(&ctx))
            .await
            .is_ok();
    Ok((passed, ctx.preflight_report().ok_or("no preflight table")?))
}

fn row<'a>(t: &'a PreflightReport, check: Check, node: &str) -> R<&'a CheckResult> {
    Ok(t.results
        .iter()
        .find(|r| r.check == check && r.node == node)
        .ok_or_else(|| format!("no {check} row for {node}:\n{}", t.to_table()))?)
}

/// Asserts `check` on `node` failed and its remedy mentions `remedy`.
fn failed(t: &PreflightReport, check: Check, node: &str, remedy: &str) -> R<()> {
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

/// Runs `argv` in the worker container (not over SSH); fails on a non-zero exit.
async fn in_worker(info: &TestbedInfo, argv: &[&str]) -> R<()> {
    let (code, out) = docker_exec(&info.head_docker()?, &info.workers[0].container, argv).await?;
    if code != 0 {
        return Err(format!("{argv:?} in the worker: {out}").into());
    }
    Ok(())
}

/// Runs `sh -c script` in the worker container (not over SSH); its output.
async fn in_worker_sh(info: &TestbedInfo, script: &str) -> R<String> {
    let (code, out) = docker_exec(
        &info.head_docker()?,
        &info.workers[0].container,
        &["sh", "-c", script],
    )
    .await?;
    if code != 0 {
        return Err(format!("{script} in the worker: {out}").into());
    }
    Ok(out)
}

/// Files below `dir` (none when it is absent).
fn files_below(dir: &Path) -> usize {
    fn walk(d: &Path, n: &mut usize) {
        for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, n);
            } else {
                *n += 1;
            }
        }
    }
    let mut n = 0;
    walk(dir, &mut n);
    n
}

/// What preflight must catch before any download, each produced for real: the head's NFS export
/// (nfs mode), the engine binaries, the base image, and the disk of each node (the head's HF
/// cache on a 1 MiB tmpfs, the worker's data directory on its `/dev/shm` filled to 1 MiB free);
/// then `up` with a missing
/// base image stops at Preflight having fetched no file.
async fn before_any_download(
    info: &TestbedInfo,
    home: &Path,
    hub: &HubServer,
    good: &DeploymentConfig,
) -> R<()> {
    let v = validate(good.clone(), home)?;
    let head = spark_deploy_core::layout::NodeLayout::of(&v, &v.config().nodes[0]);

    // nfs mode without an export of the head's cache to the worker: caught, with the line that
    // fixes it; with the export file (a real one on this machine, read through the head's Exec
    // port) it passes.
    const EXPORTS: &str = "/etc/exports.d/spark-deploy-testbed.exports";
    let mut nfs = good.clone();
    nfs.deployment.worker_storage = spark_deploy_core::config::WorkerStorage::Nfs;
    let _ = std::fs::remove_file(EXPORTS);
    let (passed, t) = preflight(&nfs, home).await?;
    assert!(!passed);
    let want = format!(
        "echo '{} {}(ro,no_subtree_check)' | sudo tee -a /etc/exports && sudo exportfs -ra",
        head.hf_cache, info.workers[0].fabric_addr
    );
    failed(&t, Check::NfsExport, "head", &want)?;
    std::fs::create_dir_all("/etc/exports.d")?;
    std::fs::write(
        EXPORTS,
        format!(
            "{} {}(ro,no_subtree_check)\n",
            head.hf_cache, info.workers[0].fabric_addr
        ),
    )?;
    let result = preflight(&nfs, home).await;
    std::fs::remove_file(EXPORTS)?;
    let (_, t) = result?;
    let r = row(&t, Check::NfsExport, "head")?;
    assert_eq!(r.verdict, Verdict::Ok, "{}", t.to_table());

    // An engine binary missing from the head's engine directory.
    let bin = Path::new(&head.engine_dir).join("tf-dsv41-lanes");
    let aside = Path::new(&head.engine_dir).join("tf-dsv41-lanes.aside");
    std::fs::rename(&bin, &aside)?;
    let result = preflight(good, home).await;
    std::fs::rename(&aside, &bin)?;
    let (passed, t) = result?;
    assert!(!passed);
    failed(
        &t,
        Check::EngineBinaries,
        "head",
        &format!("into {}", head.engine_dir),
    )?;
    assert!(
        row(&t, Check::EngineBinaries, "head")?
            .observed
            .ends_with(&format!("{}/tf-dsv41-lanes", head.engine_dir)),
        "{}",
        t.to_table()
    );

    // The base image at a tag the head's Docker does not have.
    let mut c = good.clone();
    c.engine.base_image = "spark-deploy-testbed/engine-base:missing".into();
    let (passed, t) = preflight(&c, home).await?;
    assert!(!passed);
    failed(&t, Check::BaseImage, "head", "docker load -i")?;

    // Disk: the head's HF cache on a 1 MiB tmpfs (the checkpoint, Engram tables and kit are
    // still to come), then the worker's data directory on one (its rank file, Engram tables,
    // kit and engine binaries are still to come).
    let tiny = info.state_dir.join("tiny-hf");
    std::fs::create_dir_all(&tiny)?;
    sh(&format!(
        "mount -t tmpfs -o size=1m sd-testbed-tiny {}",
        tiny.display()
    ))?;
    let mut c = good.clone();
    c.hub.cache = tiny.display().to_string();
    let result = preflight(&c, home).await;
    sh(&format!("umount {}", tiny.display()))?;
    let (passed, t) = result?;
    assert!(!passed);
    let r = t
        .results
        .iter()
        .find(|r| r.check == Check::Disk && r.node == "head" && r.verdict == Verdict::Fail)
        .ok_or_else(|| format!("no failed disk row on head:\n{}", t.to_table()))?;
    assert!(
        r.observed.contains("Engram tables") && r.observed.contains("kit"),
        "{r:?}"
    );
    assert!(
        r.remedy
            .as_deref()
            .unwrap_or("")
            .contains("data_dir / hub.cache"),
        "{r:?}"
    );
    // The worker may not mount: its data directory goes on its own /dev/shm tmpfs, filled to
    // leave 1 MiB free.
    let free_kib: u64 = in_worker_sh(info, "df -Pk /dev/shm | tail -1")
        .await?
        .split_whitespace()
        .nth(3)
        .ok_or("df of the worker's /dev/shm")?
        .parse()?;
    in_worker_sh(
        info,
        &format!(
            "head -c {} /dev/zero > /dev/shm/sd-testbed-fill",
            free_kib.saturating_sub(1024) * 1024
        ),
    )
    .await?;
    let mut c = good.clone();
    c.nodes[1].data_dir = "/dev/shm/sd-data".into();
    let result = preflight(&c, home).await;
    in_worker_sh(info, "rm -rf /dev/shm/sd-testbed-fill /dev/shm/sd-data").await?;
    let (passed, t) = result?;
    assert!(!passed);
    let r = t
        .results
        .iter()
        .find(|r| r.check == Check::Disk && r.node == "worker-1" && r.verdict == Verdict::Fail)
        .ok_or_else(|| format!("no failed disk row on worker-1:\n{}", t.to_table()))?;
    for part in ["rank file 1", "Engram tables", "kit", "engine binaries"] {
        assert!(r.observed.contains(part), "{part}: {r:?}");
    }

    // `up` (the standard plan) with the base image missing stops at Preflight: no file was
    // fetched from the hub (only listings were asked) and the HF cache holds no file.
    hub.clear_requests();
    let mut c = good.clone();
    c.engine.base_image = "spark-deploy-testbed/engine-base:missing".into();
    let v = validate(c, home)?;
    let ctx = Context::new(v.clone(), Arc::new(Recorder::default()));
    let err = Plan::standard(&v)
        .run(&ctx)
        .await
        .expect_err("preflight fails");
    assert_eq!(
        err.failure.step,
        spark_deploy_core::plan::StepKind::Preflight
    );
    let fetched: Vec<String> = hub
        .requests()
        .into_iter()
        .filter(|r| r.path.contains("/resolve/"))
        .map(|r| r.path)
        .collect();
    assert!(
        fetched.is_empty(),
        "downloaded before preflight passed: {fetched:?}"
    );
    assert_eq!(files_below(Path::new(&v.config().hub.cache)), 0);
    Ok(())
}

async fn scenario(info: &TestbedInfo, home: &Path) -> R<()> {
    // The demo's config: the test-scale checkpoint, Engram tables and kit on a hub on loopback,
    // the stand-in engine's binaries and base image on the head.
    let (hub, good) = spark_deploy_testbed::demo::prepare(info, home).await?;

    // The healthy testbed passes, every check decided on what the hosts present.
    let (passed, t) = preflight(&good, home).await?;
    assert!(passed, "{}", t.to_table());
    assert_eq!(row(&t, Check::Ssh, "worker-1")?.verdict, Verdict::Ok);
    assert_eq!(row(&t, Check::EngineBinaries, "head")?.verdict, Verdict::Ok);
    assert_eq!(row(&t, Check::BaseImage, "head")?.verdict, Verdict::Ok);
    // Each node's disk row counts its share: the head's the checkpoint, rank files, Engram
    // tables and kit; the worker's its rank file, the trees, the binaries and the image.
    let disk = |node: &str| {
        t.results
            .iter()
            .filter(|r| r.check == Check::Disk && r.node == node)
            .map(|r| r.observed.clone())
            .collect::<Vec<_>>()
            .join(" | ")
    };
    for part in ["checkpoint", "rank file 0", "Engram tables", "kit"] {
        assert!(disk("head").contains(part), "{part}: {}", t.to_table());
    }
    for part in [
        "rank file 1",
        "Engram tables",
        "kit",
        "engine binaries",
        "engine image",
    ] {
        assert!(disk("worker-1").contains(part), "{part}: {}", t.to_table());
    }

    // CONTEXT=0: the largest pool that fits every node, printed and recorded for the launch.
    let mut c = good.clone();
    c.serving.context = 0;
    let v = validate(c, home)?;
    let ctx = Context::new(v.clone(), Arc::new(Recorder::default()));
    Box::pin(Plan::from_steps(&v, vec![Step::Preflight(Preflight::new(&v))]).run(&ctx))
        .await
        .map_err(|e| e.to_string())?;
    let t = ctx.preflight_report().ok_or("no preflight table")?;
    let r = row(&t, Check::MemoryContext, "all")?;
    let n = ctx.facts().context.ok_or("no context recorded")?;
    assert!(n >= 4096 && n % 2048 == 0, "{n}");
    assert!(
        r.observed
            .starts_with(&format!("context 0 → {n} tokens (largest that fits: head ")),
        "{r:?}"
    );
    #[allow(clippy::print_stderr)]
    {
        eprintln!("CONTEXT=0 preflight:\n{}", t.to_table());
    }
    let specs = spark_deploy_core::engine::for_config(&v).rank_containers(&v, &ctx.facts());
    let rank0 = specs.iter().find(|s| s.rank == 0).ok_or("rank 0")?;
    let at = rank0
        .argv
        .iter()
        .position(|a| a == "--context")
        .ok_or("--context")?;
    assert_eq!(rank0.argv[at + 1], n.to_string());

    Box::pin(before_any_download(info, home, &hub, &good)).await?;
    for node in ["head", "worker-1"] {
        // The nodes' nvidia-smi reports the captured host's two H200s: not a Spark's GB10.
        let gpu = row(&t, Check::Gpu, node)?;
        assert_eq!(
            (gpu.verdict, gpu.observed.as_str()),
            (Verdict::Warn, "2 × NVIDIA H200"),
            "{node}"
        );
        assert_eq!(row(&t, Check::GpuProcesses, node)?.verdict, Verdict::Ok);
        // The ranks run under runc, which the daemon has; it has no NVIDIA runtime, so the
        // GPUs the driver lists are not handed to the ranks, and the table says so.
        let rt: Vec<&CheckResult> = t
            .results
            .iter()
            .filter(|r| r.check == Check::DockerRuntime && r.node == node)
            .collect();
        assert_eq!(rt[0].verdict, Verdict::Ok, "{rt:?}");
        assert!(rt[0].observed.starts_with("ranks use runc;"), "{rt:?}");
        assert!(
            rt.iter().any(|r| r.verdict == Verdict::Warn
                && r.observed.contains("no GPU device request")),
            "{rt:?}"
        );
        // The budget is the checkpoint's real size split over the ranks.
        let budget = row(&t, Check::MemoryBudget, node)?;
        assert_eq!(budget.verdict, Verdict::Ok, "{budget:?}");
        assert!(
            budget.observed.contains("(checkpoint at the Hub / ranks)"),
            "{budget:?}"
        );
        // One rail, at the bridge's MTU of 1500: warnings with their remedies, then the pass.
        assert!(
            t.results.iter().any(|r| r.check == Check::FabricRoce
                && r.node == node
                && r.verdict == Verdict::Ok
                && r.observed == "rocep1s0f1 ACTIVE, RoCE v2 GID index 3"),
            "{}",
            t.to_table()
        );
    }
    assert_eq!(row(&t, Check::GpuClocks, "all")?.verdict, Verdict::Warn);

    // The recipe's FABRIC_PEER alone (the head's fabric address left to detection), then neither
    // address given (an empty FABRIC_PEER): both are detected, and every fabric row passes.
    let (head_addr, worker_addr) = (info.head_fabric_addr, info.worker().fabric_addr);
    let mut c = good.clone();
    c.nodes[0].fabric_addr = None;
    for case in ["FABRIC_PEER alone", "no fabric address given"] {
        let (passed, t) = preflight(&c, home).await?;
        assert!(passed, "{case}:\n{}", t.to_table());
        let w = row(&t, Check::FabricAddr, "worker-1")?;
        assert!(
            w.verdict == Verdict::Ok
                && w.observed.starts_with(&format!("{worker_addr} on "))
                && w.observed.ends_with(&format!("reaches {head_addr}")),
            "{case}: {w:?}"
        );
        let h = row(&t, Check::FabricAddr, "head")?;
        assert!(
            h.observed.starts_with(&format!("{head_addr} on ")),
            "{case}: {h:?}"
        );
        c.nodes[1].fabric_addr = None;
    }

    // Ranks meant for the NVIDIA runtime: the testbed's daemon really has none.
    let mut c = good.clone();
    c.engine.runtime = "nvidia".into();
    let (passed, t) = preflight(&c, home).await?;
    assert!(!passed);
    failed(
        &t,
        Check::DockerRuntime,
        "head",
        "nvidia-ctk runtime configure",
    )?;
    failed(
        &t,
        Check::DockerRuntime,
        "worker-1",
        "nvidia-ctk runtime configure",
    )?;

    // A worker without nvidia-smi.
    let smi = host_facts::facts_dir(info, 1).join("bin/nvidia-smi");
    in_worker(info, &["rm", "/usr/local/bin/nvidia-smi"]).await?;
    let result = preflight(&good, home).await;
    in_worker(
        info,
        &[
            "ln",
            "-s",
            &smi.display().to_string(),
            "/usr/local/bin/nvidia-smi",
        ],
    )
    .await?;
    let (passed, t) = result?;
    assert!(!passed);
    failed(&t, Check::Gpu, "worker-1", "install the NVIDIA driver")?;
    assert_eq!(row(&t, Check::Gpu, "head")?.verdict, Verdict::Warn);

    // Peer reachable only over the management network: the worker's "fabric" address is its
    // management one, so the head's route to it leaves from the management bridge.
    let mut c = good.clone();
    c.nodes[1].fabric_addr = Some(info.workers[0].management_addr);
    let (passed, t) = preflight(&c, home).await?;
    assert!(!passed);
    failed(
        &t,
        Check::FabricAddr,
        "head",
        "must be configured on the ConnectX-7 netdev",
    )?;

    // MTU mismatch: the worker's fabric netdev at 1400, the head's bridge at 1500 (the hosts'
    // sysfs trees show their real netdevs' MTU).
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
    failed(&t, Check::FabricMtu, "all", "mtu 1500")?;

    // MemAvailable below a floor above this machine's memory.
    let mut c = good.clone();
    c.lifecycle.min_avail_gib = 128; // the largest valid floor; this machine has 24 GiB
    let (passed, t) = preflight(&c, home).await?;
    assert!(!passed);
    failed(&t, Check::MemoryAvailable, "head", "drop_caches")?;
    failed(&t, Check::MemoryAvailable, "worker-1", "drop_caches")?;

    // Rank weights larger than this machine: a rank file of 24 GiB on the head (sparse: its size
    // is what the engine counts, not its blocks) leaves no CONTEXT that fits.
    let v = validate(good.clone(), home)?;
    let rank_cache =
        Path::new(&spark_deploy_core::layout::NodeLayout::of(&v, &v.config().nodes[0]).inputs_dir)
            .join("rank-cache");
    std::fs::create_dir_all(&rank_cache)?;
    let big = rank_cache.join("rank0of2-0123456789abcdef0123.bin");
    std::fs::File::create(&big)?.set_len(24 << 30)?;
    let result = preflight(&good, home).await;
    std::fs::remove_file(&big)?;
    let (passed, t) = result?;
    assert!(!passed);
    failed(&t, Check::MemoryBudget, "head", "no CONTEXT fits")?;
    assert!(
        row(&t, Check::MemoryBudget, "head")?
            .observed
            .starts_with("weights 24.0 (rank file)"),
        "{}",
        t.to_table()
    );
    assert_eq!(
        row(&t, Check::MemoryBudget, "worker-1")?.verdict,
        Verdict::Ok
    );

    // The API port in use on the head.
    let listener = std::net::TcpListener::bind(("0.0.0.0", good.serving.port))?;
    let (passed, t) = preflight(&good, home).await?;
    drop(listener);
    assert!(!passed);
    failed(&t, Check::PortApi, "head", "serving.port")?;

    // Worker SSH refused, then an unknown host key.
    let mut c = good.clone();
    c.nodes[1].ssh_port = Some(1);
    let (passed, t) = preflight(&c, home).await?;
    assert!(!passed);
    failed(&t, Check::Ssh, "worker-1", "sshd")?;
    let empty = info.state_dir.join("empty_known_hosts");
    std::fs::write(&empty, "")?;
    let mut c = good.clone();
    c.nodes[1].known_hosts = empty.display().to_string();
    let (passed, t) = preflight(&c, home).await?;
    assert!(!passed);
    failed(&t, Check::Ssh, "worker-1", "ssh-keyscan")?;

    // The worker's GPU facts changed: its nvidia-smi reports lower clock caps.
    let clock = host_facts::facts_dir(info, 1).join(CLOCK_FILE);
    let original = std::fs::read_to_string(&clock)?;
    std::fs::write(&clock, original.replace(": 1980 MHz", ": 1500 MHz"))?;
    let result = preflight(&good, home).await;
    std::fs::write(&clock, &original)?;
    let (passed, t) = result?;
    assert!(!passed);
    failed(&t, Check::GpuClocks, "all", "nvidia-smi -lgc 1500,1500")?;

    // The worker's RoCE facts changed.
    let sys = host_facts::sysfs_root(info, 1);
    let worker_addr = info.workers[0].fabric_addr;
    let rail = |hca, state, v2| Rail {
        hca,
        netdev: &dev,
        state,
        v2,
    };
    // A GID table without a RoCE v2 IPv4 entry.
    write_tree(&sys, worker_addr, &[rail("rocep1s0f1", "4: ACTIVE", false)])?;
    let (passed, t) = preflight(&good, home).await?;
    assert!(!passed);
    failed(&t, Check::FabricRoce, "worker-1", "RoCE v1")?;
    // A second rail down.
    write_tree(
        &sys,
        worker_addr,
        &[
            rail("rocep1s0f1", "4: ACTIVE", true),
            rail("roceP2p1s0f1", "1: DOWN", true),
        ],
    )?;
    let (passed, t) = preflight(&good, home).await?;
    assert!(!passed);
    failed(
        &t,
        Check::FabricRoce,
        "worker-1",
        "ibv_devinfo -d roceP2p1s0f1",
    )?;
    write_tree(&sys, worker_addr, &[rail("rocep1s0f1", "4: ACTIVE", true)])?;
    let (passed, t) = preflight(&good, home).await?;
    assert!(passed, "{}", t.to_table());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn testbed_preflight_catches_each_failure_for_real() {
    common::testbed::on_testbed(|info, home| async move { Box::pin(scenario(&info, &home)).await })
        .await;
}
