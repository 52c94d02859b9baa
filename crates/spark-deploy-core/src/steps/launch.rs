use serde::Serialize;

use super::ranks;
use crate::config::ValidatedConfig;
use crate::container::{ContainerSpec, labels};
use crate::engine::tensorfold::fingerprint::{InputIdentity, RankSettings, compare};
use crate::engine::tensorfold::launch::rank_specs;
use crate::event::Level;
use crate::facts::DeploymentFacts;
use crate::layout::NodeLayout;
use crate::plan::StepKind;
use crate::plan::describe::{Action, ActionDetail};
use crate::ports::exec::Cmd;
use crate::run::{Context, Outcome, StepFailure};

/// Starts every rank through its node's Docker port, followers first, after comparing the
/// cross-rank fingerprint; both ranks or neither.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LaunchRank {
    /// Containers in start order (rank 1 before rank 0).
    pub containers: Vec<ContainerSpec>,
}

impl LaunchRank {
    /// The launch of `config` with `facts`.
    #[must_use]
    pub fn new(config: &ValidatedConfig, facts: &DeploymentFacts) -> Self {
        Self {
            containers: rank_specs(config, facts),
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
            "start the ranks, rank 1 before rank 0, both or neither".to_owned(),
            actions,
        )
    }
}

/// Errors of LaunchRank.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// A value only preflight or fetch can know is still a placeholder.
    #[error(
        "rank {rank} on {node} still carries a placeholder ({value}); remedy: run the Preflight and FetchCheckpoint steps first (`spark-deploy up` runs them)"
    )]
    Unresolved {
        /// Rank.
        rank: u32,
        /// Node.
        node: String,
        /// The placeholder.
        value: String,
    },
    /// The ranks disagree on settings that must match.
    #[error("the ranks' settings differ, refusing to launch either: {}", .0.iter().map(|m| format!("{} (rank 0: {}, rank {}: {})", m.setting, m.rank0, m.rank, m.other)).collect::<Vec<_>>().join("; "))]
    Mismatch(Vec<crate::engine::tensorfold::fingerprint::Mismatch>),
    /// Reading a node's input identities failed.
    #[error("reading the inputs of rank {rank} on {node}: {source}")]
    Inputs {
        /// Rank.
        rank: u32,
        /// Node.
        node: String,
        /// Underlying error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The API key file could not be prepared.
    #[error(transparent)]
    ApiKey(#[from] crate::lifecycle::api_key::ApiKeyError),
    /// Starting a container failed.
    #[error("starting rank {rank} on {node}: {source}")]
    Start {
        /// Rank.
        rank: u32,
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
        rank: u32,
        /// Node.
        node: String,
        /// Log tail.
        tail: String,
    },
}

const IDENTITY_SCRIPT: &str = r#"kit="$1"; inputs="$2"; engram="$3"; prefix="$4"
if [ -f "$kit/MANIFEST" ]; then echo "kit $(sha256sum "$kit/MANIFEST" | cut -d' ' -f1)"; else echo "kit missing"; fi
if [ -f "$inputs/dsv41_token_map.json" ]; then echo "tokenmap $(sha256sum "$inputs/dsv41_token_map.json" | cut -d' ' -f1)"; else echo "tokenmap missing"; fi
for f in "$inputs/rank-cache/$prefix"*.bin; do [ -f "$f" ] && [ ! -L "$f" ] && echo "rank $(basename "$f")"; done
for f in "$engram"/*.safetensors; do [ -e "$f" ] && echo "engram $(basename "$f") $(stat -L -c %s "$f")"; done
true"#;

async fn identity(ctx: &Context, spec: &ContainerSpec) -> Result<InputIdentity, LaunchError> {
    let err = |e: Box<dyn std::error::Error + Send + Sync>| LaunchError::Inputs {
        rank: spec.rank,
        node: spec.node.clone(),
        source: e,
    };
    let i = ranks::node_index(ctx, &spec.node);
    let c = ctx.config().config();
    let layout = NodeLayout::of(ctx.config(), &c.nodes[i]);
    let world = c.nodes.len();
    let out = ctx
        .exec(i)
        .await
        .map_err(|e| err(Box::new(e)))?
        .run(&Cmd::shell(IDENTITY_SCRIPT).args([
            "sh",
            &layout.kit_dir,
            &layout.inputs_dir,
            &layout.engram_dir,
            &format!("rank{}of{world}-", spec.rank),
        ]))
        .await
        .map_err(|e| err(Box::new(e)))?;
    let mut id = InputIdentity::default();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let mut w = line.split_whitespace();
        match (w.next(), w.next(), w.next()) {
            (Some("kit"), Some(v), _) => id.kit_manifest_sha256 = v.to_owned(),
            (Some("tokenmap"), Some(v), _) => id.token_map_sha256 = v.to_owned(),
            (Some("rank"), Some(v), _) => {
                if !id.rank_file.is_empty() {
                    return Err(err(format!(
                        "two rank files for rank {} in {}/rank-cache: {} and {v}",
                        spec.rank, layout.inputs_dir, id.rank_file
                    )
                    .into()));
                }
                id.rank_file = v.to_owned();
            }
            (Some("engram"), Some(n), Some(s)) => {
                id.engram_files.push((n.to_owned(), s.parse().unwrap_or(0)))
            }
            _ => {}
        }
    }
    if id.rank_file.is_empty() {
        return Err(err(format!(
            "no rank{}of{world}-*.bin in {}/rank-cache",
            spec.rank, layout.inputs_dir
        )
        .into()));
    }
    let docker = ctx.docker(i).await.map_err(|e| err(Box::new(e)))?;
    let image = docker
        .inspect_image(&spec.image)
        .await
        .map_err(|e| err(Box::new(e)))?
        .ok_or_else(|| {
            err(format!("image {} is not present on {}", spec.image, spec.node).into())
        })?;
    // Images are the same when their content labels are, whatever their IDs.
    id.image_content = image
        .config
        .and_then(|c| c.labels)
        .and_then(|l| l.get(crate::container::labels::CONTENT).cloned())
        .ok_or_else(|| {
            err(format!(
                "image {} on {} has no {} label: it was not built by BuildImage (`spark-deploy up` builds and ships it)",
                spec.image,
                spec.node,
                crate::container::labels::CONTENT
            )
            .into())
        })?;
    Ok(id)
}

/// The rank specs for the facts learned so far and their cross-rank fingerprint.
async fn resolve(ctx: &Context) -> Result<(Vec<ContainerSpec>, String), LaunchError> {
    let specs = rank_specs(ctx.config(), &ctx.facts());
    for s in &specs {
        let values = s
            .argv
            .iter()
            .chain(s.env.values())
            .chain(s.mounts.iter().map(|m| &m.source));
        if let Some(v) = values
            .into_iter()
            .find(|v| v.contains("detected at preflight>") || v.contains("resolved at fetch>"))
        {
            return Err(LaunchError::Unresolved {
                rank: s.rank,
                node: s.node.clone(),
                value: v.clone(),
            });
        }
    }
    let mut ranks_settings = Vec::new();
    for s in &specs {
        let id = identity(ctx, s).await?;
        ranks_settings.push((s.rank, RankSettings::of(s, &id)));
    }
    let fingerprint = compare(&ranks_settings).map_err(LaunchError::Mismatch)?;
    Ok((specs, fingerprint))
}

impl LaunchRank {
    /// Resolves the specs with the facts learned so far, compares the fingerprint, then starts
    /// the ranks in order (followers first).
    pub(crate) async fn run(&self, ctx: &Context) -> Result<Outcome, StepFailure> {
        let fail = |e: LaunchError| {
            let remedy = matches!(e, LaunchError::Mismatch(_)).then(|| "rebuild the inputs on both nodes from the same plan (`spark-deploy up` re-runs BuildRankCache and ConfigureWorkerStorage)".to_owned());
            StepFailure::new(StepKind::LaunchRank, e, remedy)
        };
        let (mut specs, mut fingerprint) = resolve(ctx).await.map_err(fail)?;
        // Already running with exactly these settings: nothing to do. Running with other settings
        // (a changed CONTEXT, a rebuilt input) or only partly: stop both, then start both.
        let mut running = Vec::new();
        for s in &specs {
            let i = ranks::node_index(ctx, &s.node);
            let d = ctx.docker(i).await.map_err(|e| {
                fail(LaunchError::Start {
                    rank: s.rank,
                    node: s.node.clone(),
                    source: e.into(),
                })
            })?;
            let info = d.inspect_container(&s.name).await.ok().flatten();
            let is_running = info
                .as_ref()
                .and_then(|c| c.state.as_ref())
                .and_then(|st| st.running)
                .unwrap_or(false);
            let fp = info
                .and_then(|c| c.config)
                .and_then(|c| c.labels)
                .and_then(|l| l.get(labels::FINGERPRINT).cloned());
            running.push((is_running, fp));
        }
        if running
            .iter()
            .all(|(r, fp)| *r && fp.as_deref() == Some(fingerprint.as_str()))
        {
            ctx.set_already_running();
            record_launch(ctx, &specs, &fingerprint).await;
            return Ok(Outcome::Skipped {
                reason: format!(
                    "both ranks already running with fingerprint {}",
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
            super::Preflight::new(ctx.config()).check(ctx).await?;
            (specs, fingerprint) = resolve(ctx).await.map_err(fail)?;
        }
        if running.iter().any(|(r, _)| *r) {
            ctx.log(StepKind::LaunchRank, None, Level::Warn, "the running ranks differ from the plan (settings or inputs changed): stopping both before starting both");
            super::ranks::stop_deployment(ctx).await;
        }
        let c = ctx.config().config();
        crate::lifecycle::api_key::for_launch(&c.serving).map_err(|e| fail(e.into()))?;
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
            ranks::start(ctx, s).await.map_err(|source| {
                fail(LaunchError::Start {
                    rank: s.rank,
                    node: s.node.clone(),
                    source,
                })
            })?;
            if s.rank != 0 {
                // A follower that dies at once (bad argv, missing input) must stop the launch here.
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                let i = ranks::node_index(ctx, &s.node);
                let running = match ctx.docker(i).await {
                    Ok(d) => d
                        .inspect_container(&s.name)
                        .await
                        .ok()
                        .flatten()
                        .and_then(|c| c.state)
                        .and_then(|st| st.running)
                        .unwrap_or(false),
                    Err(_) => false,
                };
                if !running {
                    let tail = ranks::log_tail(ctx, i, &s.name, 20).await;
                    return Err(fail(LaunchError::Exited {
                        rank: s.rank,
                        node: s.node.clone(),
                        tail,
                    }));
                }
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
        let i = ranks::node_index(ctx, &s.node);
        let Ok(d) = ctx.docker(i).await else { return };
        let Some(id) = d
            .inspect_container(&s.name)
            .await
            .ok()
            .flatten()
            .and_then(|c| c.id)
        else {
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
        model_commit: facts.model_commit,
        nodes: facts.nodes,
        ranks,
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
