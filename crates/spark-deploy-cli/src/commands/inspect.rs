//! `status` and `logs`: read-only views of a running deployment.

use std::sync::Arc;

use clap::Args;
use spark_deploy_core::event::Recorder;
use spark_deploy_core::lifecycle::log_stream::{self, LogLine, LogQuery};
use spark_deploy_core::lifecycle::log_time::parse_since;
use spark_deploy_core::lifecycle::status::status;
use spark_deploy_core::run::Context;

use super::Global;
use crate::exit::{Failure, INTERRUPTED, NOT_SERVING, RUNTIME};
use crate::render;

fn context(global: &Global) -> Result<(tokio::runtime::Runtime, Context), Failure> {
    let config = global.load()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::new(RUNTIME, &e, None))?;
    Ok((rt, Context::new(config, Arc::new(Recorder::default()))))
}

/// `status`: prints the state of both ranks and the API; exits [`NOT_SERVING`] unless the pair
/// is serving.
pub(crate) fn run_status(global: &Global) -> Result<(), Failure> {
    let (rt, ctx) = context(global)?;
    let s = rt.block_on(status(&ctx));
    if global.json {
        render::out(&serde_json::to_string_pretty(&s).unwrap_or_default());
    } else {
        let mut out = format!(
            "deployment {}: {}\n",
            ctx.config().config().deployment.name,
            s.overall
        );
        for r in &s.ranks {
            let mem = r
                .mem_available_gib
                .map_or_else(|| "?".to_owned(), |m| format!("{m:.1} GiB"));
            out.push_str(&format!(
                "  rank {} on {}: {} {} (since {}) fingerprint {} — MemAvailable {mem}\n",
                r.rank,
                r.node,
                r.container,
                r.state,
                r.started_at.as_deref().unwrap_or("-"),
                r.fingerprint
                    .as_deref()
                    .map_or("-", |f| &f[..f.len().min(12)])
            ));
        }
        match &s.served {
            Ok(ids) => out.push_str(&format!("  serving: {}\n", ids.join(", "))),
            Err(e) => out.push_str(&format!("  API: {e}\n")),
        }
        let w = &s.watch;
        out.push_str(&format!(
            "  watch: {}{} — {}{}{}\n",
            w.state,
            w.pid.map(|p| format!(" (pid {p})")).unwrap_or_default(),
            w.reason,
            w.paused_until
                .as_ref()
                .filter(|_| !w.reason.contains("paused until"))
                .map(|u| format!("; paused until {u}"))
                .unwrap_or_default(),
            if w.heals_last_hour > 0 {
                format!("; {} heal(s) in the last hour", w.heals_last_hour)
            } else {
                String::new()
            },
        ));
        if let Some(m) = &w.stop_marker {
            out.push_str(&format!(
                "  stop marker: {m} (`spark-deploy up` removes it)\n"
            ));
        }
        render::out(&out);
    }
    if s.overall == "running" {
        Ok(())
    } else {
        Err(Failure::reported(NOT_SERVING))
    }
}

/// `--since` as clap parses it: the Unix time it names.
fn since(value: &str) -> Result<i64, String> {
    parse_since(value, std::time::SystemTime::now()).map_err(|e| e.to_string())
}

#[derive(Args, Debug)]
pub(crate) struct LogsArgs {
    /// Only this rank's log (0 is the head); default: every rank, interleaved by time, each line
    /// prefixed with `[rank N]`.
    #[arg(long)]
    rank: Option<usize>,
    /// Last N lines of each rank (default 100, or every line since `--since`).
    #[arg(long, value_name = "N")]
    tail: Option<usize>,
    /// Only lines written since WHEN: `30s`, `10m`, `2h`, `1d` back from now, a Unix time or an
    /// RFC 3339 time (`2026-12-01T10:00:00Z`).
    #[arg(long, value_name = "WHEN", value_parser = since)]
    since: Option<i64>,
    /// Keep printing new lines as the ranks write them, until Ctrl-C or the ranks stop.
    #[arg(long, short)]
    follow: bool,
}

fn render_line(line: &LogLine, prefix: bool, json: bool) -> String {
    if json {
        serde_json::json!({
            "rank": line.rank,
            "node": line.node,
            "ts": line.timestamp,
            "line": line.text,
        })
        .to_string()
    } else if prefix {
        format!("[rank {}] {} {}", line.rank, line.timestamp, line.text)
    } else {
        format!("{} {}", line.timestamp, line.text)
    }
}

/// `logs`: the newest lines of every rank (or one), ordered by time; `-f` follows.
pub(crate) fn run_logs(global: &Global, args: &LogsArgs) -> Result<(), Failure> {
    let (rt, ctx) = context(global)?;
    let nodes = ctx.config().config().nodes.len();
    let ranks: Vec<usize> = match args.rank {
        Some(r) if r >= nodes => {
            let names: Vec<String> = ctx
                .config()
                .config()
                .nodes
                .iter()
                .enumerate()
                .map(|(i, n)| format!("{i} ({})", n.name))
                .collect();
            return Err(Failure::usage(
                format!(
                    "--rank {r}: this deployment has ranks {}",
                    names.join(" and ")
                ),
                format!(
                    "pass --rank 0..={}, or leave --rank out for every rank",
                    nodes - 1
                ),
            ));
        }
        Some(r) => vec![r],
        None => (0..nodes).collect(),
    };
    let query = LogQuery {
        tail: args.tail.or(if args.since.is_some() {
            None
        } else {
            Some(100)
        }),
        since: args.since,
        follow: args.follow,
    };
    let prefix = ranks.len() > 1;
    let json = global.json;
    rt.block_on(async {
        let closed = tokio::sync::Notify::new();
        let mut open = true;
        let mut on_line = |line: LogLine| {
            if open && !render::line(&render_line(&line, prefix, json)) {
                open = false;
                closed.notify_one();
            }
        };
        tokio::select! {
            r = log_stream::read(&ctx, &ranks, &query, &mut on_line) => {
                for m in r.map_err(|e| Failure::new(RUNTIME, &e, None))? {
                    render::note(&format!("warning: {m}"));
                }
                Ok(())
            }
            () = closed.notified() => Ok(()),
            _ = tokio::signal::ctrl_c() => Err(Failure::reported(INTERRUPTED)),
        }
    })
}
