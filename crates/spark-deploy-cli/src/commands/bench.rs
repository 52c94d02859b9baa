//! `bench`: decode and prefill rates through the deployment's API, stored by fingerprint
//! (docs/validate-and-bench.md).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use clap::Args;
use spark_deploy_core::api::Api;
use spark_deploy_core::bench::{self, Kind, Options, chart, report};
use spark_deploy_core::event::Event;

use super::Global;
use crate::exit::{Failure, RUNTIME};
use crate::render;

/// `spark-deploy bench` options.
#[derive(Args, Debug)]
pub(crate) struct BenchArgs {
    /// Concurrent stream counts (capped by serving.parallel).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    streams: Vec<u32>,
    /// Prompt kinds: prose, code, structured.
    #[arg(long, value_delimiter = ',', default_value = "prose,code,structured")]
    kinds: Vec<String>,
    /// Completion tokens per request.
    #[arg(long, default_value_t = 256)]
    max_tokens: u64,
    /// Repetitions (the median is reported).
    #[arg(long, default_value_t = 3)]
    reps: u32,
    /// Prefill prompt lengths in tokens (those that do not fit serving.context are left out).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "8192,16384,32768,65536,131072,262144"
    )]
    prefill: Vec<u64>,
    /// Measure no prefill.
    #[arg(long)]
    no_prefill: bool,
    /// Compare with the last run of the same fingerprint.
    #[arg(long)]
    compare: bool,
    /// Regression threshold for --compare, percent.
    #[arg(long, default_value_t = 5.0)]
    threshold: f64,
}

pub(crate) fn run(global: &Global, args: &BenchArgs) -> Result<(), Failure> {
    let config = global.load()?;
    let kinds = args
        .kinds
        .iter()
        .map(|k| {
            Kind::parse(k).ok_or_else(|| {
                Failure::usage(
                    format!("--kinds: {k:?} is not a prompt kind"),
                    "use prose, code and/or structured",
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let opts = Options {
        kinds,
        streams: args.streams.clone(),
        max_tokens: args.max_tokens,
        reps: args.reps,
        prefill: if args.no_prefill {
            Vec::new()
        } else {
            args.prefill.clone()
        },
    };
    let api = Api::from_config(&config).map_err(|e| Failure::new(RUNTIME, &e, None))?;
    let fingerprint = report::fingerprint(&config).map_err(|e| Failure::new(RUNTIME, &e, None))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::new(RUNTIME, &e, None))?;
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    rt.spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            flag.store(true, Ordering::SeqCst);
        }
    });
    let sink = |e: Event| {
        if let Event::Log { line, .. } = &e {
            render::note(line);
        }
    };
    let results = rt
        .block_on(bench::run(&api, &opts, &sink, &|| {
            stop.load(Ordering::SeqCst)
        }))
        .map_err(|e| Failure::new(RUNTIME, &e, None))?;
    let mut json = report::benchy_json(&results, &fingerprint);
    let startup = report::add_startup(&mut json, Path::new(&config.config().deployment.state_dir));
    let dir = report::dir(
        Path::new(&config.config().deployment.state_dir),
        &fingerprint,
    );
    let stored =
        report::store(&dir, results.at_unix, &json).map_err(|e| Failure::new(RUNTIME, &e, None))?;
    let mut table = report::markdown(&results);
    if let Some(t) = &startup {
        table.push('\n');
        table.push_str(&report::startup_line(t));
        table.push('\n');
    }
    let ts = stored.file_stem().map_or_else(
        || results.at_unix.to_string(),
        |s| s.to_string_lossy().into_owned(),
    );
    let charts = report::store_file(&dir, &format!("{ts}.png"), &chart::png(&results))
        .and_then(|_| {
            report::store_file(
                &dir,
                &format!("{ts}.html"),
                chart::html(&results, &table, &fingerprint).as_bytes(),
            )
        })
        .map_err(|e| Failure::new(RUNTIME, &e, None))?;
    if global.json {
        render::out(&serde_json::to_string_pretty(&json).unwrap_or_default());
    } else {
        render::out(&table);
    }
    render::note(&format!(
        "stored {} and the charts {} / .png (fingerprint {fingerprint}, {:.1} s)",
        stored.display(),
        charts.display(),
        results.wall_s
    ));
    if args.compare {
        let last =
            report::last(&dir, Some(&stored)).map_err(|e| Failure::new(RUNTIME, &e, None))?;
        match last {
            None => render::note("compare: no earlier run of this fingerprint"),
            Some(before) => {
                let t = args.threshold / 100.0;
                let deltas = report::compare(&before, &json, t);
                render::out(&report::compare_markdown(&deltas, t));
                let n = deltas.iter().filter(|d| d.regression).count();
                if n > 0 {
                    render::note(&format!(
                        "compare: {n} figure(s) dropped more than {} %",
                        args.threshold
                    ));
                }
            }
        }
    }
    Ok(())
}
