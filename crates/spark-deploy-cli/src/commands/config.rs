//! `spark-deploy config check`.

use clap::Subcommand;

use super::Global;
use crate::exit::Failure;
use crate::render;

#[derive(Subcommand, Debug)]
pub(crate) enum ConfigCommand {
    /// Validate the config file and the environment overrides.
    Check,
}

pub(crate) fn run(global: &Global, cmd: &ConfigCommand) -> Result<(), Failure> {
    match cmd {
        ConfigCommand::Check => {
            let config = global.load()?;
            let source = global.config_path().map_or_else(
                || "built-in defaults".to_owned(),
                |p| p.display().to_string(),
            );
            if global.json {
                let v = serde_json::json!({ "ok": true, "source": source, "warnings": config.warnings() });
                render::out(&v.to_string());
            } else {
                render::warnings(config.warnings());
                render::out(&format!(
                    "config OK ({source}): {} nodes, context {}, parallel {}",
                    config.config().nodes.len(),
                    config.config().serving.context,
                    config.config().serving.parallel
                ));
            }
            Ok(())
        }
    }
}
