//! Values only preflight or fetch can know, as data: either the detected value or an explicit
//! placeholder naming what will be detected where — never an empty string.

use serde::{Deserialize, Serialize};

use crate::config::{NodeConfig, ValidatedConfig};

/// Per-node facts the launch needs (the fabric environment of docs/engine-contract.md).
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
    /// The CONTEXT preflight computed when `serving.context` is 0 (the largest that fits every
    /// node); `None` until then, and whenever the config names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<u64>,
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
            context: None,
        }
    }

    /// The pool the ranks get (`--context`): `serving.context`, or when it is 0 the largest that
    /// fits, as preflight computed it (a placeholder until then).
    #[must_use]
    pub fn context(&self, config: &ValidatedConfig) -> String {
        match (config.config().serving.context, self.context) {
            (0, Some(n)) => n.to_string(),
            (0, None) => "<largest CONTEXT that fits every node, computed at preflight>".to_owned(),
            (n, _) => n.to_string(),
        }
    }
}

/// A fact a step needs that preflight or fetch has not yet detected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PendingFact {
    /// The checkpoint's commit (resolved at fetch).
    ModelCommit,
    /// A node's fabric IPv4 (detected at preflight).
    FabricAddr,
    /// A node's fabric netdev (detected at preflight).
    Netdev,
    /// A node's RoCE devices (detected at preflight).
    RdmaDevices,
    /// A node's RoCE v2 GID index (detected at preflight).
    GidIndex,
    /// The pool when `serving.context` is 0: the largest that fits (computed at preflight).
    Context,
}

impl PendingFact {
    /// What it is and which step detects it, for people.
    #[must_use]
    pub fn describe(self) -> &'static str {
        match self {
            Self::ModelCommit => "the checkpoint's commit (resolved by FetchCheckpoint)",
            Self::FabricAddr => "its fabric IPv4 address (detected by Preflight)",
            Self::Netdev => "its fabric netdev (detected by Preflight)",
            Self::RdmaDevices => "its RoCE devices (detected by Preflight)",
            Self::GidIndex => "its RoCE v2 GID index (detected by Preflight)",
            Self::Context => {
                "the CONTEXT that fits every node, asked for by CONTEXT=0 (computed by Preflight)"
            }
        }
    }
}

impl NodeFacts {
    /// The facts of this node still at their placeholders (compared with the placeholders of
    /// `node`, never searched for in text).
    #[must_use]
    pub fn pending(&self, node: &NodeConfig) -> Vec<PendingFact> {
        let p = Self::placeholders(node);
        let mut out = Vec::new();
        if self.fabric_addr == p.fabric_addr && node.fabric_addr.is_none() {
            out.push(PendingFact::FabricAddr);
        }
        if self.netdev == p.netdev {
            out.push(PendingFact::Netdev);
        }
        if self.rdma_devices.is_some() && self.rdma_devices == p.rdma_devices {
            out.push(PendingFact::RdmaDevices);
        }
        if self.gid_index.is_some() && self.gid_index == p.gid_index {
            out.push(PendingFact::GidIndex);
        }
        out
    }
}

impl DeploymentFacts {
    /// Every fact still pending, with the node it belongs to (the head's name for the commit).
    #[must_use]
    pub fn unresolved(&self, config: &ValidatedConfig) -> Vec<(String, PendingFact)> {
        let c = config.config();
        let mut out = Vec::new();
        if !is_commit(&self.model_commit) {
            out.push((c.nodes[0].name.clone(), PendingFact::ModelCommit));
        }
        if c.serving.context == 0 && self.context.is_none() {
            out.push((c.nodes[0].name.clone(), PendingFact::Context));
        }
        for (f, n) in self.nodes.iter().zip(&c.nodes) {
            out.extend(f.pending(n).into_iter().map(|p| (n.name.clone(), p)));
        }
        out
    }
}

/// Whether `rev` is a full 40-hex commit hash.
#[must_use]
pub fn is_commit(rev: &str) -> bool {
    rev.len() == 40
        && rev
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}
