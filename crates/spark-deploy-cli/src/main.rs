//! `spark-deploy`: the command line over the spark-deploy plan.
//!
//! Exit codes: 0 success, 2 usage, 3 configuration, 4 preflight, 5 runtime (see `exit.rs`).

mod commands;
mod events;
mod exit;
mod render;
#[cfg(feature = "testbed")]
mod standin;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Deploy one large model across NVIDIA DGX Sparks.
#[derive(Parser, Debug)]
#[command(name = "spark-deploy", version, about, propagate_version = true, after_help = exit::HELP)]
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
    /// Machine-readable output: JSON for plans and checks, JSON lines for events.
    #[arg(long, global = true)]
    json: bool,
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
    /// Stop both ranks and start both with the current config (validated first).
    Restart,
    /// Print the deployment's API key (generated on the first `up`).
    ApiKey,
    /// Check what the deployment serves through its API (text, thinking, tools, JSON schema,
    /// tokenizer, images, a long needle, exactness).
    Validate(commands::validate::ValidateArgs),
    /// Measure decode (1/2/4 streams, prose/code/structured) and cold prefill through the API.
    Bench(commands::bench::BenchArgs),
    /// Deploy onto the testbed (two Sparks on this machine) in one command.
    #[cfg(feature = "testbed")]
    Demo,
    /// Run the whole deployment: preflight, fetch, rank inputs, worker storage, image, launch, smoke.
    Up,
    /// Stop every rank (rank 0 first), saving logs.
    Down,
    /// Check every node; changes nothing.
    Preflight,
    /// Download the checkpoint, Engram shards and kit (pinned, resumable, verified).
    Fetch {
        /// Check the cache only, with no network (air-gapped nodes).
        #[arg(long)]
        verify_only: bool,
    },
    /// Build, verify or preview per-rank weight files (TFDSRK01) without a GPU.
    RankCache(commands::rank_cache::RankCacheArgs),
    /// Two Sparks on one machine: bring the testbed up or down.
    #[cfg(feature = "testbed")]
    #[command(subcommand)]
    Testbed(commands::testbed::TestbedCommand),
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
    let global = commands::Global {
        config: cli.config,
        json: cli.json,
    };
    let result = match cli.command {
        Command::Init(args) => commands::init::run(&global, &args),
        Command::Config(cmd) => commands::config::run(&global, &cmd),
        Command::Plan => commands::plan::run(&global),
        Command::Status => commands::inspect::run_status(&global),
        Command::Logs(args) => commands::inspect::run_logs(&global, &args),
        Command::Restart => commands::run::run(&global, commands::run::Which::Restart),
        Command::ApiKey => commands::api_key(&global),
        Command::Validate(args) => commands::validate::run(&global, &args),
        Command::Bench(args) => commands::bench::run(&global, &args),
        #[cfg(feature = "testbed")]
        Command::Demo => commands::demo::run(&global),
        Command::Up => commands::run::run(&global, commands::run::Which::Up),
        Command::Down => commands::run::run(&global, commands::run::Which::Down),
        Command::Preflight => commands::run::run(&global, commands::run::Which::Preflight),
        Command::Fetch { verify_only } => commands::run::run(
            &global,
            if verify_only {
                commands::run::Which::FetchVerifyOnly
            } else {
                commands::run::Which::Fetch
            },
        ),
        Command::RankCache(args) => commands::rank_cache::run(args)
            .map_err(|e| exit::Failure::new(exit::RUNTIME, e.as_ref(), None)),
        #[cfg(feature = "testbed")]
        Command::Testbed(cmd) => commands::testbed::run(&global, &cmd),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            render::failure(&failure, global.json);
            ExitCode::from(failure.code)
        }
    }
}
