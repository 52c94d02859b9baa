//! SSH sessions to worker nodes, shared by the [`exec`](super::exec) and
//! [`docker`](super::docker) ports.
//!
//! One OpenSSH ControlMaster per node (the `openssh` crate, process-mux) carries remote
//! commands and the forwarded Docker socket. Every session is opened with:
//!
//! - `BatchMode=yes` (key authentication only, never a prompt);
//! - `StrictHostKeyChecking=yes` against exactly the known_hosts file of the [`SshTarget`]
//!   (`GlobalKnownHostsFile=/dev/null`), so an unknown or changed host key is refused;
//! - only the identity file of the target (`IdentitiesOnly=yes`), no agent;
//! - a generated `ssh_config` instead of the user's `~/.ssh/config`, so nothing leaks in;
//! - the control directory under a short runtime directory ([`runtime_dir`]), because unix
//!   socket paths are limited to 108 bytes.

use std::io;
use std::num::NonZeroUsize;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use openssh::{ControlPersist, KnownHosts, Session, SessionBuilder};

use super::SshTarget;

/// How long an idle ControlMaster (no open channel) outlives its last use.
///
/// Bounds the lifetime of a master left behind by a killed process.
pub const CONTROL_PERSIST_IDLE: Duration = Duration::from_secs(1800);

/// Errors of opening an SSH session.
#[derive(Debug, thiserror::Error)]
pub enum SshError {
    /// The local runtime directory for control sockets could not be prepared.
    #[error(
        "{node}: cannot prepare the SSH control directory {path}: {source} \
         (remedy: make sure /tmp is writable, or set TMPDIR to a short writable path)"
    )]
    ControlDir {
        /// Node name.
        node: String,
        /// The directory.
        path: PathBuf,
        /// Underlying error.
        #[source]
        source: io::Error,
    },
    /// A file the session needs (identity, known_hosts) is missing.
    #[error(
        "{node}: {what} {path} is not readable: {source} \
         (remedy: check the node's SSH settings in the deployment config)"
    )]
    MissingFile {
        /// Node name.
        node: String,
        /// Which file (`identity file`, `known_hosts file`).
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// Underlying error.
        #[source]
        source: io::Error,
    },
    /// The ControlMaster could not be established (unreachable, refused, host key or auth).
    #[error(
        "{node}: cannot open an SSH session to {destination} port {port}: {source} \
         (remedy: check that sshd runs on the node, that the host key is in {known_hosts}, \
         and that the public key of {identity} is in the node's authorized_keys)"
    )]
    Connect {
        /// Node name.
        node: String,
        /// `user@host`.
        destination: String,
        /// Port.
        port: u16,
        /// known_hosts file used.
        known_hosts: PathBuf,
        /// Identity file used.
        identity: PathBuf,
        /// Underlying error.
        #[source]
        source: openssh::Error,
    },
}

/// An open SSH session to a node, cheap to clone (the ControlMaster is shared).
#[derive(Debug, Clone)]
pub struct SshSession {
    node: String,
    target: SshTarget,
    session: Arc<Session>,
}

impl SshSession {
    /// Opens a ControlMaster to `target`; `node` names the node in errors.
    ///
    /// # Errors
    ///
    /// [`SshError::MissingFile`] when the identity or known_hosts file cannot be read,
    /// [`SshError::ControlDir`] when the control directory cannot be created,
    /// [`SshError::Connect`] when ssh fails (unreachable, host key unknown or changed,
    /// key refused).
    pub async fn connect(node: impl Into<String>, target: &SshTarget) -> Result<Self, SshError> {
        let node = node.into();
        for (what, path) in [
            ("identity file", &target.identity_file),
            ("known_hosts file", &target.known_hosts),
        ] {
            std::fs::File::open(path).map_err(|source| SshError::MissingFile {
                node: node.clone(),
                what,
                path: path.clone(),
                source,
            })?;
        }
        let dir = runtime_dir().map_err(|(path, source)| SshError::ControlDir {
            node: node.clone(),
            path,
            source,
        })?;
        // Read by the master at start only; unique per connection, removed afterwards.
        let config = dir.join(format!(
            "ssh_config-{}-{}-{}",
            sanitize(&node),
            std::process::id(),
            next_config_id()
        ));
        write_private(&config, ssh_config(target).as_bytes()).map_err(|source| {
            SshError::ControlDir {
                node: node.clone(),
                path: config.clone(),
                source,
            }
        })?;

        let mut b = SessionBuilder::default();
        b.known_hosts_check(KnownHosts::Strict)
            .user_known_hosts_file(&target.known_hosts)
            .keyfile(&target.identity_file)
            .port(target.port)
            .connect_timeout(target.connect_timeout)
            .server_alive_interval(Duration::from_secs(15))
            .config_file(&config)
            .control_directory(&dir)
            .control_persist(ControlPersist::IdleFor(
                NonZeroUsize::new(usize::try_from(CONTROL_PERSIST_IDLE.as_secs()).unwrap_or(1800))
                    .unwrap_or(NonZeroUsize::MIN),
            ));
        let session = b.connect(&target.destination).await;
        let _ = std::fs::remove_file(&config);
        let session = session.map_err(|source| SshError::Connect {
            node: node.clone(),
            destination: target.destination.clone(),
            port: target.port,
            known_hosts: target.known_hosts.clone(),
            identity: target.identity_file.clone(),
            source,
        })?;
        Ok(Self {
            node,
            target: target.clone(),
            session: Arc::new(session),
        })
    }

    /// The node name given at connect time.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The target this session was opened to.
    pub fn target(&self) -> &SshTarget {
        &self.target
    }

    /// The underlying `openssh` session.
    pub fn session(&self) -> &Arc<Session> {
        &self.session
    }

    /// Whether the ControlMaster is still alive.
    ///
    /// # Errors
    ///
    /// The `openssh` error when the master is gone.
    pub async fn check(&self) -> Result<(), openssh::Error> {
        self.session.check().await
    }

    /// Closes the ControlMaster if this is the last handle to it (otherwise the master is
    /// closed when the last clone is dropped).
    ///
    /// # Errors
    ///
    /// The `openssh` error when `ssh -O exit` fails.
    pub async fn close(self) -> Result<(), openssh::Error> {
        match Arc::try_unwrap(self.session) {
            Ok(s) => s.close().await,
            Err(_) => Ok(()),
        }
    }
}

/// The short per-user runtime directory for control and forwarded sockets:
/// `$TMPDIR` (default `/tmp`) joined with `sd-<uid>`, mode 0700.
///
/// # Errors
///
/// The path and the I/O error when the directory cannot be created or is not owned by us.
pub fn runtime_dir() -> Result<PathBuf, (PathBuf, io::Error)> {
    let base = std::env::var_os("TMPDIR")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute() && p.as_os_str().len() < 40)
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    let uid = std::fs::metadata("/proc/self").map_or(0, |m| m.uid());
    let dir = base.join(format!("sd-{uid}"));
    let err = |e| (dir.clone(), e);
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(err(e)),
    }
    let meta = std::fs::symlink_metadata(&dir).map_err(err)?;
    if !meta.is_dir() || meta.uid() != uid {
        return Err(err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "exists but is not a directory owned by this user",
        )));
    }
    if meta.permissions().mode() & 0o077 != 0 {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).map_err(err)?;
    }
    Ok(dir)
}

/// A file-name-safe form of a node name.
pub(crate) fn sanitize(node: &str) -> String {
    node.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn next_config_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

fn write_private(path: &Path, contents: &[u8]) -> io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(contents)
}

fn ssh_config(target: &SshTarget) -> String {
    // Options the `openssh` builder has no setter for. Command-line options of the builder
    // (known_hosts, key, port, timeouts) take precedence over these anyway.
    format!(
        "# generated by spark-deploy for {dest}\n\
         Host *\n\
         \x20 BatchMode yes\n\
         \x20 StrictHostKeyChecking yes\n\
         \x20 GlobalKnownHostsFile /dev/null\n\
         \x20 UserKnownHostsFile \"{kh}\"\n\
         \x20 IdentitiesOnly yes\n\
         \x20 IdentityAgent none\n\
         \x20 PasswordAuthentication no\n\
         \x20 KbdInteractiveAuthentication no\n\
         \x20 UpdateHostKeys no\n\
         \x20 LogLevel ERROR\n",
        dest = target.destination,
        kh = target.known_hosts.display(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_dir_is_short_and_private() {
        let dir = runtime_dir().expect("runtime dir");
        assert!(dir.as_os_str().len() < 40, "{}", dir.display());
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
    }

    #[test]
    fn sanitize_keeps_names_readable() {
        assert_eq!(sanitize("worker-1"), "worker-1");
        assert_eq!(sanitize("a/b c"), "a_b_c");
    }

    #[test]
    fn config_keeps_host_key_checking_strict() {
        let t = SshTarget::new("root@198.18.1.2", "/k/id", "/k/known_hosts");
        let c = ssh_config(&t);
        assert!(c.contains("StrictHostKeyChecking yes"));
        assert!(c.contains("UserKnownHostsFile \"/k/known_hosts\""));
        assert!(c.contains("GlobalKnownHostsFile /dev/null"));
    }
}
