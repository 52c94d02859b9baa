//! Starting a recorded generation again (an upgrade's automatic rollback, and `rollback` by
//! hand), and retiring generations beyond the retention.

use crate::config::ValidatedConfig;
use crate::context::Context;
use crate::engine;
use crate::event::{Event, Level, Source};
use crate::layout::NodeLayout;
use crate::lifecycle::generations::{self, Generation, GenerationState, GenerationsError, History};
use crate::plan::{Plan, Step};
use crate::run::RunError;
use crate::steps::{LaunchRank, Preflight, Smoke, Stop};

/// Why a generation could not be started again.
#[derive(Debug, thiserror::Error)]
pub enum RollbackError {
    /// There is no generation to return to.
    #[error("no earlier generation to return to ({0})")]
    NoTarget(String),
    /// The history could not be read or written.
    #[error(transparent)]
    History(#[from] GenerationsError),
    /// The generation's recorded config does not validate any more.
    #[error("generation {id}'s recorded config does not validate: {detail}")]
    Config {
        /// The generation.
        id: u32,
        /// Why.
        detail: String,
    },
    /// Its image could not be given back its name on a node.
    #[error("restoring generation {id}'s image {tag} as {image} on {node}: {detail}")]
    Image {
        /// The generation.
        id: u32,
        /// The kept tag.
        tag: String,
        /// The name the launch uses.
        image: String,
        /// The node.
        node: String,
        /// Why.
        detail: String,
    },
    /// Its launch failed (both-or-neither stopped whatever started).
    #[error("starting generation {id}: {source}")]
    Launch {
        /// The generation.
        id: u32,
        /// The run's error.
        #[source]
        source: Box<RunError>,
    },
}

impl RollbackError {
    /// What to do about it.
    #[must_use]
    pub fn remedy(&self) -> String {
        match self {
            Self::NoTarget(_) => "`spark-deploy history` lists the generations; only one that served and was not retired can be returned to".into(),
            Self::History(_) => "fix or move aside the file named".into(),
            Self::Config { .. } => "`spark-deploy up` with a config that validates".into(),
            Self::Image { .. } => "the generation's image is gone from that node: `spark-deploy up` with its config builds and ships it again".into(),
            Self::Launch { source, .. } => source
                .failure
                .remedy
                .clone()
                .unwrap_or_else(|| "`spark-deploy logs` shows why the ranks failed".into()),
        }
    }
}

/// The recorded config of `g`, with the secrets of `current`.
pub(crate) fn config_of(
    g: &Generation,
    current: &ValidatedConfig,
) -> Result<ValidatedConfig, String> {
    g.validated(current)
}

/// Starts generation `g` again on `ctx` (whose config is `g`'s): its image given back its name on
/// every node, then Preflight, Stop (whatever runs), LaunchRank with its checkpoint commit, Smoke.
/// The run records it serving again.
pub(crate) async fn restore(ctx: &Context, g: &Generation) -> Result<(), RollbackError> {
    let v = ctx.config().clone();
    for (i, node) in v.config().nodes.iter().enumerate() {
        let image = NodeLayout::of(&v, node).image;
        let Some(tag) = g.images.get(i).filter(|t| **t != image) else {
            continue;
        };
        let err = |detail: String| RollbackError::Image {
            id: g.id,
            tag: tag.clone(),
            image: image.clone(),
            node: node.name.clone(),
            detail,
        };
        let docker = ctx.docker(i).await.map_err(|e| err(e.to_string()))?;
        docker
            .tag_image(tag, &image)
            .await
            .map_err(|e| err(e.to_string()))?;
    }
    ctx.update_facts(|f| f.model_commit = crate::facts::Detected::Known(g.model_commit.clone()));
    let e = engine::for_config(&v);
    let facts = ctx.facts();
    let plan = Plan::from_steps(
        &v,
        vec![
            Step::Preflight(Preflight::new(&v)),
            Step::Stop(Stop::new(&v)),
            Step::LaunchRank(LaunchRank::new(e.as_ref(), &v, &facts)),
            Step::Smoke(Smoke::new(e.as_ref(), &v)),
        ],
    );
    Box::pin(plan.run(ctx))
        .await
        .map(|_| ())
        .map_err(|source| RollbackError::Launch {
            id: g.id,
            source: Box::new(source),
        })
}

/// `spark-deploy rollback`: stops the serving generation and starts the one that served before
/// it. `current` is the deployment's current config (for its state directory and secrets);
/// events go to its sink. Returns the generation serving now.
///
/// # Errors
///
/// [`RollbackError`]: nothing to return to, or its start failed (then nothing serves: the
/// error says why).
pub async fn rollback(current: &Context) -> Result<u32, RollbackError> {
    let state_dir = std::path::PathBuf::from(&current.config().config().deployment.state_dir);
    let history = generations::read(&state_dir)?;
    let target = history.previous().cloned().ok_or_else(|| {
        RollbackError::NoTarget(match history.serving() {
            Some(g) => format!("generation {} serves and none served before it", g.id),
            None => "no generation is recorded".into(),
        })
    })?;
    let v = config_of(&target, current.config()).map_err(|detail| RollbackError::Config {
        id: target.id,
        detail,
    })?;
    current.emit(Event::Log {
        source: Source::Command("rollback".into()),
        node: None,
        level: Level::Info,
        line: format!(
            "returning to generation {} (fingerprint {})",
            target.id, target.fingerprint
        ),
    });
    let ctx = Context::new(v, current.sink());
    restore(&ctx, &target).await?;
    Ok(target.id)
}

/// Retires generations `ids`: their image tags go, and their inputs directories on every node
/// unless a generation still kept uses the same one. Failures are warned, not fatal: the next
/// accepted upgrade tries again.
pub(crate) async fn retire(ctx: &Context, history: &History, ids: &[u32]) {
    let kept: Vec<&Generation> = history
        .generations
        .iter()
        .filter(|g| !ids.contains(&g.id) && g.state != GenerationState::Rejected)
        .collect();
    let layouts = |g: &Generation| -> Vec<NodeLayout> {
        config_of(g, ctx.config())
            .map(|v| {
                v.config()
                    .nodes
                    .iter()
                    .map(|n| NodeLayout::of(&v, n))
                    .collect()
            })
            .unwrap_or_default()
    };
    let kept_layouts: Vec<Vec<NodeLayout>> = kept.iter().map(|g| layouts(g)).collect();
    let warn = |node: &str, line: String| {
        ctx.emit(Event::Log {
            source: Source::Command("upgrade".into()),
            node: Some(node.to_owned()),
            level: Level::Warn,
            line,
        });
    };
    let mut retired = Vec::new();
    for g in history.generations.iter().filter(|g| ids.contains(&g.id)) {
        for (i, l) in layouts(g).iter().enumerate() {
            let in_use = |f: &dyn Fn(&NodeLayout) -> &String| {
                kept_layouts
                    .iter()
                    .any(|k| k.get(i).is_some_and(|kl| f(kl) == f(l)))
            };
            if let Some(tag) = g.images.get(i)
                && !kept.iter().any(|k| k.images.get(i) == Some(tag))
                && *tag != l.image
                && let Ok(d) = ctx.docker(i).await
                && let Err(e) = d.remove_image(tag).await
            {
                warn(
                    &l.node,
                    format!("removing generation {}'s image tag {tag}: {e}", g.id),
                );
            }
            if !in_use(&|x: &NodeLayout| &x.inputs_dir)
                && let Ok(exec) = ctx.exec(i).await
                && let Err(e) = exec
                    .run(&crate::ports::exec::Cmd::new("rm").args(["-rf", "--", &l.inputs_dir]))
                    .await
            {
                warn(
                    &l.node,
                    format!(
                        "removing generation {}'s inputs {}: {e}",
                        g.id, l.inputs_dir
                    ),
                );
            }
        }
        retired.push(g.id);
    }
    let state_dir = std::path::PathBuf::from(&ctx.config().config().deployment.state_dir);
    if let Ok(mut h) = generations::read(&state_dir) {
        for g in h.generations.iter_mut().filter(|g| retired.contains(&g.id)) {
            g.state = GenerationState::Retired;
            g.note = Some("retired: its inputs and image tag were removed".into());
        }
        let _ = generations::write(&state_dir, &h);
    }
}
