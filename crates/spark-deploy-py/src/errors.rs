//! The exception hierarchy: `SparkDeployError` and one subclass per failing area, carrying the
//! Rust error's fields as attributes.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use spark_deploy_core::config::ConfigError as CoreConfigError;
use spark_deploy_core::plan::StepKind;
use spark_deploy_core::run::RunError;
use spark_deploy_core::steps::PreflightFailed;

create_exception!(
    spark_deploy,
    SparkDeployError,
    PyException,
    "Base class of every spark-deploy error."
);
create_exception!(
    spark_deploy,
    ConfigError,
    SparkDeployError,
    "The configuration is unreadable or invalid; `.field` names the field."
);

create_exception!(
    spark_deploy,
    UpgradeError,
    SparkDeployError,
    "An upgrade or rollback did not end with the new generation serving: `.remedy`, and `.restored` (the generation serving again, or None)."
);

create_exception!(
    spark_deploy,
    StepError,
    SparkDeployError,
    "A step of a plan run failed: `.step`, `.error`, `.remedy`, `.report` (the steps so far), `.node` and `.rank` (when the error names them), `.checks` (preflight's table)."
);

/// One subclass of `StepError` per step.
macro_rules! step_errors {
    ($($name:ident => $doc:literal),* $(,)?) => {
        $(create_exception!(spark_deploy, $name, StepError, $doc);)*
        fn register_steps(m: &Bound<'_, PyModule>) -> PyResult<()> {
            let py = m.py();
            m.add("StepError", py.get_type::<StepError>())?;
            $(m.add(stringify!($name), py.get_type::<$name>())?;)*
            Ok(())
        }
    };
}

step_errors!(
    PreflightError => "A preflight check failed; nothing was changed.",
    FetchError => "Downloading the checkpoint, Engram shards or kit failed (partial files are kept and resumed).",
    RankCacheError => "Building a rank's cache failed.",
    StorageError => "Giving the workers their bytes (NFS volume or copy) failed.",
    ImageError => "Making the engine image present on every node failed.",
    LaunchError => "Starting a rank failed; every rank of the deployment was stopped.",
    SmokeError => "Readiness or the smoke generation failed; every rank was stopped.",
    StopError => "Stopping a rank failed.",
);

/// Maps a config error, setting `field`, `problems` and `remedy`.
pub(crate) fn config_error(e: &CoreConfigError) -> PyErr {
    let err = ConfigError::new_err(e.to_string());
    Python::attach(|py| {
        let value = err.value(py);
        let _ = value.setattr("field", e.field());
        let problems: Vec<(String, String, String)> = match e {
            CoreConfigError::Invalid { problems } => problems
                .iter()
                .map(|p| (p.field.clone(), p.value.clone(), p.allowed.clone()))
                .collect(),
            _ => Vec::new(),
        };
        let _ = value.setattr("problems", problems);
        let _ = value.setattr("remedy", e.remedy());
    });
    err
}

/// The step's name as in events and reports (`fetch_checkpoint`).
pub(crate) fn step_name(kind: StepKind) -> String {
    serde_json::to_value(kind)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| kind.title().to_owned())
}

/// Maps a failed run to the exception of its failed step, with `step`, `error`, `remedy` and
/// `report` (the step dicts so far, as a `Report`).
pub(crate) fn run_error(py: Python<'_>, e: &RunError) -> PyResult<PyErr> {
    let message = e.to_string();
    let err = match e.failure.step {
        StepKind::Preflight => PreflightError::new_err(message),
        StepKind::FetchCheckpoint => FetchError::new_err(message),
        StepKind::BuildRankCache => RankCacheError::new_err(message),
        StepKind::ConfigureWorkerStorage => StorageError::new_err(message),
        StepKind::BuildImage => ImageError::new_err(message),
        StepKind::LaunchRank => LaunchError::new_err(message),
        StepKind::Smoke => SmokeError::new_err(message),
        StepKind::Stop => StopError::new_err(message),
    };
    let value = err.value(py);
    value.setattr("step", step_name(e.failure.step))?;
    value.setattr("error", e.failure.chain())?;
    value.setattr("remedy", e.failure.remedy.clone())?;
    value.setattr("report", crate::plan::report(py, &e.report)?)?;
    value.setattr("node", e.failure.node.clone())?;
    value.setattr("rank", e.failure.rank)?;
    let checks = match e.failure.source.downcast_ref::<PreflightFailed>() {
        Some(p) => crate::to_py(py, &p.report.results)?,
        None => pyo3::types::PyList::empty(py).into_any(),
    };
    value.setattr("checks", checks)?;
    Ok(err)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("SparkDeployError", py.get_type::<SparkDeployError>())?;
    m.add("ConfigError", py.get_type::<ConfigError>())?;
    m.add("UpgradeError", py.get_type::<UpgradeError>())?;
    register_steps(m)
}
