//! One sample of a running pair: per node `MemAvailable` (through the Exec port, from the node's
//! `proc_root`), the rank's container through the Docker port, GPU power and utilisation where
//! `nvidia-smi` answers; rank 0's `/metrics` counters (the engine's [`ServingSignals`]) with the
//! API key; and the 1-token probe's state.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::api::Api;
use crate::container::rank_container_name;
use crate::context::Context;
use crate::engine::ServingSignals;
use crate::ports::exec::Cmd;

/// How long one query of a sample may take before it counts as unanswered.
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(3);

/// A rank's container as its node's Docker saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ContainerObs {
    /// Running.
    Running,
    /// Exists, not running.
    Exited,
    /// Does not exist.
    Absent,
    /// The node's Docker did not answer (see `docker_error`).
    Unreachable,
}

/// One rank and its node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankSample {
    /// The rank.
    pub rank: usize,
    /// Its node.
    pub node: String,
    /// Its container.
    pub container: ContainerObs,
    /// When the container last started (Docker's RFC 3339), when it exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    /// Its exit code, once exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i64>,
    /// Why Docker did not answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub docker_error: Option<String>,
    /// `MemAvailable`, GiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_available_gib: Option<f64>,
    /// Why the node's Exec port did not answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec_error: Option<String>,
    /// The host process holding the most memory (`name (N GiB)`), read when below the floor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_process: Option<String>,
    /// GPU power draw, W (sum over the node's GPUs), where `nvidia-smi` answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_power_w: Option<f64>,
    /// GPU utilisation, % (highest over the node's GPUs), where `nvidia-smi` answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_util_pct: Option<f64>,
}

impl RankSample {
    /// A running rank with nothing else measured (tests, recorded sequences).
    #[must_use]
    pub fn running(rank: usize, node: &str) -> Self {
        Self {
            rank,
            node: node.to_owned(),
            container: ContainerObs::Running,
            started_at: Some("2026-12-01T10:00:00Z".into()),
            exit_code: None,
            docker_error: None,
            mem_available_gib: Some(64.0),
            exec_error: None,
            top_process: None,
            gpu_power_w: None,
            gpu_util_pct: None,
        }
    }
}

/// The 1-token probe as the sample saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum ProbeObs {
    /// Sent, no answer yet.
    InFlight {
        /// Since when (ms since the epoch).
        since_ms: u64,
    },
    /// Answered with a token.
    Ok {
        /// How long it took.
        ms: u64,
    },
    /// Failed or timed out.
    Failed {
        /// How long it took.
        ms: u64,
        /// What happened.
        detail: String,
    },
}

/// Everything one sample saw.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// When (ms since the epoch).
    pub ts_ms: u64,
    /// One entry per rank.
    pub ranks: Vec<RankSample>,
    /// Rank 0's running requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running_requests: Option<f64>,
    /// Rank 0's generated-tokens counter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generated_tokens: Option<f64>,
    /// Why `/metrics` could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_error: Option<String>,
    /// The probe, when one is in flight or just ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<ProbeObs>,
}

impl Sample {
    /// One line for people: per node memory and container, the counters, the probe.
    #[must_use]
    pub fn summary(&self) -> String {
        let mut parts: Vec<String> = self
            .ranks
            .iter()
            .map(|r| {
                let mem = r
                    .mem_available_gib
                    .map_or_else(|| "mem ?".to_owned(), |g| format!("mem {g:.1} GiB"));
                let c = match r.container {
                    ContainerObs::Running => "running",
                    ContainerObs::Exited => "exited",
                    ContainerObs::Absent => "absent",
                    ContainerObs::Unreachable => "docker unreachable",
                };
                let gpu = match (r.gpu_power_w, r.gpu_util_pct) {
                    (Some(w), Some(u)) => format!(", gpu {w:.0} W {u:.0}%"),
                    _ => String::new(),
                };
                format!("{} rank{} {c}, {mem}{gpu}", r.node, r.rank)
            })
            .collect();
        parts.push(match (self.running_requests, self.generated_tokens) {
            (Some(r), Some(t)) => format!("requests {r:.0}, tokens {t:.0}"),
            _ => format!(
                "metrics: {}",
                self.metrics_error.as_deref().unwrap_or("unreadable")
            ),
        });
        if let Some(p) = &self.probe {
            parts.push(match p {
                ProbeObs::InFlight { .. } => "probe in flight".to_owned(),
                ProbeObs::Ok { ms } => format!("probe ok in {ms} ms"),
                ProbeObs::Failed { ms, detail } => format!("probe failed after {ms} ms: {detail}"),
            });
        }
        parts.join("; ")
    }
}

/// The value of metric `name` (no labels, or the sum over its label sets) in Prometheus text.
#[must_use]
pub fn metric(text: &str, name: &str) -> Option<f64> {
    let mut found = None;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') {
            continue;
        }
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let rest = if let Some(r) = rest.strip_prefix('{') {
            match r.split_once('}') {
                Some((_, v)) => v,
                None => continue,
            }
        } else if rest.starts_with(' ') {
            rest
        } else {
            continue;
        };
        if let Some(v) = rest
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        {
            found = Some(found.unwrap_or(0.0) + v);
        }
    }
    found
}

/// `(power W summed, utilisation % highest)` of `nvidia-smi
/// --query-gpu=power.draw,utilization.gpu --format=csv,noheader,nounits`.
#[must_use]
pub fn parse_gpu(text: &str) -> Option<(f64, f64)> {
    let mut power = 0.0;
    let mut util: f64 = 0.0;
    let mut any = false;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let mut f = line.split(',').map(str::trim);
        let p = f.next()?.parse::<f64>().ok();
        let u = f.next()?.parse::<f64>().ok();
        if let Some(p) = p {
            power += p;
        }
        if let Some(u) = u {
            util = util.max(u);
        }
        any |= p.is_some() || u.is_some();
    }
    any.then_some((power, util))
}

/// `(name, GiB)` of the first line of `ps -eo comm=,rss= --sort=-rss`.
#[must_use]
pub fn parse_top_process(text: &str) -> Option<String> {
    let line = text.lines().find(|l| !l.trim().is_empty())?;
    let (name, rss) = line.trim().rsplit_once(char::is_whitespace)?;
    let kib: f64 = rss.trim().parse().ok()?;
    Some(format!(
        "{} ({:.1} GiB)",
        name.trim(),
        kib / f64::from(1u32 << 20)
    ))
}

async fn timed<T, E: std::fmt::Display>(
    f: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, String> {
    match tokio::time::timeout(QUERY_TIMEOUT, f).await {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(_) => Err(format!("no answer within {} s", QUERY_TIMEOUT.as_secs())),
    }
}

async fn node(ctx: &Context, rank: usize, floor_gib: f64) -> RankSample {
    let c = ctx.config().config();
    let node = &c.nodes[rank];
    let container = rank_container_name(&c.deployment.name, rank);
    let mut s = RankSample {
        rank,
        node: node.name.clone(),
        container: ContainerObs::Unreachable,
        started_at: None,
        exit_code: None,
        docker_error: None,
        mem_available_gib: None,
        exec_error: None,
        top_process: None,
        gpu_power_w: None,
        gpu_util_pct: None,
    };
    match timed(ctx.rank_state(rank, &container)).await {
        Ok(st) => {
            s.container = if !st.exists {
                ContainerObs::Absent
            } else if st.running {
                ContainerObs::Running
            } else {
                ContainerObs::Exited
            };
            s.started_at = st.started_at;
            s.exit_code = st.exit_code.filter(|_| !st.running);
        }
        Err(e) => s.docker_error = Some(e),
    }
    let exec = match timed(ctx.exec(rank)).await {
        Ok(e) => e,
        Err(e) => {
            s.exec_error = Some(e);
            return s;
        }
    };
    match timed(exec.read_file(&node.meminfo_path())).await {
        Ok(b) => {
            s.mem_available_gib =
                crate::preflight::meminfo::mem_available(&String::from_utf8_lossy(&b))
                    .map(|b| b as f64 / f64::from(1u32 << 30));
        }
        Err(e) => s.exec_error = Some(e),
    }
    if s.mem_available_gib.is_some_and(|g| g < floor_gib) {
        let ps = Cmd::new("sh").args([
            "-c",
            "ps -eo comm=,rss= --sort=-rss 2>/dev/null | head -n 1",
        ]);
        if let Ok(out) = timed(exec.run(&ps)).await {
            s.top_process = parse_top_process(&String::from_utf8_lossy(&out.stdout));
        }
    }
    let smi = Cmd::new("sh").args([
        "-c",
        &format!(
            "PATH={}:$PATH; command -v nvidia-smi >/dev/null 2>&1 || exit 0; \
             nvidia-smi --query-gpu=power.draw,utilization.gpu --format=csv,noheader,nounits 2>/dev/null || true",
            node.path.join(":")
        ),
    ]);
    if let Ok(out) = timed(exec.run(&smi)).await
        && let Some((w, u)) = parse_gpu(&String::from_utf8_lossy(&out.stdout))
    {
        s.gpu_power_w = Some(w);
        s.gpu_util_pct = Some(u);
    }
    s
}

/// Rank 0's counters: `(running requests, generated tokens)`.
async fn counters(api: Option<&Api>, signals: &ServingSignals) -> Result<(f64, f64), String> {
    let api = api.ok_or("no API key to read /metrics with")?;
    let reply = timed(api.get(signals.metrics_path)).await?;
    if reply.status != 200 {
        return Err(format!(
            "{} answered HTTP {}",
            signals.metrics_path, reply.status
        ));
    }
    let get = |name: &str| {
        metric(&reply.text, name).ok_or_else(|| format!("no {name} in {}", signals.metrics_path))
    };
    Ok((
        get(signals.running_requests)?,
        get(signals.generated_tokens)?,
    ))
}

/// Samples every node (concurrently) and rank 0's counters.
pub async fn collect(
    ctx: &Context,
    api: Option<&Api>,
    signals: &ServingSignals,
    floor_gib: f64,
    ts_ms: u64,
) -> Sample {
    let n = ctx.config().config().nodes.len();
    let (ranks, metrics) = tokio::join!(
        futures::future::join_all((0..n).map(|r| node(ctx, r, floor_gib))),
        counters(api, signals)
    );
    let (running_requests, generated_tokens, metrics_error) = match metrics {
        Ok((r, t)) => (Some(r), Some(t), None),
        Err(e) => (None, None, Some(e)),
    };
    Sample {
        ts_ms,
        ranks,
        running_requests,
        generated_tokens,
        metrics_error,
        probe: None,
    }
}

/// One 1-token chat completion; `Ok` with the time it took, else why not.
///
/// # Errors
///
/// What failed (transport, HTTP status, no token), or the timeout.
pub async fn probe(api: &Api, timeout: Duration) -> Result<u64, String> {
    let t = std::time::Instant::now();
    let body = serde_json::json!({
        "messages": [{"role": "user", "content": "Say OK."}],
        "max_tokens": 1,
        "chat_template_kwargs": {"enable_thinking": false},
    });
    let reply = match tokio::time::timeout(timeout, api.chat(body)).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return Err(e.to_string()),
        Err(_) => return Err(format!("no answer within {:.0} s", timeout.as_secs_f64())),
    };
    if reply.status != 200 {
        return Err(format!("HTTP {}: {}", reply.status, reply.error_message()));
    }
    let v = reply.json();
    let tokens = v["usage"]["completion_tokens"].as_u64().unwrap_or(0);
    if tokens == 0 && v["choices"][0]["message"]["content"].as_str().is_none() {
        return Err("the reply carries no token".to_owned());
    }
    Ok(u64::try_from(t.elapsed().as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_gpu_and_ps_parse() {
        let text = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 2\nvllm:num_requests_running_total 9\nvllm:generation_tokens_total{model=\"a\"} 10\nvllm:generation_tokens_total{model=\"b\"} 5\n";
        assert_eq!(metric(text, "vllm:num_requests_running"), Some(2.0));
        assert_eq!(metric(text, "vllm:generation_tokens_total"), Some(15.0));
        assert_eq!(metric(text, "vllm:absent"), None);
        assert_eq!(parse_gpu("41.20, 0\n55.00, 97\n"), Some((96.2, 97.0)));
        assert_eq!(parse_gpu("[N/A], [N/A]\n"), None);
        assert_eq!(parse_gpu(""), None);
        assert_eq!(
            parse_top_process("python3   3145728\nbash 10\n").as_deref(),
            Some("python3 (3.0 GiB)")
        );
    }
}
