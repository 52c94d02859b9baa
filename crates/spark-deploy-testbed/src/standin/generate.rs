//! A reply as tokens, and its timed generation under the [`PerfModel`].
//!
//! A token is four bytes of the reply's text (cut at character boundaries), the same
//! approximation the prompt count uses. The first token comes out of the prefill; each later
//! verify step yields one token (serial) or [`PerfModel::step_tokens`] tokens (drafts), and is
//! emitted as one chunk when its deadline comes. Deadlines are absolute, so rounding in the
//! timer does not accumulate.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use sha2::{Digest, Sha256};

use super::perf::{PerfModel, PromptKind};

/// One token of a reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Part of `reasoning_content`.
    Reasoning(String),
    /// Part of `content`.
    Content(String),
    /// Part of the tool call's name.
    ToolName(String),
    /// Part of the tool call's arguments.
    ToolArgs(String),
}

impl Piece {
    fn tag_and_text(&self) -> (u8, &str) {
        match self {
            Self::Reasoning(s) => (b'r', s),
            Self::Content(s) => (b'c', s),
            Self::ToolName(s) => (b'n', s),
            Self::ToolArgs(s) => (b'a', s),
        }
    }
}

/// `s` in tokens of at most four bytes.
#[must_use]
pub fn split4(s: &str) -> Vec<String> {
    let mut out = Vec::with_capacity(s.len() / 4 + 1);
    let mut start = 0;
    while start < s.len() {
        let mut end = (start + 4).min(s.len());
        while !s.is_char_boundary(end) {
            end += 1;
        }
        out.push(s[start..end].to_owned());
        start = end;
    }
    out
}

/// The tokens of a reply: reasoning, then content, then the tool call.
#[must_use]
pub fn pieces(
    reasoning: Option<&str>,
    content: Option<&str>,
    tool: Option<(&str, &str)>,
) -> Vec<Piece> {
    let mut out: Vec<Piece> = reasoning
        .map(split4)
        .unwrap_or_default()
        .into_iter()
        .map(Piece::Reasoning)
        .collect();
    out.extend(
        content
            .map(split4)
            .unwrap_or_default()
            .into_iter()
            .map(Piece::Content),
    );
    if let Some((name, args)) = tool {
        out.extend(split4(name).into_iter().map(Piece::ToolName));
        out.extend(split4(args).into_iter().map(Piece::ToolArgs));
    }
    out
}

/// The hash of a token sequence: equal replies have equal hashes, whatever path made them.
#[must_use]
pub fn token_sha(pieces: &[Piece]) -> String {
    let mut h = Sha256::new();
    for p in pieces {
        let (tag, text) = p.tag_and_text();
        h.update([tag]);
        h.update((text.len() as u32).to_le_bytes());
        h.update(text.as_bytes());
    }
    hex::encode(h.finalize())
}

/// Concatenated text of the pieces `pick` selects.
#[must_use]
pub fn text(pieces: &[Piece], pick: fn(&Piece) -> Option<&str>) -> String {
    pieces.iter().filter_map(pick).collect()
}

/// What the timed generation measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    /// Seconds from the request to the first token.
    pub prefill_s: f64,
    /// Draft tokens proposed (5 per verify step with drafts).
    pub drafted: u64,
    /// Draft tokens accepted.
    pub accepted: u64,
}

/// Counts a stream as decoding while it lives.
struct Decoding<'a>(&'a AtomicU64);

impl<'a> Decoding<'a> {
    fn enter(c: &'a AtomicU64) -> Self {
        c.fetch_add(1, Ordering::SeqCst);
        Self(c)
    }
}

impl Drop for Decoding<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What one generation runs with.
#[derive(Debug, Clone, Copy)]
pub struct Run<'a> {
    /// The model.
    pub perf: &'a PerfModel,
    /// Streams decoding now (shared by every request).
    pub decoding: &'a AtomicU64,
    /// Prompt tokens to prefill (not resumed from the cache).
    pub uncached: u64,
    /// Kind of the prompt.
    pub kind: PromptKind,
    /// Drafts on.
    pub draft: bool,
    /// When the request arrived: the prefill counts from here, so the server's own handling of
    /// the request is part of the modelled TTFT, not added to it. Tokio's clock, so a test can
    /// pause it and check the timing exactly.
    pub arrived: Instant,
}

/// Generates `pieces` in time: sleeps through the prefill, then calls `emit` once per verify
/// step with that step's tokens. Returns `None` when `emit` returns false (the client left).
pub async fn run(
    r: Run<'_>,
    pieces: &[Piece],
    mut emit: impl FnMut(&[Piece]) -> bool,
) -> Option<Timing> {
    tokio::time::sleep_until(r.arrived + r.perf.prefill(r.uncached)).await;
    let prefill_s = r.arrived.elapsed().as_secs_f64();
    let mut t = Timing {
        prefill_s,
        drafted: 0,
        accepted: 0,
    };
    if pieces.is_empty() {
        return Some(t);
    }
    if !emit(&pieces[..1]) {
        return None;
    }
    let _decoding = Decoding::enter(r.decoding);
    let mut at = Instant::now();
    let (mut i, mut step) = (1, 0u64);
    while i < pieces.len() {
        let k = r
            .perf
            .step_tokens(r.kind, r.draft, step)
            .min(pieces.len() - i);
        at += r.perf.step(r.decoding.load(Ordering::SeqCst));
        let now = Instant::now();
        if at > now {
            tokio::time::sleep(at - now).await;
        } else if now - at > Duration::from_millis(50) {
            // far behind (a stalled runtime): do not burst the backlog
            at = now;
        }
        if !emit(&pieces[i..i + k]) {
            return None;
        }
        if r.draft {
            t.drafted += 5;
            t.accepted += (k - 1) as u64;
        }
        i += k;
        step += 1;
    }
    Some(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_and_hashes() {
        assert_eq!(split4("abcdefghi"), ["abcd", "efgh", "i"]);
        assert_eq!(split4("ab×cd").concat(), "ab×cd");
        let p = pieces(Some("think"), Some("391"), None);
        assert_eq!(p.len(), 3);
        assert_eq!(
            text(&p, |p| match p {
                Piece::Content(s) => Some(s),
                _ => None,
            }),
            "391"
        );
        let q = pieces(Some("think"), Some("392"), None);
        assert_ne!(token_sha(&p), token_sha(&q));
        assert_eq!(
            token_sha(&p),
            token_sha(&pieces(Some("think"), Some("391"), None))
        );
    }

    // On tokio's paused clock: every sleep ends exactly at its deadline, so the figures below
    // are the model's own, whatever else the machine is doing (the wall clock made this test
    // fail under a loaded CI run).
    #[tokio::test(start_paused = true)]
    async fn timed_generation_follows_the_model() {
        let perf = PerfModel {
            serial_tps: 1000.0,
            prefill_tps: 10_000.0,
            contention: 0.0,
            time_scale: 1.0,
            accept: [1.0, 2.0, 1.0, 1.0],
        };
        let decoding = AtomicU64::new(0);
        let p = pieces(None, Some(&"x".repeat(4 * 201)), None);
        let mut times = Vec::new();
        let t = run(
            Run {
                perf: &perf,
                decoding: &decoding,
                uncached: 1000,
                kind: PromptKind::Code,
                draft: true,
                arrived: Instant::now(),
            },
            &p,
            |chunk| {
                times.push((Instant::now(), chunk.len()));
                true
            },
        )
        .await
        .unwrap();
        assert!((t.prefill_s - 0.1).abs() < 1e-3, "{t:?}");
        // 200 tokens after the first in 100 steps of 1 ms
        let span = times.last().unwrap().0 - times[0].0;
        let rate = 200.0 / span.as_secs_f64();
        assert!((rate - 2000.0).abs() / 2000.0 < 0.01, "{rate}");
        // one chunk per verify step: the first token, then 100 steps of two
        assert_eq!(times.len(), 101);
        assert_eq!(t.drafted, 500);
        assert_eq!(t.accepted, 100);
        assert_eq!(times.iter().map(|t| t.1).sum::<usize>(), 201);
        assert_eq!(decoding.load(Ordering::SeqCst), 0);
    }
}
