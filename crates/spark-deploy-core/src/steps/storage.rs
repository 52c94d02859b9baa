use std::collections::BTreeMap;

use serde::Serialize;

use std::net::IpAddr;
use std::path::PathBuf;

use super::nfs_volume;
use super::send_ahead::SendAhead;
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
use crate::transfer::{FileJob, expand, fan_out, pull};

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

/// What an overlapped `up` shipped while the others were fetched or built.
#[derive(Debug, Default)]
struct Shipped {
    /// (worker rank, destination) of every file shipped (sent, or found there and verified).
    files: std::collections::HashSet<(usize, PathBuf)>,
    /// Per worker rank, what its transfers did.
    stats: BTreeMap<usize, pull::TransferStats>,
}

impl Shipped {
    fn contains(&self, rank: usize, to: &std::path::Path) -> bool {
        self.files.contains(&(rank, to.to_path_buf()))
    }

    /// Records worker `rank`'s `jobs` and what their transfer did.
    fn record(&mut self, rank: usize, jobs: &[FileJob], stats: pull::TransferStats) {
        self.files.extend(jobs.iter().map(|j| (rank, j.to.clone())));
        let s = self.stats.entry(rank).or_default();
        s.files += stats.files;
        s.sent += stats.sent;
        s.bytes_sent += stats.bytes_sent;
    }
}

/// The remedy of a failed copy.
const RESUME: &str = "fix what the message names on the head or the worker, then run `spark-deploy up` again: it resumes partial files";

/// Ships `jobs` to worker `index` over the fabric (head file server bound to the head's fabric
/// address, worker pulls); used by BuildImage.
pub(crate) async fn ship(
    ctx: &Context,
    step: StepKind,
    index: usize,
    jobs: &[FileJob],
) -> Result<pull::TransferStats, BoxError> {
    let mut r = ship_all(ctx, step, &[(index, jobs.to_vec())]).await?;
    r.pop().ok_or_else(|| BoxError::from("no transfer"))?
}

/// The head's address on the fabric, where its file servers listen.
///
/// # Errors
///
/// The address is not known yet (Preflight finds it).
pub(crate) fn head_fabric_addr(ctx: &Context) -> Result<IpAddr, BoxError> {
    let facts = ctx.facts();
    facts.nodes[0]
        .fabric_addr
        .known()
        .map(|a| IpAddr::V4(*a))
        .ok_or_else(|| {
            format!(
                "the head's fabric address is unknown ({}): run Preflight first",
                facts.nodes[0].fabric_addr
            )
            .into()
        })
}

/// The name of the manifest (in a worker's data directory) of the files `step` shipped there.
/// Each step has its own: in an overlapped `up` BuildImage ships the engine binaries while
/// ConfigureWorkerStorage ships the checkpoint, and a transfer rewrites its manifest when it ends.
fn manifest_name(step: StepKind) -> &'static str {
    match step {
        StepKind::BuildImage => ".spark-deploy-received-engine.tsv",
        _ => ".spark-deploy-received.tsv",
    }
}

/// How many files `step` pulls at once on each worker. Each pull is an SSH session channel, and
/// sshd allows 10 per connection by default: in an overlapped `up` ConfigureWorkerStorage's 4
/// pulls and one follow per rank file run beside BuildImage's 2 (a few engine binaries).
fn streams(step: StepKind) -> usize {
    match step {
        StepKind::BuildImage => 2,
        _ => 4,
    }
}

/// Ships each `(worker index, jobs)` over the fabric, every worker at the same time
/// ([`fan_out::feed`]); each worker's outcome in order. The outer error: nothing could start
/// (the head's fabric address unknown, a worker's destination not its user's, a source
/// unreadable, no server).
pub(crate) async fn ship_all(
    ctx: &Context,
    step: StepKind,
    workers: &[(usize, Vec<FileJob>)],
) -> Result<Vec<Result<pull::TransferStats, BoxError>>, BoxError> {
    let c = ctx.config().config();
    let head_addr = head_fabric_addr(ctx)?;
    let mut execs = Vec::with_capacity(workers.len());
    for (index, jobs) in workers {
        let exec = ctx.exec(*index).await?;
        crate::transfer::ownership::check(
            exec,
            &c.nodes[*index].name,
            &crate::transfer::ownership::roots(jobs.iter().map(|j| j.to.as_path())),
        )
        .await?;
        execs.push(exec);
    }
    let manifests: Vec<PathBuf> = workers
        .iter()
        .map(|(i, _)| PathBuf::from(&c.nodes[*i].data_dir).join(manifest_name(step)))
        .collect();
    let targets: Vec<fan_out::Target<'_>> = workers
        .iter()
        .zip(&execs)
        .zip(&manifests)
        .map(|(((_, jobs), exec), manifest)| fan_out::Target {
            exec,
            jobs,
            manifest,
        })
        .collect();
    let hashes = PathBuf::from(&c.deployment.state_dir).join("transfer-hashes.tsv");
    let started = std::time::Instant::now();
    let progress = |t: usize, p: &pull::TransferProgress<'_>| {
        let (rate_bps, eta_s) = crate::event::rate_and_eta(p.done, p.total, started);
        ctx.emit(Event::Progress {
            source: step.into(),
            node: Some(c.nodes[workers[t].0].name.clone()),
            label: p.file.file_name().map_or_else(
                || p.file.display().to_string(),
                |n| n.to_string_lossy().into_owned(),
            ),
            bytes_done: p.done,
            bytes_total: Some(p.total),
            rate_bps,
            eta_s,
            file: Some(FileBytes {
                done: p.file_done,
                total: p.file_total,
            }),
        });
    };
    let results = fan_out::feed(
        head_addr,
        &targets,
        &hashes,
        streams(step),
        &progress,
        ctx.cancelled(),
    )
    .await?;
    let cancelled = ctx.is_cancelled();
    Ok(results
        .into_iter()
        .map(|r| match r {
            // A transfer the cancellation broke reports the cancellation, not its broken pull.
            Err(_) if cancelled => Err(BoxError::from("cancelled")),
            r => r.map_err(BoxError::from),
        })
        .collect())
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

/// Whether any worker mounts an NFS volume (`nfs` mode).
pub(crate) fn mounts_nfs(ctx: &Context, engine: &dyn Engine) -> bool {
    ConfigureWorkerStorage::new(engine, ctx.config(), &ctx.facts())
        .workers
        .iter()
        .any(|w| w.nfs_volume.is_some())
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
    /// Prepares every worker (its NFS volume or its own tree) and then copies the planned files to
    /// all of them at once.
    pub(crate) async fn run(
        &self,
        ctx: &Context,
        engine: &dyn Engine,
    ) -> Result<Outcome, StepFailure> {
        let fail = |w: &WorkerPlan, e: BoxError| {
            StepFailure::new(StepKind::ConfigureWorkerStorage, e, Some(RESUME.into()))
                .at(Some(w.node.clone()), Some(w.rank))
        };
        // Overlapped `up`: Engram shards travel as they land, the kit and the token map once
        // built, the rank files as soon as they are final on the head; whatever is left once the
        // build is done.
        let mut shipped = Shipped::default();
        if ctx.overlapped() {
            shipped = self.ship_early(ctx, engine).await?;
            ctx.wait_for(StepKind::ConfigureWorkerStorage, |c| c.stages().built)
                .await?;
        }
        // Every worker's own preparation, side by side; the first failure (in rank order) fails
        // the step after all have ended.
        let prepared = futures::future::join_all(
            self.workers
                .iter()
                .map(|w| async move { (w, self.prepare(ctx, engine, w).await) }),
        )
        .await;
        let mut work = Vec::with_capacity(prepared.len());
        for (w, r) in prepared {
            // What this run shipped already (final on the head when it went, verified on
            // arrival) is not looked at again.
            let rest: Vec<FileJob> = r?
                .into_iter()
                .filter(|j| !shipped.contains(w.rank, &j.to))
                .collect();
            work.push((w.rank, rest));
        }
        let results = if work.iter().all(|(_, jobs)| jobs.is_empty()) {
            work.iter()
                .map(|_| Ok(crate::transfer::pull::TransferStats::default()))
                .collect()
        } else {
            ship_all(ctx, StepKind::ConfigureWorkerStorage, &work)
                .await
                .map_err(|e| {
                    StepFailure::new(StepKind::ConfigureWorkerStorage, e, Some(RESUME.into()))
                })?
        };
        let mut bytes = 0;
        let mut summary = Vec::new();
        let mut first_failure = None;
        for (w, r) in self.workers.iter().zip(results) {
            let stats = match r {
                Ok(s) => {
                    let early = shipped.stats.get(&w.rank).copied().unwrap_or_default();
                    pull::TransferStats {
                        files: s.files + early.files,
                        sent: s.sent + early.sent,
                        bytes_sent: s.bytes_sent + early.bytes_sent,
                    }
                }
                Err(e) => {
                    first_failure = first_failure.or(Some(fail(w, e)));
                    continue;
                }
            };
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
        if let Some(f) = first_failure {
            return Err(f);
        }
        ctx.mark_stage(|s| s.stored = true);
        if bytes == 0 {
            return Ok(Outcome::Skipped {
                reason: summary.join("; "),
            });
        }
        Ok(Outcome::Done { bytes: Some(bytes) })
    }

    /// The overlapped part: ships each worker what is final on the head already (the engine's
    /// early files: Engram shards as they land, the rank file once the rank files are final),
    /// again and again, until the fetch has finished and the rank files are final; meanwhile each
    /// worker's rank file follows to it as it is written ([`SendAhead`]). The bytes sent (a
    /// followed file's counted once, by its pull).
    async fn ship_early(&self, ctx: &Context, engine: &dyn Engine) -> Result<Shipped, StepFailure> {
        let ahead = SendAhead::default();
        let ship = self.ship_final(ctx, engine, &ahead);
        let follow = ahead.run(ctx, &self.workers);
        tokio::pin!(ship, follow);
        let mut followed = false;
        loop {
            tokio::select! {
                r = &mut ship => return r,
                () = &mut follow, if !followed => followed = true,
            }
        }
    }

    /// [`Self::ship_early`]'s shipping of final files; the rank files once they are final on the
    /// head and `ahead` has ended its follows (whose sums their pulls take).
    async fn ship_final(
        &self,
        ctx: &Context,
        engine: &dyn Engine,
        ahead: &SendAhead,
    ) -> Result<Shipped, StepFailure> {
        let fail = |w: &WorkerPlan, e: BoxError| {
            StepFailure::new(StepKind::ConfigureWorkerStorage, e, Some(RESUME.into()))
                .at(Some(w.node.clone()), Some(w.rank))
        };
        let mut shipped = Shipped::default();
        let mut rank_files_sent = false;
        loop {
            let stages = ctx.stages();
            let with_rank_files = stages.rank_files && ahead.done() && !rank_files_sent;
            if stages.failed || ctx.is_cancelled() {
                return Err(StepFailure::new(
                    StepKind::ConfigureWorkerStorage,
                    "cancelled",
                    None,
                ));
            }
            let mut work = Vec::with_capacity(self.workers.len());
            for w in &self.workers {
                let mut jobs: Vec<FileJob> = engine
                    .worker_jobs_early(ctx, w.rank, with_rank_files)
                    .await
                    .map_err(|e| fail(w, e))?
                    .into_iter()
                    .filter(|j| !shipped.contains(w.rank, &j.to))
                    .collect();
                ahead.claim(w.rank, &mut jobs);
                work.push((w.rank, jobs));
            }
            if work.iter().any(|(_, j)| !j.is_empty()) {
                let results = ship_all(ctx, StepKind::ConfigureWorkerStorage, &work)
                    .await
                    .map_err(|e| {
                        StepFailure::new(StepKind::ConfigureWorkerStorage, e, Some(RESUME.into()))
                    })?;
                for ((w, r), (rank, jobs)) in self.workers.iter().zip(results).zip(&work) {
                    shipped.record(*rank, jobs, r.map_err(|e| fail(w, e))?);
                }
            }
            rank_files_sent |= with_rank_files;
            if stages.fetched && rank_files_sent {
                return Ok(shipped);
            }
            // Again in 250 ms (the Engram shards that landed meanwhile), or as soon as another
            // stage ends or the follows do.
            let follows_done = ahead.done();
            let _ = tokio::time::timeout(
                std::time::Duration::from_millis(250),
                ctx.wait_until(|c| c.stages() != stages || ahead.done() != follows_done),
            )
            .await;
        }
    }

    /// One worker's preparation before the copy: its NFS volume (`nfs`) or the check of its own
    /// tree (`local`); then the files it must receive.
    async fn prepare(
        &self,
        ctx: &Context,
        engine: &dyn Engine,
        w: &WorkerPlan,
    ) -> Result<Vec<FileJob>, StepFailure> {
        let i = w.rank;
        if let Some((name, options)) = &w.nfs_volume {
            nfs(ctx, i, w, name, options).await.map_err(|e| {
                StepFailure::new(StepKind::ConfigureWorkerStorage, e, None)
                    .at(Some(w.node.clone()), Some(i))
            })?;
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
        engine.worker_jobs(ctx, i).await.map_err(|e| {
            StepFailure::new(StepKind::ConfigureWorkerStorage, e, Some(RESUME.into()))
                .at(Some(w.node.clone()), Some(i))
        })
    }
}
