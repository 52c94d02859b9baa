//! `validate`: proves what a deployment serves, through its API only (docs/validate-and-bench.md).
//!
//! Checks, in order: `text`, `thinking_on`, `thinking_off`, `tool_call`, `tool_array`,
//! `json_schema`, `tokenizer`, `image`, `needle`, `exactness`. Each yields a [`Verdict`] with its
//! wall time and a one-line detail; `json_schema` answered with 400 is `unsupported`, not a
//! failure. Events carry `Source::Command("validate")`.

pub mod images;

use std::time::Instant;

use serde::Serialize;
use serde_json::{Value, json};

use crate::api::{Api, ApiError, Reply};
use crate::event::{Event, EventSink, Level, Source};

/// One check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Check {
    /// A one-word factual answer, thinking off.
    Text,
    /// Thinking on: non-empty `reasoning_content`, the answer in `content`.
    ThinkingOn,
    /// Thinking off: no reasoning anywhere.
    ThinkingOff,
    /// A tool call with a string argument.
    ToolCall,
    /// A tool call whose `tags` argument must arrive as a JSON array.
    ToolArray,
    /// JSON-schema constrained output (400 = unsupported).
    JsonSchema,
    /// `/tokenize`.
    Tokenizer,
    /// Image input: the generated probe set.
    Image,
    /// A passphrase in a long prompt.
    Needle,
    /// Same tokens with and without drafts.
    Exactness,
}

impl Check {
    /// Every check, in the order they run.
    pub const ALL: [Self; 10] = [
        Self::Text,
        Self::ThinkingOn,
        Self::ThinkingOff,
        Self::ToolCall,
        Self::ToolArray,
        Self::JsonSchema,
        Self::Tokenizer,
        Self::Image,
        Self::Needle,
        Self::Exactness,
    ];

    /// The name used by `--only` / `--skip` and in reports.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Text => "text",
            Self::ThinkingOn => "thinking_on",
            Self::ThinkingOff => "thinking_off",
            Self::ToolCall => "tool_call",
            Self::ToolArray => "tool_array",
            Self::JsonSchema => "json_schema",
            Self::Tokenizer => "tokenizer",
            Self::Image => "image",
            Self::Needle => "needle",
            Self::Exactness => "exactness",
        }
    }

    /// The check named `name`.
    ///
    /// # Errors
    /// [`ValidateError::UnknownCheck`] naming the known checks.
    pub fn parse(name: &str) -> Result<Self, ValidateError> {
        let n = name.trim().replace('-', "_");
        Self::ALL
            .into_iter()
            .find(|c| c.name() == n)
            .ok_or_else(|| ValidateError::UnknownCheck {
                name: name.to_owned(),
            })
    }
}

/// A check's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// It holds.
    Pass,
    /// It does not hold: the deployment is not serving correctly.
    Fail,
    /// The engine says it does not offer this (not a failure).
    Unsupported,
}

impl Verdict {
    /// `PASS`, `FAIL`, `UNSUPPORTED`.
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::Pass => "PASS",
            Self::Fail => "FAIL",
            Self::Unsupported => "UNSUPPORTED",
        }
    }
}

/// One check's result.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CheckResult {
    /// The check.
    pub check: Check,
    /// Its outcome.
    pub verdict: Verdict,
    /// What was seen, in one line.
    pub detail: String,
    /// Wall time, seconds.
    pub seconds: f64,
}

/// Every result.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// The API validated.
    pub base_url: String,
    /// The served model.
    pub model: String,
    /// One result per check run.
    pub results: Vec<CheckResult>,
}

impl Report {
    /// True when no check failed.
    #[must_use]
    pub fn ok(&self) -> bool {
        self.results.iter().all(|r| r.verdict != Verdict::Fail)
    }
}

/// Errors of `validate` before any check runs.
#[derive(Debug, thiserror::Error)]
pub enum ValidateError {
    /// `--only` / `--skip` named an unknown check.
    #[error("no check is named {name:?}; remedy: use one of {}", Check::ALL.map(Check::name).join(", "))]
    UnknownCheck {
        /// The name given.
        name: String,
    },
    /// The needle does not fit the pool.
    #[error(
        "--needle {tokens} does not fit the pool of {pool} positions (with {reply} reply tokens and alignment); remedy: use --needle {max} or less, or raise serving.context"
    )]
    NeedleTooLarge {
        /// Asked.
        tokens: u64,
        /// `serving.context`.
        pool: u64,
        /// Reply budget.
        reply: u64,
        /// The largest that fits.
        max: u64,
    },
    /// The API could not be set up.
    #[error(transparent)]
    Api(#[from] ApiError),
}

/// Which checks run and how large the needle prompt is.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// Only these (empty = all).
    pub only: Vec<Check>,
    /// Not these.
    pub skip: Vec<Check>,
    /// Approximate prompt tokens of the needle check (`None` = [`DEFAULT_NEEDLE`], capped by
    /// the pool).
    pub needle_tokens: Option<u64>,
}

/// The needle prompt's default size, in tokens: modest, so `validate` stays quick.
pub const DEFAULT_NEEDLE: u64 = 16_000;
/// The needle check's reply budget: 2,048 tokens, less on a small pool (an eighth of it, at
/// least 64).
#[must_use]
pub fn needle_reply(pool: u64) -> u64 {
    (pool / 8).clamp(64, 2048)
}
/// The passphrase hidden in the needle prompt.
pub const PASSPHRASE: &str = "violet-harbor-7291";

impl Options {
    fn selected(&self) -> Vec<Check> {
        Check::ALL
            .into_iter()
            .filter(|c| self.only.is_empty() || self.only.contains(c))
            .filter(|c| !self.skip.contains(c))
            .collect()
    }

    /// The needle size for `pool`: the asked size, or the default capped by what fits.
    ///
    /// # Errors
    /// [`ValidateError::NeedleTooLarge`] when an asked size does not fit.
    pub fn needle_for(&self, pool: u64) -> Result<u64, ValidateError> {
        // prompt + reply + 18 rounded up to 2048 must fit; keep a margin for the tokenizer
        let reply = needle_reply(pool);
        let max = pool.saturating_sub(reply + 2048 + 64) * 9 / 10;
        match self.needle_tokens {
            Some(t) if t > max => Err(ValidateError::NeedleTooLarge {
                tokens: t,
                pool,
                reply,
                max,
            }),
            Some(t) => Ok(t),
            None => Ok(DEFAULT_NEEDLE.min(max)),
        }
    }
}

type Outcome = (Verdict, String);

fn pass(detail: impl Into<String>) -> Outcome {
    (Verdict::Pass, detail.into())
}

fn fail(detail: impl Into<String>) -> Outcome {
    (Verdict::Fail, detail.into())
}

fn short(s: &str) -> String {
    let one: String = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if one.chars().count() > 80 {
        format!("{}…", one.chars().take(80).collect::<String>())
    } else {
        one
    }
}

/// The parts of a chat reply a check looks at.
struct Answer {
    content: String,
    reasoning: String,
    finish: String,
    tool_calls: Vec<Value>,
    body: Value,
}

fn answer(r: &Reply) -> Result<Answer, Outcome> {
    if r.status != 200 {
        return Err(fail(format!(
            "HTTP {}: {}",
            r.status,
            short(&r.error_message())
        )));
    }
    let body = r.json();
    let m = &body["choices"][0]["message"];
    Ok(Answer {
        content: m["content"].as_str().unwrap_or_default().to_owned(),
        reasoning: m["reasoning_content"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        finish: body["choices"][0]["finish_reason"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        tool_calls: m["tool_calls"].as_array().cloned().unwrap_or_default(),
        body,
    })
}

fn leaked(content: &str) -> bool {
    content.contains("<think>") || content.contains("</think>")
}

async fn text(api: &Api) -> Result<Outcome, ApiError> {
    let r = api
        .chat(json!({"messages": [{"role": "user", "content": "What is the capital of France? One word."}],
                     "temperature": 0, "max_tokens": 16, "reasoning_effort": "none"}))
        .await?;
    Ok(match answer(&r) {
        Err(o) => o,
        Ok(a) if a.content.to_lowercase().contains("paris") => {
            pass(format!("{:?}", short(&a.content)))
        }
        Ok(a) => fail(format!("expected Paris, got {:?}", short(&a.content))),
    })
}

const SUM: &str = "What is 17 + 25? Answer with the number.";

async fn thinking(api: &Api, on: bool) -> Result<Outcome, ApiError> {
    let mut body = json!({"messages": [{"role": "user", "content": SUM}], "max_tokens": 512});
    if on {
        body["reasoning_effort"] = json!("low");
    } else {
        body["chat_template_kwargs"] = json!({"enable_thinking": false});
    }
    let r = api.chat(body).await?;
    let a = match answer(&r) {
        Err(o) => return Ok(o),
        Ok(a) => a,
    };
    let right = a.content.contains("42");
    Ok(if leaked(&a.content) {
        fail(format!(
            "thinking leaked into content: {:?}",
            short(&a.content)
        ))
    } else if !right {
        fail(format!(
            "expected 42 in content, got {:?}",
            short(&a.content)
        ))
    } else if on && a.reasoning.trim().is_empty() {
        fail("reasoning_content is empty with thinking on")
    } else if !on && !a.reasoning.trim().is_empty() {
        fail(format!(
            "reasoning_content present with thinking off: {:?}",
            short(&a.reasoning)
        ))
    } else if on {
        pass(format!("42, {} chars of reasoning", a.reasoning.len()))
    } else {
        pass("42, no reasoning")
    })
}

fn call_args(a: &Answer, name: &str) -> Result<Value, Outcome> {
    if a.finish != "tool_calls" {
        return Err(fail(format!(
            "finish_reason {:?}, expected tool_calls (content {:?})",
            a.finish,
            short(&a.content)
        )));
    }
    let call = a
        .tool_calls
        .iter()
        .find(|c| c["function"]["name"] == name)
        .ok_or_else(|| {
            fail(format!(
                "no call of {name} among {} tool call(s)",
                a.tool_calls.len()
            ))
        })?;
    let raw = call["function"]["arguments"].as_str().unwrap_or_default();
    serde_json::from_str(raw).map_err(|e| fail(format!("arguments are not JSON ({e}): {raw:?}")))
}

async fn tool_call(api: &Api) -> Result<Outcome, ApiError> {
    let r = api
        .chat(json!({"messages": [{"role": "user", "content": "What is the weather in Paris right now? Use the get_weather tool."}],
            "max_tokens": 512, "reasoning_effort": "none", "tool_choice": "auto",
            "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]}))
        .await?;
    Ok(
        match answer(&r).and_then(|a| call_args(&a, "get_weather")) {
            Err(o) => o,
            Ok(args) if args["city"].is_string() => pass(format!("get_weather({args})")),
            Ok(args) => fail(format!("arguments lack a string city: {args}")),
        },
    )
}

async fn tool_array(api: &Api) -> Result<Outcome, ApiError> {
    let r = api
        .chat(json!({"max_tokens": 1024, "temperature": 0,
            "messages": [{"role": "user", "content": "Tag document 42 with 'urgent', 'finance' and 'q3' using the tool."}],
            "tools": [{"type": "function", "function": {"name": "add_tags", "description": "Add tags to a document",
                "parameters": {"type": "object", "properties": {"doc_id": {"type": "integer"},
                    "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["doc_id", "tags"]}}}]}))
        .await?;
    Ok(match answer(&r).and_then(|a| call_args(&a, "add_tags")) {
        Err(o) => o,
        Ok(args) => match (&args["tags"], &args["doc_id"]) {
            (Value::Array(t), d) if t.len() >= 3 && d.is_i64() => pass(format!("add_tags({args})")),
            (Value::Array(t), _) if t.len() < 3 => fail(format!(
                "tags has {} item(s), expected ≥ 3: {args}",
                t.len()
            )),
            (Value::Array(_), d) => fail(format!("doc_id is not an integer: {d}")),
            (t, _) => fail(format!(
                "tags arrived as {}, not a JSON array: {t}",
                kind(t)
            )),
        },
    })
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

async fn json_schema(api: &Api) -> Result<Outcome, ApiError> {
    let r = api
        .chat(json!({"messages": [{"role": "user", "content": "Is water wet? Answer in JSON."}],
            "max_tokens": 256, "reasoning_effort": "none",
            "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": {
                "type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}}}}))
        .await?;
    if r.status == 400 {
        return Ok((
            Verdict::Unsupported,
            format!(
                "the engine refuses response_format: {}",
                short(&r.error_message())
            ),
        ));
    }
    Ok(match answer(&r) {
        Err(o) => o,
        Ok(a) => match serde_json::from_str::<Value>(a.content.trim()) {
            Ok(v) if v["ok"].is_boolean() => pass(v.to_string()),
            Ok(v) => fail(format!("ok is not a boolean: {v}")),
            Err(e) => fail(format!(
                "content is not JSON ({e}): {:?}",
                short(&a.content)
            )),
        },
    })
}

async fn tokenizer(api: &Api) -> Result<Outcome, ApiError> {
    let r = api
        .post("/tokenize", &json!({"model": api.model, "messages": [{"role": "user", "content": "Hello, world."}]}))
        .await?;
    if r.status != 200 {
        return Ok(fail(format!(
            "/tokenize: HTTP {}: {}",
            r.status,
            short(&r.error_message())
        )));
    }
    let v = r.json();
    let tokens = v["tokens"].as_array().cloned().unwrap_or_default();
    let count = v["count"].as_u64();
    Ok(if tokens.first().and_then(Value::as_u64) != Some(0) {
        fail(format!(
            "tokens[0] is {}, expected 0 (BOS)",
            tokens.first().unwrap_or(&Value::Null)
        ))
    } else if count != Some(tokens.len() as u64) {
        fail(format!("count {} ≠ {} tokens", v["count"], tokens.len()))
    } else {
        pass(format!("{} tokens", tokens.len()))
    })
}

async fn image(api: &Api) -> Result<Outcome, ApiError> {
    use base64_png::encode;
    let mut seen = Vec::new();
    let mut transcribed = None;
    for pic in images::pictures() {
        let url = format!("data:image/png;base64,{}", encode(&pic.png));
        let r = api
            .chat(json!({"temperature": 0, "max_tokens": 256, "reasoning_effort": "none",
                "messages": [{"role": "user", "content": [
                    {"type": "image_url", "image_url": {"url": url}},
                    {"type": "text", "text": "Describe this image, and transcribe any text in it exactly."}]}]}))
            .await?;
        let a = match answer(&r) {
            Err((v, d)) => {
                return Ok((
                    v,
                    format!("{} ({}x{}): {d}", pic.name, pic.width, pic.height),
                ));
            }
            Ok(a) => a,
        };
        if a.content.trim().is_empty() {
            return Ok(fail(format!(
                "{} ({}x{}): empty answer",
                pic.name, pic.width, pic.height
            )));
        }
        if let Some(w) = pic.must_mention
            && !a.content.to_lowercase().contains(w)
        {
            return Ok(fail(format!(
                "{}: the answer does not mention {w}: {:?}",
                pic.name,
                short(&a.content)
            )));
        }
        if let Some(t) = pic.text {
            transcribed = Some(a.content.to_uppercase().contains(t));
        }
        seen.push(pic.name);
    }
    let t = match transcribed {
        Some(true) => "; the sign was transcribed",
        Some(false) => "; the sign was not transcribed (reported, not required)",
        None => "",
    };
    Ok(pass(format!(
        "{} images answered ({}){t}",
        seen.len(),
        seen.join(", ")
    )))
}

/// Base64 for data URLs (standard alphabet, padded).
mod base64_png {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

    pub(super) fn encode(b: &[u8]) -> String {
        let mut out = String::with_capacity(b.len().div_ceil(3) * 4);
        for c in b.chunks(3) {
            let n = (u32::from(c[0]) << 16)
                | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
                | u32::from(*c.get(2).unwrap_or(&0));
            for k in 0..4 {
                if k <= c.len() {
                    out.push(A[(n >> (18 - 6 * k) & 63) as usize] as char);
                } else {
                    out.push('=');
                }
            }
        }
        out
    }
}

/// Prose from a word list, about `tokens` tokens long (~4.5 bytes a token), with the passphrase
/// sentence at 60 % depth. Deterministic.
#[must_use]
pub fn needle_prompt(tokens: u64) -> String {
    const WORDS: &[&str] = &[
        "amber", "valley", "quiet", "river", "stone", "market", "lantern", "harbour", "winter",
        "garden", "copper", "meadow", "signal", "window", "forest", "thread", "island", "candle",
        "engine", "orchard", "station", "mirror", "canvas", "bridge", "pepper", "saddle", "ribbon",
    ];
    let bytes = usize::try_from(tokens.saturating_mul(9) / 2).unwrap_or(usize::MAX);
    let at = bytes * 6 / 10;
    let mut s = String::with_capacity(bytes + 128);
    let mut x: u64 = 1234;
    let mut placed = false;
    let mut words = 0;
    while s.len() < bytes {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        s.push_str(WORDS[((x >> 33) % WORDS.len() as u64) as usize]);
        words += 1;
        s.push_str(if words % 12 == 0 { ". " } else { " " });
        if !placed && s.len() >= at {
            s.push_str(&format!("The secret passphrase is {PASSPHRASE}. "));
            placed = true;
        }
    }
    s
}

async fn needle(api: &Api, tokens: u64) -> Result<Outcome, ApiError> {
    let prompt = format!(
        "{}\n\nWhat is the secret passphrase stated in the text above? Answer with the passphrase only.",
        needle_prompt(tokens)
    );
    let r = api
        .chat(json!({"messages": [{"role": "user", "content": prompt}], "temperature": 0, "seed": 1234,
                     "max_tokens": needle_reply(api.pool), "reasoning_effort": "none"}))
        .await?;
    Ok(match answer(&r) {
        Err(o) => o,
        Ok(a) => {
            let pt = &a.body["usage"]["prompt_tokens"];
            let pf = a.body["tensorfold"]["prefill_s"]
                .as_f64()
                .map_or_else(String::new, |s| format!(", prefill {s:.2} s"));
            if a.content.contains(PASSPHRASE) {
                pass(format!("found in {pt} prompt tokens{pf}"))
            } else {
                fail(format!(
                    "not found in {pt} prompt tokens: {:?}",
                    short(&a.content)
                ))
            }
        }
    })
}

async fn exactness(api: &Api) -> Result<Outcome, ApiError> {
    let body = json!({"messages": [{"role": "user", "content": "Write two sentences about a lighthouse."}],
        "temperature": 0, "seed": 1234, "max_tokens": 128, "reasoning_effort": "none"});
    let mut serial = body.clone();
    serial["draft"] = json!(false);
    let mut hashes = Vec::new();
    for b in [body, serial] {
        let r = api.chat(b).await?;
        let a = match answer(&r) {
            Err(o) => return Ok(o),
            Ok(a) => a,
        };
        let h = a.body["tensorfold"]["token_sha"].as_str().map_or_else(
            || {
                use sha2::Digest as _;
                format!(
                    "reply:{}",
                    hex::encode(sha2::Sha256::digest(a.content.as_bytes()))
                )
            },
            str::to_owned,
        );
        hashes.push(h);
    }
    Ok(if hashes[0] == hashes[1] {
        pass(format!(
            "token hash {} with and without drafts",
            &hashes[0][..hashes[0].len().min(16)]
        ))
    } else {
        fail(format!(
            "drafted {} ≠ serial {}",
            &hashes[0][..hashes[0].len().min(16)],
            &hashes[1][..hashes[1].len().min(16)]
        ))
    })
}

/// Runs the selected checks one after the other; every check's outcome is in the report (a
/// transport error fails that check and the rest still run).
///
/// # Errors
/// [`ValidateError::NeedleTooLarge`] before any check when an asked needle does not fit.
pub async fn run(
    api: &Api,
    opts: &Options,
    events: &dyn EventSink,
) -> Result<Report, ValidateError> {
    let source = || Source::Command("validate".into());
    let selected = opts.selected();
    let needle_tokens = if selected.contains(&Check::Needle) {
        opts.needle_for(api.pool)?
    } else {
        0
    };
    events.emit(Event::Started {
        source: source(),
        message: format!(
            "{} check(s) against {} ({})",
            selected.len(),
            api.base_url,
            api.model
        ),
    });
    let all = Instant::now();
    let mut results = Vec::new();
    for check in selected {
        let t = Instant::now();
        let r = match check {
            Check::Text => text(api).await,
            Check::ThinkingOn => thinking(api, true).await,
            Check::ThinkingOff => thinking(api, false).await,
            Check::ToolCall => tool_call(api).await,
            Check::ToolArray => tool_array(api).await,
            Check::JsonSchema => json_schema(api).await,
            Check::Tokenizer => tokenizer(api).await,
            Check::Image => image(api).await,
            Check::Needle => needle(api, needle_tokens).await,
            Check::Exactness => exactness(api).await,
        };
        let (verdict, detail) = r.unwrap_or_else(|e| fail(e.to_string()));
        let res = CheckResult {
            check,
            verdict,
            detail,
            seconds: t.elapsed().as_secs_f64(),
        };
        events.emit(Event::Log {
            source: source(),
            node: None,
            level: if verdict == Verdict::Fail {
                Level::Error
            } else {
                Level::Info
            },
            line: format!(
                "{} {} {:.2}s {}",
                check.name(),
                verdict.label(),
                res.seconds,
                res.detail
            ),
        });
        results.push(res);
    }
    let report = Report {
        base_url: api.base_url.clone(),
        model: api.model.clone(),
        results,
    };
    if report.ok() {
        events.emit(Event::Finished {
            source: source(),
            duration_ms: all.elapsed().as_millis() as u64,
            bytes: None,
        });
    } else {
        let failed: Vec<&str> = report
            .results
            .iter()
            .filter(|r| r.verdict == Verdict::Fail)
            .map(|r| r.check.name())
            .collect();
        events.emit(Event::Failed {
            source: source(),
            error: format!("failed: {}", failed.join(", ")),
            remedy: Some(
                "read each failed check's line; `spark-deploy logs` shows what the engine said"
                    .into(),
            ),
        });
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_needles_and_base64() {
        assert_eq!(Check::parse("tool-array").unwrap(), Check::ToolArray);
        let e = Check::parse("vibes").unwrap_err().to_string();
        assert!(e.contains("vibes") && e.contains("exactness"), "{e}");
        let p = needle_prompt(1000);
        assert!(p.contains(PASSPHRASE));
        let at = p.find(PASSPHRASE).unwrap() as f64 / p.len() as f64;
        assert!((0.55..0.65).contains(&at), "{at}");
        let o = Options {
            only: vec![],
            skip: vec![Check::Image],
            needle_tokens: None,
        };
        assert!(!o.selected().contains(&Check::Image));
        assert_eq!(o.needle_for(1_048_576).unwrap(), DEFAULT_NEEDLE);
        assert!(o.needle_for(8192).unwrap() < 8192);
        // a test-scale pool still holds a needle
        let small = o.needle_for(4096).unwrap();
        assert!(small > 1000, "{small}");
        assert!(small * 10 / 9 + needle_reply(4096) + 2048 + 64 <= 4096 + 10);
        let big = Options {
            needle_tokens: Some(250_000),
            ..o
        };
        assert!(big.needle_for(65_536).is_err());
        assert_eq!(base64_png::encode(b"Man"), "TWFu");
        assert_eq!(base64_png::encode(b"Ma"), "TWE=");
    }
}
