use std::collections::BTreeMap;

use serde::Serialize;

use crate::config::{ValidatedConfig, WorkerStorage};
use crate::engine::tensorfold::TOKEN_MAP_FILE;
use crate::facts::DeploymentFacts;
use crate::layout::{NodeLayout, repo_folder};
use crate::plan::describe::{Action, ActionDetail, Transfer};

/// What one worker receives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WorkerPlan {
    /// Worker node.
    pub node: String,
    /// Rank it serves.
    pub rank: u32,
    /// Address the bytes travel to (the worker's fabric address, never management).
    pub fabric_addr: String,
    /// NFS volume options in `nfs` mode.
    pub nfs_volume: Option<(String, BTreeMap<String, String>)>,
    /// Files copied in both modes (and the checkpoint in `copy` mode).
    pub transfers: Vec<Transfer>,
}

/// Gives every worker exactly the bytes its rank needs: in `nfs` mode a read-only Docker NFS
/// volume of the head's cache plus local copies of the Engram tables, kit and rank inputs; in
/// `copy` mode the checkpoint files as well.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConfigureWorkerStorage {
    /// Mode.
    pub mode: WorkerStorage,
    /// One entry per worker.
    pub workers: Vec<WorkerPlan>,
}

impl ConfigureWorkerStorage {
    /// The storage plan of `config`.
    #[must_use]
    pub fn new(config: &ValidatedConfig, facts: &DeploymentFacts) -> Self {
        let c = config.config();
        let head = NodeLayout::of(config, &c.nodes[0]);
        let world = c.nodes.len();
        let workers = c
            .nodes
            .iter()
            .enumerate()
            .skip(1)
            .map(|(r, node)| {
                let w = NodeLayout::of(config, node);
                let mut transfers = Vec::new();
                if c.deployment.worker_storage == WorkerStorage::Copy {
                    let snap = format!("hub/{}", repo_folder(&c.model.id));
                    transfers.push(Transfer {
                        what: format!("checkpoint snapshot {} (config, tokenizer, index, every shard incl. vision)", facts.model_commit),
                        from: format!("{}/{snap}", head.hf_cache),
                        to: format!("{}/{snap}", w.hf_cache),
                    });
                }
                transfers.extend([
                    Transfer { what: "Engram tables (local disk, never NFS)".into(), from: head.engram_dir.clone(), to: w.engram_dir.clone() },
                    Transfer { what: "kernel kit (identical bytes)".into(), from: head.kit_dir.clone(), to: w.kit_dir.clone() },
                    Transfer {
                        what: format!("rank {r} weight file"),
                        from: format!("{}/rank-cache/rank{r}of{world}-<hash>.bin", head.inputs_dir),
                        to: format!("{}/rank-cache/", w.inputs_dir),
                    },
                    Transfer {
                        what: "token map".into(),
                        from: format!("{}/{TOKEN_MAP_FILE}", head.inputs_dir),
                        to: format!("{}/{TOKEN_MAP_FILE}", w.inputs_dir),
                    },
                    Transfer { what: "engine binaries".into(), from: head.engine_dir.clone(), to: w.engine_dir.clone() },
                ]);
                let nfs_volume = (c.deployment.worker_storage == WorkerStorage::Nfs).then(|| {
                    let server = if c.storage.head_nfs_server.is_empty() { facts.nodes[0].fabric_addr.clone() } else { c.storage.head_nfs_server.clone() };
                    let path = if c.storage.nfs_path.is_empty() { head.hf_cache.clone() } else { c.storage.nfs_path.clone() };
                    let options = BTreeMap::from([
                        ("type".to_owned(), "nfs".to_owned()),
                        ("device".to_owned(), format!(":{path}")),
                        ("o".to_owned(), format!("addr={server},nfsvers=4.2,ro,nconnect=8,rsize=1048576,wsize=1048576,hard,timeo=600")),
                    ]);
                    (c.storage.nfs_volume.clone(), options)
                });
                WorkerPlan {
                    node: node.name.clone(),
                    rank: u32::try_from(r).unwrap_or(u32::MAX),
                    fabric_addr: facts.nodes[r].fabric_addr.clone(),
                    nfs_volume,
                    transfers,
                }
            })
            .collect();
        Self {
            mode: c.deployment.worker_storage,
            workers,
        }
    }

    pub(crate) fn describe(&self) -> (String, Vec<Action>) {
        let mut actions = Vec::new();
        for w in &self.workers {
            if let Some((name, options)) = &w.nfs_volume {
                actions.push(Action::with(
                    &w.node,
                    "create the read-only NFS volume of the head's cache (export checked on the head), verify every file from a throwaway container",
                    ActionDetail::Volume { name: name.clone(), driver: "local".into(), options: options.clone() },
                ));
            }
            actions.push(Action::with(
                &w.node,
                "copy missing or differing files, resumable, verified by size and sha256 on arrival",
                ActionDetail::Transfer { via: format!("fabric address {}", w.fabric_addr), files: w.transfers.clone() },
            ));
        }
        let mode = match self.mode {
            WorkerStorage::Nfs => "nfs",
            WorkerStorage::Copy => "copy",
        };
        (
            format!("give every worker exactly the bytes its rank needs ({mode} mode)"),
            actions,
        )
    }
}

impl ConfigureWorkerStorage {
    /// Runs the step.
    pub(crate) async fn run(
        &self,
        ctx: &crate::run::Context,
    ) -> Result<crate::run::Outcome, crate::run::StepFailure> {
        let _ = ctx;
        Err(crate::run::StepFailure::new(
            crate::plan::StepKind::ConfigureWorkerStorage,
            "this step's runner is being integrated",
            None,
        ))
    }
}
