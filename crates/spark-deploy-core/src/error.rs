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
            Self::Config(crate::config::ConfigError::Invalid { .. }) => {
                Some("fix the named fields (allowed ranges shown), then run `spark-deploy config check`".into())
            }
            Self::Config(crate::config::ConfigError::Read { .. }) => Some("create one with `spark-deploy init`".into()),
            Self::Config(_) => None,
        }
    }
}
