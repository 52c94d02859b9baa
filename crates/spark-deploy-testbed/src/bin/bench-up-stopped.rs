//! `up` from stopped on the testbed, the small and the large test-scale checkpoint side by side
//! (not a timed test): how much `up` costs beyond the engine's own load once everything is
//! prepared, and whether that overhead grows with the checkpoint (it must not: stamps and
//! manifests decide what is checked again, never a full re-hash).
//!
//! For each checkpoint (small, then large; each with its own head caches, state and worker
//! directories, emptied first):
//! 1. a first `spark-deploy up` from empty caches (untimed for the comparison: fetch from the
//!    testbed hub, rank-file build, worker copy, image, launch, smoke), run as a child process
//!    whose peak RSS (`VmHWM` of `/proc/<pid>/status`, sampled every 10 ms) is printed as
//!    `peak RSS <MiB> MiB (limit 512)`;
//! 2. `down`, then `BENCH_ROUNDS` times (default 3): `up` (timed) and `down`.
//!
//! `BENCH_CHECKPOINTS=small` (or `large`) runs one size only, for a quick look (no ratio then).
//!
//! Every `up` is the CLI (`spark-deploy --json up`); its per-step durations come from the run
//! report it prints last. The engine's load is the stand-in's time from the first rank
//! container's start (`State.StartedAt`) to rank 0's `serving` line (Docker's timestamp of that
//! log line): rank files opened, the split proof done, the API open. The overhead is the rest of
//! the `up`'s wall time: process start, preflight, the stamped checks of the fetched files and
//! rank files, the worker manifest checks, the image check, starting the containers, the
//! readiness polls and the smoke generation. Prints per-step medians for both sizes; the last
//! line is the large checkpoint's median overhead over the small one's.
//!
//! `cargo build --release -p spark-deploy-cli -p spark-deploy-testbed --bins && target/release/bench-up-stopped`
//! (the `spark-deploy` and `tf-standin` binaries are found next to this one).
//!
//! Reuses a running testbed (never tearing down one it did not create) but refuses while a
//! deployment runs on it. The generated hub repos are kept below the testbed's state directory
//! (`bench-up-stopped/<size>/hub-repos`: generating the large one takes a while); the
//! deployments' caches and worker copies are removed at the end. The events of each size's last
//! timed `up` are kept in the testbed's cache directory, which `testbed down` keeps
//! (`bench-up-stopped-<size>.events.jsonl`: where its time went, event by event).

#![allow(clippy::print_stdout)]

use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader, Read as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use spark_deploy_core::config::{DeploymentConfig, validate};
use spark_deploy_core::container::rank_container_name;
use spark_deploy_core::lifecycle::log_time::parse_rfc3339;
use spark_deploy_testbed::checkpoint::CheckpointSpec;
use spark_deploy_testbed::cluster::{self, TestbedInfo, TestbedOptions};
use spark_deploy_testbed::reuse::{self, Origin};

type R<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// The steps of `up`, in order, as the run report names them, between the CLI's own time before
/// the first event and after the last.
const STEPS: [&str; 9] = [
    "cli: start to first event",
    "preflight",
    "fetch_checkpoint",
    "build_rank_cache",
    "configure_worker_storage",
    "build_image",
    "launch_rank",
    "smoke",
    "cli: last event to exit",
];

/// What one CLI run gave.
struct CliRun {
    wall_s: f64,
    /// Step → (status, seconds), from the run report.
    steps: BTreeMap<String, (String, f64)>,
    /// Peak resident set of the CLI process, bytes (`VmHWM`).
    peak_rss: u64,
    /// Its stdout: the events as JSON lines, then the result document.
    lines: Vec<String>,
}

fn unix_ms() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

fn load_avg() -> String {
    fs_err::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// `VmHWM` of a live process, bytes.
fn vm_hwm(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Runs `spark-deploy --config CONFIG --json VERB`, sampling its peak RSS until it exits.
fn cli(exe: &Path, config: &Path, verb: &str) -> R<CliRun> {
    let t = Instant::now();
    let spawned = unix_ms();
    let mut child = Command::new(exe)
        .arg("--config")
        .arg(config)
        .args(["--json", verb])
        .env_remove("SPARK_DEPLOY_API_KEY")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let pid = child.id();
    let out = child.stdout.take().ok_or("stdout")?;
    let mut err = child.stderr.take().ok_or("stderr")?;
    let lines = std::thread::spawn(move || {
        BufReader::new(out)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<_>>()
    });
    let errs = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let mut peak = 0;
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        peak = peak.max(vm_hwm(pid).unwrap_or(0));
        std::thread::sleep(Duration::from_millis(10));
    };
    let wall_s = t.elapsed().as_secs_f64();
    let exited = unix_ms();
    let lines = lines.join().map_err(|_| "stdout reader panicked")?;
    let errs = errs.join().map_err(|_| "stderr reader panicked")?;
    if !status.success() {
        let tail: Vec<&String> = lines.iter().rev().take(5).collect();
        return Err(format!("`spark-deploy {verb}` failed ({status}): {errs}\n{tail:?}").into());
    }
    let mut steps = BTreeMap::new();
    if let Some(report) = lines
        .iter()
        .rev()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v.get("report").is_some())
    {
        for s in report["report"]["steps"].as_array().into_iter().flatten() {
            let name = s["step"].as_str().unwrap_or("?").to_owned();
            let status = s["status"].as_str().unwrap_or("?").to_owned();
            let ms = s["duration_ms"].as_f64().unwrap_or(f64::NAN);
            steps.insert(name, (status, ms / 1000.0));
        }
    }
    // The process's own time outside the plan's events: before the first (start, config,
    // plan) and after the last (result, exit).
    let stamps: Vec<f64> = lines
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["ts_ms"].as_f64())
        .collect();
    if let (Some(first), Some(last)) = (stamps.first(), stamps.last()) {
        steps.insert(
            "cli: start to first event".into(),
            ("-".into(), (first - spawned) / 1000.0),
        );
        steps.insert(
            "cli: last event to exit".into(),
            ("-".into(), (exited - last) / 1000.0),
        );
    }
    Ok(CliRun {
        wall_s,
        steps,
        peak_rss: peak,
        lines,
    })
}

fn docker(args: &[&str]) -> R<String> {
    let o = Command::new("docker").args(args).output()?;
    if !o.status.success() {
        return Err(format!(
            "docker {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr)
        )
        .into());
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

fn seconds(t: (i64, u32)) -> f64 {
    t.0 as f64 + f64::from(t.1) / 1e9
}

/// The engine's load of the deployment `name` with `ranks` ranks that runs now: from the first
/// rank container's start to rank 0's `serving` line, seconds.
fn engine_load(name: &str, ranks: usize) -> R<f64> {
    let mut first_start = f64::INFINITY;
    for r in 0..ranks {
        let c = rank_container_name(name, r);
        let at = docker(&["inspect", "-f", "{{.State.StartedAt}}", &c])?;
        let t = parse_rfc3339(at.trim()).ok_or_else(|| format!("{c}: StartedAt {at:?}"))?;
        first_start = first_start.min(seconds(t));
    }
    let c0 = rank_container_name(name, 0);
    let logs = docker(&["logs", "--timestamps", &c0])?;
    let serving = logs
        .lines()
        .find(|l| l.contains("\"serving\""))
        .and_then(|l| l.split_whitespace().next())
        .and_then(parse_rfc3339)
        .ok_or_else(|| format!("{c0}: no `serving` line in its log"))?;
    Ok(seconds(serving) - first_start)
}

/// Where one size's deployment keeps its files: the head's below `dir`, each worker's below its
/// disk directory.
fn size_config(
    base: &DeploymentConfig,
    info: &TestbedInfo,
    dir: &Path,
    tag: &str,
) -> DeploymentConfig {
    let mut c = base.clone();
    let d = |s: &str| dir.join(s).display().to_string();
    c.deployment.state_dir = d("state");
    c.hub.cache = d("hf");
    c.hub.ablit_cache = d("hf-ablit");
    c.nodes[0].data_dir = d("data");
    for (n, w) in c.nodes.iter_mut().skip(1).zip(&info.workers) {
        let wd = w.disk_dir.join(format!("bench-up-stopped-{tag}"));
        n.hf_cache = wd.join("hf").display().to_string();
        n.data_dir = wd.join("data").display().to_string();
    }
    c
}

/// Every file a size's deployment wrote, on the head and on the workers' disks.
fn remove_deployment_files(info: &TestbedInfo, dir: &Path, tag: &str) {
    for s in ["state", "hf", "hf-ablit", "data", "spark-deploy.toml"] {
        let p = dir.join(s);
        let _ = fs_err::remove_dir_all(&p).or_else(|_| fs_err::remove_file(&p));
    }
    for w in &info.workers {
        let _ = fs_err::remove_dir_all(w.disk_dir.join(format!("bench-up-stopped-{tag}")));
    }
}

/// The figures of one size.
struct SizeResult {
    tag: &'static str,
    shard_bytes: u64,
    first: CliRun,
    ups: Vec<(CliRun, f64)>,
}

impl SizeResult {
    fn overheads(&self) -> Vec<f64> {
        self.ups.iter().map(|(r, load)| r.wall_s - load).collect()
    }
}

fn dir_bytes(p: &Path) -> u64 {
    let mut total = 0;
    let mut dirs = vec![p.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => dirs.push(e.path()),
                Ok(m) => total += m.len(),
                Err(_) => {}
            }
        }
    }
    total
}

async fn one_size(
    info: &TestbedInfo,
    home: &Path,
    exe: &Path,
    tag: &'static str,
    spec: CheckpointSpec,
    rounds: usize,
    events_dir: &Path,
) -> R<SizeResult> {
    let dir = info.state_dir.join("bench-up-stopped").join(tag);
    remove_deployment_files(info, &dir, tag);
    let base = size_config(
        &spark_deploy_testbed::deployment::deployment_config(info),
        info,
        &dir,
        tag,
    );
    let repos = dir.join("hub-repos");
    let (hub, config) =
        spark_deploy_testbed::demo::prepare_checkpoint(home, None, &repos, spec, base).await?;
    let shard_bytes = dir_bytes(&repos.join(spark_deploy_testbed::demo::MODEL));
    let path = dir.join("spark-deploy.toml");
    fs_err::write(&path, toml::to_string_pretty(&config)?)?;
    let ranks = config.nodes.len();
    let name = config.deployment.name.clone();
    validate(config, home)?;
    let (owned, p) = (exe.to_path_buf(), path.clone());
    let events = events_dir.join(format!("bench-up-stopped-{tag}.events.jsonl"));
    // The CLI runs block: off the runtime, which serves the hub meanwhile.
    let result = tokio::task::spawn_blocking(move || -> R<SizeResult> {
        let path = p;
        let exe = owned.as_path();
        println!(
            "{tag}: first up from empty caches ({:.2} GiB of model files; load average {})",
            shard_bytes as f64 / f64::from(1u32 << 30),
            load_avg()
        );
        let first = cli(exe, &path, "up")?;
        println!(
            "{tag}: first up {:.1} s; peak RSS {:.0} MiB (limit 512)",
            first.wall_s,
            first.peak_rss as f64 / f64::from(1u32 << 20)
        );
        cli(exe, &path, "down")?;
        let mut ups = Vec::new();
        for round in 1..=rounds {
            let la = load_avg();
            let up = cli(exe, &path, "up")?;
            let load = engine_load(&name, ranks)?;
            println!(
                "{tag} round {round}: up from stopped {:.2} s, engine load {load:.2} s, overhead {:.2} s, of which rank-file checks {:.2} s (load average {la})",
                up.wall_s,
                up.wall_s - load,
                up.steps.get("build_rank_cache").map_or(f64::NAN, |s| s.1)
            );
            cli(exe, &path, "down")?;
            if round == rounds {
                // Where the time of an `up` from stopped goes, event by event (kept after the run).
                if let Some(d) = events.parent() {
                    fs_err::create_dir_all(d)?;
                }
                fs_err::write(&events, up.lines.join("\n") + "\n")?;
            }
            ups.push((up, load));
        }
        Ok(SizeResult {
            tag,
            shard_bytes,
            first,
            ups,
        })
    })
    .await?;
    if result.is_err() {
        let _ = cli(exe, &path, "down");
    }
    drop(hub);
    remove_deployment_files(info, &dir, tag);
    result
}

fn print_table(results: &[SizeResult]) {
    let mut head = String::from("| step |");
    let mut rule = String::from("|---|");
    for r in results {
        head.push_str(&format!(
            " {} first up s | {} up from stopped s (median) |",
            r.tag, r.tag
        ));
        rule.push_str("---|---|");
    }
    println!("{head}");
    println!("{rule}");
    for step in STEPS {
        let mut row = format!("| {step} |");
        for r in results {
            let first = r
                .first
                .steps
                .get(step)
                .map_or_else(|| "-".into(), |(st, s)| format!("{s:.2} ({st})"));
            let status = r
                .ups
                .first()
                .and_then(|(u, _)| u.steps.get(step))
                .map_or("-", |(st, _)| st.as_str());
            let m = median(
                r.ups
                    .iter()
                    .filter_map(|(u, _)| u.steps.get(step).map(|x| x.1))
                    .collect(),
            );
            row.push_str(&format!(" {first} | {m:.2} ({status}) |"));
        }
        println!("{row}");
    }
    let mut row = String::from("| **wall** |");
    for r in results {
        let m = median(r.ups.iter().map(|(u, _)| u.wall_s).collect());
        row.push_str(&format!(" {:.2} | {m:.2} |", r.first.wall_s));
    }
    println!("{row}");
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> R<()> {
    let opts = TestbedOptions {
        install_tools: true,
        ..TestbedOptions::default()
    };
    let exe = std::env::current_exe()?
        .parent()
        .map(|d| d.join("spark-deploy"))
        .filter(|p| p.is_file())
        .ok_or("the spark-deploy binary is not next to this one: `cargo build --release -p spark-deploy-cli`")?;
    let testbed = reuse::up_or_reuse(&opts).await?;
    if testbed.origin == Origin::Reused {
        let ps = Command::new("docker")
            .args(["ps", "-q", "--filter", "name=-rank"])
            .output()?;
        if !ps.stdout.is_empty() {
            return Err("a deployment runs on the testbed: stop it (`spark-deploy down`) before benchmarking `up`, which starts its own".into());
        }
        println!("reusing the testbed that is up: it stays up");
    }
    let result = bench(&testbed.info, &exe, &opts.cache_dir).await;
    if testbed.origin == Origin::Created {
        cluster::down(&opts).await?;
    }
    result
}

async fn bench(info: &TestbedInfo, exe: &Path, events_dir: &Path) -> R<()> {
    let home = std::env::var_os("HOME").map_or_else(|| "/root".into(), PathBuf::from);
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    // `BENCH_CHECKPOINTS=small` for a quick look (no ratio then).
    let wanted = std::env::var("BENCH_CHECKPOINTS").unwrap_or_else(|_| "small,large".into());
    let mut results = Vec::new();
    for (tag, spec) in [
        ("small", CheckpointSpec::small(5)),
        ("large", CheckpointSpec::large(5)),
    ] {
        if wanted.split(',').any(|w| w.trim() == tag) {
            results.push(one_size(info, &home, exe, tag, spec, rounds, events_dir).await?);
        }
    }
    print_table(&results);
    for r in &results {
        let o = r.overheads();
        println!(
            "{}: {:.2} GiB of model files; first up peak RSS {:.0} MiB (limit 512); up from stopped: wall median {:.2} s, engine load median {:.2} s, overhead median {:.2} s (min {:.2}, max {:.2}; bound 2 s)",
            r.tag,
            r.shard_bytes as f64 / f64::from(1u32 << 30),
            r.first.peak_rss as f64 / f64::from(1u32 << 20),
            median(r.ups.iter().map(|(u, _)| u.wall_s).collect()),
            median(r.ups.iter().map(|(_, l)| *l).collect()),
            median(o.clone()),
            o.iter().copied().fold(f64::INFINITY, f64::min),
            o.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        );
    }
    if let [small, large] = &results[..] {
        let (small, large) = (median(small.overheads()), median(large.overheads()));
        println!(
            "up from stopped, large / small overhead = {:.2}x",
            large / small
        );
    }
    Ok(())
}
