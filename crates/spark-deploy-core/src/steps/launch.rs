use serde::Serialize;

use crate::config::ValidatedConfig;
use crate::container::ContainerSpec;
use crate::engine::tensorfold::launch::rank_specs;
use crate::facts::DeploymentFacts;
use crate::plan::describe::{Action, ActionDetail};

/// Starts every rank through its node's Docker port, followers first, after comparing the
/// cross-rank fingerprint; both ranks or neither.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LaunchRank {
    /// Containers in start order (rank 1 before rank 0).
    pub containers: Vec<ContainerSpec>,
}

impl LaunchRank {
    /// The launch of `config` with `facts`.
    #[must_use]
    pub fn new(config: &ValidatedConfig, facts: &DeploymentFacts) -> Self {
        Self {
            containers: rank_specs(config, facts),
        }
    }

    pub(crate) fn describe(&self) -> (String, Vec<Action>) {
        let actions = self
            .containers
            .iter()
            .map(|c| {
                Action::with(
                    &c.node,
                    format!("start rank {} ({})", c.rank, c.name),
                    ActionDetail::Container(Box::new(c.clone())),
                )
            })
            .collect();
        (
            "start the ranks, rank 1 before rank 0, both or neither".to_owned(),
            actions,
        )
    }
}
