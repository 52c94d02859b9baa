//! The overlapped ConfigureWorkerStorage's sending ahead: the final start of each worker's files
//! that are still being written on the head (a rank file built as the checkpoint's shards land,
//! published with [`Context::publish_growing`]) goes to the worker's `.partial` while the rest
//! is written, so the file's own pull, once it is final, moves only what is left (see
//! [`crate::transfer::prefix`]).
//!
//! Sending ahead only saves time: a worker it cannot reach is left to the file's pull, which
//! reports the problem with its remedy.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use super::storage::{WorkerPlan, head_fabric_addr};
use crate::context::Context;
use crate::event::{Event, FileBytes, Level, StepKind};
use crate::transfer::prefix::{GrowingFile, push_prefix};
use crate::transfer::server::FileServer;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Sends ahead once at least this much more of a file is final (fewer, larger pulls).
const STEP: u64 = 32 << 20;

/// One worker's server for its files' partials, and their URLs.
struct Served {
    server: FileServer,
    urls: HashMap<PathBuf, String>,
}

/// What was sent ahead so far, across the rounds of one run.
#[derive(Default)]
pub(crate) struct SendAhead {
    servers: HashMap<usize, Served>,
    /// Bytes each worker's `.partial` holds, by (rank, destination).
    held: HashMap<(usize, PathBuf), u64>,
    /// Workers whose destinations were checked to be their user's.
    checked: HashSet<usize>,
    /// Workers given up on for the run (their files go whole with their pulls).
    given_up: HashSet<usize>,
}

impl SendAhead {
    /// Sends every worker the final bytes of its growing files it does not hold yet; the bytes
    /// sent. A failure is logged and ends sending ahead to that worker for the run.
    pub(crate) async fn round(&mut self, ctx: &Context, workers: &[WorkerPlan]) -> u64 {
        let mut sent = 0;
        for w in workers {
            if self.given_up.contains(&w.rank) {
                continue;
            }
            for g in ctx.growing_files(w.rank) {
                let key = (w.rank, g.to.clone());
                let held = self.held.get(&key).copied().unwrap_or(0);
                if g.ready < held + STEP {
                    continue;
                }
                match self.push(ctx, w, &g).await {
                    Ok(now) => {
                        sent += now.saturating_sub(held);
                        self.held.insert(key, now);
                        report(ctx, w, &g, now);
                    }
                    Err(e) => {
                        ctx.log(
                            StepKind::ConfigureWorkerStorage,
                            Some(&w.node),
                            Level::Warn,
                            format!(
                                "sending the start of {} ahead stopped ({}); it goes whole once final",
                                g.to.display(),
                                crate::causes::one_line(e.as_ref())
                            ),
                        );
                        self.given_up.insert(w.rank);
                        break;
                    }
                }
            }
        }
        sent
    }

    async fn push(
        &mut self,
        ctx: &Context,
        w: &WorkerPlan,
        g: &GrowingFile,
    ) -> Result<u64, BoxError> {
        let exec = ctx.exec(w.rank).await?;
        if self.checked.insert(w.rank) {
            crate::transfer::ownership::check(
                exec,
                &w.node,
                &crate::transfer::ownership::roots(std::iter::once(g.to.as_path())),
            )
            .await?;
        }
        let served = match self.servers.entry(w.rank) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(Served {
                server: FileServer::start(std::net::SocketAddr::new(head_fabric_addr(ctx)?, 0))
                    .await?,
                urls: HashMap::new(),
            }),
        };
        let url = served
            .urls
            .entry(g.from.clone())
            .or_insert_with(|| served.server.allow(g.from.clone()))
            .clone();
        Ok(push_prefix(exec, &served.server, &url, g).await?)
    }
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
