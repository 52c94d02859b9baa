//! The one place that maps the configuration's profile name to its implementation.

use std::sync::Arc;

use super::Engine;
use crate::config::{EngineProfileName, ValidatedConfig};

/// The engine of `profile`.
#[must_use]
pub fn for_profile(profile: EngineProfileName) -> Arc<dyn Engine> {
    match profile {
        EngineProfileName::TensorfoldDsv41 => Arc::new(super::tensorfold::TensorfoldDsv41::TP2),
        EngineProfileName::TensorfoldDsv41Tp4 => Arc::new(super::tensorfold::TensorfoldDsv41::TP4),
    }
}

/// The engine `config` names (`deployment.engine`).
#[must_use]
pub fn for_config(config: &ValidatedConfig) -> Arc<dyn Engine> {
    for_profile(config.config().deployment.engine)
}
