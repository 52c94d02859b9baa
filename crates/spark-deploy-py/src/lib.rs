//! `import spark_deploy`: the spark-deploy plan API for Python (Jupyter, pipelines).
//!
//! A thin layer over `spark-deploy-core`: configs and plans cross the boundary as plain Python
//! data (dicts, lists, str, int), errors as a `SparkDeployError` hierarchy carrying the Rust
//! error's fields.
//!
//! - `runtime`: one tokio runtime per process, recreated after `fork`.
//! - `events`: running work with the GIL released while the calling thread delivers events to
//!   the Python callback and watches for Ctrl-C / a cancel flag.
//! - `plan`: `Plan` (standard, teardown, from_steps, describe, run, run_async) and `Report`.
//! - `deployment`: the `Deployment` handle.
//! - `testbed` (cargo feature `testbed`, on by default): `Testbed`, `testbed_up` / `testbed_down`.
//! - `errors`: `SparkDeployError`, `ConfigError`, `StepError` and one subclass per step.
//! - `helpers.py`: the pure-Python parts (`Report`, HTML renderings, Jupyter progress, asyncio).

mod deployment;
mod errors;
mod events;
mod measure;
mod plan;
mod runtime;
#[cfg(feature = "testbed")]
mod testbed;

use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use spark_deploy_core::config::{self, DeploymentConfig, ValidatedConfig};

use errors::config_error;

/// Converts a serde value into Python objects through the `json` module.
pub(crate) fn to_py<'py>(
    py: Python<'py>,
    value: &impl serde::Serialize,
) -> PyResult<Bound<'py, PyAny>> {
    let text = serde_json::to_string(value)
        .map_err(|e| errors::SparkDeployError::new_err(e.to_string()))?;
    py.import("json")?.call_method1("loads", (text,))
}

pub(crate) fn home() -> PathBuf {
    std::env::var_os("HOME").map_or_else(|| PathBuf::from("/"), PathBuf::from)
}

/// A deployment configuration (TOML file + environment overrides under the recipe's names).
///
/// Create one with ``Config.load(path)`` or ``Config.from_dict(d)``; check it with ``validate()``;
/// hand it to ``Plan.standard(config)`` or ``Deployment(config)``.
#[pyclass(module = "spark_deploy", frozen)]
#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) inner: DeploymentConfig,
}

#[pymethods]
impl Config {
    /// Loads a config file (or the defaults when `path` is None) and applies environment overrides.
    ///
    /// Args:
    ///     path: TOML file, or None for the built-in defaults.
    ///     env: a dict used instead of `os.environ` for the overrides (WORKER, CONTEXT, HF_TOKEN, ...).
    ///
    /// Returns:
    ///     The config (not yet validated: see ``validate()``).
    ///
    /// Raises:
    ///     ConfigError: unreadable file, unknown key, bad value (``.field`` names it).
    #[staticmethod]
    #[pyo3(signature = (path=None, env=None))]
    fn load(
        path: Option<PathBuf>,
        env: Option<std::collections::HashMap<String, String>>,
    ) -> PyResult<Self> {
        let inner = match env {
            Some(map) => config::load_with_env(path.as_deref(), &|k| map.get(k).cloned()),
            None => config::load(path.as_deref()),
        }
        .map_err(|e| config_error(&e))?;
        Ok(Self { inner })
    }

    /// Builds a config from a dict shaped like the TOML file (missing keys take defaults).
    ///
    /// Args:
    ///     data: ``{"serving": {"context": 262144}, "nodes": [...], ...}``.
    ///
    /// Returns:
    ///     The config (not yet validated: see ``validate()``).
    ///
    /// Raises:
    ///     ConfigError: unknown key or wrong type.
    #[staticmethod]
    fn from_dict(py: Python<'_>, data: &Bound<'_, PyDict>) -> PyResult<Self> {
        let text: String = py
            .import("json")?
            .call_method1("dumps", (data,))?
            .extract()?;
        let inner: DeploymentConfig = serde_json::from_str(&text).map_err(|e| {
            config_error(&config::ConfigError::Parse {
                path: PathBuf::from("<dict>"),
                message: e.to_string(),
            })
        })?;
        Ok(Self { inner })
    }

    /// Validates every field.
    ///
    /// Returns:
    ///     The warnings (risky but accepted values) as dicts with ``field`` and the reason.
    ///
    /// Raises:
    ///     ConfigError: with ``.field`` (first refused field) and ``.problems`` (every one).
    fn validate<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let v = self.validated()?;
        to_py(py, &v.warnings())
    }

    /// The config as a dict shaped like the TOML file.
    ///
    /// Returns:
    ///     The dict (secrets are never included).
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_py(py, &self.inner)
    }

    fn __repr__(&self) -> String {
        format!(
            "Config(model={:?}, nodes={}, context={}, parallel={})",
            self.inner.model.id,
            self.inner.nodes.len(),
            self.inner.serving.context,
            self.inner.serving.parallel
        )
    }
}

impl Config {
    pub(crate) fn validated(&self) -> PyResult<ValidatedConfig> {
        config::validate(self.inner.clone(), &home()).map_err(|e| config_error(&e))
    }
}

/// Deploy one large model across NVIDIA DGX Sparks: the spark-deploy plan from Python.
///
/// ``Config`` → ``Plan`` / ``Deployment`` → ``Report``; failures raise ``StepError`` subclasses.
#[pymodule]
fn spark_deploy(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<Config>()?;
    m.add_class::<plan::Plan>()?;
    m.add_class::<deployment::Deployment>()?;
    m.add("Report", plan::helpers(m.py())?.getattr("Report")?)?;
    for name in ["ValidationReport", "CheckResult", "Verdict", "BenchRows"] {
        m.add(name, plan::helpers(m.py())?.getattr(name)?)?;
    }
    m.add("StepStatus", plan::helpers(m.py())?.getattr("StepStatus")?)?;
    #[cfg(feature = "testbed")]
    {
        m.add_class::<testbed::Testbed>()?;
        m.add_function(wrap_pyfunction!(testbed::testbed_up, m)?)?;
        m.add_function(wrap_pyfunction!(testbed::testbed_down, m)?)?;
    }
    errors::register(m)?;
    Ok(())
}
