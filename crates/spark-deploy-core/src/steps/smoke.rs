use serde::Serialize;

use std::time::{Duration, Instant};

use crate::config::ValidatedConfig;
use crate::container::rank_container_name;
use crate::context::{Context, Outcome, StepFailure};
use crate::describe::Action;
use crate::engine::{ApiEndpoint, Engine, ProbeError, Readiness};
use crate::event::Level;
use crate::event::StepKind;
use crate::secret::Secret;

/// Waits for readiness (both containers running, rank 1 loaded, `/v1/models` lists the served
/// name) and runs one greedy chat completion with thinking off through rank 0.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Smoke {
    /// Head node.
    pub node: String,
    /// Base URL of the API as seen from the head.
    pub base_url: String,
    /// Served model id.
    pub served_name: String,
    /// Readiness timeout, seconds.
    pub timeout_s: u64,
    /// The engine's probes, as the plan shows them.
    #[serde(skip)]
    pub actions: Vec<Action>,
}

impl Smoke {
    /// The smoke test of `config`.
    #[must_use]
    pub fn new(engine: &dyn Engine, config: &ValidatedConfig) -> Self {
        let c = config.config();
        let host = if c.serving.host == "0.0.0.0" {
            "127.0.0.1"
        } else {
            c.serving.host.as_str()
        };
        let mut smoke = Self {
            node: c.nodes[0].name.clone(),
            base_url: format!("http://{host}:{}", c.serving.port),
            served_name: c.model.served_name.clone(),
            timeout_s: c.lifecycle.ready_timeout_s,
            actions: Vec::new(),
        };
        smoke.actions = engine.plan_smoke(config, &smoke.endpoint(None));
        smoke
    }

    pub(crate) fn describe(&self) -> (String, Vec<Action>) {
        (
            "prove the ranks serve: readiness, then one real generation".to_owned(),
            self.actions.clone(),
        )
    }

    fn endpoint(&self, key: Option<Secret>) -> ApiEndpoint {
        ApiEndpoint {
            base_url: self.base_url.clone(),
            served_name: self.served_name.clone(),
            key,
        }
    }
}

/// Errors of Smoke.
#[derive(Debug, thiserror::Error)]
pub enum SmokeError {
    /// A probe found the pair broken (a rank exited, a follower's link error, a wrong answer).
    #[error("{0}; every rank is being stopped")]
    Probe(#[source] ProbeError),
    /// Readiness did not come in time.
    #[error("not ready after {timeout_s} s: {last}")]
    Timeout {
        /// The timeout.
        timeout_s: u64,
        /// The last observation.
        last: String,
    },
    /// The API key could not be read.
    #[error(transparent)]
    ApiKey(#[from] crate::lifecycle::api_key::ApiKeyError),
    /// Cancelled.
    #[error("cancelled while waiting for readiness")]
    Cancelled,
}

impl Smoke {
    /// Waits for readiness (the engine's probe, retried while a node's Docker does not answer),
    /// then runs the engine's generation probe.
    pub(crate) async fn run(
        &self,
        ctx: &Context,
        engine: &dyn Engine,
    ) -> Result<Outcome, StepFailure> {
        let fail = |e: SmokeError| {
            let remedy = match &e {
                SmokeError::Timeout { .. } => {
                    "every rank was stopped and its log saved under <data_dir>/logs/<deployment>/ on its node: if the ranks were still loading, raise lifecycle.ready_timeout_s; otherwise fix what the logs name"
                }
                SmokeError::ApiKey(_) => {
                    "run `spark-deploy up` again: it writes the API key file before the launch"
                }
                SmokeError::Cancelled => "run `spark-deploy up` again when ready",
                SmokeError::Probe(_) => {
                    "every rank was stopped and its log saved gzipped on its node under <data_dir>/logs/<deployment>/ (the newest *.log.gz); fix what it names, then run `spark-deploy up`"
                }
            };
            let (node, rank) = match &e {
                SmokeError::Probe(
                    ProbeError::RankExited { rank, node, .. }
                    | ProbeError::FollowError { rank, node, .. },
                ) => (Some(node.clone()), Some(*rank)),
                _ => (None, None),
            };
            StepFailure::new(StepKind::Smoke, e, Some(remedy.into())).at(node, rank)
        };
        let c = ctx.config().config();
        let key = crate::lifecycle::api_key::client_key(&c.serving).map_err(|e| fail(e.into()))?;
        let api = self.endpoint(key);
        if ctx.already_running()
            && matches!(engine.probe_ready(ctx, &api).await, Ok(Readiness::Ready))
        {
            return Ok(Outcome::Skipped {
                reason: format!(
                    "{} already serving on port {}: every rank runs and answers",
                    self.served_name, c.serving.port
                ),
            });
        }
        let start = Instant::now();
        // Startup timings count from the launch of the first rank (this run's), else from now.
        let origin = ctx.launch_started().unwrap_or(start);
        let api_addr = (
            if c.serving.host == "0.0.0.0" {
                "127.0.0.1".to_owned()
            } else {
                c.serving.host.clone()
            },
            c.serving.port,
        );
        let mut port_open: Option<f64> = None;
        let mut last_note = Instant::now();
        loop {
            if ctx.is_cancelled() {
                return Err(fail(SmokeError::Cancelled));
            }
            if port_open.is_none()
                && tokio::time::timeout(
                    Duration::from_millis(200),
                    tokio::net::TcpStream::connect((api_addr.0.as_str(), api_addr.1)),
                )
                .await
                .is_ok_and(|r| r.is_ok())
            {
                port_open = Some(origin.elapsed().as_secs_f64());
            }
            let why = match engine.probe_ready(ctx, &api).await {
                Ok(Readiness::Ready) => break,
                Ok(Readiness::Waiting(why)) => why,
                // Docker not answering says nothing about the ranks: retry, never stop a
                // healthy pair for it.
                Err(e) if e.is_transient() => e.to_string(),
                Err(e) => return Err(fail(SmokeError::Probe(e))),
            };
            if start.elapsed() > Duration::from_secs(self.timeout_s) {
                return Err(fail(SmokeError::Timeout {
                    timeout_s: self.timeout_s,
                    last: why,
                }));
            }
            if last_note.elapsed() > Duration::from_secs(5) {
                let latest = ctx
                    .log_tail(0, &rank_container_name(&c.deployment.name, 0), 1)
                    .await;
                ctx.log(
                    StepKind::Smoke,
                    Some(&self.node),
                    Level::Info,
                    format!("waiting: {why}; rank 0: {}", latest.trim()),
                );
                last_note = Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let http_ready = origin.elapsed().as_secs_f64();
        let line = engine
            .probe_generation(ctx, &api)
            .await
            .map_err(|e| fail(SmokeError::Probe(e)))?;
        let timings = crate::lifecycle::startup::StartupTimings {
            at_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
                .saturating_sub(origin.elapsed().as_secs()),
            port_open_s: port_open.unwrap_or(http_ready),
            http_ready_s: http_ready,
            first_token_s: origin.elapsed().as_secs_f64(),
        };
        ctx.log(
            StepKind::Smoke,
            Some(&self.node),
            Level::Info,
            format!(
                "startup: port open {:.1} s, HTTP ready {:.1} s, first token {:.1} s after the launch",
                timings.port_open_s, timings.http_ready_s, timings.first_token_s
            ),
        );
        let state_dir = std::path::Path::new(&c.deployment.state_dir);
        if let Err(e) = crate::lifecycle::startup::write(state_dir, &timings) {
            ctx.log(
                StepKind::Smoke,
                None,
                Level::Warn,
                format!("{e}: bench will not show the startup timings"),
            );
        }
        ctx.log(StepKind::Smoke, Some(&self.node), Level::Info, line);
        ctx.log(
            StepKind::Smoke,
            Some(&self.node),
            Level::Info,
            format!("{} is running on port {}", self.served_name, c.serving.port),
        );
        Ok(Outcome::Done { bytes: None })
    }
}
