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
use bytes::Bytes;
use futures::Stream;

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
        /// The SSH destination (`user@host`, `host` or an ssh config alias).
        destination: String,
        /// SSH port, when set explicitly (otherwise ssh's resolution).
        port: Option<u16>,
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
            } => {
                write!(f, "SSH tunnel to {destination}")?;
                if let Some(port) = port {
                    write!(f, ":{port}")?;
                }
                write!(f, ":{}", remote_socket.display())
            }
        }
    }
}

mod error;
mod images;
mod ops;
mod throwaway;

pub use error::DockerError;

/// What [`DockerNode::remove_by_label`] removed.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
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

/// What [`DockerNode::container_state`] reports of one container.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerState {
    /// The container exists.
    pub exists: bool,
    /// It is running.
    pub running: bool,
    /// Its exit code, once it exited.
    pub exit_code: Option<i64>,
    /// How often the daemon restarted it.
    pub restart_count: Option<i64>,
    /// Its ID.
    pub id: Option<String>,
    /// When it last started (RFC 3339, as the daemon writes it).
    pub started_at: Option<String>,
    /// Its labels.
    pub labels: std::collections::HashMap<String, String>,
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
            port: Some(22),
            remote_socket: DEFAULT_SOCKET.into(),
        };
        assert_eq!(
            v.to_string(),
            "SSH tunnel to root@198.18.1.2:22:/var/run/docker.sock"
        );
        let v = Via::Ssh {
            destination: "sparky".into(),
            port: None,
            remote_socket: DEFAULT_SOCKET.into(),
        };
        assert_eq!(v.to_string(), "SSH tunnel to sparky:/var/run/docker.sock");
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
