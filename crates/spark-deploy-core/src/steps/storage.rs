use std::collections::BTreeMap;

use serde::Serialize;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use super::nfs_volume;
use crate::config::{ValidatedConfig, WorkerStorage};
use crate::context::{Context, Outcome, StepFailure};
use crate::describe::{Action, ActionDetail, Transfer};
use crate::engine::Engine;
use crate::event::FileBytes;
use crate::event::StepKind;
use crate::event::{Event, Level};
use crate::facts::DeploymentFacts;
use crate::layout::{NodeLayout, repo_folder};
use crate::ports::exec::Cmd;
use crate::transfer::{FileJob, expand, pull, server::FileServer};

/// What one worker receives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WorkerPlan {
    /// Worker node.
    pub node: String,
    /// Rank it serves.
    pub rank: usize,
    /// Address the bytes travel to (the worker's fabric address, never management).
    pub fabric_addr: String,
    /// NFS volume options in `nfs` mode.
    pub nfs_volume: Option<(String, BTreeMap<String, String>)>,
    /// In `local` mode, the worker's own tree and the checkpoint files it must hold there.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local_tree: Option<LocalTree>,
    /// Files copied in both modes (and the checkpoint in `copy` mode).
    pub transfers: Vec<Transfer>,
}

/// `local` mode: the worker's own HF cache tree, bind-mounted read-only as rank's cache.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LocalTree {
    /// The tree on the worker (`storage.worker_tree`).
    pub path: String,
    /// The checkpoint's snapshot directory inside it.
    pub snapshot: String,
    /// Files of the snapshot the follower reads at start, checked present.
    pub required: Vec<String>,
}

/// The checkpoint files a follower reads from its HF cache at start (it reads its weights from
/// its rank file): what `local` mode checks in the worker's tree.
const FOLLOWER_READS: [&str; 3] = ["config.json", "tokenizer.json", "tokenizer_config.json"];

/// Gives every worker exactly the bytes its rank needs: in `nfs` mode a read-only Docker NFS
/// volume of the head's cache plus local copies of the Engram tables, kit and rank inputs; in
/// `copy` mode the checkpoint files as well.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConfigureWorkerStorage {
    /// Mode.
    pub mode: WorkerStorage,
    /// One entry per worker.
    pub workers: Vec<WorkerPlan>,
}

impl ConfigureWorkerStorage {
    /// The storage plan of `config`.
    #[must_use]
    pub fn new(engine: &dyn Engine, config: &ValidatedConfig, facts: &DeploymentFacts) -> Self {
        let c = config.config();
        let head = NodeLayout::of(config, &c.nodes[0]);
        let workers = c
            .nodes
            .iter()
            .enumerate()
            .skip(1)
            .map(|(r, node)| {
                let transfers = engine.plan_worker_inputs(config, facts, r);
                let nfs_volume = (c.deployment.worker_storage == WorkerStorage::Nfs).then(|| {
                    let server = crate::layout::nfs_server(config, &facts.nodes[0].fabric_addr);
                    let path = if c.storage.nfs_path.is_empty() { head.hf_cache.clone() } else { c.storage.nfs_path.clone() };
                    let options = BTreeMap::from([
                        ("type".to_owned(), "nfs".to_owned()),
                        ("device".to_owned(), format!(":{path}")),
                        ("o".to_owned(), format!("addr={server},nfsvers=4.2,ro,nconnect=8,rsize=1048576,wsize=1048576,hard,timeo=600")),
                    ]);
                    (c.storage.nfs_volume.clone(), options)
                });
                let local_tree = (c.deployment.worker_storage == WorkerStorage::Local).then(|| {
                    LocalTree {
                        path: c.storage.worker_tree.clone(),
                        snapshot: crate::layout::snapshot_dir(&c.storage.worker_tree, &c.model.id, &facts.model_commit.to_string())
                            .display()
                            .to_string(),
                        required: FOLLOWER_READS.iter().map(|f| (*f).to_owned()).collect(),
                    }
                });
                WorkerPlan {
                    node: node.name.clone(),
                    rank: r,
                    fabric_addr: facts.nodes[r].fabric_addr.to_string(),
                    nfs_volume,
                    local_tree,
                    transfers,
                }
            })
            .collect();
        Self {
            mode: c.deployment.worker_storage,
            workers,
        }
    }

    pub(crate) fn describe(&self) -> (String, Vec<Action>) {
        let mut actions = Vec::new();
        for w in &self.workers {
            if let Some((name, options)) = &w.nfs_volume {
                actions.push(Action::with(
                    &w.node,
                    "create the read-only NFS volume of the head's cache (export checked on the head), verify every file from a throwaway container",
                    ActionDetail::Volume { name: name.clone(), driver: "local".into(), options: options.clone() },
                ));
            }
            if let Some(t) = &w.local_tree {
                actions.push(Action::new(
                    &w.node,
                    format!(
                        "check that {} holds {} (bind-mounted read-only as the rank's HF cache; nothing of the checkpoint is copied)",
                        t.snapshot,
                        t.required.join(", ")
                    ),
                ));
            }
            actions.push(Action::with(
                &w.node,
                "copy missing or differing files, resumable, verified by size and sha256 on arrival",
                ActionDetail::Transfer { via: format!("fabric address {}", w.fabric_addr), files: w.transfers.clone() },
            ));
        }
        let mode = match self.mode {
            WorkerStorage::Nfs => "nfs",
            WorkerStorage::Copy => "copy",
            WorkerStorage::Local => "local",
        };
        (
            format!("give every worker exactly the bytes its rank needs ({mode} mode)"),
            actions,
        )
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Ships `jobs` to worker `index` over the fabric (head file server bound to the head's fabric
/// address, worker pulls); used by ConfigureWorkerStorage and BuildImage.
pub(crate) async fn ship(
    ctx: &Context,
    step: StepKind,
    index: usize,
    jobs: &[FileJob],
) -> Result<pull::TransferStats, BoxError> {
    let c = ctx.config().config();
    let facts = ctx.facts();
    let head_addr: IpAddr = facts.nodes[0]
        .fabric_addr
        .known()
        .map(|a| IpAddr::V4(*a))
        .ok_or_else(|| {
            format!(
                "the head's fabric address is unknown ({}): run Preflight first",
                facts.nodes[0].fabric_addr
            )
        })?;
    let exec = ctx.exec(index).await?;
    let node = c.nodes[index].name.clone();
    crate::transfer::ownership::check(
        exec,
        &node,
        &crate::transfer::ownership::roots(jobs.iter().map(|j| j.to.as_path())),
    )
    .await?;
    let server = FileServer::start(SocketAddr::new(head_addr, 0)).await?;
    let manifest = PathBuf::from(&c.nodes[index].data_dir).join(".spark-deploy-received.tsv");
    let hashes = PathBuf::from(&c.deployment.state_dir).join("transfer-hashes.tsv");
    let progress = |p: &pull::TransferProgress<'_>| {
        ctx.emit(Event::Progress {
            source: step.into(),
            node: Some(node.clone()),
            label: p.file.file_name().map_or_else(
                || p.file.display().to_string(),
                |n| n.to_string_lossy().into_owned(),
            ),
            bytes_done: p.done,
            bytes_total: Some(p.total),
            rate_bps: None,
            eta_s: None,
            file: Some(FileBytes {
                done: p.file_done,
                total: p.file_total,
            }),
        });
    };
    let transfer = pull::transfer(exec, &server, jobs, &manifest, &hashes, 4, &progress);
    let mut transfer = std::pin::pin!(transfer);
    tokio::select! {
        r = &mut transfer => Ok(r?),
        () = ctx.cancelled() => {
            // Break the pulls in flight and wait for them to end (the run bounds this wait):
            // each worker keeps its `.partial` file, and files that arrived whole are already
            // in the worker's manifest, so the next run resumes the one and skips the others.
            server.stop_transfers();
            let _ = transfer.await;
            Err("cancelled".into())
        }
    }
}

fn export_and_server<'a>(
    options: &'a BTreeMap<String, String>,
    cache: &'a str,
) -> (&'a str, &'a str) {
    let server = options
        .get("o")
        .and_then(|o| o.strip_prefix("addr="))
        .and_then(|o| o.split(',').next())
        .unwrap_or_default();
    let exported = options
        .get("device")
        .map_or(cache, |d| d.trim_start_matches(':'));
    (exported, server)
}

/// What to create and verify for worker plan `w`.
fn volume_spec<'a>(
    ctx: &Context,
    w: &'a WorkerPlan,
    name: &'a str,
    options: &'a BTreeMap<String, String>,
) -> Result<nfs_volume::VolumeSpec<'a>, BoxError> {
    let c = ctx.config().config();
    let facts = ctx.facts();
    let snap =
        crate::layout::snapshot_dir(&c.hub.cache, &c.model.id, &facts.model_commit.to_string());
    let mut expected: Vec<(String, u64)> = expand(&snap, &snap)?
        .into_iter()
        .filter_map(|j| {
            j.from
                .strip_prefix(&snap)
                .ok()
                .map(|p| (p.display().to_string(), j.size))
        })
        .collect();
    expected.sort();
    let (_, server) = export_and_server(options, "");
    Ok(nfs_volume::VolumeSpec {
        node: &w.node,
        name,
        options,
        server,
        labels: BTreeMap::from([(
            crate::container::labels::DEPLOYMENT.to_owned(),
            c.deployment.name.clone(),
        )]),
        image: c.engine.image.clone(),
        snapshot: format!(
            "hub/{}/snapshots/{}",
            repo_folder(&c.model.id),
            facts.model_commit
        ),
        expected,
    })
}

/// NFS mode on worker `index`: the head's export checked, the volume created or accepted through the worker's Docker, and its mount
/// verified when the engine image is already there (else BuildImage verifies it,
/// [`verify_nfs_mounts`]).
async fn nfs(
    ctx: &Context,
    index: usize,
    w: &WorkerPlan,
    name: &str,
    options: &BTreeMap<String, String>,
) -> Result<(), BoxError> {
    let c = ctx.config().config();
    let head = NodeLayout::of(ctx.config(), &c.nodes[0]);
    let (exported, server) = export_and_server(options, &head.hf_cache);
    {
        let facts = ctx.facts();
        let client: std::net::Ipv4Addr =
            *facts.nodes[index].fabric_addr.known().ok_or_else(|| {
                format!(
                    "the fabric address of {} is unknown ({}): run Preflight first",
                    w.node, facts.nodes[index].fabric_addr
                )
            })?;
        let exports = ctx
            .exec(0)
            .await?
            .run(&Cmd::shell(
                "cat /etc/exports /etc/exports.d/*.exports 2>/dev/null; true",
            ))
            .await?;
        nfs_volume::check_exports(&String::from_utf8_lossy(&exports.stdout), exported, client)
            .map_err(|why| nfs_volume::NfsError::NotExported {
                path: exported.to_owned(),
                client,
                why,
            })?;
    }
    let spec = volume_spec(ctx, w, name, options)?;
    let docker = ctx.docker(index).await?;
    let created = nfs_volume::create_or_accept(docker, &spec).await?;
    ctx.log(
        StepKind::ConfigureWorkerStorage,
        Some(&w.node),
        Level::Info,
        format!(
            "NFS volume {name} {} through {}'s Docker: device :{exported}, server {server}",
            if created {
                "created"
            } else {
                "present with the same options"
            },
            w.node
        ),
    );
    if docker.inspect_image(&spec.image).await?.is_none() {
        ctx.log(
            StepKind::ConfigureWorkerStorage,
            Some(&w.node),
            Level::Info,
            format!("NFS volume {name}: the engine image is not on {} yet; BuildImage verifies the mount once it is", w.node),
        );
        return Ok(());
    }
    verify_one(ctx, StepKind::ConfigureWorkerStorage, docker, &spec).await
}

async fn verify_one(
    ctx: &Context,
    step: StepKind,
    docker: &crate::ports::docker::DockerNode,
    spec: &nfs_volume::VolumeSpec<'_>,
) -> Result<(), BoxError> {
    nfs_volume::verify_mount(docker, spec).await?;
    ctx.log(
        step,
        Some(spec.node),
        Level::Info,
        format!(
            "NFS volume {}: all {} snapshot files visible from a container on {} with the head's sizes",
            spec.name,
            spec.expected.len(),
            spec.node
        ),
    );
    Ok(())
}

/// Verifies every worker's NFS volume from a container of the engine image (BuildImage calls it
/// once the image is on every node); nothing in `copy` mode.
///
/// # Errors
///
/// The first worker whose mount fails or differs.
pub(crate) async fn verify_nfs_mounts(ctx: &Context, engine: &dyn Engine) -> Result<(), BoxError> {
    let plan = ConfigureWorkerStorage::new(engine, ctx.config(), &ctx.facts());
    for w in &plan.workers {
        if let Some((name, options)) = &w.nfs_volume {
            let spec = volume_spec(ctx, w, name, options)?;
            let docker = ctx.docker(w.rank).await?;
            verify_one(ctx, StepKind::BuildImage, docker, &spec).await?;
        }
    }
    Ok(())
}

/// `local` mode: the follower's files are in the worker's tree.
async fn check_local_tree(ctx: &Context, index: usize, tree: &LocalTree) -> Result<(), BoxError> {
    let exec = ctx.exec(index).await?;
    let mut missing = Vec::new();
    for f in &tree.required {
        let p = PathBuf::from(&tree.snapshot).join(f);
        if !exec.path_exists(&p).await? {
            missing.push(f.clone());
        }
    }
    if missing.is_empty() {
        ctx.log(
            StepKind::ConfigureWorkerStorage,
            Some(&ctx.config().config().nodes[index].name),
            Level::Info,
            format!("{} holds {}", tree.snapshot, tree.required.join(", ")),
        );
        return Ok(());
    }
    Err(format!(
        "the worker's tree {} lacks {} in {}",
        tree.path,
        missing.join(", "),
        tree.snapshot
    )
    .into())
}

impl ConfigureWorkerStorage {
    /// Copies the planned files to every worker (and, in `nfs` mode, creates the NFS volume).
    pub(crate) async fn run(
        &self,
        ctx: &Context,
        engine: &dyn Engine,
    ) -> Result<Outcome, StepFailure> {
        let fail = |e: BoxError| {
            StepFailure::new(
                StepKind::ConfigureWorkerStorage,
                e,
                Some("fix what the message names on the head or the worker, then run `spark-deploy up` again: it resumes partial files".into()),
            )
        };
        let mut bytes = 0;
        let mut summary = Vec::new();
        for w in &self.workers {
            let i = w.rank;
            if let Some((name, options)) = &w.nfs_volume {
                nfs(ctx, i, w, name, options)
                    .await
                    .map_err(|e| StepFailure::new(StepKind::ConfigureWorkerStorage, e, None))?;
            }
            if let Some(tree) = &w.local_tree {
                check_local_tree(ctx, i, tree).await.map_err(|e| {
                    StepFailure::new(
                        StepKind::ConfigureWorkerStorage,
                        e,
                        Some(format!(
                            "put the checkpoint's snapshot at {} on {} (for example `hf download {} --revision {} --cache-dir {}/hub` there), or set NFS_VOLUME to a volume name (nfs) or empty (copy)",
                            tree.snapshot,
                            w.node,
                            ctx.config().config().model.id,
                            ctx.facts().model_commit,
                            tree.path
                        )),
                    )
                    .at(Some(w.node.clone()), Some(i))
                })?;
            }
            let jobs = engine.worker_jobs(ctx, i).await.map_err(fail)?;
            let stats = ship(ctx, StepKind::ConfigureWorkerStorage, i, &jobs)
                .await
                .map_err(fail)?;
            ctx.log(
                StepKind::ConfigureWorkerStorage,
                Some(&w.node),
                Level::Info,
                format!(
                    "{} files: {} sent ({} bytes) over the fabric, the rest present and verified",
                    stats.files, stats.sent, stats.bytes_sent
                ),
            );
            summary.push(format!(
                "{}: all {} files present and verified",
                w.node, stats.files
            ));
            bytes += stats.bytes_sent;
        }
        if bytes == 0 {
            return Ok(Outcome::Skipped {
                reason: summary.join("; "),
            });
        }
        Ok(Outcome::Done { bytes: Some(bytes) })
    }
}
