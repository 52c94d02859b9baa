//! Commands that run plans: `up`, `down`, `restart`, `prepare`, `preflight`, `fetch`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use spark_deploy_core::config::ValidatedConfig;
use spark_deploy_core::event::{Event, EventSink};
use spark_deploy_core::lifecycle::run_log::EventLog;
use spark_deploy_core::plan::{Plan, StepKind};
use spark_deploy_core::run::{Context, RunError, RunReport};

use super::Global;
use crate::api_hint::ApiHint;
use crate::events::TerminalSink;
use crate::exit::{CONFIG, Failure, INTERRUPTED, PREFLIGHT, RUNTIME};
use crate::render;

pub(crate) use spark_deploy_core::plan::Verb as Which;

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
        return Failure::msg(code, e.to_string(), e.failure.remedy.clone());
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

/// Flags of the verbs that change the deployment (`up`, `down`, `restart`).
#[derive(clap::Args, Debug, Default)]
pub(crate) struct RunArgs {
    /// Print what would happen (the plan, with what read-only checks detect filled in) and
    /// change nothing. Env: DRY_RUN=1.
    #[arg(long, env = "DRY_RUN", value_parser = clap::builder::BoolishValueParser::new())]
    pub dry_run: bool,
}

/// Events to the terminal and to the run's log (`<state_dir>/last-run.events.jsonl`, for support
/// bundles); the context redacts secrets before either sees them.
pub(crate) struct Tee {
    terminal: Arc<dyn EventSink>,
    log: Option<Arc<EventLog>>,
}

impl Tee {
    /// `terminal` plus the run log of `config` (none when the state dir is not writable: the run
    /// must not fail for its log).
    pub(crate) fn new(config: &ValidatedConfig, terminal: Arc<dyn EventSink>) -> Self {
        let state_dir = std::path::Path::new(&config.config().deployment.state_dir);
        Self {
            terminal,
            log: EventLog::create(state_dir).ok().map(Arc::new),
        }
    }

    /// Ends the run's log: kept as the last run's events when a step ran (a run refused before
    /// its first step, e.g. by the lock, keeps the previous run's events).
    pub(crate) fn end(&self, result: &Result<RunReport, RunError>) {
        let Some(log) = &self.log else { return };
        let ran = match result {
            Ok(_) => true,
            Err(e) => !e.report.steps.is_empty(),
        };
        if ran {
            if let Err(e) = log.finish() {
                render::note(&format!("warning: {e}"));
            }
        } else {
            log.discard();
        }
    }
}

impl EventSink for Tee {
    fn emit(&self, event: Event) {
        if let Some(log) = &self.log {
            log.emit(event.clone());
        }
        self.terminal.emit(event);
    }
}

/// Runs `plan` with events to the terminal and the run log; says whether Ctrl-C came.
pub(crate) async fn run_logged(
    global: &Global,
    config: &ValidatedConfig,
    plan: &Plan,
) -> (Arc<Context>, Result<RunReport, RunError>, bool) {
    let tee = Arc::new(Tee::new(
        config,
        Arc::new(TerminalSink::new(global.json, global.verbosity)),
    ));
    let ctx = Arc::new(Context::new(config.clone(), tee.clone()));
    let (result, interrupted) = cancellable(&ctx, plan.run(&ctx)).await;
    tee.end(&result);
    if let Err(e) = spark_deploy_core::bundle::keep_preflight(&ctx) {
        render::note(&format!("warning: {e}"));
    }
    (ctx, result, interrupted)
}

pub(crate) fn run(global: &Global, which: Which) -> Result<(), Failure> {
    run_with(global, which, &RunArgs::default())
}

/// `DRY_RUN=1`: the plan with what a read-only preflight detected; nothing changes.
fn dry_run(global: &Global, config: ValidatedConfig, plan: &Plan) -> Result<(), Failure> {
    if !global.json {
        render::note("DRY_RUN=1: printing the plan; nothing is stopped, started or prepared");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::new(RUNTIME, &e, None))?;
    let ctx = Context::new(
        config,
        Arc::new(TerminalSink::new(global.json, global.verbosity)),
    );
    let shown = rt.block_on(plan.dry_run(&ctx));
    if global.json {
        render::out(&serde_json::json!({ "dry_run": shown }).to_string());
    } else {
        render::out(&spark_deploy_core::plan::render::render_text(&shown.plan));
    }
    Ok(())
}

pub(crate) fn run_with(global: &Global, which: Which, args: &RunArgs) -> Result<(), Failure> {
    let config = global.load()?;
    render::warnings(config.warnings());
    let plan = Plan::for_verb(&config, which);
    if args.dry_run {
        return dry_run(global, config, &plan);
    }
    if matches!(which, Which::Up | Which::Restart) {
        key_agrees(&config)?;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::new(RUNTIME, &e, None))?;
    let (ctx, result, interrupted) = rt.block_on(run_logged(global, &config, &plan));
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
