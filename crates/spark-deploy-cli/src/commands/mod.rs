//! One module per command.

pub(crate) mod bench;
pub(crate) mod config;
#[cfg(feature = "testbed")]
pub(crate) mod demo;
pub(crate) mod init;
pub(crate) mod inspect;
pub(crate) mod plan;
pub(crate) mod rank_cache;
pub(crate) mod run;
#[cfg(feature = "testbed")]
pub(crate) mod testbed;
pub(crate) mod validate;

use std::path::{Path, PathBuf};

use spark_deploy_core::config::{self as cfg, ValidatedConfig};

use crate::exit::Failure;

/// Options every command sees.
pub(crate) struct Global {
    pub(crate) config: Option<PathBuf>,
    pub(crate) json: bool,
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

    /// Loads, applies the environment and validates.
    pub(crate) fn load(&self) -> Result<ValidatedConfig, Failure> {
        let raw = cfg::load(self.config_path().as_deref())?;
        let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/"), PathBuf::from);
        Ok(cfg::validate(raw, &home)?)
    }
}

/// `spark-deploy api-key`: prints the key on request (never in logs or events).
pub(crate) fn api_key(global: &Global) -> Result<(), Failure> {
    let config = global.load()?;
    let path = std::path::Path::new(&config.config().serving.api_key_file);
    let key = spark_deploy_core::lifecycle::api_key::read(path).map_err(|e| {
        Failure::new(
            crate::exit::RUNTIME,
            &e,
            Some("run `spark-deploy up` first: it generates the key".into()),
        )
    })?;
    crate::render::out(key.expose());
    Ok(())
}
