//! `validate`: proves what a deployment serves, through its API only (docs/validate-and-bench.md).
//!
//! Checks, in order: `text`, `thinking_on`, `thinking_off`, `tool_call`, `tool_array`,
//! `json_schema`, `tokenizer`, `image`, `needle`, `exactness`. Each yields a [`Verdict`] with its
//! wall time and a one-line detail; `json_schema` answered with 400 is `unsupported`, not a
//! failure. Events carry `Source::Command("validate")`.

mod checks;
pub mod images;
mod reply;

pub use checks::needle_prompt;

use std::time::Instant;

use crate::api::{Api, ApiError};
use crate::event::{Event, EventSink, Level, Source};
use serde::Serialize;

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
            Check::Text => checks::text(api).await,
            Check::ThinkingOn => checks::thinking(api, true).await,
            Check::ThinkingOff => checks::thinking(api, false).await,
            Check::ToolCall => checks::tool_call(api).await,
            Check::ToolArray => checks::tool_array(api).await,
            Check::JsonSchema => checks::json_schema(api).await,
            Check::Tokenizer => checks::tokenizer(api).await,
            Check::Image => checks::image(api).await,
            Check::Needle => checks::needle(api, needle_tokens).await,
            Check::Exactness => checks::exactness(api).await,
        };
        let (verdict, detail) = r.unwrap_or_else(|e| reply::fail(e.to_string()));
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
        assert_eq!(checks::base64_png::encode(b"Man"), "TWFu");
        assert_eq!(checks::base64_png::encode(b"Ma"), "TWE=");
    }
}
