//! Bringing the testbed up without tearing down one that is already up: its state loads and
//! every worker container runs, so someone (a demo deployment, another tool) may be using it. Such
//! a testbed is reused as it is, and left up by whoever reused it; only a testbed a tool created
//! is the tool's to take down.

use crate::cluster::{self, TestbedError, TestbedInfo, TestbedOptions};
use spark_deploy_core::ports::docker::DockerNode;

/// Whether the caller created the testbed or found it up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// It was up already: leave it up.
    Reused,
    /// The caller brought it up: the caller may take it down.
    Created,
}

/// The testbed to use, and whose it is.
#[derive(Debug, Clone)]
pub struct Acquired {
    /// What a deployment config needs.
    pub info: TestbedInfo,
    /// Whose it is.
    pub origin: Origin,
}

/// The testbed that is up now under `opts.state_dir`, if any: its state loads and every worker
/// container runs on this machine's daemon.
pub async fn running(opts: &TestbedOptions) -> Option<TestbedInfo> {
    let info = TestbedInfo::load(&opts.state_dir).ok()?;
    let docker = DockerNode::local("head", &opts.docker_socket).ok()?;
    for w in &info.workers {
        let c = docker.inspect_container(&w.container).await.ok()??;
        if !c.state.and_then(|s| s.running).unwrap_or(false) {
            return None;
        }
    }
    Some(info)
}

/// Reuses the testbed that is up, else brings one up ([`cluster::up`], which replaces only a
/// dead or half-built one).
///
/// # Errors
///
/// As [`cluster::up`].
pub async fn up_or_reuse(opts: &TestbedOptions) -> Result<Acquired, TestbedError> {
    if let Some(info) = running(opts).await {
        return Ok(Acquired {
            info,
            origin: Origin::Reused,
        });
    }
    Ok(Acquired {
        info: cluster::up(opts).await?,
        origin: Origin::Created,
    })
}
