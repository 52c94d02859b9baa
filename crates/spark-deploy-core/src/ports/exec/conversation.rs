//! A command the caller talks to while it runs: lines in on its stdin, lines out of its stdout.
//!
//! [`Exec::output`](super::Exec::output) runs a command to its end with all of its input given up
//! front; a [`Conversation`] keeps one process on the node for a series of requests, each answered
//! before the next is sent, so the process (an interpreter, a shell, an SSH channel) starts once.
//! Dropping a conversation kills the local end (the `ssh` client, or the process itself on the
//! head): the remote process sees its stdin close.

use std::process::{ExitStatus, Stdio};

use tokio::io::{
    AsyncBufReadExt as _, AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, BufReader,
};

use super::{Backend, Cmd, Exec, ExecError, SpawnError};

type Writer<'a> = Box<dyn AsyncWrite + Send + Sync + Unpin + 'a>;
type Reader<'a> = Box<dyn AsyncRead + Send + Sync + Unpin + 'a>;

enum Process<'a> {
    Local(tokio::process::Child),
    Ssh(openssh::Child<&'a openssh::Session>),
}

/// A running command with its stdin, stdout and stderr held by the caller.
pub struct Conversation<'a> {
    node: &'a str,
    command: String,
    process: Process<'a>,
    stdin: Option<Writer<'a>>,
    stdout: BufReader<Reader<'a>>,
    stderr: Reader<'a>,
}

/// How a conversation ended.
#[derive(Debug)]
pub struct Ended {
    /// The command's exit status.
    pub status: ExitStatus,
    /// Everything it wrote to stderr.
    pub stderr: Vec<u8>,
}

impl<'a> Conversation<'a> {
    /// Starts `cmd` on `exec`'s node with its three streams piped; `cmd`'s stdin bytes, if any,
    /// are sent first.
    pub(super) async fn start(exec: &'a Exec, cmd: &Cmd) -> Result<Self, ExecError> {
        let spawn_err = |source: SpawnError| ExecError::Spawn {
            node: exec.node.clone(),
            command: cmd.to_string(),
            source,
        };
        let args = cmd.args.iter().map(|a| a.value.as_str());
        let (process, stdin, stdout, stderr): (Process<'a>, Writer<'a>, Reader<'a>, Reader<'a>) =
            match &exec.backend {
                Backend::Local => {
                    let mut child = tokio::process::Command::new(&cmd.program)
                        .args(args)
                        .stdin(Stdio::piped())
                        .stdout(Stdio::piped())
                        .stderr(Stdio::piped())
                        .kill_on_drop(true)
                        .spawn()
                        .map_err(|e| spawn_err(e.into()))?;
                    let (i, o, e) = (child.stdin.take(), child.stdout.take(), child.stderr.take());
                    let pipes = i.zip(o).zip(e).ok_or_else(|| {
                        spawn_err(std::io::Error::other("a piped stream is missing").into())
                    })?;
                    let ((i, o), e) = pipes;
                    (Process::Local(child), Box::new(i), Box::new(o), Box::new(e))
                }
                Backend::Ssh(s) => {
                    let mut c = s.session().command(cmd.program.as_str());
                    c.args(args)
                        .stdin(openssh::Stdio::piped())
                        .stdout(openssh::Stdio::piped())
                        .stderr(openssh::Stdio::piped());
                    let mut child = c.spawn().await.map_err(|e| spawn_err(e.into()))?;
                    let (i, o, e) = (
                        child.stdin().take(),
                        child.stdout().take(),
                        child.stderr().take(),
                    );
                    let pipes = i.zip(o).zip(e).ok_or_else(|| {
                        spawn_err(std::io::Error::other("a piped stream is missing").into())
                    })?;
                    let ((i, o), e) = pipes;
                    (Process::Ssh(child), Box::new(i), Box::new(o), Box::new(e))
                }
            };
        let mut this = Self {
            node: &exec.node,
            command: cmd.to_string(),
            process,
            stdin: Some(stdin),
            stdout: BufReader::new(stdout),
            stderr,
        };
        if let Some(bytes) = &cmd.stdin {
            // A command may exit before it reads (EPIPE): its stdout and its end then tell.
            match this.write(bytes).await {
                Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                    return Err(this.broken(e));
                }
                _ => {}
            }
        }
        Ok(this)
    }

    fn broken(&self, source: std::io::Error) -> ExecError {
        ExecError::Spawn {
            node: self.node.to_owned(),
            command: self.command.clone(),
            source: source.into(),
        }
    }

    /// Sends `bytes` to the command's stdin.
    ///
    /// # Errors
    ///
    /// [`ExecError::Spawn`] when the command's stdin is closed (it exited, or the channel broke).
    pub async fn send(&mut self, bytes: &[u8]) -> Result<(), ExecError> {
        let r = self.write(bytes).await;
        r.map_err(|e| self.broken(e))
    }

    async fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::BrokenPipe))?;
        stdin.write_all(bytes).await?;
        stdin.flush().await
    }

    /// The next line the command writes to stdout, without its newline; `None` when it closed
    /// stdout (it exited: [`Conversation::finish`] tells how).
    ///
    /// # Errors
    ///
    /// [`ExecError::Spawn`] when reading fails.
    pub async fn line(&mut self) -> Result<Option<String>, ExecError> {
        let mut line = String::new();
        match self.stdout.read_line(&mut line).await {
            Ok(0) => Ok(None),
            Ok(_) => Ok(Some(line.trim_end_matches('\n').to_owned())),
            Err(e) => Err(self.broken(e)),
        }
    }

    /// Closes the command's stdin and waits for it to exit.
    ///
    /// # Errors
    ///
    /// [`ExecError::Spawn`] when waiting fails.
    pub async fn finish(mut self) -> Result<Ended, ExecError> {
        drop(self.stdin.take());
        let mut stderr = Vec::new();
        let read = self.stderr.read_to_end(&mut stderr).await;
        read.map_err(|e| self.broken(e))?;
        let (node, command) = (self.node.to_owned(), self.command.clone());
        let status = match self.process {
            Process::Local(mut c) => c.wait().await.map_err(SpawnError::from),
            Process::Ssh(c) => c.wait().await.map_err(SpawnError::from),
        }
        .map_err(|source| ExecError::Spawn {
            node,
            command,
            source,
        })?;
        Ok(Ended { status, stderr })
    }
}
