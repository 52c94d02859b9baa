//! Environment overrides under the original bash recipe's names.
//!
//! One table, [`ENV_OVERRIDES`], drives both the overrides and the README's reference, so the
//! documented list is the applied list. The environment wins over the file (RECIPE.md §1.1).

use std::net::Ipv4Addr;

use super::ConfigError;
use super::schema::{DeploymentConfig, NodeConfig, PreparePolicy, WorkerStorage};
use crate::secret::Secret;

/// One environment variable and the config field it sets.
pub struct EnvOverride {
    /// Variable name, as the recipe spells it.
    pub var: &'static str,
    /// Config field path it sets.
    pub field: &'static str,
    /// Whether the value is a secret (never echoed in errors).
    pub secret: bool,
    apply: fn(&mut DeploymentConfig, &str) -> Result<(), String>,
}

/// Variables whose value is passed to both ranks unchanged, only when set (ENGINE-CONTRACT.md §2.10).
pub const OPAQUE_SWITCHES: [&str; 4] = [
    "TF_DS_ENGRAM_LANES",
    "TF_DS_IDX_SPLIT",
    "PREFILL_INTERLEAVE_MS",
    "TF_DS_IMAGE_CACHE",
];

macro_rules! ov {
    ($var:literal, $field:literal, |$c:ident, $v:ident| $body:expr) => {
        EnvOverride {
            var: $var,
            field: $field,
            secret: false,
            apply: |$c, $v| $body,
        }
    };
    (secret $var:literal, $field:literal, |$c:ident, $v:ident| $body:expr) => {
        EnvOverride {
            var: $var,
            field: $field,
            secret: true,
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
    ov!("HF_CACHE", "hub.cache", |c, v| {
        c.hub.cache = v.to_owned();
        Ok(())
    }),
    ov!("HF_ENDPOINT", "hub.endpoint", |c, v| {
        c.hub.endpoint = v.trim().to_owned();
        Ok(())
    }),
    ov!(secret "HF_TOKEN", "hub.token", |c, v| {
        c.hub.token = (!v.trim().is_empty()).then(|| Secret::new(v.trim()));
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
        // The recipe's rule: an empty NFS_VOLUME means a local copy on the worker.
        if v.trim().is_empty() {
            c.deployment.worker_storage = WorkerStorage::Copy;
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

/// Applies every variable `lookup` returns a value for, in table order.
///
/// # Errors
///
/// [`ConfigError::Env`] naming the variable and the expected form; a secret's value is never echoed.
pub fn apply_env(
    config: &mut DeploymentConfig,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<&'static str>, ConfigError> {
    let mut applied = Vec::new();
    for ov in ENV_OVERRIDES {
        if let Some(value) = lookup(ov.var) {
            (ov.apply)(config, &value).map_err(|expected| ConfigError::Env {
                var: ov.var,
                field: ov.field,
                value: if ov.secret {
                    crate::secret::REDACTED.to_owned()
                } else {
                    value.clone()
                },
                expected,
            })?;
            applied.push(ov.var);
        }
    }
    Ok(applied)
}

/// Looks up a variable by its recipe name.
#[must_use]
pub fn find(var: &str) -> Option<&'static EnvOverride> {
    ENV_OVERRIDES.iter().find(|o| o.var == var)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let v: Vec<(String, String)> = pairs
            .iter()
            .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
            .collect();
        move |k| v.iter().find(|(a, _)| a == k).map(|(_, b)| b.clone())
    }

    #[test]
    fn recipe_names_set_fields() {
        let mut c = DeploymentConfig::default();
        let applied = apply_env(
            &mut c,
            &env(&[
                ("WORKER", "ops@10.0.0.2"),
                ("FABRIC_PEER", "192.0.2.2"),
                ("CONTEXT", "524288"),
                ("NFS_VOLUME", ""),
                ("PREPARE", "0"),
                ("TF_DS_IDX_SPLIT", "3"),
                ("HF_TOKEN", "hf_x"),
            ]),
        )
        .unwrap();
        assert_eq!(applied.len(), 7);
        assert_eq!(c.nodes[1].ssh, "ops@10.0.0.2");
        assert_eq!(c.nodes[1].fabric_addr, Some(Ipv4Addr::new(192, 0, 2, 2)));
        assert_eq!(c.serving.context, 524_288);
        assert_eq!(c.deployment.worker_storage, WorkerStorage::Copy);
        assert_eq!(c.lifecycle.prepare, PreparePolicy::Never);
        assert_eq!(c.engine.switches["TF_DS_IDX_SPLIT"], "3");
        assert_eq!(c.hub.token.as_ref().unwrap().expose(), "hf_x");
    }

    #[test]
    fn bad_value_names_the_variable_and_hides_secrets() {
        let mut c = DeploymentConfig::default();
        let e = apply_env(&mut c, &env(&[("CONTEXT", "lots")]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("CONTEXT") && e.contains("serving.context") && e.contains("whole number"),
            "{e}"
        );
        assert!(OPAQUE_SWITCHES.iter().all(|s| find(s).is_some()));
    }
}
