//! Smoke tells "the rank exited" from "Docker did not answer".
//!
//! The pair is brought up on the testbed by the standard plan (the stand-in engine, real Docker,
//! real SSH). Then Smoke runs alone with the worker's Docker port bound to a unix-socket proxy
//! this test controls, in front of the same daemon: for the first seconds the proxy drops every
//! connection (the worker's Docker does not answer), then it forwards them. Smoke must wait
//! through the outage and pass, and nothing may be stopped. Then rank 1 is killed for real:
//! Smoke must fail promptly, naming rank 1, and stop rank 0 too (both ranks or neither).

// An integration test: a failed unwrap or expect is the test failure, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use spark_deploy_core::config::validate;
use spark_deploy_core::event::{Event, Recorder, Source, StepKind};
use spark_deploy_core::plan::Plan;
use spark_deploy_core::ports::docker::{DEFAULT_SOCKET, DockerNode};
use spark_deploy_core::run::Context;
use tokio::net::{UnixListener, UnixStream};

use common::testbed::{R, on_testbed};

/// A unix-socket proxy in front of a Docker socket that answers only while `up` is set; while it
/// is not, every connection is closed at once, unanswered.
struct DockerProxy {
    socket: PathBuf,
    up: Arc<AtomicBool>,
    dropped: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl DockerProxy {
    fn start(dir: &Path, daemon: &'static str) -> R<Self> {
        let socket = dir.join("docker.sock");
        let listener = UnixListener::bind(&socket)?;
        let up = Arc::new(AtomicBool::new(false));
        let dropped = Arc::new(AtomicUsize::new(0));
        let (u, d) = (Arc::clone(&up), Arc::clone(&dropped));
        let task = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if !u.load(Ordering::SeqCst) {
                    d.fetch_add(1, Ordering::SeqCst);
                    drop(client);
                    continue;
                }
                tokio::spawn(async move {
                    if let Ok(mut server) = UnixStream::connect(daemon).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
            }
        });
        Ok(Self {
            socket,
            up,
            dropped,
            task,
        })
    }
}

impl Drop for DockerProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn running(name: &str) -> R<bool> {
    let out = std::process::Command::new("docker")
        .args(["inspect", "-f", "{{.State.Running}}", name])
        .output()?;
    Ok(String::from_utf8_lossy(&out.stdout).trim() == "true")
}

fn smoke_plan(v: &spark_deploy_core::config::ValidatedConfig) -> R<Plan> {
    let smoke = Plan::standard(v)
        .steps()
        .iter()
        .find(|s| s.kind() == StepKind::Smoke)
        .cloned()
        .ok_or("no Smoke in the standard plan")?;
    Ok(Plan::from_steps(v, vec![smoke]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn testbed_smoke_waits_out_a_docker_outage_but_not_an_exited_rank() {
    on_testbed(|info, home| async move {
        let (hub, config) = spark_deploy_testbed::demo::prepare(&info, &home).await?;
        let v = validate(config, &home)?;
        let result: R<()> = async {
            Plan::standard(&v)
                .run(&Context::new(v.clone(), Arc::new(Recorder::default())))
                .await?;
            let names = ["sd-testbed-rank0", "sd-testbed-rank1"];
            assert!(running(names[0])? && running(names[1])?, "the pair is up");

            // 1. The worker's Docker does not answer for 7 s (longer than Smoke's 5 s note), then
            // answers again: Smoke waits it out and passes; nothing is stopped.
            let dir = tempfile::tempdir()?;
            let proxy = DockerProxy::start(dir.path(), DEFAULT_SOCKET)?;
            let worker = v.config().nodes[1].name.clone();
            let rec = Recorder::default();
            let ctx = Context::new(v.clone(), Arc::new(rec.clone()))
                .with_docker(1, DockerNode::local(worker.clone(), &proxy.socket)?);
            let up = Arc::clone(&proxy.up);
            let outage = Duration::from_secs(7);
            let restore = tokio::spawn(async move {
                tokio::time::sleep(outage).await;
                up.store(true, Ordering::SeqCst);
            });
            let start = Instant::now();
            let smoke = smoke_plan(&v)?.run(&ctx).await;
            let took = start.elapsed();
            restore.await?;
            let events = rec.events();
            smoke.map_err(|e| format!("{}\n{events:#?}", e.failure.chain()))?;
            assert!(
                took >= outage,
                "Smoke passed after {took:?}, before the outage ended"
            );
            assert!(
                proxy.dropped.load(Ordering::SeqCst) > 0,
                "Smoke asked the worker's Docker during the outage"
            );
            let lines: Vec<&str> = events
                .iter()
                .filter_map(|e| match e {
                    Event::Log {
                        source: Source::Step(StepKind::Smoke),
                        line,
                        ..
                    } => Some(line.as_str()),
                    _ => None,
                })
                .collect();
            assert!(
                lines.iter().any(|l| l.starts_with("waiting: ")
                    && l.contains(&format!("{worker}'s Docker did not answer"))),
                "Smoke said why it waited: {lines:#?}"
            );
            assert!(
                !events
                    .iter()
                    .any(|e| matches!(e, Event::Log { line, .. } if line.contains("stopped"))),
                "nothing was stopped: {events:#?}"
            );
            assert!(
                running(names[0])? && running(names[1])?,
                "both ranks still run"
            );
            drop(ctx);
            drop(proxy);

            // 2. Rank 1 really exits: Smoke fails promptly, names rank 1 on the worker, and stops
            // rank 0 too. The readiness timeout (lifecycle.ready_timeout_s) is far longer.
            std::process::Command::new("docker")
                .args(["kill", names[1]])
                .output()?;
            let rec = Recorder::default();
            let ctx = Context::new(v.clone(), Arc::new(rec.clone()));
            let start = Instant::now();
            let err = smoke_plan(&v)?
                .run(&ctx)
                .await
                .expect_err("Smoke must fail with rank 1 dead");
            let took = start.elapsed();
            assert!(
                took < Duration::from_secs(10) && v.config().lifecycle.ready_timeout_s > 60,
                "failed after {took:?}"
            );
            assert_eq!(err.failure.step, StepKind::Smoke);
            assert_eq!(err.failure.rank, Some(1), "{}", err.failure.chain());
            assert_eq!(err.failure.node.as_deref(), Some(worker.as_str()));
            assert!(
                err.failure.chain().contains("rank 1 (sd-testbed-rank1 on"),
                "{}",
                err.failure.chain()
            );
            assert!(!running(names[0])?, "rank 0 was stopped too");
            #[allow(clippy::print_stderr)]
            {
                eprintln!("an exited rank failed Smoke after {took:.2?}");
            }
            Ok(())
        }
        .await;
        let stop = Plan::teardown(&v)
            .run(&Context::new(v.clone(), Arc::new(Recorder::default())))
            .await;
        drop(hub);
        result?;
        stop.map_err(|e| e.failure.chain())?;
        Ok(())
    })
    .await;
}
