//! The Exec port: run a command, read, write or check a file on a node.
//!
//! [`Exec`] has one implementation per [`NodeTarget`]: a local process on the head
//! (`tokio::process`) and a command over the node's SSH session (see [`super::ssh`]) on a
//! worker. Output is captured; [`Exec::run`] checks the exit status. Errors name the node and
//! the command; arguments marked secret ([`Cmd::secret_arg`]) are shown as `***`.
//!
//! # Caveats
//!
//! No method adds a timeout: wrap calls in `tokio::time::timeout` where a bound is needed.
//! Over SSH (process-mux) a remote exit status of 255 is reported as an SSH failure and 127
//! as "command not found" by the `openssh` crate, so remote scripts must not use those codes.
//! Each remote command is an SSH session channel, and sshd allows `MaxSessions` (default 10)
//! of those per connection: bound concurrent commands on one node below that. (The Docker
//! port's forwarded-socket channels are not sessions and do not count; the testbed test holds
//! 12 Docker streams open against the default limit.)

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Output, Stdio};

use tokio::io::AsyncWriteExt;

use super::NodeTarget;
use super::ssh::{SshError, SshSession};

mod conversation;
pub use conversation::{Conversation, Ended};

/// How much of a failed command's stderr goes into an error message.
const STDERR_TAIL: usize = 2000;

/// Errors of the Exec port. Every variant names the node.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The SSH session to the node could not be opened.
    #[error("{node}: cannot connect for remote commands")]
    Connect {
        /// Node name.
        node: String,
        /// Underlying error.
        #[source]
        source: Box<SshError>,
    },
    /// The command could not be started (local spawn or SSH channel failure).
    #[error(
        "{node}: cannot run `{command}`: {source} \
         (remedy: check that the program exists on the node and the SSH session is alive)"
    )]
    Spawn {
        /// Node name.
        node: String,
        /// The command, secrets redacted.
        command: String,
        /// Underlying error.
        #[source]
        source: SpawnError,
    },
    /// The command ran and exited unsuccessfully.
    #[error("{node}: `{command}` failed with {status}; stderr: {stderr}")]
    Failed {
        /// Node name.
        node: String,
        /// The command, secrets redacted.
        command: String,
        /// Exit status.
        status: ExitStatus,
        /// The last part of stderr.
        stderr: String,
    },
    /// A local file operation failed.
    #[error("{node}: cannot {op} {path}: {source}")]
    LocalFile {
        /// Node name.
        node: String,
        /// `read`, `write`, `check`.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// Underlying error.
        #[source]
        source: io::Error,
    },
    /// A path cannot be passed to a remote shell (not UTF-8).
    #[error("{node}: path {path} is not valid UTF-8 and cannot be sent to the remote shell")]
    NonUtf8Path {
        /// Node name.
        node: String,
        /// The path.
        path: PathBuf,
    },
}

/// Why a command could not be started.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// Local process error.
    #[error(transparent)]
    Local(#[from] io::Error),
    /// SSH error (master gone, channel refused, remote exit 255 or 127).
    #[error(transparent)]
    Ssh(#[from] openssh::Error),
}

/// One command argument, possibly secret, possibly shown by a name instead of its value.
#[derive(Clone, PartialEq, Eq)]
struct Arg {
    value: String,
    secret: bool,
    shown_as: Option<&'static str>,
}

/// A command to run on a node: a program, its arguments and optional stdin bytes.
///
/// No environment and no working directory on purpose: over SSH they would have to be spliced
/// into the command line; pass `env K=V prog` or `sh -c 'cd dir && ...'` explicitly.
#[derive(Clone, PartialEq, Eq)]
pub struct Cmd {
    program: String,
    args: Vec<Arg>,
    stdin: Option<Vec<u8>>,
}

impl Cmd {
    /// A command running `program` (looked up in the node's `PATH`).
    pub fn new(program: impl Into<String>) -> Self {
        Self {
            program: program.into(),
            args: Vec::new(),
            stdin: None,
        }
    }

    /// `sh -c <script>`.
    pub fn shell(script: impl Into<String>) -> Self {
        Self::new("sh").arg("-c").arg(script)
    }

    /// Appends an argument.
    #[must_use]
    pub fn arg(mut self, a: impl Into<String>) -> Self {
        self.args.push(Arg {
            value: a.into(),
            secret: false,
            shown_as: None,
        });
        self
    }

    /// Appends arguments.
    #[must_use]
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        for a in args {
            self = self.arg(a);
        }
        self
    }

    /// Appends an argument shown as `***` in errors and descriptions.
    #[must_use]
    pub fn secret_arg(mut self, a: impl Into<String>) -> Self {
        self.args.push(Arg {
            value: a.into(),
            secret: true,
            shown_as: None,
        });
        self
    }

    /// Appends an argument shown as `name` in errors and descriptions: a program's whole text
    /// passed to an interpreter, say, which would bury the rest of the command line.
    #[must_use]
    pub fn named_arg(mut self, a: impl Into<String>, name: &'static str) -> Self {
        self.args.push(Arg {
            value: a.into(),
            secret: false,
            shown_as: Some(name),
        });
        self
    }

    /// Bytes fed to the command's stdin (stdin is empty otherwise).
    #[must_use]
    pub fn stdin(mut self, bytes: impl Into<Vec<u8>>) -> Self {
        self.stdin = Some(bytes.into());
        self
    }

    /// The program.
    pub fn program(&self) -> &str {
        &self.program
    }
}

impl fmt::Display for Cmd {
    /// The command line with secret arguments redacted.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.program)?;
        for a in &self.args {
            if a.secret {
                f.write_str(" ***")?;
            } else if let Some(name) = a.shown_as {
                write!(f, " {name}")?;
            } else if a.value.is_empty()
                || a.value
                    .contains(|c: char| c.is_whitespace() || c == '\'' || c == '"')
            {
                write!(f, " {:?}", a.value)?;
            } else {
                write!(f, " {}", a.value)?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for Cmd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Cmd({self})")
    }
}

enum Backend {
    Local,
    Ssh(SshSession),
}

/// The Exec port bound to one node.
pub struct Exec {
    node: String,
    backend: Backend,
}

impl fmt::Debug for Exec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.backend {
            Backend::Local => "local".to_owned(),
            Backend::Ssh(s) => format!("ssh {}", s.target().destination),
        };
        f.debug_struct("Exec")
            .field("node", &self.node)
            .field("via", &kind)
            .finish()
    }
}

impl Exec {
    /// Binds the port to a node; for [`NodeTarget::Ssh`] this opens the SSH session.
    ///
    /// # Errors
    ///
    /// [`ExecError::Connect`] when the SSH session cannot be opened.
    pub async fn connect(node: impl Into<String>, target: &NodeTarget) -> Result<Self, ExecError> {
        let node = node.into();
        let backend = match target {
            NodeTarget::Local => Backend::Local,
            NodeTarget::Ssh(t) => Backend::Ssh(
                SshSession::connect(node.clone(), t)
                    .await
                    .map_err(|source| ExecError::Connect {
                        node: node.clone(),
                        source: Box::new(source),
                    })?,
            ),
        };
        Ok(Self { node, backend })
    }

    /// The port for the local machine.
    pub fn local(node: impl Into<String>) -> Self {
        Self {
            node: node.into(),
            backend: Backend::Local,
        }
    }

    /// Uses an already open SSH session (e.g. shared with the Docker port).
    pub fn from_session(session: SshSession) -> Self {
        Self {
            node: session.node().to_owned(),
            backend: Backend::Ssh(session),
        }
    }

    /// The node name.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The SSH session, for a worker node.
    pub fn ssh_session(&self) -> Option<&SshSession> {
        match &self.backend {
            Backend::Local => None,
            Backend::Ssh(s) => Some(s),
        }
    }

    /// Runs `cmd`, captures its output and returns it whatever the exit status.
    ///
    /// # Errors
    ///
    /// [`ExecError::Spawn`] when the command cannot be started or the SSH channel fails.
    pub async fn output(&self, cmd: &Cmd) -> Result<Output, ExecError> {
        let spawn_err = |source: SpawnError| ExecError::Spawn {
            node: self.node.clone(),
            command: cmd.to_string(),
            source,
        };
        match &self.backend {
            Backend::Local => {
                let mut c = tokio::process::Command::new(&cmd.program);
                c.args(cmd.args.iter().map(|a| &a.value))
                    .stdin(if cmd.stdin.is_some() {
                        Stdio::piped()
                    } else {
                        Stdio::null()
                    })
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .kill_on_drop(true);
                let mut child = c.spawn().map_err(|e| spawn_err(e.into()))?;
                if let (Some(bytes), Some(mut stdin)) = (&cmd.stdin, child.stdin.take()) {
                    // Feed stdin while the output is drained, so large inputs cannot deadlock.
                    let feed = async move {
                        let r = stdin.write_all(bytes).await;
                        drop(stdin);
                        r
                    };
                    let (fed, out) = tokio::join!(feed, child.wait_with_output());
                    let out = out.map_err(|e| spawn_err(e.into()))?;
                    // A command may legitimately exit without reading stdin (EPIPE).
                    if let Err(e) = fed
                        && e.kind() != io::ErrorKind::BrokenPipe
                    {
                        return Err(spawn_err(e.into()));
                    }
                    Ok(out)
                } else {
                    child
                        .wait_with_output()
                        .await
                        .map_err(|e| spawn_err(e.into()))
                }
            }
            Backend::Ssh(s) => {
                let mut c = s.session().command(cmd.program.as_str());
                c.args(cmd.args.iter().map(|a| a.value.as_str()));
                match &cmd.stdin {
                    None => c.output().await.map_err(|e| spawn_err(e.into())),
                    Some(bytes) => {
                        c.stdin(openssh::Stdio::piped())
                            .stdout(openssh::Stdio::piped())
                            .stderr(openssh::Stdio::piped());
                        let mut child = c.spawn().await.map_err(|e| spawn_err(e.into()))?;
                        let stdin = child.stdin().take();
                        let feed = async move {
                            if let Some(mut stdin) = stdin {
                                stdin.write_all(bytes).await?;
                                stdin.shutdown().await?;
                            }
                            Ok::<_, io::Error>(())
                        };
                        let (fed, out) = tokio::join!(feed, child.wait_with_output());
                        let out = out.map_err(|e| spawn_err(e.into()))?;
                        if let Err(e) = fed
                            && e.kind() != io::ErrorKind::BrokenPipe
                        {
                            return Err(spawn_err(e.into()));
                        }
                        Ok(out)
                    }
                }
            }
        }
    }

    /// Starts `cmd` for a conversation: the caller sends to its stdin and reads lines of its
    /// stdout while it runs (`cmd`'s stdin bytes, if any, go first).
    ///
    /// # Errors
    ///
    /// [`ExecError::Spawn`] when the command cannot be started or its stdin taken.
    pub async fn converse(&self, cmd: &Cmd) -> Result<Conversation<'_>, ExecError> {
        Conversation::start(self, cmd).await
    }

    /// Runs `cmd` and checks that it exits with status 0.
    ///
    /// # Errors
    ///
    /// [`ExecError::Spawn`] as for [`Exec::output`]; [`ExecError::Failed`] with the exit status
    /// and the tail of stderr when the command fails.
    pub async fn run(&self, cmd: &Cmd) -> Result<Output, ExecError> {
        let out = self.output(cmd).await?;
        if out.status.success() {
            Ok(out)
        } else {
            Err(ExecError::Failed {
                node: self.node.clone(),
                command: cmd.to_string(),
                status: out.status,
                stderr: stderr_tail(&out.stderr),
            })
        }
    }

    /// Reads a whole file.
    ///
    /// # Errors
    ///
    /// [`ExecError::LocalFile`] on the head; [`ExecError::Failed`] (e.g. no such file) or
    /// [`ExecError::Spawn`] on a worker.
    pub async fn read_file(&self, path: &Path) -> Result<Vec<u8>, ExecError> {
        match &self.backend {
            Backend::Local => tokio::fs::read(path)
                .await
                .map_err(|source| self.local_err("read", path, source)),
            Backend::Ssh(_) => {
                let p = self.remote_path(path)?;
                Ok(self.run(&Cmd::new("cat").arg("--").arg(p)).await?.stdout)
            }
        }
    }

    /// Writes a whole file (mode 0644, parent directories created), replacing it atomically:
    /// the bytes go to a temporary file next to it which is then renamed.
    ///
    /// # Errors
    ///
    /// [`ExecError::LocalFile`] on the head; [`ExecError::Failed`] or [`ExecError::Spawn`] on a
    /// worker.
    pub async fn write_file(&self, path: &Path, contents: &[u8]) -> Result<(), ExecError> {
        match &self.backend {
            Backend::Local => {
                let tmp = tmp_name(path);
                let res = async {
                    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                        tokio::fs::create_dir_all(parent).await?;
                    }
                    // Exclusive and never through a symlink planted at the temporary name.
                    let (t, bytes) = (tmp.clone(), contents.to_vec());
                    tokio::task::spawn_blocking(move || crate::safe_fs::write_exclusive(&t, bytes))
                        .await
                        .map_err(std::io::Error::other)??;
                    tokio::fs::rename(&tmp, path).await
                }
                .await;
                if res.is_err() {
                    let _ = tokio::fs::remove_file(&tmp).await;
                }
                res.map_err(|source| self.local_err("write", path, source))
            }
            Backend::Ssh(_) => {
                let p = self.remote_path(path)?;
                // The temporary is removed first and created under noclobber (`set -C`): a
                // symlink planted at its name is never written through.
                // The temporary is per writer (`$$`): two writers of one file never share it.
                let script = "set -eC; umask 022; mkdir -p -- \"$(dirname -- \"$1\")\"; \
                              t=\"$1.sd-tmp.$$\"; rm -f -- \"$t\"; \
                              cat > \"$t\" || { rm -f -- \"$t\"; exit 1; }; \
                              mv -f -- \"$t\" \"$1\"";
                self.run(&Cmd::shell(script).arg("sh").arg(p).stdin(contents.to_vec()))
                    .await
                    .map(|_| ())
            }
        }
    }

    /// Whether a path exists (any file type; a dangling symlink counts as absent).
    ///
    /// # Errors
    ///
    /// [`ExecError::LocalFile`] on the head when the check itself fails (e.g. permission);
    /// [`ExecError::Failed`] or [`ExecError::Spawn`] on a worker.
    pub async fn path_exists(&self, path: &Path) -> Result<bool, ExecError> {
        match &self.backend {
            Backend::Local => tokio::fs::try_exists(path)
                .await
                .map_err(|source| self.local_err("check", path, source)),
            Backend::Ssh(_) => {
                let p = self.remote_path(path)?;
                let cmd = Cmd::new("test").arg("-e").arg(p);
                let out = self.output(&cmd).await?;
                match out.status.code() {
                    Some(0) => Ok(true),
                    Some(1) => Ok(false),
                    _ => Err(ExecError::Failed {
                        node: self.node.clone(),
                        command: cmd.to_string(),
                        status: out.status,
                        stderr: stderr_tail(&out.stderr),
                    }),
                }
            }
        }
    }

    /// Closes the SSH session if this port holds the last handle to it.
    ///
    /// # Errors
    ///
    /// [`ExecError::Spawn`] when `ssh -O exit` fails.
    pub async fn close(self) -> Result<(), ExecError> {
        match self.backend {
            Backend::Local => Ok(()),
            Backend::Ssh(s) => s.close().await.map_err(|source| ExecError::Spawn {
                node: self.node,
                command: "ssh -O exit".to_owned(),
                source: source.into(),
            }),
        }
    }

    fn local_err(&self, op: &'static str, path: &Path, source: io::Error) -> ExecError {
        ExecError::LocalFile {
            node: self.node.clone(),
            op,
            path: path.to_owned(),
            source,
        }
    }

    fn remote_path<'p>(&self, path: &'p Path) -> Result<&'p str, ExecError> {
        path.to_str().ok_or_else(|| ExecError::NonUtf8Path {
            node: self.node.clone(),
            path: path.to_owned(),
        })
    }
}

/// A temporary beside `path`, unique to this writer (process and call), so two writers of one
/// file never share it.
fn tmp_name(path: &Path) -> PathBuf {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut s = path.as_os_str().to_owned();
    s.push(format!(".sd-tmp.{}.{n}", std::process::id()));
    PathBuf::from(s)
}

fn stderr_tail(stderr: &[u8]) -> String {
    let s = String::from_utf8_lossy(stderr);
    let s = s.trim();
    if s.len() <= STDERR_TAIL {
        return s.to_owned();
    }
    let mut start = s.len() - STDERR_TAIL;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    format!("...{}", &s[start..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_redacts_secrets_and_quotes_spaces() {
        let c = Cmd::new("curl")
            .arg("-H")
            .secret_arg("Authorization: Bearer hf_abc")
            .arg("a b")
            .named_arg("import sys\nprint(sys.argv)\n", "<script.py>");
        let s = c.to_string();
        assert_eq!(s, "curl -H *** \"a b\" <script.py>");
        assert!(!format!("{c:?}").contains("hf_abc"));
    }

    /// A conversation: the command's stdin bytes go first, each line sent is answered before
    /// the next, and its end gives the status and everything it wrote to stderr.
    #[tokio::test]
    async fn a_conversation_answers_line_by_line_and_ends_with_its_status() {
        let e = Exec::local("worker");
        let script = r#"read -r first; echo "first $first"; while read -r l; do echo "got $l"; done; echo bye >&2; exit 4"#;
        let mut c = e
            .converse(&Cmd::shell(script).stdin(b"tok\n".to_vec()))
            .await
            .unwrap();
        assert_eq!(c.line().await.unwrap().as_deref(), Some("first tok"));
        for n in 0..3 {
            c.send(format!("{n}\n").as_bytes()).await.unwrap();
            assert_eq!(c.line().await.unwrap(), Some(format!("got {n}")));
        }
        let ended = c.finish().await.unwrap();
        assert_eq!(
            (ended.status.code(), ended.stderr),
            (Some(4), b"bye\n".to_vec())
        );
        // A command that exits at once: sending to it may fail, its stdout ends without a line.
        let mut c = e.converse(&Cmd::shell("exit 3")).await.unwrap();
        let _ = c.send(b"x\n").await;
        assert_eq!(c.line().await.unwrap(), None);
        assert_eq!(c.finish().await.unwrap().status.code(), Some(3));
    }

    #[tokio::test]
    async fn local_run_captures_output_and_checks_status() {
        let e = Exec::local("head");
        let out = e.run(&Cmd::new("echo").arg("hi")).await.unwrap();
        assert_eq!(out.stdout, b"hi\n");
        let err = e
            .run(&Cmd::shell("echo oops >&2; exit 3").secret_arg("s3cr3t"))
            .await
            .unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("head: `sh -c"), "{msg}");
        assert!(msg.contains("oops"), "{msg}");
        assert!(!msg.contains("s3cr3t"), "{msg}");
        assert!(matches!(err, ExecError::Failed { .. }));
    }

    #[tokio::test]
    async fn local_stdin_and_files() {
        let e = Exec::local("head");
        let out = e
            .run(&Cmd::new("cat").stdin(b"abc".to_vec()))
            .await
            .unwrap();
        assert_eq!(out.stdout, b"abc");
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub/f.txt");
        assert!(!e.path_exists(&p).await.unwrap());
        e.write_file(&p, b"data").await.unwrap();
        assert!(e.path_exists(&p).await.unwrap());
        assert_eq!(e.read_file(&p).await.unwrap(), b"data");
        let err = e.read_file(&dir.path().join("none")).await.unwrap_err();
        assert!(err.to_string().contains("head: cannot read"), "{err}");
    }

    #[tokio::test]
    async fn missing_program_is_a_spawn_error() {
        let e = Exec::local("head");
        let err = e.run(&Cmd::new("/nonexistent/prog-sd")).await.unwrap_err();
        assert!(matches!(err, ExecError::Spawn { .. }), "{err}");
    }
}
