//! Acting on the ranks, all or none: save every rank's log, stop rank 0 then the followers (the
//! `down` plan), and by policy start rank 1 then rank 0 and smoke (the `up` plan). The plans do
//! the work; this module only orders them and keeps what was seen.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::SuperviseError;
use super::decide::Finding;
use super::sample::Sample;
use crate::config::ValidatedConfig;
use crate::container::rank_container_name;
use crate::context::Context;
use crate::plan::Plan;
use crate::run::RunError;

/// Lines of each rank's log kept before a heal stops it.
pub const LOG_LINES: usize = 20_000;

/// Writes `rank<N>.log` for every rank (the running or exited container's log as Docker has
/// it) and `finding.json` (the finding and the last samples) into `dir`.
///
/// # Errors
///
/// [`SuperviseError::Write`] when a file cannot be written.
pub async fn save_logs(
    ctx: &Context,
    dir: &Path,
    finding: &Finding,
    window: &[Sample],
) -> Result<Vec<PathBuf>, SuperviseError> {
    let c = ctx.config().config();
    let write = |path: PathBuf, bytes: &[u8]| {
        std::fs::create_dir_all(dir)
            .and_then(|()| crate::safe_fs::write_exclusive(&path, bytes))
            .map(|()| path.clone())
            .map_err(|source| SuperviseError::Write { path, source })
    };
    let mut saved = Vec::new();
    for rank in 0..c.nodes.len() {
        let container = rank_container_name(&c.deployment.name, rank);
        let text = ctx.log_tail(rank, &container, LOG_LINES).await;
        saved.push(write(dir.join(format!("rank{rank}.log")), text.as_bytes())?);
    }
    let tail = &window[window.len().saturating_sub(20)..];
    let record = serde_json::json!({"finding": finding, "samples": tail});
    saved.push(write(
        dir.join("finding.json"),
        serde_json::to_string_pretty(&record)
            .unwrap_or_default()
            .as_bytes(),
    )?);
    Ok(saved)
}

/// A context for one plan run of `config` that is cancelled when `outer` is.
fn child_of(outer: &Context, config: ValidatedConfig) -> Arc<Context> {
    let ctx = Arc::new(Context::new(config, outer.sink()));
    let mut signal = outer.cancel_signal();
    let inner = Arc::clone(&ctx);
    tokio::spawn(async move {
        while !*signal.borrow() {
            if signal.changed().await.is_err() {
                return;
            }
        }
        inner.cancel();
    });
    ctx
}

/// Stops both ranks, rank 0 first, each log saved (the `down` plan, without its stop marker),
/// each rank given `watch.heal_stop_grace_s` before SIGKILL.
///
/// # Errors
///
/// The plan's [`RunError`].
pub async fn stop_pair(outer: &Context) -> Result<(), Box<RunError>> {
    let ctx = child_of(outer, outer.config().clone());
    let grace_s = ctx.config().config().watch.heal_stop_grace_s;
    // Boxed: a plan run is a large future; heals nest it deep in the watch loop.
    Box::pin(Plan::teardown_with_grace(ctx.config(), grace_s).run(&ctx))
        .await
        .map(|_| ())
        .map_err(Box::new)
}

/// The config a heal starts: the serving generation's (an upgrade or a rollback may have replaced
/// the one this watch was started with — a heal never brings a superseded generation back), else
/// this watch's own.
fn serving_config(outer: &Context) -> ValidatedConfig {
    let own = outer.config();
    let state_dir = Path::new(&own.config().deployment.state_dir);
    crate::lifecycle::generations::read(state_dir)
        .ok()
        .and_then(|h| h.serving().cloned())
        .filter(|g| g.config_sha256 != crate::lifecycle::launch_record::config_sha256(own))
        .and_then(|g| g.validated(own).ok())
        .unwrap_or_else(|| own.clone())
}

/// Starts both ranks of the serving generation, rank 1 first, and smokes (the `up` plan: done
/// steps skip).
///
/// # Errors
///
/// The plan's [`RunError`]; the run then stops the ranks it started.
pub async fn start_pair(outer: &Context) -> Result<(), Box<RunError>> {
    let ctx = child_of(outer, serving_config(outer));
    Box::pin(Plan::standard(ctx.config()).run(&ctx))
        .await
        .map(|_| ())
        .map_err(Box::new)
}
