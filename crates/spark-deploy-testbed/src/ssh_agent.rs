//! A real `ssh-agent` of its own, on its own socket, for tests that log in with a key held only
//! by an agent. The agent runs in the foreground (`-D`) as a child of this process and is
//! killed when the [`SshAgent`] is dropped; nothing in this process's environment changes.

use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

/// Errors of the test agent.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// `ssh-agent` or `ssh-add` could not be run.
    #[error(
        "cannot run {program}: {source} \
         (remedy: install the OpenSSH client, e.g. `apt-get install -y openssh-client`)"
    )]
    Spawn {
        /// The program.
        program: &'static str,
        /// Underlying error.
        #[source]
        source: io::Error,
    },
    /// The agent's socket did not appear.
    #[error("ssh-agent did not create {socket} within 5 s")]
    NoSocket {
        /// The socket path.
        socket: PathBuf,
    },
    /// `ssh-add` failed.
    #[error("`ssh-add {args}` failed: {output}")]
    Add {
        /// Its arguments.
        args: String,
        /// Its stdout and stderr.
        output: String,
    },
    /// The temporary directory for the socket could not be created.
    #[error("cannot create a directory for the agent's socket: {source}")]
    Dir {
        /// Underlying error.
        #[source]
        source: io::Error,
    },
}

/// A running `ssh-agent`.
#[derive(Debug)]
pub struct SshAgent {
    _child: tokio::process::Child,
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl SshAgent {
    /// Starts an empty agent on a fresh socket.
    ///
    /// # Errors
    ///
    /// [`AgentError::Dir`], [`AgentError::Spawn`] or [`AgentError::NoSocket`].
    pub async fn start() -> Result<Self, AgentError> {
        let dir = tempfile::tempdir().map_err(|source| AgentError::Dir { source })?;
        let socket = dir.path().join("agent.sock");
        let child = tokio::process::Command::new("ssh-agent")
            .arg("-D")
            .arg("-a")
            .arg(&socket)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| AgentError::Spawn {
                program: "ssh-agent",
                source,
            })?;
        for _ in 0..100 {
            if socket.exists() {
                return Ok(Self {
                    _child: child,
                    socket,
                    _dir: dir,
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(AgentError::NoSocket { socket })
    }

    /// The agent's socket (what `SSH_AUTH_SOCK` names).
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Adds a private key (`ssh-add <key>`).
    ///
    /// # Errors
    ///
    /// [`AgentError::Spawn`] or [`AgentError::Add`].
    pub async fn add(&self, key: &Path) -> Result<(), AgentError> {
        self.ssh_add(&[key.as_os_str()]).await.map(drop)
    }

    /// Removes every key (`ssh-add -D`).
    ///
    /// # Errors
    ///
    /// [`AgentError::Spawn`] or [`AgentError::Add`].
    pub async fn remove_all(&self) -> Result<(), AgentError> {
        self.ssh_add(&[OsStr::new("-D")]).await.map(drop)
    }

    /// The keys held (`ssh-add -l`), one line each; empty when none.
    ///
    /// # Errors
    ///
    /// [`AgentError::Spawn`] or [`AgentError::Add`].
    pub async fn list(&self) -> Result<Vec<String>, AgentError> {
        match self.ssh_add(&[OsStr::new("-l")]).await {
            Ok(text) => Ok(text.lines().map(str::to_owned).collect()),
            // `ssh-add -l` exits 1 for an empty agent.
            Err(AgentError::Add { output, .. }) if output.contains("no identities") => {
                Ok(Vec::new())
            }
            Err(e) => Err(e),
        }
    }

    async fn ssh_add(&self, args: &[&OsStr]) -> Result<String, AgentError> {
        let out = tokio::process::Command::new("ssh-add")
            .args(args)
            .env("SSH_AUTH_SOCK", &self.socket)
            .stdin(Stdio::null())
            .output()
            .await
            .map_err(|source| AgentError::Spawn {
                program: "ssh-add",
                source,
            })?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() {
            Ok(text)
        } else {
            Err(AgentError::Add {
                args: args
                    .iter()
                    .map(|a| a.to_string_lossy())
                    .collect::<Vec<_>>()
                    .join(" "),
                output: text + &String::from_utf8_lossy(&out.stderr),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn holds_and_drops_keys() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("id");
        let st = std::process::Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-f"])
            .arg(&key)
            .status()
            .unwrap();
        assert!(st.success());
        let agent = SshAgent::start().await.unwrap();
        assert!(agent.list().await.unwrap().is_empty());
        agent.add(&key).await.unwrap();
        let keys = agent.list().await.unwrap();
        assert_eq!(keys.len(), 1, "{keys:?}");
        assert!(keys[0].contains("ED25519"), "{keys:?}");
        agent.remove_all().await.unwrap();
        assert!(agent.list().await.unwrap().is_empty());
    }
}
