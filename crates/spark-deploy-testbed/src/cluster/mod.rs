//! The testbed cluster: two (or more) Sparks on one machine (docs/testbed.md).
//!
//! [`up`] builds, on the local Docker daemon:
//!
//! - the fabric network (bridge on 198.18.0.0/24, the head = gateway 198.18.0.1) and the
//!   management network (198.18.1.0/24, head 198.18.1.1), after checking that no interface
//!   already routes either subnet;
//! - the node image, from a `mmdebstrap` root filesystem of this machine's release and apt
//!   sources, imported without a registry and cached by a recipe label ([`image`]);
//! - a fresh client key and per-worker host key ([`keys`]) and the known_hosts file;
//! - worker `i` as container `spark-deploy-testbed-worker-<i>` at 198.18.0.(i+1) (fabric) and
//!   198.18.1.(i+1) (management), running a real sshd ([`worker`]);
//! - the GPU and RoCE facts every node presents: an `nvidia-smi` answering with outputs captured
//!   on an NVIDIA host, and a sysfs tree with a RoCE device on the node's real fabric netdev
//!   ([`crate::host_facts`]).
//!
//! [`down`] removes every container, network, volume and image labelled
//! `io.spark-deploy.testbed=1`, and the state directory; nothing else.
//!
//! # Caveats
//!
//! Names, subnets and addresses are fixed: one testbed per Docker daemon at a time, and tests
//! using it must run serially (one test binary, or the nextest `testbed` group). `up` replaces
//! a testbed that is already up. Needs root (bridge networks, mmdebstrap), `ssh`/`ssh-keygen`,
//! and `mmdebstrap` (installed with apt-get when [`TestbedOptions::install_tools`] is set).

pub mod image;
pub mod keys;
pub mod labels;
pub mod network;
pub mod worker;

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use spark_deploy_core::ports::docker::{DockerError, DockerNode, Removed};
use spark_deploy_core::ports::exec::{Exec, ExecError};
use spark_deploy_core::ports::{NodeTarget, SshTarget};

pub use image::ImageSource;

/// File in the state directory holding the [`TestbedInfo`] of the running testbed.
pub const INFO_FILE: &str = "testbed.json";
/// Marker file: `down` only deletes a state directory that carries it.
const MARKER: &str = ".spark-deploy-testbed";

/// Errors of the testbed cluster.
#[derive(Debug, thiserror::Error)]
pub enum TestbedError {
    /// Bad options.
    #[error("invalid testbed options: {0}")]
    Options(String),
    /// The local Docker daemon is unreachable.
    #[error(
        "the local Docker daemon is not reachable \
         (remedy: start dockerd and make sure this user may open {socket})"
    )]
    DockerUnreachable {
        /// The socket.
        socket: PathBuf,
        /// Underlying error.
        #[source]
        source: Box<DockerError>,
    },
    /// A state file could not be written or removed.
    #[error("cannot {op} {path}: {source}")]
    State {
        /// `create`, `write`, `read`, `remove`.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// Underlying error.
        #[source]
        source: io::Error,
    },
    /// The state file could not be parsed.
    #[error("cannot parse {path}: {source} (remedy: run `spark-deploy testbed up` again)")]
    StateParse {
        /// The path.
        path: PathBuf,
        /// Underlying error.
        #[source]
        source: serde_json::Error,
    },
    /// The state directory is not a testbed's.
    #[error(
        "{path} exists and is not a testbed state directory (no {MARKER} marker); refusing to \
         delete it (remedy: choose another state_dir or remove it by hand)"
    )]
    ForeignStateDir {
        /// The path.
        path: PathBuf,
    },
    /// Network setup failed.
    #[error(transparent)]
    Network(#[from] network::NetworkError),
    /// Image build or import failed.
    #[error(transparent)]
    Image(#[from] image::ImageError),
    /// Key generation failed.
    #[error(transparent)]
    Keys(#[from] keys::KeyError),
    /// A worker container failed.
    #[error(transparent)]
    Worker(#[from] worker::WorkerError),
    /// Another Docker call failed.
    #[error(transparent)]
    Docker(#[from] DockerError),
    /// The hosts' GPU and RoCE facts could not be installed.
    #[error(
        "cannot give the testbed's hosts their GPU and RoCE facts (remedy: check that the worker \
         answers over SSH and has a route to the head's fabric address, then run `spark-deploy \
         testbed up` again)"
    )]
    HostFacts(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// Options of [`up`] and [`down`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestbedOptions {
    /// Keys, known_hosts, worker disks and `testbed.json`. Removed by [`down`].
    /// Default: `$SPARK_DEPLOY_TESTBED_DIR`, else `/var/tmp/spark-deploy-testbed`.
    pub state_dir: PathBuf,
    /// Rootfs tars (rebuildable). Kept by [`down`]; see [`purge_cache`].
    /// Default: `$SPARK_DEPLOY_TESTBED_CACHE`, else `/var/tmp/spark-deploy-testbed-cache`.
    pub cache_dir: PathBuf,
    /// Number of workers (1..=8). Default 1.
    pub workers: u8,
    /// The daemon socket on this machine (also mounted into workers).
    pub docker_socket: PathBuf,
    /// Debian suite of the node image; default: this machine's `VERSION_CODENAME`.
    pub suite: Option<String>,
    /// apt sources file handed to mmdebstrap; default: this machine's
    /// (`/etc/apt/sources.list.d/debian.sources`, ...).
    pub apt_sources: Option<PathBuf>,
    /// Run `apt-get install -y mmdebstrap` when it is missing. Default false.
    pub install_tools: bool,
    /// How long to wait for each worker's sshd.
    pub sshd_timeout: Duration,
}

impl Default for TestbedOptions {
    fn default() -> Self {
        let env_path = |k: &str, d: &str| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map_or_else(|| PathBuf::from(d), PathBuf::from)
        };
        Self {
            state_dir: env_path("SPARK_DEPLOY_TESTBED_DIR", "/var/tmp/spark-deploy-testbed"),
            cache_dir: env_path(
                "SPARK_DEPLOY_TESTBED_CACHE",
                "/var/tmp/spark-deploy-testbed-cache",
            ),
            workers: 1,
            docker_socket: PathBuf::from(spark_deploy_core::ports::docker::DEFAULT_SOCKET),
            suite: None,
            apt_sources: None,
            install_tools: false,
            sshd_timeout: Duration::from_secs(30),
        }
    }
}

/// One worker of a running testbed: what a deployment config needs to target it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerInfo {
    /// Node name, e.g. `worker-1` (also the container's hostname).
    pub name: String,
    /// Container name, e.g. `spark-deploy-testbed-worker-1`.
    pub container: String,
    /// The `network_mode` for this worker's rank containers: `container:<container>`.
    pub network_mode: String,
    /// Fabric address, e.g. 198.18.0.2.
    pub fabric_addr: Ipv4Addr,
    /// Management address (where sshd listens), e.g. 198.18.1.2.
    pub management_addr: Ipv4Addr,
    /// SSH destination, e.g. `root@198.18.1.2`.
    pub ssh_destination: String,
    /// SSH port.
    pub ssh_port: u16,
    /// The head's private key for this worker.
    pub identity_file: PathBuf,
    /// known_hosts holding this worker's host key.
    pub known_hosts: PathBuf,
    /// The worker's disk: a host directory mounted at the same path in the worker.
    pub disk_dir: PathBuf,
}

impl WorkerInfo {
    /// The SSH target of this worker (10 s connect timeout).
    pub fn ssh_target(&self) -> SshTarget {
        SshTarget {
            port: Some(self.ssh_port),
            identity_file: Some(self.identity_file.clone()),
            known_hosts: Some(self.known_hosts.clone()),
            ..SshTarget::new(self.ssh_destination.clone())
        }
    }

    /// The node target of this worker.
    pub fn node_target(&self) -> NodeTarget {
        NodeTarget::Ssh(self.ssh_target())
    }
}

/// A running testbed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TestbedInfo {
    /// The state directory.
    pub state_dir: PathBuf,
    /// The head's fabric address (gateway of the fabric network), 198.18.0.1.
    pub head_fabric_addr: Ipv4Addr,
    /// The head's management address, 198.18.1.1.
    pub head_management_addr: Ipv4Addr,
    /// `198.18.0.0/24`.
    pub fabric_subnet: String,
    /// `198.18.1.0/24`.
    pub management_subnet: String,
    /// Docker network names.
    pub fabric_network: String,
    /// Docker network names.
    pub management_network: String,
    /// The node image reference (also usable for helper containers in tests).
    pub image: String,
    /// How the image was obtained by this `up`.
    pub image_source: ImageSource,
    /// The workers, in rank order.
    pub workers: Vec<WorkerInfo>,
    /// Wall time of `up`, in milliseconds.
    pub up_millis: u64,
}

impl TestbedInfo {
    /// Reads `testbed.json` from a state directory.
    ///
    /// # Errors
    ///
    /// [`TestbedError::State`] or [`TestbedError::StateParse`].
    pub fn load(state_dir: &Path) -> Result<Self, TestbedError> {
        let path = state_dir.join(INFO_FILE);
        let text = std::fs::read_to_string(&path).map_err(|source| TestbedError::State {
            op: "read",
            path: path.clone(),
            source,
        })?;
        serde_json::from_str(&text).map_err(|source| TestbedError::StateParse { path, source })
    }

    /// The first worker (the testbed always has at least one).
    pub fn worker(&self) -> &WorkerInfo {
        &self.workers[0]
    }

    /// The Exec port for the head (`node` = `head`).
    pub fn head_exec(&self) -> Exec {
        Exec::local("head")
    }

    /// The Docker port for the head, on the local daemon socket.
    ///
    /// # Errors
    ///
    /// [`DockerError::Connect`] when the socket is missing.
    pub fn head_docker(&self) -> Result<DockerNode, DockerError> {
        DockerNode::local(
            "head",
            Path::new(spark_deploy_core::ports::docker::DEFAULT_SOCKET),
        )
    }
}

impl WorkerInfo {
    /// Opens the Exec port for this worker over SSH.
    ///
    /// # Errors
    ///
    /// [`ExecError::Connect`] when the SSH session cannot be opened.
    pub async fn exec(&self) -> Result<Exec, ExecError> {
        Exec::connect(self.name.clone(), &self.node_target()).await
    }

    /// Opens the Docker port for this worker (its daemon socket forwarded over SSH).
    ///
    /// # Errors
    ///
    /// [`DockerError::Ssh`], [`DockerError::Forward`] or [`DockerError::Connect`].
    pub async fn docker(&self) -> Result<DockerNode, DockerError> {
        DockerNode::connect(self.name.clone(), &self.node_target()).await
    }
}

fn state_err(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> TestbedError {
    let path = path.to_owned();
    move |source| TestbedError::State { op, path, source }
}

/// Brings the testbed up (replacing one that is already up) and returns what a deployment
/// config needs. On failure, the partial testbed is torn down again (the image and rootfs
/// cache are kept).
///
/// # Errors
///
/// [`TestbedError`] naming the failing part: the daemon, a subnet already routed, mmdebstrap,
/// the image import, key generation, a network or container operation, or sshd readiness.
pub async fn up(opts: &TestbedOptions) -> Result<TestbedInfo, TestbedError> {
    if opts.workers == 0 || opts.workers > labels::MAX_WORKERS {
        return Err(TestbedError::Options(format!(
            "workers must be 1..={}, got {}",
            labels::MAX_WORKERS,
            opts.workers
        )));
    }
    let started = Instant::now();
    let docker = head_docker(opts).await?;
    teardown(&docker, false).await?;
    remove_state_dir(&opts.state_dir)?;
    match build(&docker, opts, started).await {
        Ok(info) => Ok(info),
        Err(e) => {
            let _ = teardown(&docker, false).await;
            Err(e)
        }
    }
}

async fn head_docker(opts: &TestbedOptions) -> Result<DockerNode, TestbedError> {
    let err = |source| TestbedError::DockerUnreachable {
        socket: opts.docker_socket.clone(),
        source: Box::new(source),
    };
    let docker = DockerNode::local("head", &opts.docker_socket).map_err(err)?;
    docker.ping().await.map_err(err)?;
    Ok(docker)
}

async fn build(
    docker: &DockerNode,
    opts: &TestbedOptions,
    started: Instant,
) -> Result<TestbedInfo, TestbedError> {
    // Subnets must be free before anything is created.
    network::check_subnet_free(labels::FABRIC_SUBNET)?;
    network::check_subnet_free(labels::MANAGEMENT_SUBNET)?;

    // State directory (absolute: the worker disk is mounted at the same path).
    std::fs::create_dir_all(&opts.state_dir).map_err(state_err("create", &opts.state_dir))?;
    let state_dir =
        std::fs::canonicalize(&opts.state_dir).map_err(state_err("create", &opts.state_dir))?;
    std::fs::write(state_dir.join(MARKER), b"spark-deploy testbed state\n")
        .map_err(state_err("write", &state_dir.join(MARKER)))?;

    // Image (cached by recipe label / rootfs tar).
    let recipe =
        image::Recipe::for_this_machine(opts.suite.as_deref(), opts.apt_sources.as_deref())?;
    let (image_ref, image_source) =
        image::ensure(docker, &recipe, &opts.cache_dir, opts.install_tools).await?;

    // Keys.
    let ssh_dir = state_dir.join("ssh");
    std::fs::create_dir_all(&ssh_dir).map_err(state_err("create", &ssh_dir))?;
    let client = keys::generate(&ssh_dir.join("id_ed25519"), "spark-deploy-testbed-head").await?;
    let client_pub = client.public_line()?;

    // Networks.
    network::create(
        docker,
        labels::FABRIC_NETWORK,
        labels::FABRIC_BRIDGE,
        labels::FABRIC_SUBNET,
        "fabric",
    )
    .await?;
    network::create(
        docker,
        labels::MANAGEMENT_NETWORK,
        labels::MANAGEMENT_BRIDGE,
        labels::MANAGEMENT_SUBNET,
        "management",
    )
    .await?;

    // Workers.
    let known_hosts = ssh_dir.join("known_hosts");
    let mut known_lines = Vec::new();
    let mut workers = Vec::new();
    for i in 1..=opts.workers {
        let name = labels::worker_name(i);
        let container = labels::worker_container(i);
        let fabric_addr = labels::host(labels::FABRIC_SUBNET, i + 1);
        let management_addr = labels::host(labels::MANAGEMENT_SUBNET, i + 1);
        let node_dir = state_dir.join(&name);
        let disk_dir = node_dir.join("disk");
        std::fs::create_dir_all(&disk_dir).map_err(state_err("create", &disk_dir))?;
        let host_key = keys::generate(
            &node_dir.join("ssh_host_ed25519_key"),
            &format!("{name}-host"),
        )
        .await?;
        let worker_ssh = node_dir.join("etc-ssh");
        worker::prepare_ssh_dir(
            &worker_ssh,
            &host_key.private,
            &host_key.public,
            &client_pub,
        )?;
        worker::create_and_start(
            docker,
            &worker::WorkerSpec {
                container: container.clone(),
                hostname: name.clone(),
                image: image_ref.clone(),
                fabric_addr,
                management_addr,
                ssh_dir: worker_ssh,
                disk_dir: disk_dir.clone(),
                docker_socket: opts.docker_socket.clone(),
            },
        )
        .await?;
        known_lines.push(keys::known_hosts_line(
            management_addr,
            22,
            &host_key.public_line()?,
        ));
        workers.push(WorkerInfo {
            name,
            network_mode: format!("container:{container}"),
            container,
            fabric_addr,
            management_addr,
            ssh_destination: format!("root@{management_addr}"),
            ssh_port: 22,
            identity_file: client.private.clone(),
            known_hosts: known_hosts.clone(),
            disk_dir,
        });
    }
    std::fs::write(&known_hosts, known_lines.join("\n") + "\n")
        .map_err(state_err("write", &known_hosts))?;
    for w in &workers {
        worker::wait_for_sshd(
            docker,
            &w.container,
            SocketAddr::from((w.management_addr, w.ssh_port)),
            opts.sshd_timeout,
        )
        .await?;
    }

    let info = TestbedInfo {
        state_dir: state_dir.clone(),
        head_fabric_addr: labels::host(labels::FABRIC_SUBNET, 1),
        head_management_addr: labels::host(labels::MANAGEMENT_SUBNET, 1),
        fabric_subnet: labels::cidr(labels::FABRIC_SUBNET),
        management_subnet: labels::cidr(labels::MANAGEMENT_SUBNET),
        fabric_network: labels::FABRIC_NETWORK.to_owned(),
        management_network: labels::MANAGEMENT_NETWORK.to_owned(),
        image: image_ref,
        image_source,
        workers,
        up_millis: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
    };
    crate::host_facts::install(&info)
        .await
        .map_err(TestbedError::HostFacts)?;
    let path = state_dir.join(INFO_FILE);
    let json = serde_json::to_vec_pretty(&info).map_err(|source| TestbedError::StateParse {
        path: path.clone(),
        source,
    })?;
    std::fs::write(&path, json).map_err(state_err("write", &path))?;
    Ok(info)
}

/// Removes labelled containers, networks and volumes, and with `with_images` the images too.
async fn teardown(docker: &DockerNode, with_images: bool) -> Result<Removed, TestbedError> {
    if with_images {
        return Ok(docker.remove_by_label(labels::LABEL_FILTER).await?);
    }
    let mut removed = Removed::default();
    for c in docker
        .list_containers_by_label(labels::LABEL_FILTER)
        .await?
    {
        if let Some(id) = c.id
            && docker.remove_container(&id).await?
        {
            removed.containers.push(id);
        }
    }
    for n in docker.list_networks_by_label(labels::LABEL_FILTER).await? {
        if let Some(id) = n.id
            && docker.remove_network(&id).await?
        {
            removed.networks.push(n.name.unwrap_or(id));
        }
    }
    for v in docker.list_volumes_by_label(labels::LABEL_FILTER).await? {
        if docker.remove_volume(&v.name).await? {
            removed.volumes.push(v.name);
        }
    }
    Ok(removed)
}

fn remove_state_dir(dir: &Path) -> Result<(), TestbedError> {
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(state_err("read", dir)(e)),
        Ok(_) => {}
    }
    let empty = std::fs::read_dir(dir)
        .map_err(state_err("read", dir))?
        .next()
        .is_none();
    if !empty && !dir.join(MARKER).is_file() {
        return Err(TestbedError::ForeignStateDir {
            path: dir.to_owned(),
        });
    }
    std::fs::remove_dir_all(dir).map_err(state_err("remove", dir))
}

/// What [`down`] removed.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct DownReport {
    /// Docker objects removed.
    pub removed: Removed,
    /// Whether the state directory was removed.
    pub state_dir_removed: bool,
}

impl std::fmt::Display for DownReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let r = &self.removed;
        write!(
            f,
            "removed {} container(s), {} network(s), {} image(s), {} volume(s){}",
            r.containers.len(),
            r.networks.len(),
            r.images.len(),
            r.volumes.len(),
            if self.state_dir_removed {
                " and the state directory"
            } else {
                ""
            }
        )
    }
}

/// Tears the testbed down: removes every container, network, volume and image labelled
/// `io.spark-deploy.testbed=1`, then the state directory. Idempotent; the rootfs cache stays.
///
/// # Errors
///
/// [`TestbedError::DockerUnreachable`], a removal error, or
/// [`TestbedError::ForeignStateDir`] when the state directory is not a testbed's.
pub async fn down(opts: &TestbedOptions) -> Result<DownReport, TestbedError> {
    let docker = head_docker(opts).await?;
    let removed = teardown(&docker, true).await?;
    let existed = opts.state_dir.exists();
    remove_state_dir(&opts.state_dir)?;
    Ok(DownReport {
        removed,
        state_dir_removed: existed,
    })
}

/// Deletes the rootfs cache (rebuilt by the next `up`, about half a minute).
///
/// # Errors
///
/// [`TestbedError::State`].
pub fn purge_cache(opts: &TestbedOptions) -> Result<(), TestbedError> {
    match std::fs::remove_dir_all(&opts.cache_dir) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            Err(state_err("remove", &opts.cache_dir)(e))
        }
        _ => Ok(()),
    }
}
