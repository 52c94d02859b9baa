//! `spark-deploy config check`.

use std::path::PathBuf;

use clap::Subcommand;
use spark_deploy_core::config::{self as cfg, ValidatedConfig, env::AppliedOverride};
use spark_deploy_core::hub::{HfToken, TokenSource};

use super::Global;
use crate::exit::Failure;
use crate::render;

#[derive(Subcommand, Debug)]
pub(crate) enum ConfigCommand {
    /// Validate the config file and the environment overrides; show which variable set which key
    /// and where the Hub cache and token come from.
    Check,
}

pub(crate) fn run(global: &Global, cmd: &ConfigCommand) -> Result<(), Failure> {
    match cmd {
        ConfigCommand::Check => {
            let (raw, overrides) =
                cfg::load_explained(global.config_path().as_deref(), &|k| std::env::var(k).ok())?;
            let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/"), PathBuf::from);
            let config = cfg::validate(raw, &home)?;
            let source = global.config_path().map_or_else(
                || "built-in defaults".to_owned(),
                |p| p.display().to_string(),
            );
            let hub = hub_settings(&config);
            if global.json {
                let v = serde_json::json!({
                    "ok": true,
                    "source": source,
                    "warnings": config.warnings(),
                    "overrides": overrides,
                    "hub": hub,
                });
                render::out(&v.to_string());
            } else {
                render::warnings(config.warnings());
                let mut text = format!(
                    "config OK ({source}): {} nodes, context {}, parallel {}\n",
                    config.config().nodes.len(),
                    config.config().serving.context,
                    config.config().serving.parallel
                );
                text.push_str(&overrides_text(&overrides));
                text.push_str(&hub.text());
                render::out(&text);
            }
            Ok(())
        }
    }
}

/// One line per variable that set a key: `NAME=value -> key`, with a weaker one marked as
/// overruled by the variable that decides.
fn overrides_text(overrides: &[AppliedOverride]) -> String {
    if overrides.is_empty() {
        return "environment overrides: none\n".to_owned();
    }
    let mut s = String::from("environment overrides:\n");
    for o in overrides {
        s.push_str(&format!("  {}={} -> {}", o.var, o.value, o.key));
        if let Some(by) = o.shadowed_by {
            s.push_str(&format!(" (overruled by {by})"));
        }
        s.push('\n');
    }
    s
}

/// The Hub settings in effect: where the cache is, where the token comes from (never the token).
#[derive(serde::Serialize)]
struct HubSettings {
    /// The cache root (`hub.cache`).
    cache: String,
    /// The hub cache below it, where `huggingface_hub` with the same environment looks.
    hub_cache: String,
    token_file: String,
    token: TokenSource,
    endpoint: String,
    offline: bool,
}

fn hub_settings(config: &ValidatedConfig) -> HubSettings {
    let h = &config.config().hub;
    HubSettings {
        cache: h.cache.clone(),
        hub_cache: spark_deploy_core::steps::hub_dir(&h.cache)
            .display()
            .to_string(),
        token_file: h.token_file.clone(),
        token: HfToken::configured(h).1,
        endpoint: spark_deploy_core::secret::redact_url(&h.endpoint),
        offline: h.offline,
    }
}

impl HubSettings {
    fn text(&self) -> String {
        let token = match &self.token {
            TokenSource::Environment => "from the environment (HF_TOKEN)".to_owned(),
            TokenSource::File { path } => format!("from {path}"),
            TokenSource::Absent { looked_in } => format!("none (no HF_TOKEN; {looked_in} absent)"),
        };
        let endpoint = if self.endpoint.is_empty() {
            "the Hugging Face Hub"
        } else {
            &self.endpoint
        };
        format!(
            "hub: cache {} (hub cache {}), token {token}, endpoint {endpoint}{}\n",
            self.cache,
            self.hub_cache,
            if self.offline {
                ", offline (no network)"
            } else {
                ""
            }
        )
    }
}
