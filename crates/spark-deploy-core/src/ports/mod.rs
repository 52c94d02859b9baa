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

/// How to reach a node over SSH: what `ssh` is given, with host-key checking always on.
///
/// Unset fields are resolved by ssh as for `ssh <destination>` (the ssh config, then ssh's
/// defaults); set fields override the ssh config. See [`ssh::options`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshTarget {
    /// What `ssh` is given: `user@host`, `host`, or a `Host` alias of the ssh config
    /// (e.g. `root@198.18.1.2`, `spark-2`). Never starts with `-`.
    pub destination: String,
    /// Port of the node's sshd (`-p`); `None` = the ssh config's `Port`, else 22.
    pub port: Option<u16>,
    /// The key file offered first (`-i` with `IdentitiesOnly=yes`: the agent's other keys are
    /// not offered; the ssh config's `IdentityFile`s are tried after it); `None` = ssh's choice: the agent's keys, the ssh
    /// config's `IdentityFile`, the default identities (`~/.ssh/id_ed25519`, `id_ecdsa`,
    /// `id_rsa`, ...).
    pub identity_file: Option<PathBuf>,
    /// The known_hosts file that must hold the node's host key (`UserKnownHostsFile`);
    /// `None` = the ssh config's `UserKnownHostsFile`, else `<home>/.ssh/known_hosts`. The
    /// system-wide known_hosts is consulted too, as ssh does.
    pub known_hosts: Option<PathBuf>,
    /// The home whose `.ssh/config` is honoured (and whose `.ssh/known_hosts` is the default);
    /// `None` = the account's home as ssh finds it.
    pub home: Option<PathBuf>,
    /// The ssh-agent socket (`SSH_AUTH_SOCK` of ssh); `None` = inherited from this process.
    pub agent_socket: Option<PathBuf>,
    /// Bound on establishing the TCP connection (`ConnectTimeout`).
    pub connect_timeout: Duration,
}

impl SshTarget {
    /// A target resolved entirely by ssh, with a 10 s connect timeout.
    pub fn new(destination: impl Into<String>) -> Self {
        Self {
            destination: destination.into(),
            port: None,
            identity_file: None,
            known_hosts: None,
            home: None,
            agent_socket: None,
            connect_timeout: Duration::from_secs(10),
        }
    }
}

impl std::fmt::Display for NodeTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NodeTarget::Local => f.write_str("local"),
            NodeTarget::Ssh(t) => match t.port {
                Some(port) => write!(f, "ssh://{}:{port}", t.destination),
                None => write!(f, "ssh://{}", t.destination),
            },
        }
    }
}
