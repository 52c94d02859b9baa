//! The command line against a running testbed deployment (`spark-deploy demo`): `status`, `logs`,
//! Ctrl-C, progress output, the API hints. Every test brings the demo up and takes both the
//! deployment and the testbed down whatever happens; run them under the testbed lock.

// An integration test: a failed unwrap or expect is the test failure, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The config `demo` writes.
const CONFIG: &str = "/var/tmp/spark-deploy-testbed/spark-deploy.toml";

fn sd(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_spark-deploy"));
    c.args(args).env_remove("SPARK_DEPLOY_API_KEY");
    c
}

fn with_config(args: &[&str]) -> Command {
    let mut c = sd(&["--config", CONFIG]);
    c.args(args);
    c
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The demo deployment; dropping it stops the ranks and removes the testbed.
struct Demo {
    /// What `demo` printed.
    out: Output,
}

impl Demo {
    fn up() -> Self {
        Self::up_with(&[])
    }

    fn up_with(env: &[(&str, &str)]) -> Self {
        let mut c = sd(&["demo"]);
        c.envs(env.iter().copied());
        let out = c.output().unwrap();
        let demo = Self { out };
        assert!(
            demo.out.status.success(),
            "demo failed:\n{}\n{}",
            text(&demo.out.stdout),
            text(&demo.out.stderr)
        );
        demo
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = with_config(&["down"]).output();
        let _ = sd(&["testbed", "down"]).output();
    }
}

/// Reads a child's stdout lines on a thread.
fn lines_of(child: &mut Child) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    rx
}

/// Waits for a line satisfying `f`, collecting every line seen.
fn wait_for(rx: &mpsc::Receiver<String>, seen: &mut Vec<String>, f: impl Fn(&str) -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Ok(l) = rx.recv_timeout(Duration::from_millis(200)) {
            let hit = f(&l);
            seen.push(l);
            if hit {
                return true;
            }
        }
    }
    false
}

fn sigint(child: &Child) {
    let ok = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -INT");
}

#[test]
fn testbed_logs_follow_both_ranks_and_status_exit_codes() {
    let _demo = Demo::up();

    let s = with_config(&["status"]).output().unwrap();
    assert_eq!(
        s.status.code(),
        Some(0),
        "{}{}",
        text(&s.stdout),
        text(&s.stderr)
    );
    assert!(text(&s.stdout).contains(": running"), "{}", text(&s.stdout));

    // Both ranks, interleaved by time, each line prefixed with its rank.
    let l = with_config(&["logs"]).output().unwrap();
    assert!(l.status.success(), "{}", text(&l.stderr));
    let lines: Vec<String> = text(&l.stdout).lines().map(str::to_owned).collect();
    assert!(
        lines.iter().any(|x| x.starts_with("[rank 0] ")),
        "{lines:?}"
    );
    assert!(
        lines.iter().any(|x| x.starts_with("[rank 1] ")),
        "{lines:?}"
    );
    let stamps: Vec<&str> = lines
        .iter()
        .map(|x| x.split_whitespace().nth(2).unwrap_or(""))
        .collect();
    let keys: Vec<_> = stamps
        .iter()
        .map(|t| spark_deploy_core::lifecycle::log_time::parse_rfc3339(t).unwrap())
        .collect();
    assert!(
        keys.windows(2).all(|w| w[0] <= w[1]),
        "ordered by time: {stamps:?}"
    );

    // One rank: no prefix, only its lines (the stand-in's JSON lines name their rank).
    let l1 = with_config(&["logs", "--rank", "1"]).output().unwrap();
    assert!(l1.status.success(), "{}", text(&l1.stderr));
    let t1 = text(&l1.stdout);
    assert!(
        t1.contains("\"rank\": 1") && !t1.contains("\"rank\": 0") && !t1.contains("[rank"),
        "{t1}"
    );

    // --since in the future of every line shows none of them.
    let none = with_config(&["logs", "--since", "0s"]).output().unwrap();
    assert!(none.status.success(), "{}", text(&none.stderr));
    assert!(
        !text(&none.stdout).contains("\"rank\""),
        "{}",
        text(&none.stdout)
    );

    // -f prints the backlog and keeps following; Ctrl-C exits 130.
    let follow = || {
        with_config(&["logs", "-f"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut f = follow();
    let rx = lines_of(&mut f);
    let mut seen = Vec::new();
    assert!(
        wait_for(&rx, &mut seen, |l| l.starts_with("[rank 1] ")),
        "backlog: {seen:?}"
    );
    std::thread::sleep(Duration::from_millis(500));
    assert!(f.try_wait().unwrap().is_none(), "still following");
    sigint(&f);
    assert_eq!(f.wait().unwrap().code(), Some(130), "Ctrl-C exits 130");

    // Lines written after the follow began arrive (the ranks' last words as `down` stops them),
    // each once, and the follow ends by itself when the ranks are gone.
    let mut f = follow();
    let rx = lines_of(&mut f);
    let mut seen = Vec::new();
    assert!(
        wait_for(&rx, &mut seen, |l| l.starts_with("[rank 1] ")),
        "backlog: {seen:?}"
    );
    std::thread::sleep(Duration::from_millis(1500));
    let d = with_config(&["down"]).output().unwrap();
    assert!(d.status.success(), "{}", text(&d.stderr));
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = f.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "logs -f must end when the ranks stop"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(status.code(), Some(0));
    seen.extend(rx.try_iter());
    let new: Vec<&String> = seen.iter().filter(|l| !lines.contains(l)).collect();
    assert!(
        !new.is_empty(),
        "no line written after the follow began arrived: {seen:?}"
    );
    let mut unique = seen.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), seen.len(), "every line once: {seen:?}");

    let s = with_config(&["status"]).output().unwrap();
    assert_eq!(
        s.status.code(),
        Some(1),
        "{}{}",
        text(&s.stdout),
        text(&s.stderr)
    );
    assert!(text(&s.stdout).contains(": down"), "{}", text(&s.stdout));
}

/// A Python with the `openai` package: `$SPARK_DEPLOY_TEST_PYTHON`, the active virtualenv, the
/// repository's `.venv` (what `.ci/run` creates), else `python3`.
fn python() -> String {
    let repo = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let candidates = [
        std::env::var("SPARK_DEPLOY_TEST_PYTHON").ok(),
        std::env::var("VIRTUAL_ENV")
            .ok()
            .map(|v| format!("{v}/bin/python")),
        Some(format!("{repo}/.venv/bin/python")),
        Some("python3".to_owned()),
    ];
    for p in candidates.into_iter().flatten() {
        if Command::new(&p)
            .args(["-c", "import openai"])
            .output()
            .is_ok_and(|o| o.status.success())
        {
            return p;
        }
    }
    panic!("no Python with the openai package: set SPARK_DEPLOY_TEST_PYTHON");
}

/// The three snippet lines `up` printed.
fn snippet(stdout: &str) -> String {
    let lines: Vec<&str> = stdout
        .lines()
        .skip_while(|l| !l.starts_with("Python (openai package)"))
        .skip(1)
        .take_while(|l| l.starts_with("    "))
        .map(str::trim)
        .collect();
    assert_eq!(lines.len(), 3, "three lines of Python: {stdout}");
    lines.join("\n")
}

fn run_python(code: &str, key: Option<&str>) -> Output {
    let mut c = Command::new(python());
    c.args(["-c", code]).env_remove("OPENAI_API_KEY");
    if let Some(k) = key {
        c.env("OPENAI_API_KEY", k);
    }
    c.output().unwrap()
}

#[test]
fn testbed_up_prints_how_to_call_the_api_and_the_snippet_works() {
    let demo = Demo::up();
    let out = text(&demo.out.stdout);
    assert!(out.contains("API (OpenAI-compatible): http://"), "{out}");
    assert!(out.contains("(on the head: http://127.0.0.1:"), "{out}");
    assert!(
        out.contains(&format!(
            "`spark-deploy --config {CONFIG} api-key` prints it"
        )),
        "{out}"
    );
    let code = snippet(&out);

    let key = with_config(&["api-key"]).output().unwrap();
    assert!(key.status.success(), "{}", text(&key.stderr));
    let key = text(&key.stdout).trim().to_owned();
    let ok = run_python(&code, Some(&key));
    assert!(
        ok.status.success(),
        "the printed snippet works: {}",
        text(&ok.stderr)
    );
    assert!(!text(&ok.stdout).trim().is_empty(), "a reply is printed");
    let denied = run_python(&code, Some("sk-wrong"));
    assert!(!denied.status.success(), "a wrong key is refused");
    assert!(
        text(&denied.stderr).contains("401"),
        "{}",
        text(&denied.stderr)
    );

    // serving.auth = "none": the ranks restart without a key and the printed snippet needs none.
    let dir = tempfile::tempdir().unwrap();
    let mut cfg: toml::Table = std::fs::read_to_string(CONFIG).unwrap().parse().unwrap();
    cfg.entry("serving")
        .or_insert_with(|| toml::Value::Table(toml::Table::new()))
        .as_table_mut()
        .unwrap()
        .insert("auth".into(), "none".into());
    let open_config = dir.path().join("open.toml");
    std::fs::write(&open_config, toml::to_string(&cfg).unwrap()).unwrap();
    let open_path = open_config.display().to_string();
    // `restart`: the launch fingerprint covers only what both ranks must agree on, so a rank-0
    // setting alone does not make `up` restart the pair.
    let up = sd(&["--config", &open_path, "restart"]).output().unwrap();
    assert!(up.status.success(), "{}", text(&up.stderr));
    let out = text(&up.stdout);
    assert!(out.contains("Key: none"), "{out}");
    let code = snippet(&out);
    assert!(code.contains("api_key=\"none\""), "{code}");
    let ok = run_python(&code, None);
    assert!(ok.status.success(), "no key needed: {}", text(&ok.stderr));
    let s = sd(&["--config", &open_path, "status"]).output().unwrap();
    assert_eq!(s.status.code(), Some(0), "{}", text(&s.stdout));

    // Half a pair: `status` is not serving; `logs` shows the rank that is left and names the other.
    let rm = Command::new("docker")
        .args(["rm", "-f", "sd-testbed-rank1"])
        .output()
        .unwrap();
    assert!(rm.status.success(), "{}", text(&rm.stderr));
    let s = with_config(&["status"]).output().unwrap();
    assert_eq!(s.status.code(), Some(1), "{}", text(&s.stdout));
    assert!(
        text(&s.stdout).contains(": degraded"),
        "{}",
        text(&s.stdout)
    );
    let l = with_config(&["logs"]).output().unwrap();
    assert!(l.status.success(), "{}", text(&l.stderr));
    assert!(text(&l.stdout).contains("[rank 0] "), "{}", text(&l.stdout));
    assert!(
        text(&l.stderr).contains("rank 1 on worker-1: no container sd-testbed-rank1"),
        "{}",
        text(&l.stderr)
    );
}

/// Reads a child's stderr lines on a thread.
fn stderr_lines_of(child: &mut Child) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    let err = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(err).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    rx
}

#[test]
fn testbed_progress_is_plain_lines_off_a_terminal_and_ctrl_c_exits_130() {
    // Off a terminal (stderr is a pipe here): plain progress lines, at every event with a zero
    // interval, each file with its own figures or the step's total; no bar redraws.
    let demo = Demo::up_with(&[("SPARK_DEPLOY_PROGRESS_INTERVAL", "0")]);
    let err = text(&demo.out.stderr);
    assert!(
        !err.contains('\r') && !err.contains('\u{1b}'),
        "no carriage returns or escape codes off a terminal"
    );
    let progress: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("    [") && l.contains(" / ") && l.contains("%)"))
        .collect();
    assert!(
        progress
            .iter()
            .any(|l| l.starts_with("    [head] FetchCheckpoint total: ")),
        "download total lines: {err}"
    );
    assert!(
        progress
            .iter()
            .any(|l| l.starts_with("    [worker-1] ConfigureWorkerStorage total: ")),
        "copy total lines: {err}"
    );
    assert!(!err.contains("-0.0 B/s"), "{err}");

    // Ctrl-C while `up` waits for the pair: exit 130, both ranks stopped, said once.
    let d = with_config(&["down"]).output().unwrap();
    assert!(d.status.success(), "{}", text(&d.stderr));
    let mut up = with_config(&["up"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let rx = stderr_lines_of(&mut up);
    let mut seen = Vec::new();
    assert!(
        wait_for(&rx, &mut seen, |l| l.starts_with("==> Smoke")),
        "up reached Smoke: {seen:?}"
    );
    let t = Instant::now();
    sigint(&up);
    let status = up.wait().unwrap();
    seen.extend(rx.try_iter());
    assert_eq!(status.code(), Some(130), "{seen:?}");
    assert!(t.elapsed() < Duration::from_secs(30), "stopped promptly");
    let all = seen.join("\n");
    assert_eq!(all.matches("interrupted (Ctrl-C)").count(), 1, "{all}");
    let s = with_config(&["status"]).output().unwrap();
    assert_eq!(s.status.code(), Some(1), "{}", text(&s.stdout));
}

fn container_id(name: &str) -> String {
    let o = Command::new("docker")
        .args(["inspect", "-f", "{{.Id}} {{.State.Running}}", name])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "docker inspect {name}: {}",
        text(&o.stderr)
    );
    text(&o.stdout).trim().to_owned()
}

#[test]
fn testbed_demo_and_testbed_up_reuse_a_running_deployment() {
    let _demo = Demo::up();
    let ids = || {
        [
            container_id("sd-testbed-rank0"),
            container_id("spark-deploy-testbed-worker-1"),
        ]
    };
    let before = ids();
    assert!(before.iter().all(|i| i.ends_with(" true")), "{before:?}");

    // A second demo: the testbed is used as it is (the worker container is the same one). The
    // demo re-imports its engine base image, a new image content, so `up` restarts the pair.
    let again = sd(&["demo"]).output().unwrap();
    assert!(again.status.success(), "{}", text(&again.stderr));
    let err = text(&again.stderr);
    assert!(err.contains("reusing the testbed that is up"), "{err}");
    assert!(!err.contains("bringing the testbed up"), "{err}");
    let after = ids();
    assert_eq!(after[1], before[1], "the testbed's worker was not replaced");
    let before = after;
    let config = std::fs::read_to_string(CONFIG).unwrap();

    // `testbed up` over a running deployment: reused, its config kept.
    let up = sd(&["testbed", "up"]).output().unwrap();
    assert!(up.status.success(), "{}", text(&up.stderr));
    let out = text(&up.stdout);
    assert!(
        out.contains("already up: reused as it is") && out.contains("(kept)"),
        "{out}"
    );
    assert_eq!(ids(), before, "nothing was torn down or restarted");
    assert_eq!(
        std::fs::read_to_string(CONFIG).unwrap(),
        config,
        "the demo's config is kept"
    );
    let s = with_config(&["status"]).output().unwrap();
    assert_eq!(
        s.status.code(),
        Some(0),
        "still serving: {}",
        text(&s.stdout)
    );
}

/// Reboot persistence: the worker Spark restarts (its container: sshd, fabric address and rank
/// 1's network namespace all go away and come back). `service boot`, what the unit runs after
/// boot, waits for the fabric link and the worker's SSH, finds the pair not serving, and brings
/// it back worker-first to a real generation.
#[test]
#[allow(clippy::print_stderr)]
fn testbed_service_boot_brings_the_pair_back_after_a_worker_restart() {
    let _demo = Demo::up();
    let rank1_before = container_id("sd-testbed-rank1");

    let t = Instant::now();
    let r = Command::new("docker")
        .args(["restart", "-t", "1", "spark-deploy-testbed-worker-1"])
        .output()
        .unwrap();
    assert!(r.status.success(), "docker restart: {}", text(&r.stderr));
    let restart_s = t.elapsed().as_secs_f64();

    let t = Instant::now();
    let boot = with_config(&["service", "boot", "--no-watch", "--timeout", "120"])
        .output()
        .unwrap();
    let boot_s = t.elapsed().as_secs_f64();
    let err = text(&boot.stderr);
    assert!(
        boot.status.success(),
        "service boot failed:\n{}\n{err}",
        text(&boot.stdout)
    );
    assert!(err.contains("the pair is reachable"), "{err}");
    assert!(err.contains("the pair does not serve"), "{err}");
    // Worker first: rank 1's start is logged before rank 0's.
    let (r1, r0) = (
        err.find("starting rank 1").expect("rank 1 started"),
        err.find("starting rank 0").expect("rank 0 started"),
    );
    assert!(r1 < r0, "rank 1 before rank 0:\n{err}");
    assert_ne!(
        container_id("sd-testbed-rank1"),
        rank1_before,
        "rank 1 is a new container"
    );

    let s = with_config(&["status"]).output().unwrap();
    assert_eq!(
        s.status.code(),
        Some(0),
        "serving again: {}",
        text(&s.stdout)
    );
    let v = with_config(&["validate", "--only", "text"])
        .output()
        .unwrap();
    assert!(
        v.status.success(),
        "a real generation: {}{}",
        text(&v.stdout),
        text(&v.stderr)
    );

    // A second boot (the unit restarted while the pair serves) changes nothing.
    let ids = (
        container_id("sd-testbed-rank0"),
        container_id("sd-testbed-rank1"),
    );
    let again = with_config(&["service", "boot", "--no-watch", "--timeout", "60"])
        .output()
        .unwrap();
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert!(
        text(&again.stderr).contains("already serving"),
        "{}",
        text(&again.stderr)
    );
    assert_eq!(
        (
            container_id("sd-testbed-rank0"),
            container_id("sd-testbed-rank1")
        ),
        ids
    );
    for l in err.lines().filter(|l| {
        l.starts_with("the pair is reachable") || l.starts_with("the pair does not serve")
    }) {
        eprintln!("service boot: {l}");
    }
    eprintln!(
        "worker restart: docker restart {restart_s:.1} s; service boot back to serving {boot_s:.1} s"
    );
}

// ---- A first deployment killed and resumed ----

/// Bytes the worker container received on its fabric interface (read in its network namespace).
fn fabric_rx(container: &str, addr: std::net::Ipv4Addr) -> u64 {
    let pid = text(
        &Command::new("docker")
            .args(["inspect", "-f", "{{.State.Pid}}", container])
            .output()
            .unwrap()
            .stdout,
    );
    let netns = |args: &[&str]| {
        let out = Command::new("nsenter")
            .args(["-t", pid.trim(), "-n"])
            .args(args)
            .output()
            .unwrap();
        text(&out.stdout)
    };
    let addrs = netns(&["ip", "-o", "-4", "addr", "show"]);
    let ifname = addrs
        .lines()
        .find(|l| l.contains(&format!("inet {addr}/")))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or_else(|| panic!("no interface with {addr}: {addrs}"))
        .to_owned();
    let dev = netns(&["cat", "/proc/net/dev"]);
    dev.lines()
        .find_map(|l| l.trim().strip_prefix(&format!("{ifname}:")))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no counters of {ifname}: {dev}"))
}

/// `up` with JSON events; the seconds from its start to ConfigureWorkerStorage's end (the data
/// moved), and whether it succeeded.
#[allow(clippy::print_stdout)]
fn timed_up(config: &std::path::Path) -> TimedUp {
    let t = Instant::now();
    let mut child = sd(&["--json", "--config", &config.display().to_string(), "up"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut moved = None;
    let (mut rank1_written, mut sent_ahead) = (false, 0u64);
    let mut follow_stopped = None;
    // The rank-1 file's events as (ms since the first event, step, bytes done/total, file
    // done), and every other event but progress: what the build and the copy did, and when.
    let mut trail: Vec<String> = Vec::new();
    let mut first_ts = None;
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if follow_stopped.is_none() && line.contains("as it is written stopped") {
            follow_stopped = Some(line.clone());
        }
        if moved.is_none()
            && line.contains("configure_worker_storage")
            && (line.contains("\"finished\"") || line.contains("\"skipped\""))
        {
            moved = Some(t.elapsed().as_secs_f64());
        }
        let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
        let ts = v["ts_ms"].as_i64().unwrap_or(0);
        let since = ts - *first_ts.get_or_insert(ts);
        if v["event"] != "progress" || !v["label"].as_str().unwrap_or("").starts_with("rank1of2") {
            if v["event"] != "progress" && trail.len() < 400 {
                let said: String = v["line"].as_str().unwrap_or("").chars().take(160).collect();
                trail.push(format!(
                    "{since:>6} {} {} {said}",
                    v["event"], v["source"]["step"]
                ));
            }
            continue;
        }
        if trail.len() < 400 {
            trail.push(format!(
                "{since:>6} {} {}/{} file {}",
                v["source"]["step"], v["bytes_done"], v["bytes_total"], v["file"]["done"]
            ));
        }
        if v["source"]["step"] == "build_rank_cache" {
            rank1_written = v["bytes_done"] == v["bytes_total"];
        } else if v["source"]["step"] == "configure_worker_storage" && !rank1_written {
            sent_ahead = sent_ahead.max(v["file"]["done"].as_u64().unwrap_or(0));
        }
    }
    let ok = child.wait().unwrap().success();
    // Shown with the test's output (a failure, or --nocapture).
    println!("the up's events (rank1of2 progress, and every other event but progress):");
    for t in &trail {
        println!("  {t}");
    }
    TimedUp {
        moved_s: moved.unwrap_or_else(|| t.elapsed().as_secs_f64()),
        ok,
        sent_ahead,
        follow_stopped,
    }
}

/// What [`timed_up`] saw.
struct TimedUp {
    /// Seconds until ConfigureWorkerStorage ended (the data moved).
    moved_s: f64,
    /// `up` succeeded.
    ok: bool,
    /// Bytes of the worker's rank file on the worker before the head had written all of it.
    sent_ahead: u64,
    /// The warning of a follow of a growing rank file that ended before the file was complete.
    follow_stopped: Option<String>,
}

/// The testbed and the deployment on it, taken down whatever happens.
struct Resumable {
    rt: tokio::runtime::Runtime,
    opts: spark_deploy_testbed::cluster::TestbedOptions,
    config: std::path::PathBuf,
}

impl Drop for Resumable {
    fn drop(&mut self) {
        let _ = sd(&["--config", &self.config.display().to_string(), "down"]).output();
        let _ = self
            .rt
            .block_on(spark_deploy_testbed::cluster::down(&self.opts));
    }
}

/// A first deployment over one 40 MB/s link is SIGKILLed at about 30 %, 60 % and 90 % of the time
/// its data takes to move (measured by an uninterrupted first deployment), then `up` runs again
/// to serving. What the hub served and what reached the worker's fabric interface beyond the
/// uninterrupted run's figures (re-fetched and re-sent bytes) stays under 1 % of them: finished
/// downloads, rank-file shards and copies are never redone, partial ones continue. In the
/// uninterrupted run, the worker's rank file starts moving while the head still writes it.
#[test]
#[allow(clippy::print_stdout)]
fn testbed_a_first_deploy_killed_at_30_60_and_90_percent_resumes_moving_under_1_percent_again() {
    use spark_deploy_testbed::checkpoint::CheckpointSpec;
    use spark_deploy_testbed::cluster::{self, TestbedOptions};
    use spark_deploy_testbed::hub_server::HubOptions;

    let rt = tokio::runtime::Runtime::new().unwrap();
    let opts = TestbedOptions {
        install_tools: true,
        ..TestbedOptions::default()
    };
    let info = rt.block_on(cluster::up(&opts)).unwrap();
    let config_path = info.state_dir.join("resume.toml");
    let tb = Resumable {
        rt,
        opts,
        config: config_path.clone(),
    };
    let home = std::env::var_os("HOME").map_or_else(|| "/root".into(), std::path::PathBuf::from);
    let repos = info.state_dir.join("hub-repos-medium-330mb-8shards");
    spark_deploy_testbed::demo::hub_tree_of(&repos, &CheckpointSpec::medium(9)).unwrap();
    let exe = std::path::PathBuf::from(env!("CARGO_BIN_EXE_spark-deploy"));
    let (hub, config) = tb
        .rt
        .block_on(spark_deploy_testbed::demo::prepare_on(
            &info,
            &home,
            Some(&exe),
            &repos,
            HubOptions {
                link_rate: std::num::NonZeroU64::new(40_000_000),
                ..HubOptions::default()
            },
        ))
        .unwrap();
    std::fs::write(&config_path, toml::to_string_pretty(&config).unwrap()).unwrap();
    let v = spark_deploy_core::config::validate(config, &home).unwrap();
    let w = &info.workers[0];
    let fresh = || {
        let out = sd(&["--config", &config_path.display().to_string(), "down"])
            .output()
            .unwrap();
        assert!(out.status.success(), "down: {}", text(&out.stderr));
        spark_deploy_testbed::deployment::remove_deployment_files(&v, &info);
        (hub.bytes_served(), fabric_rx(&w.container, w.fabric_addr))
    };

    // The uninterrupted first deployment: what it moves, and how long moving it takes.
    let (h0, r0) = fresh();
    let TimedUp {
        moved_s,
        ok,
        sent_ahead,
        follow_stopped,
    } = timed_up(&config_path);
    assert!(ok, "the uninterrupted up failed");
    // Followed to its end: the rank file's pull took the worker's sum, it did not resume.
    assert_eq!(follow_stopped, None);
    let fetched = hub.bytes_served() - h0;
    let received = fabric_rx(&w.container, w.fabric_addr) - r0;
    println!(
        "uninterrupted: {fetched} bytes from the hub, {received} bytes to the worker, data moved in {moved_s:.1} s; {sent_ahead} bytes of the worker's rank file sent while the head still wrote it"
    );
    // The worker's rank file starts moving while the head still builds it (its final start).
    assert!(
        sent_ahead >= 32 << 20,
        "the rank file moved only once built: {sent_ahead} bytes sent ahead"
    );
    assert!(
        fetched > 100_000_000,
        "a checkpoint worth interrupting: {fetched} bytes"
    );

    for pct in [30u32, 60, 90] {
        let (h0, r0) = fresh();
        let mut child = sd(&["--config", &config_path.display().to_string(), "up"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_secs_f64(moved_s * f64::from(pct) / 100.0));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let at_kill = hub.bytes_served() - h0;
        assert!(
            timed_up(&config_path).ok,
            "{pct} %: up after the kill failed"
        );
        let refetched = (hub.bytes_served() - h0).saturating_sub(fetched);
        let resent = (fabric_rx(&w.container, w.fabric_addr) - r0).saturating_sub(received);
        println!(
            "killed at {pct} % ({at_kill} bytes fetched by then): re-fetched {refetched} bytes ({:.3} %), re-sent {resent} bytes ({:.3} %)",
            refetched as f64 * 100.0 / fetched as f64,
            resent as f64 * 100.0 / received as f64
        );
        assert!(
            refetched * 100 <= fetched,
            "{pct} %: re-fetched {refetched} of {fetched} bytes"
        );
        assert!(
            resent * 100 <= received,
            "{pct} %: re-sent {resent} of {received} bytes"
        );
    }
    drop(hub);
    drop(tb);
}
