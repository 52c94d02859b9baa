//! The overlapped ConfigureWorkerStorage's sending ahead: each worker's files that are still being
//! written on the head (a rank file built as the checkpoint's shards land, published with
//! [`Context::publish_growing`]) follow to the worker as they grow, one stream per file, each byte
//! sent the moment it is final and hashed on arrival ([`crate::transfer::prefix::follow`]). When
//! the file is final on the head, its worker holds it whole and knows its sum, so the file's pull
//! moves nothing and reads nothing: it checks that sum against the head's and renames.
//!
//! Sending ahead only saves time: a follow that fails is logged, and the file's pull resumes after
//! what arrived, reporting any real problem with its remedy.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Mutex;

use futures::StreamExt as _;
use futures::stream::FuturesUnordered;

use super::storage::{WorkerPlan, head_fabric_addr};
use crate::context::Context;
use crate::event::{Event, FileBytes, Level, StepKind};
use crate::ports::exec::Exec;
use crate::transfer::FileJob;
use crate::transfer::prefix::{GrowingFile, follow};
use crate::transfer::server::FileServer;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How often the follows' progress is reported (and new growing files looked for).
const TICK: std::time::Duration = std::time::Duration::from_millis(250);

/// What the follows of one run have done.
#[derive(Default)]
struct State {
    /// The sum each worker took of a file it received whole, by (rank, destination).
    sums: HashMap<(usize, PathBuf), String>,
    /// Every follow has ended, and no file grows any more.
    done: bool,
}

/// The follows of one run: [`SendAhead::run`] drives them while the rest of the step ships the
/// files that are final.
#[derive(Default)]
pub(crate) struct SendAhead {
    state: Mutex<State>,
}

impl SendAhead {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether every follow has ended (the files they followed can be pulled now).
    pub(crate) fn done(&self) -> bool {
        self.state().done
    }

    /// Gives each of `rank`'s `jobs` whose file was followed whole the sum its worker took.
    pub(crate) fn claim(&self, rank: usize, jobs: &mut [FileJob]) {
        let state = self.state();
        for j in jobs {
            if let Some(sum) = state.sums.get(&(rank, j.to.clone())) {
                j.partial_sum = Some(sum.clone());
            }
        }
    }

    /// Follows every worker's growing files until the rank files are final on the head and every
    /// follow has ended, or until the run fails or is cancelled; then [`SendAhead::done`].
    pub(crate) async fn run(&self, ctx: &Context, workers: &[WorkerPlan]) {
        let mut servers: HashMap<usize, FileServer> = HashMap::new();
        let mut started: HashSet<(usize, PathBuf)> = HashSet::new();
        let mut given_up: HashSet<usize> = HashSet::new();
        let mut moving: HashMap<PathBuf, (&WorkerPlan, GrowingFile)> = HashMap::new();
        let mut reported: HashMap<PathBuf, u64> = HashMap::new();
        let mut running = FuturesUnordered::new();
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let stages = ctx.stages();
            if stages.failed || ctx.is_cancelled() {
                break;
            }
            for w in workers {
                if given_up.contains(&w.rank) {
                    continue;
                }
                for (g, ready) in ctx.growing_files(w.rank) {
                    if !started.insert((w.rank, g.to.clone())) {
                        continue;
                    }
                    let final_now = *ready.borrow();
                    match start(ctx, w, &g, ready, &mut servers).await {
                        Ok((exec, token, url)) => {
                            say(
                                ctx,
                                w,
                                &g,
                                Level::Info,
                                &format!("({final_now} of {} bytes final)", g.size),
                            );
                            moving.insert(g.from.clone(), (w, g.clone()));
                            running.push(async move {
                                let r = follow(exec, &token, &url, &g).await;
                                (w, g, r)
                            });
                        }
                        Err(e) => {
                            warn(ctx, w, &g, e.as_ref());
                            given_up.insert(w.rank);
                            break;
                        }
                    }
                }
            }
            if stages.rank_files && running.is_empty() {
                break;
            }
            tokio::select! {
                Some((w, g, r)) = running.next(), if !running.is_empty() => {
                    moving.remove(&g.from);
                    match r {
                        Ok(Some(f)) => {
                            report(ctx, w, &g, g.size);
                            self.state().sums.insert((w.rank, g.to.clone()), f.sha256);
                        }
                        Ok(None) => {}
                        Err(e) => warn(ctx, w, &g, &e),
                    }
                }
                _ = tick.tick() => {
                    for server in servers.values() {
                        for (from, at) in server.positions() {
                            if let Some((w, g)) = moving.get(&from) {
                                // Only what moved: a follow waiting for the build's first final
                                // bytes (hours, on a slow link) is not reported every tick.
                                let at = at.min(g.size);
                                if reported.insert(from.clone(), at) != Some(at) {
                                    report(ctx, w, g, at);
                                }
                            }
                        }
                    }
                }
            }
        }
        self.state().done = true;
    }
}

/// Starts following `g` to worker `w`: checks the worker's destination is its user's, allows the
/// file on the worker's server (started with its first file); the worker's Exec, the server's
/// token and the file's URL.
async fn start<'c>(
    ctx: &'c Context,
    w: &WorkerPlan,
    g: &GrowingFile,
    ready: tokio::sync::watch::Receiver<u64>,
    servers: &mut HashMap<usize, FileServer>,
) -> Result<(&'c Exec, crate::secret::Secret, String), BoxError> {
    let exec = ctx.exec(w.rank).await?;
    crate::transfer::ownership::check(
        exec,
        &w.node,
        &crate::transfer::ownership::roots(std::iter::once(g.to.as_path())),
    )
    .await?;
    let server = match servers.entry(w.rank) {
        std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
        std::collections::hash_map::Entry::Vacant(e) => {
            e.insert(FileServer::start(std::net::SocketAddr::new(head_fabric_addr(ctx)?, 0)).await?)
        }
    };
    let url = server.allow_growing(g.from.clone(), g.size, ready)?;
    Ok((exec, server.token().clone(), url))
}

fn warn(ctx: &Context, w: &WorkerPlan, g: &GrowingFile, e: &(dyn std::error::Error + 'static)) {
    say(
        ctx,
        w,
        g,
        Level::Warn,
        &format!(
            "stopped ({}); its pull resumes after what arrived",
            crate::causes::one_line(e)
        ),
    );
}

/// A log line of `g`'s follow to `w`: "sending <file> ahead as it is written <what>".
fn say(ctx: &Context, w: &WorkerPlan, g: &GrowingFile, level: Level, what: &str) {
    ctx.log(
        StepKind::ConfigureWorkerStorage,
        Some(&w.node),
        level,
        format!("sending {} ahead as it is written {what}", g.to.display()),
    );
}

/// A progress event for `g`: `held` of its bytes are on the worker.
fn report(ctx: &Context, w: &WorkerPlan, g: &GrowingFile, held: u64) {
    ctx.emit(Event::Progress {
        source: StepKind::ConfigureWorkerStorage.into(),
        node: Some(w.node.clone()),
        label: g.to.file_name().map_or_else(
            || g.to.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        ),
        bytes_done: held,
        bytes_total: Some(g.size),
        rate_bps: None,
        eta_s: None,
        file: Some(FileBytes {
            done: held,
            total: g.size,
        }),
    });
}
