//! What the stand-in "knows": deterministic answers to the questions the smoke test and
//! `spark-deploy validate` ask, tool arguments read from the request, and filler text for
//! replies that run to their budget (`ignore_eos`).
//!
//! Rules, first match wins: a question about a passphrase is answered from the prompt
//! (`… passphrase is WORD …`); a product `a*b` (or `a × b`) or a sum `a + b` is computed; "the
//! capital of France" is Paris; otherwise the caller's fixed sentence.

use serde_json::{Map, Value, json};

/// Finds the first product `a*b` (also `a × b`) of unsigned integers in `s`.
#[must_use]
pub fn find_product(s: &str) -> Option<(u128, u128, u128)> {
    find_op(s, &['*', '×']).and_then(|(a, b)| a.checked_mul(b).map(|p| (a, b, p)))
}

/// Finds the first sum `a + b` of unsigned integers in `s`.
#[must_use]
pub fn find_sum(s: &str) -> Option<(u128, u128, u128)> {
    find_op(s, &['+']).and_then(|(a, b)| a.checked_add(b).map(|p| (a, b, p)))
}

fn find_op(s: &str, ops: &[char]) -> Option<(u128, u128)> {
    let c: Vec<char> = s.chars().collect();
    let num = |mut j: usize| -> (String, usize) {
        let mut n = String::new();
        while j < c.len() && c[j].is_ascii_digit() {
            n.push(c[j]);
            j += 1;
        }
        (n, j)
    };
    let mut i = 0;
    while i < c.len() {
        if !c[i].is_ascii_digit() || (i > 0 && c[i - 1].is_ascii_digit()) {
            i += 1;
            continue;
        }
        let (a, mut j) = num(i);
        while j < c.len() && c[j] == ' ' {
            j += 1;
        }
        if j < c.len() && ops.contains(&c[j]) {
            j += 1;
            while j < c.len() && c[j] == ' ' {
                j += 1;
            }
            let (b, _) = num(j);
            if let (Ok(x), Ok(y)) = (a.parse::<u128>(), b.parse::<u128>()) {
                return Some((x, y));
            }
        }
        i = j.max(i + 1);
    }
    None
}

/// The word after "passphrase is" in `prompt`, when the question asks for a passphrase.
#[must_use]
pub fn find_needle(question: &str, prompt: &str) -> Option<String> {
    if !question.to_lowercase().contains("passphrase") {
        return None;
    }
    let at = prompt.find("passphrase is ")? + "passphrase is ".len();
    let word: String = prompt[at..]
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '-' || *c == '_')
        .collect();
    (!word.is_empty()).then_some(word)
}

/// The answer the rules give to `question` (the last user message) over the whole `prompt`.
#[must_use]
pub fn knowledge(question: &str, prompt: &str) -> Option<(String, String)> {
    if let Some(n) = find_needle(question, prompt) {
        return Some((n.clone(), format!("The prompt states the passphrase: {n}.")));
    }
    if let Some((a, b, p)) = find_product(question) {
        return Some((
            p.to_string(),
            format!("The user asks for {a}*{b}. {a}*{b} = {p}."),
        ));
    }
    if let Some((a, b, s)) = find_sum(question) {
        return Some((
            s.to_string(),
            format!("The user asks for {a} + {b}. {a} + {b} = {s}."),
        ));
    }
    if question.to_lowercase().contains("capital of france") {
        return Some(("Paris".into(), "The capital of France is Paris.".into()));
    }
    None
}

/// Quoted items (`'x'` or `"x"`) of `s`, in order.
fn quoted(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = s;
    while let Some(i) = rest.find(['\'', '"']) {
        let q = rest[i..].chars().next().unwrap_or('\'');
        let tail = &rest[i + 1..];
        let Some(j) = tail.find(q) else { break };
        if j > 0 {
            out.push(tail[..j].to_owned());
        }
        rest = &tail[j + 1..];
    }
    out
}

fn first_integer(s: &str) -> Option<i64> {
    s.split(|c: char| !c.is_ascii_digit())
        .find(|w| !w.is_empty())
        .and_then(|w| w.parse().ok())
}

/// A value for `schema`, reading the request's text where it can: integers are the first number
/// in `text` (else 1), arrays of strings its quoted items, strings `"stand-in"`, booleans true.
#[must_use]
pub fn schema_value(schema: &Value, text: &str) -> Value {
    if let Some(e) = schema["enum"].as_array().and_then(|e| e.first()) {
        return e.clone();
    }
    let t = match &schema["type"] {
        Value::Array(a) => a.first().and_then(Value::as_str).unwrap_or("string"),
        Value::String(s) => s.as_str(),
        _ => "string",
    };
    match t {
        "integer" | "number" => json!(first_integer(text).unwrap_or(1)),
        "boolean" => json!(true),
        "array" => json!(quoted(text)),
        "object" => {
            let mut m = Map::new();
            for r in schema["required"].as_array().into_iter().flatten() {
                if let Some(r) = r.as_str() {
                    m.insert(r.to_owned(), schema_value(&schema["properties"][r], text));
                }
            }
            Value::Object(m)
        }
        "null" => Value::Null,
        _ => json!("stand-in"),
    }
}

const WORDS: &[&str] = &[
    "the",
    "river",
    "carries",
    "light",
    "across",
    "a",
    "quiet",
    "valley",
    "where",
    "old",
    "stone",
    "bridges",
    "hold",
    "morning",
    "fog",
    "and",
    "every",
    "lantern",
    "keeps",
    "its",
    "small",
    "promise",
    "to",
    "travellers",
    "who",
    "walk",
    "home",
    "late",
];

/// Filler text of exactly `tokens` four-byte tokens, deterministic for `seed`.
#[must_use]
pub fn filler(tokens: u64, seed: u64) -> String {
    let want = usize::try_from(tokens.saturating_mul(4)).unwrap_or(usize::MAX);
    let mut s = String::with_capacity(want + 16);
    let mut x = seed | 1;
    while s.len() < want {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.push_str(WORDS[(x % WORDS.len() as u64) as usize]);
        s.push(' ');
    }
    s.truncate(want);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules() {
        assert_eq!(find_product("what is 17*23?"), Some((17, 23, 391)));
        assert_eq!(find_product("a 12 × 3 b"), Some((12, 3, 36)));
        assert_eq!(find_product("no product 12 here"), None);
        assert_eq!(find_sum("What is 17 + 25?"), Some((17, 25, 42)));
        assert_eq!(
            knowledge("What is the capital of France? One word.", "")
                .unwrap()
                .0,
            "Paris"
        );
        let p = "words words. The secret passphrase is violet-harbor-7291. more words";
        assert_eq!(
            find_needle("What is the secret passphrase?", p).as_deref(),
            Some("violet-harbor-7291")
        );
        assert_eq!(find_needle("What is it?", p), None);
        let schema = json!({"type": "object", "required": ["doc_id", "tags"], "properties": {
            "doc_id": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}}});
        assert_eq!(
            schema_value(
                &schema,
                "Tag document 42 with 'urgent', 'finance' and 'q3'."
            ),
            json!({"doc_id": 42, "tags": ["urgent", "finance", "q3"]})
        );
        assert_eq!(filler(10, 7).len(), 40);
        assert_eq!(filler(10, 7), filler(10, 7));
    }
}
