//! A minimal client of a deployment's OpenAI-compatible API, used by `validate` and `bench`: the
//! base URL from `serving.host`/`serving.port` (`0.0.0.0` is reached as `127.0.0.1`), the served
//! name from `model.served_name`, the key from `serving.api_key_file`. Nothing here depends on
//! where the engine runs.
//!
//! Streaming reads server-sent events as they arrive and stamps each `data:` line with the time
//! it was read, so timings are taken the way a client sees them.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::config::ValidatedConfig;
use crate::secret::Secret;

/// Errors of talking to the API.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The API key file could not be read.
    #[error(
        "{cause}; remedy: run `spark-deploy up` (it writes the key), or point serving.api_key_file at the key file"
    )]
    Key {
        /// The key file error (in the message, so not repeated as a cause).
        cause: crate::lifecycle::api_key::ApiKeyError,
    },
    /// The request did not complete.
    #[error(
        "{method} {url}: {detail}; remedy: check the deployment is up (`spark-deploy status`) and serving.host/serving.port point at rank 0"
    )]
    Transport {
        /// `GET`/`POST`.
        method: &'static str,
        /// The URL.
        url: String,
        /// What failed.
        detail: String,
    },
}

/// A reply: status and body.
#[derive(Debug, Clone)]
pub struct Reply {
    /// HTTP status.
    pub status: u16,
    /// The body as text.
    pub text: String,
}

impl Reply {
    /// The body as JSON (`Null` when it is not JSON).
    #[must_use]
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or(Value::Null)
    }

    /// The error message of an error body, else the start of the body.
    #[must_use]
    pub fn error_message(&self) -> String {
        let v = self.json();
        v["error"]["message"]
            .as_str()
            .map_or_else(|| self.text.chars().take(200).collect(), str::to_owned)
    }
}

/// One streamed chat completion, as the client saw it.
#[derive(Debug, Clone)]
pub struct Streamed {
    /// HTTP status (the other fields are empty unless 200).
    pub status: u16,
    /// When the request was sent.
    pub start: Instant,
    /// When the first chunk carrying generated tokens arrived.
    pub first_token: Option<Instant>,
    /// When the last chunk carrying generated tokens arrived.
    pub last_token: Option<Instant>,
    /// When the stream ended.
    pub end: Instant,
    /// Chunks carrying generated tokens.
    pub token_chunks: u64,
    /// `usage` of the final chunk (`stream_options.include_usage`).
    pub usage: Option<Value>,
    /// Concatenated `content`.
    pub content: String,
    /// The `tensorfold` block, when the engine sends one.
    pub tensorfold: Option<Value>,
    /// An error event's message, or the error body of a non-200 reply.
    pub error: Option<String>,
}

/// The API of one deployment.
#[derive(Debug, Clone)]
pub struct Api {
    /// `http://host:port`.
    pub base_url: String,
    /// The served model id.
    pub model: String,
    /// The pool (`serving.context`).
    pub pool: u64,
    /// Concurrent streams (`serving.parallel`).
    pub parallel: u32,
    key: Option<Secret>,
    client: reqwest::Client,
}

impl Api {
    /// The API `config` serves, with its key.
    ///
    /// # Errors
    /// [`ApiError::Key`] when the key file cannot be read.
    pub fn from_config(config: &ValidatedConfig) -> Result<Self, ApiError> {
        let c = config.config();
        let key = crate::lifecycle::api_key::read(std::path::Path::new(&c.serving.api_key_file))
            .map_err(|cause| ApiError::Key { cause })?;
        let host = if c.serving.host == "0.0.0.0" || c.serving.host.is_empty() {
            "127.0.0.1".to_owned()
        } else if c.serving.host.contains(':') {
            format!("[{}]", c.serving.host)
        } else {
            c.serving.host.clone()
        };
        Ok(Self::new(
            format!("http://{host}:{}", c.serving.port),
            c.model.served_name.clone(),
            Some(key),
            c.serving.context,
            c.serving.parallel,
        ))
    }

    /// An API at `base_url` serving `model`.
    #[must_use]
    pub fn new(
        base_url: String,
        model: String,
        key: Option<Secret>,
        pool: u64,
        parallel: u32,
    ) -> Self {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(3600))
            .connect_timeout(Duration::from_secs(10))
            .pool_max_idle_per_host(16)
            .build()
            .unwrap_or_default();
        Self {
            base_url,
            model,
            pool,
            parallel,
            key,
            client,
        }
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let mut r = self
            .client
            .request(method, format!("{}{path}", self.base_url));
        if let Some(k) = &self.key {
            r = r.bearer_auth(k.expose());
        }
        r
    }

    fn transport(&self, method: &'static str, path: &str, e: &reqwest::Error) -> ApiError {
        ApiError::Transport {
            method,
            url: format!("{}{path}", self.base_url),
            detail: e.to_string(),
        }
    }

    /// `GET path`.
    ///
    /// # Errors
    /// [`ApiError::Transport`] when no reply arrives.
    pub async fn get(&self, path: &str) -> Result<Reply, ApiError> {
        let r = self
            .request(reqwest::Method::GET, path)
            .send()
            .await
            .map_err(|e| self.transport("GET", path, &e))?;
        let status = r.status().as_u16();
        let text = r
            .text()
            .await
            .map_err(|e| self.transport("GET", path, &e))?;
        Ok(Reply { status, text })
    }

    /// `POST path` with a JSON body.
    ///
    /// # Errors
    /// [`ApiError::Transport`] when no reply arrives.
    pub async fn post(&self, path: &str, body: &Value) -> Result<Reply, ApiError> {
        let r = self
            .request(reqwest::Method::POST, path)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_string())
            .send()
            .await
            .map_err(|e| self.transport("POST", path, &e))?;
        let status = r.status().as_u16();
        let text = r
            .text()
            .await
            .map_err(|e| self.transport("POST", path, &e))?;
        Ok(Reply { status, text })
    }

    /// A chat completion (`model` is filled in).
    ///
    /// # Errors
    /// [`ApiError::Transport`] when no reply arrives.
    pub async fn chat(&self, mut body: Value) -> Result<Reply, ApiError> {
        body["model"] = Value::String(self.model.clone());
        self.post("/v1/chat/completions", &body).await
    }

    /// A streamed chat completion (`model`, `stream` and `stream_options.include_usage` are
    /// filled in), timed chunk by chunk.
    ///
    /// # Errors
    /// [`ApiError::Transport`] when the request or the stream fails.
    pub async fn stream_chat(&self, mut body: Value) -> Result<Streamed, ApiError> {
        const PATH: &str = "/v1/chat/completions";
        body["model"] = Value::String(self.model.clone());
        body["stream"] = Value::Bool(true);
        body["stream_options"] = serde_json::json!({"include_usage": true});
        let start = Instant::now();
        let mut r = self
            .request(reqwest::Method::POST, PATH)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_string())
            .send()
            .await
            .map_err(|e| self.transport("POST", PATH, &e))?;
        let status = r.status().as_u16();
        let mut s = Streamed {
            status,
            start,
            first_token: None,
            last_token: None,
            end: start,
            token_chunks: 0,
            usage: None,
            content: String::new(),
            tensorfold: None,
            error: None,
        };
        if status != 200 {
            let text = r.text().await.unwrap_or_default();
            s.error = Some(Reply { status, text }.error_message());
            s.end = Instant::now();
            return Ok(s);
        }
        let mut buf: Vec<u8> = Vec::new();
        while let Some(bytes) = r
            .chunk()
            .await
            .map_err(|e| self.transport("POST", PATH, &e))?
        {
            let now = Instant::now();
            buf.extend_from_slice(&bytes);
            while let Some(i) = buf.windows(2).position(|w| w == b"\n\n") {
                let event: Vec<u8> = buf.drain(..i + 2).collect();
                let line = String::from_utf8_lossy(&event);
                for data in line.lines().filter_map(|l| l.strip_prefix("data:")) {
                    s.take(data.trim(), now);
                }
            }
        }
        s.end = Instant::now();
        Ok(s)
    }
}

impl Streamed {
    fn take(&mut self, data: &str, now: Instant) {
        if data == "[DONE]" {
            return;
        }
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            return;
        };
        if let Some(e) = v.get("error") {
            self.error = Some(e["message"].as_str().unwrap_or("error event").to_owned());
        }
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            self.usage = Some(u.clone());
        }
        if let Some(t) = v.get("tensorfold") {
            self.tensorfold = Some(t.clone());
        }
        let delta = &v["choices"][0]["delta"];
        let text = |k: &str| delta[k].as_str().unwrap_or_default();
        let carries = !text("content").is_empty()
            || !text("reasoning_content").is_empty()
            || delta["tool_calls"].is_array();
        self.content.push_str(text("content"));
        if carries {
            self.first_token.get_or_insert(now);
            self.last_token = Some(now);
            self.token_chunks += 1;
        }
    }

    /// `usage.completion_tokens`.
    #[must_use]
    pub fn completion_tokens(&self) -> Option<u64> {
        self.usage.as_ref()?["completion_tokens"].as_u64()
    }

    /// `usage.prompt_tokens`.
    #[must_use]
    pub fn prompt_tokens(&self) -> Option<u64> {
        self.usage.as_ref()?["prompt_tokens"].as_u64()
    }

    /// `usage.prompt_tokens_details.cached_tokens` (0 when absent).
    #[must_use]
    pub fn cached_tokens(&self) -> u64 {
        self.usage.as_ref().map_or(0, |u| {
            u["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap_or(0)
        })
    }
}
