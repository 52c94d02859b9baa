//! Typed deployment configuration: one TOML file plus environment overrides, validated once.
//!
//! Flow: [`load`] reads the file (or the defaults), applies the environment under the recipe's
//! names ([`env::ENV_OVERRIDES`]), then [`validate::validate`] turns it into a [`ValidatedConfig`],
//! the only input a [`crate::plan::Plan`] accepts ("parse, don't validate").

pub mod env;
pub mod hf_env;
pub mod recipe;
pub mod reference;
pub mod schema;
pub mod template;
pub mod validate;

use std::path::{Path, PathBuf};

pub use schema::{
    ApiAuth, DeploymentConfig, EngineProfileName, HealPolicy, NodeConfig, PreparePolicy,
    WatchSection, WorkerStorage, repo_is_remote,
};
pub use validate::{ConfigWarning, FieldProblem, ValidatedConfig, validate};

/// Errors of loading, overriding and validating a configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid TOML for the schema (unknown key, wrong type).
    #[error(
        "config file {path}: {message}\n  remedy: compare with `spark-deploy init --stdout` and the README's config reference"
    )]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message, with line, column and key.
        message: String,
    },
    /// An environment override has a bad value.
    #[error("environment variable {var} (sets {field}) = {value:?}: expected {expected}")]
    Env {
        /// The variable.
        var: &'static str,
        /// The field it sets.
        field: &'static str,
        /// The value (`***` for secrets).
        value: String,
        /// What would be accepted.
        expected: String,
    },
    /// A value imported from a bash recipe is out of form or refused by validation.
    #[error("{}:{}: {}={:?} (sets {}): expected {}", .0.file.display(), .0.line, .0.var, .0.value, .0.field, .0.expected)]
    Recipe(Box<RecipeProblem>),
    /// A recipe file is present but cannot be read (or is a FIFO, a device, a directory).
    #[error("cannot read recipe file {}: {error}", path.display())]
    RecipeRead {
        /// The file.
        path: PathBuf,
        /// The I/O error or the refusal.
        error: std::io::Error,
    },
    /// `init --from-recipe` was given a directory holding no recipe.
    #[error("{} holds no bash recipe: neither .env nor scripts/local.sh is there", dir.display())]
    NoRecipe {
        /// The directory given.
        dir: PathBuf,
    },
    /// One or more fields hold values the deployment or the engine would refuse.
    #[error("invalid configuration:\n{}", problems.iter().map(|p| format!("  - {p}")).collect::<Vec<_>>().join("\n"))]
    Invalid {
        /// Every problem found, each naming its field.
        problems: Vec<FieldProblem>,
    },
    /// A file could not be written (init).
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// Where a refused recipe value is and what it set ([`ConfigError::Recipe`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecipeProblem {
    /// The recipe file.
    pub file: PathBuf,
    /// The 1-based line of the assignment.
    pub line: usize,
    /// The variable.
    pub var: String,
    /// The field it sets.
    pub field: String,
    /// The value (`***` for secrets).
    pub value: String,
    /// What would be accepted.
    pub expected: String,
}

impl ConfigError {
    /// What the user can do about it.
    #[must_use]
    pub fn remedy(&self) -> Option<String> {
        match self {
            Self::Invalid { .. } => Some(
                "fix the named fields (allowed ranges shown), then run `spark-deploy config check`"
                    .into(),
            ),
            Self::Read { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                Some("create one with `spark-deploy init`".into())
            }
            // A refusal of `safe_fs` carries its own remedy.
            Self::Read { source, .. } if crate::safe_fs::refusal(source).is_some() => None,
            Self::Read { .. } => Some(
                "point --config (SPARK_DEPLOY_CONFIG) at a readable regular file of at most 1 MiB"
                    .into(),
            ),
            Self::RecipeRead { .. } => Some(
                "make it a readable regular file of at most 1 MiB, or remove it from the recipe"
                    .into(),
            ),
            Self::Env { var, .. } => Some(format!("fix or unset {var} in the environment")),
            Self::Recipe(p) => Some(format!(
                "fix or remove {} at {}:{}, then run `spark-deploy init --from-recipe` again",
                p.var,
                p.file.display(),
                p.line
            )),
            Self::NoRecipe { .. } => Some(
                "give the recipe's top directory (the one holding .env and scripts/local.sh)"
                    .into(),
            ),
            Self::Parse { .. } | Self::Write { .. } => None,
        }
    }

    /// The first field path this error names, if any.
    #[must_use]
    pub fn field(&self) -> Option<String> {
        match self {
            Self::Env { field, .. } => Some((*field).to_owned()),
            Self::Recipe(p) => Some(p.field.clone()),
            Self::Invalid { problems } => problems.first().map(|p| p.field.clone()),
            Self::Parse { message, .. } => message.lines().find_map(|l| {
                l.split_once("unknown field `")
                    .map(|(_, r)| r.split('`').next().unwrap_or("").to_owned())
            }),
            _ => None,
        }
    }
}

/// Parses a TOML document into a config (no environment, no validation).
///
/// # Errors
///
/// [`ConfigError::Parse`] with line, column and key for syntax errors, unknown keys and wrong types.
pub fn parse(text: &str, origin: &Path) -> Result<DeploymentConfig, ConfigError> {
    toml::from_str(text).map_err(|e| ConfigError::Parse {
        path: origin.to_owned(),
        message: e.to_string().trim_end().to_owned(),
    })
}

/// Reads `path` (or the defaults when `None`) and applies the process environment.
///
/// # Errors
///
/// [`ConfigError::Read`], [`ConfigError::Parse`], [`ConfigError::Env`].
pub fn load(path: Option<&Path>) -> Result<DeploymentConfig, ConfigError> {
    load_with_env(path, &|k| std::env::var(k).ok())
}

/// [`load`] with an explicit environment lookup (tests, Python dicts).
///
/// # Errors
///
/// As [`load`].
pub fn load_with_env(
    path: Option<&Path>,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<DeploymentConfig, ConfigError> {
    load_explained(path, lookup).map(|(config, _)| config)
}

/// [`load_with_env`], also saying which variable set which key (`config check`).
///
/// # Errors
///
/// As [`load`].
pub fn load_explained(
    path: Option<&Path>,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<(DeploymentConfig, Vec<env::AppliedOverride>), ConfigError> {
    let mut config = match path {
        Some(p) => {
            let text = crate::safe_fs::read_to_string_capped(p, crate::safe_fs::TEXT_CAP).map_err(
                |source| ConfigError::Read {
                    path: p.to_owned(),
                    source,
                },
            )?;
            parse(&text, p)?
        }
        None => DeploymentConfig::default(),
    };
    let applied = env::apply_env(&mut config, lookup)?;
    Ok((config, applied))
}
