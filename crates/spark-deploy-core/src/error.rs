//! The top-level error: one variant per module error, each keeping its source.

/// Any spark-deploy error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Loading or validating the configuration.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
}

impl Error {
    /// What the user can do about it, when the error knows.
    #[must_use]
    pub fn remedy(&self) -> Option<String> {
        match self {
            Self::Config(e) => e.remedy(),
        }
    }
}
