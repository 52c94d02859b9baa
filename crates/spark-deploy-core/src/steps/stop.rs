use serde::Serialize;

use super::ranks;
use crate::config::ValidatedConfig;
use crate::container::rank_container_name;
use crate::context::{Context, Outcome, StepFailure};
use crate::describe::{Action, ActionDetail};
use crate::event::Level;
use crate::event::StepKind;
use crate::layout::NodeLayout;

/// Stops every rank, rank 0 first with a grace period, saving each container's log (gzip, named by
/// date, time and rank, newest `log_keep` kept) before removing it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Stop {
    /// (node, container, log dir) in stop order.
    pub ranks: Vec<(String, String, String)>,
    /// Grace period, seconds.
    pub grace_s: u64,
    /// Logs kept per rank.
    pub log_keep: u32,
}

impl Stop {
    /// The teardown of `config`.
    #[must_use]
    pub fn new(config: &ValidatedConfig) -> Self {
        let c = config.config();
        let ranks = c
            .nodes
            .iter()
            .enumerate()
            .map(|(r, n)| {
                (
                    n.name.clone(),
                    rank_container_name(&c.deployment.name, r),
                    NodeLayout::of(config, n).log_dir,
                )
            })
            .collect();
        Self {
            ranks,
            grace_s: c.lifecycle.stop_timeout_s,
            log_keep: c.lifecycle.log_keep,
        }
    }

    pub(crate) fn describe(&self) -> (String, Vec<Action>) {
        let actions = self
            .ranks
            .iter()
            .map(|(node, name, logs)| {
                Action::with(
                    node,
                    format!(
                        "stop {name} (grace {} s), save its log, remove it",
                        self.grace_s
                    ),
                    ActionDetail::Outputs {
                        files: vec![format!(
                            "{logs}/<YYYYmmdd-HHMMSS>-{name}.log.gz (newest {} kept)",
                            self.log_keep
                        )],
                    },
                )
            })
            .collect();
        (
            "stop every rank, rank 0 first, logs saved".to_owned(),
            actions,
        )
    }
}

impl Stop {
    /// Stops every rank in order (rank 0 first), saving logs; skipped when none runs.
    pub(crate) async fn run(&self, ctx: &Context) -> Result<Outcome, StepFailure> {
        let mut stopped = 0;
        for (node, container, log_dir) in &self.ranks {
            let i = ctx.node_index(node);
            match ranks::stop_and_save(ctx, i, container, log_dir, self.log_keep, self.grace_s)
                .await
            {
                Ok(ranks::Stopped::Absent) => {}
                Ok(ranks::Stopped::Removed(path)) => {
                    stopped += 1;
                    let saved = path.map_or_else(
                        || "log not kept (log_keep = 0)".to_owned(),
                        |p| format!("log saved to {p}"),
                    );
                    ctx.log(
                        StepKind::Stop,
                        Some(node),
                        Level::Info,
                        format!("stopped {container}; {saved}"),
                    );
                }
                Err(e) => {
                    return Err(StepFailure::new(
                        StepKind::Stop,
                        e,
                        Some(format!(
                            "check the Docker daemon on {node}, then rerun `spark-deploy down`"
                        )),
                    ));
                }
            }
        }
        if stopped == 0 {
            return Ok(Outcome::Skipped {
                reason: "no rank container of this deployment exists".into(),
            });
        }
        Ok(Outcome::Done { bytes: None })
    }
}
