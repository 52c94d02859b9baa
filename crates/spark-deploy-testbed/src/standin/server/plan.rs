//! Understanding a chat request before it runs: messages, images, the pool rule, thinking,
//! tools, response formats, fault modes and the deterministic answer; `/tokenize`.

use super::*;

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

pub(super) fn tokens(s: &str) -> u64 {
    (s.len() as u64).div_ceil(4)
}

pub(super) fn align_up(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

pub(super) fn decode_image(url: &str) -> Result<ImageInfo, ApiError> {
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

pub(super) fn text_of(
    content: &Value,
    images: &mut Vec<ImageInfo>,
    vision: bool,
) -> Result<String, ApiError> {
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

pub(super) fn cut(s: &str, max_bytes: usize) -> &str {
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
pub(super) struct Prompt {
    text: String,
    last_user: String,
    images: Vec<ImageInfo>,
    tokens: u64,
    last_role: String,
}

pub(super) fn read_prompt(cfg: &ServerConfig, messages: &[Value]) -> Result<Prompt, ApiError> {
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
pub(super) fn arrays_as_strings(v: Value) -> Value {
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
