//! `spark-deploy demo`: the whole deployment onto the testbed in one command.

use std::path::PathBuf;

use spark_deploy_core::config::validate;
use spark_deploy_core::plan::Plan;
use spark_deploy_testbed::cluster::{self, TestbedOptions};
use spark_deploy_testbed::reuse;

use super::Global;
use crate::api_hint::ApiHint;
use crate::exit::{CONFIG, Failure, RUNTIME};
use crate::render;

/// `spark-deploy demo` options.
#[derive(clap::Args, Debug)]
pub(crate) struct DemoArgs {
    /// Nodes of the testbed, the head included: 2 (TP=2) or 4 (the TP=4 profile).
    #[arg(long, default_value_t = 2, value_parser = nodes)]
    nodes: u8,
}

fn nodes(v: &str) -> Result<u8, String> {
    match v {
        "2" => Ok(2),
        "4" => Ok(4),
        _ => Err(format!("{v}: 2 (a pair) or 4 (four Sparks)")),
    }
}

pub(crate) fn run(global: &Global, args: &DemoArgs) -> Result<(), Failure> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::new(RUNTIME, &e, None))?;
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/"), PathBuf::from);
    let opts = TestbedOptions {
        install_tools: true,
        workers: args.nodes - 1,
        ..TestbedOptions::default()
    };
    rt.block_on(async {
        let info = match reuse::running(&opts).await {
            // Someone's testbed (maybe a deployment on it): used as it is, never replaced; with
            // another number of nodes, refused.
            Some(info) => {
                reuse::check_workers(&info, &opts).map_err(|e| Failure::new(RUNTIME, &e, None))?;
                render::note(&format!("reusing the testbed that is up ({})", info.state_dir.display()));
                info
            }
            None => {
                render::note("bringing the testbed up (first time: builds its node image from this machine's Debian packages)");
                cluster::up(&opts).await.map_err(|e| Failure::new(RUNTIME, &e, Some("`spark-deploy testbed down` removes a half-built testbed".into())))?
            }
        };
        render::note("generating the test-scale checkpoint, starting the testbed hub, installing the engine stand-in");
        // This executable is the engine stand-in too (run under the engine's names), so the
        // demo needs nothing else built.
        let exe = std::env::current_exe().map_err(|e| Failure::new(RUNTIME, &e, None))?;
        let (hub, config) = spark_deploy_testbed::demo::prepare_with_engine(&info, &home, Some(&exe)).await.map_err(|e| Failure::new(RUNTIME, e.as_ref(), None))?;
        let path = info.state_dir.join("spark-deploy.toml");
        let text = toml::to_string_pretty(&config).map_err(|e| Failure::new(CONFIG, &e, None))?;
        fs_err::write(&path, format!("# Written by `spark-deploy demo` for the testbed.\n{text}")).map_err(|e| Failure::new(RUNTIME, &e, None))?;
        let config = validate(config, &home)?;
        super::run::key_agrees(&config)?;
        let (_ctx, result, interrupted) = super::run::run_logged(global, &config, &Plan::standard(&config)).await;
        drop(hub);
        match result {
            Ok(report) => {
                let hint = ApiHint::new(&config, Some(&path.display().to_string()));
                if global.json {
                    render::out(&serde_json::json!({ "report": report, "api": hint, "config": path }).to_string());
                } else {
                    render::out(&hint.text());
                }
                render::note(&format!("stop it with: spark-deploy --config {} down; then spark-deploy testbed down", path.display()));
                Ok(())
            }
            Err(e) => Err(super::run::failure(&e, interrupted, global.json)),
        }
    })
}
