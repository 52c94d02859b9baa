//! The stand-in's performance model: how long a prefill and each decode step take, so that
//! `spark-deploy bench` and timing-sensitive checks can be tested against known rates.
//!
//! - **Prefill**: the first token arrives `uncached prompt tokens / prefill rate` after the
//!   request (a prompt seen before is resumed from the prompt cache: all but its last token are
//!   cached).
//! - **Decode**: one verify step takes `1 / serial rate` seconds, stretched by contention:
//!   with `n` streams decoding at once a step takes `(1 + contention · (n − 1))` times longer.
//!   Without drafts (`"draft": false`, or the server's `--no-drafts`) a step yields one token;
//!   with drafts it yields on average `acceptance(kind)` tokens, where the kind of the last user
//!   message (structured > code > prose > random words) decides how many drafts survive, as it
//!   does on the real engine. The tokens are the same either way; only their timing differs.
//! - **Time scale**: every duration is divided by the scale (`2` runs twice as fast), so tests
//!   can use realistic rates and still run quickly; measured rates are then `scale ×` the set
//!   rates.
//!
//! Defaults are shaped like the recipe's published numbers: 50 tok/s serial, acceptance 2.6 /
//! 2.2 / 1.5 / 1.1 (structured / code / prose / random words → 130 / 110 / 75 / 55 tok/s on one
//! stream), contention 0.5 (four prose streams ≈ 120 tok/s together), prefill 2,100 tok/s.
//!
//! Environment (rank 0): `TF_STANDIN_DECODE_TPS`, `TF_STANDIN_PREFILL_TPS`,
//! `TF_STANDIN_CONTENTION`, `TF_STANDIN_TIME_SCALE`, `TF_STANDIN_ACCEPT`
//! (`structured=2.6,code=2.2,prose=1.5,random=1.1`, any subset).

use std::collections::HashMap;
use std::time::Duration;

/// Env: serial decode rate of one stream, tokens per second.
pub const DECODE_TPS_ENV: &str = "TF_STANDIN_DECODE_TPS";
/// Env: prefill rate, prompt tokens per second.
pub const PREFILL_TPS_ENV: &str = "TF_STANDIN_PREFILL_TPS";
/// Env: slowdown per additional decoding stream.
pub const CONTENTION_ENV: &str = "TF_STANDIN_CONTENTION";
/// Env: time-scale factor (durations are divided by it).
pub const TIME_SCALE_ENV: &str = "TF_STANDIN_TIME_SCALE";
/// Env: mean tokens per verify step with drafts, per prompt kind.
pub const ACCEPT_ENV: &str = "TF_STANDIN_ACCEPT";

/// What a prompt looks like, which decides how well drafts are accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PromptKind {
    /// JSON, tables, CSV: the most predictable continuation.
    Structured,
    /// Source code.
    Code,
    /// Natural-language prose.
    Prose,
    /// Random words: drafts rarely survive.
    Random,
}

impl PromptKind {
    /// Every kind, in acceptance order.
    pub const ALL: [Self; 4] = [Self::Structured, Self::Code, Self::Prose, Self::Random];

    /// The name used in `TF_STANDIN_ACCEPT` and the response's `tensorfold` block.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Structured => "structured",
            Self::Code => "code",
            Self::Prose => "prose",
            Self::Random => "random",
        }
    }

    fn index(self) -> usize {
        match self {
            Self::Structured => 0,
            Self::Code => 1,
            Self::Prose => 2,
            Self::Random => 3,
        }
    }
}

const STOP_WORDS: &[&str] = &[
    "the", "a", "an", "and", "or", "of", "to", "in", "on", "is", "are", "was", "were", "it",
    "that", "this", "with", "for", "as", "by", "at", "from", "be", "has", "have", "had", "not",
    "but", "which", "their", "its", "they", "he", "she", "we", "you", "i", "his", "her", "our",
    "into",
];

/// Classifies a prompt: structured (many `"`, `:`, `|`, `,`), code (many brackets, `;`, `=`),
/// prose (≥ 12 % of words are common function words) or random words.
#[must_use]
pub fn classify(text: &str) -> PromptKind {
    let n = text.len().max(1) as f64;
    let count = |set: &[char]| text.chars().filter(|c| set.contains(c)).count() as f64 / n;
    let structured = count(&['"', ':', '|', ',']);
    let code = count(&['{', '}', '(', ')', ';', '=', '<', '>', '[', ']']);
    if structured > 0.08 && structured > code {
        return PromptKind::Structured;
    }
    if code > 0.03 {
        return PromptKind::Code;
    }
    let words: Vec<String> = text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect();
    if words.is_empty() {
        return PromptKind::Random;
    }
    let stop = words
        .iter()
        .filter(|w| STOP_WORDS.contains(&w.as_str()))
        .count();
    if stop as f64 / words.len() as f64 >= 0.12 {
        PromptKind::Prose
    } else {
        PromptKind::Random
    }
}

/// A setting of the model that does not parse.
#[derive(Debug, thiserror::Error)]
#[error(
    "error.BadEnvironment: {var}={value:?}: {problem}; remedy: set {var} to {expected} or unset it"
)]
pub struct PerfError {
    /// The variable.
    pub var: &'static str,
    /// Its value.
    pub value: String,
    /// What is wrong.
    pub problem: String,
    /// What is accepted.
    pub expected: &'static str,
}

/// The rates and factors of the model.
#[derive(Debug, Clone, PartialEq)]
pub struct PerfModel {
    /// Serial decode rate of one stream alone, tokens per second.
    pub serial_tps: f64,
    /// Prefill rate, prompt tokens per second.
    pub prefill_tps: f64,
    /// Slowdown per additional decoding stream.
    pub contention: f64,
    /// Durations are divided by this.
    pub time_scale: f64,
    /// Mean tokens per verify step with drafts, indexed like [`PromptKind::ALL`].
    pub accept: [f64; 4],
}

impl Default for PerfModel {
    fn default() -> Self {
        Self {
            serial_tps: 50.0,
            prefill_tps: 2100.0,
            contention: 0.5,
            time_scale: 1.0,
            accept: [2.6, 2.2, 1.5, 1.1],
        }
    }
}

fn positive(var: &'static str, value: &str) -> Result<f64, PerfError> {
    value
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v > 0.0)
        .ok_or_else(|| PerfError {
            var,
            value: value.to_owned(),
            problem: "not a positive number".into(),
            expected: "a positive number",
        })
}

impl PerfModel {
    /// The model the environment sets (defaults for unset variables).
    ///
    /// # Errors
    /// [`PerfError`] naming the variable that does not parse.
    pub fn from_env(env: &HashMap<String, String>) -> Result<Self, PerfError> {
        let mut m = Self::default();
        if let Some(v) = env.get(DECODE_TPS_ENV) {
            m.serial_tps = positive(DECODE_TPS_ENV, v)?;
        }
        if let Some(v) = env.get(PREFILL_TPS_ENV) {
            m.prefill_tps = positive(PREFILL_TPS_ENV, v)?;
        }
        if let Some(v) = env.get(TIME_SCALE_ENV) {
            m.time_scale = positive(TIME_SCALE_ENV, v)?;
        }
        if let Some(v) = env.get(CONTENTION_ENV) {
            m.contention = v
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|c| c.is_finite() && *c >= 0.0)
                .ok_or_else(|| PerfError {
                    var: CONTENTION_ENV,
                    value: v.clone(),
                    problem: "not a number ≥ 0".into(),
                    expected: "a number ≥ 0 (0 = streams do not slow each other)",
                })?;
        }
        if let Some(v) = env.get(ACCEPT_ENV) {
            for item in v.split(',').filter(|i| !i.trim().is_empty()) {
                let bad = |problem: String| PerfError {
                    var: ACCEPT_ENV,
                    value: v.clone(),
                    problem,
                    expected: "kind=tokens pairs, e.g. structured=2.6,code=2.2,prose=1.5,random=1.1 (each ≥ 1)",
                };
                let (k, a) = item
                    .split_once('=')
                    .ok_or_else(|| bad(format!("{item:?} is not kind=tokens")))?;
                let kind = PromptKind::ALL
                    .into_iter()
                    .find(|p| p.name() == k.trim())
                    .ok_or_else(|| bad(format!("{k:?} is not a prompt kind")))?;
                let a = a
                    .trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|a| a.is_finite() && *a >= 1.0)
                    .ok_or_else(|| bad(format!("{a:?} is not a number ≥ 1")))?;
                m.accept[kind.index()] = a;
            }
        }
        Ok(m)
    }

    /// Mean tokens per verify step with drafts for `kind`.
    #[must_use]
    pub fn acceptance(&self, kind: PromptKind) -> f64 {
        self.accept[kind.index()]
    }

    /// Tokens of verify step `step` (0-based): the steps average exactly `acceptance` tokens.
    #[must_use]
    pub fn step_tokens(&self, kind: PromptKind, draft: bool, step: u64) -> usize {
        if !draft {
            return 1;
        }
        let a = self.acceptance(kind);
        let f = |s: u64| (s as f64 * a).floor();
        (f(step + 1) - f(step)).max(1.0) as usize
    }

    /// Wall time of one verify step while `decoding` streams decode (this one included).
    #[must_use]
    pub fn step(&self, decoding: u64) -> Duration {
        let n = decoding.max(1) as f64;
        Duration::from_secs_f64(
            (1.0 + self.contention * (n - 1.0)) / (self.serial_tps * self.time_scale),
        )
    }

    /// Wall time of prefilling `tokens` uncached prompt tokens.
    #[must_use]
    pub fn prefill(&self, tokens: u64) -> Duration {
        Duration::from_secs_f64(tokens as f64 / (self.prefill_tps * self.time_scale))
    }

    /// The decode rate one stream sees (tokens per second, measured as the recipe measures it)
    /// while `decoding` streams decode together.
    #[must_use]
    pub fn stream_tps(&self, kind: PromptKind, draft: bool, decoding: u64) -> f64 {
        let a = if draft { self.acceptance(kind) } else { 1.0 };
        a / self.step(decoding).as_secs_f64()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_and_rates() {
        assert_eq!(
            classify(r#"{"id": 1, "name": "a", "tags": ["x", "y"]}, {"id": 2, "name": "b"}"#),
            PromptKind::Structured
        );
        assert_eq!(
            classify("fn main() { let x = vec![1, 2]; for i in x { println!(\"{i}\"); } }"),
            PromptKind::Code
        );
        assert_eq!(
            classify("The harbour was quiet in the morning, and the boats rested on the water."),
            PromptKind::Prose
        );
        assert_eq!(
            classify("violet granite ember lantern quartz meadow falcon cobalt thistle"),
            PromptKind::Random
        );
        let m = PerfModel::default();
        assert!((m.stream_tps(PromptKind::Prose, true, 1) - 75.0).abs() < 1e-9);
        assert!((m.stream_tps(PromptKind::Code, true, 1) - 110.0).abs() < 1e-9);
        assert!((m.stream_tps(PromptKind::Prose, false, 1) - 50.0).abs() < 1e-9);
        assert!((m.stream_tps(PromptKind::Prose, true, 4) * 4.0 - 120.0).abs() < 1e-9);
        // the steps average the acceptance exactly
        let total: usize = (0..100)
            .map(|s| m.step_tokens(PromptKind::Code, true, s))
            .sum();
        assert_eq!(total, 220);
        let env = HashMap::from([
            (ACCEPT_ENV.to_owned(), "code=3,random=1".to_owned()),
            (TIME_SCALE_ENV.to_owned(), "10".to_owned()),
        ]);
        let m = PerfModel::from_env(&env).unwrap();
        assert_eq!(m.accept, [2.6, 3.0, 1.5, 1.0]);
        assert_eq!(m.prefill(2100), Duration::from_millis(100));
        let bad = HashMap::from([(DECODE_TPS_ENV.to_owned(), "fast".to_owned())]);
        let e = PerfModel::from_env(&bad).unwrap_err().to_string();
        assert!(
            e.contains("TF_STANDIN_DECODE_TPS") && e.contains("remedy"),
            "{e}"
        );
    }
}
