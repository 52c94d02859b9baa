use std::path::Path;

use serde::Serialize;

mod collect;
mod engine_source;
mod fabric_peers;

use crate::config::ValidatedConfig;
use crate::context::{Context, Outcome, StepFailure};
use crate::describe::{Action, ActionDetail};
use crate::engine::Engine;
use crate::event::Level;
use crate::event::StepKind;
use crate::facts::Detected;
use crate::preflight::decide::{NodeFacts, PortProbe, Settings, decide};
use crate::preflight::report::{Check, PreflightReport, Verdict};
use crate::preflight::roce;
use collect::{gather, gather_prerequisites, settle_inputs, settle_shares};

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
    /// Rendezvous ports that must be free on the head's fabric address, one per follower (the
    /// engine profile's).
    pub rendezvous_ports: Vec<u16>,
    /// The container runtime the ranks run under, which every daemon must have.
    pub runtime: String,
    /// Skip when the pair of the last launch still runs with this very config (its launch record
    /// matches): `up` on a running deployment. A launch that must restart ranks after all runs
    /// the deferred checks first.
    pub skip_when_running: bool,
    /// `engine.repo` (the engine is built from it when set).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub engine_repo: String,
    /// `engine.base_image`.
    #[serde(skip)]
    pub base_image: String,
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
            rendezvous_ports: crate::engine::for_config(config)
                .rendezvous_ports(config)
                .into_iter()
                .map(|(_, port)| port)
                .collect(),
            runtime: c.engine.runtime.clone(),
            skip_when_running: false,
            engine_repo: c.engine.repo.clone(),
            base_image: c.engine.base_image.clone(),
        }
    }

    /// The same checks, skipped while the recorded pair runs unchanged (the standard plan's
    /// preflight).
    #[must_use]
    pub fn skip_when_running(mut self) -> Self {
        self.skip_when_running = true;
        self
    }

    pub(crate) fn describe(&self) -> (String, Vec<Action>) {
        let actions = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, node)| {
                let mut checks = vec![
                    if i == 0 { "exec: local".to_owned() } else { "ssh: BatchMode key login, host key known; sudo -n".to_owned() },
                    format!("docker: daemon reachable, runtime {} registered, no other GPU container", self.runtime),
                    "gpu: nvidia-smi, model, clock caps equal on every node".to_owned(),
                    format!("memory: MemAvailable >= {} GiB; budget of weights + arena + KV for the pool (CONTEXT 0: the largest pool that fits every node)", self.min_avail_gib),
                    if i == 0 {
                        "disk: space for what is still missing (checkpoint, rank files, Engram tables, kit)".to_owned()
                    } else {
                        "disk: space for this node's share (its rank file, Engram tables, kit, engine binaries, the engine image; copy mode: the checkpoint's small files)".to_owned()
                    },
                    "fabric: address local on its netdev, peer reachable, RoCE devices ACTIVE, RoCE v2 GID index".to_owned(),
                ];
                if i == 0 {
                    checks.push("engine: the binaries BuildImage ships are in the engine directory; the base image is in Docker (never pulled); nfs mode: the cache exported read-only to every worker".to_owned());
                    let rdv = self.rendezvous_ports.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
                    checks.push(format!("ports: {} (API) and {rdv} (rendezvous) free", self.api_port));
                    if !self.engine_repo.is_empty() {
                        checks.push(format!("engine: base image {} present (never pulled); {} reachable with the commit", self.base_image, self.engine_repo));
                    }
                }
                Action::with(node, "collect facts and decide", ActionDetail::Checks { checks })
            })
            .collect();
        let summary = if self.skip_when_running {
            "check every node before anything changes (skipped while the last launch's pair runs with this config)"
        } else {
            "check every node before anything changes"
        };
        (summary.to_owned(), actions)
    }
}

/// Why preflight stopped the deployment.
#[derive(Debug, thiserror::Error)]
#[error("preflight failed ({} check(s)); nothing was changed:\n{}", .report.failures().len(), .report.to_table())]
pub struct PreflightFailed {
    /// The whole table.
    pub report: PreflightReport,
}

/// When the rank containers of the last launch all still run (same container IDs) and that launch
/// used this very config, restores the facts it was launched with, marks preflight deferred and
/// says why it is skipped. `None` (run the checks) in every other case, also when the record is
/// unreadable.
async fn unchanged_running_pair(ctx: &Context) -> Option<String> {
    use crate::lifecycle::launch_record;
    let state_dir = Path::new(&ctx.config().config().deployment.state_dir);
    let record = launch_record::read(state_dir).ok().flatten()?;
    if record.config_sha256 != launch_record::config_sha256(ctx.config())
        || record.ranks.len() != ctx.config().config().nodes.len()
        || record.nodes.len() != ctx.config().config().nodes.len()
    {
        return None;
    }
    for r in &record.ranks {
        let d = ctx.docker(r.node).await.ok()?;
        let info = d.inspect_container(&r.name).await.ok().flatten()?;
        let running = info.state.and_then(|s| s.running).unwrap_or(false);
        if !running || info.id.as_deref() != Some(r.id.as_str()) {
            return None;
        }
    }
    ctx.update_facts(|f| {
        f.model_commit = Detected::Known(record.model_commit.clone());
        f.nodes.clone_from(&record.nodes);
        f.context = record.context;
    });
    ctx.set_preflight_deferred(true);
    Some(format!(
        "every rank runs unchanged (fingerprint {}) since a launch that passed preflight with this config; `spark-deploy preflight` checks the nodes now",
        record.fingerprint.get(..12).unwrap_or(&record.fingerprint)
    ))
}

fn port_free(addr: &str) -> bool {
    std::net::TcpListener::bind(addr).is_ok()
}

impl Preflight {
    /// Checks every node in parallel, records the detected facts, and fails with the table when
    /// any check fails.
    pub(crate) async fn run(
        &self,
        ctx: &Context,
        engine: &dyn Engine,
    ) -> Result<Outcome, StepFailure> {
        if self.skip_when_running
            && let Some(reason) = unchanged_running_pair(ctx).await
        {
            return Ok(Outcome::Skipped { reason });
        }
        self.check(ctx, engine).await
    }

    /// Runs every check (also the deferred preflight of a launch that must restart the ranks).
    pub(crate) async fn check(
        &self,
        ctx: &Context,
        engine: &dyn Engine,
    ) -> Result<Outcome, StepFailure> {
        ctx.set_preflight_deferred(false);
        let c = ctx.config().config();
        let peers = fabric_peers::peers(&fabric_peers::resolve(ctx).await);
        let gathered =
            futures::future::join_all((0..c.nodes.len()).map(|i| gather(ctx, i, peers[i]))).await;
        let mut head = None;
        let mut facts: Vec<NodeFacts> = Vec::with_capacity(gathered.len());
        for (f, h) in gathered {
            head = head.or(h);
            facts.push(f);
        }
        settle_inputs(ctx, &mut facts, head).await;
        facts[0].engine_build = engine_source::collect(ctx).await;
        // Boxed: these futures hold many awaits, kept off the stack of whoever polls the plan.
        if let Some(h) = facts.first_mut() {
            Box::pin(gather_prerequisites(ctx, engine, h)).await;
        }
        Box::pin(settle_shares(ctx, engine, &mut facts)).await;
        let api = format!("{}:{}", c.serving.host, c.serving.port);
        // A port held by this deployment's own running rank 0 is not a conflict (second `up`).
        let ours = match ctx.docker(0).await {
            Ok(d) => d
                .inspect_container(&crate::container::rank_container_name(
                    &c.deployment.name,
                    0,
                ))
                .await
                .ok()
                .flatten()
                .and_then(|i| i.state)
                .and_then(|s| s.running)
                .unwrap_or(false),
            Err(_) => false,
        };
        let head_src = facts[0]
            .route
            .as_ref()
            .and_then(|r| r.as_ref().ok())
            .and_then(|t| roce::parse_route(t))
            .map(|r| r.src);
        facts[0].ports.push(PortProbe {
            check: Check::PortApi,
            free: ours || port_free(&api),
            addr: api,
            remedy: "stop what listens there (`spark-deploy down` if it is an old deployment) or change serving.port".into(),
        });
        if let Some(a) = head_src {
            for (rank, port) in engine.rendezvous_ports(ctx.config()) {
                let rdv = format!("{a}:{port}");
                facts[0].ports.push(PortProbe {
                    check: Check::PortRendezvous,
                    free: ours || port_free(&rdv),
                    addr: rdv,
                    remedy: format!("rank {rank} joins rank 0 there: stop the old rank 0 or change engine.rendezvous_port"),
                });
            }
        }
        let decision = decide(&Settings::of(ctx.config()), &facts);
        let report = PreflightReport {
            results: decision.results,
        };
        for r in &report.results {
            let level = match r.verdict {
                Verdict::Ok => Level::Info,
                Verdict::Warn => Level::Warn,
                Verdict::Fail => Level::Error,
            };
            let remedy = r
                .remedy
                .as_ref()
                .map_or_else(String::new, |m| format!(" — {m}"));
            ctx.log(
                StepKind::Preflight,
                Some(&r.node),
                level,
                format!("{}: {}{remedy}", r.check, r.observed),
            );
        }
        // What was detected is recorded also when a check failed (a dry run shows it).
        ctx.update_facts(|facts| {
            facts.context = decision.context;
            for (nf, f) in facts.nodes.iter_mut().zip(&decision.detected) {
                if let Some(r) = &f.route {
                    nf.fabric_addr = Detected::Known(r.src);
                    nf.netdev = Detected::Known(r.dev.clone());
                }
                nf.rdma_devices = Detected::Known(f.roce.as_ref().map(|r| r.devices.join(",")));
                nf.gid_index = Detected::Known(f.roce.as_ref().map(|r| r.gid_index.to_string()));
                nf.infiniband_device = f.infiniband.then(|| "/dev/infiniband".to_owned());
                nf.gpu = f.gpu;
            }
        });
        ctx.set_preflight_report(report.clone());
        if report.verdict() == Verdict::Fail {
            return Err(StepFailure::new(
                StepKind::Preflight,
                PreflightFailed { report },
                Some("fix the failed checks; nothing was changed".into()),
            ));
        }
        Ok(Outcome::Done { bytes: None })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_in_use_is_seen_on_loopback() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        assert!(!port_free(&addr));
        drop(l);
        assert!(port_free(&addr));
    }
}
