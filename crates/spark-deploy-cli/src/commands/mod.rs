//! One module per command.

pub(crate) mod config;
pub(crate) mod init;
pub(crate) mod plan;
pub(crate) mod rank_cache;
pub(crate) mod run;
pub(crate) mod testbed;

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
