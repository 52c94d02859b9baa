//! `import spark_deploy`: the spark-deploy plan API for Python (Jupyter, pipelines).
//!
//! A thin layer over `spark-deploy-core`: configs and plans cross the boundary as plain Python
//! data (dicts, lists, str, int), errors as a `SparkDeployError` hierarchy carrying the Rust
//! error's fields.

mod errors;

use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use spark_deploy_core::config::{self, DeploymentConfig, ValidatedConfig};
use spark_deploy_core::plan::Plan as CorePlan;

use errors::config_error;

/// Converts a serde value into Python objects through the `json` module.
fn to_py<'py>(py: Python<'py>, value: &impl serde::Serialize) -> PyResult<Bound<'py, PyAny>> {
    let text = serde_json::to_string(value)
        .map_err(|e| errors::SparkDeployError::new_err(e.to_string()))?;
    py.import("json")?.call_method1("loads", (text,))
}

fn home() -> PathBuf {
    std::env::var_os("HOME").map_or_else(|| PathBuf::from("/"), PathBuf::from)
}

/// A deployment configuration (TOML file + environment overrides under the recipe's names).
///
/// Create one with `Config.load(path)` or `Config.from_dict(d)`; check it with `validate()`.
#[pyclass(module = "spark_deploy", frozen)]
#[derive(Clone)]
struct Config {
    inner: DeploymentConfig,
}

#[pymethods]
impl Config {
    /// Loads a config file (or the defaults when `path` is None) and applies environment overrides.
    ///
    /// Args:
    ///     path: TOML file, or None for the built-in defaults.
    ///     env: a dict used instead of `os.environ` for the overrides (WORKER, CONTEXT, HF_TOKEN, ...).
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

    /// Validates every field; returns the warnings (risky but accepted values) as dicts.
    ///
    /// Raises:
    ///     ConfigError: with ``.field`` (first refused field) and ``.problems`` (every one).
    fn validate<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let v = self.validated()?;
        to_py(py, &v.warnings())
    }

    /// The config as a dict (secrets are never included).
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
    fn validated(&self) -> PyResult<ValidatedConfig> {
        config::validate(self.inner.clone(), &home()).map_err(|e| config_error(&e))
    }
}

/// An ordered list of typed steps for one deployment.
#[pyclass(module = "spark_deploy", frozen)]
struct Plan {
    inner: CorePlan,
}

#[pymethods]
impl Plan {
    /// The standard deployment: Preflight, FetchCheckpoint, BuildRankCache, ConfigureWorkerStorage,
    /// BuildImage, LaunchRank, Smoke.
    ///
    /// Raises:
    ///     ConfigError: when the config does not validate.
    #[staticmethod]
    fn standard(config: &Config) -> PyResult<Self> {
        Ok(Self {
            inner: CorePlan::standard(&config.validated()?),
        })
    }

    /// The plan as plain data: deployment, warnings, nodes and every step's actions per node
    /// (the same document as ``spark-deploy plan --json``).
    fn describe<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_py(py, &self.inner.describe())
    }

    /// Step kinds in order.
    fn steps(&self) -> Vec<String> {
        self.inner
            .steps()
            .iter()
            .map(|s| s.kind().title().to_owned())
            .collect()
    }

    fn __repr__(&self) -> String {
        format!("Plan({})", self.steps().join(" -> "))
    }
}

#[pymodule]
fn spark_deploy(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<Config>()?;
    m.add_class::<Plan>()?;
    errors::register(m)?;
    Ok(())
}
