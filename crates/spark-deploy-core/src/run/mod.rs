//! Running a plan: each step's `run` through the ports, events for everything, a report at the end.
//!
//! # Guarantees
//!
//! - Steps run in plan order; the first failure stops the run. The preparation steps
//!   (FetchCheckpoint, BuildRankCache, ConfigureWorkerStorage, BuildImage) run at the same time
//!   when `lifecycle.overlap` is on (`overlap`): each uses a file the moment it is final, and the
//!   first of them to fail stops the others.
//! - Both ranks or neither: when LaunchRank or Smoke fails (a rank exits, readiness times out,
//!   the generation is wrong), every rank container of the deployment is stopped, rank 0 first,
//!   and its log saved before the error is returned; after any other failure, the ranks this run
//!   started are stopped.
//! - One run at a time per deployment: the run holds `<state_dir>/deploy.lock`.
//! - Cancellation ([`Context::cancel`]) is honoured at every step boundary and inside long steps;
//!   it counts as a failure for the guarantee above.

use std::time::Instant;

use serde::Serialize;

pub use crate::context::{Context, Outcome, StepFailure, node_target};
pub use dry_run::DryRun;
pub use generation::generation_tag;

mod dry_run;
mod generation;
mod overlap;

use crate::engine::Engine;
use crate::event::Event;
use crate::event::StepKind;
use crate::plan::{Plan, Step};

/// What happened to a step in a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StepStatus {
    /// The step did its work.
    Ran,
    /// It had nothing to do.
    Skipped,
    /// It failed (the run stopped there).
    Failed,
}

/// One line of the run report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StepReport {
    /// The step.
    pub step: StepKind,
    /// What happened.
    pub status: StepStatus,
    /// Skip reason or error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// Wall time.
    pub duration_ms: u64,
    /// Bytes moved.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
}

/// The report of a whole run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RunReport {
    /// One entry per step that started.
    pub steps: Vec<StepReport>,
}

/// A failed run: the report so far and the failure. Its message is the whole story on one line
/// (`Smoke failed: rank 1 … exited: …`, each cause once); the failure's fields carry the step,
/// remedy, node and rank.
#[derive(Debug, thiserror::Error)]
#[error("{failure}: {}", failure.chain())]
pub struct RunError {
    /// Steps up to and including the failed one.
    pub report: RunReport,
    /// The failure.
    pub failure: StepFailure,
}

/// How long a step moving bytes may take, once cancelled, to end its transfers cleanly.
const CANCEL_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

fn millis(t: Instant) -> u64 {
    u64::try_from(t.elapsed().as_millis()).unwrap_or(u64::MAX)
}

async fn run_step(step: &Step, ctx: &Context, engine: &dyn Engine) -> Result<Outcome, StepFailure> {
    if ctx.is_cancelled() {
        return Err(StepFailure::new(
            step.kind(),
            "cancelled before the step started",
            None,
        ));
    }
    if ctx.prepare_policy() == crate::config::PreparePolicy::Never
        && matches!(
            step.kind(),
            StepKind::ConfigureWorkerStorage | StepKind::BuildImage
        )
    {
        return Ok(Outcome::Skipped {
            reason: "PREPARE=0: left as it is (the launch still refuses ranks whose inputs or image differ)".into(),
        });
    }
    let work = async {
        match step {
            Step::Preflight(s) => s.run(ctx, engine).await,
            Step::FetchCheckpoint(s) => s.run(ctx, engine).await,
            Step::BuildRankCache(s) => s.run(ctx, engine).await,
            Step::ConfigureWorkerStorage(s) => s.run(ctx, engine).await,
            Step::BuildImage(s) => s.run(ctx, engine).await,
            Step::LaunchRank(s) => s.run(ctx, engine).await,
            Step::Smoke(s) => s.run(ctx, engine).await,
            Step::Stop(s) => s.run(ctx).await,
        }
    };
    // LaunchRank and Stop always run to their end (bounded) so that the both-or-neither cleanup
    // sees every container they started. Steps that move bytes (downloads, copies) see the
    // cancellation themselves and get CANCEL_GRACE to end their transfers and put what arrived
    // on disk, so their partial files resume next time; then they, and every other step, are
    // abandoned (preflight changes nothing).
    if matches!(step.kind(), StepKind::LaunchRank | StepKind::Stop) {
        return work.await;
    }
    let mut work = std::pin::pin!(work);
    tokio::select! {
        r = &mut work => r,
        () = ctx.cancelled() => {
            if matches!(
                step.kind(),
                StepKind::FetchCheckpoint | StepKind::ConfigureWorkerStorage | StepKind::BuildImage
            ) {
                let _ = tokio::time::timeout(CANCEL_GRACE, work).await;
            }
            Err(StepFailure::new(step.kind(), "cancelled", None))
        }
    }
}

/// Emits a step's `Finished` or `Skipped` event and returns its report line; a failure is
/// returned for the caller to report.
fn settle(
    ctx: &Context,
    kind: StepKind,
    result: Result<Outcome, StepFailure>,
    t: Instant,
) -> Result<StepReport, StepFailure> {
    match result? {
        Outcome::Done { bytes } => {
            let duration_ms = millis(t);
            ctx.emit(Event::Finished {
                source: kind.into(),
                duration_ms,
                bytes,
            });
            Ok(StepReport {
                step: kind,
                status: StepStatus::Ran,
                detail: None,
                duration_ms,
                bytes,
            })
        }
        Outcome::Skipped { reason } => {
            ctx.emit(Event::Skipped {
                source: kind.into(),
                reason: reason.clone(),
            });
            Ok(StepReport {
                step: kind,
                status: StepStatus::Skipped,
                detail: Some(reason),
                duration_ms: millis(t),
                bytes: None,
            })
        }
    }
}

impl Plan {
    /// Runs every step in order.
    ///
    /// # Errors
    ///
    /// [`RunError`] with the report so far; ranks started by this run are stopped first.
    pub async fn run(&self, ctx: &Context) -> Result<RunReport, RunError> {
        let mut report = RunReport::default();
        ctx.set_prepare_policy(self.prepare_policy());
        let state_dir = std::path::PathBuf::from(&ctx.config().config().deployment.state_dir);
        let _lock = crate::lifecycle::lock::DeploymentLock::acquire(&state_dir).map_err(|e| {
            let step = self.steps().first().map_or(StepKind::Preflight, Step::kind);
            RunError {
                report: RunReport::default(),
                failure: StepFailure::new(
                    step,
                    e,
                    Some("only one up/down/restart at a time".into()),
                ),
            }
        })?;
        let steps = self.steps();
        let engine = self.engine().as_ref();
        let mut index = 0;
        while index < steps.len() {
            // FetchCheckpoint, BuildRankCache and ConfigureWorkerStorage run overlapped when the
            // plan has them in a row (see `overlap`); every other step alone, in order.
            let width = overlap::group_width(steps, index, ctx);
            let outcomes = if width > 1 {
                overlap::run_group(&steps[index..index + width], index, ctx, engine).await
            } else {
                let step = &steps[index];
                let t = Instant::now();
                ctx.emit(Event::Started {
                    source: step.kind().into(),
                    message: step.describe().summary,
                });
                let r = run_step(step, ctx, engine).await;
                vec![(index, settle(ctx, step.kind(), r, t), t)]
            };
            index += width;
            let mut failed = None;
            for (at, settled, t) in outcomes {
                match settled {
                    Ok(line) => report.steps.push(line),
                    Err(failure) => {
                        failed = failed.or(Some((at, failure, t)));
                    }
                }
            }
            let Some((index, mut failure, t)) = failed else {
                continue;
            };
            let kind = steps[index].kind();
            // A plan that would stop the running ranks later (restart) failed before doing so:
            // say that the pair still serves.
            if steps[index + 1..]
                .iter()
                .any(|s| s.kind() == StepKind::Stop)
            {
                let kept = "nothing was stopped: the ranks that were running keep serving";
                failure.remedy = Some(match failure.remedy.take() {
                    Some(r) => format!("{r}; {kept}"),
                    None => kept.to_owned(),
                });
            }
            ctx.emit(Event::Failed {
                source: kind.into(),
                error: failure.chain(),
                remedy: failure.remedy.clone(),
            });
            report.steps.push(StepReport {
                step: kind,
                status: StepStatus::Failed,
                detail: Some(failure.chain()),
                duration_ms: millis(t),
                bytes: None,
            });
            if matches!(kind, StepKind::LaunchRank | StepKind::Smoke) {
                crate::steps::stop_deployment(ctx).await;
            } else {
                crate::steps::stop_started_ranks(ctx).await;
            }
            return Err(RunError { report, failure });
        }
        if report
            .steps
            .iter()
            .any(|s| s.step == StepKind::Smoke && s.status == StepStatus::Ran)
            && report
                .steps
                .iter()
                .any(|s| s.step == StepKind::LaunchRank && s.status == StepStatus::Ran)
        {
            generation::record_serving(ctx).await;
        }
        if let Err(e) =
            crate::lifecycle::watch_state::WatchFiles::of(&state_dir).apply(self.marker())
        {
            ctx.emit(Event::Log {
                source: self
                    .steps()
                    .last()
                    .map_or(StepKind::Stop, Step::kind)
                    .into(),
                node: None,
                level: crate::event::Level::Warn,
                line: format!("the watch stop marker: {e}"),
            });
        }
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::config::{DeploymentConfig, ValidatedConfig, validate};
    use crate::event::Recorder;

    /// A deployment named `name` whose worker is `root@127.0.0.1:port`, with empty key and
    /// known_hosts files in `dir`.
    fn worker_on_loopback(dir: &std::path::Path, name: &str, port: u16) -> ValidatedConfig {
        let (id, kh) = (dir.join("id"), dir.join("known_hosts"));
        std::fs::write(&id, "").unwrap();
        std::fs::write(&kh, "").unwrap();
        let mut raw = DeploymentConfig::default();
        raw.deployment.name = name.into();
        raw.deployment.state_dir = dir.join("state").display().to_string();
        let w = &mut raw.nodes[1];
        w.ssh = "root@127.0.0.1".into();
        w.ssh_port = Some(port);
        w.identity_file = id.display().to_string();
        w.known_hosts = kh.display().to_string();
        validate(raw, dir).unwrap()
    }

    /// A worker whose sshd accepts and never answers: preflight waits on it until cancelled.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cancel_abandons_a_waiting_preflight_at_once() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = std::thread::spawn(move || listener.accept().map(|(s, _)| s));
        let dir = tempfile::tempdir().unwrap();
        let config = worker_on_loopback(dir.path(), "cancel-test-absent", port);
        let ctx = Arc::new(Context::new(config.clone(), Arc::new(Recorder::default())));
        let plan = Plan::from_steps(
            &config,
            vec![Step::Preflight(crate::steps::Preflight::new(&config))],
        );
        let c = Arc::clone(&ctx);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            c.cancel();
        });
        let t = Instant::now();
        let err = plan.run(&ctx).await.unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        assert_eq!(err.failure.step, StepKind::Preflight);
        assert_eq!(err.failure.chain(), "cancelled");
        assert_eq!(err.report.steps[0].status, StepStatus::Failed);
        drop(accepted);
    }

    #[test]
    fn restart_prepares_before_it_stops() {
        let dir = tempfile::tempdir().unwrap();
        let config = validate(DeploymentConfig::default(), dir.path()).unwrap();
        let kinds: Vec<StepKind> = Plan::restart(&config)
            .steps()
            .iter()
            .map(Step::kind)
            .collect();
        assert_eq!(
            kinds,
            [
                StepKind::Preflight,
                StepKind::FetchCheckpoint,
                StepKind::BuildRankCache,
                StepKind::ConfigureWorkerStorage,
                StepKind::BuildImage,
                StepKind::Stop,
                StepKind::LaunchRank,
                StepKind::Smoke,
            ]
        );
        let prepare: Vec<StepKind> = Plan::prepare(&config)
            .steps()
            .iter()
            .map(Step::kind)
            .collect();
        assert_eq!(prepare, kinds[..5]);
    }

    /// A restart whose preflight fails (the worker refuses SSH) stops nothing and says so.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_restart_that_fails_before_the_stop_says_the_pair_keeps_serving() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let dir = tempfile::tempdir().unwrap();
        let config = worker_on_loopback(dir.path(), "restart-test-absent", port);
        let rec = Recorder::default();
        let ctx = Context::new(config.clone(), Arc::new(rec.clone()));
        let err = Plan::restart(&config).run(&ctx).await.unwrap_err();
        assert_eq!(err.failure.step, StepKind::Preflight);
        let remedy = err.failure.remedy.clone().unwrap_or_default();
        assert!(remedy.contains("keep serving"), "{remedy}");
        assert!(
            !rec.events()
                .iter()
                .any(|e| e.source() == &crate::event::Source::Step(StepKind::Stop)),
            "nothing may stop"
        );
    }
}
