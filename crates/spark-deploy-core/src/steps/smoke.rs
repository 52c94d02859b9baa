use serde::Serialize;

use std::time::{Duration, Instant};

use super::ranks;
use crate::config::ValidatedConfig;
use crate::engine::tensorfold::launch::container_name;
use crate::event::Level;
use crate::plan::StepKind;
use crate::plan::describe::{Action, ActionDetail};
use crate::run::{Context, Outcome, StepFailure};
use crate::secret::Secret;

/// Waits for readiness (both containers running, rank 1 loaded, `/v1/models` lists the served
/// name) and runs one greedy chat completion with thinking off through rank 0.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Smoke {
    /// Head node.
    pub node: String,
    /// Base URL of the API as seen from the head.
    pub base_url: String,
    /// Served model id.
    pub served_name: String,
    /// Readiness timeout, seconds.
    pub timeout_s: u64,
}

impl Smoke {
    /// The smoke test of `config`.
    #[must_use]
    pub fn new(config: &ValidatedConfig) -> Self {
        let c = config.config();
        let host = if c.serving.host == "0.0.0.0" {
            "127.0.0.1"
        } else {
            c.serving.host.as_str()
        };
        Self {
            node: c.nodes[0].name.clone(),
            base_url: format!("http://{host}:{}", c.serving.port),
            served_name: c.model.served_name.clone(),
            timeout_s: c.lifecycle.ready_timeout_s,
        }
    }

    pub(crate) fn describe(&self) -> (String, Vec<Action>) {
        let actions = vec![
            Action::with(
                &self.node,
                format!(
                    "wait up to {} s for readiness, stop both ranks if either exits",
                    self.timeout_s
                ),
                ActionDetail::Http {
                    method: "GET".into(),
                    url: format!("{}/v1/models", self.base_url),
                    expect: format!("200 listing {}", self.served_name),
                },
            ),
            Action::with(
                &self.node,
                "one greedy chat completion, thinking off",
                ActionDetail::Http {
                    method: "POST".into(),
                    url: format!("{}/v1/chat/completions", self.base_url),
                    expect: "\"What is 17*23?\" answered with 391".into(),
                },
            ),
        ];
        (
            "prove the pair serves: readiness, then one real generation".to_owned(),
            actions,
        )
    }
}

/// Errors of Smoke.
#[derive(Debug, thiserror::Error)]
pub enum SmokeError {
    /// A rank's container stopped while waiting.
    #[error(
        "rank {rank} ({container} on {node}) is not running (exit code {exit_code:?}); both ranks are being stopped; its log ends with:\n{tail}"
    )]
    RankDied {
        /// Rank.
        rank: usize,
        /// Node.
        node: String,
        /// Container.
        container: String,
        /// Exit code, when known.
        exit_code: Option<i64>,
        /// Log tail.
        tail: String,
    },
    /// A follower reported a link error.
    #[error("rank {rank} on {node} reported a link error: {line}")]
    FollowError {
        /// Rank.
        rank: usize,
        /// Node.
        node: String,
        /// The engine's JSON line.
        line: String,
    },
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
    /// The generation failed or was not sane.
    #[error("the smoke generation failed: {0}")]
    Generation(String),
    /// Cancelled.
    #[error("cancelled while waiting for readiness")]
    Cancelled,
}

/// One observation of the pair's state.
enum Probe {
    Ready,
    Waiting(String),
}

impl Smoke {
    fn client() -> reqwest::Client {
        reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap_or_default()
    }

    async fn probe(
        &self,
        ctx: &Context,
        key: Option<&Secret>,
        client: &reqwest::Client,
    ) -> Result<Probe, SmokeError> {
        let c = ctx.config().config();
        let mut rank1_loaded = true;
        for (rank, node) in c.nodes.iter().enumerate() {
            let container =
                container_name(&c.deployment.name, u32::try_from(rank).unwrap_or(u32::MAX));
            let docker = ctx
                .docker(rank)
                .await
                .map_err(|e| SmokeError::Generation(e.to_string()))?;
            let state = docker
                .inspect_container(&container)
                .await
                .ok()
                .flatten()
                .and_then(|i| i.state);
            let running = state.as_ref().and_then(|s| s.running).unwrap_or(false);
            if !running {
                let tail = ranks::log_tail(ctx, rank, &container, 30).await;
                return Err(SmokeError::RankDied {
                    rank,
                    node: node.name.clone(),
                    container,
                    exit_code: state.and_then(|s| s.exit_code),
                    tail,
                });
            }
            if rank > 0 {
                let log = ranks::log_tail(ctx, rank, &container, 200).await;
                for line in log.lines() {
                    if serde_json::from_str::<serde_json::Value>(line.trim())
                        .is_ok_and(|v| v.get("follow").is_some())
                    {
                        return Err(SmokeError::FollowError {
                            rank,
                            node: node.name.clone(),
                            line: line.trim().to_owned(),
                        });
                    }
                }
                rank1_loaded &= log.lines().any(|l| {
                    serde_json::from_str::<serde_json::Value>(l.trim())
                        .is_ok_and(|v| v.get("loaded_s").is_some())
                });
            }
        }
        let url = format!("{}/v1/models", self.base_url);
        match crate::lifecycle::api_key::authorize(client.get(&url), key)
            .send()
            .await
        {
            Ok(r) if r.status().is_success() => {
                let body = r.text().await.unwrap_or_default();
                if !body.contains(&format!("\"{}\"", self.served_name)) {
                    Ok(Probe::Waiting(format!(
                        "/v1/models does not list {} yet",
                        self.served_name
                    )))
                } else if !rank1_loaded {
                    Ok(Probe::Waiting(
                        "rank 1 has not printed its loaded line yet".into(),
                    ))
                } else {
                    Ok(Probe::Ready)
                }
            }
            Ok(r) => Ok(Probe::Waiting(format!(
                "/v1/models answered {}",
                r.status()
            ))),
            Err(e) => Ok(Probe::Waiting(format!(
                "/v1/models: {}",
                if e.is_connect() {
                    "connection refused (still loading)".to_owned()
                } else {
                    e.to_string()
                }
            ))),
        }
    }

    async fn generate(
        &self,
        key: Option<&Secret>,
        client: &reqwest::Client,
    ) -> Result<String, SmokeError> {
        let body = serde_json::json!({
            "model": self.served_name,
            "messages": [{"role": "user", "content": "What is 17*23? Answer with the number only."}],
            "max_tokens": 64,
            "temperature": 0,
            "chat_template_kwargs": {"enable_thinking": false},
        });
        let r = crate::lifecycle::api_key::authorize(
            client.post(format!("{}/v1/chat/completions", self.base_url)),
            key,
        )
        .json(&body)
        .send()
        .await
        .map_err(|e| SmokeError::Generation(e.to_string()))?;
        let status = r.status();
        let text = r
            .text()
            .await
            .map_err(|e| SmokeError::Generation(e.to_string()))?;
        if !status.is_success() {
            return Err(SmokeError::Generation(format!(
                "HTTP {status}: {}",
                text.chars().take(400).collect::<String>()
            )));
        }
        let v: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| SmokeError::Generation(format!("not JSON ({e}): {text}")))?;
        let answer = v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or("")
            .trim()
            .to_owned();
        if answer.is_empty() || !answer.contains("391") {
            return Err(SmokeError::Generation(format!(
                "asked for 17*23, got {answer:?}"
            )));
        }
        Ok(answer)
    }

    /// Waits for readiness (both ranks running, rank 1 loaded, `/v1/models` lists the served
    /// name), then runs one greedy generation with thinking off.
    pub(crate) async fn run(&self, ctx: &Context) -> Result<Outcome, StepFailure> {
        let fail = |e: SmokeError| {
            StepFailure::new(
                StepKind::Smoke,
                e,
                Some("see the rank logs saved by the stop (`spark-deploy logs`)".into()),
            )
        };
        let c = ctx.config().config();
        let key = crate::lifecycle::api_key::client_key(&c.serving).map_err(|e| fail(e.into()))?;
        let client = Self::client();
        if ctx.already_running()
            && matches!(
                self.probe(ctx, key.as_ref(), &client).await,
                Ok(Probe::Ready)
            )
        {
            return Ok(Outcome::Skipped {
                reason: format!(
                    "{} already serving on port {}: both ranks run, /v1/models lists it",
                    self.served_name, c.serving.port
                ),
            });
        }
        let start = Instant::now();
        let mut last_note = Instant::now();
        loop {
            if ctx.is_cancelled() {
                return Err(fail(SmokeError::Cancelled));
            }
            match self.probe(ctx, key.as_ref(), &client).await.map_err(fail)? {
                Probe::Ready => break,
                Probe::Waiting(why) => {
                    if start.elapsed() > Duration::from_secs(self.timeout_s) {
                        return Err(fail(SmokeError::Timeout {
                            timeout_s: self.timeout_s,
                            last: why,
                        }));
                    }
                    if last_note.elapsed() > Duration::from_secs(5) {
                        let latest =
                            ranks::log_tail(ctx, 0, &container_name(&c.deployment.name, 0), 1)
                                .await;
                        ctx.log(
                            StepKind::Smoke,
                            Some(&self.node),
                            Level::Info,
                            format!("waiting: {why}; rank 0: {}", latest.trim()),
                        );
                        last_note = Instant::now();
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let answer = self.generate(key.as_ref(), &client).await.map_err(fail)?;
        ctx.log(
            StepKind::Smoke,
            Some(&self.node),
            Level::Info,
            format!("17*23 = {answer}"),
        );
        ctx.log(
            StepKind::Smoke,
            Some(&self.node),
            Level::Info,
            format!("{} is running on port {}", self.served_name, c.serving.port),
        );
        Ok(Outcome::Done { bytes: None })
    }
}
