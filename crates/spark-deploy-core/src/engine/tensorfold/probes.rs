//! Readiness and the smoke generation for the dsv41 pair: every rank's container running, rank 1
//! loaded (its `loaded_s` line) and not reporting a follow error, `/v1/models` listing the served
//! name; then one greedy chat completion with thinking off that must answer 17*23 = 391.

use std::time::Duration;

use crate::container::rank_container_name;
use crate::context::Context;
use crate::engine::{ApiEndpoint, ProbeError, Readiness};

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap_or_default()
}

fn has_key(line: &str, key: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(line.trim()).is_ok_and(|v| v.get(key).is_some())
}

/// One readiness observation.
pub(crate) async fn ready(ctx: &Context, api: &ApiEndpoint) -> Result<Readiness, ProbeError> {
    let c = ctx.config().config();
    let mut followers_loaded = true;
    for (rank, node) in c.nodes.iter().enumerate() {
        let container = rank_container_name(&c.deployment.name, rank);
        match ctx.rank_state(rank, &container).await {
            Ok(state) if state.running => {}
            Ok(state) => {
                return Err(ProbeError::RankExited {
                    rank,
                    node: node.name.clone(),
                    tail: ctx.log_tail(rank, &container, 30).await,
                    container,
                    exit_code: state.exit_code,
                });
            }
            Err(e) => {
                return Err(ProbeError::DockerUnavailable {
                    node: node.name.clone(),
                    detail: e.to_string(),
                });
            }
        }
        if rank > 0 {
            let log = ctx.log_tail(rank, &container, 200).await;
            if let Some(line) = log.lines().find(|l| has_key(l, "follow")) {
                return Err(ProbeError::FollowError {
                    rank,
                    node: node.name.clone(),
                    line: line.trim().to_owned(),
                });
            }
            followers_loaded &= log.lines().any(|l| has_key(l, "loaded_s"));
        }
    }
    let url = format!("{}/v1/models", api.base_url);
    let req = crate::lifecycle::api_key::authorize(client().get(&url), api.key.as_ref());
    Ok(match req.send().await {
        Ok(r) if r.status().is_success() => {
            let body = r.text().await.unwrap_or_default();
            if !body.contains(&format!("\"{}\"", api.served_name)) {
                Readiness::Waiting(format!("/v1/models does not list {} yet", api.served_name))
            } else if !followers_loaded {
                Readiness::Waiting("a follower has not printed its loaded line yet".into())
            } else {
                Readiness::Ready
            }
        }
        Ok(r) => Readiness::Waiting(format!("/v1/models answered {}", r.status())),
        Err(e) if e.is_connect() => {
            Readiness::Waiting("/v1/models: connection refused (still loading)".into())
        }
        Err(e) => Readiness::Waiting(format!("/v1/models: {e}")),
    })
}

/// One greedy generation with thinking off; the answer must contain 391.
pub(crate) async fn generation(api: &ApiEndpoint) -> Result<String, ProbeError> {
    let body = serde_json::json!({
        "model": api.served_name,
        "messages": [{"role": "user", "content": "What is 17*23? Answer with the number only."}],
        "max_tokens": 64,
        "temperature": 0,
        "chat_template_kwargs": {"enable_thinking": false},
    });
    let req = client()
        .post(format!("{}/v1/chat/completions", api.base_url))
        .json(&body);
    let r = crate::lifecycle::api_key::authorize(req, api.key.as_ref())
        .send()
        .await
        .map_err(|e| ProbeError::Generation(e.to_string()))?;
    let status = r.status();
    let text = r
        .text()
        .await
        .map_err(|e| ProbeError::Generation(e.to_string()))?;
    if !status.is_success() {
        return Err(ProbeError::Generation(format!(
            "HTTP {status}: {}",
            text.chars().take(400).collect::<String>()
        )));
    }
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| ProbeError::Generation(format!("not JSON ({e}): {text}")))?;
    let answer = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or("")
        .trim()
        .to_owned();
    if answer.is_empty() || !answer.contains("391") {
        return Err(ProbeError::Generation(format!(
            "asked for 17*23, got {answer:?}"
        )));
    }
    Ok(format!("17*23 = {answer}"))
}
