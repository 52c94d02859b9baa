//! What a running step may touch: the validated config, the event sink, one lazily connected
//! Exec and Docker port per node, the facts learned so far, and a cancellation signal.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use tokio::sync::{OnceCell, watch};

use crate::config::{NodeConfig, ValidatedConfig};
use crate::event::{Event, EventSink, Level, RedactingSink};
use crate::event::{Source, StepKind};
use crate::facts::DeploymentFacts;
use crate::ports::docker::{ContainerState, DockerError, DockerNode};
use crate::ports::exec::{Exec, ExecError};
use crate::ports::{NodeTarget, SshTarget};
use crate::preflight::report::PreflightReport;
use crate::transfer::prefix::GrowingFile;

/// What a step did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The step did its work.
    Done {
        /// Bytes moved, when any.
        bytes: Option<u64>,
    },
    /// Nothing to do.
    Skipped {
        /// Why (e.g. "all 43 files present and verified").
        reason: String,
    },
}

/// A step's failure: which step, the error, what to do, and where (node and rank, when the
/// error names them), as typed fields.
#[derive(Debug, thiserror::Error)]
#[error("{} failed", step.title())]
pub struct StepFailure {
    /// The step.
    pub step: StepKind,
    /// The underlying error.
    #[source]
    pub source: Box<dyn std::error::Error + Send + Sync>,
    /// What the user can do.
    pub remedy: Option<String>,
    /// The node the failure happened on, when known.
    pub node: Option<String>,
    /// The rank concerned, when known.
    pub rank: Option<usize>,
}

impl StepFailure {
    /// Wraps `source` for `step`.
    pub fn new(
        step: StepKind,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
        remedy: Option<String>,
    ) -> Self {
        Self {
            step,
            source: source.into(),
            remedy,
            node: None,
            rank: None,
        }
    }

    /// Records where the failure happened.
    #[must_use]
    pub fn at(mut self, node: Option<String>, rank: Option<usize>) -> Self {
        self.node = node;
        self.rank = rank;
        self
    }

    /// The error and its causes as one line, each cause once.
    #[must_use]
    pub fn chain(&self) -> String {
        crate::causes::one_line(self.source.as_ref())
    }

    /// The error and its causes, top first, each once.
    #[must_use]
    pub fn causes(&self) -> Vec<String> {
        crate::causes::causes(self.source.as_ref())
    }
}

/// The node target a config entry describes (`~` already expanded by validation): unset SSH
/// settings are left to ssh, which reads `<home>/.ssh/config`.
#[must_use]
pub fn node_target(node: &NodeConfig, home: &std::path::Path) -> NodeTarget {
    if node.is_local() {
        return NodeTarget::Local;
    }
    let set = |p: &str| (!p.is_empty()).then(|| PathBuf::from(p));
    NodeTarget::Ssh(SshTarget {
        port: node.ssh_port,
        identity_file: set(&node.identity_file),
        known_hosts: set(&node.known_hosts),
        home: Some(home.to_owned()),
        ..SshTarget::new(node.ssh.clone())
    })
}

struct NodeConn {
    name: String,
    target: NodeTarget,
    exec: OnceCell<Exec>,
    docker: OnceCell<DockerNode>,
}

/// A growing file as last published, and the sender of its final start as it grows.
type Published = (GrowingFile, tokio::sync::watch::Sender<u64>);

/// Shared state of one plan run.
pub struct Context {
    config: ValidatedConfig,
    sink: Arc<dyn EventSink>,
    nodes: Vec<NodeConn>,
    facts: Mutex<DeploymentFacts>,
    cancel: watch::Receiver<bool>,
    cancel_tx: watch::Sender<bool>,
    started: Mutex<Vec<(usize, String)>>,
    already_running: std::sync::atomic::AtomicBool,
    preflight_deferred: std::sync::atomic::AtomicBool,
    preflight: Mutex<Option<PreflightReport>>,
    launch_started: Mutex<Option<std::time::Instant>>,
    prepare: Mutex<crate::config::PreparePolicy>,
    dry_run: std::sync::atomic::AtomicBool,
    overlap: Mutex<Option<Stages>>,
    /// Files still being written, by (rank, destination): as last published, and the sender of
    /// their final start as it grows.
    growing: Mutex<std::collections::BTreeMap<(usize, PathBuf), Published>>,
    wanted_first: Mutex<Option<Vec<String>>>,
    fetched_repos: Mutex<std::collections::BTreeSet<String>>,
}

/// Where the preparation steps stand when they run overlapped (see [`Context::overlapped`]): each
/// flag turns true once, when that stage has finished successfully.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stages {
    /// FetchCheckpoint has every file (and the commits are known).
    pub fetched: bool,
    /// BuildRankCache has every rank file under its final name on the head.
    pub rank_files: bool,
    /// BuildRankCache has every input besides the rank files and the Engram tables final on the
    /// head (the token map and the kit with its tables): the workers can have them.
    pub side_inputs: bool,
    /// BuildRankCache is done (token map, kit, tables too).
    pub built: bool,
    /// ConfigureWorkerStorage is done (every worker's files, its NFS volume in `nfs` mode).
    pub stored: bool,
    /// One of the overlapped steps failed: the others stop.
    pub failed: bool,
}

/// How often a step waiting on another overlapped step looks again.
const STAGE_POLL: std::time::Duration = std::time::Duration::from_millis(50);

impl Context {
    /// A context for `config`, sending events (secrets redacted) to `sink`.
    #[must_use]
    pub fn new(config: ValidatedConfig, sink: Arc<dyn EventSink>) -> Self {
        let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/"), PathBuf::from);
        let c = config.config();
        let secrets = c.secrets();
        let sink: Arc<dyn EventSink> = Arc::new(RedactingSink::new(ArcSink(sink), secrets));
        let nodes = c
            .nodes
            .iter()
            .map(|n| NodeConn {
                name: n.name.clone(),
                target: node_target(n, &home),
                exec: OnceCell::new(),
                docker: OnceCell::new(),
            })
            .collect();
        let facts = Mutex::new(DeploymentFacts::placeholders(&config));
        let prepare = Mutex::new(c.lifecycle.prepare);
        let (cancel_tx, cancel) = watch::channel(false);
        Self {
            config,
            sink,
            nodes,
            facts,
            cancel,
            cancel_tx,
            started: Mutex::new(Vec::new()),
            already_running: std::sync::atomic::AtomicBool::new(false),
            preflight_deferred: std::sync::atomic::AtomicBool::new(false),
            preflight: Mutex::new(None),
            launch_started: Mutex::new(None),
            prepare,
            dry_run: std::sync::atomic::AtomicBool::new(false),
            overlap: Mutex::new(None),
            growing: Mutex::new(std::collections::BTreeMap::new()),
            wanted_first: Mutex::new(Some(Vec::new())),
            fetched_repos: Mutex::new(std::collections::BTreeSet::new()),
        }
    }

    /// Whether FetchCheckpoint, BuildRankCache and ConfigureWorkerStorage run at the same time
    /// (`lifecycle.overlap`): each then uses a file the moment it is final, and
    /// [`Context::stages`] says what the others have finished.
    #[must_use]
    pub fn overlapped(&self) -> bool {
        self.overlap
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_some()
    }

    /// Starts (or ends) the overlapped mode; starting resets the stages.
    pub(crate) fn set_overlapped(&self, on: bool) {
        *self
            .overlap
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = on.then(Stages::default);
    }

    /// What the overlapped steps have finished (all true when not overlapped: every earlier step
    /// has).
    #[must_use]
    pub fn stages(&self) -> Stages {
        self.overlap
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .unwrap_or(Stages {
                fetched: true,
                rank_files: true,
                side_inputs: true,
                built: true,
                stored: true,
                failed: false,
            })
    }

    /// Records that FetchCheckpoint has every file of `repo` (`owner/name`) in the cache.
    pub(crate) fn mark_repo_fetched(&self, repo: &str) {
        self.fetched_repos
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(repo.to_owned());
    }

    /// Whether FetchCheckpoint has every file of `repo` (`owner/name`) in the cache already, in
    /// this run: steps running alongside it (the overlapped `up`) can use the whole repository
    /// before the fetch has finished the others.
    #[must_use]
    pub fn repo_fetched(&self, repo: &str) -> bool {
        self.stages().fetched
            || self
                .fetched_repos
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .contains(repo)
    }

    /// Asks FetchCheckpoint, running alongside, to download these repository paths before the
    /// others still waiting, in this order (the overlapped build wants the shards holding the
    /// start of its rank files first). An empty list: nothing in particular.
    pub fn want_first(&self, paths: Vec<String>) {
        *self
            .wanted_first
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(paths);
    }

    /// Tells FetchCheckpoint that a step running alongside will say what it wants first
    /// ([`Context::want_first`]): until it does, large files wait a few seconds at most.
    pub(crate) fn expect_wish(&self) {
        *self
            .wanted_first
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
    }

    /// The paths last given to [`Context::want_first`]; `None` while a wish is expected and not
    /// given yet.
    #[must_use]
    pub fn wanted_first(&self) -> Option<Vec<String>> {
        self.wanted_first
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Publishes a file of node `rank` that is still being written on the head (a rank file built
    /// while the checkpoint arrives; it exists, though its final start may still be empty), or
    /// its grown final start: the overlapped ConfigureWorkerStorage follows it to its worker as
    /// it grows.
    pub fn publish_growing(&self, rank: usize, file: GrowingFile) {
        let mut growing = self
            .growing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match growing.entry((rank, file.to.clone())) {
            std::collections::btree_map::Entry::Occupied(mut e) => {
                e.get().1.send_replace(file.ready);
                e.get_mut().0 = file;
            }
            std::collections::btree_map::Entry::Vacant(e) => {
                let (tx, _) = tokio::sync::watch::channel(file.ready);
                e.insert((file, tx));
            }
        }
    }

    /// The files published for node `rank` with [`Context::publish_growing`], as last published,
    /// each with a receiver of its final start as it grows. The receiver closes when the build
    /// ends ([`Context::end_growing`]), whether or not the file reached its size.
    #[must_use]
    pub fn growing_files(
        &self,
        rank: usize,
    ) -> Vec<(GrowingFile, tokio::sync::watch::Receiver<u64>)> {
        self.growing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .filter(|((r, _), _)| *r == rank)
            .map(|(_, (f, tx))| (f.clone(), tx.subscribe()))
            .collect()
    }

    /// Ends the publishing of growing files (the build ended, however it ended): every receiver
    /// of [`Context::growing_files`] closes, and none is published any more.
    pub fn end_growing(&self) {
        self.growing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clear();
    }

    /// Records a finished stage (nothing when not overlapped).
    pub fn mark_stage(&self, f: impl FnOnce(&mut Stages)) {
        if let Some(s) = self
            .overlap
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_mut()
        {
            f(s);
        }
    }

    /// [`Context::wait_until`] inside `step`: a cancellation, or another overlapped step's failure,
    /// ends the wait as this step's failure.
    ///
    /// # Errors
    ///
    /// A [`StepFailure`] of `step` ("cancelled") when the wait ends without `ready`.
    pub async fn wait_for(
        &self,
        step: StepKind,
        ready: impl Fn(&Self) -> bool,
    ) -> Result<(), StepFailure> {
        if self.wait_until(ready).await {
            Ok(())
        } else {
            Err(StepFailure::new(step, "cancelled", None))
        }
    }

    /// Waits until `ready` holds (looked at every 50 ms); `false` when the run is cancelled, or
    /// an overlapped step fails, first.
    pub async fn wait_until(&self, ready: impl Fn(&Self) -> bool) -> bool {
        loop {
            if ready(self) {
                return true;
            }
            if self.is_cancelled() || self.stages().failed {
                return false;
            }
            tokio::time::sleep(STAGE_POLL).await;
        }
    }

    /// A dry run: checks read and wait for nothing (`DRY_RUN=1`).
    #[must_use]
    pub fn is_dry_run(&self) -> bool {
        self.dry_run.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub(crate) fn set_dry_run(&self) {
        self.dry_run
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// How the preparation steps of the running plan treat what they find (`PREPARE`): the
    /// config's `lifecycle.prepare`, except under `spark-deploy prepare`, which always prepares.
    #[must_use]
    pub fn prepare_policy(&self) -> crate::config::PreparePolicy {
        *self
            .prepare
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Sets the policy the plan runs with (see [`Context::prepare_policy`]).
    pub(crate) fn set_prepare_policy(&self, policy: crate::config::PreparePolicy) {
        *self
            .prepare
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = policy;
    }

    /// This context with node `index`'s Docker port bound to `docker`, already connected,
    /// instead of connecting to what [`node_target`] says on first use: a daemon reached
    /// another way (a socket proxy, a socket at another path).
    ///
    /// # Panics
    ///
    /// When `index` is not a node of the config.
    #[must_use]
    pub fn with_docker(mut self, index: usize, docker: DockerNode) -> Self {
        self.nodes[index].docker = OnceCell::new_with(Some(docker));
        self
    }

    /// The index of the node named `name` (the head's, 0, for an unknown name).
    #[must_use]
    pub fn node_index(&self, name: &str) -> usize {
        self.config
            .config()
            .nodes
            .iter()
            .position(|n| n.name == name)
            .unwrap_or(0)
    }

    /// The state of `container` on node `index` through that node's Docker port.
    ///
    /// # Errors
    ///
    /// [`DockerError`]: the node's Docker could not be reached or did not answer. That says
    /// nothing about the container: callers retry rather than conclude it stopped.
    pub async fn rank_state(
        &self,
        index: usize,
        container: &str,
    ) -> Result<ContainerState, DockerError> {
        self.docker(index).await?.container_state(container).await
    }

    /// The last `lines` lines of `container`'s log on node `index`, as text (a note in angle
    /// brackets when the log cannot be read).
    pub async fn log_tail(&self, index: usize, container: &str, lines: usize) -> String {
        match self.docker(index).await {
            Ok(d) => d.logs(container, false, Some(lines)).await.map_or_else(
                |e| format!("<log unavailable: {e}>"),
                |b| String::from_utf8_lossy(&b).into_owned(),
            ),
            Err(e) => format!("<log unavailable: {e}>"),
        }
    }

    /// Records that the launch starts its first rank now (the origin of the startup timings).
    pub fn mark_launch_started(&self) {
        if let Ok(mut t) = self.launch_started.lock() {
            *t = Some(std::time::Instant::now());
        }
    }

    /// When this run's launch started its first rank, if it did.
    #[must_use]
    pub fn launch_started(&self) -> Option<std::time::Instant> {
        self.launch_started.lock().ok().and_then(|t| *t)
    }

    /// The validated config.
    #[must_use]
    pub fn config(&self) -> &ValidatedConfig {
        &self.config
    }

    /// Emits an event.
    pub fn emit(&self, event: Event) {
        self.sink.emit(event);
    }

    /// The (redacting) event sink, for progress reported from a stream that outlives a borrow
    /// of the context.
    #[must_use]
    pub fn sink(&self) -> Arc<dyn EventSink> {
        Arc::clone(&self.sink)
    }

    /// Emits a log line for `step`.
    pub fn log(
        &self,
        source: impl Into<Source>,
        node: Option<&str>,
        level: Level,
        line: impl Into<String>,
    ) {
        self.emit(Event::Log {
            source: source.into(),
            node: node.map(str::to_owned),
            level,
            line: line.into(),
        });
    }

    /// The Exec port of node `index`, connected on first use.
    ///
    /// # Errors
    ///
    /// [`ExecError`] when the SSH session cannot be opened.
    pub async fn exec(&self, index: usize) -> Result<&Exec, ExecError> {
        let n = &self.nodes[index];
        n.exec
            .get_or_try_init(|| Exec::connect(n.name.clone(), &n.target))
            .await
    }

    /// The Docker port of node `index`, connected on first use (workers: through their SSH).
    ///
    /// # Errors
    ///
    /// [`DockerError`] when the session, the forward or the socket fails.
    pub async fn docker(&self, index: usize) -> Result<&DockerNode, DockerError> {
        let n = &self.nodes[index];
        n.docker
            .get_or_try_init(|| DockerNode::connect(n.name.clone(), &n.target))
            .await
    }

    /// Node names in rank order.
    #[must_use]
    pub fn node_names(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.name.clone()).collect()
    }

    /// The facts learned so far (placeholders until preflight and fetch fill them).
    #[must_use]
    pub fn facts(&self) -> DeploymentFacts {
        self.facts
            .lock()
            .map(|f| f.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }

    /// Updates the facts.
    pub fn update_facts(&self, f: impl FnOnce(&mut DeploymentFacts)) {
        let mut guard = self
            .facts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut guard);
    }

    /// The table of the last preflight this run made (passed or failed), if any.
    #[must_use]
    pub fn preflight_report(&self) -> Option<PreflightReport> {
        self.preflight
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Records the preflight table (`spark-deploy preflight --json` prints it).
    pub fn set_preflight_report(&self, report: PreflightReport) {
        *self
            .preflight
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(report);
    }

    /// Records a rank container this run started on node `index`.
    pub fn record_started(&self, index: usize, container: String) {
        self.started
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push((index, container));
    }

    /// Takes the list of rank containers this run started (for the both-or-neither cleanup).
    #[must_use]
    pub fn take_started(&self) -> Vec<(usize, String)> {
        std::mem::take(
            &mut *self
                .started
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    /// Records that LaunchRank found the pair already running with the planned fingerprint.
    pub fn set_already_running(&self) {
        self.already_running
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether LaunchRank found the pair already running with the planned fingerprint.
    #[must_use]
    pub fn already_running(&self) -> bool {
        self.already_running
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Records that Preflight was skipped because the recorded pair runs unchanged; a launch that
    /// must (re)start ranks after all runs it first.
    pub fn set_preflight_deferred(&self, deferred: bool) {
        self.preflight_deferred
            .store(deferred, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether Preflight was skipped on a running, unchanged pair (see
    /// [`Context::set_preflight_deferred`]).
    #[must_use]
    pub fn preflight_deferred(&self) -> bool {
        self.preflight_deferred
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Asks every running step to stop at its next cancellation point.
    pub fn cancel(&self) {
        let _ = self.cancel_tx.send(true);
    }

    /// Whether cancellation was requested.
    #[must_use]
    pub fn is_cancelled(&self) -> bool {
        *self.cancel.borrow()
    }

    /// The cancellation flag as a watch receiver, for ports that wind down on their own (the
    /// Hub port's [`HubConfig::cancel`](crate::hub::HubConfig)).
    #[must_use]
    pub fn cancel_signal(&self) -> watch::Receiver<bool> {
        self.cancel.clone()
    }

    /// Resolves when cancellation is requested.
    pub async fn cancelled(&self) {
        let mut rx = self.cancel.clone();
        let _ = rx.wait_for(|c| *c).await;
    }
}

/// Adapts an `Arc<dyn EventSink>` to a sized sink.
struct ArcSink(Arc<dyn EventSink>);

impl EventSink for ArcSink {
    fn emit(&self, event: Event) {
        self.0.emit(event);
    }
}
