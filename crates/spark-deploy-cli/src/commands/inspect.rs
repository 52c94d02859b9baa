//! `status` and `logs`: read-only views of a running deployment.

use std::sync::Arc;

use clap::Args;
use spark_deploy_core::container::rank_container_name;
use spark_deploy_core::event::Recorder;
use spark_deploy_core::lifecycle::status::status;
use spark_deploy_core::run::Context;

use super::Global;
use crate::exit::{Failure, RUNTIME};
use crate::render;

fn context(global: &Global) -> Result<(tokio::runtime::Runtime, Context), Failure> {
    let config = global.load()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::new(RUNTIME, &e, None))?;
    Ok((rt, Context::new(config, Arc::new(Recorder::default()))))
}

pub(crate) fn run_status(global: &Global) -> Result<(), Failure> {
    let (rt, ctx) = context(global)?;
    let s = rt.block_on(status(&ctx));
    if global.json {
        render::out(&serde_json::to_string_pretty(&s).unwrap_or_default());
        return Ok(());
    }
    let mut out = format!(
        "deployment {}: {}\n",
        ctx.config().config().deployment.name,
        s.overall
    );
    for r in &s.ranks {
        let mem = r
            .mem_available_gib
            .map_or_else(|| "?".to_owned(), |m| format!("{m:.1} GiB"));
        out.push_str(&format!(
            "  rank {} on {}: {} {} (since {}) fingerprint {} — MemAvailable {mem}\n",
            r.rank,
            r.node,
            r.container,
            r.state,
            r.started_at.as_deref().unwrap_or("-"),
            r.fingerprint
                .as_deref()
                .map_or("-", |f| &f[..f.len().min(12)])
        ));
    }
    match &s.served {
        Ok(ids) => out.push_str(&format!("  serving: {}\n", ids.join(", "))),
        Err(e) => out.push_str(&format!("  API: {e}\n")),
    }
    render::out(&out);
    Ok(())
}

#[derive(Args, Debug)]
pub(crate) struct LogsArgs {
    /// Rank whose log to print (default: every rank).
    #[arg(long)]
    rank: Option<usize>,
    /// Last N lines.
    #[arg(long, default_value_t = 100)]
    tail: usize,
}

pub(crate) fn run_logs(global: &Global, args: &LogsArgs) -> Result<(), Failure> {
    let (rt, ctx) = context(global)?;
    let c = ctx.config().config().clone();
    rt.block_on(async {
        for (rank, node) in c.nodes.iter().enumerate() {
            if args.rank.is_some_and(|r| r != rank) {
                continue;
            }
            let name = rank_container_name(&c.deployment.name, rank);
            let docker = ctx
                .docker(rank)
                .await
                .map_err(|e| Failure::new(RUNTIME, &e, None))?;
            let text = docker
                .logs(&name, true, Some(args.tail))
                .await
                .map_err(|e| {
                    Failure::new(
                        RUNTIME,
                        &e,
                        Some(
                            "is the deployment up? saved logs are in the node's data_dir/logs"
                                .into(),
                        ),
                    )
                })?;
            render::out(&format!(
                "==> rank {rank} ({name} on {}) <==\n{}",
                node.name,
                String::from_utf8_lossy(&text)
            ));
        }
        Ok(())
    })
}
