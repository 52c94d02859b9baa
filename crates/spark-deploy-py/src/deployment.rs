//! `Deployment`: the handle notebooks use — bring it up, check it, stop it.

use std::sync::Arc;

use pyo3::prelude::*;
use spark_deploy_core::config::ValidatedConfig;
use spark_deploy_core::container::rank_container_name;
use spark_deploy_core::event::Event;
use spark_deploy_core::plan::{Plan as CorePlan, Verb};
use spark_deploy_core::run::Context;

use crate::Config;
use crate::events;
use crate::plan::run_plan;

/// One deployment described by a config: ``up()``, ``preflight()``, ``status()``, ``logs()``,
/// ``stop()``, ``restart()``, ``support_bundle()``.
///
/// Args:
///     config: the deployment config (validated here).
///
/// Raises:
///     ConfigError: when the config does not validate.
#[pyclass(module = "spark_deploy", frozen)]
pub(crate) struct Deployment {
    config: Config,
    validated: ValidatedConfig,
}

#[pymethods]
impl Deployment {
    #[new]
    fn new(config: &Config) -> PyResult<Self> {
        let config = config.clone();
        let validated = config.validated()?;
        Ok(Self { config, validated })
    }

    /// The config this deployment was created from.
    #[getter]
    fn config(&self) -> Config {
        self.config.clone()
    }

    /// The standard plan for this deployment (nothing runs).
    ///
    /// Returns:
    ///     ``Plan.standard(config)``.
    fn plan(&self) -> crate::plan::Plan {
        crate::plan::Plan {
            inner: CorePlan::standard(&self.validated),
        }
    }

    /// Runs the standard plan: steps whose work is done are skipped with the reason; a failure
    /// after a launch stops both ranks.
    ///
    /// Args:
    ///     on_event: called on this thread with each event dict; None to ignore events.
    ///
    /// Returns:
    ///     The run's ``Report``.
    ///
    /// Raises:
    ///     SparkDeployError: the failed step's subclass (PreflightError, FetchError, ...).
    ///     KeyboardInterrupt: after the run was cancelled and cleaned up.
    #[pyo3(signature = (on_event=None))]
    fn up<'py>(
        &self,
        py: Python<'py>,
        on_event: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        run_plan(
            py,
            &CorePlan::for_verb(&self.validated, Verb::Up),
            on_event.as_ref(),
            None,
        )
    }

    /// Checks every node (SSH, sudo, Docker, GPU clocks, memory, disk, fabric, ports); changes
    /// nothing.
    ///
    /// Args:
    ///     on_event: called on this thread with each event dict (one ``log`` per check).
    ///
    /// Returns:
    ///     The run's ``Report``.
    ///
    /// Raises:
    ///     PreflightError: a check failed (the ``log`` events name it and its remedy).
    #[pyo3(signature = (on_event=None))]
    fn preflight<'py>(
        &self,
        py: Python<'py>,
        on_event: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let plan = CorePlan::for_verb(&self.validated, Verb::Preflight);
        run_plan(py, &plan, on_event.as_ref(), None)
    }

    /// Stops every rank, rank 0 first, saving each log gzipped.
    ///
    /// Args:
    ///     on_event: called on this thread with each event dict.
    ///
    /// Returns:
    ///     The run's ``Report``.
    ///
    /// Raises:
    ///     StopError: a rank could not be stopped.
    #[pyo3(signature = (on_event=None))]
    fn stop<'py>(
        &self,
        py: Python<'py>,
        on_event: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        run_plan(
            py,
            &CorePlan::for_verb(&self.validated, Verb::Down),
            on_event.as_ref(),
            None,
        )
    }

    /// Stops both ranks and starts both again, in one run (as ``spark-deploy restart``): the
    /// teardown's Stop step followed by the standard plan, whose launch compares the fingerprint
    /// anew.
    ///
    /// Args:
    ///     on_event: called on this thread with each event dict.
    ///
    /// Returns:
    ///     The run's ``Report`` (``stop`` first, then the standard steps).
    ///
    /// Raises:
    ///     StepError: the failed step's subclass (StopError, PreflightError, ...).
    ///     KeyboardInterrupt: after the run was cancelled and cleaned up.
    #[pyo3(signature = (on_event=None))]
    fn restart<'py>(
        &self,
        py: Python<'py>,
        on_event: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        run_plan(
            py,
            &CorePlan::for_verb(&self.validated, Verb::Restart),
            on_event.as_ref(),
            None,
        )
    }

    /// The API key of the deployment (generated 0600 by the first ``up()``); never logged.
    ///
    /// Returns:
    ///     The key, for ``openai.OpenAI(api_key=...)``.
    ///
    /// Raises:
    ///     SparkDeployError: no key yet (run ``up()`` first) or it is unreadable.
    fn api_key(&self) -> PyResult<String> {
        let path = std::path::Path::new(&self.validated.config().serving.api_key_file);
        spark_deploy_core::lifecycle::api_key::read(path)
            .map(|k| k.expose().to_owned())
            .map_err(|e| {
                crate::errors::SparkDeployError::new_err(format!(
                    "{e}; run up() first: it generates the key"
                ))
            })
    }

    /// The API's base URL on the head (``http://HOST:PORT/v1``; ``0.0.0.0`` becomes ``127.0.0.1``).
    #[getter]
    fn base_url(&self) -> String {
        let s = &self.validated.config().serving;
        let host = if s.host == "0.0.0.0" {
            "127.0.0.1"
        } else {
            s.host.as_str()
        };
        format!("http://{host}:{}/v1", s.port)
    }

    /// The deployment's state, read-only: both ranks' containers, the served models, memory.
    ///
    /// Returns:
    ///     A dict: ``overall`` (``running`` when every rank runs and the API answers, else
    ///     ``down`` or ``degraded``), ``served`` (model ids, or None), ``served_error`` (why they
    ///     could not be read, or None) and ``ranks``: one dict per rank with ``rank``, ``node``,
    ///     ``container``, ``state`` (``running``, ``exited``, ``absent`` or an error),
    ///     ``started_at``, ``fingerprint``, ``mem_available_gib``; ``watch``: the supervisor's
    ///     ``state``, ``reason``, ``paused_until``, ``stop_marker``, ``heals_last_hour``, ``pid``.
    fn status<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let config = self.validated.clone();
        let s = events::block(py, async move {
            let ctx = Context::new(config, Arc::new(|_: Event| {}));
            Ok(spark_deploy_core::lifecycle::status::status(&ctx).await)
        })?;
        let (served, served_error) = match &s.served {
            Ok(v) => (Some(v.clone()), None),
            Err(e) => (None, Some(e.clone())),
        };
        crate::to_py(
            py,
            &serde_json::json!({
                "overall": s.overall,
                "served": served,
                "served_error": served_error,
                "ranks": s.ranks,
                "watch": s.watch,
            }),
        )
    }

    /// Supervises the running pair until cancelled, as ``spark-deploy watch`` does
    /// (docs/operations.md, "Watch"): samples every node, heals all ranks or none, at most
    /// ``watch.max_heals_per_hour`` times, never a pair stopped by ``stop()``.
    ///
    /// Args:
    ///     on_event: called on this thread with each event dict (samples, decisions and actions,
    ///         ``source == {"supervisor": "watch"}``, and the steps of a heal); None to ignore.
    ///     cancel: a ``threading.Event``; setting it ends the watch.
    ///
    /// Raises:
    ///     KeyboardInterrupt: on Ctrl-C, after the watch (and any heal in progress) ended.
    ///     SparkDeployError: the watch directory under the state directory cannot be written.
    #[pyo3(signature = (on_event=None, cancel=None))]
    fn watch<'py>(
        &self,
        py: Python<'py>,
        on_event: Option<Bound<'py, PyAny>>,
        cancel: Option<Bound<'py, PyAny>>,
    ) -> PyResult<()> {
        let (sink, tx, rx) = events::channel_sink::<Result<(), String>>();
        let ctx = Arc::new(Context::new(self.validated.clone(), Arc::new(sink)));
        let run_ctx = ctx.clone();
        let work = move || async move {
            spark_deploy_core::supervise::watch(&run_ctx)
                .await
                .map_err(|e| e.to_string())
        };
        events::drive(
            py,
            rx,
            tx,
            work,
            on_event.as_ref(),
            cancel.as_ref(),
            &|| ctx.cancel(),
        )?
        .map_err(crate::errors::SparkDeployError::new_err)
    }

    /// Upgrades the serving generation to ``new_config``, as ``spark-deploy upgrade`` does
    /// (docs/operations.md, "Upgrades and rollbacks"): prepared beside the old pair while it
    /// serves, switched to, checked (smoke, validate, a short bench within 5 % of the old figures)
    /// and kept — or the old generation is started again.
    ///
    /// Args:
    ///     new_config: the configuration of the new generation (same deployment name).
    ///     on_event: called on this thread with each event dict; None to ignore.
    ///     cancel: a ``threading.Event``; setting it (or Ctrl-C) during the preparation stops
    ///         nothing, during the switch it ends with the old generation serving.
    ///
    /// Returns:
    ///     A dict: ``generation`` (now serving), ``previous``, ``figures`` and ``baseline``
    ///     (``decode_tps``, ``prefill_tps``), ``switch_s``, ``removed`` (retired generations).
    ///
    /// Raises:
    ///     ConfigError: ``new_config`` does not validate.
    ///     UpgradeError: the new generation was refused or could not be prepared; ``.remedy``
    ///         says what to do, ``.restored`` the generation serving again (or None).
    ///     KeyboardInterrupt: after Ctrl-C, once one generation serves again.
    #[pyo3(signature = (new_config, on_event=None, cancel=None))]
    fn upgrade<'py>(
        &self,
        py: Python<'py>,
        new_config: &Config,
        on_event: Option<Bound<'py, PyAny>>,
        cancel: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        use spark_deploy_core::upgrade::{self, Options, UpgradeError};
        let new = new_config.validated()?;
        let (sink, tx, rx) =
            events::channel_sink::<Result<serde_json::Value, (String, String, Option<u32>)>>();
        let ctx = Arc::new(Context::new(new, Arc::new(sink)));
        let run_ctx = ctx.clone();
        let work = move || async move {
            match upgrade::upgrade(&run_ctx, &Options::default()).await {
                Ok(u) => Ok(serde_json::to_value(u).unwrap_or_default()),
                Err(e) => {
                    let restored = match &e {
                        UpgradeError::RolledBack { restored, .. } => Some(*restored),
                        UpgradeError::NotPrepared { serving, .. } => Some(*serving),
                        _ => None,
                    };
                    Err((e.to_string(), e.remedy(), restored))
                }
            }
        };
        match events::drive(
            py,
            rx,
            tx,
            work,
            on_event.as_ref(),
            cancel.as_ref(),
            &|| ctx.cancel(),
        )? {
            Ok(v) => crate::to_py(py, &v),
            Err((message, remedy, restored)) => {
                let err = crate::errors::UpgradeError::new_err(message);
                let value = err.value(py);
                value.setattr("remedy", remedy)?;
                value.setattr("restored", restored)?;
                Err(err)
            }
        }
    }

    /// Stops the serving generation and starts the one that served before it (its recorded
    /// config, image tag and inputs), as ``spark-deploy rollback``.
    ///
    /// Args:
    ///     on_event: called on this thread with each event dict; None to ignore.
    ///
    /// Returns:
    ///     The generation serving now.
    ///
    /// Raises:
    ///     UpgradeError: nothing to return to, or its start failed (``.remedy``).
    #[pyo3(signature = (on_event=None))]
    fn rollback<'py>(&self, py: Python<'py>, on_event: Option<Bound<'py, PyAny>>) -> PyResult<u32> {
        let (sink, tx, rx) = events::channel_sink::<Result<u32, (String, String)>>();
        let ctx = Arc::new(Context::new(self.validated.clone(), Arc::new(sink)));
        let run_ctx = ctx.clone();
        let work = move || async move {
            spark_deploy_core::upgrade::rollback(&run_ctx)
                .await
                .map_err(|e| (e.to_string(), e.remedy()))
        };
        match events::drive(py, rx, tx, work, on_event.as_ref(), None, &|| ctx.cancel())? {
            Ok(id) => Ok(id),
            Err((message, remedy)) => {
                let err = crate::errors::UpgradeError::new_err(message);
                err.value(py).setattr("remedy", remedy)?;
                Err(err)
            }
        }
    }

    /// Every generation, oldest first, as ``spark-deploy history --json``.
    ///
    /// Returns:
    ///     A list of dicts: ``id``, ``state`` (``serving``, ``superseded``, ``rejected``,
    ///     ``retired``), ``fingerprint``, ``model_commit``, ``served_from``/``served_until`` (Unix
    ///     seconds), ``figures`` (``decode_tps``, ``prefill_tps``) and ``note`` (why it was
    ///     refused), ``config`` (secrets never recorded), ``images``, ``config_sha256``.
    ///
    /// Raises:
    ///     SparkDeployError: the history file cannot be read.
    fn history<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let h = spark_deploy_core::upgrade::history(&self.validated)
            .map_err(|e| crate::errors::SparkDeployError::new_err(e.to_string()))?;
        crate::to_py(
            py,
            &serde_json::to_value(&h.generations).unwrap_or_default(),
        )
    }

    /// Checks what the deployment serves through its API (docs/validate-and-bench.md).
    ///
    /// Args:
    ///     only: run only these checks (names as ``spark-deploy validate`` takes them).
    ///     skip: leave these checks out.
    ///     needle: needle prompt size in tokens (default 16000, capped by the pool).
    ///     on_event: called on this thread with each event dict (one ``log`` per check).
    ///
    /// Returns:
    ///     A ``ValidationReport``: a list of ``CheckResult`` (``check``, ``verdict``, ``detail``,
    ///     ``seconds``) with ``.ok``.
    ///
    /// Raises:
    ///     ValueError: an unknown check name, or a needle that does not fit the pool.
    ///     SparkDeployError: the API key file cannot be read.
    #[pyo3(signature = (only=vec![], skip=vec![], needle=None, on_event=None))]
    fn validate<'py>(
        &self,
        py: Python<'py>,
        only: Vec<String>,
        skip: Vec<String>,
        needle: Option<u64>,
        on_event: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        crate::measure::validate(py, &self.validated, &only, &skip, needle, on_event)
    }

    /// Measures decode (per stream and aggregate) and cold prefill through the API by the
    /// recipe's method, and stores the run under the state directory by fingerprint.
    ///
    /// Args:
    ///     streams: concurrent stream counts (capped by ``serving.parallel``).
    ///     kinds: prompt kinds: ``prose``, ``code``, ``structured``.
    ///     max_tokens: completion tokens per request.
    ///     reps: repetitions (the median is reported).
    ///     prefill: prefill lengths in tokens (those that do not fit the pool are left out).
    ///     on_event: called on this thread with each event dict (one ``log`` per row).
    ///     cancel: a ``threading.Event``; setting it stops the load.
    ///
    /// Returns:
    ///     ``BenchRows``: a list of row dicts with ``to_pandas()``, shown as the chart in Jupyter.
    ///     Ctrl-C stops the load and returns the rows measured so far (``.interrupted``).
    ///
    /// Raises:
    ///     ValueError: an unknown prompt kind.
    ///     SparkDeployError: a request failed or the API key file cannot be read.
    #[pyo3(signature = (streams=vec![1, 2, 4], kinds=vec!["prose".to_owned(), "code".to_owned(), "structured".to_owned()], max_tokens=256, reps=3, prefill=vec![8192, 16384, 32768, 65536, 131_072, 262_144], on_event=None, cancel=None))]
    #[allow(clippy::too_many_arguments)]
    fn bench<'py>(
        &self,
        py: Python<'py>,
        streams: Vec<u32>,
        kinds: Vec<String>,
        max_tokens: u64,
        reps: u32,
        prefill: Vec<u64>,
        on_event: Option<&Bound<'py, PyAny>>,
        cancel: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let args = crate::measure::BenchArgs {
            streams,
            kinds,
            max_tokens,
            reps,
            prefill,
        };
        crate::measure::bench(py, &self.validated, args, on_event, cancel)
    }

    /// The engine log of one rank's container (stdout and stderr interleaved).
    ///
    /// Args:
    ///     rank: 0 (the head, serving the API) or 1 (the worker).
    ///     tail: only the last ``tail`` lines; None for the whole log.
    ///
    /// Returns:
    ///     The log text ("" when the container does not exist).
    ///
    /// Raises:
    ///     SparkDeployError: a node or its Docker daemon is unreachable.
    ///     ValueError: no such rank.
    #[pyo3(signature = (rank=0, tail=Some(200)), text_signature = "(self, /, rank=0, tail=200)")]
    fn logs(&self, py: Python<'_>, rank: u32, tail: Option<usize>) -> PyResult<String> {
        let config = self.validated.clone();
        let index = usize::try_from(rank).unwrap_or(usize::MAX);
        if index >= config.config().nodes.len() {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "no rank {rank}: the deployment has {} node(s)",
                config.config().nodes.len()
            )));
        }
        let bytes = events::block(py, async move {
            let ctx = Context::new(config.clone(), Arc::new(|_: Event| {}));
            let container = rank_container_name(&config.config().deployment.name, index);
            let docker = ctx.docker(index).await?;
            if docker.inspect_container(&container).await?.is_none() {
                return Ok(Vec::new());
            }
            Ok(docker.logs(&container, false, tail).await?)
        })?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// Writes a support bundle: one ``.tar.gz`` with both ranks' current and saved logs, the
    /// config and plan (secrets as ``***``), status, the last launch, preflight report, facts and
    /// run events, the supervisor's files, and per node the kernel log tail, ``NVRM`` lines, link
    /// counters and memory. Every member is scrubbed of the HF token and the API key; what could
    /// not be read is listed in the bundle's ``index.json`` with why.
    ///
    /// Args:
    ///     out: where to write it; None for ``<state_dir>/bundles/<name>-<time>.tar.gz``.
    ///
    /// Returns:
    ///     The path of the archive written.
    ///
    /// Raises:
    ///     SparkDeployError: the archive could not be written.
    #[pyo3(signature = (out=None))]
    fn support_bundle(&self, py: Python<'_>, out: Option<std::path::PathBuf>) -> PyResult<String> {
        let config = self.validated.clone();
        let report = events::block(py, async move {
            let ctx = Context::new(config, Arc::new(|_: Event| {}));
            Ok(spark_deploy_core::bundle::write(&ctx, out.as_deref()).await?)
        })?;
        Ok(report.path.display().to_string())
    }

    fn __repr__(&self) -> String {
        let c = self.validated.config();
        format!(
            "Deployment(name={:?}, model={:?}, nodes={})",
            c.deployment.name,
            c.model.id,
            c.nodes.len()
        )
    }
}
