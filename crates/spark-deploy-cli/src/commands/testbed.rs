//! `spark-deploy testbed up|down`: two Sparks on one machine (see the testbed crate).

use std::path::PathBuf;

use clap::Subcommand;
use spark_deploy_testbed::cluster::{self, TestbedOptions};
use spark_deploy_testbed::deployment::deployment_config;
use spark_deploy_testbed::reuse::{self, Origin};

use super::Global;
use crate::exit::{Failure, RUNTIME};
use crate::render;

#[derive(Subcommand, Debug)]
pub(crate) enum TestbedCommand {
    /// Build the networks, the worker containers with sshd and their keys; write a deployment config.
    Up {
        /// Where to write the deployment config targeting the testbed (default: <state dir>/spark-deploy.toml).
        #[arg(long, value_name = "FILE")]
        write_config: Option<PathBuf>,
        /// Worker nodes besides the head: 1 (a pair, TP=2) or 3 (four nodes, the TP=4 profile).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=3))]
        workers: u8,
    },
    /// Remove every container, network, image and volume the testbed created, and its state.
    Down,
}

fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::new(RUNTIME, &e, None))
}

pub(crate) fn run(global: &Global, cmd: &TestbedCommand) -> Result<(), Failure> {
    let opts = TestbedOptions {
        install_tools: true,
        workers: match cmd {
            TestbedCommand::Up { workers, .. } => *workers,
            TestbedCommand::Down => 1,
        },
        ..TestbedOptions::default()
    };
    let rt = runtime()?;
    match cmd {
        TestbedCommand::Up { write_config, .. } => {
            let testbed = rt.block_on(reuse::up_or_reuse(&opts)).map_err(|e| {
                Failure::new(
                    RUNTIME,
                    &e,
                    Some(
                        "see the message; `spark-deploy testbed down` removes a half-built testbed"
                            .into(),
                    ),
                )
            })?;
            let reused = testbed.origin == Origin::Reused;
            let info = testbed.info;
            let config = deployment_config(&info);
            let text = format!(
                "# Deployment config for the spark-deploy testbed (written by `spark-deploy testbed up`).\n{}",
                toml::to_string_pretty(&config).map_err(|e| Failure::new(RUNTIME, &e, None))?
            );
            let path = write_config
                .clone()
                .unwrap_or_else(|| info.state_dir.join("spark-deploy.toml"));
            // A reused testbed's config may be a running deployment's (`demo` writes its own
            // there): kept unless another file is asked for.
            let keep = reused && write_config.is_none() && path.exists();
            if !keep {
                let tmp = path.with_extension("toml.partial");
                fs_err::write(&tmp, text)
                    .and_then(|()| fs_err::rename(&tmp, &path))
                    .map_err(|e| Failure::new(RUNTIME, &e, None))?;
            }
            if global.json {
                render::out(
                    &serde_json::json!({ "testbed": info, "config": path, "reused": reused })
                        .to_string(),
                );
            } else {
                let how = if reused {
                    "already up: reused as it is (nothing replaced)".to_owned()
                } else {
                    format!("up in {:.1} s", info.up_millis as f64 / 1000.0)
                };
                let workers: Vec<String> = info
                    .workers
                    .iter()
                    .map(|w| {
                        format!(
                            "worker {} at {} (fabric {}), ssh {}",
                            w.name, w.container, w.fabric_addr, w.ssh_destination
                        )
                    })
                    .collect();
                render::out(&format!(
                    "testbed {how}: {}\nconfig: {}{}\nnext: spark-deploy --config {} plan",
                    workers.join("; "),
                    path.display(),
                    if keep { " (kept)" } else { "" },
                    path.display()
                ));
            }
            Ok(())
        }
        TestbedCommand::Down => {
            let report = rt
                .block_on(cluster::down(&opts))
                .map_err(|e| Failure::new(RUNTIME, &e, None))?;
            if global.json {
                render::out(&serde_json::json!({ "down": report }).to_string());
            } else {
                render::out(&format!("testbed down: {report}"));
            }
            Ok(())
        }
    }
}
