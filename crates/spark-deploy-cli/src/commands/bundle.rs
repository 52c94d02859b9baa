//! `spark-deploy support-bundle [--out PATH]`: one `.tar.gz` to attach to a bug report.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use spark_deploy_core::event::Recorder;
use spark_deploy_core::run::Context;

use super::Global;
use crate::exit::{Failure, RUNTIME};
use crate::render;

#[derive(Args, Debug)]
pub(crate) struct BundleArgs {
    /// Where to write the archive (default: `<state_dir>/bundles/<name>-<time>.tar.gz`).
    #[arg(long, value_name = "PATH")]
    out: Option<PathBuf>,
}

pub(crate) fn run(global: &Global, args: &BundleArgs) -> Result<(), Failure> {
    let config = global.load()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::new(RUNTIME, &e, None))?;
    let ctx = Context::new(config, Arc::new(Recorder::default()));
    let report = rt
        .block_on(spark_deploy_core::bundle::write(&ctx, args.out.as_deref()))
        .map_err(|e| Failure::new(RUNTIME, &e, None))?;
    if global.json {
        render::out(&serde_json::to_string(&report).unwrap_or_default());
    } else {
        let mut out = format!(
            "wrote {} ({} members; the HF token and the API key are redacted)\n",
            report.path.display(),
            report.members.len()
        );
        for a in &report.absent {
            out.push_str(&format!("  absent: {} — {}\n", a.name, a.why));
        }
        render::out(&out);
    }
    Ok(())
}
