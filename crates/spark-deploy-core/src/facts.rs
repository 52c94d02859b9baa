//! Values only preflight or fetch can know, as data: each is a [`Detected`] value, either known
//! or [`Detected::Pending`] naming what will be detected where. The placeholder text
//! (`<fabric IPv4 on head, detected at preflight>`) is only their display and serialized form;
//! nothing searches text to find what is pending.

use std::fmt;
use std::net::Ipv4Addr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::config::{NodeConfig, ValidatedConfig};

/// A fact still to be detected: which one, and of what (a node's name, or for the checkpoint's
/// commit `<revision> of <model id>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    /// Which fact.
    pub fact: PendingFact,
    /// Whose: the node's name, or `<revision> of <model id>` for [`PendingFact::ModelCommit`].
    pub of: String,
}

impl fmt::Display for Pending {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.fact {
            PendingFact::ModelCommit => write!(f, "<commit of {}, resolved at fetch>", self.of),
            fact => write!(f, "<{} on {}, detected at preflight>", fact.what(), self.of),
        }
    }
}

impl Pending {
    /// The placeholder `text` shows, if it is one ([`Pending`]'s display form read back, as a
    /// launch record or an export input holds it).
    #[must_use]
    pub fn parse(text: &str) -> Option<Self> {
        if let Some(of) = text
            .strip_prefix("<commit of ")
            .and_then(|t| t.strip_suffix(", resolved at fetch>"))
        {
            return Some(Self {
                fact: PendingFact::ModelCommit,
                of: of.to_owned(),
            });
        }
        let body = text
            .strip_prefix('<')?
            .strip_suffix(", detected at preflight>")?;
        [
            PendingFact::FabricAddr,
            PendingFact::Netdev,
            PendingFact::RdmaDevices,
            PendingFact::GidIndex,
        ]
        .into_iter()
        .find_map(|fact| {
            let of = body.strip_prefix(fact.what())?.strip_prefix(" on ")?;
            Some(Self {
                fact,
                of: of.to_owned(),
            })
        })
    }
}

/// A value detected by a step, or still [`Pending`]. Displayed and serialized as the value, or as
/// the placeholder text while pending.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Detected<T> {
    /// Detected (or set in the config).
    Known(T),
    /// Not yet detected.
    Pending(Pending),
}

impl<T> Detected<T> {
    fn pending(fact: PendingFact, of: impl Into<String>) -> Self {
        Self::Pending(Pending {
            fact,
            of: of.into(),
        })
    }

    /// The value, when known.
    #[must_use]
    pub fn known(&self) -> Option<&T> {
        match self {
            Self::Known(v) => Some(v),
            Self::Pending(_) => None,
        }
    }

    /// What is still pending, if anything.
    #[must_use]
    pub fn pending_fact(&self) -> Option<PendingFact> {
        match self {
            Self::Known(_) => None,
            Self::Pending(p) => Some(p.fact),
        }
    }
}

impl<T: fmt::Display> fmt::Display for Detected<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Known(v) => v.fmt(f),
            Self::Pending(p) => p.fmt(f),
        }
    }
}

impl<T: fmt::Display> Detected<Option<T>> {
    /// The text a launch line carries: the value, the placeholder while pending, `None` when the
    /// node has none.
    #[must_use]
    pub fn text(&self) -> Option<String> {
        match self {
            Self::Known(v) => v.as_ref().map(ToString::to_string),
            Self::Pending(p) => Some(p.to_string()),
        }
    }
}

impl<T: Serialize> Serialize for Detected<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Known(v) => v.serialize(s),
            Self::Pending(p) => s.collect_str(p),
        }
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Detected<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Repr<T> {
            Placeholder(Placeholder),
            Known(T),
        }
        struct Placeholder(Pending);
        impl<'de> Deserialize<'de> for Placeholder {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = String::deserialize(d)?;
                Pending::parse(&text)
                    .map(Placeholder)
                    .ok_or_else(|| serde::de::Error::custom("not a placeholder"))
            }
        }
        Ok(match Repr::<T>::deserialize(d)? {
            Repr::Placeholder(Placeholder(p)) => Self::Pending(p),
            Repr::Known(v) => Self::Known(v),
        })
    }
}

/// Per-node facts the launch needs (the fabric environment of docs/engine-contract.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeFacts {
    /// Node name.
    pub node: String,
    /// The node's fabric IPv4.
    pub fabric_addr: Detected<Ipv4Addr>,
    /// Netdev carrying the fabric address (`NCCL_SOCKET_IFNAME`).
    pub netdev: Detected<String>,
    /// RoCE devices of the fabric port, comma-separated (`NCCL_IB_HCA`, `TF_RDMA_DEVICES`);
    /// `None` when the node has none (NCCL over sockets).
    pub rdma_devices: Detected<Option<String>>,
    /// RoCE v2 GID index of the fabric address (`NCCL_IB_GID_INDEX`, `TF_RDMA_GID_INDEX`);
    /// `None` without RoCE devices.
    pub gid_index: Detected<Option<String>>,
    /// `/dev/infiniband` to pass through.
    pub infiniband_device: Option<String>,
    /// Whether the rank gets a GPU device request.
    pub gpu: bool,
}

impl NodeFacts {
    /// Placeholders for everything not set in the config.
    #[must_use]
    pub fn placeholders(node: &NodeConfig) -> Self {
        let n = node.name.as_str();
        Self {
            node: n.to_owned(),
            fabric_addr: node.fabric_addr.map_or_else(
                || Detected::pending(PendingFact::FabricAddr, n),
                Detected::Known,
            ),
            netdev: Detected::pending(PendingFact::Netdev, n),
            rdma_devices: Detected::pending(PendingFact::RdmaDevices, n),
            gid_index: Detected::pending(PendingFact::GidIndex, n),
            infiniband_device: Some("/dev/infiniband".to_owned()),
            gpu: true,
        }
    }
}

/// Facts of the whole deployment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeploymentFacts {
    /// The checkpoint commit served (the config's revision when it is a commit).
    pub model_commit: Detected<String>,
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
            Detected::Known(rev.clone())
        } else {
            Detected::pending(PendingFact::ModelCommit, format!("{rev} of {}", c.model.id))
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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
    /// The fact's name in its placeholder (`fabric IPv4`, `fabric netdev`, ...).
    fn what(self) -> &'static str {
        match self {
            Self::ModelCommit => "commit",
            Self::FabricAddr => "fabric IPv4",
            Self::Netdev => "fabric netdev",
            Self::RdmaDevices => "RoCE devices of the fabric port",
            Self::GidIndex => "RoCE v2 GID index of the fabric address",
            Self::Context => "context that fits every node",
        }
    }

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
    /// The facts of this node still pending.
    #[must_use]
    pub fn pending(&self) -> Vec<PendingFact> {
        [
            self.fabric_addr.pending_fact(),
            self.netdev.pending_fact(),
            self.rdma_devices.pending_fact(),
            self.gid_index.pending_fact(),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

impl DeploymentFacts {
    /// Every fact still pending, with the node it belongs to (the head's name for the commit).
    #[must_use]
    pub fn unresolved(&self, config: &ValidatedConfig) -> Vec<(String, PendingFact)> {
        let c = config.config();
        let mut out = Vec::new();
        if self.model_commit.known().is_none() {
            out.push((c.nodes[0].name.clone(), PendingFact::ModelCommit));
        }
        if c.serving.context == 0 && self.context.is_none() {
            out.push((c.nodes[0].name.clone(), PendingFact::Context));
        }
        for (f, n) in self.nodes.iter().zip(&c.nodes) {
            out.extend(f.pending().into_iter().map(|p| (n.name.clone(), p)));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_placeholder_is_a_value_shown_as_text_and_read_back() {
        let c = crate::config::validate(
            crate::config::DeploymentConfig::default(),
            std::path::Path::new("/home/u"),
        )
        .unwrap();
        let mut facts = DeploymentFacts::placeholders(&c);
        let head = facts.nodes[0].node.clone();
        assert_eq!(
            facts.nodes[0].netdev.to_string(),
            format!("<fabric netdev on {head}, detected at preflight>")
        );
        assert_eq!(
            facts.nodes[0].rdma_devices.text(),
            Some(format!(
                "<RoCE devices of the fabric port on {head}, detected at preflight>"
            ))
        );
        // Serialized as today's text, and read back as the same pending value.
        let json = serde_json::to_string(&facts.nodes[0]).unwrap();
        assert!(json.contains("\"<fabric netdev on "), "{json}");
        let back: NodeFacts = serde_json::from_str(&json).unwrap();
        assert_eq!(back, facts.nodes[0]);
        // A node value that merely looks odd is a value, not a placeholder.
        let odd: Detected<String> = serde_json::from_str("\"<eth0>\"").unwrap();
        assert_eq!(odd, Detected::Known("<eth0>".to_owned()));
        // Pending is a matter of type, not text: filling every fact leaves nothing pending.
        assert!(!facts.unresolved(&c).is_empty());
        facts.model_commit = Detected::Known("a".repeat(40));
        for n in &mut facts.nodes {
            n.fabric_addr = Detected::Known(Ipv4Addr::new(198, 18, 0, 1));
            n.netdev = Detected::Known("enp1s0f0np0".into());
            n.rdma_devices = Detected::Known(None);
            n.gid_index = Detected::Known(None);
        }
        assert!(facts.unresolved(&c).is_empty());
        let json = serde_json::to_value(&facts.nodes[1]).unwrap();
        assert_eq!(json["fabric_addr"], "198.18.0.1");
        assert_eq!(json["rdma_devices"], serde_json::Value::Null);
        assert_eq!(facts.nodes[1].rdma_devices.text(), None);
    }
}
