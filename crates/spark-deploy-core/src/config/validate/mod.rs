//! Validation: every field checked once, every problem reported with its path and allowed range.
//!
//! The checks mirror what the engine would refuse later, at a cost of an hour on a Spark: the pool
//! limit of the RoPE tables, the TP=2 kit's stream limit, the world size (the engine profile's
//! `EngineLimits`; docs/engine-contract.md lists them).
//!
//! The checks of each section are in a child module (`serving`, `engine`, `lifecycle`, `nodes`,
//! then `paths` across sections), run in that order; this module holds the checker, the result types and the `~` expansion.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::ConfigError;
use super::schema::DeploymentConfig;
use crate::engine::limits::EngineLimits;

mod engine;
mod lifecycle;
mod nodes;
mod paths;
mod serving;

/// One refused field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FieldProblem {
    /// Field path, e.g. `serving.context` or `nodes[1].ssh`.
    pub field: String,
    /// The offending value as written.
    pub value: String,
    /// What is allowed.
    pub allowed: String,
}

impl fmt::Display for FieldProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} = {}: allowed {}",
            self.field, self.value, self.allowed
        )
    }
}

/// A value that is accepted but risky.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConfigWarning {
    /// Field path.
    pub field: String,
    /// What the risk is and what to do.
    pub message: String,
}

impl fmt::Display for ConfigWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// A configuration that passed [`validate`]: `~` expanded, every value in range.
#[derive(Debug, Clone)]
pub struct ValidatedConfig {
    config: DeploymentConfig,
    warnings: Vec<ConfigWarning>,
}

impl ValidatedConfig {
    /// The validated values.
    #[must_use]
    pub fn config(&self) -> &DeploymentConfig {
        &self.config
    }

    /// Accepted but risky values.
    #[must_use]
    pub fn warnings(&self) -> &[ConfigWarning] {
        &self.warnings
    }

    /// The engine's limits for this profile.
    #[must_use]
    pub fn limits(&self) -> EngineLimits {
        EngineLimits::of(self.config.deployment.engine, self.config.nodes.len())
    }
}

struct Checker {
    problems: Vec<FieldProblem>,
    warnings: Vec<ConfigWarning>,
}

impl Checker {
    fn refuse(
        &mut self,
        field: impl Into<String>,
        value: impl fmt::Display,
        allowed: impl Into<String>,
    ) {
        self.problems.push(FieldProblem {
            field: field.into(),
            value: value.to_string(),
            allowed: allowed.into(),
        });
    }

    fn warn(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.warnings.push(ConfigWarning {
            field: field.into(),
            message: message.into(),
        });
    }

    fn range<T: PartialOrd + fmt::Display + Copy>(
        &mut self,
        field: &str,
        v: T,
        lo: T,
        hi: T,
        why: &str,
    ) {
        // Written so that a NaN (TOML's `nan`) is outside every range.
        if !(v >= lo && v <= hi) {
            self.refuse(field, v, format!("{lo}..={hi}{why}"));
        }
    }

    fn name(&mut self, field: &str, v: &str, max: usize) {
        let ok = !v.is_empty()
            && v.len() <= max
            && v.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !v.starts_with('-');
        if !ok {
            self.refuse(
                field,
                format!("{v:?}"),
                format!("1..={max} characters of [a-z0-9-], not starting with '-'"),
            );
        }
    }

    fn repo(&mut self, field: &str, v: &str) {
        // The Hub's rules for each part: [A-Za-z0-9-_.], not starting or ending with '-' or
        // '.', no `--` or `..`, at most 96 characters.
        let part_ok = |p: &str| {
            !p.is_empty()
                && p.len() <= 96
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
                && !p.starts_with(['-', '.'])
                && !p.ends_with(['-', '.'])
                && !p.contains("--")
                && !p.contains("..")
        };
        let ok = v
            .split_once('/')
            .is_some_and(|(o, n)| part_ok(o) && part_ok(n));
        if !ok {
            self.refuse(
                field,
                format!("{v:?}"),
                "a Hub repo id `owner/name` (each of [A-Za-z0-9-_.], not starting or ending with \
                 '-' or '.', no `--` or `..`)",
            );
        }
    }

    fn revision(&mut self, field: &str, v: &str) {
        if crate::commit::is_commit_id(v) {
            return;
        }
        match crate::commit::check_ref_name(v) {
            Err(why) => self.refuse(
                field,
                format!("{v:?}"),
                format!(
                    "a 40-hex commit or a branch/tag name by git's rules (this one {why}): \
                     no `..`, no leading or trailing '/', only A-Z a-z 0-9 - _ . /"
                ),
            ),
            Ok(()) => self.warn(field, format!("{v:?} is not a commit: it is resolved once at fetch and the commit is recorded; pin a 40-hex commit for reproducible deployments")),
        }
    }

    /// A path on a node: no NUL or other control character; empty only when `may_be_empty`
    /// (then `empty_means` says what empty stands for).
    fn path(&mut self, field: &str, v: &str, empty_means: Option<&str>) {
        let problem = if v.is_empty() {
            empty_means.is_none().then_some("is empty")
        } else if v.trim().is_empty() {
            Some("is only whitespace")
        } else if v.contains('\0') {
            Some("contains a NUL byte")
        } else if v.chars().any(char::is_control) {
            Some("contains a newline or another control character")
        } else {
            None
        };
        if let Some(problem) = problem {
            let empty = empty_means.map_or_else(String::new, |m| format!(", or \"\" for {m}"));
            self.refuse(
                field,
                format!("{v:?}"),
                format!("a path without control characters (this one {problem}){empty}"),
            );
        }
    }
}

/// Replaces a leading `~` by `home`.
#[must_use]
pub fn expand_home(path: &str, home: &Path) -> String {
    if path == "~" {
        home.display().to_string()
    } else if let Some(rest) = path.strip_prefix("~/") {
        home.join(rest).display().to_string()
    } else {
        path.to_owned()
    }
}

/// Validates `config`, expanding `~` with `home` (the head's home directory).
///
/// # Errors
///
/// [`ConfigError::Invalid`] listing every refused field with its allowed range.
pub fn validate(mut config: DeploymentConfig, home: &Path) -> Result<ValidatedConfig, ConfigError> {
    let mut c = Checker {
        problems: Vec::new(),
        warnings: Vec::new(),
    };
    let limits = EngineLimits::of(config.deployment.engine, config.nodes.len());

    c.name("deployment.name", &config.deployment.name, 40);

    serving::model(&mut c, &config);
    serving::serving(&mut c, &config, &limits);
    engine::engine(&mut c, &config, &limits);
    lifecycle::lifecycle(&mut c, &config);
    nodes::nodes(&mut c, &config, &limits);
    paths::paths(&mut c, &config);

    if !c.problems.is_empty() {
        return Err(ConfigError::Invalid {
            problems: c.problems,
        });
    }

    // Expand `~` with the head's home: the same user on every Spark unless paths are set per node.
    config.deployment.state_dir = expand_home(&config.deployment.state_dir, home);
    // Empty cache and token file: huggingface_hub's defaults, each on its own (the token stays
    // where `hf auth login` put it when only the cache is moved); the environment has filled
    // them already when it names them (`hf_env`).
    if config.hub.cache.is_empty() {
        config.hub.cache = super::hf_env::DEFAULT_HF_HOME.to_owned();
    }
    if config.hub.token_file.is_empty() {
        config.hub.token_file = super::hf_env::token_file_in(super::hf_env::DEFAULT_HF_HOME);
    }
    config.hub.cache = expand_home(&config.hub.cache, home);
    config.hub.ablit_cache = expand_home(&config.hub.ablit_cache, home);
    config.hub.token_file = expand_home(&config.hub.token_file, home);
    let api = expand_home(&config.serving.api_key_file, home);
    config.serving.api_key_file = if Path::new(&api).is_absolute() {
        api
    } else {
        PathBuf::from(&config.deployment.state_dir)
            .join(api)
            .display()
            .to_string()
    };
    let head_cache = config.hub.cache.clone();
    for node in &mut config.nodes {
        node.data_dir = expand_home(&node.data_dir, home);
        node.hf_cache = if node.hf_cache.is_empty() {
            head_cache.clone()
        } else {
            expand_home(&node.hf_cache, home)
        };
        node.identity_file = expand_home(&node.identity_file, home);
        node.known_hosts = expand_home(&node.known_hosts, home);
    }
    Ok(ValidatedConfig {
        config,
        warnings: c.warnings,
    })
}

#[cfg(test)]
mod tests;
