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
    fn nfs_volume_selects_copy_local_tree_or_a_volume_as_in_the_recipe() {
        let mode = |v: &str| {
            let mut c = DeploymentConfig::default();
            apply_env(&mut c, &env(&[("NFS_VOLUME", v)])).unwrap();
            (
                c.deployment.worker_storage,
                c.storage.nfs_volume.clone(),
                c.storage.worker_tree.clone(),
            )
        };
        let default_volume = DeploymentConfig::default().storage.nfs_volume;
        assert_eq!(mode("").0, WorkerStorage::Copy);
        assert_eq!(
            mode("/srv/hf"),
            (WorkerStorage::Local, default_volume, "/srv/hf".to_owned())
        );
        assert_eq!(
            mode("dsv41-hf"),
            (WorkerStorage::Nfs, "dsv41-hf".to_owned(), String::new())
        );
        // Validated: local mode names its tree; a path given as a volume name is refused with
        // the way to local mode.
        let mut c = DeploymentConfig::default();
        apply_env(&mut c, &env(&[("NFS_VOLUME", "/srv/hf")])).unwrap();
        crate::config::validate(c, std::path::Path::new("/home/u")).unwrap();
        let mut c = DeploymentConfig::default();
        c.deployment.worker_storage = WorkerStorage::Local;
        let e = crate::config::validate(c, std::path::Path::new("/home/u"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("storage.worker_tree"), "{e}");
        let mut c = DeploymentConfig::default();
        c.storage.nfs_volume = "/srv/hf".into();
        let e = crate::config::validate(c, std::path::Path::new("/home/u"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("storage.nfs_volume") && e.contains("\"local\""),
            "{e}"
        );
    }

    /// (value the file gives, environment, expected result).
    type Case = (
        &'static str,
        &'static [(&'static str, &'static str)],
        &'static str,
    );

    /// The head's cache root, token file and token after the environment and validation, with
    /// the file setting `hub.cache` / `hub.token_file` when given.
    fn hf(file: (&str, &str), pairs: &[(&str, &str)]) -> (String, String, Option<String>) {
        let mut c = DeploymentConfig::default();
        (c.hub.cache, c.hub.token_file) = (file.0.to_owned(), file.1.to_owned());
        apply_env(&mut c, &env(pairs)).unwrap();
        let v = crate::config::validate(c, std::path::Path::new("/home/u")).unwrap();
        let h = &v.config().hub;
        (
            h.cache.clone(),
            h.token_file.clone(),
            h.token.as_ref().map(|t| t.expose().to_owned()),
        )
    }

    #[test]
    fn hf_cache_precedence_is_huggingface_hubs() {
        // (file's hub.cache, environment) -> cache root; huggingface_hub's hub cache is <root>/hub.
        let cases: &[Case] = &[
            ("", &[], "/home/u/.cache/huggingface"),
            ("", &[("XDG_CACHE_HOME", "/x")], "/x/huggingface"),
            ("", &[("XDG_CACHE_HOME", "/x"), ("HF_HOME", "/h")], "/h"),
            (
                "",
                &[("HF_HOME", "/h"), ("HUGGINGFACE_HUB_CACHE", "/old/hub")],
                "/old",
            ),
            (
                "",
                &[
                    ("HUGGINGFACE_HUB_CACHE", "/old/hub"),
                    ("HF_HUB_CACHE", "/new/hub/"),
                ],
                "/new",
            ),
            ("", &[("HF_HOME", "~/h")], "/home/u/h"),
            (
                "",
                &[("HF_HOME", "$XDG_CACHE_HOME/h"), ("XDG_CACHE_HOME", "/x")],
                "/x/h",
            ),
            // The recipe's HF_CACHE ranks above HF_HOME (as in the recipe), below HF_HUB_CACHE.
            ("", &[("HF_HOME", "/h"), ("HF_CACHE", "/r")], "/r"),
            ("", &[("HF_CACHE", "/r"), ("HF_HUB_CACHE", "/n/hub")], "/n"),
            // The environment wins over the file, except XDG_CACHE_HOME, which moves a default only.
            ("/f", &[("XDG_CACHE_HOME", "/x")], "/f"),
            ("/f", &[("HF_HOME", "/h")], "/h"),
            ("/f", &[("HF_HUB_CACHE", "/n/hub")], "/n"),
            // Empty variables count as unset.
            ("/f", &[("HF_HOME", ""), ("HF_HUB_CACHE", " ")], "/f"),
        ];
        for (file, pairs, want) in cases {
            assert_eq!(
                hf((file, ""), pairs).0,
                *want,
                "file {file:?}, env {pairs:?}"
            );
        }
    }

    #[test]
    fn hf_token_precedence_is_huggingface_hubs() {
        // (file's hub.token_file, environment) -> token file.
        let cases: &[Case] = &[
            ("", &[], "/home/u/.cache/huggingface/token"),
            ("", &[("XDG_CACHE_HOME", "/x")], "/x/huggingface/token"),
            ("", &[("HF_HOME", "/h")], "/h/token"),
            (
                "",
                &[("HF_HOME", "/h"), ("HF_TOKEN_PATH", "/t/tok")],
                "/t/tok",
            ),
            // The token stays where `hf auth login` wrote it when only the hub cache moves.
            (
                "",
                &[("HF_HUB_CACHE", "/n/hub")],
                "/home/u/.cache/huggingface/token",
            ),
            (
                "",
                &[("HF_CACHE", "/r")],
                "/home/u/.cache/huggingface/token",
            ),
            ("/f/tok", &[("XDG_CACHE_HOME", "/x")], "/f/tok"),
            ("/f/tok", &[("HF_HOME", "/h")], "/h/token"),
        ];
        for (file, pairs, want) in cases {
            assert_eq!(
                hf(("", file), pairs).1,
                *want,
                "file {file:?}, env {pairs:?}"
            );
        }
        // HF_TOKEN wins over the legacy name; either is cleaned like huggingface_hub's.
        let t = |pairs: &[(&str, &str)]| hf(("", ""), pairs).2;
        assert_eq!(t(&[]), None);
        assert_eq!(
            t(&[("HUGGING_FACE_HUB_TOKEN", "hf_old")]).as_deref(),
            Some("hf_old")
        );
        assert_eq!(
            t(&[
                ("HUGGING_FACE_HUB_TOKEN", "hf_old"),
                ("HF_TOKEN", " hf_new\n")
            ])
            .as_deref(),
            Some("hf_new")
        );
        assert_eq!(
            t(&[("HUGGING_FACE_HUB_TOKEN", "hf_old"), ("HF_TOKEN", "")]).as_deref(),
            Some("hf_old")
        );
    }

    #[test]
    fn a_hub_cache_not_named_hub_is_refused_with_the_fix() {
        let mut c = DeploymentConfig::default();
        let e = apply_env(&mut c, &env(&[("HF_HUB_CACHE", "/data/models")])).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("HF_HUB_CACHE")
                && text.contains("hub.cache")
                && text.contains("/data/models/hub"),
            "{text}"
        );
        assert!(e.remedy().unwrap().contains("HF_HUB_CACHE"));
    }

    #[test]
    fn hf_endpoint_and_offline() {
        let mut c = DeploymentConfig::default();
        apply_env(&mut c, &env(&[("HF_ENDPOINT", "http://127.0.0.1:9/")])).unwrap();
        assert_eq!(c.hub.endpoint, "http://127.0.0.1:9");
        let offline = |pairs: &[(&str, &str)]| {
            let mut c = DeploymentConfig::default();
            apply_env(&mut c, &env(pairs)).unwrap();
            c.hub.offline
        };
        assert!(!offline(&[]));
        assert!(offline(&[("HF_HUB_OFFLINE", "1")]));
        assert!(offline(&[("HF_HUB_OFFLINE", "true")]));
        assert!(offline(&[("TRANSFORMERS_OFFLINE", "YES")]));
        // HF_HUB_OFFLINE decides when set, even against TRANSFORMERS_OFFLINE; empty falls through.
        assert!(!offline(&[
            ("TRANSFORMERS_OFFLINE", "1"),
            ("HF_HUB_OFFLINE", "0")
        ]));
        assert!(offline(&[
            ("TRANSFORMERS_OFFLINE", "1"),
            ("HF_HUB_OFFLINE", "")
        ]));
    }

    #[test]
    fn applied_says_which_variable_set_which_key() {
        let mut c = DeploymentConfig::default();
        c.hub.cache = "/f".into();
        let applied = apply_env(
            &mut c,
            &env(&[
                ("XDG_CACHE_HOME", "/x"),
                ("HF_HOME", "/h"),
                ("HF_HUB_CACHE", "/n/hub"),
                ("HF_TOKEN", "hf_secret"),
                ("PORT", "9000"),
            ]),
        )
        .unwrap();
        let row = |var: &str, key: &str| {
            applied
                .iter()
                .find(|a| a.var == var && a.key == key)
                .cloned()
        };
        // XDG_CACHE_HOME moves only the token file's default here: the file names the cache.
        assert_eq!(row("XDG_CACHE_HOME", "hub.cache"), None);
        let xdg = row("XDG_CACHE_HOME", "hub.token_file").unwrap();
        assert_eq!(xdg.shadowed_by, Some("HF_HOME"));
        assert_eq!(
            row("HF_HOME", "hub.cache").unwrap().shadowed_by,
            Some("HF_HUB_CACHE")
        );
        assert_eq!(row("HF_HOME", "hub.token_file").unwrap().shadowed_by, None);
        let hub = row("HF_HUB_CACHE", "hub.cache").unwrap();
        assert_eq!((hub.value.as_str(), hub.shadowed_by), ("/n/hub", None));
        assert_eq!(row("HF_TOKEN", "hub.token").unwrap().value, "***");
        assert_eq!(row("PORT", "serving.port").unwrap().value, "9000");
        assert!(!format!("{applied:?}").contains("hf_secret"));
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
