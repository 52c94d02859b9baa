//! What `bench` leaves behind: a markdown table, JSON with llama-benchy's report fields, results
//! stored under the state directory by the deployment's fingerprint, and the comparison with the
//! last run of the same fingerprint.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::{Results, Stat};
use crate::config::ValidatedConfig;
use crate::lifecycle::launch_record;

/// Errors of storing or reading results.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// A file could not be read or written.
    #[error("bench results {path}: {source}; remedy: check deployment.state_dir is writable")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The launch record could not be read.
    #[error(transparent)]
    Record(#[from] launch_record::LaunchRecordError),
}

fn ms(s: &Stat, scale: f64) -> String {
    format!("{:.1} ± {:.1}", s.mean * scale, s.std * scale)
}

/// The markdown table: one row per prompt kind × streams (per-stream and aggregate side by
/// side), one per prefill length.
#[must_use]
pub fn markdown(r: &Results) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "| kind | streams | per-stream tok/s | aggregate tok/s | TTFT ms | completion tokens |"
    );
    let _ = writeln!(t, "|---|---:|---:|---:|---:|---:|");
    for d in &r.decode {
        let _ = writeln!(
            t,
            "| {} | {} | {} | {} | {} | {} |",
            d.kind.name(),
            d.streams,
            ms(&d.per_stream, 1.0),
            ms(&d.aggregate, 1.0),
            ms(&d.ttft_s, 1000.0),
            d.completion_tokens
        );
    }
    if !r.prefill.is_empty() {
        let _ = writeln!(
            t,
            "\n| prefill length | prompt tokens | prefill tok/s | TTFT s |"
        );
        let _ = writeln!(t, "|---:|---:|---:|---:|");
        for p in &r.prefill {
            let _ = writeln!(
                t,
                "| {} | {} | {} | {:.2} ± {:.2} |",
                p.length,
                p.prompt_tokens,
                ms(&p.rate, 1.0),
                p.ttft_s.mean,
                p.ttft_s.std
            );
        }
    }
    if !r.prefill_skipped.is_empty() {
        let _ = writeln!(
            t,
            "\nprefill lengths left out (do not fit the pool): {:?}",
            r.prefill_skipped
        );
    }
    t
}

fn benchy_stat(s: &Stat, scale: f64) -> Value {
    json!({"mean": s.mean * scale, "std": s.std * scale,
           "values": s.values.iter().map(|v| v * scale).collect::<Vec<_>>()})
}

/// The results in llama-benchy's report shape: `{"model", "benchmarks": [{"concurrency",
/// "prompt_size", "response_size", "context_size", "is_context_prefill_phase",
/// "pp_throughput", "tg_throughput", "peak_throughput", "ttfr", "e2e_ttft"}]}` (throughputs
/// tok/s, times ms, each `{mean, std, values}`), plus spark-deploy's own fields under
/// `"spark_deploy"`. The mapping is in docs/validate-and-bench.md.
#[must_use]
pub fn benchy_json(r: &Results, fingerprint: &str) -> Value {
    let mut benchmarks = Vec::new();
    for d in &r.decode {
        benchmarks.push(json!({
            "concurrency": d.streams,
            "prompt_size": d.prompt_tokens,
            "response_size": d.completion_tokens,
            "context_size": 0,
            "is_context_prefill_phase": false,
            "prompt_kind": d.kind.name(),
            "tg_throughput": benchy_stat(&d.per_stream, 1.0),
            "peak_throughput": benchy_stat(&d.aggregate, 1.0),
            "ttfr": benchy_stat(&d.ttft_s, 1000.0),
            "e2e_ttft": benchy_stat(&d.ttft_s, 1000.0),
        }));
    }
    for p in &r.prefill {
        benchmarks.push(json!({
            "concurrency": 1,
            "prompt_size": p.prompt_tokens,
            "response_size": 1,
            "context_size": 0,
            "is_context_prefill_phase": false,
            "pp_throughput": benchy_stat(&p.rate, 1.0),
            "ttfr": benchy_stat(&p.ttft_s, 1000.0),
            "e2e_ttft": benchy_stat(&p.ttft_s, 1000.0),
        }));
    }
    json!({"model": r.model, "benchmarks": benchmarks,
           "spark_deploy": {"fingerprint": fingerprint, "results": r}})
}

/// The deployment's fingerprint: the config hash (secrets are never serialized), and, when the
/// last `up` left a launch record, the ranks' launch fingerprint (image content label, engine
/// switches and environment) and the checkpoint commit. 16 hex digits.
///
/// # Errors
/// [`ReportError::Record`] when a launch record exists but cannot be read.
pub fn fingerprint(config: &ValidatedConfig) -> Result<String, ReportError> {
    let state = Path::new(&config.config().deployment.state_dir);
    let mut h = Sha256::new();
    h.update(launch_record::config_sha256(config));
    if let Some(r) = launch_record::read(state)? {
        h.update(r.fingerprint);
        h.update(r.model_commit);
        if let Some(clocks) = r.gpu_clocks {
            h.update(clocks);
        }
    }
    Ok(hex::encode(h.finalize())[..16].to_owned())
}

/// The startup timings of the last `up` as one line for the table.
#[must_use]
pub fn startup_line(t: &crate::lifecycle::startup::StartupTimings) -> String {
    format!(
        "startup of the last up: port open {:.1} s, HTTP ready {:.1} s, first token {:.1} s after the launch",
        t.port_open_s, t.http_ready_s, t.first_token_s
    )
}

/// Adds the startup timings of the last `up` (`<state_dir>/startup.json`, when `up` measured
/// them) to a report's JSON (`spark_deploy.startup`) and returns them.
pub fn add_startup(
    json: &mut Value,
    state_dir: &Path,
) -> Option<crate::lifecycle::startup::StartupTimings> {
    let t = crate::lifecycle::startup::read(state_dir).ok().flatten()?;
    json["spark_deploy"]["startup"] = serde_json::to_value(t).unwrap_or(Value::Null);
    Some(t)
}

/// `<state_dir>/bench/<fingerprint>/`.
#[must_use]
pub fn dir(state_dir: &Path, fingerprint: &str) -> PathBuf {
    state_dir.join("bench").join(fingerprint)
}

/// Writes `json` as `<dir>/<at_unix>.json` (temporary file, then rename) and returns the path.
///
/// # Errors
/// [`ReportError::Io`].
pub fn store(dir: &Path, at_unix: u64, json: &Value) -> Result<PathBuf, ReportError> {
    // Two runs within one second get `<at_unix>-1`, `-2`, ... so neither replaces the other.
    let mut stem = at_unix.to_string();
    let mut n = 0u32;
    while dir.join(format!("{stem}.json")).exists() {
        n += 1;
        stem = format!("{at_unix}-{n}");
    }
    store_file(
        dir,
        &format!("{stem}.json"),
        &serde_json::to_vec_pretty(json).unwrap_or_default(),
    )
}

/// The order of a stored run's stem (`<at_unix>` or `<at_unix>-<n>`).
fn run_order(stem: &str) -> Option<(u64, u32)> {
    let (secs, n) = stem.split_once('-').unwrap_or((stem, "0"));
    Some((secs.parse().ok()?, n.parse().ok()?))
}

/// Writes `bytes` as `<dir>/<name>` (temporary file, then rename) and returns the path.
///
/// # Errors
/// [`ReportError::Io`].
pub fn store_file(dir: &Path, name: &str, bytes: &[u8]) -> Result<PathBuf, ReportError> {
    let path = dir.join(name);
    let io = |source| ReportError::Io {
        path: path.clone(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    let tmp = dir.join(format!(".{name}.partial"));
    crate::safe_fs::write_exclusive(&tmp, bytes).map_err(io)?;
    std::fs::rename(&tmp, &path).map_err(io)?;
    Ok(path)
}

/// The newest stored run in `dir` other than `except`, as JSON.
///
/// # Errors
/// [`ReportError::Io`] when the directory exists but cannot be read.
pub fn last(dir: &Path, except: Option<&Path>) -> Result<Option<Value>, ReportError> {
    let io = |source| ReportError::Io {
        path: dir.to_owned(),
        source,
    };
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(e)),
    };
    let mut runs: Vec<((u64, u32), PathBuf)> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| Some(p.as_path()) != except)
        .filter_map(|p| {
            let n = run_order(p.file_stem()?.to_str()?)?;
            (p.extension()? == "json").then_some((n, p))
        })
        .collect();
    runs.sort();
    Ok(runs
        .last()
        .and_then(|(_, p)| std::fs::read(p).ok())
        .and_then(|b| serde_json::from_slice(&b).ok()))
}

/// One compared figure.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Delta {
    /// Which row and figure (`prose × 4 aggregate`, `prefill 8192`).
    pub what: String,
    /// The last run's value.
    pub before: f64,
    /// This run's value.
    pub now: f64,
    /// Relative change.
    pub change: f64,
    /// A drop beyond the threshold.
    pub regression: bool,
}

fn figures(v: &Value) -> Vec<(String, f64)> {
    let r = &v["spark_deploy"]["results"];
    let mut out = Vec::new();
    for d in r["decode"].as_array().into_iter().flatten() {
        let name = format!("{} × {}", d["kind"].as_str().unwrap_or("?"), d["streams"]);
        out.push((
            format!("{name} per-stream"),
            d["per_stream"]["median"].as_f64().unwrap_or(0.0),
        ));
        out.push((
            format!("{name} aggregate"),
            d["aggregate"]["median"].as_f64().unwrap_or(0.0),
        ));
    }
    for p in r["prefill"].as_array().into_iter().flatten() {
        out.push((
            format!("prefill {}", p["length"]),
            p["rate"]["median"].as_f64().unwrap_or(0.0),
        ));
    }
    out
}

/// Figure by figure, `now` against `before` (medians); a drop of more than `threshold`
/// (0.05 = 5 %) is a regression.
#[must_use]
pub fn compare(before: &Value, now: &Value, threshold: f64) -> Vec<Delta> {
    let old = figures(before);
    figures(now)
        .into_iter()
        .filter_map(|(what, n)| {
            let (_, b) = old.iter().find(|(w, _)| *w == what)?;
            let change = if *b > 0.0 { n / b - 1.0 } else { 0.0 };
            Some(Delta {
                what,
                before: *b,
                now: n,
                change,
                regression: change < -threshold,
            })
        })
        .collect()
}

/// The comparison as markdown.
#[must_use]
pub fn compare_markdown(deltas: &[Delta], threshold: f64) -> String {
    let mut t = String::from("| figure | last run | this run | change |\n|---|---:|---:|---:|\n");
    for d in deltas {
        let flag = if d.regression {
            format!(" **regression (> {:.0} %)**", threshold * 100.0)
        } else {
            String::new()
        };
        let _ = writeln!(
            t,
            "| {} | {:.1} | {:.1} | {:+.1} %{flag} |",
            d.what,
            d.before,
            d.now,
            d.change * 100.0
        );
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_ups_startup_timings_join_the_report() {
        let d = tempfile::tempdir().unwrap();
        let mut json = serde_json::json!({"spark_deploy": {"fingerprint": "f"}});
        assert!(add_startup(&mut json, d.path()).is_none());
        let t = crate::lifecycle::startup::StartupTimings {
            at_unix: 7,
            port_open_s: 1.25,
            http_ready_s: 2.5,
            first_token_s: 2.75,
        };
        crate::lifecycle::startup::write(d.path(), &t).unwrap();
        assert_eq!(add_startup(&mut json, d.path()), Some(t));
        assert_eq!(json["spark_deploy"]["startup"]["http_ready_s"], 2.5);
        assert_eq!(
            startup_line(&t),
            "startup of the last up: port open 1.2 s, HTTP ready 2.5 s, first token 2.8 s after the launch"
        );
    }
}
