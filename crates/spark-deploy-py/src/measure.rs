//! `Deployment.validate()` and `Deployment.bench()`: the core's checks and benchmark through the
//! deployment's API, results as Python objects (`ValidationReport`, `BenchRows` in
//! `helpers.py`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use spark_deploy_core::api::Api;
use spark_deploy_core::bench::{self, Kind, chart, report};
use spark_deploy_core::config::ValidatedConfig;
use spark_deploy_core::validate::{self, Check};

use crate::events;
use crate::plan::helpers;

fn value_error(e: impl std::fmt::Display) -> PyErr {
    pyo3::exceptions::PyValueError::new_err(e.to_string())
}

fn runtime_error(e: impl std::fmt::Display) -> PyErr {
    crate::errors::SparkDeployError::new_err(e.to_string())
}

fn checks(names: &[String]) -> PyResult<Vec<Check>> {
    names
        .iter()
        .map(|n| Check::parse(n).map_err(value_error))
        .collect()
}

/// Runs `validate` and returns a `ValidationReport`.
pub(crate) fn validate<'py>(
    py: Python<'py>,
    config: &ValidatedConfig,
    only: &[String],
    skip: &[String],
    needle: Option<u64>,
    on_event: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let opts = validate::Options {
        only: checks(only)?,
        skip: checks(skip)?,
        needle_tokens: needle,
    };
    let api = Api::from_config(config).map_err(runtime_error)?;
    let (sink, tx, rx) = events::channel_sink::<Result<validate::Report, String>>();
    let work = move || async move {
        validate::run(&api, &opts, &sink)
            .await
            .map_err(|e| e.to_string())
    };
    let report = events::drive(py, rx, tx, work, on_event, None, &|| {})?.map_err(value_error)?;
    let v = serde_json::to_value(&report).map_err(runtime_error)?;
    helpers(py)?
        .getattr("ValidationReport")?
        .call_method1("from_json", (crate::to_py(py, &v)?,))
}

/// What `bench` is asked to measure.
pub(crate) struct BenchArgs {
    pub(crate) streams: Vec<u32>,
    pub(crate) kinds: Vec<String>,
    pub(crate) max_tokens: u64,
    pub(crate) reps: u32,
    pub(crate) prefill: Vec<u64>,
}

/// Runs `bench`, stores the run (JSON, PNG, HTML) under the state directory and returns
/// `BenchRows`. Ctrl-C (or `cancel.set()`) stops the load; what was measured is returned.
pub(crate) fn bench<'py>(
    py: Python<'py>,
    config: &ValidatedConfig,
    args: BenchArgs,
    on_event: Option<&Bound<'py, PyAny>>,
    cancel: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let kinds = args
        .kinds
        .iter()
        .map(|k| {
            Kind::parse(k).ok_or_else(|| {
                value_error(format!(
                    "{k:?} is not a prompt kind: use prose, code or structured"
                ))
            })
        })
        .collect::<PyResult<Vec<_>>>()?;
    let opts = bench::Options {
        kinds,
        streams: args.streams,
        max_tokens: args.max_tokens,
        reps: args.reps,
        prefill: args.prefill,
    };
    let api = Api::from_config(config).map_err(runtime_error)?;
    let fingerprint = report::fingerprint(config).map_err(runtime_error)?;
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    // the run's result also lands here: after a Ctrl-C, drive returns the KeyboardInterrupt
    // and this slot still holds what was measured
    let slot: Arc<Mutex<Option<bench::Results>>> = Arc::new(Mutex::new(None));
    let kept = slot.clone();
    let (sink, tx, rx) = events::channel_sink::<Result<bench::Results, String>>();
    let work = move || async move {
        let r = bench::run(&api, &opts, &sink, &|| flag.load(Ordering::SeqCst))
            .await
            .map_err(|e| e.to_string());
        if let (Ok(res), Ok(mut k)) = (&r, kept.lock()) {
            *k = Some(res.clone());
        }
        r
    };
    // the work keeps what it measured when stopped, so a Ctrl-C still yields rows
    let outcome = events::drive(py, rx, tx, work, on_event, cancel, &|| {
        stop.store(true, Ordering::SeqCst);
    });
    let interrupted =
        matches!(&outcome, Err(e) if e.is_instance_of::<pyo3::exceptions::PyKeyboardInterrupt>(py));
    let results = match outcome {
        Ok(r) => r.map_err(runtime_error)?,
        Err(e) if interrupted => match slot.lock().ok().and_then(|mut s| s.take()) {
            Some(r) => r,
            None => return Err(e),
        },
        Err(e) => return Err(e),
    };
    let json = report::benchy_json(&results, &fingerprint);
    let dir = report::dir(
        std::path::Path::new(&config.config().deployment.state_dir),
        &fingerprint,
    );
    let table = report::markdown(&results);
    let html = chart::html(&results, &table, &fingerprint);
    let png = chart::png(&results);
    let stored = report::store(&dir, results.at_unix, &json).map_err(runtime_error)?;
    report::store_file(&dir, &format!("{}.png", results.at_unix), &png).map_err(runtime_error)?;
    report::store_file(&dir, &format!("{}.html", results.at_unix), html.as_bytes())
        .map_err(runtime_error)?;
    helpers(py)?.getattr("BenchRows")?.call_method1(
        "from_json",
        (
            crate::to_py(py, &json)?,
            table,
            html,
            pyo3::types::PyBytes::new(py, &png),
            stored.display().to_string(),
            interrupted,
        ),
    )
}
