//! Rank container operations shared by LaunchRank, Smoke and Stop: start one, save a log and
//! remove one, stop every rank a run started (all or none), read a log tail.

use std::path::Path;
use std::time::SystemTime;

use crate::container::ContainerSpec;
use crate::context::Context;
use crate::event::Level;
use crate::event::StepKind;
use crate::lifecycle::logs;
use crate::ports::container_body::create_body;
use crate::ports::docker::DockerError;
use crate::ports::exec::{Cmd, ExecError};

/// Errors of rank container operations.
#[derive(Debug, thiserror::Error)]
pub enum RankOpError {
    /// A Docker call failed.
    #[error(transparent)]
    Docker(#[from] DockerError),
    /// Saving a log on the node failed.
    #[error("saving the log of {container} on {node}: {source}")]
    SaveLog {
        /// Node.
        node: String,
        /// Container.
        container: String,
        /// Underlying error.
        #[source]
        source: ExecError,
    },
    /// Compressing a log failed.
    #[error("compressing the log of {container}: {source}")]
    Compress {
        /// Container.
        container: String,
        /// Underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// Creates and starts `spec` on its node, replacing a stopped container of the same name.
///
/// Whether the node's daemon lets a container raise `RLIMIT_MEMLOCK` is a capability of that
/// host, detected here: when the start fails with the spec's memlock limit and succeeds without
/// it, the rank runs without it and a warning says so (RDMA needs pinned memory; a Spark's daemon
/// must allow it). Any other failure is returned as it is.
///
/// # Errors
///
/// [`RankOpError::Docker`] naming node and container.
pub(crate) async fn start(
    ctx: &Context,
    step: StepKind,
    spec: &ContainerSpec,
) -> Result<(), RankOpError> {
    let i = ctx.node_index(&spec.node);
    let docker = ctx.docker(i).await?;
    docker.remove_container(&spec.name).await?;
    docker
        .create_container(&spec.name, create_body(spec))
        .await?;
    ctx.record_started(i, spec.name.clone());
    let Err(first) = docker.start_container(&spec.name).await else {
        return Ok(());
    };
    if !spec.ulimits.iter().any(|u| u.name == "memlock") {
        return Err(first.into());
    }
    let mut without = spec.clone();
    without.ulimits.retain(|u| u.name != "memlock");
    docker.remove_container(&spec.name).await?;
    docker
        .create_container(&spec.name, create_body(&without))
        .await?;
    if let Err(second) = docker.start_container(&spec.name).await {
        // Both failed: the retry's error is the one that says what is wrong without memlock;
        // the first is logged so neither is lost.
        ctx.log(
            step,
            Some(&spec.node),
            Level::Warn,
            format!(
                "starting rank {} with the memlock limit failed first: {first}",
                spec.rank
            ),
        );
        return Err(second.into());
    }
    ctx.log(
        step,
        Some(&spec.node),
        Level::Warn,
        format!(
            "{}'s Docker refuses the memlock limit ({first}); rank {} runs without it. RDMA needs pinned memory: allow `--ulimit memlock=-1` in that daemon (LimitMEMLOCK=infinity in its unit) before serving over RoCE",
            spec.node, spec.rank
        ),
    );
    Ok(())
}

fn gzip(bytes: &[u8]) -> std::io::Result<Vec<u8>> {
    use std::io::Write as _;
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(bytes)?;
    enc.finish()
}

/// What [`stop_and_save`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Stopped {
    /// No such container.
    Absent,
    /// Stopped and removed; the saved log, unless `keep` is 0.
    Removed(Option<String>),
}

/// Stops `container` on node `node` (grace `grace_s`), saves its log with timestamps gzipped into
/// `log_dir` on that node (keeping the newest `keep`), and removes it.
///
/// # Errors
///
/// [`RankOpError`] for Docker, compression or writing failures.
pub(crate) async fn stop_and_save(
    ctx: &Context,
    node: usize,
    container: &str,
    log_dir: &str,
    keep: u32,
    grace_s: u64,
) -> Result<Stopped, RankOpError> {
    let docker = ctx.docker(node).await?;
    if docker.inspect_container(container).await?.is_none() {
        return Ok(Stopped::Absent);
    }
    docker
        .stop_container(container, i32::try_from(grace_s).unwrap_or(i32::MAX))
        .await?;
    let mut saved = None;
    if keep > 0 {
        let log = docker.logs(container, true, None).await?;
        let gz = gzip(&log).map_err(|source| RankOpError::Compress {
            container: container.to_owned(),
            source,
        })?;
        let path = format!(
            "{}/{}",
            log_dir.trim_end_matches('/'),
            logs::file_name(SystemTime::now(), container)
        );
        let exec = ctx
            .exec(node)
            .await
            .map_err(|source| RankOpError::SaveLog {
                node: ctx.node_names()[node].clone(),
                container: container.to_owned(),
                source,
            })?;
        let save = |source| RankOpError::SaveLog {
            node: ctx.node_names()[node].clone(),
            container: container.to_owned(),
            source,
        };
        exec.write_file(Path::new(&path), &gz).await.map_err(save)?;
        let listing = exec
            .run(&Cmd::new("ls").arg("-1").arg(log_dir))
            .await
            .map_err(save)?;
        let names: Vec<String> = String::from_utf8_lossy(&listing.stdout)
            .lines()
            .map(str::to_owned)
            .collect();
        let prune = logs::to_prune(&names, container, keep as usize);
        if !prune.is_empty() {
            let mut cmd = Cmd::new("rm").arg("-f").arg("--");
            for p in prune {
                cmd = cmd.arg(format!("{}/{p}", log_dir.trim_end_matches('/')));
            }
            exec.run(&cmd).await.map_err(save)?;
        }
        saved = Some(path);
    }
    docker.remove_container(container).await?;
    Ok(Stopped::Removed(saved))
}

/// Stops one rank for the both-or-neither rule, reporting (never hiding) the outcome.
async fn stop_for_pair(ctx: &Context, node: usize, container: &str) {
    let c = ctx.config().config();
    let n = &c.nodes[node];
    let log_dir = crate::layout::NodeLayout::of(ctx.config(), n).log_dir;
    match stop_and_save(
        ctx,
        node,
        container,
        &log_dir,
        c.lifecycle.log_keep.max(1),
        c.lifecycle.stop_timeout_s,
    )
    .await
    {
        Ok(Stopped::Removed(path)) => ctx.log(
            StepKind::Stop,
            Some(&n.name),
            Level::Warn,
            format!(
                "stopped {container} (all ranks or none); log saved to {}",
                path.unwrap_or_else(|| "<not saved>".into())
            ),
        ),
        Ok(Stopped::Absent) => {}
        Err(e) => ctx.log(
            StepKind::Stop,
            Some(&n.name),
            Level::Error,
            format!("could not stop {container}: {e}"),
        ),
    }
}

/// Stops every rank container this run started, rank 0 first, saving logs.
pub(crate) async fn stop_started(ctx: &Context) {
    let mut started = ctx.take_started();
    started.sort_by_key(|(node, _)| *node);
    for (node, container) in started {
        stop_for_pair(ctx, node, &container).await;
    }
}

/// Stops every rank container of the deployment (rank 0 first), whoever started them, saving
/// logs: the pair is never left half-running after a launch or readiness failure.
pub(crate) async fn stop_deployment(ctx: &Context) {
    let _ = ctx.take_started();
    let c = ctx.config().config();
    for node in 0..c.nodes.len() {
        let container = crate::container::rank_container_name(&c.deployment.name, node);
        stop_for_pair(ctx, node, &container).await;
    }
}
