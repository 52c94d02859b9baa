//! `bench-storage` on a testbed someone else brought up: reused and left up, only the
//! benchmark's own files removed. Brings the testbed up: run under the testbed lock.

// An integration test: a failed unwrap or expect is the test failure, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(clippy::print_stdout)]

use std::process::Command;

use spark_deploy_testbed::cluster::{self, TestbedInfo, TestbedOptions};

fn worker_state(name: &str) -> String {
    let o = Command::new("docker")
        .args(["inspect", "-f", "{{.Id}} {{.State.Running}}", name])
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout).trim().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn testbed_bench_storage_leaves_a_testbed_it_did_not_create_up() {
    let opts = TestbedOptions {
        install_tools: true,
        ..TestbedOptions::default()
    };
    let info = cluster::up(&opts).await.unwrap();
    let scenario = async {
        let worker = info.worker().container.clone();
        let before = worker_state(&worker);
        assert!(before.ends_with(" true"), "{before}");
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_bench-storage"))
            .env("BENCH_CHECKPOINT", "small")
            .output()
            .await
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        // Whether the benchmark itself completes here (it needs rsync) does not matter: the
        // testbed it found must be left as it was.
        println!(
            "bench-storage exit {:?}\n{stdout}\n{stderr}",
            out.status.code()
        );
        assert!(
            stdout.contains("reusing the testbed that is up"),
            "{stdout}{stderr}"
        );
        assert_eq!(worker_state(&worker), before, "the worker was not replaced");
        let still = TestbedInfo::load(&opts.state_dir).expect("the testbed's state is kept");
        assert_eq!(still.worker().container, worker);
        for d in ["bench-src", "bench-hf", "bench-39"] {
            assert!(!info.state_dir.join(d).exists(), "{d} removed");
        }
        for d in [
            "bench-ours",
            "bench-rsync",
            "bench-cp",
            "bench-disk",
            "bench-39",
        ] {
            assert!(
                !info.worker().disk_dir.join(d).exists(),
                "worker {d} removed"
            );
        }
    };
    let result = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(scenario)).await;
    cluster::down(&opts).await.unwrap();
    if let Err(p) = result {
        std::panic::resume_unwind(p);
    }
}
