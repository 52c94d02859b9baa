//! `standin-loopback`: both ranks of the engine stand-in on loopback (no testbed), plus a
//! spark-deploy config that points at them, for benchmarks and demos of what talks to the API.
//!
//! `standin-loopback [--pool N] [--parallel N] [--env KEY=VALUE]... --config-out FILE`
//! prints one JSON line `{"base_url", "config", "model"}` once rank 0 serves, then runs until
//! its stdin closes. `--env` sets rank 0's stand-in variables (`TF_STANDIN_TIME_SCALE=10`,
//! `TF_STANDIN_FAULT=lost_needle`, ...). Needs `tf-standin` built next to it.

use std::io::Read as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use spark_deploy_testbed::standin::loopback::{LoopbackInputs, LoopbackOptions, LoopbackPair};

#[derive(Parser, Debug)]
#[command(about = "The engine stand-in's two ranks on loopback, and a config pointing at them")]
struct Args {
    /// The pool (`--context` / `--pool`).
    #[arg(long, default_value_t = 65_536)]
    pool: u64,
    /// Concurrent streams.
    #[arg(long, default_value_t = 4)]
    parallel: u32,
    /// Rank 0 environment, KEY=VALUE (repeatable).
    #[arg(long = "env", value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// Where to write the spark-deploy config.
    #[arg(long)]
    config_out: PathBuf,
}

#[allow(clippy::print_stdout, clippy::print_stderr)]
fn main() -> ExitCode {
    let args = Args::parse();
    let Some(bin) = spark_deploy_testbed::standin::locate_binary() else {
        eprintln!(
            "standin-loopback: tf-standin not found next to this binary; remedy: cargo build -p spark-deploy-testbed --bin tf-standin"
        );
        return ExitCode::from(2);
    };
    let mut env = Vec::new();
    for kv in &args.env {
        let Some((k, v)) = kv.split_once('=') else {
            eprintln!("standin-loopback: --env {kv:?} is not KEY=VALUE");
            return ExitCode::from(2);
        };
        env.push((k.to_owned(), v.to_owned()));
    }
    let run = || -> Result<(LoopbackInputs, LoopbackPair), Box<dyn std::error::Error>> {
        let inputs = LoopbackInputs::generate(&bin, args.pool)?;
        let pair = LoopbackPair::start(
            &inputs,
            &LoopbackOptions {
                pool: args.pool,
                parallel: args.parallel,
                env,
                ..LoopbackOptions::default()
            },
        )?;
        let state = args
            .config_out
            .parent()
            .map_or_else(|| PathBuf::from("."), PathBuf::from);
        fs_err::write(
            &args.config_out,
            pair.config_toml(&state, args.pool, args.parallel),
        )?;
        Ok((inputs, pair))
    };
    let (_inputs, pair) = match run() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("standin-loopback: {e}");
            return ExitCode::from(1);
        }
    };
    println!(
        "{}",
        serde_json::json!({"base_url": pair.base_url(), "config": args.config_out, "model": pair.served_name})
    );
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    ExitCode::SUCCESS
}
