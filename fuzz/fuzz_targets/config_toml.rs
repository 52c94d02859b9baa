//! The deployment config: TOML text, then (after a NUL byte) `KEY=value` environment lines,
//! through the core's public entry points: parse, environment overrides, validation.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use spark_deploy_core::config::{self, DeploymentConfig, env::apply_env, validate};

fuzz_target!(|data: &[u8]| {
    let mut parts = data.splitn(2, |b| *b == 0);
    let toml = String::from_utf8_lossy(parts.next().unwrap_or_default());
    let env_text = String::from_utf8_lossy(parts.next().unwrap_or_default());
    let env: Vec<(String, String)> = env_text
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let lookup = |k: &str| {
        env.iter()
            .rev()
            .find(|(name, _)| name == k)
            .map(|(_, v)| v.clone())
    };
    let mut cfg = if toml.trim().is_empty() {
        DeploymentConfig::default()
    } else {
        match config::parse(&toml, Path::new("fuzz.toml")) {
            Ok(c) => c,
            Err(e) => {
                let _ = (e.to_string(), e.remedy(), e.field());
                return;
            }
        }
    };
    if let Err(e) = apply_env(&mut cfg, &lookup) {
        let _ = (e.to_string(), e.remedy(), e.field());
        return;
    }
    match validate(cfg, Path::new("/home/fuzz")) {
        Ok(v) => {
            let _ = (v.warnings().len(), v.limits());
        }
        Err(e) => {
            let _ = (e.to_string(), e.remedy(), e.field());
        }
    }
});
