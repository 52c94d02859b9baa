//! `sd-hub`: serve a directory of repositories as an HF-compatible hub (testbed tool).
//!
//! ```text
//! sd-hub serve <ROOT> [--addr 127.0.0.1:0] [--gated owner/name]... [--private owner/name]... [--lfs-redirect]
//!                     [--rate-limit BYTES_PER_SEC] [--link-rate BYTES_PER_SEC]
//! ```
//! The token unlocking gated and private repositories is read from the environment variable `SD_HUB_TOKEN`
//! (never from argv). Once listening, one line `endpoint=<url>` is printed, followed by one line
//! `repo=<owner/name> commit=<sha>` per repository; the server runs until killed. `--rate-limit`
//! paces every file transfer (so a download takes long enough to interrupt); `GET
//! <endpoint>/_testbed/requests` returns the request log with the body bytes sent per request.
//!
//! ```text
//! sd-hub fetch --endpoint URL --cache DIR --repo owner/name --revision REV [--include GLOB]...
//! sd-hub verify --cache DIR --repo owner/name --revision SHA
//! ```
//! drive the Hub port of `spark-deploy-core` (token from `HF_TOKEN` or `$HF_HOME/token`).
//!
//! ```text
//! sd-hub generate <ROOT> [--size small|large] [--seed N]
//! ```
//! writes the test-scale checkpoint as the testbed's hub repos (`testbed/dsv41-exl3`,
//! `testbed/dsv41-original`, `testbed/dsv41-kit`) below `<ROOT>`, once (a complete tree is kept),
//! and prints one line `repo=<owner/name> files=<n> bytes=<total>` per repository.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::collections::HashMap;
use std::io::Write as _;
use std::net::SocketAddr;
use std::num::NonZeroU64;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use spark_deploy_testbed::hub_server::{HubOptions, HubServer};

#[derive(Parser)]
#[command(
    name = "sd-hub",
    about = "HF-compatible hub server and Hub-port driver for the testbed"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Serve `<ROOT>/<owner>/<name>/` directories as model repositories.
    Serve {
        /// Directory holding `<owner>/<name>/` repositories.
        root: PathBuf,
        /// Address to bind (loopback by default; port 0 picks a free port).
        #[arg(long, default_value = "127.0.0.1:0")]
        addr: SocketAddr,
        /// A gated repository: `resolve` needs the token from env `SD_HUB_TOKEN` (repeatable).
        #[arg(long)]
        gated: Vec<String>,
        /// A private repository: invisible without the token from env `SD_HUB_TOKEN` (repeatable).
        #[arg(long)]
        private: Vec<String>,
        /// Redirect LFS files with a 302 to a blob URL, as the Hub does.
        #[arg(long)]
        lfs_redirect: bool,
        /// Pace every file transfer at this many bytes per second.
        #[arg(long)]
        rate_limit: Option<NonZeroU64>,
        /// Pace all transfers together at this many bytes per second (one shared link).
        #[arg(long)]
        link_rate: Option<NonZeroU64>,
    },
    /// Download a repository into an HF cache with the Hub port (resumable, verified).
    Fetch {
        /// Hub endpoint URL.
        #[arg(long)]
        endpoint: String,
        /// HF hub cache directory (the one holding `models--…`).
        #[arg(long)]
        cache: PathBuf,
        /// `owner/name`.
        #[arg(long)]
        repo: String,
        /// Commit sha or branch.
        #[arg(long, default_value = "main")]
        revision: String,
        /// Only files matching these globs (`*` and `?`), default all.
        #[arg(long)]
        include: Vec<String>,
    },
    /// Generate the test-scale checkpoint as the testbed hub's repos (kept when already there).
    Generate {
        /// Directory to hold `<owner>/<name>/` repositories.
        root: PathBuf,
        /// `small` (~10 MB, the tests' checkpoint) or `large` (~2.6 GB of shards, benchmarks).
        #[arg(long, default_value = "small", value_parser = ["small", "large"])]
        size: String,
        /// Generator seed.
        #[arg(long, default_value_t = 5)]
        seed: u64,
    },
    /// Verify a cached snapshot without network.
    Verify {
        /// HF hub cache directory.
        #[arg(long)]
        cache: PathBuf,
        /// `owner/name`.
        #[arg(long)]
        repo: String,
        /// Commit sha (or a branch recorded under `refs/`).
        #[arg(long)]
        revision: String,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Serve {
            root,
            addr,
            gated,
            private,
            lfs_redirect,
            rate_limit,
            link_rate,
        } => serve(
            root,
            addr,
            gated,
            private,
            HubOptions {
                lfs_redirect,
                rate_limit,
                link_rate,
                ..HubOptions::default()
            },
        ),
        Cmd::Fetch {
            endpoint,
            cache,
            repo,
            revision,
            include,
        } => port::fetch(endpoint, cache, repo, revision, include),
        Cmd::Generate { root, size, seed } => generate(&root, &size, seed),
        Cmd::Verify {
            cache,
            repo,
            revision,
        } => port::verify(cache, repo, revision),
    }
}

fn generate(root: &std::path::Path, size: &str, seed: u64) -> ExitCode {
    use spark_deploy_testbed::checkpoint::CheckpointSpec;
    use spark_deploy_testbed::demo::{KIT, MODEL, ORIGINAL, hub_tree_of};
    let spec = if size == "large" {
        CheckpointSpec::large(seed)
    } else {
        CheckpointSpec::small(seed)
    };
    if let Err(e) = hub_tree_of(root, &spec) {
        eprintln!("sd-hub generate: {}", report(e.as_ref()));
        return ExitCode::FAILURE;
    }
    let mut out = std::io::stdout().lock();
    for repo in [MODEL, ORIGINAL, KIT] {
        let (mut files, mut bytes) = (0u64, 0u64);
        let mut dirs = vec![root.join(repo)];
        while let Some(d) = dirs.pop() {
            for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                match e.metadata() {
                    Ok(m) if m.is_dir() => dirs.push(e.path()),
                    Ok(m) => {
                        files += 1;
                        bytes += m.len();
                    }
                    Err(_) => {}
                }
            }
        }
        let _ = writeln!(out, "repo={repo} files={files} bytes={bytes}");
    }
    ExitCode::SUCCESS
}

fn serve(
    root: PathBuf,
    addr: SocketAddr,
    gated: Vec<String>,
    private: Vec<String>,
    mut opts: HubOptions,
) -> ExitCode {
    if !gated.is_empty() || !private.is_empty() {
        let Ok(token) = std::env::var("SD_HUB_TOKEN") else {
            eprintln!("sd-hub: --gated/--private need the token in env SD_HUB_TOKEN");
            return ExitCode::from(2);
        };
        let with_token = |repos: Vec<String>| {
            repos
                .into_iter()
                .map(|r| (r, token.clone()))
                .collect::<HashMap<_, _>>()
        };
        opts.gated = with_token(gated);
        opts.private = with_token(private);
    }
    let server = match HubServer::start(&root, addr, opts) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("sd-hub: {}", report(&e));
            return ExitCode::FAILURE;
        }
    };
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "endpoint={}", server.endpoint());
    for line in repo_lines(&server, &root) {
        let _ = writeln!(out, "{line}");
    }
    let _ = out.flush();
    drop(out);
    loop {
        std::thread::park();
    }
}

fn repo_lines(server: &HubServer, root: &std::path::Path) -> Vec<String> {
    let mut lines = Vec::new();
    if let Ok(owners) = std::fs::read_dir(root) {
        for o in owners.flatten() {
            if let Ok(names) = std::fs::read_dir(o.path()) {
                for n in names.flatten() {
                    let id = format!(
                        "{}/{}",
                        o.file_name().to_string_lossy(),
                        n.file_name().to_string_lossy()
                    );
                    if let Some(c) = server.commit(&id) {
                        lines.push(format!("repo={id} commit={c}"));
                    }
                }
            }
        }
    }
    lines.sort();
    lines
}

fn report(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

mod port {
    use super::{ExitCode, PathBuf, report};
    use spark_deploy_core::hub::{
        FetchEvent, HfCache, HfToken, Hub, HubConfig, select, verify_snapshot,
    };

    fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
    }

    pub(super) fn fetch(
        endpoint: String,
        cache: PathBuf,
        repo: String,
        revision: String,
        include: Vec<String>,
    ) -> ExitCode {
        let mut cfg = HubConfig::new(Some(endpoint), cache);
        cfg.token = HfToken::from_env();
        let run = async move {
            let hub = Hub::new(cfg)?;
            let pinned = hub.resolve(&repo, &revision).await?;
            let files = hub.list_files(&pinned).await?;
            let wanted: Vec<_> = select(&files, &include)?.into_iter().cloned().collect();
            let progress = |e: &FetchEvent| {
                if let FetchEvent::Retrying { file, reason, .. } = e {
                    eprintln!("sd-hub fetch: retrying {file}: {reason}");
                }
            };
            let r = hub.fetch(&pinned, &wanted, &progress).await?;
            println!("commit={}", pinned.commit);
            println!("snapshot={}", r.snapshot_dir.display());
            println!("{}", r.summary());
            Ok::<_, Box<dyn std::error::Error>>(())
        };
        let runtime = match runtime() {
            Ok(r) => r,
            Err(e) => {
                eprintln!(
                    "sd-hub fetch: cannot start the tokio runtime: {e}; check the process and thread limits (ulimit -u)"
                );
                return ExitCode::FAILURE;
            }
        };
        match runtime.block_on(run) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("sd-hub fetch: {}", report(e.as_ref()));
                ExitCode::FAILURE
            }
        }
    }

    pub(super) fn verify(cache: PathBuf, repo: String, revision: String) -> ExitCode {
        match verify_snapshot(&HfCache::new(cache), &repo, &revision, None) {
            Ok(r) if r.is_ok() => {
                println!("all {} files present and verified", r.verified.len());
                ExitCode::SUCCESS
            }
            Ok(r) => {
                for p in &r.problems {
                    println!("problem: {p}");
                }
                println!(
                    "{} verified, {} problems",
                    r.verified.len(),
                    r.problems.len()
                );
                ExitCode::FAILURE
            }
            Err(e) => {
                eprintln!("sd-hub verify: {}", report(&e));
                ExitCode::from(2)
            }
        }
    }
}
