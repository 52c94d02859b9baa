//! Validation: every field checked once, every problem reported with its path and allowed range.
//!
//! The checks mirror what the engine would refuse later, at a cost of an hour on a Spark: the pool
//! limit of the RoPE tables, the TP=2 kit's stream limit, the world size (the engine profile's
//! `EngineLimits`; docs/engine-contract.md lists them).

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::ConfigError;
use super::env::OPAQUE_SWITCHES;
use super::schema::{DeploymentConfig, WorkerStorage};
use crate::engine::limits::EngineLimits;
use crate::ports::ssh::options::{check_destination, check_path};

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
        EngineLimits::of(self.config.deployment.engine)
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
        if v < lo || v > hi {
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
        let ok = v.split_once('/').is_some_and(|(o, n)| {
            !o.is_empty()
                && !n.is_empty()
                && !n.contains('/')
                && v.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_./".contains(&b))
        });
        if !ok {
            self.refuse(field, format!("{v:?}"), "a Hub repo id `owner/name`");
        }
    }

    fn revision(&mut self, field: &str, v: &str) {
        let sha = crate::commit::is_commit_id(v);
        let branch = !v.is_empty()
            && v.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_./".contains(&b));
        if !sha && !branch {
            self.refuse(
                field,
                format!("{v:?}"),
                "a 40-hex commit or a branch/tag name",
            );
        } else if !sha {
            self.warn(field, format!("{v:?} is not a commit: it is resolved once at fetch and the commit is recorded; pin a 40-hex commit for reproducible deployments"));
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

/// Engine environment the deployment sets itself; `engine.env` may not override them.
const MANAGED_ENV: &[&str] = &[
    "TF_TP_WORLD",
    "TF_TP_MASTER",
    "TF_TP_PORT",
    "TF_DS_RANK_CACHE",
    "TF_DS_KIT",
    "TENSORFOLD_CUDA_KERNELS",
    "TF_DS_ENGRAM",
    "TF_DS_TOKEN_MAP",
    "TF_RDMA_DEVICES",
    "TF_RDMA_GID_INDEX",
    "TF_DS_GRAPHS",
    "TF_DS_HC_SIDE",
    "TF_DS_L2_PREFETCH",
    "TF_DS_ENGRAM_AIO",
    "TF_DS_REPLAY_FLOOR",
    "NCCL_IB_HCA",
    "NCCL_IB_GID_INDEX",
    "NCCL_SOCKET_IFNAME",
    "TENSORFOLD_API_KEY",
];

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
    let limits = EngineLimits::of(config.deployment.engine);

    c.name("deployment.name", &config.deployment.name, 40);

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
    let extent = (s.max_tokens + 18).div_ceil(2048) * 2048;
    if s.context >= limits.min_pool && extent > s.context {
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
    match s.host.parse::<std::net::IpAddr>() {
        Err(_) => c.refuse(
            "serving.host",
            format!("{:?}", s.host),
            "an IP address to bind, e.g. 0.0.0.0",
        ),
        Ok(ip) if s.auth == super::ApiAuth::None && !ip.is_loopback() => c.warn(
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

    // [engine]
    c.range(
        "engine.rendezvous_port",
        config.engine.rendezvous_port,
        1,
        u16::MAX,
        "",
    );
    if config.engine.rendezvous_port == s.port {
        c.refuse(
            "engine.rendezvous_port",
            config.engine.rendezvous_port,
            "a port different from serving.port",
        );
    }
    if config.engine.image.is_empty() {
        c.refuse("engine.image", "\"\"", "an image reference");
    }
    let rt = &config.engine.runtime;
    if rt.is_empty()
        || !rt
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || "._-".contains(ch))
    {
        c.refuse(
            "engine.runtime",
            format!("{rt:?}"),
            "the name of a runtime registered in Docker (`docker info` lists them; \"nvidia\" for the NVIDIA Container Toolkit)",
        );
    }
    if !crate::commit::is_commit_id(&config.engine.commit) {
        c.refuse(
            "engine.commit",
            format!("{:?}", config.engine.commit),
            "the 40-hex lowercase commit the engine binaries are built from",
        );
    }
    if config.engine.base_image.is_empty() {
        c.refuse(
            "engine.base_image",
            "\"\"",
            "an image reference present on the head",
        );
    }
    if config.engine.base_image == config.engine.image {
        c.refuse(
            "engine.image",
            format!("{:?}", config.engine.image),
            "a tag different from engine.base_image (the image is built FROM the base)",
        );
    }
    let repo = &config.engine.repo;
    if !repo.is_empty() && !super::schema::repo_is_remote(repo) && !repo.starts_with('/') {
        c.refuse(
            "engine.repo",
            format!("{repo:?}"),
            "a git URL (https://…, ssh://…, git@host:path) or an absolute path to a repository on the head",
        );
    }
    for (i, p) in config.engine.patches.iter().enumerate() {
        if p.trim().is_empty() {
            c.refuse(
                format!("engine.patches[{i}]"),
                "\"\"",
                "the path of a patch file on the head",
            );
        }
    }
    for (k, v) in &config.engine.switches {
        if !OPAQUE_SWITCHES.contains(&k.as_str()) {
            c.refuse(
                format!("engine.switches.{k}"),
                format!("{v:?}"),
                format!(
                    "one of {}; other variables go in engine.env",
                    OPAQUE_SWITCHES.join(", ")
                ),
            );
        } else if v.is_empty() {
            c.refuse(
                format!("engine.switches.{k}"),
                "\"\"",
                "a non-empty value (remove the key to leave it unset)",
            );
        }
    }
    for (k, v) in &config.engine.env {
        let field = format!("engine.env.{k}");
        if !(k.starts_with("TF_") || k.starts_with("NCCL_") || k.starts_with("TENSORFOLD_")) {
            c.refuse(field, k, "names starting with TF_, NCCL_ or TENSORFOLD_");
        } else if MANAGED_ENV.contains(&k.as_str()) {
            c.refuse(field, k, "a variable spark-deploy does not set itself (this one comes from the config and preflight)");
        } else if v.is_empty() {
            c.refuse(
                field,
                "\"\"",
                "a non-empty value (empty engine values are read as 0)",
            );
        } else if k == "TF_DS_ROUND_ROWS" && v != "16" {
            c.refuse(field, v, "16 (the TP=2 kit recorded 16-row rounds only)");
        } else if k == "TF_DS_STREAMS"
            && v.parse::<u32>()
                .map_or(true, |n| n > limits.max_parallel || n < s.parallel)
        {
            c.refuse(
                field,
                v,
                format!("serving.parallel..={} (the TP=2 kit)", limits.max_parallel),
            );
        } else if k == "TF_DS_WINDOW" || k == "TF_DS_2D_GU" {
            c.refuse(field, v, "nothing: TP=4 builds only");
        }
    }

    // [lifecycle]
    let l = &config.lifecycle;
    c.range(
        "lifecycle.min_avail_gib",
        l.min_avail_gib,
        1,
        128,
        " (a Spark has 128 GB)",
    );
    c.range("lifecycle.log_keep", l.log_keep, 0, 1000, "");
    c.range(
        "lifecycle.ready_timeout_s",
        l.ready_timeout_s,
        1,
        86_400,
        "",
    );
    c.range("lifecycle.stop_timeout_s", l.stop_timeout_s, 1, 3600, "");

    // [watch]
    let w = &config.watch;
    c.range("watch.interval_s", w.interval_s, 0.2, 60.0, " seconds");
    c.range("watch.wedge_s", w.wedge_s, 1.0, 3600.0, " seconds");
    c.range(
        "watch.probe_idle_s",
        w.probe_idle_s,
        1.0,
        86_400.0,
        " seconds",
    );
    c.range(
        "watch.probe_timeout_s",
        w.probe_timeout_s,
        1.0,
        600.0,
        " seconds",
    );
    c.range(
        "watch.memory_floor_gib",
        w.memory_floor_gib,
        0.0,
        128.0,
        " GiB (a Spark has 128 GB)",
    );
    c.range("watch.max_heals_per_hour", w.max_heals_per_hour, 0, 60, "");
    if w.wedge_s < 2.0 * w.interval_s {
        c.refuse(
            "watch.wedge_s",
            w.wedge_s,
            format!(
                "at least two samples: >= 2 × watch.interval_s ({})",
                2.0 * w.interval_s
            ),
        );
    }

    // [storage]
    if config.storage.nfs_volume.is_empty() {
        c.refuse(
            "storage.nfs_volume",
            "\"\"",
            "a Docker volume name (set deployment.worker_storage = \"copy\" for no NFS)",
        );
    } else if config.storage.nfs_volume.starts_with('/') {
        c.refuse(
            "storage.nfs_volume",
            &config.storage.nfs_volume,
            "a Docker volume name; for a tree already on the worker set deployment.worker_storage = \"local\" and storage.worker_tree to that path (NFS_VOLUME=<absolute path> does both)",
        );
    }
    if config.deployment.worker_storage == WorkerStorage::Local
        && !config.storage.worker_tree.starts_with('/')
    {
        c.refuse(
            "storage.worker_tree",
            format!("{:?}", config.storage.worker_tree),
            "the absolute path of the worker's HF cache tree (holding hub/models--…), required by deployment.worker_storage = \"local\"",
        );
    }

    // [[nodes]]
    let n = config.nodes.len();
    if !limits.world_sizes.contains(&n) {
        c.refuse("nodes", format!("{n} node(s)"), format!("{:?} nodes: the engine's tensor-parallel world size (one rank per node, head first)", limits.world_sizes));
    }
    let mut names = std::collections::BTreeSet::new();
    for (i, node) in config.nodes.iter().enumerate() {
        let p = format!("nodes[{i}]");
        c.name(&format!("{p}.name"), &node.name, 32);
        if !names.insert(node.name.clone()) {
            c.refuse(format!("{p}.name"), &node.name, "a name no other node uses");
        }
        if i == 0 && !node.is_local() {
            c.refuse(
                format!("{p}.ssh"),
                &node.ssh,
                "\"local\": the first node is the head, where spark-deploy runs",
            );
        }
        if i > 0 {
            let dest = node.ssh.rsplit('@').next().unwrap_or("");
            let unsafe_dest = check_destination(&node.ssh).err();
            if node.is_local() || dest.is_empty() || unsafe_dest.is_some() {
                c.refuse(
                    format!("{p}.ssh"),
                    format!("{:?}", node.ssh),
                    format!(
                        "an ssh destination for a worker (set WORKER): `user@host`, `host` or a \
                         Host alias of ~/.ssh/config{}",
                        unsafe_dest
                            .map(|u| format!("; this one {u}"))
                            .unwrap_or_default()
                    ),
                );
            }
            if node.ssh_port == Some(0) {
                c.refuse(
                    format!("{p}.ssh_port"),
                    0,
                    "1 to 65535, or unset for ssh's own (the ssh config's Port, else 22)",
                );
            }
            for (field, value) in [
                ("identity_file", &node.identity_file),
                ("known_hosts", &node.known_hosts),
            ] {
                if let Some(problem) = (!value.is_empty())
                    .then(|| check_path(value).err())
                    .flatten()
                {
                    c.refuse(
                        format!("{p}.{field}"),
                        format!("{value:?}"),
                        format!(
                            "a file path ssh reads as written (this one {problem}), or unset for \
                             ssh's own resolution through ~/.ssh/config"
                        ),
                    );
                }
            }
        }
        if node.network_mode != "host"
            && node
                .network_mode
                .strip_prefix("container:")
                .is_none_or(str::is_empty)
        {
            c.refuse(
                format!("{p}.network_mode"),
                &node.network_mode,
                "\"host\" or \"container:<name>\"",
            );
        }
        if !Path::new(&node.sysfs_root).is_absolute() {
            c.refuse(
                format!("{p}.sysfs_root"),
                format!("{:?}", node.sysfs_root),
                "an absolute path on the node (\"/sys\")",
            );
        }
        if !Path::new(&node.proc_root).is_absolute() {
            c.refuse(
                format!("{p}.proc_root"),
                format!("{:?}", node.proc_root),
                "an absolute path on the node (\"/proc\")",
            );
        }
        for dir in &node.path {
            if !Path::new(dir).is_absolute() || dir.contains(':') {
                c.refuse(
                    format!("{p}.path"),
                    format!("{dir:?}"),
                    "absolute directories on the node, without ':'",
                );
            }
        }
        if let Some(addr) = node.fabric_addr
            && (addr.is_unspecified()
                || addr.is_loopback()
                || addr.is_multicast()
                || addr.is_broadcast())
        {
            c.refuse(
                format!("{p}.fabric_addr"),
                addr,
                "the node's unicast IPv4 on the fabric link",
            );
        }
    }
    let fabric: Vec<_> = config.nodes.iter().filter_map(|n| n.fabric_addr).collect();
    if fabric.len()
        != fabric
            .iter()
            .collect::<std::collections::BTreeSet<_>>()
            .len()
    {
        c.refuse(
            "nodes[].fabric_addr",
            "duplicate",
            "a different fabric address per node",
        );
    }

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
mod tests {
    use super::*;

    fn check(f: impl FnOnce(&mut DeploymentConfig)) -> Result<ValidatedConfig, ConfigError> {
        let mut c = DeploymentConfig::default();
        f(&mut c);
        validate(c, Path::new("/home/spark"))
    }

    fn refused_field(f: impl FnOnce(&mut DeploymentConfig)) -> String {
        match check(f) {
            Err(ConfigError::Invalid { problems }) => problems[0].field.clone(),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn watch_fields_are_checked_by_name() {
        assert_eq!(
            refused_field(|c| c.watch.interval_s = 0.0),
            "watch.interval_s"
        );
        assert_eq!(
            refused_field(|c| c.watch.memory_floor_gib = -1.0),
            "watch.memory_floor_gib"
        );
        assert_eq!(
            refused_field(|c| c.watch.max_heals_per_hour = 61),
            "watch.max_heals_per_hour"
        );
        assert_eq!(refused_field(|c| c.watch.wedge_s = 3.0), "watch.wedge_s");
        assert_eq!(
            refused_field(|c| c.nodes[1].proc_root = "proc".into()),
            "nodes[1].proc_root"
        );
        let mut raw = DeploymentConfig::default();
        raw.watch.heal = crate::config::HealPolicy::Stop;
        assert!(validate(raw, Path::new("/home/u")).is_ok());
    }

    #[test]
    fn runtime_sysfs_root_and_path_are_checked() {
        assert_eq!(
            refused_field(|c| c.engine.runtime = "nvidia runc".into()),
            "engine.runtime"
        );
        assert_eq!(
            refused_field(|c| c.nodes[1].sysfs_root = "sys".into()),
            "nodes[1].sysfs_root"
        );
        assert_eq!(
            refused_field(|c| c.nodes[0].path = vec!["/a:/b".into()]),
            "nodes[0].path"
        );
        let v = check(|c| {
            c.engine.runtime = "runc".into();
            c.nodes[0].path = vec!["/usr/local/nvidia/bin".into()];
            c.nodes[1].sysfs_root = "/srv/facts/sys".into();
        })
        .unwrap();
        assert_eq!(v.config().nodes[1].sysfs_root, "/srv/facts/sys");
    }

    #[test]
    fn engine_repo_is_a_url_or_an_absolute_path() {
        assert_eq!(
            refused_field(|c| c.engine.repo = "engine-src".into()),
            "engine.repo"
        );
        for ok in [
            "",
            "/srv/tensorfold",
            "https://example.org/tensorfold.git",
            "ssh://git@example.org/tensorfold.git",
            "git@example.org:org/tensorfold.git",
        ] {
            assert!(check(|c| c.engine.repo = ok.into()).is_ok(), "{ok}");
        }
        assert!(crate::config::repo_is_remote("git@example.org:org/x.git"));
        assert!(!crate::config::repo_is_remote("/srv/a:b/x"));
    }

    #[test]
    fn defaults_pass_with_warnings() {
        let v = check(|_| {}).unwrap();
        let fields: Vec<_> = v.warnings().iter().map(|w| w.field.as_str()).collect();
        assert!(fields.contains(&"serving.context"), "{fields:?}");
        assert!(fields.contains(&"model.revision"), "{fields:?}");
        assert_eq!(
            v.config().nodes[1].data_dir,
            "/home/spark/.cache/spark-deploy"
        );
        assert_eq!(
            v.config().serving.api_key_file,
            "/home/spark/.local/state/spark-deploy/api-key"
        );
    }

    #[test]
    fn context_0_asks_preflight_for_the_largest_that_fits() {
        let v = check(|c| c.serving.context = 0).unwrap();
        assert_eq!(v.config().serving.context, 0);
    }

    #[test]
    fn engine_limits_are_refused_with_the_field() {
        assert_eq!(refused_field(|c| c.serving.context = 1), "serving.context");
        assert_eq!(
            refused_field(|c| c.serving.context = 1_114_064),
            "serving.context"
        );
        assert_eq!(
            refused_field(|c| c.serving.parallel = 5),
            "serving.parallel"
        );
        assert_eq!(refused_field(|c| c.nodes.truncate(1)), "nodes");
        assert_eq!(
            refused_field(|c| {
                c.engine.env.insert("TF_DS_ROUND_ROWS".into(), "48".into());
            }),
            "engine.env.TF_DS_ROUND_ROWS"
        );
        assert_eq!(
            refused_field(|c| {
                c.engine.env.insert("TF_TP_MASTER".into(), "1.2.3.4".into());
            }),
            "engine.env.TF_TP_MASTER"
        );
        assert_eq!(
            refused_field(|c| c.nodes[0].ssh = "me@elsewhere".into()),
            "nodes[0].ssh"
        );
        assert_eq!(
            refused_field(|c| c.nodes[1].network_mode = "bridge".into()),
            "nodes[1].network_mode"
        );
        assert_eq!(
            refused_field(|c| c.serving.max_tokens = 40_000_000),
            "serving.max_tokens"
        );
        assert_eq!(
            refused_field(|c| c.engine.commit = "59402086381A42C74D53053443224EEC2790B4C5".into()),
            "engine.commit"
        );
    }

    #[test]
    fn ssh_values_that_ssh_would_misread_are_refused_with_the_reason() {
        let e = check(|c| c.nodes[1].ssh = "-oProxyCommand=touch /tmp/x".into())
            .unwrap_err()
            .to_string();
        assert!(e.contains("nodes[1].ssh = "), "{e}");
        assert!(e.contains("starts with '-'"), "{e}");
        assert!(e.contains("Host alias of ~/.ssh/config"), "{e}");
        let e = check(|c| c.nodes[1].known_hosts = "/k/kh\nProxyCommand x".into())
            .unwrap_err()
            .to_string();
        assert!(e.contains("nodes[1].known_hosts = "), "{e}");
        assert!(e.contains("newline"), "{e}");
        assert_eq!(
            refused_field(|c| c.nodes[1].identity_file = "/k/%h".into()),
            "nodes[1].identity_file"
        );
        assert_eq!(
            refused_field(|c| c.nodes[1].ssh_port = Some(0)),
            "nodes[1].ssh_port"
        );
        // An alias, no port, no key, no known_hosts: all left to ssh.
        let v = check(|c| c.nodes[1].ssh = "sparky".into()).unwrap();
        let w = &v.config().nodes[1];
        assert_eq!((w.ssh_port, w.identity_file.as_str()), (None, ""));
    }

    #[test]
    fn message_carries_value_and_range() {
        let e = check(|c| c.serving.parallel = 9).unwrap_err().to_string();
        assert!(e.contains("serving.parallel = 9: allowed 1..=4"), "{e}");
    }
}
