//! The fault suite of `spark-deploy watch` on the testbed, one test per fault: the pair is
//! deployed with the standard plan, the supervisor runs in the test's runtime, the fault is
//! injected for real (signals through Docker, the stand-in's fault file, a lowered meminfo fact,
//! a restarted worker container, a stopped sshd), and each test prints one row: detection time,
//! action, time back to serving, each with its goal.
//!
//! Checked here: every fault is detected and acted on as its row says (a heal that starts and
//! finishes, a pair serving again with both ranks running); both ranks' logs saved for every heal;
//! never one rank left running alone; a blip never healed; a user's `down` never undone. The
//! goals' times (a dead rank found within 5 s; a wedge within 30 s of its onset with the default
//! `wedge_s`; serving again within the engine's load time + 10 s after detection) are speed goals:
//! `scripts/bench-watch` runs this suite and checks each row against its goal, on a quiet host.
//! Here they are only bounded by how long a test waits (a busy CI host runs them slower).

// An integration test: a failed unwrap or expect is the test failure, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use spark_deploy_core::config::{DeploymentConfig, ValidatedConfig, validate};
use spark_deploy_core::event::{Event, Level, Recorder, Source};
use spark_deploy_core::lifecycle::watch_state::WatchFiles;
use spark_deploy_core::plan::{Plan, Verb};
use spark_deploy_core::run::Context;
use spark_deploy_core::supervise;
use spark_deploy_testbed::cluster::TestbedInfo;
use spark_deploy_testbed::host_facts;

mod common;

use common::testbed::{R, on_testbed, on_testbed_with};

const RANK0: &str = "sd-testbed-rank0";
const RANK1: &str = "sd-testbed-rank1";

/// A deployed pair under a running supervisor.
struct Watched {
    _hub: spark_deploy_testbed::hub_server::HubServer,
    v: ValidatedConfig,
    rec: Recorder,
    ctx: Arc<Context>,
    key: String,
}

impl Watched {
    fn files(&self) -> WatchFiles {
        WatchFiles::of(Path::new(&self.v.config().deployment.state_dir))
    }

    /// The first supervisor event matching `f` after `skip` events, polled until `timeout`.
    async fn wait(&self, timeout: Duration, f: impl Fn(&Event) -> bool) -> Option<Instant> {
        let t = Instant::now();
        while t.elapsed() < timeout {
            if self
                .rec
                .events()
                .iter()
                .any(|e| matches!(e.source(), Source::Supervisor(_)) && f(e))
            {
                return Some(Instant::now());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        None
    }

    fn lines(&self) -> Vec<String> {
        self.rec
            .events()
            .iter()
            .filter(|e| matches!(e.source(), Source::Supervisor(_)))
            .map(|e| match e {
                Event::Log { line, .. } => line.clone(),
                Event::Started { message, .. } => format!("started: {message}"),
                Event::Failed { error, .. } => format!("failed: {error}"),
                Event::Finished { duration_ms, .. } => format!("finished in {duration_ms} ms"),
                other => format!("{other:?}"),
            })
            .collect()
    }

    /// Runs the supervisor while `scenario` runs (in this task: the plans it runs are not `Send`),
    /// then cancels it and takes the pair down.
    async fn run(&self, scenario: impl std::future::Future<Output = R<()>>) -> R<()> {
        let scenario = async {
            let r = async {
                self.wait(
                    Duration::from_secs(20),
                    |e| matches!(e, Event::Log { line, .. } if line.starts_with("decision: ")),
                )
                .await
                .ok_or("watch decided nothing")?;
                scenario.await
            }
            .await;
            self.ctx.cancel();
            r
        };
        // Boxed: both are large futures (plan runs inside), kept off the test thread's stack.
        let (watched, r) = tokio::join!(Box::pin(supervise::watch(&self.ctx)), Box::pin(scenario));
        r?;
        watched?;
        Plan::teardown(&self.v)
            .run(&Context::new(self.v.clone(), Arc::new(Recorder::default())))
            .await?;
        Ok(())
    }
}

fn heal_started(e: &Event) -> bool {
    matches!(e, Event::Started { message, .. } if message.starts_with("healing") || message.starts_with("stopping the pair"))
}

fn heal_finished(e: &Event) -> bool {
    matches!(e, Event::Finished { .. })
}

/// Deploys the testbed pair (`tweak` applied to the config) and starts watching it.
async fn deploy_and_watch(
    info: &TestbedInfo,
    home: &Path,
    tweak: impl FnOnce(&mut DeploymentConfig),
) -> R<Watched> {
    let (hub, mut config) = spark_deploy_testbed::demo::prepare(info, home).await?;
    config.watch.interval_s = 1.0;
    config.watch.wedge_s = 6.0;
    config.watch.probe_idle_s = 30.0;
    config.watch.probe_timeout_s = 5.0;
    tweak(&mut config);
    let v = validate(config, home)?;
    // A fresh watch history per test (the flap count lives in it).
    let _ = std::fs::remove_dir_all(Path::new(&v.config().deployment.state_dir).join("watch"));
    Plan::for_verb(&v, Verb::Up)
        .run(&Context::new(v.clone(), Arc::new(Recorder::default())))
        .await?;
    let key =
        spark_deploy_core::lifecycle::api_key::read(Path::new(&v.config().serving.api_key_file))?
            .expose()
            .to_owned();
    let rec = Recorder::default();
    let ctx = Arc::new(Context::new(v.clone(), Arc::new(rec.clone())));
    Ok(Watched {
        _hub: hub,
        v,
        rec,
        ctx,
        key,
    })
}

fn docker(args: &[&str]) -> R<String> {
    let o = std::process::Command::new("docker").args(args).output()?;
    if !o.status.success() {
        return Err(format!(
            "docker {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr)
        )
        .into());
    }
    Ok(String::from_utf8_lossy(&o.stdout).trim().to_owned())
}

fn running(name: &str) -> bool {
    docker(&["inspect", "-f", "{{.State.Running}}", name]).is_ok_and(|s| s == "true")
}

async fn chat_ok(key: &str, timeout: Duration) -> bool {
    let r = reqwest::Client::new()
        .post("http://127.0.0.1:8888/v1/chat/completions")
        .bearer_auth(key)
        .timeout(timeout)
        .json(&serde_json::json!({"model": "DeepSeek-V4.1-Flash-1017", "messages": [{"role": "user", "content": "What is 6*7?"}], "max_tokens": 8, "chat_template_kwargs": {"enable_thinking": false}}))
        .send()
        .await;
    matches!(r, Ok(r) if r.status().is_success())
}

/// Requests in a loop (two at a time) until dropped: requests are running most of the time.
fn load(key: &str) -> tokio::task::JoinHandle<()> {
    let key = key.to_owned();
    tokio::spawn(async move {
        let client = reqwest::Client::new();
        let one = |client: reqwest::Client, key: String| async move {
            loop {
                let _ = client
                    .post("http://127.0.0.1:8888/v1/chat/completions")
                    .bearer_auth(&key)
                    .timeout(Duration::from_secs(90))
                    .json(&serde_json::json!({"model": "DeepSeek-V4.1-Flash-1017", "messages": [{"role": "user", "content": "Tell a long story."}], "max_tokens": 400, "ignore_eos": true, "chat_template_kwargs": {"enable_thinking": false}}))
                    .send()
                    .await
                    .map(|r| r.bytes());
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        tokio::join!(one(client.clone(), key.clone()), one(client, key));
    })
}

/// Rank 1's load time as the engine reports it (`loaded_s`).
fn loaded_s() -> f64 {
    docker(&["logs", RANK1])
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find_map(|j| j["loaded_s"].as_f64())
        .unwrap_or(0.0)
}

/// The heal directories (each must hold both ranks' logs).
fn heal_dirs(w: &Watched) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(w.files().heals())
        .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

fn assert_logs_saved(w: &Watched, heals: usize) {
    let dirs = heal_dirs(w);
    assert_eq!(dirs.len(), heals, "{dirs:?}");
    for d in dirs {
        for rank in 0..2 {
            let f = d.join(format!("rank{rank}.log"));
            assert!(f.is_file(), "{} missing", f.display());
        }
        assert!(d.join("finding.json").is_file());
    }
}

/// A fault's measured times and their goals.
#[derive(Default)]
struct Times {
    /// Seconds from the fault to the heal's start.
    detected: Option<f64>,
    /// Its goal.
    detect_goal: Option<f64>,
    /// Seconds from the fault to serving again.
    back: Option<f64>,
    /// The goal of `back - detected`: the engine's load + 10 s.
    back_goal: Option<f64>,
}

/// Prints the fault's row: `FAULT-ROW | fault | detected | goal | action | serving again | after
/// detection | goal |` (`scripts/bench-watch` reads them).
fn row(fault: &str, action: &str, t: &Times) {
    let s = |v: Option<f64>| v.map_or_else(|| "—".to_owned(), |v| format!("{v:.1} s"));
    let after = t.back.zip(t.detected).map(|(b, d)| b - d);
    eprintln!(
        "FAULT-ROW | {fault} | {} | {} | {action} | {} | {} | {} |",
        s(t.detected),
        s(t.detect_goal),
        s(t.back),
        s(after),
        s(t.back_goal)
    );
}

/// The supervisor's lines, printed, and `msg`: a failure's message stays short (it ends the
/// test's output) with what the watch said above it.
fn failure(w: &Watched, msg: &str) -> String {
    for l in w.lines() {
        eprintln!("watch: {l}");
    }
    msg.to_owned()
}

/// Injects `fault` at t0, waits for the heal to start and finish; checks what followed and prints
/// the row with its goals (`detect_goal`; serving again within the engine's load + 10 s).
async fn heal_row(
    w: &Watched,
    fault: &str,
    detect_goal: f64,
    inject: impl AsyncFnOnce() -> R<()>,
) -> R<()> {
    let t0 = Instant::now();
    inject().await?;
    let started = w
        .wait(Duration::from_secs(90), heal_started)
        .await
        .ok_or_else(|| failure(w, &format!("{fault}: no heal within 90 s")))?;
    let detected = started.duration_since(t0).as_secs_f64();
    let finished = w
        .wait(Duration::from_secs(180), heal_finished)
        .await
        .ok_or_else(|| failure(w, &format!("{fault}: the heal did not finish within 180 s")))?;
    let back = finished.duration_since(t0).as_secs_f64();
    assert!(
        chat_ok(&w.key, Duration::from_secs(20)).await,
        "{fault}: not serving after the heal"
    );
    assert!(
        running(RANK0) && running(RANK1),
        "{fault}: both ranks run after the heal"
    );
    let load = loaded_s();
    let why = w
        .lines()
        .into_iter()
        .find_map(|l| {
            l.strip_prefix("started: healing the pair: ")
                .map(str::to_owned)
        })
        .unwrap_or_default();
    row(
        fault,
        &format!("heal (stop 0,1; start 1,0; smoke) on: {why}"),
        &Times {
            detected: Some(detected),
            detect_goal: Some(detect_goal),
            back: Some(back),
            back_goal: Some(load + 10.0),
        },
    );
    assert_logs_saved(w, 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn testbed_watch_sigkill_rank1_heals_the_pair() {
    on_testbed(|info, home| async move {
        let w = deploy_and_watch(&info, &home, |_| {}).await?;
        w.run(async {
            heal_row(&w, "SIGKILL rank 1", 5.0, async || {
                docker(&["kill", "-s", "KILL", RANK1]).map(|_| ())
            })
            .await?;
            Ok(())
        })
        .await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn testbed_watch_sigkill_rank0_heals_the_pair() {
    on_testbed(|info, home| async move {
        let w = deploy_and_watch(&info, &home, |_| {}).await?;
        w.run(async {
            heal_row(&w, "SIGKILL rank 0", 5.0, async || {
                docker(&["kill", "-s", "KILL", RANK0]).map(|_| ())
            })
            .await?;
            // Then the user stops the pair: `down` writes the stop marker and watch never heals.
            Plan::for_verb(&w.v, Verb::Down)
                .run(&Context::new(w.v.clone(), Arc::new(Recorder::default())))
                .await?;
            w.wait(Duration::from_secs(30), |e| {
                matches!(e, Event::Log { line, .. } if line.contains("stop marker, not healing: stopped by the user (down)"))
            })
            .await
            .ok_or_else(|| failure(&w, "watch did not see the user's down within 30 s"))?;
            tokio::time::sleep(Duration::from_secs(4)).await;
            let heals = w.rec.events().iter().filter(|e| heal_started(e)).count();
            if heals != 1 {
                return Err(failure(&w, &format!("the user's down was healed: {heals} heals")).into());
            }
            assert!(!running(RANK0) && !running(RANK1));
            let st = supervise::status(Path::new(&w.v.config().deployment.state_dir));
            assert_eq!(st.stop_marker.as_deref(), Some("stopped by the user (down)"));
            Ok(())
        })
        .await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn testbed_watch_sigstop_rank1_under_load_is_a_wedge() {
    on_testbed(|info, home| async move {
        let w = deploy_and_watch(&info, &home, |_| {}).await?;
        w.run(async {
            let l = load(&w.key);
            tokio::time::sleep(Duration::from_secs(2)).await;
            // Requests already past their round trip to rank 1 finish first: the counter freezes
            // seconds after the signal, then wedge_s = 6 applies; the goal is the wedge goal, 30 s.
            heal_row(
                &w,
                "SIGSTOP rank 1 under load (wedge_s = 6)",
                30.0,
                async || docker(&["kill", "-s", "STOP", RANK1]).map(|_| ()),
            )
            .await?;
            l.abort();
            Ok(())
        })
        .await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn testbed_watch_standin_wedge_under_load_with_the_default_wedge_s() {
    on_testbed(|info, home| async move {
        let w = deploy_and_watch(&info, &home, |c| {
            let d = spark_deploy_core::config::WatchSection::default();
            c.watch.wedge_s = d.wedge_s;
            c.watch.probe_timeout_s = d.probe_timeout_s;
        })
        .await?;
        w.run(async {
            let l = load(&w.key);
            tokio::time::sleep(Duration::from_secs(2)).await;
            let fault = tempfile::NamedTempFile::new()?;
            std::fs::write(fault.path(), "wedge\n")?;
            let src = fault.path().display().to_string();
            heal_row(
                &w,
                "stand-in wedge under load (default wedge_s = 30)",
                30.0 + 2.0,
                async || {
                    docker(&["cp", &src, &format!("{RANK0}:/tmp/tf-standin-fault")]).map(|_| ())
                },
            )
            .await?;
            l.abort();
            Ok(())
        })
        .await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn testbed_watch_memory_floor_on_the_worker_stops_and_restarts_the_pair() {
    on_testbed(|info, home| async move {
        let w = deploy_and_watch(&info, &home, |_| {}).await?;
        w.run(async {
            let i2 = info.clone();
            let t0 = Instant::now();
            host_facts::lower_meminfo(&info, 1, 2.0)?;
            let started = w
                .wait(Duration::from_secs(30), heal_started)
                .await
                .ok_or_else(|| failure(&w, "no heal within 30 s"))?;
            // The host process is gone once the pair is stopped: the node has its memory back.
            host_facts::restore_meminfo(&i2, 1)?;
            let finished = w
                .wait(Duration::from_secs(180), heal_finished)
                .await
                .ok_or_else(|| failure(&w, "the heal did not finish within 180 s"))?;
            let detected = started.duration_since(t0).as_secs_f64();
            let back = finished.duration_since(t0).as_secs_f64();
            let decision = w
                .lines()
                .into_iter()
                .find(|l| l.contains("below the floor"))
                .ok_or("no memory decision")?;
            assert!(
                decision.contains("worker-1") && decision.contains("largest host process"),
                "{decision}"
            );
            assert!(chat_ok(&w.key, Duration::from_secs(20)).await);
            assert!(running(RANK0) && running(RANK1));
            assert_logs_saved(&w, 1);
            row(
                "memory floor on the worker (2.0 < 3 GiB)",
                "heal of the pair; process named",
                &Times {
                    detected: Some(detected),
                    detect_goal: Some(5.0),
                    back: Some(back),
                    back_goal: Some(loaded_s() + 10.0),
                },
            );
            Ok(())
        })
        .await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn testbed_watch_worker_container_restarted_brings_the_pair_back() {
    on_testbed(|info, home| async move {
        let w = deploy_and_watch(&info, &home, |_| {}).await?;
        w.run(async {
            let worker = info.workers[0].container.clone();
            // The reboot of a Spark: every process of the node ends (rank 1 runs in the worker
            // container's process namespace), its sshd comes back with the container, and rank 1's
            // container is found exited: a dead rank, goal 5 s.
            heal_row(&w, "worker container restarted (reboot)", 5.0, async || {
                docker(&["restart", "-t", "1", &worker]).map(|_| ())
            })
            .await?;
            Ok(())
        })
        .await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn testbed_watch_worker_sshd_stopped_20_s_is_reported_never_healed() {
    on_testbed(|info, home| async move {
        let w = deploy_and_watch(&info, &home, |_| {}).await?;
        w.run(async {
            let worker = info.workers[0].container.clone();
            let d = info.head_docker()?;
            let t0 = Instant::now();
            spark_deploy_testbed::cluster::worker::stop_sshd(&d, &worker).await?;
            let mut served = 0;
            let mut failed = 0;
            while t0.elapsed() < Duration::from_secs(20) {
                if chat_ok(&w.key, Duration::from_secs(5)).await {
                    served += 1;
                } else {
                    failed += 1;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            spark_deploy_testbed::cluster::worker::start_sshd(&d, &worker).await?;
            tokio::time::sleep(Duration::from_secs(5)).await;
            let blip = w
                .lines()
                .into_iter()
                .find(|l| l.contains("control-plane blip"));
            if w.rec.events().iter().any(heal_started) {
                return Err(failure(&w, "healed a blip").into());
            }
            assert_eq!(failed, 0, "rank 0 kept serving ({served} ok)");
            assert!(running(RANK0) && running(RANK1));
            row(
                "worker sshd stopped 20 s while serving",
                &format!(
                    "no heal; {} ({served} requests served meanwhile)",
                    if blip.is_some() {
                        "blip reported"
                    } else {
                        "the open SSH session kept answering"
                    }
                ),
                &Times {
                    back: Some(0.0),
                    ..Times::default()
                },
            );
            Ok(())
        })
        .await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn testbed_watch_crash_loop_hits_the_flap_limit_and_stays_down() {
    on_testbed(|info, home| async move {
        let w = deploy_and_watch(&info, &home, |c| {
            c.engine
                .env
                .insert("TF_STANDIN_FAULT".into(), "crash_loop".into());
            c.watch.max_heals_per_hour = 2;
        })
        .await?;
        w.run(async {
            let t0 = Instant::now();
            let stopped = w
            .wait(Duration::from_secs(240), |e| {
                matches!(e, Event::Failed { error, .. } if error.contains("max_heals_per_hour"))
            })
            .await
            .ok_or_else(|| failure(&w, "no flap stop within 240 s"))?;
            let marker = w.files().read_stop().ok_or("no stop marker")?;
            assert!(marker.contains("max_heals_per_hour = 2"), "{marker}");
            assert!(!running(RANK0) && !running(RANK1), "both ranks down");
            assert_logs_saved(&w, 3);
            // It stays down: no heal while the marker is there.
            tokio::time::sleep(Duration::from_secs(5)).await;
            assert!(!running(RANK0) && !running(RANK1));
            let status = supervise::status(Path::new(&w.v.config().deployment.state_dir));
            assert_eq!(status.stop_marker.as_deref(), Some(marker.as_str()));
            let levels = w
                .rec
                .events()
                .iter()
                .filter(|e| {
                    matches!(
                        e,
                        Event::Log {
                            level: Level::Error,
                            ..
                        }
                    )
                })
                .count();
            assert!(levels >= 3, "every finding that acted is an error event");
            row(
                "crash loop (rank 1 exits 8 s after start), max_heals_per_hour = 2",
                "2 heals, then stopped for good; stop marker written",
                &Times {
                    detected: Some(stopped.duration_since(t0).as_secs_f64()),
                    ..Times::default()
                },
            );
            Ok(())
        })
        .await
    })
    .await;
}

/// Four nodes (three workers, the TP=4 profile), the whole path in one test: `up` runs every step
/// on four nodes (each worker fed its own W=4 rank file at once, every node's file verified), the
/// four ranks serve with the split proof over four, followers start 3, 2, 1 and join their own
/// ports; then follower 2 is killed: the watch stops all four (every log saved) and starts all
/// four again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn testbed_four_nodes_serve_and_a_killed_follower_heals_all_four() {
    on_testbed_with(3, |info, home| async move {
        let w = deploy_and_watch(&info, &home, |_| {}).await?;
        let c = w.v.config();
        assert_eq!(c.nodes.len(), 4);
        let ranks: Vec<String> = (0..4).map(|r| format!("sd-testbed-rank{r}")).collect();
        for (r, name) in ranks.iter().enumerate() {
            assert!(running(name), "rank {r} runs");
            // Each node holds exactly its own rank's W=4 file.
            let layout = spark_deploy_core::layout::NodeLayout::of(&w.v, &c.nodes[r]);
            let files: Vec<String> =
                std::fs::read_dir(Path::new(&layout.inputs_dir).join("rank-cache"))?
                    .filter_map(Result::ok)
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.ends_with(".bin"))
                    .collect();
            let own = format!("rank{r}of4-");
            assert!(
                files.iter().any(|f| f.starts_with(&own)),
                "{} on node {r}: {files:?}",
                own
            );
            if r > 0 {
                assert_eq!(
                    files.len(),
                    1,
                    "a worker holds only its own rank file: {files:?}"
                );
                let argv = docker(&["inspect", "-f", "{{json .Config.Cmd}}", name])?;
                let argv: Vec<String> = serde_json::from_str(&argv)?;
                assert_eq!(argv[3..5], [r.to_string(), "4".to_owned()], "{argv:?}");
                for flag in ["--round-rows", "--streams", "--context"] {
                    assert!(argv.iter().any(|a| a == flag), "{flag} in {argv:?}");
                }
            }
        }
        // The follower starts, in order: 3, 2, 1, then rank 0.
        let started = |n: &str| docker(&["inspect", "-f", "{{.State.StartedAt}}", n]);
        let times: Vec<String> = ranks.iter().rev().map(|n| started(n)).collect::<R<_>>()?;
        assert!(
            times.windows(2).all(|p| p[0] <= p[1]),
            "start order 3, 2, 1, 0: {times:?}"
        );
        let health: serde_json::Value = reqwest::get("http://127.0.0.1:8888/health")
            .await?
            .json()
            .await?;
        assert_eq!(health["split_proof"]["ok"], true, "{health}");
        assert!(
            chat_ok(&w.key, Duration::from_secs(20)).await,
            "four ranks serve"
        );
        let ids = || -> R<Vec<String>> {
            ranks
                .iter()
                .map(|n| docker(&["inspect", "-f", "{{.Id}}", n]))
                .collect()
        };
        let before = ids()?;
        w.run(async {
            let t0 = Instant::now();
            docker(&["kill", "-s", "KILL", "sd-testbed-rank2"])?;
            w.wait(Duration::from_secs(60), heal_started)
                .await
                .ok_or_else(|| failure(&w, "no heal within 60 s"))?;
            let detected = t0.elapsed().as_secs_f64();
            w.wait(Duration::from_secs(180), heal_finished)
                .await
                .ok_or_else(|| failure(&w, "the heal did not finish within 180 s"))?;
            let back = t0.elapsed().as_secs_f64();
            assert!(
                chat_ok(&w.key, Duration::from_secs(20)).await,
                "serving after the heal"
            );
            let after = ids()?;
            for (r, (a, b)) in before.iter().zip(&after).enumerate() {
                assert_ne!(
                    a, b,
                    "rank {r} was stopped and started again with the others"
                );
                assert!(running(&ranks[r]), "rank {r} runs after the heal");
            }
            let dirs = heal_dirs(&w);
            assert_eq!(dirs.len(), 1, "{dirs:?}");
            for r in 0..4 {
                assert!(
                    dirs[0].join(format!("rank{r}.log")).is_file(),
                    "rank {r}'s log saved"
                );
            }
            row(
                "SIGKILL rank 2 of 4",
                "heal all four (stop 0,1,2,3; start 3,2,1,0; smoke)",
                &Times {
                    detected: Some(detected),
                    detect_goal: Some(5.0),
                    back: Some(back),
                    back_goal: Some(loaded_s() + 10.0),
                },
            );
            Ok(())
        })
        .await
    })
    .await;
}
