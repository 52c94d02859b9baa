//! Plan descriptions: serialisable data describing every step's actions per node.

use std::collections::BTreeMap;

use serde::Serialize;

pub mod render;

use crate::config::{ConfigWarning, ValidatedConfig};
use crate::container::ContainerSpec;
use crate::event::StepKind;
use crate::facts::DeploymentFacts;
use crate::layout::NodeLayout;
use crate::secret::REDACTED;

/// Schema id of `spark-deploy plan --json`.
pub const PLAN_SCHEMA: &str = "spark-deploy.plan/v1";

/// One thing a step does on one node.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Action {
    /// Node name.
    pub node: String,
    /// One line saying what happens.
    pub action: String,
    /// Exact details, when there are any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<ActionDetail>,
}

impl Action {
    /// An action without details.
    #[must_use]
    pub fn new(node: &str, action: impl Into<String>) -> Self {
        Self {
            node: node.to_owned(),
            action: action.into(),
            detail: None,
        }
    }

    /// An action with details.
    #[must_use]
    pub fn with(node: &str, action: impl Into<String>, detail: ActionDetail) -> Self {
        Self {
            node: node.to_owned(),
            action: action.into(),
            detail: Some(detail),
        }
    }
}

/// A file moved from one node to another.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Transfer {
    /// What it is.
    pub what: String,
    /// Source path on the head.
    pub from: String,
    /// Destination path on the worker.
    pub to: String,
}

/// Exact details of an action.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ActionDetail {
    /// Checks run on the node.
    Checks {
        /// Check names with their thresholds.
        checks: Vec<String>,
    },
    /// Files fetched from a Hub repo at a revision.
    Fetch {
        /// `owner/name`.
        repo: String,
        /// Pinned revision.
        revision: String,
        /// Files (or patterns resolved against the Hub's file list).
        files: Vec<String>,
        /// Cache root the files land in.
        cache: String,
        /// Whether the repo needs a token.
        gated: bool,
    },
    /// Files written.
    Outputs {
        /// Paths.
        files: Vec<String>,
    },
    /// A Docker volume created on the node.
    Volume {
        /// Volume name.
        name: String,
        /// Driver.
        driver: String,
        /// Driver options.
        options: BTreeMap<String, String>,
    },
    /// Files transferred to the node.
    Transfer {
        /// Over which address.
        via: String,
        /// The files.
        files: Vec<Transfer>,
    },
    /// A container started.
    Container(Box<ContainerSpec>),
    /// An HTTP request.
    Http {
        /// Method.
        method: String,
        /// URL.
        url: String,
        /// What is sent or expected.
        expect: String,
    },
}

/// One step's description.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepDescription {
    /// The step.
    pub step: StepKind,
    /// What the step achieves.
    pub summary: String,
    /// Its actions in order.
    pub actions: Vec<Action>,
}

/// A node as the plan sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeSummary {
    /// Name.
    pub name: String,
    /// Rank served.
    pub rank: usize,
    /// `local` or the ssh target.
    pub ssh: String,
    /// Fabric IPv4 or its placeholder.
    pub fabric_addr: String,
    /// Container network mode.
    pub network_mode: String,
    /// Where the inputs live.
    pub layout: NodeLayout,
}

/// The deployment's identity and serving settings.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeploymentSummary {
    /// Deployment name.
    pub name: String,
    /// Engine profile.
    pub engine: String,
    /// Checkpoint repo.
    pub model: String,
    /// Checkpoint revision as configured.
    pub revision: String,
    /// Checkpoint commit served (or its placeholder).
    pub model_commit: String,
    /// Served model id.
    pub served_name: String,
    /// API URL on the head.
    pub api: String,
    /// Shared pool.
    pub context: u64,
    /// Streams.
    pub parallel: u32,
    /// `nfs` or `copy`.
    pub worker_storage: String,
    /// Secrets: `***` when set, `not set` otherwise. Values never appear.
    pub secrets: BTreeMap<String, String>,
}

/// The whole plan.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlanDescription {
    /// [`PLAN_SCHEMA`].
    pub schema: &'static str,
    /// Identity and serving settings.
    pub deployment: DeploymentSummary,
    /// Accepted but risky config values.
    pub warnings: Vec<ConfigWarning>,
    /// Nodes, head first.
    pub nodes: Vec<NodeSummary>,
    /// Steps in order.
    pub steps: Vec<StepDescription>,
}

fn secret_state(set: bool) -> String {
    if set {
        REDACTED.to_owned()
    } else {
        "not set".to_owned()
    }
}

impl PlanDescription {
    pub(crate) fn new(
        config: &ValidatedConfig,
        facts: &DeploymentFacts,
        steps: Vec<StepDescription>,
    ) -> Self {
        let c = config.config();
        let head_addr = if c.serving.host == "0.0.0.0" {
            "<head>".to_owned()
        } else {
            c.serving.host.clone()
        };
        let deployment = DeploymentSummary {
            name: c.deployment.name.clone(),
            engine: c.deployment.engine.as_str().into(),
            model: c.model.id.clone(),
            revision: c.model.revision.clone(),
            model_commit: facts.model_commit.to_string(),
            served_name: c.model.served_name.clone(),
            api: format!("http://{head_addr}:{}/v1", c.serving.port),
            context: c.serving.context,
            parallel: c.serving.parallel,
            worker_storage: match c.deployment.worker_storage {
                crate::config::WorkerStorage::Nfs => "nfs".into(),
                crate::config::WorkerStorage::Copy => "copy".into(),
                crate::config::WorkerStorage::Local => "local".into(),
            },
            secrets: BTreeMap::from([
                ("hf_token".to_owned(), secret_state(c.hub.token.is_some())),
                (
                    "api_key".to_owned(),
                    secret_state(c.serving.api_key.is_some()),
                ),
            ]),
        };
        let nodes = c
            .nodes
            .iter()
            .enumerate()
            .map(|(rank, n)| NodeSummary {
                name: n.name.clone(),
                rank,
                ssh: n.ssh.clone(),
                fabric_addr: facts.nodes[rank].fabric_addr.to_string(),
                network_mode: n.network_mode.clone(),
                layout: NodeLayout::of(config, n),
            })
            .collect();
        Self {
            schema: PLAN_SCHEMA,
            deployment,
            warnings: config.warnings().to_vec(),
            nodes,
            steps,
        }
    }

    /// Pretty JSON.
    #[must_use]
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// Every container spec in the plan, in start order.
    #[must_use]
    pub fn containers(&self) -> Vec<&ContainerSpec> {
        self.steps
            .iter()
            .flat_map(|s| &s.actions)
            .filter_map(|a| match &a.detail {
                Some(ActionDetail::Container(spec)) => Some(spec.as_ref()),
                _ => None,
            })
            .collect()
    }
}
