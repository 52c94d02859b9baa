//! Fault modes of the stand-in's API, so that every check of `spark-deploy validate` can be shown
//! to fail when the engine misbehaves in that way.
//!
//! `TF_STANDIN_FAULT` on rank 0: a comma list of
//!
//! | fault | what the API then does |
//! |---|---|
//! | `wrong_answer` | answers every question with its fixed sentence |
//! | `thinking_leak` | thinks even when told not to, and puts the thinking into `content` (with `</think>`) instead of `reasoning_content` |
//! | `no_tool_call` | ignores the offered tools and answers in text |
//! | `tool_args_string` | sends array arguments as a JSON string (`"[\"a\"]"`) instead of an array |
//! | `no_json_schema` | refuses `response_format` with 400 (an engine without schema support) |
//! | `bad_json_schema` | answers a `response_format` request with text that is not JSON |
//! | `tokenize_mismatch` | `/tokenize` reports a `count` different from its token list |
//! | `bad_image` | answers a request with images with empty content |
//! | `lost_needle` | does not find the passphrase in a long prompt |
//! | `draft_mismatch` | with drafts on, one token differs from the serial path's |
//! | `wedge` | `/health` stays ok, `/metrics` counters freeze, every chat request hangs (a wedged pair) |
//! | `crash_loop` | rank 1 exits [`CRASH_AFTER`] after it starts following (given to both ranks through `engine.env`, every launch crashes again) |
//! | `follower_exits` | rank 1 exits at once (code 2, before it loads anything), like an engine given an argument it refuses (through `engine.env`) |
//!
//! Rank 0 also reads [`FAULT_FILE`] (a comma list in the same form, absent = none) while it
//! serves, so a test turns a fault on at runtime by copying that file into the container
//! (`docker cp`), with no shell in the image.

use std::collections::HashMap;

/// Env: the fault modes.
pub const FAULT_ENV: &str = "TF_STANDIN_FAULT";

/// The file inside rank 0's container naming faults turned on at runtime.
pub const FAULT_FILE: &str = "/tmp/tf-standin-fault";

/// How long rank 1 follows in `crash_loop` mode before it exits.
pub const CRASH_AFTER: std::time::Duration = std::time::Duration::from_secs(8);

/// One fault mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Fixed sentence for every question.
    WrongAnswer,
    /// Thinking in `content`, also when off.
    ThinkingLeak,
    /// Tools ignored.
    NoToolCall,
    /// Arrays as JSON strings.
    ToolArgsString,
    /// `response_format` refused with 400.
    NoJsonSchema,
    /// `response_format` answered with non-JSON.
    BadJsonSchema,
    /// `/tokenize` count ≠ its tokens.
    TokenizeMismatch,
    /// Empty answer to images.
    BadImage,
    /// The needle is not found.
    LostNeedle,
    /// Drafted tokens differ from serial ones.
    DraftMismatch,
    /// Health ok, counters frozen, requests hang.
    Wedge,
    /// Rank 1 exits soon after every start.
    CrashLoop,
    /// Rank 1 exits at once.
    FollowerExits,
}

impl Fault {
    /// Every fault mode.
    pub const ALL: [Self; 13] = [
        Self::WrongAnswer,
        Self::ThinkingLeak,
        Self::NoToolCall,
        Self::ToolArgsString,
        Self::NoJsonSchema,
        Self::BadJsonSchema,
        Self::TokenizeMismatch,
        Self::BadImage,
        Self::LostNeedle,
        Self::DraftMismatch,
        Self::Wedge,
        Self::CrashLoop,
        Self::FollowerExits,
    ];

    /// The name in `TF_STANDIN_FAULT`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::WrongAnswer => "wrong_answer",
            Self::ThinkingLeak => "thinking_leak",
            Self::NoToolCall => "no_tool_call",
            Self::ToolArgsString => "tool_args_string",
            Self::NoJsonSchema => "no_json_schema",
            Self::BadJsonSchema => "bad_json_schema",
            Self::TokenizeMismatch => "tokenize_mismatch",
            Self::BadImage => "bad_image",
            Self::LostNeedle => "lost_needle",
            Self::DraftMismatch => "draft_mismatch",
            Self::Wedge => "wedge",
            Self::CrashLoop => "crash_loop",
            Self::FollowerExits => "follower_exits",
        }
    }
}

/// An unknown fault name.
#[derive(Debug, thiserror::Error)]
#[error(
    "error.BadEnvironment: {FAULT_ENV} names {name:?}, which is no fault mode; remedy: use a comma list of {}",
    Fault::ALL.map(Fault::name).join(", ")
)]
pub struct FaultError {
    /// The unknown name.
    pub name: String,
}

/// The fault modes in effect.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Faults(Vec<Fault>);

impl Faults {
    /// The faults `TF_STANDIN_FAULT` names (none when unset).
    ///
    /// # Errors
    /// [`FaultError`] for an unknown name.
    pub fn from_env(env: &HashMap<String, String>) -> Result<Self, FaultError> {
        Self::parse(env.get(FAULT_ENV).map(String::as_str).unwrap_or_default())
    }

    /// The faults of a comma list.
    ///
    /// # Errors
    /// [`FaultError`] for an unknown name.
    pub fn parse(list: &str) -> Result<Self, FaultError> {
        let mut out = Vec::new();
        for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let f = Fault::ALL
                .into_iter()
                .find(|f| f.name() == name)
                .ok_or_else(|| FaultError {
                    name: name.to_owned(),
                })?;
            out.push(f);
        }
        Ok(Self(out))
    }

    /// These faults.
    #[must_use]
    pub fn of(faults: &[Fault]) -> Self {
        Self(faults.to_vec())
    }

    /// Whether `f` is in effect.
    #[must_use]
    pub fn has(&self, f: Fault) -> bool {
        self.0.contains(&f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_comma_lists_and_refuses_unknown_names() {
        let env = HashMap::from([(FAULT_ENV.to_owned(), "lost_needle, bad_image".to_owned())]);
        let f = Faults::from_env(&env).unwrap();
        assert!(f.has(Fault::LostNeedle) && f.has(Fault::BadImage));
        assert!(!f.has(Fault::DraftMismatch));
        assert_eq!(
            Faults::from_env(&HashMap::new()).unwrap(),
            Faults::default()
        );
        let env = HashMap::from([(FAULT_ENV.to_owned(), "slow".to_owned())]);
        let e = Faults::from_env(&env).unwrap_err().to_string();
        assert!(
            e.contains("\"slow\"") && e.contains("draft_mismatch"),
            "{e}"
        );
    }
}
