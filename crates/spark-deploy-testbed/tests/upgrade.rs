//! `upgrade`, `rollback` and `history` on the testbed, one case after another on one deployment,
//! while a client polls the API throughout (one one-token answer every 50 ms):
//!
//! - a new generation whose engine fails at start → rolled back, generation 1 serves again;
//! - a new generation whose answers fail `validate` (the stand-in's `no_tool_call` fault: Smoke passes, the tool-call check does not) →
//!   rolled back;
//! - a new generation 20 % slower (the stand-in's decode rate) → rolled back;
//! - Ctrl-C during the preparation → nothing stopped (no gap in the answers);
//! - Ctrl-C during the switch → the old generation serves again;
//! - a good generation → accepted, the old one superseded;
//! - a heal by a `watch` started with the old config → starts the serving generation;
//! - `rollback` → the old generation serves again;
//! - another accepted upgrade retires the generation beyond `lifecycle.keep_generations` (1), and
//!   `rollback` skips it.
//!
//! Every upgrade holds `watch`'s pause lease while the old ranks stop, and gives it back.
//!
//! The downtime of an accepted switch, of a Ctrl-C'd switch and of `rollback` is the longest gap
//! between two good answers; a refused generation's rollback is timed from the refusal to the old
//! generation's first answer. Each must stay within the engine's load time (launch to first
//! token, as Smoke measured it) + 10 s.

// An integration test: a failed unwrap or expect is the test failure, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use spark_deploy_core::config::{DeploymentConfig, ValidatedConfig, validate};
use spark_deploy_core::event::{Event, EventSink, Recorder, Source, StepKind};
use spark_deploy_core::lifecycle::generations::GenerationState;
use spark_deploy_core::plan::Plan;
use spark_deploy_core::run::Context;
use spark_deploy_core::upgrade::{self, Options, UpgradeError};

use common::testbed::{R, on_testbed_removing_ranks};
use spark_deploy_testbed::poller::Poller;

/// The stand-in ten times faster than its defaults, so benches take seconds.
fn with_env(config: &DeploymentConfig, extra: &[(&str, &str)], home: &Path) -> R<ValidatedConfig> {
    let mut c = config.clone();
    c.engine
        .env
        .insert("TF_STANDIN_TIME_SCALE".into(), "10".into());
    for (k, v) in extra {
        c.engine.env.insert((*k).into(), (*v).into());
    }
    Ok(validate(c, home)?)
}

/// A sink that records and, on the first event `trigger` accepts, cancels the context.
struct CancelOn {
    rec: Recorder,
    ctx: OnceLock<Arc<Context>>,
    trigger: fn(&Event) -> bool,
    /// When the upgrade refused the new generation (and began restoring the old one).
    refused_at: Mutex<Option<Instant>>,
    /// The watch pause lease, and whether it existed when the old ranks were stopped.
    pause_file: std::path::PathBuf,
    paused_at_stop: AtomicBool,
}

impl EventSink for CancelOn {
    fn emit(&self, event: Event) {
        if (self.trigger)(&event)
            && let Some(c) = self.ctx.get()
        {
            c.cancel();
        }
        if matches!(
            &event,
            Event::Started {
                source: Source::Step(StepKind::Stop),
                ..
            }
        ) && self.pause_file.is_file()
        {
            self.paused_at_stop.store(true, Ordering::SeqCst);
        }
        if matches!(&event, Event::Log { line, .. } if line.starts_with("refused: ")) {
            *self.refused_at.lock().unwrap() = Some(Instant::now());
        }
        self.rec.emit(event);
    }
}

/// The upgrade's result, and when it refused the new generation.
async fn upgrade_to(
    v: &ValidatedConfig,
    cancel_on: Option<fn(&Event) -> bool>,
) -> (Result<upgrade::Upgraded, UpgradeError>, Option<Instant>) {
    let sink = Arc::new(CancelOn {
        rec: Recorder::default(),
        ctx: OnceLock::new(),
        trigger: cancel_on.unwrap_or(|_| false),
        refused_at: Mutex::new(None),
        pause_file: Path::new(&v.config().deployment.state_dir).join("watch/pause"),
        paused_at_stop: AtomicBool::new(false),
    });
    let ctx = Arc::new(Context::new(v.clone(), sink.clone()));
    let _ = sink.ctx.set(Arc::clone(&ctx));
    let r = upgrade::upgrade(&ctx, &Options::default()).await;
    let refused = *sink.refused_at.lock().unwrap();
    if r.is_ok() || refused.is_some() {
        assert!(
            sink.paused_at_stop.load(Ordering::SeqCst),
            "watch was paused while the old ranks stopped"
        );
    }
    assert!(
        !sink.pause_file.exists(),
        "the upgrade gave the pause lease back"
    );
    (r, refused)
}

/// The engine's load time on this testbed (launch to first token, as Smoke measured it) + 10 s.
fn downtime_bound(v: &ValidatedConfig) -> f64 {
    let t =
        spark_deploy_core::lifecycle::startup::read(Path::new(&v.config().deployment.state_dir))
            .ok()
            .flatten()
            .map_or(5.0, |t| t.first_token_s);
    t + 10.0
}

fn serving(v: &ValidatedConfig) -> u32 {
    upgrade::history(v).unwrap().serving().map_or(0, |g| g.id)
}

async fn scenario(info: &spark_deploy_testbed::cluster::TestbedInfo, home: &Path) -> R<()> {
    let (hub, config) = spark_deploy_testbed::demo::prepare(info, home).await?;
    let v1 = with_env(&config, &[], home)?;
    Plan::standard(&v1)
        .run(&Context::new(v1.clone(), Arc::new(Recorder::default())))
        .await
        .map_err(|e| format!("up: {e}"))?;
    assert_eq!(serving(&v1), 1, "the first up records generation 1");
    let poller = Poller::start(&v1)?;
    tokio::time::sleep(Duration::from_millis(300)).await;

    let refused = [
        (
            "fails at start",
            with_env(&config, &[("TF_STANDIN_DECODE_TPS", "not-a-rate")], home)?,
            "failed",
        ),
        (
            "fails validate",
            with_env(&config, &[("TF_STANDIN_FAULT", "no_tool_call")], home)?,
            "validate failed",
        ),
        (
            "20 % slower",
            with_env(&config, &[("TF_STANDIN_DECODE_TPS", "40")], home)?,
            "below the baseline",
        ),
    ];
    let bound = downtime_bound(&v1);
    for (case, v, why_has) in &refused {
        let t = Instant::now();
        let (r, refused_at) = upgrade_to(v, None).await;
        let e = r.expect_err(case);
        let (gap, good) = poller.gap(t, Instant::now());
        // The rollback's own downtime: the gap it opens (the new generation may still answer
        // after the refusal, until it is stopped), or, when nothing answered at the refusal,
        // the time to the old generation's first answer.
        let restore = refused_at.map_or(f64::INFINITY, |at| {
            let first = poller
                .first_good_after(at)
                .map_or(f64::INFINITY, |g| g.duration_since(at).as_secs_f64());
            first.max(poller.gap(at, Instant::now()).0)
        });
        eprintln!(
            "{case}: {e} — rollback restored serving in {restore:.2} s (bound {bound:.1} s); no answers for {gap:.2} s in all (the new generation's trial included); wall {:.1} s",
            t.elapsed().as_secs_f64()
        );
        match &e {
            UpgradeError::RolledBack { why, restored } => {
                assert!(why.contains(why_has), "{case}: {why}");
                assert_eq!(*restored, 1, "{case}");
            }
            other => panic!("{case}: expected a rollback, got {other}"),
        }
        assert!(good, "{case}: generation 1 answers again");
        assert!(restore <= bound, "{case}: the rollback took {restore:.1} s");
        assert_eq!(serving(&v1), 1, "{case}");
    }
    let h = upgrade::history(&v1)?;
    assert_eq!(
        h.generations
            .iter()
            .filter(|g| g.state == GenerationState::Rejected)
            .count(),
        3,
        "{h:?}"
    );
    assert!(
        h.generations[0].figures.is_some(),
        "the baseline was measured and kept"
    );

    let good_cfg = {
        let mut c = config.clone();
        c.serving.max_tokens /= 2;
        with_env(&c, &[], home)?
    };
    // Ctrl-C during the preparation (at Preflight's start): nothing stopped, no gap.
    let t = Instant::now();
    let e = upgrade_to(
        &good_cfg,
        Some(|e| {
            matches!(
                e,
                Event::Started {
                    source: Source::Step(StepKind::Preflight),
                    ..
                }
            )
        }),
    )
    .await
    .0
    .expect_err("interrupted");
    let (gap, good) = poller.gap(t, Instant::now());
    eprintln!("Ctrl-C while preparing: {e} — longest gap {gap:.2} s");
    assert!(matches!(e, UpgradeError::NotPrepared { .. }), "{e}");
    assert!(good && gap < 1.0, "nothing was stopped: gap {gap:.2} s");
    assert_eq!(serving(&v1), 1);

    // Ctrl-C during the switch (the old ranks stopped, the new ones starting): the old one serves
    // again.
    let t = Instant::now();
    let e = upgrade_to(
        &good_cfg,
        Some(|e| {
            matches!(
                e,
                Event::Started {
                    source: Source::Step(StepKind::LaunchRank),
                    ..
                }
            )
        }),
    )
    .await
    .0
    .expect_err("interrupted");
    let (gap, good) = poller.gap(t, Instant::now());
    eprintln!("Ctrl-C during the switch: {e} — downtime {gap:.2} s");
    assert!(
        matches!(e, UpgradeError::RolledBack { restored: 1, .. }),
        "{e}"
    );
    assert!(good && gap <= bound, "gap {gap:.2} s");

    // A good generation is accepted.
    let t = Instant::now();
    let u = upgrade_to(&good_cfg, None)
        .await
        .0
        .map_err(|e| format!("{e} — {}", e.remedy()))?;
    let (gap, good) = poller.gap(t, Instant::now());
    eprintln!(
        "accepted: generation {} ({:.1} tok/s, baseline {:.1}) — downtime {gap:.2} s, switch {:.1} s",
        u.generation, u.figures.decode_tps, u.baseline.decode_tps, u.switch_s
    );
    assert!(good && gap <= bound, "gap {gap:.2} s (bound {bound:.1} s)");
    assert_eq!(serving(&v1), u.generation);
    assert_eq!(u.previous, 1);
    let h = upgrade::history(&v1)?;
    assert_eq!(h.generations[0].state, GenerationState::Superseded);

    // A watch started with the old config heals the serving generation, never the superseded
    // one.
    let old_ctx = Context::new(v1.clone(), Arc::new(Recorder::default()));
    spark_deploy_core::supervise::act::stop_pair(&old_ctx)
        .await
        .map_err(|e| e.to_string())?;
    spark_deploy_core::supervise::act::start_pair(&old_ctx)
        .await
        .map_err(|e| e.to_string())?;
    assert_eq!(
        serving(&v1),
        u.generation,
        "the heal started the serving generation"
    );
    let record = spark_deploy_core::lifecycle::launch_record::read(Path::new(
        &v1.config().deployment.state_dir,
    ))?
    .ok_or("no launch record")?;
    assert_eq!(
        record.config_sha256,
        spark_deploy_core::lifecycle::launch_record::config_sha256(&good_cfg)
    );

    // Rollback by hand.
    let t = Instant::now();
    let ctx = Context::new(good_cfg.clone(), Arc::new(Recorder::default()));
    let back = upgrade::rollback(&ctx)
        .await
        .map_err(|e| format!("{e} — {}", e.remedy()))?;
    let (gap, good) = poller.gap(t, Instant::now());
    eprintln!("rollback: generation {back} serves again — downtime {gap:.2} s");
    assert_eq!(back, 1);
    assert!(good && gap <= bound, "gap {gap:.2} s (bound {bound:.1} s)");
    assert_eq!(serving(&v1), 1);

    // Retention (lifecycle.keep_generations = 1): another accepted upgrade retires the
    // generation that served before generation 1 and keeps generation 1 as the rollback target.
    let third = {
        let mut c = config.clone();
        c.serving.max_tokens /= 4;
        with_env(&c, &[], home)?
    };
    let u3 = upgrade_to(&third, None)
        .await
        .0
        .map_err(|e| format!("{e} — {}", e.remedy()))?;
    assert_eq!(u3.removed, vec![u.generation], "{u3:?}");
    let h = upgrade::history(&v1)?;
    let state_of = |id: u32| h.generations.iter().find(|g| g.id == id).map(|g| g.state);
    assert_eq!(state_of(u.generation), Some(GenerationState::Retired));
    assert_eq!(state_of(1), Some(GenerationState::Superseded));
    let back = upgrade::rollback(&Context::new(third.clone(), Arc::new(Recorder::default())))
        .await
        .map_err(|e| format!("{e} — {}", e.remedy()))?;
    assert_eq!(back, 1, "a retired generation is never a rollback target");
    eprintln!(
        "retention: generation {} retired, rollback to {back}",
        u.generation
    );

    poller.end().await;
    Plan::teardown(&v1)
        .run(&Context::new(v1.clone(), Arc::new(Recorder::default())))
        .await?;
    drop(hub);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn testbed_upgrade_rolls_back_every_refused_generation_and_accepts_a_good_one() {
    on_testbed_removing_ranks(|info, home| async move { scenario(&info, &home).await }).await;
}
