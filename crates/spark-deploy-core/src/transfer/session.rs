//! One receiver per stream: the pulls of a transfer go through a few long-lived processes on the
//! worker instead of one SSH channel, one shell and one Python per file.
//!
//! Each stream of a transfer is a [`Lane`]: it starts `receive.py --session` on the worker once,
//! sends it the token, then one file at a time (a JSON line: url, destination, size, sha256,
//! mode, manifest, the partial's claimed sum), and reads one JSON line back per file: `code` 0
//! and the landed file's mtime, or the pull script's exit code and why. The session does for each
//! file what the pull script does (resume, retries, size and sum, mode, rename, the manifest's
//! line), so a file lands, or fails, the same either way. A worker without `python3` answers the
//! session's start with exit 3, and that lane pulls each of its files with the pull script
//! instead (`curl`).
//!
//! Per file, the session spares an SSH channel, a shell with its ten tool starts, and a start of
//! Python with its imports: about 70 ms of CPU each on the development machine, on both ends of a
//! copy that is otherwise bound by the worker's CPU (docs/first-deploy.md).

use std::collections::VecDeque;
use std::sync::Mutex;

use super::FileJob;
use crate::ports::exec::{Cmd, Conversation, Exec, ExecError};

/// Starts the session: exit 3 when the worker has no `$1`; else the receiver (`$2`) in session
/// mode with the stall limit `$3`. `-S`: the receiver needs the standard library alone, and
/// Python starts faster without the site packages.
const START: &str =
    r#"command -v "$1" >/dev/null 2>&1 || exit 3; exec "$1" -S -c "$2" --session "$3""#;

/// The exit status with which [`START`] says the worker has no interpreter.
const NO_INTERPRETER: i32 = 3;

/// A stream that moves nothing for this long fails the attempt (as the pull script's).
const STALL_SECS: u32 = 30;

/// One file to pull: the job, its sha256 and the URL the head serves it under.
pub(super) type Pull<'a> = (&'a FileJob, &'a String, String);

/// How one file's pull ended.
pub(super) enum Pulled {
    /// It landed with this mtime (as `stat -c %.9Y` prints it).
    Landed(String),
    /// It failed: the exit code and why.
    Failed(String),
}

/// The files still to pull, shared by the lanes: each takes the next when it is free.
pub(super) struct Queue<'a>(Mutex<VecDeque<Pull<'a>>>);

impl<'a> Queue<'a> {
    pub(super) fn new(pulls: impl IntoIterator<Item = Pull<'a>>) -> Self {
        Self(Mutex::new(pulls.into_iter().collect()))
    }

    fn next(&self) -> Option<Pull<'a>> {
        self.0.lock().ok()?.pop_front()
    }
}

/// What a lane runs each file with.
enum Receiver<'a> {
    /// Not started yet.
    Unstarted,
    /// The session on the worker.
    Session(Box<Conversation<'a>>),
    /// The pull script, one run per file (the worker has no interpreter).
    Script,
}

/// What every lane of one transfer shares.
pub(super) struct Shared<'a> {
    /// The worker.
    pub(super) exec: &'a Exec,
    /// The files still to pull.
    pub(super) queue: Queue<'a>,
    /// The server's token and a newline: the first line every receiver reads.
    pub(super) token_line: String,
    /// The worker's manifest.
    pub(super) manifest: String,
    /// The program that runs the session.
    pub(super) interpreter: &'a str,
    /// The pull script, for each file where the worker has no interpreter.
    pub(super) script: &'static str,
}

/// One stream of a transfer.
pub(super) struct Lane<'a> {
    shared: &'a Shared<'a>,
    receiver: Receiver<'a>,
}

impl<'a> Lane<'a> {
    /// A lane taking files from `shared`'s queue; its session starts with its first file.
    pub(super) fn new(shared: &'a Shared<'a>) -> Self {
        Self {
            shared,
            receiver: Receiver::Unstarted,
        }
    }

    /// Pulls the queue's next file; `None` when the queue is empty (the session is then ended).
    pub(super) async fn next(&mut self) -> Option<(Pull<'a>, Result<Pulled, ExecError>)> {
        let Some(pull) = self.shared.queue.next() else {
            if let Receiver::Session(s) = std::mem::replace(&mut self.receiver, Receiver::Script) {
                // Every file it was sent has been answered: how it ends changes nothing.
                let _ = s.finish().await;
            }
            return None;
        };
        let r = self.pull(&pull).await;
        Some((pull, r))
    }

    async fn pull(&mut self, pull: &Pull<'a>) -> Result<Pulled, ExecError> {
        if matches!(self.receiver, Receiver::Unstarted) {
            let start = Cmd::shell(START)
                .args(["sh", self.shared.interpreter])
                .named_arg(include_str!("receive.py"), "<receive.py>")
                .arg(STALL_SECS.to_string())
                .stdin(self.shared.token_line.as_bytes().to_vec());
            self.receiver = Receiver::Session(Box::new(self.shared.exec.converse(&start).await?));
        }
        if let Receiver::Session(s) = &mut self.receiver {
            // A session that exited (or never started its interpreter) refuses the request or
            // closes its stdout without answering.
            let answer = match s
                .send(job_line(pull, &self.shared.manifest).as_bytes())
                .await
            {
                Ok(()) => s.line().await?,
                Err(_) => None,
            };
            if let Some(answer) = answer {
                return Ok(parse_answer(&answer));
            }
        }
        // How the session ended says whether the worker has no interpreter (the pull script
        // then takes this file and the lane's next ones) or the receiver failed.
        if let Receiver::Session(s) = std::mem::replace(&mut self.receiver, Receiver::Script) {
            let ended = s.finish().await?;
            if ended.status.code() != Some(NO_INTERPRETER) {
                return Ok(Pulled::Failed(format!(
                    "the receiver on the worker ended ({}): {}",
                    ended.status,
                    String::from_utf8_lossy(&ended.stderr).trim()
                )));
            }
        }
        self.by_script(pull).await
    }

    /// The pull script for one file (`$1`–`$7`, the token on stdin).
    async fn by_script(&self, (job, sha, url): &Pull<'a>) -> Result<Pulled, ExecError> {
        let cmd = Cmd::shell(self.shared.script)
            .arg("sh")
            .args([
                url.clone(),
                job.to.display().to_string(),
                job.size.to_string(),
                (*sha).clone(),
                format!("{:o}", job.mode),
                self.shared.manifest.clone(),
                claim(job),
            ])
            .stdin(self.shared.token_line.as_bytes().to_vec());
        let out = self.shared.exec.output(&cmd).await?;
        Ok(if out.status.success() {
            Pulled::Landed(String::from_utf8_lossy(&out.stdout).trim().to_owned())
        } else {
            Pulled::Failed(format!(
                "{}: {}",
                out.status
                    .code()
                    .map_or_else(|| "killed by a signal".to_owned(), |c| format!("exit {c}")),
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        })
    }
}

/// `<size>:<sha256>` of the partial as the worker took it while following the file, or empty.
fn claim(job: &FileJob) -> String {
    job.partial_sum
        .as_ref()
        .map_or_else(String::new, |s| format!("{}:{s}", job.size))
}

/// The session's request for one file.
fn job_line((job, sha, url): &Pull<'_>, manifest: &str) -> String {
    let line = serde_json::json!({
        "url": url,
        "dest": job.to.display().to_string(),
        "size": job.size,
        "sha256": sha,
        "mode": format!("{:o}", job.mode),
        "manifest": manifest,
        "claim": claim(job),
    });
    format!("{line}\n")
}

/// The session's answer for one file.
fn parse_answer(answer: &str) -> Pulled {
    #[derive(serde::Deserialize)]
    struct Answer {
        code: i64,
        text: String,
    }
    match serde_json::from_str::<Answer>(answer) {
        Ok(a) if a.code == 0 => Pulled::Landed(a.text),
        Ok(a) => Pulled::Failed(format!("exit {}: {}", a.code, a.text)),
        Err(e) => Pulled::Failed(format!("the receiver answered {answer:?}: {e}")),
    }
}
