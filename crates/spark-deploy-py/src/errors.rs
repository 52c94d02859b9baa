//! The exception hierarchy: `SparkDeployError` and one subclass per failing area, carrying the
//! Rust error's fields as attributes.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use spark_deploy_core::config::ConfigError as CoreConfigError;

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

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("SparkDeployError", py.get_type::<SparkDeployError>())?;
    m.add("ConfigError", py.get_type::<ConfigError>())?;
    Ok(())
}
