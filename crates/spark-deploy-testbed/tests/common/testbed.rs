//! Running one scenario on the testbed: bring it up (with the tools the tests use), run, and tear
//! it down whatever happened; the scenario's error is reported after the teardown.

use std::future::Future;
use std::path::PathBuf;

use spark_deploy_testbed::cluster::{self, TestbedInfo, TestbedOptions};

pub type R<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Runs `scenario(info, home)` on a fresh testbed (one worker), then `cluster::down`; panics
/// with the first error.
pub async fn on_testbed<F, Fut>(scenario: F)
where
    F: FnOnce(TestbedInfo, PathBuf) -> Fut,
    Fut: Future<Output = R<()>>,
{
    on_testbed_with(1, scenario).await;
}

/// [`on_testbed`] with `workers` workers.
pub async fn on_testbed_with<F, Fut>(workers: u8, scenario: F)
where
    F: FnOnce(TestbedInfo, PathBuf) -> Fut,
    Fut: Future<Output = R<()>>,
{
    let opts = TestbedOptions {
        install_tools: true,
        workers,
        ..TestbedOptions::default()
    };
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    let result = async {
        let info = cluster::up(&opts).await?;
        scenario(info, home).await
    }
    .await;
    let down = cluster::down(&opts).await;
    result.unwrap();
    down.unwrap();
}

/// Each plan step's outcome in `events`: `ran`, `skipped` or `failed`, in order.
pub fn steps(
    events: &[spark_deploy_core::event::Event],
) -> Vec<(spark_deploy_core::event::StepKind, &'static str)> {
    use spark_deploy_core::event::{Event, Source};
    events
        .iter()
        .filter_map(|e| match e {
            Event::Finished {
                source: Source::Step(step),
                ..
            } => Some((*step, "ran")),
            Event::Skipped {
                source: Source::Step(step),
                ..
            } => Some((*step, "skipped")),
            Event::Failed {
                source: Source::Step(step),
                ..
            } => Some((*step, "failed")),
            _ => None,
        })
        .collect()
}

/// Whether any container of the testbed deployment (`sd-testbed`) exists, running or not.
pub fn any_rank_container() -> R<bool> {
    let ps = std::process::Command::new("docker")
        .args([
            "ps",
            "-aq",
            "--filter",
            "label=io.spark-deploy.deployment=sd-testbed",
        ])
        .output()?;
    Ok(!ps.stdout.is_empty())
}

/// [`on_testbed`] for a scenario that starts ranks: whether it returns or panics, rank containers
/// it left behind are removed before the testbed comes down; then its panic, if any, resumes.
pub async fn on_testbed_removing_ranks<F, Fut>(scenario: F)
where
    F: FnOnce(TestbedInfo, PathBuf) -> Fut,
    Fut: Future<Output = R<()>>,
{
    on_testbed(|info, home| async move {
        let r =
            futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(scenario(info, home)))
                .await;
        if any_rank_container().unwrap_or(false) {
            let _ = std::process::Command::new("docker")
                .args(["rm", "-f", "sd-testbed-rank0", "sd-testbed-rank1"])
                .output();
        }
        match r {
            Ok(r) => r,
            Err(p) => std::panic::resume_unwind(p),
        }
    })
    .await;
}
