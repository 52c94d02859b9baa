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

#[derive(Debug)]
struct LinkState {
    stream: Option<tokio::net::TcpStream>,
    step: u64,
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
    /// A state over the connected link (`None` when rank 1 was lost before serving), whose last
    /// used step was `step`.
    #[must_use]
    pub fn new(cfg: ServerConfig, stream: Option<tokio::net::TcpStream>, step: u64) -> Arc<Self> {
        let down = stream.is_none();
        Arc::new(Self {
            cfg,
            link: Mutex::new(LinkState { stream, step }),
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

    /// Sends one primitive to rank 1 and waits for its ack. Any failure marks the peer down for
    /// good (the engine's `failAll`).
    async fn round_trip(&self, k: u8, fields: &[u8]) -> Result<(), LinkError> {
        let mut l = self.link.lock().await;
        let step = l.step + 1;
        let Some(s) = l.stream.as_mut() else {
            return Err(LinkError::PeerDown);
        };
        let r = async {
            link::write_frame_async(s, &link::payload(k, step, fields)).await?;
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
            Ok(())
        }
        .await;
        l.step = step;
        if r.is_err() {
            l.stream = None;
            self.peer_down.store(true, Ordering::SeqCst);
        }
        r
    }

    /// Rank 0's shutdown: sends `done` to rank 1 (when the link is up).
    pub async fn send_done(&self) {
        let mut l = self.link.lock().await;
        let step = l.step + 1;
        if let Some(s) = l.stream.as_mut() {
            let _ = link::write_frame_async(s, &link::payload(kind::DONE, step, &[])).await;
            let _ = tokio::io::AsyncWriteExt::shutdown(s).await;
        }
        l.step = step;
        l.stream = None;
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

async fn dispatch(State(st): State<Arc<AppState>>, req: Request) -> Response {
    let arrived = std::time::Instant::now();
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    if path == "/health" {
        return health(&st);
    }
    let is_metrics = path == "/metrics" || path == "/v1/metrics";
    if !(st.authorized(req.headers()) || (is_metrics && st.cfg.metrics_open)) {
        let mut r = ApiError {
            status: 401,
            kind: "authentication_error",
            code: "invalid_api_key",
            message: "missing or invalid API key: send Authorization: Bearer KEY or x-api-key"
                .into(),
        }
        .response();
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer"),
        );
        return r;
    }
    match (method, path.as_str()) {
        (Method::GET, p) if p.ends_with("/models") => models(&st),
        (Method::GET, _) if is_metrics => metrics(&st),
        (Method::POST, "/v1/chat/completions") => {
            let Ok(body) = axum::body::to_bytes(req.into_body(), 64 << 20).await else {
                return ApiError::bad("cannot read the request body (64 MiB limit)").response();
            };
            let running = Running::enter(&st);
            chat(&st, running, &body, arrived).await
        }
        (Method::POST, "/tokenize" | "/v1/tokenize") => {
            let Ok(body) = axum::body::to_bytes(req.into_body(), 64 << 20).await else {
                return ApiError::bad("cannot read the request body (64 MiB limit)").response();
            };
            match tokenize(&st.cfg, &body) {
                Ok(v) => json_response(StatusCode::OK, &v),
                Err(e) => e.response(),
            }
        }
        (_, p) => ApiError {
            status: 404,
            kind: "not_found_error",
            code: "not_found",
            message: format!("{p} is not served by the engine stand-in"),
        }
        .response(),
    }
}

fn health(st: &AppState) -> Response {
    let proof = st.cfg.proof.to_json();
    let v = if st.cfg.keys.is_empty() {
        json!({
            "status": "ok",
            "model": st.cfg.served_ids[0],
            "model_ids": st.cfg.served_ids,
            "max_batch_size": st.cfg.parallel,
            "warming": false,
            "memory": {"active": 0, "cache": 0, "peak": 0},
            "live": st.running.load(Ordering::SeqCst),
            "split_proof": proof,
        })
    } else {
        json!({"status": "ok", "split_proof": proof})
    };
    json_response(StatusCode::OK, &v)
}

fn models(st: &AppState) -> Response {
    let data: Vec<Value> = st
        .cfg
        .served_ids
        .iter()
        .map(|id| json!({"id": id, "object": "model", "created": 0, "owned_by": "tensorfold"}))
        .collect();
    json_response(StatusCode::OK, &json!({"object": "list", "data": data}))
}

fn metrics(st: &AppState) -> Response {
    let running = st.running.load(Ordering::SeqCst);
    let load = |c: &AtomicU64| c.load(Ordering::SeqCst).to_string();
    let frozen = st.wedged();
    let generated = || frozen.map_or_else(|| load(&st.generated), |v| v.to_string());
    let rows: [(&str, &str, String); 15] = [
        (
            "tensorfold:requests_total",
            "counter",
            st.requests.load(Ordering::SeqCst).to_string(),
        ),
        (
            "tensorfold:request_failures_total",
            "counter",
            st.failures.load(Ordering::SeqCst).to_string(),
        ),
        (
            "tensorfold:peer_down",
            "gauge",
            u8::from(st.peer_down.load(Ordering::SeqCst)).to_string(),
        ),
        (
            "tensorfold:split_proof_ok",
            "gauge",
            u8::from(st.cfg.proof.ok).to_string(),
        ),
        (
            "tensorfold:pool_positions",
            "gauge",
            st.cfg.pool.to_string(),
        ),
        (
            "tensorfold:num_requests_running",
            "gauge",
            running.to_string(),
        ),
        ("vllm:num_requests_running", "gauge", running.to_string()),
        ("vllm:kv_cache_usage_perc", "gauge", "0".to_owned()),
        (
            "tensorfold:num_requests_decoding",
            "gauge",
            load(&st.decoding),
        ),
        (
            "tensorfold:prompt_tokens_total",
            "counter",
            load(&st.prompt_tokens),
        ),
        (
            "vllm:prompt_tokens_total",
            "counter",
            load(&st.prompt_tokens),
        ),
        ("tensorfold:generation_tokens_total", "counter", generated()),
        ("vllm:generation_tokens_total", "counter", generated()),
        (
            "vllm:spec_decode_num_draft_tokens",
            "counter",
            load(&st.drafted),
        ),
        (
            "vllm:spec_decode_num_accepted_tokens",
            "counter",
            load(&st.accepted),
        ),
    ];
    let mut text = String::new();
    for (name, t, v) in rows {
        text.push_str(&format!("# TYPE {name} {t}\n{name} {v}\n"));
    }
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        text,
    )
        .into_response()
}

/// One decoded image part.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageInfo {
    /// Decoded bytes.
    pub bytes: usize,
    /// PNG width and height.
    pub width: u32,
    /// PNG height.
    pub height: u32,
    /// The mean colour's name, when the pixels decode.
    pub colour: Option<&'static str>,
}

impl ImageInfo {
    fn describe(&self) -> String {
        let colour = self
            .colour
            .map_or_else(String::new, |c| format!(", mostly {c}"));
        format!(
            "{}x{} PNG ({} bytes{colour})",
            self.width, self.height, self.bytes
        )
    }
}

/// A chat request, understood.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatPlan {
    /// The reply's `model`.
    pub model: String,
    /// Stream as SSE.
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// Prompt tokens (approximation, see the module docs).
    pub prompt_tokens: u64,
    /// The reply budget.
    pub max_tokens: u64,
    /// Thinking on.
    pub thinking: bool,
    /// `(name, arguments JSON)` of the one tool call.
    pub tool_call: Option<(String, String)>,
    /// Image parts.
    pub images: Vec<ImageInfo>,
    /// `finish_reason`.
    pub finish_reason: &'static str,
    /// The reply's tokens.
    pub pieces: Vec<Piece>,
    /// Reply tokens.
    pub completion_tokens: u64,
    /// Of which reasoning.
    pub reasoning_tokens: u64,
    /// Kind of the last user message (draft acceptance).
    pub kind: PromptKind,
    /// Drafts on for this request.
    pub draft: bool,
    /// The prompt-cache key (no key for prompts with images: they are never cached).
    pub cache_key: Option<[u8; 32]>,
}

impl ChatPlan {
    /// `reasoning_content`.
    #[must_use]
    pub fn reasoning(&self) -> Option<String> {
        let r = generate::text(&self.pieces, |p| match p {
            Piece::Reasoning(s) => Some(s),
            _ => None,
        });
        (!r.is_empty()).then_some(r)
    }

    /// `content` (`None` for a tool call).
    #[must_use]
    pub fn content(&self) -> Option<String> {
        if self.tool_call.is_some() {
            return None;
        }
        Some(generate::text(&self.pieces, |p| match p {
            Piece::Content(s) => Some(s),
            _ => None,
        }))
    }
}

fn tokens(s: &str) -> u64 {
    (s.len() as u64).div_ceil(4)
}

fn align_up(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

fn decode_image(url: &str) -> Result<ImageInfo, ApiError> {
    let rest = url.strip_prefix("data:").ok_or_else(|| {
        ApiError::bad("image_url must be a data: URL (the engine fetches no remote images)")
    })?;
    let (meta, data) = rest
        .split_once(',')
        .ok_or_else(|| ApiError::bad("image_url data URL has no ','"))?;
    if !meta.ends_with(";base64") {
        return Err(ApiError::bad("image_url data URL is not ;base64"));
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .map_err(|e| ApiError::bad(format!("image_url data URL: bad base64: {e}")))?;
    const PNG: &[u8] = b"\x89PNG\r\n\x1a\n";
    if bytes.len() < 24 || &bytes[..8] != PNG || &bytes[12..16] != b"IHDR" {
        return Err(ApiError::bad(
            "only PNG images are decoded natively; other formats need python3 with Pillow, which the stand-in image does not have",
        ));
    }
    let be = |i: usize| u32::from_be_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
    Ok(ImageInfo {
        bytes: bytes.len(),
        width: be(16),
        height: be(20),
        colour: png::decode(&bytes).ok().map(|s| s.colour()),
    })
}

fn text_of(content: &Value, images: &mut Vec<ImageInfo>, vision: bool) -> Result<String, ApiError> {
    match content {
        Value::Null => Ok(String::new()),
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut out = String::new();
            for p in parts {
                match p["type"].as_str() {
                    Some("text") => out.push_str(p["text"].as_str().unwrap_or_default()),
                    Some("image_url") => {
                        if !vision {
                            return Err(ApiError::bad(
                                "image parts need a vision checkpoint (config.json vision_config) and the kit's vision/",
                            ));
                        }
                        let url = p["image_url"]["url"]
                            .as_str()
                            .or_else(|| p["image_url"].as_str())
                            .ok_or_else(|| ApiError::bad("image_url part without a url"))?;
                        images.push(decode_image(url)?);
                    }
                    other => {
                        return Err(ApiError::bad(format!(
                            "content part type {other:?} is not supported"
                        )));
                    }
                }
            }
            Ok(out)
        }
        _ => Err(ApiError::bad(
            "message content must be a string or a list of parts",
        )),
    }
}

fn cut(s: &str, max_bytes: usize) -> &str {
    if s.len() <= max_bytes {
        return s;
    }
    let mut n = max_bytes;
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    &s[..n]
}

/// The prompt as the engine would see it: every message's role and text, the images, the
/// last user message and the prompt-token count.
struct Prompt {
    text: String,
    last_user: String,
    images: Vec<ImageInfo>,
    tokens: u64,
    last_role: String,
}

fn read_prompt(cfg: &ServerConfig, messages: &[Value]) -> Result<Prompt, ApiError> {
    let mut images = Vec::new();
    let mut text = String::new();
    let mut text_bytes = 0u64;
    let mut last_user = String::new();
    for m in messages {
        let role = m["role"]
            .as_str()
            .ok_or_else(|| ApiError::bad("every message needs a role"))?;
        let t = text_of(&m["content"], &mut images, cfg.vision)?;
        text_bytes += t.len() as u64;
        text.push_str(role);
        text.push('\n');
        text.push_str(&t);
        text.push('\n');
        for tc in m["tool_calls"].as_array().into_iter().flatten() {
            let a = tc["function"]["arguments"].as_str().unwrap_or_default();
            text_bytes += a.len() as u64;
            text.push_str(a);
        }
        if role == "user" {
            last_user = t;
        }
    }
    let last_role = messages
        .last()
        .and_then(|m| m["role"].as_str())
        .unwrap_or("")
        .to_owned();
    Ok(Prompt {
        tokens: text_bytes.div_ceil(4).max(1) + 256 * images.len() as u64,
        text,
        last_user,
        images,
        last_role,
    })
}

/// Array values as JSON strings (the `tool_args_string` fault).
fn arrays_as_strings(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .map(|(k, v)| match v {
                    Value::Array(_) => (k, Value::String(v.to_string())),
                    other => (k, arrays_as_strings(other)),
                })
                .collect(),
        ),
        other => other,
    }
}

/// Understands a chat request: validation, the pool rule, thinking, tools, images, response
/// formats, fault modes and the deterministic answer.
///
/// # Errors
/// 400 [`ApiError`]s: malformed request, `n` ≠ 1, bad images, `context_length_exceeded`, an
/// unsupported `response_format` (fault `no_json_schema`).
pub fn plan_chat(cfg: &ServerConfig, body: &[u8]) -> Result<ChatPlan, ApiError> {
    let faults = &cfg.faults;
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad(format!("the body is not JSON: {e}")))?;
    let messages = v["messages"]
        .as_array()
        .filter(|m| !m.is_empty())
        .ok_or_else(|| ApiError::bad("messages must be a non-empty list"))?;
    if v.get("n").is_some_and(|n| n.as_u64() != Some(1)) {
        return Err(ApiError::bad("n must be 1"));
    }
    let model = v["model"]
        .as_str()
        .filter(|m| cfg.served_ids.iter().any(|s| s == m))
        .map_or_else(|| cfg.served_ids[0].clone(), str::to_owned);
    let prompt = read_prompt(cfg, messages)?;
    let prompt_tokens = prompt.tokens;
    let max_tokens = match v
        .get("max_completion_tokens")
        .or_else(|| v.get("max_tokens"))
    {
        None | Some(Value::Null) => cfg.max_tokens,
        Some(m) => m
            .as_u64()
            .filter(|m| *m > 0)
            .ok_or_else(|| ApiError::bad("max_tokens must be a positive integer"))?,
    };
    let extent = align_up(prompt_tokens + max_tokens + 16 + 2, 2048);
    if extent > cfg.pool {
        return Err(ApiError {
            status: 400,
            kind: "invalid_request_error",
            code: "context_length_exceeded",
            message: format!(
                "the prompt and its max_tokens do not fit the context window: alignUp({prompt_tokens} + {max_tokens} + 18, 2048) = {extent} > pool {}",
                cfg.pool
            ),
        });
    }
    let mut thinking = cfg.thinking;
    match v.get("reasoning_effort") {
        None | Some(Value::Null) => {}
        Some(Value::String(e)) if e == "none" => thinking = false,
        Some(Value::String(e))
            if ["minimal", "low", "medium", "high", "xhigh", "max"].contains(&e.as_str()) =>
        {
            thinking = true;
        }
        Some(other) => {
            return Err(ApiError::bad(format!(
                "reasoning_effort {other} is not known"
            )));
        }
    }
    let kw = &v["chat_template_kwargs"];
    if let Some(b) = kw["enable_thinking"]
        .as_bool()
        .or_else(|| kw["thinking"].as_bool())
    {
        thinking = b;
    }
    let format = &v["response_format"];
    let schema = match format["type"].as_str() {
        None | Some("text") => None,
        Some("json_schema" | "json_object") if faults.has(Fault::NoJsonSchema) => {
            return Err(ApiError {
                status: 400,
                kind: "invalid_request_error",
                code: "unsupported_response_format",
                message:
                    "response_format needs guided decoding, which this engine build does not have"
                        .into(),
            });
        }
        Some("json_schema") => Some(format["json_schema"]["schema"].clone()),
        Some("json_object") => Some(json!({"type": "object"})),
        Some(other) => {
            return Err(ApiError::bad(format!(
                "response_format type {other:?} is not known"
            )));
        }
    };
    let tools = v["tools"].as_array().filter(|t| !t.is_empty());
    let tool_choice = &v["tool_choice"];
    let tool = match tools {
        Some(tools)
            if tool_choice.as_str() != Some("none")
                && prompt.last_role != "tool"
                && !faults.has(Fault::NoToolCall) =>
        {
            let named = tool_choice["function"]["name"].as_str();
            let t = match named {
                Some(n) => tools
                    .iter()
                    .find(|t| t["function"]["name"].as_str() == Some(n))
                    .ok_or_else(|| {
                        ApiError::bad(format!("tool_choice names {n}, which is not offered"))
                    })?,
                None => &tools[0],
            };
            let name = t["function"]["name"]
                .as_str()
                .ok_or_else(|| ApiError::bad("a tool without function.name"))?;
            let mut params = t["function"]["parameters"].clone();
            if params.is_null() {
                params = json!({"type": "object"});
            }
            let mut args = schema_value(
                &json!({"type": "object", "required": params["required"], "properties": params["properties"]}),
                &prompt.last_user,
            );
            if faults.has(Fault::ToolArgsString) {
                args = arrays_as_strings(args);
            }
            Some((name.to_owned(), args.to_string()))
        }
        _ => None,
    };
    let rules = if faults.has(Fault::WrongAnswer) {
        None
    } else if faults.has(Fault::LostNeedle)
        && find_needle(&prompt.last_user, &prompt.text).is_some()
    {
        Some((
            "The text holds no passphrase that I can find.".to_owned(),
            "I looked for a passphrase.".to_owned(),
        ))
    } else {
        knowledge(&prompt.last_user, &prompt.text)
    };
    let mut reasoning = thinking.then(|| match (&tool, &rules) {
        (Some((n, _)), _) => format!("A tool is offered; I call {n}."),
        (None, Some((_, why))) => why.clone(),
        (None, None) => "The stand-in answers with its fixed sentence.".to_owned(),
    });
    if faults.has(Fault::ThinkingLeak) && reasoning.is_none() {
        reasoning = Some("I think about it even though thinking is off.".to_owned());
    }
    let mut content = match (&tool, &rules, &schema) {
        (Some(_), _, _) => None,
        (None, _, Some(_)) if faults.has(Fault::BadJsonSchema) => {
            Some("ok: yes (not JSON)".to_owned())
        }
        (None, _, Some(s)) => Some(schema_value(s, &prompt.last_user).to_string()),
        (None, Some((answer, _)), None) => Some(answer.clone()),
        (None, None, None) if !prompt.images.is_empty() => Some(if faults.has(Fault::BadImage) {
            String::new()
        } else {
            format!(
                "I see {} image(s): {}.",
                prompt.images.len(),
                prompt
                    .images
                    .iter()
                    .map(ImageInfo::describe)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }),
        (None, None, None) => Some("Hello from the TensorFold dsv41 engine stand-in.".to_owned()),
    };
    if faults.has(Fault::ThinkingLeak)
        && let Some(r) = reasoning.take()
    {
        content = content.map(|c| format!("{r}</think>{c}"));
        if content.is_none() {
            reasoning = Some(r);
        }
    }
    let mut finish = if tool.is_some() { "tool_calls" } else { "stop" };
    // the reply budget: reasoning first, then content
    let budget = max_tokens;
    if tool.is_none() {
        let r_tokens = reasoning.as_deref().map_or(0, tokens);
        if r_tokens > budget {
            reasoning = reasoning.map(|r| cut(&r, (budget * 4) as usize).to_owned());
            content = Some(String::new());
            finish = "length";
        } else if let Some(c) = &mut content {
            let left = budget - r_tokens;
            if tokens(c) > left {
                *c = cut(c, (left * 4) as usize).to_owned();
                finish = "length";
            } else if v["ignore_eos"].as_bool() == Some(true) && tokens(c) < left {
                // pad to a whole token, then run on to the budget
                while c.len() % 4 != 0 {
                    c.push(' ');
                }
                let seed = u64::from_le_bytes(
                    Sha256::digest(prompt.text.as_bytes())[..8]
                        .try_into()
                        .unwrap_or_default(),
                );
                let more = left - tokens(c);
                c.push_str(&filler(more, seed));
                finish = "length";
            }
        }
    }
    let draft = cfg.drafts && v["draft"].as_bool() != Some(false);
    let mut pieces = generate::pieces(
        reasoning.as_deref(),
        content.as_deref(),
        tool.as_ref().map(|(n, a)| (n.as_str(), a.as_str())),
    );
    if draft
        && faults.has(Fault::DraftMismatch)
        && let Some(p) = pieces
            .iter_mut()
            .rev()
            .find(|p| matches!(p, Piece::Content(_) | Piece::Reasoning(_)))
    {
        *p = match p {
            Piece::Reasoning(_) => Piece::Reasoning("~~~~".into()),
            _ => Piece::Content("~~~~".into()),
        };
    }
    let reasoning_tokens = pieces
        .iter()
        .filter(|p| matches!(p, Piece::Reasoning(_)))
        .count() as u64;
    let cache_key = prompt
        .images
        .is_empty()
        .then(|| Sha256::digest(prompt.text.as_bytes()).into());
    Ok(ChatPlan {
        model,
        stream: v["stream"].as_bool().unwrap_or(false),
        include_usage: v["stream_options"]["include_usage"]
            .as_bool()
            .unwrap_or(false),
        prompt_tokens,
        max_tokens,
        thinking,
        tool_call: tool,
        images: prompt.images,
        finish_reason: finish,
        completion_tokens: pieces.len() as u64,
        reasoning_tokens,
        pieces,
        kind: classify(&prompt.last_user),
        draft,
        cache_key,
    })
}

/// `/tokenize`: `{"messages": [...]}` or `{"prompt": "..."}` → `{"count", "max_model_len",
/// "tokens"}`, token 0 first (the BOS), counted like a chat prompt.
///
/// # Errors
/// 400 [`ApiError`] for a body with neither field, or bad messages.
pub fn tokenize(cfg: &ServerConfig, body: &[u8]) -> Result<Value, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad(format!("the body is not JSON: {e}")))?;
    let (text, count) = if let Some(m) = v["messages"].as_array().filter(|m| !m.is_empty()) {
        let p = read_prompt(cfg, m)?;
        (p.text, p.tokens)
    } else if let Some(p) = v["prompt"].as_str() {
        (p.to_owned(), tokens(p).max(1))
    } else {
        return Err(ApiError::bad(
            "tokenize needs messages (a non-empty list) or prompt (a string)",
        ));
    };
    let ids: Vec<u64> = std::iter::once(0)
        .chain(
            generate::split4(&text)
                .iter()
                .chain(std::iter::repeat(&String::new()))
                .map(|t| {
                    let h = Sha256::digest(t.as_bytes());
                    1 + u64::from(u32::from_le_bytes([h[0], h[1], h[2], h[3]])) % 129_279
                }),
        )
        .take(usize::try_from(count).unwrap_or(usize::MAX))
        .collect();
    let reported = if cfg.faults.has(Fault::TokenizeMismatch) {
        count + 1
    } else {
        count
    };
    Ok(json!({"count": reported, "max_model_len": cfg.pool, "tokens": ids}))
}

fn usage(p: &ChatPlan, cached: u64) -> Value {
    json!({
        "prompt_tokens": p.prompt_tokens,
        "completion_tokens": p.completion_tokens,
        "total_tokens": p.prompt_tokens + p.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached},
        "completion_tokens_details": {"reasoning_tokens": p.reasoning_tokens},
    })
}

fn sse_line(e: &Value) -> String {
    format!("data: {e}\n\n")
}

fn sse(events: &[Value]) -> Response {
    let mut text: String = events.iter().map(sse_line).collect();
    text.push_str("data: [DONE]\n\n");
    sse_response(Body::from(text))
}

fn sse_response(body: Body) -> Response {
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// What every chunk and reply of one request shares.
struct Reply {
    id: String,
    created: u64,
    proof: Value,
    cached: u64,
}

impl Reply {
    fn chunk(&self, plan: &ChatPlan, delta: Value, finish: Value) -> Value {
        json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": plan.model,
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": null}],
               "split_proof": self.proof})
    }

    fn call_id(&self, plan: &ChatPlan) -> String {
        let (name, args) = plan.tool_call.clone().unwrap_or_default();
        format!(
            "call_{}",
            &hex::encode(Sha256::digest(format!("{name}{args}{}", self.id)))[..24]
        )
    }

    /// The delta of one verify step's tokens.
    fn delta(&self, plan: &ChatPlan, step: &[Piece]) -> Value {
        let mut d = serde_json::Map::new();
        let mut join = |key: &str, s: &str| {
            let prev = d.get(key).and_then(Value::as_str).unwrap_or_default();
            let joined = format!("{prev}{s}");
            d.insert(key.to_owned(), json!(joined));
        };
        let mut head = false;
        let mut args = String::new();
        for p in step {
            match p {
                Piece::Reasoning(s) => join("reasoning_content", s),
                Piece::Content(s) => join("content", s),
                Piece::ToolName(_) => head = true,
                Piece::ToolArgs(s) => args.push_str(s),
            }
        }
        if head || !args.is_empty() {
            let mut call = json!({"index": 0, "function": {"arguments": args}});
            if head {
                let name = plan.tool_call.as_ref().map(|t| t.0.clone());
                call["id"] = json!(self.call_id(plan));
                call["type"] = json!("function");
                call["function"]["name"] = json!(name);
            }
            d.insert("tool_calls".into(), json!([call]));
        }
        Value::Object(d)
    }

    fn extras(&self, plan: &ChatPlan, t: &generate::Timing) -> Value {
        json!({
            "engine": "tensorfold-native stand-in",
            "rank1": "followed",
            "images": plan.images.iter().map(|i| json!({"bytes": i.bytes, "width": i.width, "height": i.height, "format": "png"})).collect::<Vec<_>>(),
            "thinking": plan.thinking,
            "prefill_s": (t.prefill_s * 1e6).round() / 1e6,
            "token_sha": generate::token_sha(&plan.pieces),
            "draft": plan.draft,
            "kind": plan.kind.name(),
        })
    }
}

async fn chat(
    st: &Arc<AppState>,
    running: Running,
    body: &[u8],
    arrived: std::time::Instant,
) -> Response {
    st.requests.fetch_add(1, Ordering::SeqCst);
    if st.wedged().is_some() {
        // A wedged pair: the request runs forever (until the client gives up).
        let _running = running;
        return std::future::pending().await;
    }
    let fail = |e: ApiError| {
        st.failures.fetch_add(1, Ordering::SeqCst);
        e.response()
    };
    let plan = match plan_chat(&st.cfg, body) {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    if let Some(msg) = st.cfg.proof.failure() {
        return fail(ApiError {
            status: 500,
            kind: "server_error",
            code: "split_proof_failed",
            message: msg,
        });
    }
    let mut fields = Vec::with_capacity(12);
    fields.extend_from_slice(&(plan.prompt_tokens as u32).to_le_bytes());
    fields.extend_from_slice(&(plan.max_tokens as u32).to_le_bytes());
    fields.extend_from_slice(&(plan.images.len() as u32).to_le_bytes());
    let k = if plan.images.is_empty() {
        kind::PASS
    } else {
        kind::FILL_IMAGES
    };
    if let Err(e) = st.round_trip(k, &fields).await {
        st.failures.fetch_add(1, Ordering::SeqCst);
        let err = ApiError {
            status: 500,
            kind: "server_error",
            code: e.name(),
            message: format!(
                "{}: the link to rank 1 failed; every stream ends with this error until both ranks are restarted",
                e.name()
            ),
        };
        if plan.stream {
            return sse(&[err.body()]);
        }
        return err.response();
    }
    let cached = plan.cache_key.map_or(0, |key| {
        let mut c = st
            .prompt_cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if c.insert(key) {
            0
        } else {
            plan.prompt_tokens.saturating_sub(1)
        }
    });
    st.prompt_tokens
        .fetch_add(plan.prompt_tokens, Ordering::SeqCst);
    let reply = Reply {
        id: format!("chatcmpl-{}", &hex::encode(Sha256::digest(body))[..24]),
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        proof: st.cfg.proof.to_json(),
        cached,
    };
    if plan.stream {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        let st = st.clone();
        tokio::spawn(async move {
            let _running = running;
            let send = |v: &Value| tx.send(sse_line(v)).is_ok();
            if !send(&reply.chunk(
                &plan,
                json!({"role": "assistant", "content": ""}),
                Value::Null,
            )) {
                return;
            }
            let timing = generate::run(run_of(&st, &plan, cached, arrived), &plan.pieces, |step| {
                st.generated.fetch_add(step.len() as u64, Ordering::SeqCst);
                send(&reply.chunk(&plan, reply.delta(&plan, step), Value::Null))
            })
            .await;
            let Some(t) = timing else { return };
            count_drafts(&st, &t);
            let mut last = reply.chunk(&plan, json!({}), json!(plan.finish_reason));
            last["tensorfold"] = reply.extras(&plan, &t);
            last["speculative"] = json!({"drafted": t.drafted, "accepted": t.accepted});
            send(&last);
            if plan.include_usage {
                send(
                    &json!({"id": reply.id, "object": "chat.completion.chunk", "created": reply.created,
                             "model": plan.model, "choices": [], "usage": usage(&plan, reply.cached),
                             "split_proof": reply.proof}),
                );
            }
            let _ = tx.send("data: [DONE]\n\n".to_owned());
        });
        let body = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv()
                .await
                .map(|s| (Ok::<_, std::convert::Infallible>(bytes::Bytes::from(s)), rx))
        });
        return sse_response(Body::from_stream(body));
    }
    let Some(t) = generate::run(run_of(st, &plan, cached, arrived), &plan.pieces, |step| {
        st.generated.fetch_add(step.len() as u64, Ordering::SeqCst);
        true
    })
    .await
    else {
        return fail(ApiError {
            status: 500,
            kind: "server_error",
            code: "generation_stopped",
            message: "the generation stopped".into(),
        });
    };
    drop(running);
    count_drafts(st, &t);
    let mut message = json!({"role": "assistant", "content": plan.content()});
    if let Some(r) = plan.reasoning() {
        message["reasoning_content"] = json!(r);
    }
    if let Some((name, args)) = &plan.tool_call {
        message["tool_calls"] = json!([{"id": reply.call_id(&plan), "type": "function",
                                         "function": {"name": name, "arguments": args}}]);
    }
    json_response(
        StatusCode::OK,
        &json!({
            "id": reply.id,
            "object": "chat.completion",
            "created": reply.created,
            "model": plan.model,
            "choices": [{"index": 0, "message": message, "finish_reason": plan.finish_reason, "logprobs": null}],
            "usage": usage(&plan, reply.cached),
            "exact_mode": true,
            "tensorfold": reply.extras(&plan, &t),
            "speculative": {"drafted": t.drafted, "accepted": t.accepted},
            "split_proof": reply.proof,
        }),
    )
}

fn run_of<'a>(
    st: &'a AppState,
    plan: &ChatPlan,
    cached: u64,
    arrived: std::time::Instant,
) -> Run<'a> {
    Run {
        perf: &st.cfg.perf,
        decoding: &st.decoding,
        uncached: plan.prompt_tokens - cached,
        kind: plan.kind,
        draft: plan.draft,
        arrived,
    }
}

fn count_drafts(st: &AppState, t: &generate::Timing) {
    st.drafted.fetch_add(t.drafted, Ordering::SeqCst);
    st.accepted.fetch_add(t.accepted, Ordering::SeqCst);
}

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
}
