//! One module per command.

pub(crate) mod bench;
pub(crate) mod bundle;
pub(crate) mod config;
#[cfg(feature = "testbed")]
pub(crate) mod demo;
pub(crate) mod export;
pub(crate) mod init;
pub(crate) mod inspect;
pub(crate) mod plan;
pub(crate) mod rank_cache;
pub(crate) mod run;
pub(crate) mod service;
#[cfg(feature = "testbed")]
pub(crate) mod testbed;
pub(crate) mod upgrade;
pub(crate) mod validate;
pub(crate) mod watch;

use std::path::{Path, PathBuf};

use spark_deploy_core::config::{self as cfg, ValidatedConfig};

use crate::exit::Failure;

/// Options every command sees.
pub(crate) struct Global {
    pub(crate) config: Option<PathBuf>,
    pub(crate) json: bool,
    /// `fetch --revision`: replaces `model.revision` (after the file and the environment).
    pub(crate) model_revision: Option<String>,
    /// `-q` / `-v`.
    pub(crate) verbosity: crate::events::Verbosity,
}

/// The default config file name in the working directory.
pub(crate) const DEFAULT_FILE: &str = "spark-deploy.toml";

impl Global {
    /// The config file in use: `--config`, else `./spark-deploy.toml` when present, else defaults.
    pub(crate) fn config_path(&self) -> Option<PathBuf> {
        self.config.clone().or_else(|| {
            Path::new(DEFAULT_FILE)
                .exists()
                .then(|| PathBuf::from(DEFAULT_FILE))
        })
    }

    /// The `--config FILE` argument a follow-up command needs (`None` for the default file).
    pub(crate) fn config_arg(&self) -> Option<String> {
        self.config.as_ref().map(|p| p.display().to_string())
    }

    /// Loads, applies the environment and validates.
    pub(crate) fn load(&self) -> Result<ValidatedConfig, Failure> {
        let mut raw = cfg::load(self.config_path().as_deref())?;
        if let Some(rev) = &self.model_revision {
            raw.model.revision.clone_from(rev);
        }
        let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/"), PathBuf::from);
        // Log lines are scrubbed of the config's secrets as events are.
        crate::logging::redact(raw.secrets());
        Ok(cfg::validate(raw, &home)?)
    }
}

/// `spark-deploy api-key`: prints the key on request (never in logs or events).
pub(crate) fn api_key(global: &Global) -> Result<(), Failure> {
    use spark_deploy_core::lifecycle::api_key::{self, ApiKeyError};
    let config = global.load()?;
    let key = api_key::current(&config.config().serving).map_err(|e| {
        let (code, remedy) = match &e {
            // Not a regular file: the refusal carries its remedy.
            ApiKeyError::Io { source, .. }
                if spark_deploy_core::safe_fs::refusal(source).is_some() =>
            {
                (crate::exit::CONFIG, None)
            }
            ApiKeyError::Io { .. } => (
                crate::exit::RUNTIME,
                Some("run `spark-deploy up` first: it generates the key".into()),
            ),
            // The message carries its remedy.
            _ => (crate::exit::CONFIG, None),
        };
        Failure::new(code, &e, remedy)
    })?;
    if global.json {
        crate::render::out(&serde_json::json!({ "api_key": key.expose() }).to_string());
    } else {
        crate::render::out(key.expose());
    }
    Ok(())
}
