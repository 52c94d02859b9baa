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

/// A testbed that is up is reused only with the number of workers asked for: another count is
/// refused (it may carry someone's deployment, so it is never replaced from here).
///
/// # Errors
///
/// [`TestbedError::Options`] naming both counts and the remedy.
pub fn check_workers(info: &TestbedInfo, opts: &TestbedOptions) -> Result<(), TestbedError> {
    let up = info.workers.len();
    if up == usize::from(opts.workers) {
        return Ok(());
    }
    Err(TestbedError::Options(format!(
        "a testbed with {up} worker(s) is up in {} and {} were asked for; it may serve a deployment, so it is not replaced: `spark-deploy testbed down` first (after `spark-deploy --config {} down` if something runs on it), or ask for {up}",
        opts.state_dir.display(),
        opts.workers,
        opts.state_dir.join("spark-deploy.toml").display()
    )))
}

/// Reuses the testbed that is up, else brings one up ([`cluster::up`], which replaces only a
/// dead or half-built one).
///
/// # Errors
///
/// As [`cluster::up`].
pub async fn up_or_reuse(opts: &TestbedOptions) -> Result<Acquired, TestbedError> {
    if let Some(info) = running(opts).await {
        check_workers(&info, opts)?;
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
