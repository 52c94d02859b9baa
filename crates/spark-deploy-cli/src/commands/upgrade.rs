//! `spark-deploy upgrade`, `rollback` and `history`.

use std::sync::Arc;

use spark_deploy_core::lifecycle::generations::History;
use spark_deploy_core::run::Context;
use spark_deploy_core::upgrade::{self, Options};

use super::Global;
use super::run::cancellable;
use crate::events::TerminalSink;
use crate::exit::{Failure, INTERRUPTED, RUNTIME};
use crate::render;

fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::new(RUNTIME, &e, None))
}

/// `upgrade`: the config given (`--config`) becomes the new generation, or the old one serves
/// again.
pub(crate) fn run_upgrade(global: &Global) -> Result<(), Failure> {
    let config = global.load()?;
    render::warnings(config.warnings());
    super::run::key_agrees(&config)?;
    let rt = runtime()?;
    let ctx = Arc::new(Context::new(
        config,
        Arc::new(TerminalSink::new(global.json, global.verbosity)),
    ));
    let (result, interrupted) = rt.block_on(cancellable(
        &ctx,
        upgrade::upgrade(&ctx, &Options::default()),
    ));
    match result {
        Ok(u) => {
            if global.json {
                render::out(&serde_json::json!({ "upgraded": u }).to_string());
            } else {
                render::out(&format!(
                    "generation {} serves (replacing {}): decode {:.1} tok/s (was {:.1}); the switch took {:.1} s",
                    u.generation,
                    u.previous,
                    u.figures.decode_tps,
                    u.baseline.decode_tps,
                    u.switch_s
                ));
            }
            Ok(())
        }
        Err(e) => Err(Failure::msg(
            if interrupted { INTERRUPTED } else { RUNTIME },
            e.to_string(),
            Some(e.remedy()),
        )),
    }
}

/// `rollback`: the generation that served before the serving one serves again.
pub(crate) fn run_rollback(global: &Global) -> Result<(), Failure> {
    let config = global.load()?;
    let rt = runtime()?;
    let ctx = Arc::new(Context::new(
        config,
        Arc::new(TerminalSink::new(global.json, global.verbosity)),
    ));
    match rt.block_on(upgrade::rollback(&ctx)) {
        Ok(id) => {
            if global.json {
                render::out(&serde_json::json!({ "serving": id }).to_string());
            } else {
                render::out(&format!("generation {id} serves again"));
            }
            Ok(())
        }
        Err(e) => Err(Failure::msg(RUNTIME, e.to_string(), Some(e.remedy()))),
    }
}

fn when(unix: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(unix);
    humantime::format_rfc3339_seconds(t).to_string()
}

/// The history as a table.
fn table(h: &History) -> String {
    let mut out = String::from(
        "gen  state       served from           until                 fingerprint       decode tok/s  prefill tok/s  note\n",
    );
    for g in &h.generations {
        let state = serde_json::to_value(g.state)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        let fp: String = g.fingerprint.chars().take(16).collect();
        let (d, p) = g
            .figures
            .map_or((String::from("-"), String::from("-")), |f| {
                (
                    format!("{:.1}", f.decode_tps),
                    f.prefill_tps.map_or("-".into(), |p| format!("{p:.0}")),
                )
            });
        out.push_str(&format!(
            "{:<4} {:<11} {:<21} {:<21} {:<17} {:<13} {:<14} {}\n",
            g.id,
            state,
            when(g.served_from),
            g.served_until.map_or_else(|| "-".into(), when),
            if fp.is_empty() { "-".into() } else { fp },
            d,
            p,
            g.note.as_deref().unwrap_or("")
        ));
    }
    out
}

/// `history`: every generation with its fingerprint, when it served and its figures.
pub(crate) fn run_history(global: &Global) -> Result<(), Failure> {
    let config = global.load()?;
    let h = upgrade::history(&config).map_err(|e| Failure::new(RUNTIME, &e, None))?;
    if global.json {
        render::out(&serde_json::to_string(&h).unwrap_or_default());
    } else if h.generations.is_empty() {
        render::out("no generation recorded yet: `spark-deploy up` records the first");
    } else {
        render::out(table(&h).trim_end());
    }
    Ok(())
}
