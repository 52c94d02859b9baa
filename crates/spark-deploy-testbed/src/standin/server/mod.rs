//! Rank 0's HTTP API on axum: `GET /v1/models` (any path ending in
//! `/models`), `GET /health` (open even with API keys), `GET /metrics` / `/v1/metrics`
//! (Prometheus text), `POST /v1/chat/completions` (JSON and SSE, streamed in time),
//! `POST /tokenize` / `/v1/tokenize`.
//!
//! Replies are deterministic and seed-free:
//! - the rules of [`super::answer`] (a passphrase in the prompt, `a*b`, `a + b`, the capital of
//!   France) give the content; otherwise a fixed sentence (or, with image parts, a sentence naming
//!   each image's size and mean colour); `ignore_eos: true` fills the reply to `max_tokens`;
//! - `response_format` (`json_schema` / `json_object`) → content is JSON built from the schema;
//! - thinking on (server `--thinking` default; `chat_template_kwargs.enable_thinking` /
//!   `.thinking` wins; `reasoning_effort: "none"` turns it off) → `reasoning_content`;
//! - `tools` offered (and `tool_choice` not `"none"`, and the last message is not a tool result)
//!   → one call of the first offered tool (or the named `tool_choice`), arguments built from its
//!   JSON schema's `required` properties, `finish_reason: "tool_calls"`.
//!
//! Timing follows [`super::perf`]: TTFT = uncached prompt tokens / prefill rate, then verify steps
//! (one token serial, several with drafts, `"draft": false` giving the same tokens serially). A
//! prompt seen before (same messages, no images) is resumed from the prompt cache
//! (`usage.prompt_tokens_details.cached_tokens` = all but one token). The reply's `tensorfold`
//! block carries `prefill_s`, `token_sha` (hash of the reply's tokens), `draft` and `kind`.
//! Fault modes ([`super::faults`]) break one behaviour each.
//!
//! Token counting (tokenizer-free, documented approximation): prompt tokens =
//! ceil(text bytes of all messages / 4) + 256 per image; reply tokens = ceil(bytes / 4). A request
//! whose extent `alignUp(prompt + max_tokens + 16 + 2, 2048)` exceeds the pool is refused with
//! 400 `context_length_exceeded`, as the engine refuses a request that cannot fit the pool.
//!
//! Every chat request sends one frame to rank 1 and waits for its ack: a dead rank 1 fails every
//! request with `PeerDown` (500, or an SSE error event then `[DONE]`) while `/health` stays ok.
//! A failed split proof fails every chat request with 500 naming the tensor.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::Mutex;

pub use super::answer::find_product;
use super::answer::{filler, find_needle, knowledge, schema_value};
use super::faults::{Fault, Faults};
use super::generate::{self, Piece, Run};
use super::link::{self, LinkError, kind};
use super::perf::{PerfModel, PromptKind, classify};
use super::png;
use super::split::ProofReport;

/// What the server serves, fixed at start.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// `--name` first, then each `--alias`.
    pub served_ids: Vec<String>,
    /// Accepted API keys (empty = open).
    pub keys: Vec<String>,
    /// `--metrics-open`.
    pub metrics_open: bool,
    /// `--context` (the pool).
    pub pool: u64,
    /// `--max-tokens`.
    pub max_tokens: u64,
    /// `--thinking` (default) / `--no-thinking`.
    pub thinking: bool,
    /// `config.json` has `vision_config` and the kit has `vision/`.
    pub vision: bool,
    /// `--parallel`.
    pub parallel: u32,
    /// The split proof's outcome.
    pub proof: ProofReport,
    /// Drafts on (no `--no-drafts`).
    pub drafts: bool,
    /// Rates and factors of the timing.
    pub perf: PerfModel,
    /// Fault modes in effect.
    pub faults: Faults,
    /// A file naming more faults, read while serving ([`super::faults::FAULT_FILE`] in the
    /// container; none in-process).
    pub fault_file: Option<std::path::PathBuf>,
}

/// Why the server could not run.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// Binding `--host:--port` failed.
    #[error("error.AddressInUse: cannot serve HTTP on {addr}: {source}")]
    Bind {
        /// The address.
        addr: String,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// The links to the followers (one per follower, rank order). After a failure on any of them
/// they stay open but unused: a follower whose peer died hangs as in a collective, so only the
/// deployer's all-or-none stop ends the others.
#[derive(Debug)]
struct LinkState {
    streams: Vec<tokio::net::TcpStream>,
    step: u64,
    down: bool,
}

/// Shared server state.
#[derive(Debug)]
pub struct AppState {
    cfg: ServerConfig,
    link: Mutex<LinkState>,
    requests: AtomicU64,
    failures: AtomicU64,
    running: AtomicU64,
    decoding: AtomicU64,
    prompt_tokens: AtomicU64,
    generated: AtomicU64,
    drafted: AtomicU64,
    accepted: AtomicU64,
    prompt_cache: std::sync::Mutex<HashSet<[u8; 32]>>,
    peer_down: AtomicBool,
    /// The generated-tokens counter as it was when the wedge began.
    wedged_at: std::sync::Mutex<Option<u64>>,
}

/// Counts a request as running while it lives (for a stream: until its last chunk is sent).
struct Running(Arc<AppState>);

impl Running {
    fn enter(st: &Arc<AppState>) -> Self {
        st.running.fetch_add(1, Ordering::SeqCst);
        Self(st.clone())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
    }
}

impl AppState {
    /// A state over the connected links to every follower (empty when one was lost before
    /// serving), whose last used step was `step`.
    #[must_use]
    pub fn new(cfg: ServerConfig, streams: Vec<tokio::net::TcpStream>, step: u64) -> Arc<Self> {
        let down = streams.is_empty();
        Arc::new(Self {
            cfg,
            link: Mutex::new(LinkState {
                streams,
                step,
                down,
            }),
            requests: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            running: AtomicU64::new(0),
            decoding: AtomicU64::new(0),
            prompt_tokens: AtomicU64::new(0),
            generated: AtomicU64::new(0),
            drafted: AtomicU64::new(0),
            accepted: AtomicU64::new(0),
            prompt_cache: std::sync::Mutex::new(HashSet::new()),
            peer_down: AtomicBool::new(down),
            wedged_at: std::sync::Mutex::new(None),
        })
    }

    /// Whether `f` is in effect: given at start, or named in the fault file now.
    fn has(&self, f: Fault) -> bool {
        self.cfg.faults.has(f)
            || self.cfg.fault_file.as_ref().is_some_and(|p| {
                std::fs::read_to_string(p)
                    .ok()
                    .and_then(|t| Faults::parse(&t).ok())
                    .is_some_and(|fs| fs.has(f))
            })
    }

    /// In wedge mode: the generated-tokens counter frozen at the wedge's onset.
    fn wedged(&self) -> Option<u64> {
        let mut at = self.wedged_at.lock().ok()?;
        if self.has(Fault::Wedge) {
            Some(*at.get_or_insert_with(|| self.generated.load(Ordering::SeqCst)))
        } else {
            *at = None;
            None
        }
    }

    /// Sends one primitive to every follower and waits for each one's ack. Any failure marks the
    /// peers down for good (the engine's `failAll`).
    async fn round_trip(&self, k: u8, fields: &[u8]) -> Result<(), LinkError> {
        let mut l = self.link.lock().await;
        let step = l.step + 1;
        if l.down {
            return Err(LinkError::PeerDown);
        }
        let frame = link::payload(k, step, fields);
        let r = async {
            for s in &mut l.streams {
                link::write_frame_async(s, &frame).await?;
            }
            for s in &mut l.streams {
                let ack = link::read_frame_async(s, 1 << 20).await?;
                let (ak, astep, _) = link::split_payload(&ack)?;
                if ak != kind::ACK {
                    return Err(LinkError::BadFrame);
                }
                if astep != step {
                    return Err(LinkError::OutOfStep {
                        expected: step,
                        got: astep,
                    });
                }
            }
            Ok(())
        }
        .await;
        l.step = step;
        if r.is_err() {
            l.down = true;
            self.peer_down.store(true, Ordering::SeqCst);
        }
        r
    }

    /// Rank 0's shutdown: sends `done` to every follower still linked.
    pub async fn send_done(&self) {
        let mut l = self.link.lock().await;
        let step = l.step + 1;
        for s in &mut l.streams {
            let _ = link::write_frame_async(s, &link::payload(kind::DONE, step, &[])).await;
            let _ = tokio::io::AsyncWriteExt::shutdown(s).await;
        }
        l.step = step;
        l.streams.clear();
        l.down = true;
    }

    fn authorized(&self, h: &HeaderMap) -> bool {
        if self.cfg.keys.is_empty() {
            return true;
        }
        let bearer = h
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        let x = h
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
            .map(str::trim);
        [bearer, x]
            .into_iter()
            .flatten()
            .any(|k| self.cfg.keys.iter().any(|s| s == k))
    }
}

/// The router (one fallback handler dispatching by method and path).
pub fn router(state: Arc<AppState>) -> Router {
    Router::new().fallback(dispatch).with_state(state)
}

/// Binds the HTTP listener on `--host:--port` (IPv6 literals bracketed).
///
/// # Errors
/// [`ServerError::Bind`].
pub async fn bind(host: &str, port: u16) -> Result<tokio::net::TcpListener, ServerError> {
    let addr = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|source| ServerError::Bind { addr, source })
}

fn json_response(status: StatusCode, v: &Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        v.to_string(),
    )
        .into_response()
}

/// An OpenAI-style error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: u16,
    /// `error.type`.
    pub kind: &'static str,
    /// `error.code`.
    pub code: &'static str,
    /// `error.message`.
    pub message: String,
}

impl ApiError {
    fn bad(message: impl Into<String>) -> Self {
        Self {
            status: 400,
            kind: "invalid_request_error",
            code: "invalid_request",
            message: message.into(),
        }
    }

    fn body(&self) -> Value {
        json!({"error": {"message": self.message, "type": self.kind, "code": self.code, "param": null}})
    }

    fn response(&self) -> Response {
        json_response(
            StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            &self.body(),
        )
    }
}

mod chat;
mod plan;
mod routes;

use chat::*;
pub use plan::{ChatPlan, ImageInfo, plan_chat, tokenize};
use routes::*;

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> ServerConfig {
        ServerConfig {
            served_ids: vec!["M".into()],
            keys: vec![],
            metrics_open: false,
            pool: 4096,
            max_tokens: 100,
            thinking: true,
            vision: true,
            parallel: 1,
            proof: ProofReport::failed("x"),
            drafts: true,
            perf: PerfModel::default(),
            faults: Faults::default(),
            fault_file: None,
        }
    }

    #[test]
    fn products_pool_rule_and_thinking() {
        let p = plan_chat(
            &cfg(),
            br#"{"messages":[{"role":"user","content":"17*23"}]}"#,
        )
        .unwrap();
        assert_eq!(p.content().as_deref(), Some("391"));
        assert!(p.reasoning().is_some());
        let p = plan_chat(
            &cfg(),
            br#"{"messages":[{"role":"user","content":"17*23"}],"reasoning_effort":"none"}"#,
        )
        .unwrap();
        assert!(p.reasoning().is_none());
        // 1 + 2030 + 18 = 2049 -> 4096 fits; 1 + 4078 + 18 = 4097 -> 6144 does not
        assert!(
            plan_chat(
                &cfg(),
                br#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":2030}"#
            )
            .is_ok()
        );
        let e = plan_chat(
            &cfg(),
            br#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":4078}"#,
        )
        .unwrap_err();
        assert_eq!((e.status, e.code), (400, "context_length_exceeded"));
    }

    fn generated_metric(st: &AppState) -> String {
        let r = metrics(st);
        let body =
            futures::executor::block_on(axum::body::to_bytes(r.into_body(), 1 << 20)).unwrap();
        String::from_utf8_lossy(&body)
            .lines()
            .find(|l| l.starts_with("vllm:generation_tokens_total "))
            .unwrap()
            .to_owned()
    }

    #[tokio::test]
    async fn wedge_from_the_fault_file_freezes_the_counters_and_hangs_requests() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("fault");
        let mut c = cfg();
        c.fault_file = Some(file.clone());
        let st = AppState::new(c, Vec::new(), 0);
        st.generated.store(5, Ordering::SeqCst);
        assert_eq!(generated_metric(&st), "vllm:generation_tokens_total 5");
        std::fs::write(&file, "wedge\n").unwrap();
        assert_eq!(generated_metric(&st), "vllm:generation_tokens_total 5");
        st.generated.store(9, Ordering::SeqCst);
        assert_eq!(
            generated_metric(&st),
            "vllm:generation_tokens_total 5",
            "frozen at the onset"
        );
        let body = br#"{"messages":[{"role":"user","content":"17*23"}]}"#;
        let running = Running::enter(&st);
        let hung = tokio::time::timeout(
            std::time::Duration::from_millis(300),
            chat(&st, running, body, tokio::time::Instant::now()),
        )
        .await;
        assert!(hung.is_err(), "a wedged request hangs");
        assert_eq!(
            st.running.load(Ordering::SeqCst),
            0,
            "given up: no longer running"
        );
        std::fs::remove_file(&file).unwrap();
        assert_eq!(generated_metric(&st), "vllm:generation_tokens_total 9");
    }
}
