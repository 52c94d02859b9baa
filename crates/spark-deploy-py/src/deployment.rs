//! `Deployment`: the handle notebooks use — bring it up, check it, stop it.

use pyo3::prelude::*;
use spark_deploy_core::config::ValidatedConfig;
use spark_deploy_core::plan::{Plan as CorePlan, Step};
use spark_deploy_core::steps::Preflight;

use crate::Config;
use crate::plan::run_plan;

/// One deployment described by a config: ``up()``, ``preflight()``, ``stop()``, ``restart()``.
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
            &CorePlan::standard(&self.validated),
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
        let plan = CorePlan::from_steps(
            &self.validated,
            vec![Step::Preflight(Preflight::new(&self.validated))],
        );
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
            &CorePlan::teardown(&self.validated),
            on_event.as_ref(),
            None,
        )
    }

    /// ``stop()`` then ``up()``.
    ///
    /// Args:
    ///     on_event: called on this thread with each event dict of both runs.
    ///
    /// Returns:
    ///     The ``Report`` of ``up()``.
    ///
    /// Raises:
    ///     SparkDeployError: as ``stop()`` and ``up()``.
    #[pyo3(signature = (on_event=None))]
    fn restart<'py>(
        &self,
        py: Python<'py>,
        on_event: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.stop(py, on_event.clone())?;
        self.up(py, on_event)
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
