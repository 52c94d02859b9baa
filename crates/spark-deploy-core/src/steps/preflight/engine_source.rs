//! The head's facts for the engine build (with `engine.repo` set): the base image's ID and whether
//! the source holds the commit — read in the build checkout, in a local repository, or with
//! `git ls-remote` for a URL (bounded in time, never prompting).

use std::time::Duration;

use crate::context::Context;
use crate::ports::Cmd;
use crate::preflight::decide::access::error_chain;
use crate::preflight::decide::engine_build::{EngineBuildFacts, SourceProbe};

const LS_REMOTE: Duration = Duration::from_secs(30);

fn git(dir: &str) -> Cmd {
    Cmd::new("env")
        .arg("GIT_TERMINAL_PROMPT=0")
        .arg("git")
        .arg("-C")
        .arg(dir)
}

fn words(out: &std::process::Output) -> String {
    let e = String::from_utf8_lossy(&out.stderr).trim().to_owned();
    if e.is_empty() {
        format!("git exited with {}", out.status)
    } else {
        e.lines().last().unwrap_or_default().to_owned()
    }
}

/// `None` when `engine.repo` is empty (nothing is built).
pub(super) async fn collect(ctx: &Context) -> Option<EngineBuildFacts> {
    let c = ctx.config().config();
    let e = &c.engine;
    if e.repo.is_empty() {
        return None;
    }
    let base = match ctx.docker(0).await {
        Ok(d) => d
            .inspect_image(&e.base_image)
            .await
            .map(|i| i.map(|i| i.id.unwrap_or_default()))
            .map_err(|err| error_chain(&err)),
        Err(err) => Err(error_chain(&err)),
    };
    let source = match ctx.exec(0).await {
        Ok(exec) => {
            let checkout = format!("{}/src", crate::layout::engine_build_dir(&c.nodes[0]));
            let has = |dir: &str| {
                git(dir)
                    .arg("cat-file")
                    .arg("-e")
                    .arg(format!("{}^{{commit}}", e.commit))
            };
            let in_checkout = std::path::Path::new(&checkout).join(".git").exists()
                && exec
                    .output(&has(&checkout))
                    .await
                    .is_ok_and(|o| o.status.success());
            if in_checkout {
                SourceProbe::InCheckout
            } else if !crate::config::repo_is_remote(&e.repo) {
                match exec.output(&has(&e.repo)).await {
                    Ok(o) if o.status.success() => SourceProbe::Local,
                    Ok(o) => SourceProbe::LocalMissing(words(&o)),
                    Err(err) => SourceProbe::LocalMissing(error_chain(&err)),
                }
            } else {
                let cmd = Cmd::new("env")
                    .arg("GIT_TERMINAL_PROMPT=0")
                    .arg("GIT_SSH_COMMAND=ssh -o BatchMode=yes")
                    .arg("git")
                    .arg("ls-remote")
                    .arg(&e.repo);
                match tokio::time::timeout(LS_REMOTE, exec.output(&cmd)).await {
                    Err(_) => SourceProbe::Unreachable(format!(
                        "`git ls-remote` did not answer within {} s",
                        LS_REMOTE.as_secs()
                    )),
                    Ok(Err(err)) => SourceProbe::Unreachable(error_chain(&err)),
                    Ok(Ok(o)) if !o.status.success() => SourceProbe::Unreachable(words(&o)),
                    Ok(Ok(o)) => SourceProbe::Remote(
                        String::from_utf8_lossy(&o.stdout)
                            .lines()
                            .filter_map(|l| l.split_once('\t'))
                            .find(|(sha, _)| *sha == e.commit)
                            .map(|(_, r)| r.to_owned()),
                    ),
                }
            }
        }
        Err(err) => SourceProbe::Unreachable(error_chain(&err)),
    };
    Some(EngineBuildFacts {
        repo: e.repo.clone(),
        commit: e.commit.clone(),
        base_image: e.base_image.clone(),
        base,
        source,
    })
}
