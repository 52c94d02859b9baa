//! `spark-deploy`: the command line over the spark-deploy plan.
//!
//! Exit codes: 0 success, 2 usage, 3 configuration, 4 preflight, 5 runtime (see `exit.rs`).

mod api_hint;
mod commands;
mod events;
mod exit;
mod logging;
mod progress;
mod render;
#[cfg(feature = "testbed")]
mod standin;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// One line for `-h`.
const ABOUT: &str = "Deploy one large model across NVIDIA DGX Sparks (one tensor-parallel rank per \
                     Spark) and serve it through an OpenAI-compatible API on the head";

/// `--help`: what the tool does and the usual order of commands.
const LONG_ABOUT: &str = "\
Deploy one large model across NVIDIA DGX Sparks (one tensor-parallel rank per Spark, joined by their
ConnectX-7 link) and serve it through an OpenAI-compatible API on the head: TensorFold's dsv41
engine with DeepSeek-V4.1-Flash at TP=2 on port 8888 by default.

It checks every node (preflight), downloads the pinned checkpoint into the Hugging Face cache,
builds each rank's weight file, gives the worker its inputs (NFS or copy), builds the engine image,
starts both ranks and smoke-tests the API; steps whose work is done are skipped.

Usual order: `init`, `config check`, `plan` (touches nothing), `preflight`, `up`; then `status`,
`logs`, `api-key`, `watch`, `restart`, `upgrade`/`rollback`, `down`; `service install` brings the pair
back after reboots, `support-bundle` collects what a bug report needs. `demo` does it all on a
testbed (two Sparks on this machine).";

/// Deploy one large model across NVIDIA DGX Sparks (one tensor-parallel rank per Spark) and serve
/// it through an OpenAI-compatible API on the head.
#[derive(Parser, Debug)]
#[command(
    name = "spark-deploy",
    version,
    about = ABOUT,
    long_about = LONG_ABOUT,
    propagate_version = true,
    after_help = exit::HELP
)]
struct Cli {
    /// Config file (default: ./spark-deploy.toml when present, else the built-in defaults).
    #[arg(
        long,
        short,
        global = true,
        env = "SPARK_DEPLOY_CONFIG",
        value_name = "FILE"
    )]
    config: Option<PathBuf>,
    /// Machine-readable output: JSON for plans and checks, JSON lines for events and logs (a
    /// command with nothing to say in JSON refuses it).
    #[arg(long, global = true)]
    json: bool,
    /// Only warnings, errors and failures (no step lines, no progress).
    #[arg(long, short, global = true, conflicts_with = "verbose")]
    quiet: bool,
    /// Debug lines too; `RUST_LOG` (e.g. `RUST_LOG=debug`) sets the log filter in detail.
    #[arg(long, short, global = true)]
    verbose: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Write a commented default config (or import a bash recipe's settings).
    Init(commands::init::InitArgs),
    /// Validate the configuration.
    #[command(subcommand)]
    Config(commands::config::ConfigCommand),
    /// Print every step of the deployment with its actions per node; touches nothing.
    Plan,
    /// Both ranks' containers, the served model, memory available on every node.
    Status,
    /// The ranks' engine logs (timestamps), newest lines.
    Logs(commands::inspect::LogsArgs),
    /// Prepare the current config while the pair serves (preflight, inputs, storage, image), then
    /// stop every rank and start them all; a failure before the stop leaves the pair serving.
    Restart(commands::run::RunArgs),
    /// Prepare this config (`--config NEW`) beside the serving generation while it serves, switch
    /// to it, check it (smoke, validate, a short bench against the old figures) and keep it — or
    /// start the old generation again.
    Upgrade,
    /// Stop the serving generation and start the one that served before it.
    Rollback,
    /// Every generation: fingerprint, when it served, its figures, why one was refused.
    History,
    /// Print the deployment's API key (generated on the first `up`).
    ApiKey,
    /// Write one .tar.gz for a bug report: both ranks' logs (current and saved), the plan and
    /// config with secrets redacted, the last preflight, facts and run events, watch samples,
    /// each node's kernel log tail, link counters and memory.
    SupportBundle(commands::bundle::BundleArgs),
    /// Reboot persistence: systemd units on the head that bring the pair back after boot
    /// (worker first) and watch it.
    #[command(subcommand)]
    Service(commands::service::ServiceCommand),
    /// Check what the deployment serves through its API (text, thinking, tools, JSON schema,
    /// tokenizer, images, a long needle, exactness).
    Validate(commands::validate::ValidateArgs),
    /// Measure decode (1/2/4 streams, prose/code/structured) and cold prefill through the API.
    Bench(commands::bench::BenchArgs),
    /// Deploy onto the testbed (two Sparks on this machine, or four with `--nodes 4`) in one
    /// command.
    #[cfg(feature = "testbed")]
    Demo(commands::demo::DemoArgs),
    /// Supervise the running pair: samples every node, heals all ranks or none (see
    /// docs/operations.md, "Watch"); `watch pause 30m`, `watch resume`.
    Watch(commands::watch::WatchArgs),
    /// Run the whole deployment: preflight, fetch, rank inputs, worker storage, image, launch, smoke.
    Up(commands::run::RunArgs),
    /// Stop every rank (rank 0 first), saving logs.
    Down(commands::run::RunArgs),
    /// Every step up to, not including, the launch: preflight, fetch, rank inputs, worker
    /// storage, image. Starts and stops nothing.
    Prepare,
    /// Check every node; changes nothing.
    Preflight,
    /// Download the checkpoint, Engram shards and kit (pinned, resumable, verified).
    Fetch {
        /// Check the cache only, with no network (air-gapped nodes).
        #[arg(long)]
        verify_only: bool,
        /// Fetch this revision of the model (a commit, branch or tag) instead of `model.revision`
        /// (this run only; set `model.revision` to serve it).
        #[arg(long, value_name = "REV")]
        revision: Option<String>,
    },
    /// Export the validated plan: a Kubernetes LeaderWorkerSet, or compose files per node.
    #[command(subcommand)]
    Export(commands::export::ExportCommand),
    /// Build, verify or preview per-rank weight files (TFDSRK01) without a GPU.
    RankCache(commands::rank_cache::RankCacheArgs),
    /// Two Sparks on one machine: bring the testbed up or down.
    #[cfg(feature = "testbed")]
    #[command(subcommand)]
    Testbed(commands::testbed::TestbedCommand),
}

/// The verbs that refuse `--json` (every other verb honours it).
fn json_refused(command: &Command) -> Option<&'static str> {
    match command {
        Command::Init(_) => Some("init"),
        _ => None,
    }
}

fn main() -> ExitCode {
    #[cfg(feature = "testbed")]
    if let Some(code) = standin::dispatch() {
        return code;
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(exit::USAGE)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let model_revision = match &cli.command {
        Command::Fetch { revision, .. } => revision.clone(),
        _ => None,
    };
    let verbosity = if cli.quiet {
        events::Verbosity::Quiet
    } else if cli.verbose {
        events::Verbosity::Verbose
    } else {
        events::Verbosity::Normal
    };
    logging::init(verbosity);
    if cli.json
        && let Some(verb) = json_refused(&cli.command)
    {
        let f = exit::Failure::usage(
            format!("--json: `{verb}` has no machine-readable output"),
            format!("run `spark-deploy {verb}` without --json"),
        );
        render::failure(&f, false);
        return ExitCode::from(f.code);
    }
    let global = commands::Global {
        config: cli.config,
        json: cli.json,
        model_revision,
        verbosity,
    };
    tracing::debug!(command = ?cli.command, config = ?global.config_path(), "spark-deploy");
    let result = match cli.command {
        Command::Init(args) => commands::init::run(&global, &args),
        Command::Config(cmd) => commands::config::run(&global, &cmd),
        Command::Plan => commands::plan::run(&global),
        Command::Status => commands::inspect::run_status(&global),
        Command::Logs(args) => commands::inspect::run_logs(&global, &args),
        Command::Restart(args) => {
            commands::run::run_with(&global, commands::run::Which::Restart, &args)
        }
        Command::ApiKey => commands::api_key(&global),
        Command::Upgrade => commands::upgrade::run_upgrade(&global),
        Command::Rollback => commands::upgrade::run_rollback(&global),
        Command::History => commands::upgrade::run_history(&global),
        Command::SupportBundle(args) => commands::bundle::run(&global, &args),
        Command::Service(cmd) => commands::service::run(&global, &cmd),
        Command::Validate(args) => commands::validate::run(&global, &args),
        Command::Bench(args) => commands::bench::run(&global, &args),
        #[cfg(feature = "testbed")]
        Command::Demo(args) => commands::demo::run(&global, &args),
        Command::Watch(args) => commands::watch::run(&global, &args),
        Command::Up(args) => commands::run::run_with(&global, commands::run::Which::Up, &args),
        Command::Down(args) => commands::run::run_with(&global, commands::run::Which::Down, &args),
        Command::Prepare => commands::run::run(&global, commands::run::Which::Prepare),
        Command::Preflight => commands::run::run(&global, commands::run::Which::Preflight),
        Command::Fetch { verify_only, .. } => commands::run::run(
            &global,
            if verify_only {
                commands::run::Which::FetchVerifyOnly
            } else {
                commands::run::Which::Fetch
            },
        ),
        Command::Export(cmd) => commands::export::run(&global, &cmd),
        Command::RankCache(args) => commands::rank_cache::run(args, global.json)
            .map_err(|e| exit::Failure::new(exit::RUNTIME, e.as_ref(), None)),
        #[cfg(feature = "testbed")]
        Command::Testbed(cmd) => commands::testbed::run(&global, &cmd),
    };
    // Output that could not be written fails a command that otherwise succeeded.
    let result = result.and_then(|()| render::stdout_failure().map_or(Ok(()), Err));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            render::failure(&failure, global.json);
            ExitCode::from(failure.code)
        }
    }
}
