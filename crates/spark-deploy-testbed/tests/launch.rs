//! LaunchRank and a follower that dies at once.
//!
//! The pair is deployed on the testbed by the standard plan with the stand-in's `follower_exits`
//! fault: rank 1 exits as soon as it starts, like an engine given an argument it refuses.
//! LaunchRank starts the followers, then rank 0 right after them, and looks at every follower
//! once it has run 500 ms: the run must fail at LaunchRank naming rank 1 with its log tail, and
//! no rank may be left running (rank 0, started meanwhile, is stopped too: both ranks or
//! neither).

// An integration test: a failed unwrap or expect is the test failure, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use spark_deploy_core::config::validate;
use spark_deploy_core::event::{Event, Recorder, Source, StepKind};
use spark_deploy_core::plan::Plan;
use spark_deploy_core::run::Context;

use common::testbed::{R, on_testbed_removing_ranks};

/// The names of the testbed deployment's running rank containers.
fn running_ranks() -> R<String> {
    let ps = std::process::Command::new("docker")
        .args([
            "ps",
            "-q",
            "--filter",
            "label=io.spark-deploy.deployment=sd-testbed",
        ])
        .output()?;
    Ok(String::from_utf8_lossy(&ps.stdout).trim().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn testbed_a_follower_that_exits_at_once_fails_the_launch_and_no_rank_runs() {
    on_testbed_removing_ranks(|info, home| async move {
        let (hub, mut config) = spark_deploy_testbed::demo::prepare(&info, &home).await?;
        config
            .engine
            .env
            .insert("TF_STANDIN_FAULT".into(), "follower_exits".into());
        let v = validate(config, &home)?;
        let rec = Recorder::default();
        let err = Plan::standard(&v)
            .run(&Context::new(v.clone(), Arc::new(rec.clone())))
            .await
            .expect_err("a follower that exits at once must fail the run");
        let failure = &err.failure;
        assert_eq!(failure.step, StepKind::LaunchRank, "{}", failure.chain());
        assert_eq!(failure.rank, Some(1), "{}", failure.chain());
        let chain = failure.chain();
        assert!(
            chain.contains("rank 1") && chain.contains("exited right after starting"),
            "{chain}"
        );
        assert!(
            chain.contains("follower_exits"),
            "the error carries the follower's log tail: {chain}"
        );
        // Rank 0 was started beside the follower's grace (not after it), then stopped.
        let started: Vec<String> = rec
            .events()
            .iter()
            .filter_map(|e| match e {
                Event::Log {
                    source: Source::Step(StepKind::LaunchRank),
                    line,
                    ..
                } if line.starts_with("starting rank") => Some(line.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(started.len(), 2, "{started:?}");
        assert!(started[0].starts_with("starting rank 1"), "{started:?}");
        assert!(started[1].starts_with("starting rank 0"), "{started:?}");
        assert_eq!(running_ranks()?, "", "no rank is left running");
        drop(hub);
        Ok(())
    })
    .await;
}
