use serde::Serialize;

use crate::config::ValidatedConfig;
use crate::plan::describe::{Action, ActionDetail};

/// Checks every node before anything changes: SSH, Docker, GPU and clocks, memory, disk, fabric,
/// ports. Runs on all nodes in parallel (head locally, workers through the Exec port).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Preflight {
    /// Nodes checked, head first.
    pub nodes: Vec<String>,
    /// `MemAvailable` floor, GiB.
    pub min_avail_gib: u32,
    /// API port that must be free on the head.
    pub api_port: u16,
    /// Rendezvous port that must be free on the head's fabric address.
    pub rendezvous_port: u16,
}

impl Preflight {
    /// The preflight of `config`.
    #[must_use]
    pub fn new(config: &ValidatedConfig) -> Self {
        let c = config.config();
        Self {
            nodes: c.nodes.iter().map(|n| n.name.clone()).collect(),
            min_avail_gib: c.lifecycle.min_avail_gib,
            api_port: c.serving.port,
            rendezvous_port: c.engine.rendezvous_port,
        }
    }

    pub(crate) fn describe(&self) -> (String, Vec<Action>) {
        let actions = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, node)| {
                let mut checks = vec![
                    if i == 0 { "exec: local".to_owned() } else { "ssh: BatchMode key login, host key known; sudo -n".to_owned() },
                    "docker: daemon reachable, GPU device requests available, no other GPU container".to_owned(),
                    "gpu: nvidia-smi, model, clock caps equal on every node".to_owned(),
                    format!("memory: MemAvailable >= {} GiB; budget of weights + arena + KV for the pool", self.min_avail_gib),
                    "disk: space for what is still missing".to_owned(),
                    "fabric: address local on its netdev, peer reachable, RoCE devices ACTIVE, RoCE v2 GID index".to_owned(),
                ];
                if i == 0 {
                    checks.push(format!("ports: {} (API) and {} (rendezvous) free", self.api_port, self.rendezvous_port));
                }
                Action::with(node, "collect facts and decide", ActionDetail::Checks { checks })
            })
            .collect();
        (
            "check every node before anything changes".to_owned(),
            actions,
        )
    }
}
