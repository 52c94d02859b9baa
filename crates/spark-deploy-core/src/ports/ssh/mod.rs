//! SSH sessions to worker nodes, shared by the [`exec`](super::exec) and
//! [`docker`](super::docker) ports.
//!
//! One OpenSSH ControlMaster per node (the `openssh` crate, process-mux: the system `ssh`)
//! carries remote commands and the forwarded Docker socket. A node is reached the way
//! `ssh <destination>` reaches it ([`options`]): the destination may be a `Host` alias of
//! `~/.ssh/config`, whose `HostName`, `User`, `Port`, `IdentityFile` and `ProxyJump` apply;
//! the agent's keys and the default identities are offered as ssh offers them; the node's
//! explicit port, identity file and known_hosts file override. Whatever the configs say, every
//! hop runs with `BatchMode=yes` (never a prompt) and `StrictHostKeyChecking=yes` (an unknown
//! or changed host key is refused). The control directory lives under a short runtime
//! directory ([`runtime_dir`]), because unix socket paths are limited to 108 bytes.

pub mod options;
pub mod resolve;

use std::io;
use std::num::NonZeroUsize;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use openssh::{ControlPersist, Session, SessionBuilder};

use self::options::{MasterOptions, Unsafe};
use self::resolve::Resolved;
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
    /// A value of the target cannot be handed to ssh safely.
    #[error(
        "{node}: the SSH {what} {value:?} {problem} \
         (remedy: {remedy})"
    )]
    Unsafe {
        /// Node name.
        node: String,
        /// `destination`, `identity file`, `known_hosts file`, `home directory`.
        what: &'static str,
        /// The value.
        value: String,
        /// Why it is refused.
        problem: Unsafe,
        /// What to do instead.
        remedy: &'static str,
    },
    /// An explicitly configured file (identity, known_hosts) is missing.
    #[error(
        "{node}: {what} {path} is not readable: {source} \
         (remedy: fix the node's {field} in the deployment config, or leave it unset to use \
         ~/.ssh/config and ssh's defaults)"
    )]
    MissingFile {
        /// Node name.
        node: String,
        /// Which file (`identity file`, `known_hosts file`).
        what: &'static str,
        /// The config field (`identity_file`, `known_hosts`).
        field: &'static str,
        /// The path.
        path: PathBuf,
        /// Underlying error.
        #[source]
        source: io::Error,
    },
    /// A host key (the node's, or its ProxyJump host's) is not in the known_hosts files ssh
    /// checked, or differs from them.
    #[error(
        "{node}: the host key of {destination} ({resolved}) is unknown or has changed, and \
         host keys are always checked: {reason} (remedy: verify the key's fingerprint on that \
         host (`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub`), then add it to \
         {known_hosts}: `{keyscan}`{via}; or point the ssh config's UserKnownHostsFile or the \
         node's known_hosts at a file that holds it)"
    )]
    HostKey {
        /// Node name.
        node: String,
        /// The hop whose key was refused: the destination as configured, or its ProxyJump
        /// host.
        destination: String,
        /// What ssh resolved the destination to, or `unresolved`.
        resolved: String,
        /// The first known_hosts file ssh checked.
        known_hosts: String,
        /// The `ssh-keyscan` command line for the resolved host and port.
        keyscan: String,
        /// Where to run it, for a host behind a ProxyJump.
        via: String,
        /// ssh's own words.
        reason: String,
        /// Underlying error.
        #[source]
        source: openssh::Error,
    },
    /// The ControlMaster could not be established (unreachable, refused, auth).
    #[error(
        "{node}: cannot open an SSH session to {destination} ({resolved}): {reason} \
         (remedy: check that `ssh -o BatchMode=yes {destination} true` works for this user: \
         sshd running on the node, its host key in known_hosts, and a key it accepts in \
         ssh-agent, ~/.ssh/config's IdentityFile, the default identities or the node's \
         identity_file)"
    )]
    Connect {
        /// Node name.
        node: String,
        /// The destination as configured (`user@host`, `host` or an alias).
        destination: String,
        /// What ssh resolved the destination to, or `unresolved`.
        resolved: String,
        /// ssh's own words.
        reason: String,
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
    /// [`SshError::Unsafe`] when a value of the target cannot be handed to ssh,
    /// [`SshError::MissingFile`] when an explicit identity or known_hosts file cannot be read,
    /// [`SshError::ControlDir`] when the control directory cannot be created,
    /// [`SshError::HostKey`] when the host key is unknown or changed, [`SshError::Connect`]
    /// when ssh fails otherwise (unreachable, refused, no accepted key).
    pub async fn connect(node: impl Into<String>, target: &SshTarget) -> Result<Self, SshError> {
        let node = node.into();
        for (what, field, path) in [
            ("identity file", "identity_file", &target.identity_file),
            ("known_hosts file", "known_hosts", &target.known_hosts),
        ] {
            if let Some(path) = path {
                std::fs::File::open(path).map_err(|source| SshError::MissingFile {
                    node: node.clone(),
                    what,
                    field,
                    path: path.clone(),
                    source,
                })?;
            }
        }
        let dir = runtime_dir().map_err(|(path, source)| SshError::ControlDir {
            node: node.clone(),
            path,
            source,
        })?;
        // Read by the master (and any ProxyJump ssh) at start only; unique per connection,
        // removed afterwards.
        let config = dir.join(format!(
            "ssh_config-{}-{}-{}",
            sanitize(&node),
            std::process::id(),
            next_config_id()
        ));
        let options = MasterOptions::new(target, config.clone()).map_err(|r| SshError::Unsafe {
            node: node.clone(),
            what: r.what,
            remedy: r.remedy(),
            value: r.value,
            problem: r.problem,
        })?;
        write_private(&config, options.config_text.as_bytes()).map_err(|source| {
            SshError::ControlDir {
                node: node.clone(),
                path: config.clone(),
                source,
            }
        })?;
        // Removed however this function ends, a cancelled connect included.
        let _config_file = RemoveOnDrop(config);

        let mut b = SessionBuilder::default();
        options.apply(&mut b);
        b.connect_timeout(target.connect_timeout)
            .server_alive_interval(Duration::from_secs(15))
            .control_directory(&dir)
            .control_persist(ControlPersist::IdleFor(
                NonZeroUsize::new(usize::try_from(CONTROL_PERSIST_IDLE.as_secs()).unwrap_or(1800))
                    .unwrap_or(NonZeroUsize::MIN),
            ));
        let session = match b.connect(&target.destination).await {
            Ok(s) => s,
            Err(source) => return Err(diagnose(node, target, &options, source).await),
        };
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

/// A file removed when this goes out of scope.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
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
    // Mode 0600 from the start, exclusive, never through a symlink at the path.
    crate::safe_fs::create_exclusive(path, 0o600)?.write_all(contents)
}

/// The error of a failed connect: what ssh resolved the destination to and, behind a
/// ProxyJump, whether the jump host itself is the hop that fails.
async fn diagnose(
    node: String,
    target: &SshTarget,
    options: &MasterOptions,
    source: openssh::Error,
) -> SshError {
    let resolved = resolve::resolve(options.args(&target.destination)).await;
    let mut reason = error_text(&source);
    let jump = resolved
        .as_ref()
        .and_then(|r| r.proxy_jump.as_deref())
        .and_then(options::first_hop);
    if let Some(hop) = jump
        && let Some(why) = resolve::probe_hop(options, &hop, target.connect_timeout).await
    {
        reason = format!(
            "the ProxyJump host {hop} fails: {}; then {reason}",
            why.trim_end_matches('.')
        );
        if is_host_key(&why) {
            let hop_resolved = resolve::resolve(options.hop_args(&hop)).await;
            return host_key_error(node, hop, hop_resolved.as_ref(), reason, source);
        }
    }
    if is_host_key(&reason) {
        return host_key_error(
            node,
            target.destination.clone(),
            resolved.as_ref(),
            reason,
            source,
        );
    }
    SshError::Connect {
        node,
        destination: target.destination.clone(),
        resolved: described(resolved.as_ref()),
        reason,
        source,
    }
}

fn is_host_key(text: &str) -> bool {
    let lower = text.to_ascii_lowercase();
    lower.contains("host key verification failed")
        || lower.contains("host key is known")
        || lower.contains("remote host identification has changed")
        || lower.contains("host key for")
}

fn described(resolved: Option<&Resolved>) -> String {
    resolved.map_or_else(|| "unresolved".to_owned(), ToString::to_string)
}

/// [`SshError::HostKey`] for the hop whose key was refused.
fn host_key_error(
    node: String,
    destination: String,
    resolved: Option<&Resolved>,
    reason: String,
    source: openssh::Error,
) -> SshError {
    let (keyscan, known_hosts, via) = match resolved {
        Some(r) => {
            let port = if r.port == 22 {
                String::new()
            } else {
                format!("-p {} ", r.port)
            };
            (
                format!(
                    "ssh-keyscan {port}-H {} >> {}",
                    r.hostname,
                    r.user_known_hosts()
                ),
                r.user_known_hosts().to_owned(),
                r.proxy_jump
                    .as_ref()
                    .map(|j| format!(" (run it where {} is reachable, e.g. on {j})", r.hostname))
                    .unwrap_or_default(),
            )
        }
        None => (
            "ssh-keyscan -H <host> >> ~/.ssh/known_hosts".to_owned(),
            "~/.ssh/known_hosts".to_owned(),
            String::new(),
        ),
    };
    SshError::HostKey {
        node,
        destination,
        resolved: described(resolved),
        known_hosts,
        keyscan,
        via,
        reason,
        source,
    }
}

/// An error and its sources on one line, trimmed (ssh's words are in the innermost one).
fn error_text(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(t.trim());
        }
        cur = c.source();
    }
    s.replace("\r\n", " ").replace('\n', " ")
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

    #[tokio::test]
    async fn a_destination_ssh_would_read_as_an_option_never_reaches_ssh() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("ran");
        let t = SshTarget::new(format!("-oProxyCommand=touch {}", marker.display()));
        let err = SshSession::connect("worker-1", &t).await.unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, SshError::Unsafe { .. }), "{msg}");
        assert!(msg.starts_with("worker-1: the SSH destination "), "{msg}");
        assert!(msg.contains("starts with '-'"), "{msg}");
        assert!(msg.contains("remedy: set the node's ssh to"), "{msg}");
        assert!(!marker.exists());
    }

    #[test]
    fn sanitize_keeps_names_readable() {
        assert_eq!(sanitize("worker-1"), "worker-1");
        assert_eq!(sanitize("a/b c"), "a_b_c");
    }
}
