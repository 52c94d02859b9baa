//! Environment overrides under the original bash recipe's names, and the Hugging Face variables
//! as `huggingface_hub` reads them (precedence and reading rules in [`super::hf_env`]).
//!
//! One table, [`ENV_OVERRIDES`], drives both the overrides and the README's reference, so the
//! documented list is the applied list. The environment wins over the file, as it did for the bash recipe.

use std::net::Ipv4Addr;

use super::ConfigError;
use super::hf_env;
use super::schema::{DeploymentConfig, NodeConfig, PreparePolicy, WorkerStorage};
use crate::secret::Secret;

/// One environment variable and the config field it sets.
pub struct EnvOverride {
    /// Variable name, as the recipe spells it.
    pub var: &'static str,
    /// Config field path it sets.
    pub field: &'static str,
    /// Whether the value is a secret (never echoed in errors or `config check`).
    pub secret: bool,
    /// How the value is read.
    pub reading: Reading,
    /// Sets the field; `Ok(false)` when the variable does not apply (it only fills a key the
    /// file left empty).
    apply: fn(&mut DeploymentConfig, &str) -> Result<bool, String>,
}

/// How a variable's value is read before it is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    /// As given: the recipe's variables, where an empty value can mean something (`NFS_VOLUME=`).
    Plain,
    /// As `huggingface_hub` reads its variables: an empty value counts as unset.
    Hf,
    /// A Hugging Face path: empty is unset, `$VAR` / `${VAR}` are expanded from the environment
    /// and a relative path is made absolute (`~` is expanded at validation).
    HfPath,
}

/// One variable that set a key, as `config check` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct AppliedOverride {
    /// The variable.
    pub var: &'static str,
    /// The config key it set.
    pub key: &'static str,
    /// Its value as given; `***` for a secret.
    pub value: String,
    /// A stronger variable that set the same key too, and so decides it.
    pub shadowed_by: Option<&'static str>,
}

/// Variables whose value is passed to both ranks unchanged, only when set (recipe switches with no public engine source: passed through, never interpreted).
pub const OPAQUE_SWITCHES: [&str; 4] = [
    "TF_DS_ENGRAM_LANES",
    "TF_DS_IDX_SPLIT",
    "PREFILL_INTERLEAVE_MS",
    "TF_DS_IMAGE_CACHE",
];

macro_rules! ov {
    (@make $var:literal, $field:literal, $secret:literal, $reading:ident, |$c:ident, $v:ident| $body:expr) => {
        EnvOverride {
            var: $var,
            field: $field,
            secret: $secret,
            reading: Reading::$reading,
            apply: |$c, $v| {
                let r: Result<(), String> = $body;
                r.map(|()| true)
            },
        }
    };
    ($var:literal, $field:literal, |$c:ident, $v:ident| $body:expr) => {
        ov!(@make $var, $field, false, Plain, |$c, $v| $body)
    };
    (secret $var:literal, $field:literal, |$c:ident, $v:ident| $body:expr) => {
        ov!(@make $var, $field, true, Plain, |$c, $v| $body)
    };
    (hf $var:literal, $field:literal, |$c:ident, $v:ident| $body:expr) => {
        ov!(@make $var, $field, false, Hf, |$c, $v| $body)
    };
    (hf secret $var:literal, $field:literal, |$c:ident, $v:ident| $body:expr) => {
        ov!(@make $var, $field, true, Hf, |$c, $v| $body)
    };
    (hf path $var:literal, $field:literal, |$c:ident, $v:ident| $body:expr) => {
        ov!(@make $var, $field, false, HfPath, |$c, $v| $body)
    };
    // A path that only fills a key the file left empty: the body says whether it did.
    (hf fill $var:literal, $field:literal, |$c:ident, $v:ident| $body:expr) => {
        EnvOverride {
            var: $var,
            field: $field,
            secret: false,
            reading: Reading::HfPath,
            apply: |$c, $v| $body,
        }
    };
}

fn num<T: std::str::FromStr>(v: &str) -> Result<T, String> {
    v.trim().parse().map_err(|_| "a whole number".to_owned())
}

fn flag(v: &str) -> Result<bool, String> {
    match v.trim() {
        "1" | "true" | "yes" => Ok(true),
        "0" | "false" | "no" | "" => Ok(false),
        _ => Err("0 or 1".to_owned()),
    }
}

fn worker(c: &mut DeploymentConfig) -> &mut NodeConfig {
    if c.nodes.len() < 2 {
        c.nodes.push(NodeConfig::worker("worker-1", ""));
    }
    &mut c.nodes[1]
}

fn switch(c: &mut DeploymentConfig, name: &str, v: &str) -> Result<(), String> {
    c.engine.switches.insert(name.to_owned(), v.to_owned());
    Ok(())
}

/// Every recognised variable, in documentation order.
pub static ENV_OVERRIDES: &[EnvOverride] = &[
    ov!("WORKER", "nodes[1].ssh", |c, v| {
        worker(c).ssh = v.trim().to_owned();
        Ok(())
    }),
    ov!("FABRIC_PEER", "nodes[1].fabric_addr", |c, v| {
        worker(c).fabric_addr = if v.trim().is_empty() {
            None
        } else {
            Some(
                v.trim()
                    .parse::<Ipv4Addr>()
                    .map_err(|_| "a dotted-quad IPv4 address".to_owned())?,
            )
        };
        Ok(())
    }),
    ov!("WORKER_HF_CACHE", "nodes[1].hf_cache", |c, v| {
        worker(c).hf_cache = v.to_owned();
        Ok(())
    }),
    ov!("MODEL_ID", "model.id", |c, v| {
        c.model.id = v.trim().to_owned();
        Ok(())
    }),
    ov!("MODEL_REVISION", "model.revision", |c, v| {
        c.model.revision = v.trim().to_owned();
        Ok(())
    }),
    ov!("SERVED_NAME", "model.served_name", |c, v| {
        c.model.served_name = v.trim().to_owned();
        Ok(())
    }),
    ov!("ABLIT", "model.ablit", |c, v| {
        c.model.ablit = flag(v)?;
        Ok(())
    }),
    ov!("ABLIT_ID", "model.ablit_id", |c, v| {
        c.model.ablit_id = v.trim().to_owned();
        Ok(())
    }),
    ov!("ABLIT_REVISION", "model.ablit_revision", |c, v| {
        c.model.ablit_revision = v.trim().to_owned();
        Ok(())
    }),
    // The Hugging Face variables, weakest first (a later one that is set wins), in
    // huggingface_hub's order; HF_CACHE, the recipe's name for the cache root, sits above HF_HOME
    // as in the recipe. See `hf_env`.
    ov!(hf fill "XDG_CACHE_HOME", "hub.cache", |c, v| {
        let fill = c.hub.cache.is_empty();
        if fill {
            c.hub.cache = hf_env::hf_home_in(v);
        }
        Ok(fill)
    }),
    ov!(hf fill "XDG_CACHE_HOME", "hub.token_file", |c, v| {
        let fill = c.hub.token_file.is_empty();
        if fill {
            c.hub.token_file = hf_env::token_file_in(&hf_env::hf_home_in(v));
        }
        Ok(fill)
    }),
    ov!(hf path "HF_HOME", "hub.cache", |c, v| {
        c.hub.cache = v.to_owned();
        Ok(())
    }),
    ov!(hf path "HF_HOME", "hub.token_file", |c, v| {
        c.hub.token_file = hf_env::token_file_in(v);
        Ok(())
    }),
    ov!(hf path "HF_CACHE", "hub.cache", |c, v| {
        c.hub.cache = v.to_owned();
        Ok(())
    }),
    ov!(hf path "HUGGINGFACE_HUB_CACHE", "hub.cache", |c, v| {
        c.hub.cache = hf_env::root_of_hub_cache(v)?;
        Ok(())
    }),
    ov!(hf path "HF_HUB_CACHE", "hub.cache", |c, v| {
        c.hub.cache = hf_env::root_of_hub_cache(v)?;
        Ok(())
    }),
    ov!(hf path "HF_TOKEN_PATH", "hub.token_file", |c, v| {
        c.hub.token_file = v.to_owned();
        Ok(())
    }),
    ov!(hf "HF_ENDPOINT", "hub.endpoint", |c, v| {
        c.hub.endpoint = v.trim().trim_end_matches('/').to_owned();
        Ok(())
    }),
    ov!(hf secret "HUGGING_FACE_HUB_TOKEN", "hub.token", |c, v| {
        c.hub.token = hf_env::clean_token(v).map(Secret::new);
        Ok(())
    }),
    ov!(hf secret "HF_TOKEN", "hub.token", |c, v| {
        c.hub.token = hf_env::clean_token(v).map(Secret::new);
        Ok(())
    }),
    ov!(hf "TRANSFORMERS_OFFLINE", "hub.offline", |c, v| {
        c.hub.offline = hf_env::is_true(v);
        Ok(())
    }),
    ov!(hf "HF_HUB_OFFLINE", "hub.offline", |c, v| {
        c.hub.offline = hf_env::is_true(v);
        Ok(())
    }),
    ov!("CONTEXT", "serving.context", |c, v| {
        c.serving.context = num(v)?;
        Ok(())
    }),
    ov!("PARALLEL", "serving.parallel", |c, v| {
        c.serving.parallel = num(v)?;
        Ok(())
    }),
    ov!("PORT", "serving.port", |c, v| {
        c.serving.port = num(v)?;
        Ok(())
    }),
    ov!("MAX_TOKENS", "serving.max_tokens", |c, v| {
        c.serving.max_tokens = num(v)?;
        Ok(())
    }),
    ov!("THINKING", "serving.thinking", |c, v| {
        c.serving.thinking = flag(v)?;
        Ok(())
    }),
    ov!(secret "SPARK_DEPLOY_API_KEY", "serving.api_key", |c, v| {
        c.serving.api_key = (!v.trim().is_empty()).then(|| Secret::new(v.trim()));
        Ok(())
    }),
    ov!("IMAGE", "engine.image", |c, v| {
        c.engine.image = v.trim().to_owned();
        Ok(())
    }),
    ov!("MASTER_PORT", "engine.rendezvous_port", |c, v| {
        c.engine.rendezvous_port = num(v)?;
        Ok(())
    }),
    ov!(
        "TF_DS_ENGRAM_LANES",
        "engine.switches.TF_DS_ENGRAM_LANES",
        |c, v| switch(c, "TF_DS_ENGRAM_LANES", v)
    ),
    ov!(
        "TF_DS_IDX_SPLIT",
        "engine.switches.TF_DS_IDX_SPLIT",
        |c, v| switch(c, "TF_DS_IDX_SPLIT", v)
    ),
    ov!(
        "PREFILL_INTERLEAVE_MS",
        "engine.switches.PREFILL_INTERLEAVE_MS",
        |c, v| switch(c, "PREFILL_INTERLEAVE_MS", v)
    ),
    ov!(
        "TF_DS_IMAGE_CACHE",
        "engine.switches.TF_DS_IMAGE_CACHE",
        |c, v| switch(c, "TF_DS_IMAGE_CACHE", v)
    ),
    ov!("WORKER_WEIGHTS", "deployment.worker_storage", |c, v| {
        c.deployment.worker_storage = match v.trim() {
            "nfs" => WorkerStorage::Nfs,
            "copy" => WorkerStorage::Copy,
            _ => return Err("nfs or copy".to_owned()),
        };
        Ok(())
    }),
    ov!("NFS_VOLUME", "storage.nfs_volume", |c, v| {
        // The recipe's rules: an empty NFS_VOLUME means a local copy on the worker; an absolute
        // path is a tree on the worker that Docker bind-mounts (local mode).
        if v.trim().is_empty() {
            c.deployment.worker_storage = WorkerStorage::Copy;
        } else if v.trim().starts_with('/') {
            c.deployment.worker_storage = WorkerStorage::Local;
            c.storage.worker_tree = v.trim().to_owned();
        } else {
            c.deployment.worker_storage = WorkerStorage::Nfs;
            c.storage.nfs_volume = v.trim().to_owned();
        }
        Ok(())
    }),
    ov!("HEAD_NFS_SERVER", "storage.head_nfs_server", |c, v| {
        c.storage.head_nfs_server = v.trim().to_owned();
        Ok(())
    }),
    ov!("PREPARE", "lifecycle.prepare", |c, v| {
        c.lifecycle.prepare = match v.trim() {
            "auto" | "" => PreparePolicy::Auto,
            "1" | "always" => PreparePolicy::Always,
            "0" | "never" => PreparePolicy::Never,
            _ => return Err("auto, 1 or 0".to_owned()),
        };
        Ok(())
    }),
    ov!("MIN_AVAIL_GIB", "lifecycle.min_avail_gib", |c, v| {
        c.lifecycle.min_avail_gib = num(v)?;
        Ok(())
    }),
    ov!("LOG_KEEP", "lifecycle.log_keep", |c, v| {
        c.lifecycle.log_keep = num(v)?;
        Ok(())
    }),
    ov!("WAIT_TIMEOUT", "lifecycle.ready_timeout_s", |c, v| {
        c.lifecycle.ready_timeout_s = num(v)?;
        Ok(())
    }),
    ov!("STOP_TIMEOUT", "lifecycle.stop_timeout_s", |c, v| {
        c.lifecycle.stop_timeout_s = num(v)?;
        Ok(())
    }),
];

/// Applies every variable `lookup` returns a value for, in table order (so of two variables
/// setting one key, the later in the table wins), and says which set what.
///
/// # Errors
///
/// [`ConfigError::Env`] naming the variable and the expected form; a secret's value is never echoed.
pub fn apply_env(
    config: &mut DeploymentConfig,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<AppliedOverride>, ConfigError> {
    let mut applied: Vec<AppliedOverride> = Vec::new();
    for ov in ENV_OVERRIDES {
        let Some(value) = lookup(ov.var) else {
            continue;
        };
        if ov.reading != Reading::Plain && value.trim().is_empty() {
            continue;
        }
        let shown = if ov.secret {
            crate::secret::REDACTED.to_owned()
        } else if ov.field == "hub.endpoint" {
            crate::secret::redact_url(&value)
        } else {
            value.clone()
        };
        let value = if ov.reading == Reading::HfPath {
            hf_env::path(&value, lookup)
        } else {
            value
        };
        let set = (ov.apply)(config, &value).map_err(|expected| ConfigError::Env {
            var: ov.var,
            field: ov.field,
            value: shown.clone(),
            expected,
        })?;
        if !set {
            continue;
        }
        applied.push(AppliedOverride {
            var: ov.var,
            key: ov.field,
            value: shown,
            shadowed_by: None,
        });
    }
    // Of the variables that set one key, the last one applied decides it.
    let order: Vec<(&'static str, &'static str)> = applied.iter().map(|a| (a.key, a.var)).collect();
    for a in &mut applied {
        let winner = order
            .iter()
            .rev()
            .find(|(k, _)| *k == a.key)
            .map(|(_, v)| *v);
        a.shadowed_by = winner.filter(|w| *w != a.var);
    }
    Ok(applied)
}

/// Looks up a variable by its recipe name.
#[must_use]
pub fn find(var: &str) -> Option<&'static EnvOverride> {
    ENV_OVERRIDES.iter().find(|o| o.var == var)
}

#[cfg(test)]
mod tests;
