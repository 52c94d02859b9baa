//! Commands that run steps: `up`, `down`, `preflight`, `fetch`, `rank-inputs`.

use std::sync::Arc;

use spark_deploy_core::plan::{Plan, StepKind};
use spark_deploy_core::run::{Context, RunError};

use super::Global;
use crate::events::TerminalSink;
use crate::exit::{Failure, PREFLIGHT, RUNTIME};
use crate::render;

pub(crate) use spark_deploy_core::plan::Verb as Which;

fn failure(e: &RunError) -> Failure {
    let code = if e.failure.step == StepKind::Preflight {
        PREFLIGHT
    } else {
        RUNTIME
    };
    Failure {
        code,
        message: e.to_string(),
        remedy: e.failure.remedy.clone(),
    }
}

pub(crate) fn run(global: &Global, which: Which) -> Result<(), Failure> {
    let config = global.load()?;
    render::warnings(config.warnings());
    let plan = Plan::for_verb(&config, which);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::new(RUNTIME, &e, None))?;
    let ctx = Arc::new(Context::new(
        config,
        Arc::new(TerminalSink::new(global.json)),
    ));
    let result = rt.block_on(async {
        let c2 = Arc::clone(&ctx);
        // Ctrl-C cancels at the next cancellation point; a launched pair is stopped by the runner.
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                c2.cancel();
            }
        });
        plan.run(&ctx).await
    });
    match result {
        Ok(report) => {
            if global.json {
                let mut out = serde_json::json!({ "report": report });
                if let Some(p) = ctx.preflight_report() {
                    out["preflight"] = serde_json::json!(p);
                }
                render::out(&out.to_string());
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
            Err(failure(&e))
        }
    }
}
