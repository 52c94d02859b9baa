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

/// Between two readiness probes (each asks every node's Docker and the API).
const PROBE_INTERVAL: Duration = Duration::from_millis(500);
/// How often the API port is tried while it is closed (one local TCP connect).
const PORT_POLL: Duration = Duration::from_millis(50);

/// Whether `addr` accepts a TCP connection within `timeout`.
async fn port_accepts(addr: &(String, u16), timeout: Duration) -> bool {
    tokio::time::timeout(
        timeout,
        tokio::net::TcpStream::connect((addr.0.as_str(), addr.1)),
    )
    .await
    .is_ok_and(|r| r.is_ok())
}

/// Waits up to `budget` for `addr` to accept a connection, trying every `poll`: `true` as soon
/// as it does, `false` when the budget ran out with the port still closed.
async fn wait_for_port(addr: &(String, u16), budget: Duration, poll: Duration) -> bool {
    let end = Instant::now() + budget;
    loop {
        let now = Instant::now();
        if now >= end {
            return false;
        }
        let left = end - now;
        if port_accepts(addr, poll.min(left)).await {
            return true;
        }
        tokio::time::sleep(poll.min(end.saturating_duration_since(Instant::now()))).await;
    }
}

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
            if port_open.is_none() && port_accepts(&api_addr, Duration::from_millis(200)).await {
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
            if port_open.is_none() {
                // The engine opens its API once loaded: probe again as soon as the port opens,
                // not up to a whole interval later (`up` from stopped waits for this moment).
                if wait_for_port(&api_addr, PROBE_INTERVAL, PORT_POLL).await {
                    port_open = Some(origin.elapsed().as_secs_f64());
                }
            } else {
                tokio::time::sleep(PROBE_INTERVAL).await;
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn free_addr() -> (String, u16) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        drop(l);
        ("127.0.0.1".to_owned(), port)
    }

    #[tokio::test]
    async fn the_wait_ends_when_the_port_opens_not_at_the_end_of_the_interval() {
        let addr = free_addr();
        let bind = format!("{}:{}", addr.0, addr.1);
        let opener = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(150)).await;
            let l = tokio::net::TcpListener::bind(bind).await.unwrap();
            // Keep it open while the wait connects.
            tokio::time::sleep(Duration::from_secs(3)).await;
            drop(l);
        });
        let t = Instant::now();
        assert!(wait_for_port(&addr, Duration::from_secs(2), PORT_POLL).await);
        let waited = t.elapsed();
        assert!(
            // The bound tells "woke when the port opened" from "woke at the budget's end"
            // (2 s), with room for a loaded host.
            waited >= Duration::from_millis(150) && waited < Duration::from_millis(1500),
            "woke {waited:?} after the start; the port opened after 150 ms, the budget ends at 2 s"
        );
        opener.abort();
    }

    #[tokio::test]
    async fn a_port_that_stays_closed_uses_the_whole_budget() {
        let addr = free_addr();
        let t = Instant::now();
        assert!(!wait_for_port(&addr, Duration::from_millis(300), PORT_POLL).await);
        let waited = t.elapsed();
        assert!(
            waited >= Duration::from_millis(300) && waited < Duration::from_millis(1000),
            "{waited:?}"
        );
    }
}
