//! `spark-deploy export lws|compose [--out FILE|DIR]`: the validated plan as a Kubernetes
//! `LeaderWorkerSet`, or one compose file per node.

use std::path::{Path, PathBuf};

use spark_deploy_core::config::ValidatedConfig;
use spark_deploy_core::engine::for_config;
use spark_deploy_core::export::{
    self, ExportError, FactOverrides, LwsOptions, facts_input::last_launch, lws,
};
use spark_deploy_core::facts::DeploymentFacts;

use super::Global;
use crate::exit::{self, Failure};
use crate::render;

/// What to export.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum ExportCommand {
    /// One LeaderWorkerSet (leaderworkerset.x-k8s.io/v1) for the whole group, as YAML.
    Lws {
        /// Write the YAML to FILE (default: standard output).
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
        /// The engine image's io.spark-deploy.content label (default: read from the head's Docker).
        #[arg(long, value_name = "SHA256")]
        image_content: Option<String>,
        /// Path of the spark-deploy binary on every node (the init containers' verifier).
        #[arg(long, value_name = "PATH", default_value = lws::DEFAULT_VERIFIER)]
        verifier: String,
        /// Extended resource of the RDMA device plugin.
        #[arg(long, value_name = "NAME", default_value = lws::DEFAULT_RDMA_RESOURCE)]
        rdma_resource: String,
        #[command(flatten)]
        facts: FactArgs,
    },
    /// One compose file per node reproducing its rank's container (not group-safe).
    Compose {
        /// Write `<node>.compose.yaml` files into DIR (default: all to standard output).
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
        #[command(flatten)]
        facts: FactArgs,
    },
}

/// Facts given explicitly (else from the last launch).
#[derive(Debug, clap::Args)]
pub(crate) struct FactArgs {
    /// The checkpoint's commit (40 hex).
    #[arg(long, value_name = "SHA")]
    model_commit: Option<String>,
    /// A node's fabric IPv4.
    #[arg(long, value_name = "NODE=IPV4")]
    fabric_addr: Vec<String>,
    /// A node's fabric netdev.
    #[arg(long, value_name = "NODE=IFNAME")]
    netdev: Vec<String>,
    /// A node's RoCE devices (comma-separated), or `none`.
    #[arg(long, value_name = "NODE=DEVS")]
    rdma_devices: Vec<String>,
    /// A node's RoCE v2 GID index, or `none`.
    #[arg(long, value_name = "NODE=N")]
    gid_index: Vec<String>,
}

fn usage(e: &ExportError) -> Failure {
    Failure::new(exit::USAGE, e, None)
}

fn runtime(e: &ExportError) -> Failure {
    Failure::new(exit::RUNTIME, e, None)
}

impl FactArgs {
    fn overrides(&self) -> Result<FactOverrides, Failure> {
        let mut o = FactOverrides::default();
        if let Some(c) = &self.model_commit {
            o.set_model_commit(c).map_err(|e| usage(&e))?;
        }
        for (flag, values) in [
            ("fabric-addr", &self.fabric_addr),
            ("netdev", &self.netdev),
            ("rdma-devices", &self.rdma_devices),
            ("gid-index", &self.gid_index),
        ] {
            for v in values {
                o.set(flag, v).map_err(|e| usage(&e))?;
            }
        }
        Ok(o)
    }

    fn facts(&self, config: &ValidatedConfig) -> Result<DeploymentFacts, Failure> {
        let overrides = self.overrides()?;
        let record = last_launch(config).map_err(|e| runtime(&e))?;
        export::facts_for_export(config, record.as_ref(), &overrides).map_err(|e| match e {
            ExportError::UnknownNode { .. } => usage(&e),
            e => runtime(&e),
        })
    }
}

fn image_content(config: &ValidatedConfig) -> Result<String, Failure> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::new(exit::RUNTIME, &e, None))?;
    rt.block_on(export::image_content(config))
        .map_err(|e| runtime(&e))
}

fn write(path: &Path, text: &str) -> Result<(), Failure> {
    export::write_file(path, text).map_err(|e| runtime(&e))
}

/// Runs `export`.
pub(crate) fn run(global: &Global, cmd: &ExportCommand) -> Result<(), Failure> {
    let config = global.load()?;
    let engine = for_config(&config);
    match cmd {
        ExportCommand::Lws {
            out,
            image_content: content,
            verifier,
            rdma_resource,
            facts,
        } => {
            let facts = facts.facts(&config)?;
            let image_content = match content {
                Some(c) => c.clone(),
                None => image_content(&config)?,
            };
            let opts = LwsOptions {
                image_content,
                verifier: verifier.clone(),
                rdma_resource: rdma_resource.clone(),
            };
            let text = export::lws_yaml(&config, engine.as_ref(), &facts, &opts)
                .map_err(|e| runtime(&e))?;
            match out {
                Some(path) => write(path, &text),
                None => {
                    render::out(&text);
                    Ok(())
                }
            }
        }
        ExportCommand::Compose { out, facts } => {
            let facts = facts.facts(&config)?;
            let files =
                export::compose_files(&config, engine.as_ref(), &facts).map_err(|e| runtime(&e))?;
            match out {
                Some(dir) => files
                    .iter()
                    .try_for_each(|f| write(&dir.join(&f.file_name), &f.yaml)),
                None => {
                    let docs: Vec<String> = files
                        .iter()
                        .map(|f| format!("# {}\n{}", f.file_name, f.yaml))
                        .collect();
                    render::out(&docs.join("---\n"));
                    Ok(())
                }
            }
        }
    }
}
