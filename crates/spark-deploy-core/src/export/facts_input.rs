//! Where an export's facts come from: the last launch's record (the facts preflight detected and
//! the ranks ran with), then anything given explicitly; a fact still at its placeholder refuses
//! the export. And the engine image's content label, read from the head's Docker.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::Path;

use super::ExportError;
use crate::config::ValidatedConfig;
use crate::container::labels;
use crate::facts::{DeploymentFacts, Detected, is_commit};
use crate::layout::NodeLayout;
use crate::lifecycle::launch_record::{self, LaunchRecord};
use crate::ports::docker::DockerNode;

/// Facts given explicitly (flags of `spark-deploy export`, keyword arguments in Python); they
/// win over the launch record.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FactOverrides {
    /// The checkpoint's commit.
    pub model_commit: Option<String>,
    /// Fabric IPv4 per node.
    pub fabric_addr: BTreeMap<String, Ipv4Addr>,
    /// Fabric netdev per node.
    pub netdev: BTreeMap<String, String>,
    /// RoCE devices per node; `None`: the node has none (NCCL over sockets).
    pub rdma_devices: BTreeMap<String, Option<String>>,
    /// RoCE v2 GID index per node; `None`: none.
    pub gid_index: BTreeMap<String, Option<String>>,
}

fn none_or(value: &str) -> Option<String> {
    (value != "none").then(|| value.to_owned())
}

impl FactOverrides {
    /// Parses `NODE=VALUE` for the fact named by `flag` (`fabric-addr`, `netdev`,
    /// `rdma-devices`, `gid-index`) and records it.
    ///
    /// # Errors
    ///
    /// [`ExportError::BadFact`] for a missing `=`, an unknown flag or a value that does not
    /// parse (an IPv4 address; a GID index is a number or `none`).
    pub fn set(&mut self, flag: &str, assignment: &str) -> Result<(), ExportError> {
        let bad = |why: &str| ExportError::BadFact {
            what: format!("--{flag}"),
            value: assignment.to_owned(),
            why: why.to_owned(),
        };
        let (node, value) = assignment
            .split_once('=')
            .filter(|(n, v)| !n.is_empty() && !v.is_empty())
            .ok_or_else(|| bad("expected NODE=VALUE, e.g. head=198.18.0.1"))?;
        let node = node.to_owned();
        match flag {
            "fabric-addr" => {
                let addr = value
                    .parse()
                    .map_err(|_| bad("the value must be an IPv4 address"))?;
                self.fabric_addr.insert(node, addr);
            }
            "netdev" => {
                self.netdev.insert(node, value.to_owned());
            }
            "rdma-devices" => {
                self.rdma_devices.insert(node, none_or(value));
            }
            "gid-index" => {
                if value != "none" && value.parse::<u32>().is_err() {
                    return Err(bad("the value must be a number or `none`"));
                }
                self.gid_index.insert(node, none_or(value));
            }
            _ => {
                return Err(bad(
                    "unknown fact; the facts are fabric-addr, netdev, rdma-devices, gid-index",
                ));
            }
        }
        Ok(())
    }

    /// Sets the checkpoint's commit.
    ///
    /// # Errors
    ///
    /// [`ExportError::BadFact`] unless it is a full 40-hex commit.
    pub fn set_model_commit(&mut self, commit: &str) -> Result<(), ExportError> {
        if !is_commit(commit) {
            return Err(ExportError::BadFact {
                what: "--model-commit".into(),
                value: commit.to_owned(),
                why: "the value must be a full 40-hex commit (lowercase)".into(),
            });
        }
        self.model_commit = Some(commit.to_owned());
        Ok(())
    }

    fn check_nodes(&self, config: &ValidatedConfig) -> Result<(), ExportError> {
        let nodes = &config.config().nodes;
        let known = || {
            nodes
                .iter()
                .map(|n| n.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let named: [(&'static str, Vec<&String>); 4] = [
            ("--fabric-addr", self.fabric_addr.keys().collect()),
            ("--netdev", self.netdev.keys().collect()),
            ("--rdma-devices", self.rdma_devices.keys().collect()),
            ("--gid-index", self.gid_index.keys().collect()),
        ];
        for (what, keys) in named {
            if let Some(node) = keys
                .into_iter()
                .find(|k| !nodes.iter().any(|n| &n.name == *k))
            {
                return Err(ExportError::UnknownNode {
                    what,
                    node: node.clone(),
                    known: known(),
                });
            }
        }
        Ok(())
    }
}

/// The facts an export renders with: placeholders, then the launch record's facts of every
/// node it names (an address set in the config stays), then `overrides`.
///
/// # Errors
///
/// [`ExportError::UnknownNode`] for an override naming no config node, and
/// [`ExportError::UnresolvedFacts`] listing every fact still pending.
pub fn facts_for_export(
    config: &ValidatedConfig,
    record: Option<&LaunchRecord>,
    overrides: &FactOverrides,
) -> Result<DeploymentFacts, ExportError> {
    overrides.check_nodes(config)?;
    let c = config.config();
    let mut facts = DeploymentFacts::placeholders(config);
    if let Some(r) = record {
        if is_commit(&r.model_commit) {
            facts.model_commit = Detected::Known(r.model_commit.clone());
        }
        facts.context = r.context;
        for (f, node) in facts.nodes.iter_mut().zip(&c.nodes) {
            if let Some(detected) = r.nodes.iter().find(|d| d.node == node.name) {
                let configured = node.fabric_addr;
                *f = detected.clone();
                if let Some(a) = configured {
                    f.fabric_addr = Detected::Known(a);
                }
            }
        }
    }
    if let Some(commit) = &overrides.model_commit {
        facts.model_commit = Detected::Known(commit.clone());
    }
    for f in &mut facts.nodes {
        if let Some(a) = overrides.fabric_addr.get(&f.node) {
            f.fabric_addr = Detected::Known(*a);
        }
        if let Some(n) = overrides.netdev.get(&f.node) {
            f.netdev = Detected::Known(n.clone());
        }
        if let Some(d) = overrides.rdma_devices.get(&f.node) {
            f.rdma_devices = Detected::Known(d.clone());
            if d.is_none() {
                // No RoCE: NCCL over sockets, no GID and no device to pass through.
                f.gid_index = Detected::Known(None);
                f.infiniband_device = None;
            }
        }
        if let Some(g) = overrides.gid_index.get(&f.node) {
            f.gid_index = Detected::Known(g.clone());
        }
    }
    let pending = facts.unresolved(config);
    if pending.is_empty() {
        Ok(facts)
    } else {
        Err(ExportError::UnresolvedFacts { pending })
    }
}

/// The last launch's record in the config's state directory, if any.
///
/// # Errors
///
/// [`ExportError::Record`] when it exists but cannot be read.
pub fn last_launch(config: &ValidatedConfig) -> Result<Option<LaunchRecord>, ExportError> {
    Ok(launch_record::read(Path::new(
        &config.config().deployment.state_dir,
    ))?)
}

/// The content label of the head's engine image, read from the head's Docker.
///
/// # Errors
///
/// [`ExportError::ImageContent`] when Docker does not answer, the image is absent or carries no
/// label.
pub async fn image_content(config: &ValidatedConfig) -> Result<String, ExportError> {
    let head = &config.config().nodes[0];
    let image = NodeLayout::of(config, head).image;
    let err = |why: String| ExportError::ImageContent {
        node: head.name.clone(),
        image: image.clone(),
        label: labels::CONTENT,
        why,
    };
    let docker = DockerNode::local(head.name.clone(), Path::new(&head.docker_socket))
        .map_err(|e| err(e.to_string()))?;
    let inspect = docker
        .inspect_image(&image)
        .await
        .map_err(|e| err(e.to_string()))?
        .ok_or_else(|| err("the image is not on the head".into()))?;
    inspect
        .config
        .and_then(|c| c.labels)
        .and_then(|l| l.get(labels::CONTENT).cloned())
        .ok_or_else(|| err("the image carries no content label".into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{DeploymentConfig, validate};
    use crate::facts::{Detected, NodeFacts, PendingFact};

    fn config() -> ValidatedConfig {
        validate(DeploymentConfig::default(), Path::new("/home/u")).unwrap()
    }

    fn detected(node: &str, addr: &str) -> NodeFacts {
        NodeFacts {
            node: node.into(),
            fabric_addr: Detected::Known(addr.parse().unwrap()),
            netdev: Detected::Known("enp1s0f0np0".into()),
            rdma_devices: Detected::Known(Some("rocep1s0f0".into())),
            gid_index: Detected::Known(Some("3".into())),
            infiniband_device: Some("/dev/infiniband".into()),
            gpu: true,
        }
    }

    #[test]
    fn placeholders_refuse_naming_every_node_and_fact_with_its_flag() {
        let c = config();
        let e = facts_for_export(&c, None, &FactOverrides::default()).unwrap_err();
        let ExportError::UnresolvedFacts { pending } = &e else {
            panic!("{e}")
        };
        assert!(
            pending.contains(&("head".into(), PendingFact::Netdev)),
            "{pending:?}"
        );
        assert!(pending.contains(&("worker-1".into(), PendingFact::FabricAddr)));
        let text = e.to_string();
        for want in [
            "--fabric-addr worker-1=<IPv4>",
            "--netdev head=<ifname>",
            "--model-commit",
            "spark-deploy preflight",
        ] {
            assert!(text.contains(want), "{want} missing from {text}");
        }
    }

    #[test]
    fn the_record_then_overrides_resolve_every_fact() {
        let c = config();
        let head_name = c.config().nodes[0].name.clone();
        let worker = c.config().nodes[1].name.clone();
        let record = LaunchRecord {
            config_sha256: String::new(),
            fingerprint: String::new(),
            model_commit: "a".repeat(40),
            nodes: vec![detected(&head_name, "198.18.0.1")],
            context: None,
            ranks: vec![],
            gpu_clocks: None,
            at_unix: 0,
        };
        // The worker is not in the record: still pending.
        let e = facts_for_export(&c, Some(&record), &FactOverrides::default()).unwrap_err();
        assert!(
            e.to_string()
                .contains(&format!("{worker}: its fabric IPv4")),
            "{e}"
        );
        let mut o = FactOverrides::default();
        o.set("fabric-addr", &format!("{worker}=198.18.0.2"))
            .unwrap();
        o.set("netdev", &format!("{worker}=eth9")).unwrap();
        o.set("rdma-devices", &format!("{worker}=none")).unwrap();
        let f = facts_for_export(&c, Some(&record), &o).unwrap();
        assert_eq!(f.model_commit, Detected::Known("a".repeat(40)));
        assert_eq!(f.nodes[0], detected(&head_name, "198.18.0.1"));
        assert_eq!(f.nodes[1].fabric_addr.to_string(), "198.18.0.2");
        assert_eq!(f.nodes[1].rdma_devices, Detected::Known(None));
        assert_eq!(f.nodes[1].gid_index, Detected::Known(None));
        assert_eq!(f.nodes[1].infiniband_device, None);
    }

    #[test]
    fn bad_overrides_name_the_flag_and_the_remedy() {
        let mut o = FactOverrides::default();
        let e = o
            .set("fabric-addr", "head=not-an-ip")
            .unwrap_err()
            .to_string();
        assert!(e.contains("--fabric-addr") && e.contains("IPv4"), "{e}");
        let e = o.set("netdev", "eth0").unwrap_err().to_string();
        assert!(e.contains("NODE=VALUE"), "{e}");
        let e = o.set_model_commit("main").unwrap_err().to_string();
        assert!(e.contains("40-hex"), "{e}");
        o.set("netdev", "spark-9=eth0").unwrap();
        let e = facts_for_export(&config(), None, &o)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("spark-9") && e.contains("use one of head"),
            "{e}"
        );
    }
}
