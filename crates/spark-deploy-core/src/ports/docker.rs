//! The Docker port: the Docker Engine API of one node, with the same code for every node.
//!
//! - Head ([`NodeTarget::Local`]): `bollard` on the local socket (`/var/run/docker.sock`).
//! - Worker ([`NodeTarget::Ssh`]): the worker's socket is forwarded over the worker's SSH
//!   ControlMaster to a local unix socket in the short runtime directory
//!   ([`super::ssh::runtime_dir`]), then `bollard` connects to that socket. The worker needs no
//!   docker CLI and no TCP-exposed daemon; the SSH user must be able to open the socket.
//!
//! Every operation has its own error variant carrying the node (testcontainers style), and a
//! failure on a tunnelled node whose SSH master has died is reported as
//! [`DockerError::TunnelDown`] wrapping the operation's error.
//!
//! # Caveats
//!
//! - bollard 0.21 sends unversioned API paths, so the daemon answers in its own default API
//!   version. The calls used here were checked against Docker 20.10 (API 1.41).
//! - The client timeout (default 120 s) bounds only the wait for response headers; use
//!   [`DockerNode::docker_with_timeout`] for long imports.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bollard::Docker;
use bollard::errors::Error as BollardError;
use bollard::models::{
    ContainerCreateBody, ContainerInspectResponse, ContainerSummary, EndpointIpamConfig,
    EndpointSettings, ImageInspect, ImageSummary, Network, NetworkConnectRequest,
    NetworkCreateRequest, NetworkInspect, SystemVersion, Volume,
};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, CreateImageOptionsBuilder, ListContainersOptionsBuilder,
    ListImagesOptionsBuilder, ListNetworksOptionsBuilder, ListVolumesOptionsBuilder,
    RemoveContainerOptionsBuilder, RemoveImageOptionsBuilder, RemoveVolumeOptionsBuilder,
};
use bytes::Bytes;
use futures::{Stream, StreamExt};

use super::NodeTarget;
use super::ssh::{SshError, SshSession, runtime_dir, sanitize};

pub use bollard;

/// The daemon socket path on every node.
pub const DEFAULT_SOCKET: &str = "/var/run/docker.sock";

/// Default client timeout (wait for response headers).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// How a node's daemon is reached, for error messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Via {
    /// The local socket.
    Local {
        /// Socket path.
        socket: PathBuf,
    },
    /// The node's socket forwarded over SSH.
    Ssh {
        /// `user@host`.
        destination: String,
        /// SSH port.
        port: u16,
        /// Remote socket path.
        remote_socket: PathBuf,
    },
}

impl fmt::Display for Via {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Via::Local { socket } => write!(f, "local socket {}", socket.display()),
            Via::Ssh {
                destination,
                port,
                remote_socket,
            } => write!(
                f,
                "SSH tunnel to {destination}:{port}:{}",
                remote_socket.display()
            ),
        }
    }
}

/// Errors of the Docker port. Every variant names the node; most name the object.
#[derive(Debug, thiserror::Error)]
pub enum DockerError {
    /// The client could not be created for the socket.
    #[error(
        "{node}: cannot connect to Docker via {via}: {source} \
         (remedy: check that the Docker daemon runs and the socket exists)"
    )]
    Connect {
        /// Node name.
        node: String,
        /// How the daemon is reached.
        via: Via,
        /// Underlying error.
        #[source]
        source: Box<BollardError>,
    },
    /// The SSH session for the tunnel could not be opened.
    #[error("{node}: cannot open the SSH session that carries Docker")]
    Ssh {
        /// Node name.
        node: String,
        /// Underlying error.
        #[source]
        source: Box<SshError>,
    },
    /// The socket could not be forwarded over SSH.
    #[error(
        "{node}: cannot forward {remote} over SSH to {local}: {source} \
         (remedy: sshd on the node must allow stream-local forwarding and the socket must exist)"
    )]
    Forward {
        /// Node name.
        node: String,
        /// Local socket path.
        local: PathBuf,
        /// Remote socket path.
        remote: PathBuf,
        /// Underlying error.
        #[source]
        source: openssh::Error,
    },
    /// A call failed on a tunnelled node whose SSH connection is gone.
    #[error(
        "{node}: Docker is unreachable because the {via} is down ({master}) \
         (remedy: check that the node is up and its sshd is running, then reconnect)"
    )]
    TunnelDown {
        /// Node name.
        node: String,
        /// The tunnel.
        via: Via,
        /// What the SSH master check said.
        master: String,
        /// The operation's own error.
        #[source]
        source: Box<DockerError>,
    },
    /// `GET /_ping` failed.
    #[error(
        "{node}: Docker ping failed via {via}: {source} \
         (remedy: check that the daemon runs and the user may open its socket)"
    )]
    Ping {
        /// Node name.
        node: String,
        /// How the daemon is reached.
        via: Via,
        /// Underlying error.
        #[source]
        source: Box<BollardError>,
    },
    /// `GET /version` failed.
    #[error("{node}: Docker version query failed: {source}")]
    Version {
        /// Node name.
        node: String,
        /// Underlying error.
        #[source]
        source: Box<BollardError>,
    },
    /// Reading the image tar failed.
    #[error("{node}: cannot read image archive {path}: {source}")]
    ReadArchive {
        /// Node name.
        node: String,
        /// The archive.
        path: PathBuf,
        /// Underlying error.
        #[source]
        source: io::Error,
    },
    /// `POST /images/create?fromSrc=-` failed.
    #[error(
        "{node}: importing image {image} failed: {source} \
         (remedy: check that the archive is a root filesystem tar and the daemon has disk space)"
    )]
    ImportImage {
        /// Node name.
        node: String,
        /// The reference given to the image.
        image: String,
        /// Underlying error.
        #[source]
        source: Box<BollardError>,
    },
    /// Inspecting an object failed (other than "not found").
    #[error("{node}: inspecting {kind} {name} failed: {source}")]
    Inspect {
        /// Node name.
        node: String,
        /// `image`, `container`, `network`.
        kind: &'static str,
        /// Object name.
        name: String,
        /// Underlying error.
        #[source]
        source: Box<BollardError>,
    },
    /// Listing objects failed.
    #[error("{node}: listing {kind} with filter {filter} failed: {source}")]
    List {
        /// Node name.
        node: String,
        /// `containers`, `images`, `networks`, `volumes`.
        kind: &'static str,
        /// The filter used.
        filter: String,
        /// Underlying error.
        #[source]
        source: Box<BollardError>,
    },
    /// Creating a network failed.
    #[error(
        "{node}: creating network {name} failed: {source} \
         (remedy: a network with this name or an overlapping subnet may already exist)"
    )]
    CreateNetwork {
        /// Node name.
        node: String,
        /// Network name.
        name: String,
        /// Underlying error.
        #[source]
        source: Box<BollardError>,
    },
    /// Connecting a container to a network failed.
    #[error("{node}: connecting container {container} to network {network} failed: {source}")]
    ConnectNetwork {
        /// Node name.
        node: String,
        /// Network name.
        network: String,
        /// Container name.
        container: String,
        /// Underlying error.
        #[source]
        source: Box<BollardError>,
    },
    /// Creating a container failed.
    #[error(
        "{node}: creating container {name} failed: {source} \
         (remedy: check that the image exists on the node and the name is free)"
    )]
    CreateContainer {
        /// Node name.
        node: String,
        /// Container name.
        name: String,
        /// Underlying error.
        #[source]
        source: Box<BollardError>,
    },
    /// Starting a container failed.
    #[error("{node}: starting container {name} failed: {source}")]
    StartContainer {
        /// Node name.
        node: String,
        /// Container name.
        name: String,
        /// Underlying error.
        #[source]
        source: Box<BollardError>,
    },
    /// Removing an object failed (other than "not found").
    #[error("{node}: removing {kind} {name} failed: {source}")]
    Remove {
        /// Node name.
        node: String,
        /// `container`, `image`, `network`, `volume`.
        kind: &'static str,
        /// Object name or id.
        name: String,
        /// Underlying error.
        #[source]
        source: Box<BollardError>,
    },
}

impl DockerError {
    /// The operation's own error, looking through [`DockerError::TunnelDown`].
    pub fn operation(&self) -> &DockerError {
        match self {
            DockerError::TunnelDown { source, .. } => source.operation(),
            other => other,
        }
    }
}

/// What [`DockerNode::remove_by_label`] removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Removed {
    /// Container names.
    pub containers: Vec<String>,
    /// Network names.
    pub networks: Vec<String>,
    /// Image ids.
    pub images: Vec<String>,
    /// Volume names.
    pub volumes: Vec<String>,
}

struct Tunnel {
    session: SshSession,
    local: SocketFile,
    remote: PathBuf,
}

/// The local end of a forward; removed when the tunnel goes away, however it goes.
struct SocketFile(PathBuf);

impl Drop for SocketFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The Docker port bound to one node.
pub struct DockerNode {
    node: String,
    via: Via,
    docker: Docker,
    tunnel: Option<Tunnel>,
}

impl fmt::Debug for DockerNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DockerNode")
            .field("node", &self.node)
            .field("via", &self.via)
            .finish_non_exhaustive()
    }
}

fn is_not_found(e: &BollardError) -> bool {
    matches!(
        e,
        BollardError::DockerResponseServerError {
            status_code: 404,
            ..
        }
    )
}

fn label_filter(label: &str) -> HashMap<String, Vec<String>> {
    HashMap::from([("label".to_owned(), vec![label.to_owned()])])
}

impl DockerNode {
    /// Connects to the node's daemon at [`DEFAULT_SOCKET`]; for a worker this opens an SSH
    /// session and forwards the socket.
    ///
    /// # Errors
    ///
    /// [`DockerError::Ssh`], [`DockerError::Forward`] or [`DockerError::Connect`]. The daemon
    /// is not contacted: call [`DockerNode::ping`] to check it.
    pub async fn connect(
        node: impl Into<String>,
        target: &NodeTarget,
    ) -> Result<Self, DockerError> {
        let node = node.into();
        match target {
            NodeTarget::Local => Self::local(node, Path::new(DEFAULT_SOCKET)),
            NodeTarget::Ssh(t) => {
                let session = SshSession::connect(node.clone(), t)
                    .await
                    .map_err(|source| DockerError::Ssh {
                        node,
                        source: Box::new(source),
                    })?;
                Self::over_ssh(session, Path::new(DEFAULT_SOCKET)).await
            }
        }
    }

    /// Connects to a local daemon socket.
    ///
    /// # Errors
    ///
    /// [`DockerError::Connect`] when the socket does not exist.
    pub fn local(node: impl Into<String>, socket: &Path) -> Result<Self, DockerError> {
        let node = node.into();
        let via = Via::Local {
            socket: socket.to_owned(),
        };
        let docker = connect_unix(socket).map_err(|source| DockerError::Connect {
            node: node.clone(),
            via: via.clone(),
            source: Box::new(source),
        })?;
        Ok(Self {
            node,
            via,
            docker,
            tunnel: None,
        })
    }

    /// Forwards `remote_socket` of the session's node to a local socket and connects to it.
    /// The session may be shared with the Exec port.
    ///
    /// # Errors
    ///
    /// [`DockerError::Forward`] when ssh refuses the forward, [`DockerError::Connect`] when the
    /// local socket does not appear.
    pub async fn over_ssh(session: SshSession, remote_socket: &Path) -> Result<Self, DockerError> {
        let node = session.node().to_owned();
        let t = session.target();
        let via = Via::Ssh {
            destination: t.destination.clone(),
            port: t.port,
            remote_socket: remote_socket.to_owned(),
        };
        let forward_err = |local: &Path, source| DockerError::Forward {
            node: node.clone(),
            local: local.to_owned(),
            remote: remote_socket.to_owned(),
            source,
        };
        let dir = runtime_dir().map_err(|(path, e)| DockerError::Ssh {
            node: node.clone(),
            source: Box::new(SshError::ControlDir {
                node: node.clone(),
                path,
                source: e,
            }),
        })?;
        // Unique per tunnel, short enough for sun_path (108 bytes).
        let local = dir.join(format!(
            "{}-{}-{}.sock",
            sanitize(&node).chars().take(24).collect::<String>(),
            std::process::id(),
            next_tunnel_id()
        ));
        // ssh will not bind over a stale socket.
        let _ = std::fs::remove_file(&local);
        session
            .session()
            .request_port_forward(openssh::ForwardType::Local, local.as_path(), remote_socket)
            .await
            .map_err(|e| forward_err(&local, e))?;
        let docker = connect_unix(&local).map_err(|source| DockerError::Connect {
            node: node.clone(),
            via: via.clone(),
            source: Box::new(source),
        })?;
        Ok(Self {
            node,
            via,
            docker,
            tunnel: Some(Tunnel {
                session,
                local: SocketFile(local),
                remote: remote_socket.to_owned(),
            }),
        })
    }

    /// The node name.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// How the daemon is reached.
    pub fn via(&self) -> &Via {
        &self.via
    }

    /// The bollard client, for calls this port has no helper for.
    pub fn docker(&self) -> &Docker {
        &self.docker
    }

    /// A clone of the client with another header timeout (for long imports or builds).
    pub fn docker_with_timeout(&self, timeout: Duration) -> Docker {
        let mut d = self.docker.clone();
        d.set_timeout(timeout);
        d
    }

    /// The SSH session carrying the tunnel, for a worker.
    pub fn ssh_session(&self) -> Option<&SshSession> {
        self.tunnel.as_ref().map(|t| &t.session)
    }

    /// Turns an operation error into [`DockerError::TunnelDown`] when the SSH master is gone.
    ///
    /// Only transport failures are checked (an answer from the daemon proves the tunnel
    /// works). The master may need a moment to notice a dead peer, so a live master is
    /// checked once more after a short pause.
    async fn classify(&self, err: DockerError) -> DockerError {
        let Some(t) = &self.tunnel else {
            return err;
        };
        // The sources are `Box<BollardError>`, which is what the `dyn Error` holds.
        let daemon_answered = std::error::Error::source(&err)
            .and_then(|s| {
                s.downcast_ref::<Box<BollardError>>()
                    .map(AsRef::as_ref)
                    .or_else(|| s.downcast_ref::<BollardError>())
            })
            .is_some_and(|b| {
                matches!(
                    b,
                    BollardError::DockerResponseServerError { .. }
                        | BollardError::DockerStreamError { .. }
                        | BollardError::DockerContainerWaitError { .. }
                        | BollardError::JsonDataError { .. }
                        | BollardError::JsonSerdeError { .. }
                )
            });
        if daemon_answered {
            return err;
        }
        let mut check = t.session.check().await;
        if check.is_ok() {
            tokio::time::sleep(Duration::from_millis(300)).await;
            check = t.session.check().await;
        }
        match check {
            Ok(()) => err,
            Err(e) => DockerError::TunnelDown {
                node: self.node.clone(),
                via: self.via.clone(),
                master: e.to_string(),
                source: Box::new(err),
            },
        }
    }

    async fn op<T>(
        &self,
        res: Result<T, BollardError>,
        map: impl FnOnce(Box<BollardError>) -> DockerError,
    ) -> Result<T, DockerError> {
        match res {
            Ok(v) => Ok(v),
            Err(e) => Err(self.classify(map(Box::new(e))).await),
        }
    }

    /// `GET /_ping`.
    ///
    /// # Errors
    ///
    /// [`DockerError::Ping`], or [`DockerError::TunnelDown`] when the worker's SSH is gone.
    pub async fn ping(&self) -> Result<(), DockerError> {
        let r = self.docker.ping().await.map(|_| ());
        self.op(r, |source| DockerError::Ping {
            node: self.node.clone(),
            via: self.via.clone(),
            source,
        })
        .await
    }

    /// `GET /version`.
    ///
    /// # Errors
    ///
    /// [`DockerError::Version`] (or [`DockerError::TunnelDown`]).
    pub async fn version(&self) -> Result<SystemVersion, DockerError> {
        let r = self.docker.version().await;
        self.op(r, |source| DockerError::Version {
            node: self.node.clone(),
            source,
        })
        .await
    }

    /// Imports a root filesystem tar as image `reference` (`docker import`: `create_image` with
    /// `fromSrc=-` and the tar as body). `changes` are Dockerfile instructions applied to the
    /// image config (`LABEL k=v`, `CMD [...]`, `ENV K=V`, ...). Returns the image id.
    ///
    /// # Errors
    ///
    /// [`DockerError::ImportImage`] (or [`DockerError::TunnelDown`]).
    pub async fn import_image<S>(
        &self,
        reference: &str,
        changes: &[String],
        tar: S,
    ) -> Result<String, DockerError>
    where
        S: Stream<Item = Result<Bytes, io::Error>> + Send + 'static,
    {
        let (repo, tag) = split_reference(reference);
        let opts = CreateImageOptionsBuilder::default()
            .from_src("-")
            .repo(repo)
            .tag(tag)
            .changes(changes.to_vec())
            .build();
        let docker = self.docker_with_timeout(Duration::from_secs(3600));
        let mut stream = docker.create_image(Some(opts), Some(bollard::body_try_stream(tar)), None);
        let mut last_status = None;
        while let Some(item) = stream.next().await {
            let info = self
                .op(item, |source| DockerError::ImportImage {
                    node: self.node.clone(),
                    image: reference.to_owned(),
                    source,
                })
                .await?;
            if let Some(s) = info.status {
                last_status = Some(s);
            }
        }
        // The id arrives as the final status ("sha256:..."); inspect to be sure it landed.
        match self.inspect_image(reference).await? {
            Some(img) => Ok(img.id.or(last_status).unwrap_or_default()),
            None => Err(DockerError::ImportImage {
                node: self.node.clone(),
                image: reference.to_owned(),
                source: Box::new(BollardError::DockerStreamError {
                    error: format!(
                        "import finished but the image is absent (last status: {})",
                        last_status.unwrap_or_default()
                    ),
                }),
            }),
        }
    }

    /// [`DockerNode::import_image`] from a tar file on this machine, streamed in 1 MiB chunks.
    ///
    /// # Errors
    ///
    /// [`DockerError::ReadArchive`] when the file cannot be opened; otherwise as
    /// [`DockerNode::import_image`].
    pub async fn import_image_file(
        &self,
        reference: &str,
        changes: &[String],
        tar: &Path,
    ) -> Result<String, DockerError> {
        let file = tokio::fs::File::open(tar)
            .await
            .map_err(|source| DockerError::ReadArchive {
                node: self.node.clone(),
                path: tar.to_owned(),
                source,
            })?;
        self.import_image(reference, changes, file_stream(file))
            .await
    }

    /// Inspects an image; `None` when it does not exist.
    ///
    /// # Errors
    ///
    /// [`DockerError::Inspect`] for failures other than 404.
    pub async fn inspect_image(&self, name: &str) -> Result<Option<ImageInspect>, DockerError> {
        match self.docker.inspect_image(name).await {
            Ok(v) => Ok(Some(v)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(self.classify(self.inspect_err("image", name, e)).await),
        }
    }

    /// Inspects a container; `None` when it does not exist.
    ///
    /// # Errors
    ///
    /// [`DockerError::Inspect`] for failures other than 404.
    pub async fn inspect_container(
        &self,
        name: &str,
    ) -> Result<Option<ContainerInspectResponse>, DockerError> {
        match self.docker.inspect_container(name, None).await {
            Ok(v) => Ok(Some(v)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(self.classify(self.inspect_err("container", name, e)).await),
        }
    }

    /// Inspects a network; `None` when it does not exist.
    ///
    /// # Errors
    ///
    /// [`DockerError::Inspect`] for failures other than 404.
    pub async fn inspect_network(&self, name: &str) -> Result<Option<NetworkInspect>, DockerError> {
        match self.docker.inspect_network(name, None).await {
            Ok(v) => Ok(Some(v)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(self.classify(self.inspect_err("network", name, e)).await),
        }
    }

    fn inspect_err(&self, kind: &'static str, name: &str, source: BollardError) -> DockerError {
        DockerError::Inspect {
            node: self.node.clone(),
            kind,
            name: name.to_owned(),
            source: Box::new(source),
        }
    }

    fn list_err(&self, kind: &'static str, label: &str, source: Box<BollardError>) -> DockerError {
        DockerError::List {
            node: self.node.clone(),
            kind,
            filter: format!("label={label}"),
            source,
        }
    }

    /// All containers (running or not) carrying `label` (`key` or `key=value`).
    ///
    /// # Errors
    ///
    /// [`DockerError::List`].
    pub async fn list_containers_by_label(
        &self,
        label: &str,
    ) -> Result<Vec<ContainerSummary>, DockerError> {
        let opts = ListContainersOptionsBuilder::default()
            .all(true)
            .filters(&label_filter(label))
            .build();
        let r = self.docker.list_containers(Some(opts)).await;
        self.op(r, |e| self.list_err("containers", label, e)).await
    }

    /// All images carrying `label`.
    ///
    /// # Errors
    ///
    /// [`DockerError::List`].
    pub async fn list_images_by_label(
        &self,
        label: &str,
    ) -> Result<Vec<ImageSummary>, DockerError> {
        let opts = ListImagesOptionsBuilder::default()
            .all(true)
            .filters(&label_filter(label))
            .build();
        let r = self.docker.list_images(Some(opts)).await;
        self.op(r, |e| self.list_err("images", label, e)).await
    }

    /// All networks carrying `label`.
    ///
    /// # Errors
    ///
    /// [`DockerError::List`].
    pub async fn list_networks_by_label(&self, label: &str) -> Result<Vec<Network>, DockerError> {
        let opts = ListNetworksOptionsBuilder::default()
            .filters(&label_filter(label))
            .build();
        let r = self.docker.list_networks(Some(opts)).await;
        self.op(r, |e| self.list_err("networks", label, e)).await
    }

    /// All volumes carrying `label`.
    ///
    /// # Errors
    ///
    /// [`DockerError::List`].
    pub async fn list_volumes_by_label(&self, label: &str) -> Result<Vec<Volume>, DockerError> {
        let opts = ListVolumesOptionsBuilder::default()
            .filters(&label_filter(label))
            .build();
        let r = self.docker.list_volumes(Some(opts)).await;
        self.op(r, |e| self.list_err("volumes", label, e))
            .await
            .map(|v| v.volumes.unwrap_or_default())
    }

    /// Creates a network; returns its id.
    ///
    /// # Errors
    ///
    /// [`DockerError::CreateNetwork`].
    pub async fn create_network(&self, req: NetworkCreateRequest) -> Result<String, DockerError> {
        let name = req.name.clone();
        let r = self.docker.create_network(req).await;
        self.op(r, |source| DockerError::CreateNetwork {
            node: self.node.clone(),
            name,
            source,
        })
        .await
        .map(|r| r.id)
    }

    /// Connects a (created, not necessarily started) container to a network, optionally with a
    /// fixed IPv4 address.
    ///
    /// # Errors
    ///
    /// [`DockerError::ConnectNetwork`].
    pub async fn connect_network(
        &self,
        network: &str,
        container: &str,
        ipv4: Option<&str>,
    ) -> Result<(), DockerError> {
        let req = NetworkConnectRequest {
            container: container.to_owned(),
            endpoint_config: Some(EndpointSettings {
                ipam_config: ipv4.map(|ip| EndpointIpamConfig {
                    ipv4_address: Some(ip.to_owned()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        };
        let r = self.docker.connect_network(network, req).await;
        self.op(r, |source| DockerError::ConnectNetwork {
            node: self.node.clone(),
            network: network.to_owned(),
            container: container.to_owned(),
            source,
        })
        .await
    }

    /// Creates a container named `name`; returns its id.
    ///
    /// # Errors
    ///
    /// [`DockerError::CreateContainer`].
    pub async fn create_container(
        &self,
        name: &str,
        body: ContainerCreateBody,
    ) -> Result<String, DockerError> {
        let opts = CreateContainerOptionsBuilder::default().name(name).build();
        let r = self.docker.create_container(Some(opts), body).await;
        self.op(r, |source| DockerError::CreateContainer {
            node: self.node.clone(),
            name: name.to_owned(),
            source,
        })
        .await
        .map(|r| r.id)
    }

    /// Starts a container.
    ///
    /// # Errors
    ///
    /// [`DockerError::StartContainer`].
    pub async fn start_container(&self, name: &str) -> Result<(), DockerError> {
        let r = self.docker.start_container(name, None).await;
        self.op(r, |source| DockerError::StartContainer {
            node: self.node.clone(),
            name: name.to_owned(),
            source,
        })
        .await
    }

    /// Force-removes a container and its anonymous volumes; `false` when it did not exist.
    ///
    /// # Errors
    ///
    /// [`DockerError::Remove`].
    pub async fn remove_container(&self, name: &str) -> Result<bool, DockerError> {
        let opts = RemoveContainerOptionsBuilder::default()
            .force(true)
            .v(true)
            .build();
        match self.docker.remove_container(name, Some(opts)).await {
            Ok(()) => Ok(true),
            Err(e) if is_not_found(&e) => Ok(false),
            Err(e) => Err(self.classify(self.remove_err("container", name, e)).await),
        }
    }

    /// Removes a network; `false` when it did not exist.
    ///
    /// # Errors
    ///
    /// [`DockerError::Remove`].
    pub async fn remove_network(&self, name: &str) -> Result<bool, DockerError> {
        match self.docker.remove_network(name).await {
            Ok(()) => Ok(true),
            Err(e) if is_not_found(&e) => Ok(false),
            Err(e) => Err(self.classify(self.remove_err("network", name, e)).await),
        }
    }

    /// Force-removes an image; `false` when it did not exist.
    ///
    /// # Errors
    ///
    /// [`DockerError::Remove`].
    pub async fn remove_image(&self, name: &str) -> Result<bool, DockerError> {
        let opts = RemoveImageOptionsBuilder::default().force(true).build();
        match self.docker.remove_image(name, Some(opts), None).await {
            Ok(_) => Ok(true),
            Err(e) if is_not_found(&e) => Ok(false),
            Err(e) => Err(self.classify(self.remove_err("image", name, e)).await),
        }
    }

    /// Removes a volume; `false` when it did not exist.
    ///
    /// # Errors
    ///
    /// [`DockerError::Remove`].
    pub async fn remove_volume(&self, name: &str) -> Result<bool, DockerError> {
        let opts = RemoveVolumeOptionsBuilder::default().force(true).build();
        match self.docker.remove_volume(name, Some(opts)).await {
            Ok(()) => Ok(true),
            Err(e) if is_not_found(&e) => Ok(false),
            Err(e) => Err(self.classify(self.remove_err("volume", name, e)).await),
        }
    }

    fn remove_err(&self, kind: &'static str, name: &str, source: BollardError) -> DockerError {
        DockerError::Remove {
            node: self.node.clone(),
            kind,
            name: name.to_owned(),
            source: Box::new(source),
        }
    }

    /// Removes every container, then network, volume and image carrying `label`, and nothing
    /// else. Idempotent.
    ///
    /// # Errors
    ///
    /// The first [`DockerError::List`] or [`DockerError::Remove`]; objects removed before it
    /// stay removed.
    pub async fn remove_by_label(&self, label: &str) -> Result<Removed, DockerError> {
        let mut removed = Removed::default();
        for c in self.list_containers_by_label(label).await? {
            let Some(id) = c.id else { continue };
            let name = c
                .names
                .and_then(|n| n.into_iter().next())
                .map_or_else(|| id.clone(), |n| n.trim_start_matches('/').to_owned());
            if self.remove_container(&id).await? {
                removed.containers.push(name);
            }
        }
        for n in self.list_networks_by_label(label).await? {
            let Some(id) = n.id else { continue };
            if self.remove_network(&id).await? {
                removed.networks.push(n.name.unwrap_or(id));
            }
        }
        for v in self.list_volumes_by_label(label).await? {
            if self.remove_volume(&v.name).await? {
                removed.volumes.push(v.name);
            }
        }
        for i in self.list_images_by_label(label).await? {
            if self.remove_image(&i.id).await? {
                removed.images.push(i.id);
            }
        }
        Ok(removed)
    }

    /// Closes the tunnel (and the SSH session if this is its last handle).
    ///
    /// # Errors
    ///
    /// [`DockerError::Forward`] when ssh fails to close.
    pub async fn close(self) -> Result<(), DockerError> {
        let Some(t) = self.tunnel else {
            return Ok(());
        };
        drop(self.docker);
        let Tunnel {
            session,
            local,
            remote,
        } = t;
        let _ = session
            .session()
            .close_port_forward(
                openssh::ForwardType::Local,
                local.0.as_path(),
                remote.as_path(),
            )
            .await;
        let local_path = local.0.clone();
        drop(local);
        session
            .close()
            .await
            .map_err(|source| DockerError::Forward {
                node: self.node,
                local: local_path,
                remote,
                source,
            })
    }
}

fn connect_unix(socket: &Path) -> Result<Docker, BollardError> {
    let s = socket.to_string_lossy();
    Docker::connect_with_unix(&s, DEFAULT_TIMEOUT.as_secs(), bollard::API_DEFAULT_VERSION)
}

fn next_tunnel_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Splits `repo:tag` (a `:` after the last `/`); the tag defaults to `latest`.
fn split_reference(reference: &str) -> (&str, &str) {
    let slash = reference.rfind('/').map_or(0, |i| i + 1);
    match reference[slash..].rfind(':') {
        Some(i) => (&reference[..slash + i], &reference[slash + i + 1..]),
        None => (reference, "latest"),
    }
}

/// A file as a stream of 1 MiB chunks.
pub fn file_stream(
    file: tokio::fs::File,
) -> impl Stream<Item = Result<Bytes, io::Error>> + Send + 'static {
    use tokio::io::AsyncReadExt;
    futures::stream::try_unfold(file, |mut f| async move {
        let mut buf = vec![0u8; 1 << 20];
        let n = f.read(&mut buf).await?;
        if n == 0 {
            Ok(None)
        } else {
            buf.truncate(n);
            Ok(Some((Bytes::from(buf), f)))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_split_like_docker() {
        assert_eq!(split_reference("a/b:1"), ("a/b", "1"));
        assert_eq!(split_reference("a/b"), ("a/b", "latest"));
        assert_eq!(
            split_reference("host:5000/a/b"),
            ("host:5000/a/b", "latest")
        );
        assert_eq!(split_reference("host:5000/a/b:t"), ("host:5000/a/b", "t"));
    }

    #[test]
    fn via_names_the_tunnel() {
        let v = Via::Ssh {
            destination: "root@198.18.1.2".into(),
            port: 22,
            remote_socket: DEFAULT_SOCKET.into(),
        };
        assert_eq!(
            v.to_string(),
            "SSH tunnel to root@198.18.1.2:22:/var/run/docker.sock"
        );
    }

    #[test]
    fn daemon_answers_are_found_through_the_boxed_source() {
        let e = DockerError::Ping {
            node: "n".into(),
            via: Via::Local {
                socket: DEFAULT_SOCKET.into(),
            },
            source: Box::new(BollardError::DockerResponseServerError {
                status_code: 500,
                message: "x".into(),
            }),
        };
        let s = std::error::Error::source(&e).unwrap();
        assert!(s.downcast_ref::<Box<BollardError>>().is_some());
    }

    #[test]
    fn missing_local_socket_is_a_connect_error() {
        let err = DockerNode::local("head", Path::new("/nonexistent/docker.sock")).unwrap_err();
        assert!(matches!(err, DockerError::Connect { .. }));
        assert!(err.to_string().starts_with("head: cannot connect"), "{err}");
    }
}
