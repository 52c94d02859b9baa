//! Running a plan: each step's `run` through the ports, events for everything, a report at the end.
//!
//! # Guarantees
//!
//! - Steps run in plan order; the first failure stops the run.
//! - Both ranks or neither: when LaunchRank or Smoke fails (a rank exits, readiness times out,
//!   the generation is wrong), every rank container of the deployment is stopped, rank 0 first,
//!   and its log saved before the error is returned; after any other failure, the ranks this run
//!   started are stopped.
//! - One run at a time per deployment: the run holds `<state_dir>/deploy.lock`.
//! - Cancellation ([`Context::cancel`]) is honoured at every step boundary and inside long steps;
//!   it counts as a failure for the guarantee above.

mod context;

use std::time::Instant;

use serde::Serialize;

pub use context::{Context, node_target};

use crate::event::Event;
use crate::plan::{Plan, Step, StepKind};

/// What a step did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The step did its work.
    Done {
        /// Bytes moved, when any.
        bytes: Option<u64>,
    },
    /// Nothing to do.
    Skipped {
        /// Why (e.g. "all 43 files present and verified").
        reason: String,
    },
}

/// A step's failure: which step, the error chain, and what to do.
#[derive(Debug, thiserror::Error)]
#[error("{step:?} failed: {source}")]
pub struct StepFailure {
    /// The step.
    pub step: StepKind,
    /// The underlying error.
    #[source]
    pub source: Box<dyn std::error::Error + Send + Sync>,
    /// What the user can do.
    pub remedy: Option<String>,
}

impl StepFailure {
    /// Wraps `source` for `step`.
    pub fn new(
        step: StepKind,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
        remedy: Option<String>,
    ) -> Self {
        Self {
            step,
            source: source.into(),
            remedy,
        }
    }

    /// The error as one string (module errors already carry their sources' text).
    #[must_use]
    pub fn chain(&self) -> String {
        self.source.to_string()
    }
}

/// One line of the run report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StepReport {
    /// The step.
    pub step: StepKind,
    /// `ran`, `skipped` or `failed`.
    pub status: &'static str,
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

/// A failed run: the report so far and the failure.
#[derive(Debug, thiserror::Error)]
#[error("{failure}")]
pub struct RunError {
    /// Steps up to and including the failed one.
    pub report: RunReport,
    /// The failure.
    #[source]
    pub failure: StepFailure,
}

/// How long a step moving bytes may take, once cancelled, to end its transfers cleanly.
const CANCEL_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

fn millis(t: Instant) -> u64 {
    u64::try_from(t.elapsed().as_millis()).unwrap_or(u64::MAX)
}

async fn run_step(step: &Step, ctx: &Context) -> Result<Outcome, StepFailure> {
    if ctx.is_cancelled() {
        return Err(StepFailure::new(
            step.kind(),
            "cancelled before the step started",
            None,
        ));
    }
    let work = async {
        match step {
            Step::Preflight(s) => s.run(ctx).await,
            Step::FetchCheckpoint(s) => s.run(ctx).await,
            Step::BuildRankCache(s) => s.run(ctx).await,
            Step::ConfigureWorkerStorage(s) => s.run(ctx).await,
            Step::BuildImage(s) => s.run(ctx).await,
            Step::LaunchRank(s) => s.run(ctx).await,
            Step::Smoke(s) => s.run(ctx).await,
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

impl Plan {
    /// Runs every step in order.
    ///
    /// # Errors
    ///
    /// [`RunError`] with the report so far; ranks started by this run are stopped first.
    pub async fn run(&self, ctx: &Context) -> Result<RunReport, RunError> {
        let mut report = RunReport::default();
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
        for step in self.steps() {
            let kind = step.kind();
            let t = Instant::now();
            ctx.emit(Event::Started {
                step: kind,
                message: step.describe().summary,
            });
            match run_step(step, ctx).await {
                Ok(Outcome::Done { bytes }) => {
                    let duration_ms = millis(t);
                    ctx.emit(Event::Finished {
                        step: kind,
                        duration_ms,
                        bytes,
                    });
                    report.steps.push(StepReport {
                        step: kind,
                        status: "ran",
                        detail: None,
                        duration_ms,
                        bytes,
                    });
                }
                Ok(Outcome::Skipped { reason }) => {
                    ctx.emit(Event::Skipped {
                        step: kind,
                        reason: reason.clone(),
                    });
                    report.steps.push(StepReport {
                        step: kind,
                        status: "skipped",
                        detail: Some(reason),
                        duration_ms: millis(t),
                        bytes: None,
                    });
                }
                Err(failure) => {
                    ctx.emit(Event::Failed {
                        step: kind,
                        error: failure.chain(),
                        remedy: failure.remedy.clone(),
                    });
                    report.steps.push(StepReport {
                        step: kind,
                        status: "failed",
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
            }
        }
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::config::{DeploymentConfig, validate};
    use crate::event::Recorder;

    /// A worker whose sshd accepts and never answers: preflight waits on it until cancelled.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cancel_abandons_a_waiting_preflight_at_once() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = std::thread::spawn(move || listener.accept().map(|(s, _)| s));
        let dir = tempfile::tempdir().unwrap();
        let (id, kh) = (dir.path().join("id"), dir.path().join("known_hosts"));
        std::fs::write(&id, "").unwrap();
        std::fs::write(&kh, "").unwrap();
        let mut raw = DeploymentConfig::default();
        raw.deployment.testbed = true;
        raw.deployment.name = "cancel-test-absent".into();
        raw.deployment.state_dir = dir.path().join("state").display().to_string();
        let w = &mut raw.nodes[1];
        w.ssh = "root@127.0.0.1".into();
        w.ssh_port = Some(port);
        w.identity_file = id.display().to_string();
        w.known_hosts = kh.display().to_string();
        let config = validate(raw, dir.path()).unwrap();
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
        assert_eq!(err.report.steps[0].status, "failed");
        drop(accepted);
    }
}
