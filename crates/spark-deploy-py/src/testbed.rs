//! The testbed from Python: two Sparks on this machine, and the config deploying onto them.

use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};

use pyo3::prelude::*;
use spark_deploy_core::config::DeploymentConfig;
use spark_deploy_testbed::cluster::{self, TestbedOptions};
use spark_deploy_testbed::hub_server::HubServer;

use crate::Config;
use crate::events;

/// A running testbed with its hub (serving the test-scale checkpoint on loopback) and the config
/// that deploys onto it. The hub stops with ``close()`` or when the object is collected.
#[pyclass(module = "spark_deploy", frozen)]
pub(crate) struct Testbed {
    hub: Mutex<Option<HubServer>>,
    config: DeploymentConfig,
    state_dir: PathBuf,
}

#[pymethods]
impl Testbed {
    /// The deployment config targeting this testbed (stand-in engine, testbed hub).
    #[getter]
    fn config(&self) -> Config {
        Config {
            inner: self.config.clone(),
        }
    }

    /// The testbed's state directory (keys, ``testbed.json``, worker disks).
    #[getter]
    fn state_dir(&self) -> PathBuf {
        self.state_dir.clone()
    }

    /// Stops the hub (the testbed's containers stay; ``testbed_down()`` removes them).
    fn close(&self) {
        if let Some(hub) = self
            .hub
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            hub.stop();
        }
    }

    fn __repr__(&self) -> String {
        format!("Testbed(state_dir={:?})", self.state_dir)
    }
}

/// Brings the testbed up (two Sparks on this machine: a worker container over SSH, a fabric
/// network; four with ``workers=3``, whose config then takes the TP=4 profile), generates the
/// test-scale checkpoint and starts its hub, installs the stand-in.
///
/// Needs root and a running Docker daemon. Replaces a testbed that is already up.
///
/// Args:
///     workers: worker nodes besides the head, 1 (default) or 3.
///
/// Returns:
///     A ``Testbed``; ``Deployment(testbed.config).up()`` deploys onto it.
///
/// Raises:
///     SparkDeployError: the failing part (daemon, image, keys, sshd, hub).
///     KeyboardInterrupt: on Ctrl-C (``testbed_down()`` removes a half-built testbed).
#[pyfunction]
#[pyo3(signature = (workers = 1))]
pub(crate) fn testbed_up(py: Python<'_>, workers: u8) -> PyResult<Testbed> {
    if workers != 1 && workers != 3 {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "workers = {workers}: 1 (two nodes, TP=2) or 3 (four nodes, the TP=4 profile)"
        )));
    }
    let home = crate::home();
    let (hub, config, state_dir) = events::block(py, async move {
        let opts = TestbedOptions {
            workers,
            ..TestbedOptions::default()
        };
        let info = cluster::up(&opts).await?;
        let (hub, config) = spark_deploy_testbed::demo::prepare(&info, &home).await?;
        Ok((hub, config, info.state_dir))
    })?;
    Ok(Testbed {
        hub: Mutex::new(Some(hub)),
        config,
        state_dir,
    })
}

/// Removes everything the testbed created (found by label) and its state directory; the rootfs
/// cache stays. Idempotent.
///
/// Returns:
///     Whether the state directory existed and was removed.
///
/// Raises:
///     SparkDeployError: the daemon is unreachable or a removal failed.
#[pyfunction]
pub(crate) fn testbed_down(py: Python<'_>) -> PyResult<bool> {
    events::block(py, async move {
        let r = cluster::down(&TestbedOptions::default()).await?;
        Ok(r.state_dir_removed)
    })
}
