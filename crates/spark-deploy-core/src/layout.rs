//! Where every input lives on a node, derived from the config in one place.

use std::path::PathBuf;

use serde::Serialize;

use crate::config::{NodeConfig, ValidatedConfig};

/// Host paths of one node's inputs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeLayout {
    /// Node name.
    pub node: String,
    /// The node's HF cache root (`HF_HOME`-style: `hub/` below it).
    pub hf_cache: String,
    /// Engine binaries for the configured engine commit.
    pub engine_dir: String,
    /// Kernel kit (identical bytes on every node).
    pub kit_dir: String,
    /// Engram tables (local disk, never NFS).
    pub engram_dir: String,
    /// Per-checkpoint inputs: `rank-cache/` and the token map.
    pub inputs_dir: String,
    /// Saved rank logs.
    pub log_dir: String,
    /// The image routing bias read by byte range from the original model when the kit does not
    /// publish it (FetchCheckpoint writes it, BuildRankCache puts it into the kit).
    pub bias_vl_file: String,
    /// The engine image's reference on this node: `engine.image`, except on a testbed worker,
    /// which shares the head's Docker daemon and so gets a distinct tag (`<tag>-<node>`) that
    /// only the shipment through its own Docker can create.
    pub image: String,
}

/// Where BuildImage builds the engine on `node` (the head): `<data_dir>/engine-build`, holding the
/// checkout (`src/`), the output directory of the running build (`out/`), the tools' cache kept
/// between builds (`tool-cache/`), the build logs (`logs/`) and the cached builds by key
/// (`cache/<key>/`).
#[must_use]
pub fn engine_build_dir(node: &NodeConfig) -> String {
    format!("{}/engine-build", node.data_dir.trim_end_matches('/'))
}

/// The `models--owner--name` folder name of a repo in an HF cache.
#[must_use]
pub fn repo_folder(repo: &str) -> String {
    format!("models--{}", repo.replace('/', "--"))
}

/// The address the worker mounts the head's cache from (`addr=` of the NFS options): the
/// validated `storage.head_nfs_server` (an IP address, written back in its canonical form), else
/// the head's fabric address (or its placeholder until preflight). Nothing else of the config
/// reaches the mount options, so they hold exactly one `addr=`.
#[must_use]
pub fn nfs_server(
    config: &ValidatedConfig,
    head_fabric: &crate::facts::Detected<std::net::Ipv4Addr>,
) -> String {
    config
        .config()
        .storage
        .head_nfs_server
        .parse::<std::net::IpAddr>()
        .map_or_else(|_| head_fabric.to_string(), |ip| ip.to_string())
}

impl NodeLayout {
    /// The layout of `node` under `config`.
    #[must_use]
    pub fn of(config: &ValidatedConfig, node: &NodeConfig) -> Self {
        let c = config.config();
        let d = node.data_dir.trim_end_matches('/');
        let commit: String = c.engine.commit.chars().take(12).collect();
        let identity = format!(
            "{}@{}{}",
            c.model.id.replace('/', "--"),
            c.model.revision,
            if c.model.ablit {
                format!("+ablit@{}", c.model.ablit_revision)
            } else {
                String::new()
            }
        );
        Self {
            node: node.name.clone(),
            hf_cache: node.hf_cache.clone(),
            engine_dir: format!("{d}/engine/{commit}"),
            kit_dir: format!("{d}/kit/{}", c.model.kit_revision),
            engram_dir: format!("{d}/engram/{}", c.model.engram_revision),
            inputs_dir: format!("{d}/inputs/{identity}"),
            log_dir: format!("{d}/logs/{}", c.deployment.name),
            bias_vl_file: format!(
                "{d}/bias_vl/{}/gate_bias_vl.safetensors",
                c.model.engram_revision
            ),
            image: if node.image.is_empty() {
                c.engine.image.clone()
            } else {
                node.image.clone()
            },
        }
    }

    /// Path of the checkpoint snapshot below a cache root mounted at `cache_root`.
    #[must_use]
    pub fn snapshot_under(cache_root: &str, repo: &str, commit: &str) -> String {
        format!(
            "{}/hub/{}/snapshots/{commit}",
            cache_root.trim_end_matches('/'),
            repo_folder(repo)
        )
    }
}

/// The hub cache directory (`<HF_HOME>/hub`) of a cache root as the config names it.
#[must_use]
pub fn hub_dir(cache_root: &str) -> PathBuf {
    PathBuf::from(cache_root).join("hub")
}

/// The snapshot directory of `repo` at `commit` under a cache root.
#[must_use]
pub fn snapshot_dir(cache_root: &str, repo: &str, commit: &str) -> PathBuf {
    hub_dir(cache_root)
        .join(repo_folder(repo))
        .join("snapshots")
        .join(commit)
}

#[cfg(test)]
mod nfs_tests {
    use std::net::Ipv4Addr;
    use std::path::Path;

    use super::nfs_server;
    use crate::config::{DeploymentConfig, validate};
    use crate::facts::Detected;

    #[test]
    fn the_nfs_server_is_a_validated_address_or_the_head_fabric() {
        let fabric = Detected::Known(Ipv4Addr::new(198, 18, 0, 1));
        let v = validate(DeploymentConfig::default(), Path::new("/home/u")).unwrap();
        assert_eq!(nfs_server(&v, &fabric), "198.18.0.1");
        let mut c = DeploymentConfig::default();
        c.storage.head_nfs_server = "198.18.0.9".into();
        let v = validate(c, Path::new("/home/u")).unwrap();
        assert_eq!(nfs_server(&v, &fabric), "198.18.0.9");
        let mut c = DeploymentConfig::default();
        c.storage.head_nfs_server = "198.18.0.9,nolock".into();
        assert!(validate(c, Path::new("/home/u")).is_err());
    }
}
