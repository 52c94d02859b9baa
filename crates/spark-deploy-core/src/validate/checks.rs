//! The checks themselves, one function each, in the order they run: each sends its request
//! through the [`Api`] and concludes [`Verdict::Pass`], [`Verdict::Fail`] or (for
//! `json_schema` answered with 400) [`Verdict::Unsupported`], with a one-line detail.

use serde_json::{Value, json};

use super::reply::{Outcome, answer, call_args, fail, kind, leaked, pass, short};
use super::{PASSPHRASE, Verdict, images, needle_reply};
use crate::api::{Api, ApiError};

pub(super) async fn text(api: &Api) -> Result<Outcome, ApiError> {
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

pub(super) async fn thinking(api: &Api, on: bool) -> Result<Outcome, ApiError> {
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

pub(super) async fn tool_call(api: &Api) -> Result<Outcome, ApiError> {
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

pub(super) async fn tool_array(api: &Api) -> Result<Outcome, ApiError> {
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

pub(super) async fn json_schema(api: &Api) -> Result<Outcome, ApiError> {
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

pub(super) async fn tokenizer(api: &Api) -> Result<Outcome, ApiError> {
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

pub(super) async fn image(api: &Api) -> Result<Outcome, ApiError> {
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
pub(super) mod base64_png {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

    pub(in crate::validate) fn encode(b: &[u8]) -> String {
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

pub(super) async fn needle(api: &Api, tokens: u64) -> Result<Outcome, ApiError> {
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

pub(super) async fn exactness(api: &Api) -> Result<Outcome, ApiError> {
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
