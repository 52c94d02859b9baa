//! Errors of the Docker port: one variant per operation, each naming the node.

use std::io;
use std::path::PathBuf;

use bollard::errors::Error as BollardError;

use super::Via;
use crate::ports::ssh::SshError;

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
    /// `GET /info` failed.
    #[error("{node}: Docker info query failed: {source}")]
    Info {
        /// Node name.
        node: String,
        /// Underlying error.
        #[source]
        source: Box<BollardError>,
    },
    /// Creating a volume failed.
    #[error("{node}: creating volume {name} failed: {source}")]
    CreateVolume {
        /// Node name.
        node: String,
        /// Volume name.
        name: String,
        /// Underlying error.
        #[source]
        source: Box<BollardError>,
    },
    /// Waiting for a container to exit failed.
    #[error("{node}: waiting for container {name} failed: {source}")]
    Wait {
        /// Node name.
        node: String,
        /// Container name.
        name: String,
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
    /// Building an image failed (the daemon's message, or the API error).
    #[error("{node}: building image {image} failed: {detail}")]
    BuildImage {
        /// Node name.
        node: String,
        /// The tag being built.
        image: String,
        /// What the builder said.
        detail: String,
    },
    /// Streaming an image out (`docker save`), into (`docker load`) or tagging it failed.
    #[error("{node}: {op} of image {image} failed: {source}")]
    ImageTransfer {
        /// Node name.
        node: String,
        /// `save`, `load` or `tag`.
        op: &'static str,
        /// The image.
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
    /// Stopping a container failed.
    #[error("{node}: stopping container {name} failed: {source}")]
    StopContainer {
        /// Node name.
        node: String,
        /// Container name.
        name: String,
        /// Underlying error.
        #[source]
        source: Box<BollardError>,
    },
    /// Reading a container's log failed.
    #[error("{node}: reading the log of container {name} failed: {source}")]
    Logs {
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
