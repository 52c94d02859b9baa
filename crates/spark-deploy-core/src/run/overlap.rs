//! FetchCheckpoint, BuildRankCache, ConfigureWorkerStorage and BuildImage at the same time
//! (`lifecycle.overlap`): the fetch links each file the moment it verifies, the build writes each
//! shard's entries as the shard lands, the copy sends each rank file as soon as it is final, and
//! the engine image is built and shipped meanwhile.
//! The steps coordinate through [`Context::stages`]; each emits its own `Started` at once and its
//! `Finished` (or `Skipped`) when it ends, so the events draw the overlap.
//!
//! All or nothing still holds: the first step to fail marks the stages failed, the others stop
//! at their next wait (a transfer gets a moment to put what arrived on disk, so the next run
//! resumes it), and the run reports that first failure.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{CANCEL_GRACE, run_step, settle};
use crate::config::PreparePolicy;
use crate::context::{Context, StepFailure};
use crate::engine::Engine;
use crate::event::{Event, StepKind};
use crate::plan::Step;

/// One step's outcome: its index in the plan, its report line or failure, its start.
pub(super) type Settled = (usize, Result<super::StepReport, StepFailure>, Instant);

/// The preparation steps that run together, in plan order: the first three always, BuildImage
/// when the plan has it next (it needs none of their files; in `nfs` mode it waits for the
/// volumes before checking their mounts).
const GROUP: [StepKind; 4] = [
    StepKind::FetchCheckpoint,
    StepKind::BuildRankCache,
    StepKind::ConfigureWorkerStorage,
    StepKind::BuildImage,
];

/// How many steps from `index` run together: the preparation steps in a row (at least the
/// first three; a fetch that downloads, `lifecycle.overlap` on, a policy that prepares), else 1.
pub(super) fn group_width(steps: &[Step], index: usize, ctx: &Context) -> usize {
    let width = steps[index..]
        .iter()
        .zip(GROUP)
        .take_while(|(s, k)| s.kind() == *k)
        .count();
    let in_a_row = width >= 3;
    let downloads = matches!(&steps[index], Step::FetchCheckpoint(f) if !f.verify_only);
    let on = ctx.config().config().lifecycle.overlap
        && ctx.prepare_policy() != PreparePolicy::Never
        && !ctx.is_dry_run();
    if in_a_row && downloads && on {
        width
    } else {
        1
    }
}

/// Resolves once an overlapped step has failed.
async fn another_failed(ctx: &Context) {
    while !ctx.stages().failed {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs `steps` (the group, starting at plan index `first`) at the same time. The outcomes in
/// plan order, except that the first failure in time comes first.
pub(super) async fn run_group(
    steps: &[Step],
    first: usize,
    ctx: &Context,
    engine: &dyn Engine,
) -> Vec<Settled> {
    ctx.set_overlapped(true);
    if engine.builds_while_fetching() {
        // The build says which shards it wants first once it has planned (or that it wants
        // none in particular); the fetch's large files wait a moment for that.
        ctx.expect_wish();
    }
    let first_failed: Mutex<Option<usize>> = Mutex::new(None);
    for step in steps {
        ctx.emit(Event::Started {
            source: step.kind().into(),
            message: format!("{} (overlapped)", step.describe().summary),
        });
    }
    let first_failed = &first_failed;
    let runs = steps.iter().enumerate().map(|(k, step)| async move {
        let t = Instant::now();
        let mut work = std::pin::pin!(run_step(step, ctx, engine));
        let result = tokio::select! {
            r = &mut work => r,
            () = another_failed(ctx) => {
                match tokio::time::timeout(CANCEL_GRACE, &mut work).await {
                    Ok(r) => r,
                    Err(_) => Err(StepFailure::new(
                        step.kind(),
                        "stopped: an overlapped step failed",
                        None,
                    )),
                }
            }
        };
        if result.is_err() {
            first_failed
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .get_or_insert(k);
            ctx.mark_stage(|s| s.failed = true);
        }
        (first + k, settle(ctx, step.kind(), result, t), t)
    });
    let mut out = futures::future::join_all(runs).await;
    ctx.set_overlapped(false);
    if let Some(k) = *first_failed
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
    {
        let real = out.remove(k);
        out.insert(0, real);
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::config::{DeploymentConfig, validate};
    use crate::event::{Recorder, Source};
    use crate::plan::Plan;

    /// The overlapped steps of a deployment whose Hub answers every request with a 500: the fetch
    /// fails, the build and the copy (waiting on it) stop at once, and the run reports the fetch's
    /// failure, its remedy, and no other.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_first_failure_stops_the_other_overlapped_steps() {
        let hub = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", hub.local_addr().unwrap());
        std::thread::spawn(move || {
            use std::io::{Read as _, Write as _};
            for mut s in hub.incoming().flatten() {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf);
                let _ = s.write_all(
                    b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                );
            }
        });
        let dir = tempfile::tempdir().unwrap();
        let mut raw = DeploymentConfig::default();
        raw.deployment.name = "overlap-failure".into();
        raw.deployment.state_dir = dir.path().join("state").display().to_string();
        raw.hub.cache = dir.path().join("hf").display().to_string();
        raw.hub.endpoint = endpoint;
        let config = validate(raw, dir.path()).unwrap();
        let steps: Vec<Step> = Plan::standard(&config)
            .steps()
            .iter()
            .filter(|s| {
                matches!(
                    s.kind(),
                    StepKind::FetchCheckpoint
                        | StepKind::BuildRankCache
                        | StepKind::ConfigureWorkerStorage
                )
            })
            .cloned()
            .collect();
        let plan = Plan::from_steps(&config, steps);
        let rec = Recorder::default();
        let ctx = Context::new(config.clone(), Arc::new(rec.clone()));
        let err = tokio::time::timeout(Duration::from_secs(60), plan.run(&ctx))
            .await
            .expect("the run ends")
            .expect_err("the fetch fails");
        assert_eq!(err.failure.step, StepKind::FetchCheckpoint, "{err}");
        assert!(err.failure.remedy.is_some(), "{err}");
        let events = rec.events();
        let started = |k: StepKind| {
            events
                .iter()
                .any(|e| matches!(e, Event::Started { source: Source::Step(s), .. } if *s == k))
        };
        assert!(
            started(StepKind::BuildRankCache) && started(StepKind::ConfigureWorkerStorage),
            "the three ran at once"
        );
        let failed: Vec<_> = events
            .iter()
            .filter_map(|e| match e {
                Event::Failed {
                    source: Source::Step(k),
                    ..
                } => Some(*k),
                _ => None,
            })
            .collect();
        assert_eq!(
            failed,
            vec![StepKind::FetchCheckpoint],
            "one failure reported"
        );
        assert!(
            !events.iter().any(|e| matches!(e, Event::Finished { .. })),
            "nothing else finished as if all was well"
        );
    }
}
