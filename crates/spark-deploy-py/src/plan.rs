//! `Plan`: the core plan as a Python object, run with the GIL released, events delivered to a
//! callback on the calling thread, Ctrl-C cancelling the run cleanly.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyModule;
use spark_deploy_core::config::ValidatedConfig;
use spark_deploy_core::event::{Event, EventSink};
use spark_deploy_core::lifecycle::run_log::EventLog;
use spark_deploy_core::plan::{Plan as CorePlan, Step, StepKind};
use spark_deploy_core::run::{Context, RunError, RunReport};

use crate::Config;
use crate::errors::{self, SparkDeployError};
use crate::events;

static HELPERS: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// The pure-Python helpers (`Report`, HTML renderings).
pub(crate) fn helpers(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    HELPERS
        .get_or_try_init(py, || {
            let code = std::ffi::CString::new(include_str!("helpers.py"))
                .map_err(|e| SparkDeployError::new_err(e.to_string()))?;
            let m = PyModule::from_code(
                py,
                &code,
                c"spark_deploy/_helpers.py",
                c"spark_deploy._helpers",
            )?;
            m.getattr("Report")?.setattr("__module__", "spark_deploy")?;
            Ok(m.unbind())
        })
        .map(|m| m.bind(py))
}

/// A run report as a `Report` (a list of step dicts).
pub(crate) fn report<'py>(py: Python<'py>, r: &RunReport) -> PyResult<Bound<'py, PyAny>> {
    let steps = crate::to_py(py, &r.steps)?;
    helpers(py)?.getattr("Report")?.call1((steps,))
}

/// The step kinds by their names (`FetchCheckpoint` or `fetch_checkpoint`).
fn step_of(name: &str, config: &ValidatedConfig) -> PyResult<Step> {
    let kinds = StepKind::ALL;
    let kind = kinds
        .into_iter()
        .find(|k| k.title() == name || errors::step_name(*k) == name)
        .ok_or_else(|| {
            pyo3::exceptions::PyValueError::new_err(format!(
                "unknown step {name:?}; the steps are {}",
                kinds.map(StepKind::title).join(", ")
            ))
        })?;
    let engine = spark_deploy_core::engine::for_config(config);
    Ok(CorePlan::step(config, engine.as_ref(), kind))
}

/// Runs `plan`, delivering events to `on_event` on this thread; maps a failure to its exception.
pub(crate) fn run_plan<'py>(
    py: Python<'py>,
    plan: &CorePlan,
    on_event: Option<&Bound<'py, PyAny>>,
    cancel: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let default = match on_event {
        Some(_) => None,
        None => Some(helpers(py)?.call_method0("default_progress")?).filter(|d| !d.is_none()),
    };
    let on_event = on_event.or(default.as_ref());
    let (sink, tx, rx) = events::channel_sink::<Result<RunReport, RunError>>();
    // The run's events are also kept as `<state_dir>/last-run.events.jsonl` (support bundles),
    // as the command line keeps them; a state dir that is not writable costs only that file.
    let state_dir = std::path::PathBuf::from(&plan.config().config().deployment.state_dir);
    let log = EventLog::create(&state_dir).ok().map(Arc::new);
    let tee_log = log.clone();
    let tee = move |e: Event| {
        if let Some(l) = &tee_log {
            l.emit(e.clone());
        }
        sink.emit(e);
    };
    let ctx = Arc::new(Context::new(plan.config().clone(), Arc::new(tee)));
    let plan = plan.clone();
    let run_ctx = ctx.clone();
    let work = move || async move { plan.run(&run_ctx).await };
    let result = events::drive(py, rx, tx, work, on_event, cancel, &|| ctx.cancel())?;
    let _ = spark_deploy_core::bundle::keep_preflight(&ctx);
    if let Some(l) = log {
        match &result {
            Err(e) if e.report.steps.is_empty() => l.discard(),
            _ => {
                let _ = l.finish();
            }
        }
    }
    match result {
        Ok(r) => report(py, &r),
        Err(e) => Err(errors::run_error(py, &e)?),
    }
}

/// An ordered list of typed steps for one deployment.
///
/// Build one with `Plan.standard(config)`, `Plan.teardown(config)` or
/// `Plan.from_steps(config, ["Preflight", "FetchCheckpoint"])`; nothing runs until `run()`.
#[pyclass(module = "spark_deploy", frozen)]
pub(crate) struct Plan {
    pub(crate) inner: CorePlan,
}

#[pymethods]
impl Plan {
    /// The standard deployment: Preflight, FetchCheckpoint, BuildRankCache, ConfigureWorkerStorage,
    /// BuildImage, LaunchRank, Smoke.
    ///
    /// Args:
    ///     config: the deployment config.
    ///
    /// Returns:
    ///     The plan.
    ///
    /// Raises:
    ///     ConfigError: when the config does not validate.
    #[staticmethod]
    fn standard(config: &Config) -> PyResult<Self> {
        Ok(Self {
            inner: CorePlan::standard(&config.validated()?),
        })
    }

    /// The teardown plan: stop every rank, rank 0 first, saving each log.
    ///
    /// Args:
    ///     config: the deployment config.
    ///
    /// Returns:
    ///     The plan (one Stop step).
    ///
    /// Raises:
    ///     ConfigError: when the config does not validate.
    #[staticmethod]
    fn teardown(config: &Config) -> PyResult<Self> {
        Ok(Self {
            inner: CorePlan::teardown(&config.validated()?),
        })
    }

    /// A custom plan of the named steps, in the given order.
    ///
    /// Args:
    ///     config: the deployment config.
    ///     steps: step names: "Preflight", "FetchCheckpoint", "BuildRankCache",
    ///         "ConfigureWorkerStorage", "BuildImage", "LaunchRank", "Smoke", "Stop"
    ///         (or their snake_case forms, as in events).
    ///
    /// Returns:
    ///     The plan.
    ///
    /// Raises:
    ///     ConfigError: when the config does not validate.
    ///     ValueError: an unknown step name.
    #[staticmethod]
    fn from_steps(config: &Config, steps: Vec<String>) -> PyResult<Self> {
        let v = config.validated()?;
        let steps = steps
            .iter()
            .map(|s| step_of(s, &v))
            .collect::<PyResult<Vec<_>>>()?;
        Ok(Self {
            inner: CorePlan::from_steps(&v, steps),
        })
    }

    /// The plan as plain data: deployment, warnings, nodes and every step's actions per node
    /// (the same document as ``spark-deploy plan --json``).
    ///
    /// Returns:
    ///     A dict with ``schema`` ``"spark-deploy.plan/v1"``.
    fn describe<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        crate::to_py(py, &self.inner.describe())
    }

    /// Step kinds in order.
    ///
    /// Returns:
    ///     Names such as ``["Preflight", "FetchCheckpoint"]``.
    fn steps(&self) -> Vec<String> {
        self.inner
            .steps()
            .iter()
            .map(|s| s.kind().title().to_owned())
            .collect()
    }

    /// Runs every step in order, with the GIL released.
    ///
    /// Events (dicts as in ``spark-deploy --json``: ``event`` is ``started``, ``progress``,
    /// ``log``, ``skipped``, ``finished`` or ``failed``) are passed to ``on_event`` on the calling
    /// thread. Ctrl-C (KeyboardInterrupt) or an exception from ``on_event`` cancels the run: the
    /// current step is abandoned (downloads and copies keep resumable partial files; a rank
    /// launch completes first), ranks this run started are stopped, then the exception is
    /// re-raised.
    ///
    /// Args:
    ///     on_event: called with each event dict; None to ignore events (in a Jupyter kernel:
    ///         a progress table per step, with bytes, rate and ETA, updated in place).
    ///     cancel: a ``threading.Event``; setting it (from any thread) cancels the run, which
    ///         then raises the cancelled step's error.
    ///
    /// Returns:
    ///     A ``Report``: one dict per step (``step``, ``status`` ran/skipped/failed,
    ///     ``detail``, ``duration_ms``, ``bytes``).
    ///
    /// Raises:
    ///     PreflightError: (and FetchError, RankCacheError, StorageError, ImageError,
    ///         LaunchError, SmokeError, StopError) the failed step's error, with ``.step``,
    ///         ``.error``, ``.remedy`` and ``.report``.
    ///     KeyboardInterrupt: after the run was cancelled and cleaned up.
    #[pyo3(signature = (on_event=None, cancel=None))]
    fn run<'py>(
        &self,
        py: Python<'py>,
        on_event: Option<Bound<'py, PyAny>>,
        cancel: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        run_plan(py, &self.inner, on_event.as_ref(), cancel.as_ref())
    }

    /// ``run()`` for asyncio: the run goes to a worker thread, events are delivered to
    /// ``on_event`` on the event loop's thread, and cancelling the awaiting task cancels the run
    /// (the task then raises ``CancelledError`` once the run has cleaned up).
    ///
    /// Args:
    ///     on_event: called on the loop's thread with each event dict; None to ignore events.
    ///
    /// Returns:
    ///     A coroutine resolving to the ``Report``.
    ///
    /// Raises:
    ///     StepError: the failed step's subclass, as ``run()``.
    #[pyo3(signature = (on_event=None))]
    fn run_async<'py>(
        slf: &Bound<'py, Self>,
        on_event: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        helpers(slf.py())?.call_method1("run_async", (slf, on_event))
    }

    /// The validated plan as one Kubernetes ``LeaderWorkerSet`` (YAML text), exactly what
    /// ``spark-deploy export lws`` writes.
    ///
    /// Facts come from the last launch's record; the ones given here win (each a dict from node
    /// name to value). A fact still unknown raises, naming the node and the fact.
    ///
    /// Args:
    ///     image_content: the engine image's ``io.spark-deploy.content`` label; None reads it
    ///         from the head's Docker.
    ///     model_commit: the checkpoint's commit (40 hex).
    ///     fabric_addr: fabric IPv4 per node.
    ///     netdev: fabric netdev per node.
    ///     rdma_devices: RoCE devices per node (comma-separated), or ``"none"``.
    ///     gid_index: RoCE v2 GID index per node, or ``"none"``.
    ///     verifier: path of the spark-deploy binary on every node (the init containers').
    ///     rdma_resource: the RDMA device plugin's extended resource.
    ///
    /// Returns:
    ///     The YAML text, with comments explaining its choices.
    ///
    /// Raises:
    ///     ValueError: a fact that does not parse or names no node of the config.
    ///     SparkDeployError: a fact still unknown, the image label unreadable, or a container
    ///         setting a pod cannot express.
    #[pyo3(signature = (*, image_content=None, model_commit=None, fabric_addr=None, netdev=None, rdma_devices=None, gid_index=None, verifier=None, rdma_resource=None))]
    #[allow(clippy::too_many_arguments)]
    fn export_lws(
        &self,
        py: Python<'_>,
        image_content: Option<String>,
        model_commit: Option<String>,
        fabric_addr: Option<std::collections::BTreeMap<String, String>>,
        netdev: Option<std::collections::BTreeMap<String, String>>,
        rdma_devices: Option<std::collections::BTreeMap<String, String>>,
        gid_index: Option<std::collections::BTreeMap<String, String>>,
        verifier: Option<String>,
        rdma_resource: Option<String>,
    ) -> PyResult<String> {
        use spark_deploy_core::export::{self, ExportError, lws};
        let value_error = |e: ExportError| pyo3::exceptions::PyValueError::new_err(e.to_string());
        let failed = |e: ExportError| SparkDeployError::new_err(e.to_string());
        let config = self.inner.config();
        let mut o = export::FactOverrides::default();
        if let Some(c) = &model_commit {
            o.set_model_commit(c).map_err(value_error)?;
        }
        for (flag, values) in [
            ("fabric-addr", fabric_addr),
            ("netdev", netdev),
            ("rdma-devices", rdma_devices),
            ("gid-index", gid_index),
        ] {
            for (node, v) in values.into_iter().flatten() {
                o.set(flag, &format!("{node}={v}")).map_err(value_error)?;
            }
        }
        let record = export::facts_input::last_launch(config).map_err(failed)?;
        let facts = export::facts_for_export(config, record.as_ref(), &o).map_err(|e| match e {
            ExportError::UnknownNode { .. } => value_error(e),
            e => failed(e),
        })?;
        let image_content = match image_content {
            Some(c) => c,
            None => {
                let rt = crate::runtime::get()?;
                py.detach(|| rt.block_on(export::image_content(config)))
                    .map_err(failed)?
            }
        };
        let opts = export::LwsOptions {
            image_content,
            verifier: verifier.unwrap_or_else(|| lws::DEFAULT_VERIFIER.to_owned()),
            rdma_resource: rdma_resource.unwrap_or_else(|| lws::DEFAULT_RDMA_RESOURCE.to_owned()),
        };
        let engine = spark_deploy_core::engine::for_config(config);
        export::lws_yaml(config, engine.as_ref(), &facts, &opts).map_err(failed)
    }

    fn _repr_html_(&self, py: Python<'_>) -> PyResult<String> {
        let desc = self.describe(py)?;
        helpers(py)?.call_method1("plan_html", (desc,))?.extract()
    }

    fn __repr__(&self) -> String {
        format!("Plan({})", self.steps().join(" -> "))
    }
}
