//! The path and address checks: every directory and file the deployment reads or writes (no NUL
//! or control character, empty only where empty means a documented default), the Hub endpoint,
//! the repository file names joined below a snapshot, and the NFS server (an IP address, so the
//! mount options built from it hold exactly one `addr=`).

use super::Checker;
use crate::config::schema::DeploymentConfig;

pub(super) fn paths(c: &mut Checker, config: &DeploymentConfig) {
    c.path("deployment.state_dir", &config.deployment.state_dir, None);
    let h = &config.hub;
    c.path("hub.cache", &h.cache, Some("huggingface_hub's default"));
    c.path("hub.ablit_cache", &h.ablit_cache, None);
    c.path(
        "hub.token_file",
        &h.token_file,
        Some("huggingface_hub's default"),
    );
    if !config.serving.api_key_file.is_empty() {
        c.path("serving.api_key_file", &config.serving.api_key_file, None);
    }
    endpoint(c, &h.endpoint);
    for (i, f) in config.model.engram_files.iter().enumerate() {
        repo_file(c, &format!("model.engram_files[{i}]"), f);
    }
    c.path("engine.repo", &config.engine.repo, Some("no source"));
    for (i, p) in config.engine.patches.iter().enumerate() {
        if !p.trim().is_empty() {
            c.path(&format!("engine.patches[{i}]"), p, None);
        }
    }
    let s = &config.storage;
    c.path(
        "storage.nfs_path",
        &s.nfs_path,
        Some("the head's HF cache path"),
    );
    c.path("storage.worker_tree", &s.worker_tree, Some("no tree"));
    if !s.head_nfs_server.is_empty() && s.head_nfs_server.parse::<std::net::IpAddr>().is_err() {
        c.refuse(
            "storage.head_nfs_server",
            format!("{:?}", s.head_nfs_server),
            "an IP address of the head the worker mounts from (HEAD_NFS_SERVER), or \"\" for the \
             head's fabric address",
        );
    }
    for (i, n) in config.nodes.iter().enumerate() {
        let p = format!("nodes[{i}]");
        c.path(&format!("{p}.data_dir"), &n.data_dir, None);
        c.path(&format!("{p}.hf_cache"), &n.hf_cache, Some("hub.cache"));
        c.path(&format!("{p}.docker_socket"), &n.docker_socket, None);
        c.path(&format!("{p}.sysfs_root"), &n.sysfs_root, None);
        c.path(&format!("{p}.proc_root"), &n.proc_root, None);
        c.path(
            &format!("{p}.identity_file"),
            &n.identity_file,
            Some("ssh's own"),
        );
        c.path(
            &format!("{p}.known_hosts"),
            &n.known_hosts,
            Some("ssh's own"),
        );
    }
}

/// `hub.endpoint`: empty (the Hugging Face Hub) or an `http(s)://` URL. Credentials in it are
/// accepted and shown as `***` wherever secrets are.
fn endpoint(c: &mut Checker, e: &str) {
    if e.is_empty() {
        return;
    }
    let problem = if e.chars().any(|ch| ch.is_control() || ch.is_whitespace()) {
        Some("contains whitespace or a control character".to_owned())
    } else {
        match reqwest::Url::parse(e) {
            Err(err) => Some(err.to_string()),
            Ok(u) if !matches!(u.scheme(), "http" | "https") => {
                Some(format!("has scheme {:?}", u.scheme()))
            }
            Ok(u) if u.host_str().is_none_or(str::is_empty) => Some("has no host".to_owned()),
            Ok(_) => None,
        }
    };
    if let Some(problem) = problem {
        c.refuse(
            "hub.endpoint",
            format!("{:?}", crate::secret::redact_url(e)),
            format!(
                "an http:// or https:// URL of an HF-compatible hub (this one {problem}), or \"\" \
                 for the Hugging Face Hub (HF_ENDPOINT)"
            ),
        );
    }
}

/// A file of a Hub repository, joined below a snapshot directory: relative, no `..` or empty
/// component, no control character.
fn repo_file(c: &mut Checker, field: &str, f: &str) {
    let bad = f.is_empty()
        || f.starts_with('/')
        || f.chars().any(char::is_control)
        || f.contains('\\')
        || f.split('/')
            .any(|part| part.is_empty() || part == "." || part == "..");
    if bad {
        c.refuse(
            field,
            format!("{f:?}"),
            "a file of the repository, relative to its root (no leading '/', no `.` or `..` \
             component, no control character)",
        );
    }
}
