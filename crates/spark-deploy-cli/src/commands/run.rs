//! Commands that run steps: `up`, `down`, `preflight`, `fetch`, `rank-inputs`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use spark_deploy_core::config::ValidatedConfig;
use spark_deploy_core::plan::{Plan, Step, StepKind};
use spark_deploy_core::run::{Context, RunError};

use super::Global;
use crate::api_hint::ApiHint;
use crate::events::TerminalSink;
use crate::exit::{CONFIG, Failure, INTERRUPTED, PREFLIGHT, RUNTIME};
use crate::render;

/// Which steps a command runs.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Which {
    /// The standard plan.
    Up,
    /// Teardown.
    Down,
    /// Validate, then stop both ranks and start both (the launch compares the fingerprint anew).
    Restart,
    /// Every preflight check, also while the deployment runs.
    Preflight,
    /// FetchCheckpoint in verify-only mode (no network).
    FetchVerifyOnly,
    /// Only these steps of the standard plan.
    Only(&'static [StepKind]),
}

/// The failure of a run. The event stream has shown it already (the `Failed` event), so for people
/// only the exit code remains; `--json` ends with the error object as the result document.
pub(crate) fn failure(e: &RunError, interrupted: bool, json: bool) -> Failure {
    let code = if interrupted {
        INTERRUPTED
    } else if e.failure.step == StepKind::Preflight {
        PREFLIGHT
    } else {
        RUNTIME
    };
    if json {
        return Failure::msg(code, e.failure.to_string(), e.failure.remedy.clone());
    }
    if interrupted {
        render::note("interrupted (Ctrl-C): stopped cleanly; rerun the command to resume");
    }
    Failure::reported(code)
}

/// Runs `work`, cancelling `ctx` on Ctrl-C (steps stop at their next cancellation point and a
/// launched pair is stopped by the runner); also says whether Ctrl-C came.
pub(crate) async fn cancellable<T>(
    ctx: &Arc<Context>,
    work: impl std::future::Future<Output = T>,
) -> (T, bool) {
    let flag = Arc::new(AtomicBool::new(false));
    let (c2, f2) = (Arc::clone(ctx), Arc::clone(&flag));
    let watcher = tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            f2.store(true, Ordering::SeqCst);
            c2.cancel();
        }
    });
    let out = work.await;
    watcher.abort();
    (out, flag.load(Ordering::SeqCst))
}

/// Refuses, before anything runs, a `SPARK_DEPLOY_API_KEY` that differs from the deployment's key
/// file (the launch would refuse it only after deciding what to stop).
pub(crate) fn key_agrees(config: &ValidatedConfig) -> Result<(), Failure> {
    use spark_deploy_core::lifecycle::api_key::{ApiKeyError, client_key};
    match client_key(&config.config().serving) {
        Err(e @ ApiKeyError::Mismatch { .. }) => Err(Failure::new(CONFIG, &e, None)),
        _ => Ok(()),
    }
}

pub(crate) fn run(global: &Global, which: Which) -> Result<(), Failure> {
    let config = global.load()?;
    render::warnings(config.warnings());
    let plan = match which {
        Which::Up => Plan::standard(&config),
        Which::Down => Plan::teardown(&config),
        Which::Restart => Plan::restart(&config),
        Which::FetchVerifyOnly => Plan::from_steps(
            &config,
            vec![Step::FetchCheckpoint(
                spark_deploy_core::steps::FetchCheckpoint::new(&config).verify_only(),
            )],
        ),
        Which::Preflight => Plan::from_steps(
            &config,
            vec![Step::Preflight(spark_deploy_core::steps::Preflight::new(
                &config,
            ))],
        ),
        Which::Only(kinds) => {
            let steps: Vec<Step> = Plan::standard(&config)
                .steps()
                .iter()
                .filter(|s| kinds.contains(&s.kind()))
                .cloned()
                .collect();
            Plan::from_steps(&config, steps)
        }
    };
    if matches!(which, Which::Up | Which::Restart) {
        key_agrees(&config)?;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::new(RUNTIME, &e, None))?;
    let ctx = Arc::new(Context::new(
        config,
        Arc::new(TerminalSink::new(global.json, global.verbosity)),
    ));
    let (result, interrupted) = rt.block_on(cancellable(&ctx, plan.run(&ctx)));
    match result {
        Ok(report) => {
            let hint = matches!(which, Which::Up | Which::Restart)
                .then(|| ApiHint::new(ctx.config(), global.config_arg().as_deref()));
            if global.json {
                let mut out = serde_json::json!({ "report": report });
                if let Some(p) = ctx.preflight_report() {
                    out["preflight"] = serde_json::json!(p);
                }
                if let Some(h) = &hint {
                    out["api"] = serde_json::json!(h);
                }
                render::out(&out.to_string());
            } else if let Some(h) = &hint {
                render::out(&h.text());
            }
            Ok(())
        }
        Err(e) => {
            // A failed preflight's table is data too: on stdout with --json, exit code 4 as before.
            if global.json
                && e.failure.step == StepKind::Preflight
                && let Some(p) = ctx.preflight_report()
            {
                render::out(&serde_json::json!({ "preflight": p }).to_string());
            }
            Err(failure(&e, interrupted, global.json))
        }
    }
}
