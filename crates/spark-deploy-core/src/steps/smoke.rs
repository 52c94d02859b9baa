use serde::Serialize;

use crate::config::ValidatedConfig;
use crate::plan::describe::{Action, ActionDetail};

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
