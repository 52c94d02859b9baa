//! `bench`: decode and prefill rates measured through the API, by the method
//! docs/validate-and-bench.md describes:
//!
//! - **decode** (one stream) = (completion tokens − 1) / (last token chunk − first token
//!   chunk), tokens from `usage` (`stream_options.include_usage`), never from chunk counts;
//! - **aggregate** (N streams released together) = completion tokens of all streams /
//!   (latest end − earliest start);
//! - **prefill** = prompt tokens / TTFT for a cold prompt (never sent before, unique first
//!   words) with `max_tokens` 1;
//! - greedy, thinking off, `ignore_eos`, one warm-up request, the median of `reps`
//!   repetitions (each a fresh set of varied prompts).
//!
//! Events carry `Source::Command("bench")`.

pub mod chart;
pub mod prompts;
pub mod report;

use std::time::Instant;

use serde::Serialize;
use serde_json::json;

use crate::api::{Api, ApiError, Streamed};
use crate::event::{Event, EventSink, Level, Source};

pub use prompts::Kind;

/// What to measure.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// Prompt kinds.
    pub kinds: Vec<Kind>,
    /// Concurrent stream counts (capped by `serving.parallel`).
    pub streams: Vec<u32>,
    /// Completion tokens per request.
    pub max_tokens: u64,
    /// Repetitions (median reported).
    pub reps: u32,
    /// Prefill prompt lengths in tokens (those that do not fit the pool are left out).
    pub prefill: Vec<u64>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            kinds: Kind::ALL.to_vec(),
            streams: vec![1, 2, 4],
            max_tokens: 256,
            reps: 3,
            prefill: vec![8192, 16384, 32768, 65536, 131_072, 262_144],
        }
    }
}

/// Mean, standard deviation, median and the values.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Stat {
    /// Mean.
    pub mean: f64,
    /// Population standard deviation.
    pub std: f64,
    /// Median.
    pub median: f64,
    /// The values.
    pub values: Vec<f64>,
}

impl Stat {
    /// The statistics of `values` (all zero when empty).
    #[must_use]
    pub fn of(values: Vec<f64>) -> Self {
        if values.is_empty() {
            return Self {
                mean: 0.0,
                std: 0.0,
                median: 0.0,
                values,
            };
        }
        let n = values.len() as f64;
        let mean = values.iter().sum::<f64>() / n;
        let std = (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n).sqrt();
        let mut s = values.clone();
        s.sort_by(f64::total_cmp);
        let m = s.len() / 2;
        let median = if s.len() % 2 == 1 {
            s[m]
        } else {
            f64::midpoint(s[m - 1], s[m])
        };
        Self {
            mean,
            std,
            median,
            values,
        }
    }
}

/// One decode row: a prompt kind at N streams.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DecodeRow {
    /// Prompt kind.
    pub kind: Kind,
    /// Concurrent streams.
    pub streams: u32,
    /// Per-stream decode tok/s: one value per stream per repetition.
    pub per_stream: Stat,
    /// Aggregate tok/s: one value per repetition.
    pub aggregate: Stat,
    /// Time to first token, seconds, per stream per repetition.
    pub ttft_s: Stat,
    /// Completion tokens per request (from usage).
    pub completion_tokens: u64,
    /// Mean prompt tokens per request.
    pub prompt_tokens: u64,
}

/// One prefill row.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PrefillRow {
    /// Asked length, tokens.
    pub length: u64,
    /// Prompt tokens the engine counted (median).
    pub prompt_tokens: u64,
    /// Prefill tok/s per repetition.
    pub rate: Stat,
    /// TTFT seconds per repetition.
    pub ttft_s: Stat,
    /// Cached tokens the engine reported (should be 0: the prompts are cold).
    pub cached_tokens: u64,
}

/// Everything measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Results {
    /// The API measured.
    pub base_url: String,
    /// The served model.
    pub model: String,
    /// Unix seconds at the start.
    pub at_unix: u64,
    /// Wall time of the whole run, seconds.
    pub wall_s: f64,
    /// Decode rows.
    pub decode: Vec<DecodeRow>,
    /// Prefill rows.
    pub prefill: Vec<PrefillRow>,
    /// Prefill lengths left out because they do not fit the pool.
    pub prefill_skipped: Vec<u64>,
}

/// Errors of `bench`.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A request failed.
    #[error(transparent)]
    Api(#[from] ApiError),
    /// The engine answered a benchmark request with an error.
    #[error("{what}: {detail}; remedy: run `spark-deploy validate` to see which route misbehaves")]
    Request {
        /// Which request.
        what: String,
        /// The error.
        detail: String,
    },
    /// A reply without `usage` (the method needs the engine's token counts).
    #[error(
        "{what}: the stream carried no usage (stream_options.include_usage); remedy: bench needs an engine that reports usage on streams"
    )]
    NoUsage {
        /// Which request.
        what: String,
    },
    /// Stopped by the caller.
    #[error("cancelled")]
    Cancelled,
}

fn check(s: &Streamed, what: &str) -> Result<(), BenchError> {
    if s.status != 200 || s.error.is_some() {
        return Err(BenchError::Request {
            what: what.to_owned(),
            detail: format!("HTTP {}: {}", s.status, s.error.clone().unwrap_or_default()),
        });
    }
    if s.usage.is_none() {
        return Err(BenchError::NoUsage {
            what: what.to_owned(),
        });
    }
    Ok(())
}

fn body(prompt: String, max_tokens: u64) -> serde_json::Value {
    json!({"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
           "temperature": 0, "reasoning_effort": "none", "ignore_eos": true})
}

/// Per-stream decode rate of one stream, by the method.
#[must_use]
pub fn decode_rate(s: &Streamed) -> Option<f64> {
    let n = s.completion_tokens()?;
    let span = s
        .last_token?
        .checked_duration_since(s.first_token?)?
        .as_secs_f64();
    (n > 1 && span > 0.0).then(|| (n - 1) as f64 / span)
}

async fn one_rep(
    api: &Api,
    kind: Kind,
    streams: u32,
    max_tokens: u64,
    tag: &str,
) -> Result<Vec<Streamed>, BenchError> {
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(streams as usize));
    let futs = (0..streams).map(|i| {
        let b = barrier.clone();
        let prompt = prompts::prompt(kind, i as usize, &format!("{tag}-{i}"));
        async move {
            b.wait().await;
            api.stream_chat(body(prompt, max_tokens)).await
        }
    });
    let out = futures::future::join_all(futs).await;
    let mut v = Vec::new();
    for s in out {
        let s = s?;
        check(&s, &format!("{} × {streams}", kind.name()))?;
        v.push(s);
    }
    Ok(v)
}

/// Calibrates bytes per token with `/tokenize` (4.5 when the route is missing).
async fn bytes_per_token(api: &Api) -> f64 {
    let sample = prompts::filler(20_000, 7);
    match api
        .post("/tokenize", &json!({"model": api.model, "prompt": sample}))
        .await
    {
        Ok(r) if r.status == 200 => r.json()["count"]
            .as_f64()
            .filter(|c| *c > 0.0)
            .map_or(4.5, |c| sample.len() as f64 / c),
        _ => 4.5,
    }
}

/// Runs the benchmark. `cancel` is polled between requests; a cancelled run returns what was
/// measured so far.
///
/// # Errors
/// [`BenchError`] when a request fails or carries no usage.
pub async fn run(
    api: &Api,
    opts: &Options,
    events: &dyn EventSink,
    cancel: &dyn Fn() -> bool,
) -> Result<Results, BenchError> {
    let source = || Source::Command("bench".into());
    let log = |line: String| {
        events.emit(Event::Log {
            source: source(),
            node: None,
            level: Level::Info,
            line,
        });
    };
    let start = Instant::now();
    let at_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let nonce = at_unix.wrapping_mul(1_000_003) ^ u64::from(std::process::id());
    events.emit(Event::Started {
        source: source(),
        message: format!("bench against {} ({})", api.base_url, api.model),
    });
    // warm-up
    let w = api
        .stream_chat(body(
            prompts::prompt(Kind::Prose, 0, &format!("warm-up {nonce:x}")),
            32,
        ))
        .await?;
    check(&w, "warm-up")?;
    let streams: Vec<u32> = opts
        .streams
        .iter()
        .copied()
        .filter(|n| *n >= 1 && *n <= api.parallel.max(1))
        .collect();
    let dropped: Vec<u32> = opts
        .streams
        .iter()
        .copied()
        .filter(|n| !streams.contains(n))
        .collect();
    if !dropped.is_empty() {
        log(format!(
            "stream counts {dropped:?} left out: serving.parallel is {}",
            api.parallel
        ));
    }
    let mut results = Results {
        base_url: api.base_url.clone(),
        model: api.model.clone(),
        at_unix,
        wall_s: 0.0,
        decode: Vec::new(),
        prefill: Vec::new(),
        prefill_skipped: Vec::new(),
    };
    'decode: for &kind in &opts.kinds {
        for &n in &streams {
            let (mut per, mut agg, mut ttft) = (Vec::new(), Vec::new(), Vec::new());
            let (mut completion, mut prompt) = (0, 0);
            for rep in 0..opts.reps.max(1) {
                if cancel() {
                    break 'decode;
                }
                let tag = format!("{nonce:x}-{}-{n}-{rep}", kind.name());
                let ss = one_rep(api, kind, n, opts.max_tokens, &tag).await?;
                let total: u64 = ss.iter().filter_map(Streamed::completion_tokens).sum();
                let first = ss.iter().map(|s| s.start).min();
                let last = ss.iter().map(|s| s.end).max();
                if let (Some(a), Some(b)) = (first, last) {
                    agg.push(total as f64 / (b - a).as_secs_f64());
                }
                for s in &ss {
                    per.extend(decode_rate(s));
                    ttft.extend(s.first_token.map(|t| (t - s.start).as_secs_f64()));
                    completion = s.completion_tokens().unwrap_or(0);
                    prompt = s.prompt_tokens().unwrap_or(0);
                }
            }
            let row = DecodeRow {
                kind,
                streams: n,
                per_stream: Stat::of(per),
                aggregate: Stat::of(agg),
                ttft_s: Stat::of(ttft),
                completion_tokens: completion,
                prompt_tokens: prompt,
            };
            log(format!(
                "{} × {n}: {:.1} tok/s per stream, {:.1} tok/s aggregate",
                kind.name(),
                row.per_stream.median,
                row.aggregate.median
            ));
            results.decode.push(row);
        }
    }
    if !opts.prefill.is_empty() && !cancel() {
        let bpt = bytes_per_token(api).await;
        for &len in &opts.prefill {
            // alignUp(prompt + 1 + 18, 2048) must fit, with 5 % slack for the estimate
            if (len as f64 * 1.05) as u64 + 2048 + 19 > api.pool {
                results.prefill_skipped.push(len);
                continue;
            }
            let (mut rate, mut ttft, mut toks, mut cached) =
                (Vec::new(), Vec::new(), Vec::new(), 0);
            for rep in 0..opts.reps.max(1) {
                if cancel() {
                    break;
                }
                let text = prompts::filler(
                    (len as f64 * bpt) as usize,
                    nonce ^ (len << 8) ^ u64::from(rep),
                );
                let s = api.stream_chat(body(text, 1)).await?;
                check(&s, &format!("prefill {len}"))?;
                let (Some(p), Some(f)) = (s.prompt_tokens(), s.first_token) else {
                    continue;
                };
                let t = (f - s.start).as_secs_f64();
                rate.push(p as f64 / t);
                ttft.push(t);
                toks.push(p as f64);
                cached = cached.max(s.cached_tokens());
            }
            if rate.is_empty() {
                break;
            }
            let row = PrefillRow {
                length: len,
                prompt_tokens: Stat::of(toks).median as u64,
                rate: Stat::of(rate),
                ttft_s: Stat::of(ttft),
                cached_tokens: cached,
            };
            log(format!(
                "prefill {len}: {:.0} tok/s, TTFT {:.2} s",
                row.rate.median, row.ttft_s.median
            ));
            results.prefill.push(row);
        }
    }
    results.wall_s = start.elapsed().as_secs_f64();
    events.emit(Event::Finished {
        source: source(),
        duration_ms: (results.wall_s * 1000.0) as u64,
        bytes: None,
    });
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statistics() {
        let s = Stat::of(vec![3.0, 1.0, 2.0]);
        assert_eq!((s.mean, s.median), (2.0, 2.0));
        assert!((s.std - (2.0f64 / 3.0).sqrt()).abs() < 1e-12);
        assert_eq!(Stat::of(vec![1.0, 4.0]).median, 2.5);
        assert_eq!(Stat::of(vec![]).mean, 0.0);
        let p = prompts::prompt(Kind::Code, 5, "x-1");
        assert!(p.ends_with("(variant x-1)"));
        assert_ne!(prompts::filler(100, 1), prompts::filler(100, 2));
    }
}
