use serde::Serialize;

use super::ranks;
use crate::config::ValidatedConfig;
use crate::container::{ContainerSpec, labels};
use crate::context::{Context, Outcome, StepFailure};
use crate::describe::{Action, ActionDetail};
use crate::engine::{Engine, FingerprintError};
use crate::event::Level;
use crate::event::StepKind;
use crate::facts::DeploymentFacts;

/// Starts every rank through its node's Docker port, followers first, after comparing the
/// cross-rank fingerprint; all ranks or none.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LaunchRank {
    /// Containers in start order (followers from the highest rank down, rank 0 last).
    pub containers: Vec<ContainerSpec>,
}

impl LaunchRank {
    /// The launch of `config` with `facts`.
    #[must_use]
    pub fn new(engine: &dyn Engine, config: &ValidatedConfig, facts: &DeploymentFacts) -> Self {
        Self {
            containers: engine.rank_containers(config, facts),
        }
    }

    pub(crate) fn describe(&self) -> (String, Vec<Action>) {
        let actions = self
            .containers
            .iter()
            .map(|c| {
                Action::with(
                    &c.node,
                    format!("start rank {} ({})", c.rank, c.name),
                    ActionDetail::Container(Box::new(c.clone())),
                )
            })
            .collect();
        (
            "start the ranks, followers from the highest rank down, then rank 0; all or none"
                .to_owned(),
            actions,
        )
    }
}

/// Errors of LaunchRank.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// A value only preflight or fetch can know is still unknown.
    #[error("rank {rank} on {node} still lacks {what}")]
    Unresolved {
        /// Rank.
        rank: usize,
        /// Node.
        node: String,
        /// What is unknown (e.g. "the head's fabric address (detected at preflight)").
        what: String,
    },
    /// The ranks' inputs could not be read, or the ranks disagree.
    #[error(transparent)]
    Fingerprint(#[from] FingerprintError),
    /// The API key file could not be prepared.
    #[error(transparent)]
    ApiKey(#[from] crate::lifecycle::api_key::ApiKeyError),
    /// Starting a container failed.
    #[error("starting rank {rank} on {node}: {source}")]
    Start {
        /// Rank.
        rank: usize,
        /// Node.
        node: String,
        /// Underlying error.
        #[source]
        source: super::ranks::RankOpError,
    },
    /// A follower exited right after its start.
    #[error("rank {rank} on {node} exited right after starting; its log ends with:\n{tail}")]
    Exited {
        /// Rank.
        rank: usize,
        /// Node.
        node: String,
        /// Log tail.
        tail: String,
    },
}

impl LaunchError {
    /// The node and rank the error names, when it names them.
    fn location(&self) -> (Option<String>, Option<usize>) {
        match self {
            Self::Unresolved { rank, node, .. }
            | Self::Start { rank, node, .. }
            | Self::Exited { rank, node, .. }
            | Self::Fingerprint(
                FingerprintError::Inputs { rank, node, .. }
                | FingerprintError::Prepared { rank, node, .. },
            ) => (Some(node.clone()), Some(*rank)),
            Self::Fingerprint(FingerprintError::Mismatch(_)) | Self::ApiKey(_) => (None, None),
        }
    }
}

/// How long a follower must have been running before the launch counts it as started.
const FOLLOWER_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

/// The rank specs for the facts learned so far and their cross-rank fingerprint.
async fn resolve(
    ctx: &Context,
    engine: &dyn Engine,
) -> Result<(Vec<ContainerSpec>, String), LaunchError> {
    let facts = ctx.facts();
    if let Some((node, pending)) = facts.unresolved(ctx.config()).into_iter().next() {
        let what = pending.describe().to_owned();
        let rank = ctx
            .config()
            .config()
            .nodes
            .iter()
            .position(|n| n.name == node)
            .unwrap_or(0);
        return Err(LaunchError::Unresolved { rank, node, what });
    }
    let specs = engine.rank_containers(ctx.config(), &facts);
    let fingerprint = engine.fingerprint(ctx, &specs).await?;
    Ok((specs, fingerprint))
}

impl LaunchRank {
    /// Resolves the specs with the facts learned so far, compares the fingerprint, then starts
    /// the ranks in order (followers first).
    pub(crate) async fn run(
        &self,
        ctx: &Context,
        engine: &dyn Engine,
    ) -> Result<Outcome, StepFailure> {
        let fail = |e: LaunchError| {
            let remedy = match &e {
                LaunchError::Fingerprint(f) => f.remedy(),
                _ => None,
            };
            let (node, rank) = e.location();
            StepFailure::new(StepKind::LaunchRank, e, remedy).at(node, rank)
        };
        let (mut specs, mut fingerprint) = resolve(ctx, engine).await.map_err(fail)?;
        // Already running with exactly these settings: nothing to do. Running with other settings
        // (a changed CONTEXT, a rebuilt input) or only partly: stop all, then start all.
        let mut running = Vec::new();
        for s in &specs {
            let i = ctx.node_index(&s.node);
            let d = ctx.docker(i).await.map_err(|e| {
                fail(LaunchError::Start {
                    rank: s.rank,
                    node: s.node.clone(),
                    source: e.into(),
                })
            })?;
            let state = d.container_state(&s.name).await.map_err(|e| {
                fail(LaunchError::Start {
                    rank: s.rank,
                    node: s.node.clone(),
                    source: e.into(),
                })
            })?;
            running.push((
                state.running,
                state.labels.get(labels::FINGERPRINT).cloned(),
            ));
        }
        if running
            .iter()
            .all(|(r, fp)| *r && fp.as_deref() == Some(fingerprint.as_str()))
        {
            ctx.set_already_running();
            record_launch(ctx, &specs, &fingerprint).await;
            return Ok(Outcome::Skipped {
                reason: format!(
                    "every rank already running with fingerprint {}",
                    &fingerprint[..12]
                ),
            });
        }
        if ctx.preflight_deferred() {
            // Preflight was skipped for a pair that looked unchanged, yet ranks must start: check
            // the nodes now, before anything stops or starts.
            ctx.log(
                StepKind::LaunchRank,
                None,
                Level::Info,
                "the ranks must (re)start: running the deferred preflight first",
            );
            super::Preflight::new(ctx.config())
                .check(ctx, engine)
                .await?;
            (specs, fingerprint) = resolve(ctx, engine).await.map_err(fail)?;
        }
        if running.iter().any(|(r, _)| *r) {
            ctx.log(StepKind::LaunchRank, None, Level::Warn, "the running ranks differ from the plan (settings or inputs changed): stopping every rank before starting them all");
            super::ranks::stop_deployment(ctx).await;
        }
        let c = ctx.config().config();
        crate::lifecycle::api_key::for_launch(&c.serving).map_err(|e| fail(e.into()))?;
        ctx.mark_launch_started();
        // Followers first, back to back, then rank 0; a follower that dies at once (bad argv,
        // missing input) fails the launch (and the run stops every rank it started): each is
        // looked at once it has had `FOLLOWER_GRACE`, rank 0's start running meanwhile.
        let mut last_follower = None;
        for s in &mut specs {
            s.labels
                .insert(labels::FINGERPRINT.to_owned(), fingerprint.clone());
            ctx.log(
                StepKind::LaunchRank,
                Some(&s.node),
                Level::Info,
                format!(
                    "starting rank {} ({}), fingerprint {}",
                    s.rank,
                    s.name,
                    &fingerprint[..12]
                ),
            );
            ranks::start(ctx, StepKind::LaunchRank, s)
                .await
                .map_err(|source| {
                    fail(LaunchError::Start {
                        rank: s.rank,
                        node: s.node.clone(),
                        source,
                    })
                })?;
            if s.rank != 0 {
                last_follower = Some(tokio::time::Instant::now());
            }
        }
        if let Some(started) = last_follower {
            tokio::time::sleep_until(started + FOLLOWER_GRACE).await;
        }
        for s in specs.iter().filter(|s| s.rank != 0) {
            let i = ctx.node_index(&s.node);
            // Docker not answering here is not an exit: only a state that says "not running"
            // stops the launch.
            let exited = ctx
                .rank_state(i, &s.name)
                .await
                .is_ok_and(|state| !state.running);
            if exited {
                let tail = ctx.log_tail(i, &s.name, 20).await;
                return Err(fail(LaunchError::Exited {
                    rank: s.rank,
                    node: s.node.clone(),
                    tail,
                }));
            }
        }
        record_launch(ctx, &specs, &fingerprint).await;
        Ok(Outcome::Done { bytes: None })
    }
}

/// Writes the launch record (config hash, facts, container IDs) that lets the next `up` skip
/// preflight while this pair runs. A record that cannot be written only costs that skip.
async fn record_launch(ctx: &Context, specs: &[ContainerSpec], fingerprint: &str) {
    use crate::lifecycle::launch_record::{self, LaunchRecord, LaunchedRank};
    let mut ranks = Vec::new();
    for s in specs {
        let i = ctx.node_index(&s.node);
        let Some(id) = ctx.rank_state(i, &s.name).await.ok().and_then(|st| st.id) else {
            return;
        };
        ranks.push(LaunchedRank {
            node: i,
            name: s.name.clone(),
            id,
        });
    }
    let facts = ctx.facts();
    let record = LaunchRecord {
        config_sha256: launch_record::config_sha256(ctx.config()),
        fingerprint: fingerprint.to_owned(),
        model_commit: facts.model_commit.to_string(),
        nodes: facts.nodes,
        context: facts.context,
        ranks,
        gpu_clocks: ctx.preflight_report().and_then(|r| {
            r.results
                .iter()
                .find(|row| row.check == crate::preflight::report::Check::GpuClocks)
                .map(|row| row.observed.clone())
        }),
        at_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    };
    let state_dir = std::path::Path::new(&ctx.config().config().deployment.state_dir);
    if let Err(e) = launch_record::write(state_dir, &record) {
        ctx.log(
            StepKind::LaunchRank,
            None,
            Level::Warn,
            format!("{e}: the next `up` will run preflight again"),
        );
    }
}
