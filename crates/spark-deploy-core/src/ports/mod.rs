//! Effect ports: the only ways steps touch the world.
//!
//! - [`exec`]: run a command, read, write or check a file on a node (a local process on the
//!   head, an SSH session on a worker).
//! - [`docker`]: the Docker Engine API of a node (the head's socket, or a worker's socket
//!   forwarded over that worker's SSH session), with the same code for every node.
//!
//! Ports know nothing about the deployment config: the caller maps its config onto a
//! [`NodeTarget`] and a node name (used in every error message).

pub mod container_body;
pub mod docker;
pub mod exec;
pub mod ssh;

pub use docker::{DockerError, DockerNode};
pub use exec::{Cmd, Exec, ExecError};
pub use ssh::{SshError, SshSession};

use std::path::PathBuf;
use std::time::Duration;

/// How a node is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeTarget {
    /// The machine this process runs on (the head): local processes and the local Docker socket.
    Local,
    /// A machine reached over SSH (a worker).
    Ssh(SshTarget),
}

/// Everything needed to open an SSH session to a node, with host-key checking always on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshTarget {
    /// `user@host` (no `ssh://` prefix, no port), e.g. `root@198.18.1.2`.
    pub destination: String,
    /// TCP port of the node's sshd.
    pub port: u16,
    /// Private key used for authentication (`ssh -i`, with `IdentitiesOnly=yes`).
    pub identity_file: PathBuf,
    /// The known_hosts file that must already hold the node's host key
    /// (`StrictHostKeyChecking=yes`, `UserKnownHostsFile=<this>`).
    pub known_hosts: PathBuf,
    /// Bound on establishing the TCP connection (`ConnectTimeout`).
    pub connect_timeout: Duration,
}

impl SshTarget {
    /// A target on port 22 with a 10 s connect timeout.
    pub fn new(
        destination: impl Into<String>,
        identity_file: impl Into<PathBuf>,
        known_hosts: impl Into<PathBuf>,
    ) -> Self {
        Self {
            destination: destination.into(),
            port: 22,
            identity_file: identity_file.into(),
            known_hosts: known_hosts.into(),
            connect_timeout: Duration::from_secs(10),
        }
    }
}

impl std::fmt::Display for NodeTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NodeTarget::Local => f.write_str("local"),
            NodeTarget::Ssh(t) => write!(f, "ssh://{}:{}", t.destination, t.port),
        }
    }
}
