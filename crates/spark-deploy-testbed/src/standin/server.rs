//! Rank 0's HTTP API on axum: `GET /v1/models` (any path ending in
//! `/models`), `GET /health` (open even with API keys), `GET /metrics` / `/v1/metrics`
//! (Prometheus text), `POST /v1/chat/completions` (JSON and SSE).
//!
//! Replies are deterministic and seed-free:
//! - the last user message contains a product like `17*23` (or `17 × 23`) → the content is the
//!   number (`391`); otherwise a fixed sentence (or, with image parts, a sentence naming them);
//! - thinking on (server `--thinking` default; `chat_template_kwargs.enable_thinking` /
//!   `.thinking` wins; `reasoning_effort: "none"` turns it off) → `reasoning_content`;
//! - `tools` offered (and `tool_choice` not `"none"`, and the last message is not a tool result)
//!   → one call of the first offered tool (or the named `tool_choice`), arguments built from its
//!   JSON schema's `required` properties, `finish_reason: "tool_calls"`.
//!
//! Token counting (tokenizer-free, documented approximation): prompt tokens =
//! ceil(text bytes of all messages / 4) + 256 per image; reply tokens = ceil(bytes / 4). A request
//! whose extent `alignUp(prompt + max_tokens + 16 + 2, 2048)` exceeds the pool is refused with
//! 400 `context_length_exceeded`, as the engine refuses a request that cannot fit the pool.
//!
//! Every chat request sends one frame to rank 1 and waits for its ack: a dead rank 1 fails every
//! request with `PeerDown` (500, or an SSE error event then `[DONE]`) while `/health` stays ok.
//! A failed split proof fails every chat request with 500 naming the tensor.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::Mutex;

use super::link::{self, LinkError, kind};
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
    peer_down: AtomicBool,
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
            peer_down: AtomicBool::new(down),
        })
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
            st.running.fetch_add(1, Ordering::SeqCst);
            let r = chat(&st, &body).await;
            st.running.fetch_sub(1, Ordering::SeqCst);
            r
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
    let rows: [(&str, &str, String); 8] = [
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
    ];
    let mut text = String::new();
    for (name, t, v) in rows {
        text.push_str(&format!("# TYPE {name} {t}\n{name} {v}\n"));
    }
    text.push_str("# TYPE vllm:spec_decode_num_drafts counter\nvllm:spec_decode_num_drafts 0\n");
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        text,
    )
        .into_response()
}

/// One decoded image part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageInfo {
    /// Decoded bytes.
    pub bytes: usize,
    /// PNG width and height.
    pub width: u32,
    /// PNG height.
    pub height: u32,
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
    /// `reasoning_content`.
    pub reasoning: Option<String>,
    /// `content`.
    pub content: Option<String>,
    /// `(name, arguments JSON)` of the one tool call.
    pub tool_call: Option<(String, String)>,
    /// Image parts.
    pub images: Vec<ImageInfo>,
    /// `finish_reason`.
    pub finish_reason: &'static str,
    /// Reply tokens.
    pub completion_tokens: u64,
    /// Of which reasoning.
    pub reasoning_tokens: u64,
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
    })
}

/// Finds the first product `a*b` (also `a × b`) of unsigned integers in `s`.
#[must_use]
pub fn find_product(s: &str) -> Option<(u128, u128, u128)> {
    let c: Vec<char> = s.chars().collect();
    let mut i = 0;
    while i < c.len() {
        if !c[i].is_ascii_digit() || (i > 0 && c[i - 1].is_ascii_digit()) {
            i += 1;
            continue;
        }
        let num = |mut j: usize| -> (String, usize) {
            let mut n = String::new();
            while j < c.len() && c[j].is_ascii_digit() {
                n.push(c[j]);
                j += 1;
            }
            (n, j)
        };
        let (a, mut j) = num(i);
        while j < c.len() && c[j] == ' ' {
            j += 1;
        }
        if j < c.len() && (c[j] == '*' || c[j] == '×') {
            j += 1;
            while j < c.len() && c[j] == ' ' {
                j += 1;
            }
            let (b, _) = num(j);
            if let (Ok(x), Ok(y)) = (a.parse::<u128>(), b.parse::<u128>())
                && !b.is_empty()
                && let Some(p) = x.checked_mul(y)
            {
                return Some((x, y, p));
            }
        }
        i = j.max(i + 1);
    }
    None
}

fn schema_value(schema: &Value) -> Value {
    if let Some(e) = schema["enum"].as_array().and_then(|e| e.first()) {
        return e.clone();
    }
    let t = match &schema["type"] {
        Value::Array(a) => a.first().and_then(Value::as_str).unwrap_or("string"),
        Value::String(s) => s.as_str(),
        _ => "string",
    };
    match t {
        "integer" | "number" => json!(1),
        "boolean" => json!(true),
        "array" => json!([]),
        "object" => {
            let mut m = Map::new();
            for r in schema["required"].as_array().into_iter().flatten() {
                if let Some(r) = r.as_str() {
                    m.insert(r.to_owned(), schema_value(&schema["properties"][r]));
                }
            }
            Value::Object(m)
        }
        "null" => Value::Null,
        _ => json!("stand-in"),
    }
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

/// Understands a chat request: validation, the pool rule, thinking, tools, images and the
/// deterministic answer.
///
/// # Errors
/// 400 [`ApiError`]s: malformed request, `n` ≠ 1, bad images, `context_length_exceeded`.
pub fn plan_chat(cfg: &ServerConfig, body: &[u8]) -> Result<ChatPlan, ApiError> {
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
    let mut images = Vec::new();
    let mut text_bytes = 0u64;
    let mut last_user = String::new();
    for m in messages {
        let role = m["role"]
            .as_str()
            .ok_or_else(|| ApiError::bad("every message needs a role"))?;
        let t = text_of(&m["content"], &mut images, cfg.vision)?;
        text_bytes += t.len() as u64;
        for tc in m["tool_calls"].as_array().into_iter().flatten() {
            text_bytes += tc["function"]["arguments"].as_str().map_or(0, str::len) as u64;
        }
        if role == "user" {
            last_user = t;
        }
    }
    let prompt_tokens = text_bytes.div_ceil(4).max(1) + 256 * images.len() as u64;
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
    let last_role = messages
        .last()
        .and_then(|m| m["role"].as_str())
        .unwrap_or("");
    let tools = v["tools"].as_array().filter(|t| !t.is_empty());
    let tool_choice = &v["tool_choice"];
    let tool = match tools {
        Some(tools) if tool_choice.as_str() != Some("none") && last_role != "tool" => {
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
            let args = schema_value(
                &json!({"type": "object", "required": params["required"], "properties": params["properties"]}),
            );
            Some((name.to_owned(), args.to_string()))
        }
        _ => None,
    };
    let product = find_product(&last_user);
    let mut reasoning = thinking.then(|| match (&tool, product) {
        (Some((n, _)), _) => format!("A tool is offered; I call {n}."),
        (None, Some((a, b, p))) => format!("The user asks for {a}*{b}. {a}*{b} = {p}."),
        (None, None) => "The stand-in answers with its fixed sentence.".to_owned(),
    });
    let mut content = match (&tool, product) {
        (Some(_), _) => None,
        (None, Some((_, _, p))) => Some(p.to_string()),
        (None, None) if !images.is_empty() => Some(format!(
            "I received {} image(s): {}.",
            images.len(),
            images
                .iter()
                .map(|i| format!("{}x{} PNG ({} bytes)", i.width, i.height, i.bytes))
                .collect::<Vec<_>>()
                .join(", ")
        )),
        (None, None) => Some("Hello from the TensorFold dsv41 engine stand-in.".to_owned()),
    };
    let mut finish = if tool.is_some() { "tool_calls" } else { "stop" };
    // the reply budget: reasoning first, then content
    let budget = max_tokens;
    let mut reasoning_tokens = reasoning.as_deref().map_or(0, tokens);
    if tool.is_none() {
        if reasoning_tokens > budget {
            reasoning = reasoning.map(|r| cut(&r, (budget * 4) as usize).to_owned());
            reasoning_tokens = budget;
            content = Some(String::new());
            finish = "length";
        } else if let Some(c) = &content {
            let left = budget - reasoning_tokens;
            if tokens(c) > left {
                content = Some(cut(c, (left * 4) as usize).to_owned());
                finish = "length";
            }
        }
    }
    let completion_tokens = reasoning_tokens
        + content.as_deref().map_or(0, tokens)
        + tool.as_ref().map_or(0, |(n, a)| tokens(n) + tokens(a));
    Ok(ChatPlan {
        model,
        stream: v["stream"].as_bool().unwrap_or(false),
        include_usage: v["stream_options"]["include_usage"]
            .as_bool()
            .unwrap_or(false),
        prompt_tokens,
        max_tokens,
        thinking,
        reasoning,
        content,
        tool_call: tool,
        images,
        finish_reason: finish,
        completion_tokens,
        reasoning_tokens,
    })
}

fn usage(p: &ChatPlan) -> Value {
    json!({
        "prompt_tokens": p.prompt_tokens,
        "completion_tokens": p.completion_tokens,
        "total_tokens": p.prompt_tokens + p.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": p.reasoning_tokens},
    })
}

fn sse(events: &[Value]) -> Response {
    let mut text = String::new();
    for e in events {
        text.push_str("data: ");
        text.push_str(&e.to_string());
        text.push_str("\n\n");
    }
    text.push_str("data: [DONE]\n\n");
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from(text),
    )
        .into_response()
}

async fn chat(st: &AppState, body: &[u8]) -> Response {
    st.requests.fetch_add(1, Ordering::SeqCst);
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
    let id = format!("chatcmpl-{}", &hex::encode(Sha256::digest(body))[..24]);
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let proof = st.cfg.proof.to_json();
    let tool_calls = plan.tool_call.as_ref().map(|(name, args)| {
        let cid = format!(
            "call_{}",
            &hex::encode(Sha256::digest(format!("{name}{args}{id}")))[..24]
        );
        json!([{"id": cid, "type": "function", "function": {"name": name, "arguments": args}}])
    });
    let extras = json!({
        "engine": "tensorfold-native stand-in",
        "rank1": "followed",
        "images": plan.images.iter().map(|i| json!({"bytes": i.bytes, "width": i.width, "height": i.height, "format": "png"})).collect::<Vec<_>>(),
        "thinking": plan.thinking,
    });
    if plan.stream {
        let chunk = |delta: Value, finish: Value| {
            json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": plan.model,
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": null}],
                   "split_proof": proof})
        };
        let mut ev = vec![chunk(
            json!({"role": "assistant", "content": ""}),
            Value::Null,
        )];
        if let Some(r) = &plan.reasoning {
            for w in r.split_inclusive(' ') {
                ev.push(chunk(json!({"reasoning_content": w}), Value::Null));
            }
        }
        if let Some(c) = &plan.content {
            for w in c.split_inclusive(' ') {
                ev.push(chunk(json!({"content": w}), Value::Null));
            }
        }
        if let Some(tc) = &tool_calls {
            let mut tc = tc.clone();
            tc[0]["index"] = json!(0);
            ev.push(chunk(json!({"tool_calls": tc}), Value::Null));
        }
        let mut last = chunk(json!({}), json!(plan.finish_reason));
        last["tensorfold"] = extras;
        ev.push(last);
        if plan.include_usage {
            ev.push(json!({"id": id, "object": "chat.completion.chunk", "created": created,
                           "model": plan.model, "choices": [], "usage": usage(&plan), "split_proof": proof}));
        }
        return sse(&ev);
    }
    let mut message = json!({"role": "assistant", "content": plan.content});
    if let Some(r) = &plan.reasoning {
        message["reasoning_content"] = json!(r);
    }
    if let Some(tc) = tool_calls {
        message["tool_calls"] = tc;
    }
    json_response(
        StatusCode::OK,
        &json!({
            "id": id,
            "object": "chat.completion",
            "created": created,
            "model": plan.model,
            "choices": [{"index": 0, "message": message, "finish_reason": plan.finish_reason, "logprobs": null}],
            "usage": usage(&plan),
            "exact_mode": true,
            "tensorfold": extras,
            "speculative": {"drafted": 0, "accepted": 0},
            "split_proof": proof,
        }),
    )
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
        }
    }

    #[test]
    fn products_pool_rule_and_thinking() {
        assert_eq!(find_product("what is 17*23?"), Some((17, 23, 391)));
        assert_eq!(find_product("a 12 × 3 b"), Some((12, 3, 36)));
        assert_eq!(find_product("no product 12 here"), None);
        let p = plan_chat(
            &cfg(),
            br#"{"messages":[{"role":"user","content":"17*23"}]}"#,
        )
        .unwrap();
        assert_eq!(p.content.as_deref(), Some("391"));
        assert!(p.reasoning.is_some());
        let p = plan_chat(
            &cfg(),
            br#"{"messages":[{"role":"user","content":"17*23"}],"reasoning_effort":"none"}"#,
        )
        .unwrap();
        assert!(p.reasoning.is_none());
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
