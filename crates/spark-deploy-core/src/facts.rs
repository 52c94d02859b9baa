//! Values only preflight or fetch can know, as data: either the detected value or an explicit
//! placeholder naming what will be detected where — never an empty string.

use serde::{Deserialize, Serialize};

use crate::config::{NodeConfig, ValidatedConfig};

/// Per-node facts the launch needs (ENGINE-CONTRACT.md §12.4).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeFacts {
    /// Node name.
    pub node: String,
    /// The node's fabric IPv4.
    pub fabric_addr: String,
    /// Netdev carrying the fabric address (`NCCL_SOCKET_IFNAME`).
    pub netdev: String,
    /// RoCE devices of the fabric port, comma-separated (`NCCL_IB_HCA`, `TF_RDMA_DEVICES`);
    /// `None` when the node has none (NCCL over sockets).
    pub rdma_devices: Option<String>,
    /// RoCE v2 GID index of the fabric address (`NCCL_IB_GID_INDEX`, `TF_RDMA_GID_INDEX`).
    pub gid_index: Option<String>,
    /// `/dev/infiniband` to pass through.
    pub infiniband_device: Option<String>,
    /// Whether the rank gets a GPU device request.
    pub gpu: bool,
}

fn detect(what: &str, node: &str) -> String {
    format!("<{what} on {node}, detected at preflight>")
}

impl NodeFacts {
    /// Placeholders for everything not set in the config.
    #[must_use]
    pub fn placeholders(node: &NodeConfig) -> Self {
        let n = node.name.as_str();
        Self {
            node: n.to_owned(),
            fabric_addr: node
                .fabric_addr
                .map_or_else(|| detect("fabric IPv4", n), |a| a.to_string()),
            netdev: detect("fabric netdev", n),
            rdma_devices: Some(detect("RoCE devices of the fabric port", n)),
            gid_index: Some(detect("RoCE v2 GID index of the fabric address", n)),
            infiniband_device: Some("/dev/infiniband".to_owned()),
            gpu: true,
        }
    }
}

/// Facts of the whole deployment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeploymentFacts {
    /// The checkpoint commit served (the config's revision when it is a commit).
    pub model_commit: String,
    /// One entry per node, in config order.
    pub nodes: Vec<NodeFacts>,
    /// Commit of every fetched repository (`owner/name` → commit), recorded by FetchCheckpoint.
    #[serde(skip)]
    pub commits: std::collections::BTreeMap<String, String>,
}

impl DeploymentFacts {
    /// Placeholders for a config before preflight and fetch.
    #[must_use]
    pub fn placeholders(config: &ValidatedConfig) -> Self {
        let c = config.config();
        let rev = &c.model.revision;
        let model_commit = if crate::commit::is_commit_id(rev) {
            rev.clone()
        } else {
            format!("<commit of {rev} of {}, resolved at fetch>", c.model.id)
        };
        Self {
            model_commit,
            nodes: c.nodes.iter().map(NodeFacts::placeholders).collect(),
            commits: std::collections::BTreeMap::new(),
        }
    }
}
