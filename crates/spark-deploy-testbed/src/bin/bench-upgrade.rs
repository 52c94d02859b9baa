//! Downtime of `upgrade` and `rollback` on the testbed, as a client sees it: a poller asks the
//! API for one token every 50 ms while the deployment is upgraded to a new configuration
//! (accepted) and rolled back, `BENCH_ROUNDS` times (default 3). Each switch's downtime is the
//! longest gap between two good answers; the bound is the engine's load time (launch to first
//! token, as Smoke measured it) + 10 s. The last line is the worst downtime over the bound.
//!
//! `cargo run --release -p spark-deploy-testbed --bin bench-upgrade`
//!
//! Reuses a running testbed (never tearing down one it did not create) but refuses while a
//! deployment runs on it.

#![allow(clippy::print_stdout)]

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use spark_deploy_core::config::{DeploymentConfig, ValidatedConfig, validate};
use spark_deploy_core::event::Recorder;
use spark_deploy_core::plan::Plan;
use spark_deploy_core::run::Context;
use spark_deploy_core::upgrade::{self, Options};
use spark_deploy_testbed::cluster::{self, TestbedOptions};
use spark_deploy_testbed::poller::Poller;
use spark_deploy_testbed::reuse::{self, Origin};

type R<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// The stand-in ten times faster than its defaults (the benches inside `upgrade` take seconds).
fn config_with(c: &DeploymentConfig, max_tokens: u64, home: &Path) -> R<ValidatedConfig> {
    let mut c = c.clone();
    c.serving.max_tokens = max_tokens;
    c.engine
        .env
        .insert("TF_STANDIN_TIME_SCALE".into(), "10".into());
    Ok(validate(c, home)?)
}

fn quiet(v: &ValidatedConfig) -> Context {
    Context::new(v.clone(), Arc::new(Recorder::default()))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> R<()> {
    let opts = TestbedOptions {
        install_tools: true,
        ..TestbedOptions::default()
    };
    let testbed = reuse::up_or_reuse(&opts).await?;
    if testbed.origin == Origin::Reused {
        let ps = std::process::Command::new("docker")
            .args(["ps", "-q", "--filter", "name=sd-testbed-rank"])
            .output()?;
        if !ps.stdout.is_empty() {
            return Err("a deployment runs on the testbed: stop it (`spark-deploy down`) before benchmarking upgrades, which replace it".into());
        }
        println!("reusing the testbed that is up: it stays up");
    }
    let result = bench(&testbed.info).await;
    if testbed.origin == Origin::Created {
        cluster::down(&opts).await?;
    }
    result
}

async fn bench(info: &cluster::TestbedInfo) -> R<()> {
    let home = std::env::var_os("HOME").map_or_else(|| "/root".into(), std::path::PathBuf::from);
    let (hub, config) = spark_deploy_testbed::demo::prepare(info, &home).await?;
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let base = config.serving.max_tokens;
    let v1 = config_with(&config, base, &home)?;
    let result = async {
        Plan::standard(&v1).run(&quiet(&v1)).await?;
        let load = spark_deploy_core::lifecycle::startup::read(Path::new(
            &v1.config().deployment.state_dir,
        ))?
        .map_or(f64::NAN, |t| t.first_token_s);
        let bound = load + 10.0;
        let poller = Poller::start(&v1)?;
        println!("engine load (launch to first token): {load:.2} s; bound = load + 10 s = {bound:.2} s");
        println!("| round | upgrade downtime s | upgrade wall s | rollback downtime s | rollback wall s |");
        println!("|---|---|---|---|---|");
        let mut worst: f64 = 0.0;
        for round in 1..=rounds {
            let v2 = config_with(&config, base / 2 + round as u64, &home)?;
            let t = Instant::now();
            let u = upgrade::upgrade(&quiet(&v2), &Options::default())
                .await
                .map_err(|e| format!("round {round}: {e} — {}", e.remedy()))?;
            let (up_gap, up_ok) = poller.gap(t, Instant::now());
            let up_wall = t.elapsed().as_secs_f64();
            let t = Instant::now();
            let back = upgrade::rollback(&quiet(&v2))
                .await
                .map_err(|e| format!("round {round}: rollback: {e}"))?;
            let (rb_gap, rb_ok) = poller.gap(t, Instant::now());
            let rb_wall = t.elapsed().as_secs_f64();
            if !(up_ok && rb_ok) || back == u.generation {
                return Err(format!("round {round}: not serving after the switch").into());
            }
            println!("| {round} | {up_gap:.2} | {up_wall:.1} | {rb_gap:.2} | {rb_wall:.1} |");
            worst = worst.max(up_gap).max(rb_gap);
        }
        poller.end().await;
        println!("worst downtime / (load + 10 s) = {:.3}x", worst / bound);
        Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
    }
    .await;
    let _ = Plan::teardown(&v1).run(&quiet(&v1)).await;
    drop(hub);
    result
}
