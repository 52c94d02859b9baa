//! Reading a chat reply for a check: the parts a check looks at ([`Answer`]), a one-line
//! excerpt, and the two outcomes a check concludes with.

use serde_json::Value;

use super::Verdict;
use crate::api::Reply;

pub(super) type Outcome = (Verdict, String);

pub(super) fn pass(detail: impl Into<String>) -> Outcome {
    (Verdict::Pass, detail.into())
}

pub(super) fn fail(detail: impl Into<String>) -> Outcome {
    (Verdict::Fail, detail.into())
}

pub(super) fn short(s: &str) -> String {
    let one: String = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if one.chars().count() > 80 {
        format!("{}…", one.chars().take(80).collect::<String>())
    } else {
        one
    }
}

/// The parts of a chat reply a check looks at.
pub(super) struct Answer {
    pub(super) content: String,
    pub(super) reasoning: String,
    pub(super) finish: String,
    pub(super) tool_calls: Vec<Value>,
    pub(super) body: Value,
}

pub(super) fn answer(r: &Reply) -> Result<Answer, Outcome> {
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

pub(super) fn leaked(content: &str) -> bool {
    content.contains("<think>") || content.contains("</think>")
}

pub(super) fn call_args(a: &Answer, name: &str) -> Result<Value, Outcome> {
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

pub(super) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
