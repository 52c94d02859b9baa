//! The `[model]` and `[serving]` checks: Hub repos and revisions, the context and reply budget
//! against the engine's pool limits, sampling, the bind address and the API key file.

use super::Checker;
use crate::config::ApiAuth;
use crate::config::schema::DeploymentConfig;
use crate::engine::limits::EngineLimits;

pub(super) fn model(c: &mut Checker, config: &DeploymentConfig) {
    // [model]
    c.repo("model.id", &config.model.id);
    c.revision("model.revision", &config.model.revision);
    c.repo("model.engram_repo", &config.model.engram_repo);
    c.revision("model.engram_revision", &config.model.engram_revision);
    c.repo("model.kit_repo", &config.model.kit_repo);
    c.revision("model.kit_revision", &config.model.kit_revision);
    if config.model.engram_files.is_empty() {
        c.refuse(
            "model.engram_files",
            "[]",
            "the original model's shards holding the Engram tables",
        );
    }
    if config.model.ablit {
        c.repo("model.ablit_id", &config.model.ablit_id);
        c.revision("model.ablit_revision", &config.model.ablit_revision);
    }
    let sn = &config.model.served_name;
    if sn.is_empty() || sn.len() > 128 || sn.chars().any(|ch| ch.is_whitespace() || ch.is_control())
    {
        c.refuse(
            "model.served_name",
            format!("{sn:?}"),
            "1..=128 characters without whitespace",
        );
    }
}

pub(super) fn serving(c: &mut Checker, config: &DeploymentConfig, limits: &EngineLimits) {
    // [serving]
    let s = &config.serving;
    // 0: the largest pool that fits every node, computed by preflight from the memory budget.
    if s.context != 0 {
        c.range(
            "serving.context",
            s.context,
            limits.min_pool,
            limits.max_pool,
            " (0 for the largest that fits, else at least one 2048-position extent, at most what the engine's RoPE tables cover)",
        );
    }
    if s.context > limits.memory_warn_context && s.context <= limits.max_pool {
        c.warn("serving.context", format!("{} > {}: leaves about 5 GiB on the head at 1M; prefer ≤ {} unless the whole window is needed", s.context, limits.memory_warn_context, limits.memory_warn_context));
    }
    c.range(
        "serving.parallel",
        s.parallel,
        1,
        limits.max_parallel,
        " (streams the TP=2 kit covers)",
    );
    c.range("serving.port", s.port, 1, u16::MAX, "");
    c.range("serving.max_tokens", s.max_tokens, 1, limits.max_pool, "");
    // Checked: any u64 may come from the file, the environment or a recipe.
    let extent = s
        .max_tokens
        .checked_add(18)
        .map(|n| n.div_ceil(2048))
        .and_then(|n| n.checked_mul(2048));
    if let Some(extent) = extent
        && s.context >= limits.min_pool
        && extent > s.context
    {
        c.refuse("serving.max_tokens", s.max_tokens, format!("a reply budget whose extent (max_tokens + 18, rounded up to 2048 = {extent}) fits serving.context = {}", s.context));
    }
    if !(0.0..=2.0).contains(&s.temperature) {
        c.refuse("serving.temperature", s.temperature, "0.0..=2.0");
    } else if s.temperature == 0.0 {
        c.warn(
            "serving.temperature",
            "greedy decoding makes long tool-using conversations loop; the served default is 1.0",
        );
    }
    if !(s.top_p > 0.0 && s.top_p <= 1.0) {
        c.refuse("serving.top_p", s.top_p, "(0.0, 1.0]");
    }
    if s.top_k == 0 {
        c.refuse(
            "serving.top_k",
            s.top_k,
            "1 or more (1 is greedy; the served default is 20)",
        );
    }
    match s.host.parse::<std::net::IpAddr>() {
        Err(_) => c.refuse(
            "serving.host",
            format!("{:?}", s.host),
            "an IP address to bind, e.g. 0.0.0.0",
        ),
        Ok(ip) if s.auth == ApiAuth::None && !ip.is_loopback() => c.warn(
            "serving.auth",
            format!(
                "\"none\" with host {ip}: anyone who reaches port {} may call the API without a key; \
                 set serving.auth = \"key\", or bind serving.host = \"127.0.0.1\"",
                s.port
            ),
        ),
        Ok(_) => {}
    }
    if s.api_key_file.is_empty() {
        c.refuse(
            "serving.api_key_file",
            "\"\"",
            "a file path (relative paths are under deployment.state_dir)",
        );
    }
}
