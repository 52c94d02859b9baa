//! The `[engine]` checks: the image, runtime and source the engine is built from, the opaque
//! switches, and `engine.env` (prefixes, variables spark-deploy sets itself, the TP=2 kit's values).

use super::Checker;
use crate::config::env::OPAQUE_SWITCHES;
use crate::config::schema::DeploymentConfig;
use crate::engine::limits::EngineLimits;

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

pub(super) fn engine(c: &mut Checker, config: &DeploymentConfig, limits: &EngineLimits) {
    let s = &config.serving;
    // [engine]
    c.range(
        "engine.rendezvous_port",
        config.engine.rendezvous_port,
        1,
        u16::MAX,
        "",
    );
    // Follower g joins rank 0 on rendezvous_port + g − 1: the ports of every follower.
    let followers = u32::try_from(config.nodes.len().saturating_sub(1)).unwrap_or(u32::MAX);
    let first = u32::from(config.engine.rendezvous_port);
    let last = first + followers.saturating_sub(1);
    if last > u32::from(u16::MAX) {
        c.refuse(
            "engine.rendezvous_port",
            config.engine.rendezvous_port,
            format!(
                "1..={}: follower g joins rendezvous_port + g − 1, and {followers} followers need {followers} ports",
                u32::from(u16::MAX) + 1 - followers.max(1)
            ),
        );
    }
    if (first..=last.max(first)).contains(&u32::from(s.port)) {
        c.refuse(
            "engine.rendezvous_port",
            config.engine.rendezvous_port,
            if followers > 1 {
                format!(
                    "a port range {first}..={last} (one per follower) that leaves out serving.port {}",
                    s.port
                )
            } else {
                "a port different from serving.port".to_owned()
            },
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
    let remote = crate::config::schema::repo_is_remote(repo);
    // Never an option (`--upload-pack=...`), a remote helper (`ext::...`, `fd::...`) or a URL
    // with whitespace: git reads each of them as something else than a repository.
    let option_like = repo.starts_with('-')
        || repo.contains("::")
        || (remote && repo.chars().any(|ch| ch.is_whitespace() || ch.is_control()));
    if !repo.is_empty() && ((!remote && !repo.starts_with('/')) || option_like) {
        c.refuse(
            "engine.repo",
            format!("{repo:?}"),
            "a git URL (https://…, ssh://…, git@host:path; no whitespace, no `transport::` \
             helper, not starting with '-') or an absolute path to a repository on the head",
        );
    }
    for (i, p) in config.engine.patches.iter().enumerate() {
        if p.starts_with('-') {
            c.refuse(
                format!("engine.patches[{i}]"),
                format!("{p:?}"),
                "the path of a patch file on the head, not starting with '-' (write ./-name)",
            );
        } else if p.trim().is_empty() {
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
        } else if k == "TF_DS_ROUND_ROWS" && !limits.tp4_branch && v != "16" {
            c.refuse(field, v, "16 (the TP=2 kit recorded 16-row rounds only)");
        } else if k == "TF_DS_ROUND_ROWS"
            && v.parse::<u32>()
                .map_or(true, |n| !(16..=limits.max_round_rows).contains(&n))
        {
            c.refuse(
                field,
                v,
                format!(
                    "16..={} (the TP=4 kit's rows per round)",
                    limits.max_round_rows
                ),
            );
        } else if k == "TF_DS_STREAMS"
            && v.parse::<u32>()
                .map_or(true, |n| n > limits.max_parallel || n < s.parallel)
        {
            c.refuse(
                field,
                v,
                format!(
                    "serving.parallel..={} (the {} kit)",
                    limits.max_parallel,
                    if limits.tp4_branch { "TP=4" } else { "TP=2" }
                ),
            );
        } else if k == "TF_DS_WINDOW" && limits.tp4_branch {
            c.refuse(
                field,
                v,
                "nothing: the shared pool is serving.context (spark-deploy sets TF_DS_WINDOW from it)",
            );
        } else if k == "TF_DS_2D_GU" && limits.tp4_branch {
            c.refuse(
                field,
                v,
                "nothing: `parity` needs rank files written with --parity; spark-deploy builds the plain W=4 split",
            );
        } else if k == "TF_DS_WINDOW" || k == "TF_DS_2D_GU" {
            c.refuse(
                field,
                v,
                "nothing: TP=4 builds only (deployment.engine = \"tensorfold-dsv41-tp4\")",
            );
        }
    }
}
