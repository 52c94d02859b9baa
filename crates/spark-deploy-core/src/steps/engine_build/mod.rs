//! BuildImage's engine build (with `engine.repo` set): the engine's source at `engine.commit` is
//! checked out under the head's `<data_dir>/engine-build/src`, `engine.patches` are applied in
//! order (each checked with `git apply --check` first), and the profile's [`BuildRecipe`] runs in
//! a throwaway container of `engine.base_image` with the checkout mounted. The binaries it names
//! are collected with their sha256 into `cache/<key>/`, keyed by [`cache_key`] (commit, patch
//! hashes, base image ID, build command), so a re-run with the same inputs builds nothing; then
//! they are installed into the head's engine directory.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use bollard::models::{ContainerCreateBody, HostConfig};

use crate::context::Context;
use crate::digest::sha256_file;
use crate::engine::BuildRecipe;
use crate::event::{Level, StepKind};
use crate::ports::{Cmd, DockerError, DockerNode, Exec, ExecError};

mod cache;
mod patches;

pub use cache::{BuildRecord, cache_key};
use cache::{cached, install};
use patches::read_patches;
pub use patches::{PatchFailure, parse_apply_error};

/// Why the engine could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// A git command on the head failed.
    #[error("`{command}` failed on the head: {detail}")]
    Git {
        /// The command.
        command: String,
        /// Its error output.
        detail: String,
    },
    /// The repository does not hold the commit (after fetching it).
    #[error("engine.repo {repo} has no commit {commit} ({detail})")]
    NoCommit {
        /// `engine.repo`.
        repo: String,
        /// `engine.commit`.
        commit: String,
        /// What the fetch said.
        detail: String,
    },
    /// A patch file could not be read.
    #[error("patch file {path} (engine.patches) cannot be read: {source}")]
    PatchRead {
        /// The file.
        path: String,
        /// Underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A patch does not apply to the checkout (with the patches before it applied).
    #[error("patch {path} (engine.patches[{index}]) does not apply to engine {commit}: {failure}")]
    PatchDoesNotApply {
        /// The patch file.
        path: String,
        /// Its position in `engine.patches`.
        index: usize,
        /// The first 12 hex of the commit.
        commit: String,
        /// Where and why, from git's output.
        failure: Box<PatchFailure>,
    },
    /// The build command exited non-zero.
    #[error(
        "the engine build exited with code {code}; its log is kept at {log}; it ends with:\n{tail}"
    )]
    Failed {
        /// Exit code.
        code: i64,
        /// The kept log.
        log: PathBuf,
        /// Its last lines.
        tail: String,
    },
    /// The build succeeded but did not produce a binary the profile names.
    #[error("the engine build did not produce {path} (for {name}); its log is kept at {log}")]
    MissingOutput {
        /// The path under the output directory.
        path: String,
        /// The engine file it becomes.
        name: String,
        /// The kept log.
        log: PathBuf,
    },
    /// The run was cancelled during the build (its container is removed).
    #[error("the engine build was cancelled; its log so far is at {log}")]
    Cancelled {
        /// The log so far.
        log: PathBuf,
    },
    /// Docker on the head failed around the build container.
    #[error("running the build container: {0}")]
    Docker(#[from] DockerError),
    /// A command could not run on the head.
    #[error(transparent)]
    Exec(#[from] ExecError),
    /// A file on the head.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was done.
        op: &'static str,
        /// Where.
        path: PathBuf,
        /// Underlying error.
        #[source]
        source: std::io::Error,
    },
}

impl BuildError {
    /// What to do about it.
    #[must_use]
    pub fn remedy(&self, base_image: &str) -> String {
        match self {
            Self::Git { .. } | Self::NoCommit { .. } => "check engine.repo and engine.commit: the repository must be reachable from the head (`git ls-remote <repo>`) and hold the commit".to_owned(),
            Self::PatchRead { .. } => "fix the path or remove it from engine.patches".to_owned(),
            Self::PatchDoesNotApply { path, .. } => format!(
                "rebase {path} onto engine.commit (or fix the order of engine.patches), check it with `git apply --check` in a checkout of the commit, then run `spark-deploy up` again"
            ),
            Self::Failed { log, .. } | Self::MissingOutput { log, .. } => format!(
                "read the build log {}, fix what it names (a patch, or the toolchain in {base_image}), then run `spark-deploy up` again",
                log.display()
            ),
            Self::Cancelled { .. } => "run `spark-deploy up` again to build".to_owned(),
            Self::Docker(_) => format!("Docker on the head must run containers of {base_image}"),
            Self::Exec(_) => "git must be installed on the head".to_owned(),
            Self::Io { .. } => "the head's data_dir must be writable".to_owned(),
        }
    }
}

/// The engine binaries on the head after [`ensure`], and what it took.
#[derive(Debug, Clone, PartialEq)]
pub struct Built {
    /// The record (from the cache or this build).
    pub record: BuildRecord,
    /// Whether this run built (false: the cache had it).
    pub built: bool,
    /// Binaries (re)installed into the engine directory by this run.
    pub installed: usize,
}

fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> BuildError {
    let path = path.to_path_buf();
    move |source| BuildError::Io { op, path, source }
}

fn git(dir: &Path) -> Cmd {
    // No prompt for credentials: a repository that needs them fails with git's message.
    Cmd::new("env")
        .arg("GIT_TERMINAL_PROMPT=0")
        .arg("git")
        .arg("-C")
        .arg(dir.display().to_string())
}

async fn run_git(exec: &Exec, cmd: Cmd) -> Result<String, BuildError> {
    let out = exec.output(&cmd).await?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(BuildError::Git {
            command: cmd.to_string(),
            detail: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }
}

async fn has_commit(exec: &Exec, dir: &Path, commit: &str) -> Result<bool, BuildError> {
    let cmd = git(dir)
        .arg("cat-file")
        .arg("-e")
        .arg(format!("{commit}^{{commit}}"));
    Ok(exec.output(&cmd).await?.status.success())
}

/// What the build of one deployment needs to know.
#[derive(Debug, Clone)]
pub struct BuildInputs<'a> {
    /// `engine.repo`.
    pub repo: &'a str,
    /// `engine.commit`.
    pub commit: &'a str,
    /// `engine.patches`.
    pub patches: &'a [String],
    /// `engine.base_image`.
    pub base_image: &'a str,
    /// Its ID on the head.
    pub base_id: &'a str,
    /// The head's name.
    pub node: &'a str,
    /// `<data_dir>/engine-build` on the head.
    pub build_dir: &'a Path,
    /// The head's engine directory.
    pub engine_dir: &'a Path,
}

/// Makes the head's engine directory hold the binaries built from `inputs` with `recipe`: from
/// the cache when it has the key, else checked out, patched and built in a throwaway container.
///
/// # Errors
///
/// [`BuildError`], with [`BuildError::remedy`].
pub async fn ensure(
    ctx: &Context,
    docker: &DockerNode,
    inputs: &BuildInputs<'_>,
    recipe: &BuildRecipe,
) -> Result<Built, BuildError> {
    let patches = read_patches(inputs.patches)?;
    let hashes: Vec<(String, String)> = patches
        .iter()
        .map(|(n, s, _)| (n.clone(), s.clone()))
        .collect();
    let key = cache_key(inputs.commit, &hashes, inputs.base_id, recipe);
    let short = &key[..16];
    let entry = inputs.build_dir.join("cache").join(short);
    let log = |line: String| ctx.log(StepKind::BuildImage, Some(inputs.node), Level::Info, line);
    let (record, built) = if let Some(record) = cached(&entry, &key) {
        log(format!(
            "engine build cached (key {short}, built in {:.1} s before): 0 s of build",
            record.build_s
        ));
        (record, false)
    } else {
        let record = build(ctx, docker, inputs, recipe, &patches, &key, &entry).await?;
        log(format!(
            "engine built in {:.1} s (key {short}): {}",
            record.build_s,
            record
                .binaries
                .iter()
                .map(|(n, s)| format!("{n} sha256 {}", &s[..12]))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        (record, true)
    };
    let mut installed = 0;
    for (name, sha) in &record.binaries {
        let to = inputs.engine_dir.join(name);
        if sha256_file(&to).is_ok_and(|s| s == *sha) {
            continue;
        }
        install(&entry.join("engine").join(name), &to)?;
        installed += 1;
    }
    Ok(Built {
        record,
        built,
        installed,
    })
}

/// Checks out, patches and builds; collects the binaries into `entry`.
async fn build(
    ctx: &Context,
    docker: &DockerNode,
    inputs: &BuildInputs<'_>,
    recipe: &BuildRecipe,
    patches: &[(String, String, String)],
    key: &str,
    entry: &Path,
) -> Result<BuildRecord, BuildError> {
    let exec = ctx.exec(0).await?;
    let src = inputs.build_dir.join("src");
    let log_line = |line: String| {
        ctx.log(StepKind::BuildImage, Some(inputs.node), Level::Info, line);
    };
    std::fs::create_dir_all(&src).map_err(io("create", &src))?;
    if !src.join(".git").exists() {
        run_git(exec, git(&src).arg("init").arg("-q")).await?;
    }
    if !has_commit(exec, &src, inputs.commit).await? {
        log_line(format!("fetching {} from {}", inputs.commit, inputs.repo));
        // `--` first: the repository is never read as an option (`--upload-pack=...`).
        let by_id = git(&src).args(["fetch", "-q", "--no-tags", "--", inputs.repo, inputs.commit]);
        if let Err(first) = run_git(exec, by_id).await {
            // A server that refuses fetching by ID: fetch its branches and tags instead.
            let all = git(&src).args([
                "fetch",
                "-q",
                "--no-tags",
                "--",
                inputs.repo,
                "+refs/heads/*:refs/engine-build/heads/*",
                "+refs/tags/*:refs/engine-build/tags/*",
            ]);
            let detail = match run_git(exec, all).await {
                Ok(_) => first.to_string(),
                Err(e) => e.to_string(),
            };
            if !has_commit(exec, &src, inputs.commit).await? {
                return Err(BuildError::NoCommit {
                    repo: inputs.repo.to_owned(),
                    commit: inputs.commit.to_owned(),
                    detail,
                });
            }
        }
    }
    run_git(
        exec,
        git(&src).args(["checkout", "-q", "--force", "--detach", inputs.commit]),
    )
    .await?;
    run_git(exec, git(&src).args(["clean", "-q", "-fdx"])).await?;
    let short_commit: String = inputs.commit.chars().take(12).collect();
    for (index, (path, (_, _, text))) in inputs.patches.iter().zip(patches).enumerate() {
        let check = exec
            .output(&git(&src).args(["apply", "--check", "--", path.as_str()]))
            .await?;
        if !check.status.success() {
            return Err(BuildError::PatchDoesNotApply {
                path: path.clone(),
                index,
                commit: short_commit,
                failure: Box::new(parse_apply_error(
                    &String::from_utf8_lossy(&check.stderr),
                    text,
                )),
            });
        }
        run_git(exec, git(&src).args(["apply", "--", path.as_str()])).await?;
        log_line(format!("applied {path}"));
    }
    let out = inputs.build_dir.join("out");
    if out.exists() {
        std::fs::remove_dir_all(&out).map_err(io("remove", &out))?;
    }
    let cache = inputs.build_dir.join("tool-cache");
    let logs = inputs.build_dir.join("logs");
    for d in [&out, &cache, &logs] {
        std::fs::create_dir_all(d).map_err(io("create", d))?;
    }
    let log_path = logs.join(format!("build-{}.log", &key[..16]));
    let mut log_file =
        crate::safe_fs::create_exclusive(&log_path, 0o644).map_err(io("create", &log_path))?;
    // The build runs as the owner of the build directory, so its files stay removable.
    let meta = std::fs::metadata(inputs.build_dir).map_err(io("stat", inputs.build_dir))?;
    let user = (meta.uid() != 0).then(|| format!("{}:{}", meta.uid(), meta.gid()));
    let mut env = vec![format!("HOME={}", BuildRecipe::CACHE)];
    env.extend(recipe.env.iter().map(|(k, v)| format!("{k}={v}")));
    let body = ContainerCreateBody {
        image: Some(inputs.base_image.to_owned()),
        cmd: Some(recipe.command.clone()),
        env: Some(env),
        working_dir: Some(BuildRecipe::SRC.to_owned()),
        user,
        labels: Some(
            [(
                "io.spark-deploy.engine-build".to_owned(),
                key[..16].to_owned(),
            )]
            .into(),
        ),
        host_config: Some(HostConfig {
            binds: Some(vec![
                format!("{}:{}", src.display(), BuildRecipe::SRC),
                format!("{}:{}", out.display(), BuildRecipe::OUT),
                format!("{}:{}", cache.display(), BuildRecipe::CACHE),
            ]),
            ..HostConfig::default()
        }),
        ..ContainerCreateBody::default()
    };
    log_line(format!(
        "building engine {short_commit} with {} patch(es) in a throwaway container of {}: {}",
        patches.len(),
        inputs.base_image,
        recipe.command.join(" ")
    ));
    let started = Instant::now();
    let mut tail: std::collections::VecDeque<String> = std::collections::VecDeque::new();
    let mut on_line = |line: &str| {
        use std::io::Write as _;
        let _ = writeln!(log_file, "{line}");
        if tail.len() == 20 {
            tail.pop_front();
        }
        tail.push_back(line.to_owned());
        ctx.log(
            StepKind::BuildImage,
            Some(inputs.node),
            Level::Info,
            line.to_owned(),
        );
    };
    let name = format!("spark-deploy-engine-build-{}", &key[..12]);
    let code = tokio::select! {
        r = docker.run_to_end(&name, body, &mut on_line) => r?,
        () = ctx.cancelled() => {
            // The build container goes with the cancelled run; the checkout stays for the next.
            let _ = docker.remove_container(&name).await;
            return Err(BuildError::Cancelled { log: log_path });
        }
    };
    let build_s = started.elapsed().as_secs_f64();
    if code != 0 {
        return Err(BuildError::Failed {
            code,
            log: log_path,
            tail: tail.into_iter().collect::<Vec<_>>().join("\n"),
        });
    }
    let staged = entry.join("engine");
    if entry.exists() {
        std::fs::remove_dir_all(entry).map_err(io("remove", entry))?;
    }
    std::fs::create_dir_all(&staged).map_err(io("create", &staged))?;
    let mut binaries = Vec::new();
    for (path, name) in &recipe.outputs {
        let from = out.join(path);
        if !from.is_file() {
            return Err(BuildError::MissingOutput {
                path: format!("{}/{path}", BuildRecipe::OUT),
                name: name.clone(),
                log: log_path,
            });
        }
        let to = staged.join(name);
        install(&from, &to)?;
        binaries.push((name.clone(), sha256_file(&to).map_err(io("read", &to))?));
    }
    crate::safe_fs::copy_exclusive(&log_path, &entry.join("build.log"), 0o644)
        .map_err(io("copy", &log_path))?;
    let record = BuildRecord {
        key: key.to_owned(),
        repo: inputs.repo.to_owned(),
        commit: inputs.commit.to_owned(),
        patches: patches
            .iter()
            .map(|(n, s, _)| (n.clone(), s.clone()))
            .collect(),
        base_image: inputs.base_image.to_owned(),
        base_id: inputs.base_id.to_owned(),
        command: recipe.command.clone(),
        binaries,
        build_s,
    };
    let json = serde_json::to_vec_pretty(&record).map_err(|e| BuildError::Io {
        op: "encode",
        path: entry.join("build.json"),
        source: std::io::Error::other(e),
    })?;
    // Written last: a record exists only for a complete entry.
    let rec = entry.join("build.json");
    std::fs::write(&rec, json).map_err(io("write", &rec))?;
    Ok(record)
}

#[cfg(test)]
mod tests;
