//! NFS mode of ConfigureWorkerStorage on the testbed, as far as this machine allows: the head's
//! exports are checked as on a Spark (a real exports file on this machine), the volume is
//! created through the worker's SSH-forwarded Docker with the seed's options (checked by
//! inspecting it), an existing volume with other options is refused with the fix, and the mount —
//! which this kernel cannot do — fails at the throwaway container's start and is classified as
//! "NFS not available on this host". What is not exercised is printed with the test's output.

// An integration test: a failed unwrap or expect is the test failure, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use spark_deploy_core::config::{WorkerStorage, validate};
use spark_deploy_core::event::{Event, Recorder};
use spark_deploy_core::plan::{Plan, StepKind};
use spark_deploy_core::ports::docker::DockerNode;
use spark_deploy_core::run::Context;
use spark_deploy_testbed::cluster::TestbedInfo;

mod common;

use common::testbed::R;

const VOLUME: &str = "sd-testbed-nfs-hf";
/// The head's export of its cache to the worker, written by the test and removed after it.
const EXPORTS: &str = "/etc/exports.d/spark-deploy-testbed.exports";

async fn scenario(info: &TestbedInfo, home: &Path) -> R<()> {
    let (hub, mut config) = spark_deploy_testbed::demo::prepare(info, home).await?;
    config.deployment.worker_storage = WorkerStorage::Nfs;
    config.storage.nfs_volume = VOLUME.into();
    let v = validate(config, home)?;
    let head_cache = v.config().hub.cache.clone();
    let plan = || {
        let steps = Plan::standard(&v)
            .steps()
            .iter()
            .filter(|s| {
                [
                    StepKind::Preflight,
                    StepKind::FetchCheckpoint,
                    StepKind::BuildRankCache,
                    StepKind::ConfigureWorkerStorage,
                    StepKind::BuildImage,
                ]
                .contains(&s.kind())
            })
            .cloned()
            .collect();
        Plan::from_steps(&v, steps)
    };
    let worker = DockerNode::connect(&v.config().nodes[1].name, &{
        spark_deploy_core::run::node_target(&v.config().nodes[1], home)
    })
    .await?;
    let _ = worker.remove_volume(VOLUME).await;
    let worker_image = spark_deploy_core::layout::NodeLayout::of(&v, &v.config().nodes[1]).image;
    let _ = worker.remove_image(&worker_image).await;

    // 0. The head's exports are checked as on a Spark: without an export of the cache to the
    //    worker's fabric address, Preflight refuses, before anything is downloaded, with the
    //    exportfs line that fixes it (and creates nothing).
    let _ = std::fs::remove_file(EXPORTS);
    let err = plan()
        .run(&Context::new(v.clone(), Arc::new(Recorder::default())))
        .await
        .expect_err("the cache is not exported");
    assert_eq!(err.failure.step, StepKind::Preflight);
    let msg = err.to_string();
    assert!(msg.contains("sudo exportfs -ra"), "{msg}");
    assert!(
        worker.inspect_volume(VOLUME).await?.is_none(),
        "nothing created"
    );
    // The head exports its cache read-only to the worker: a real exports file on this machine,
    // read through the head's Exec port like on a Spark (removed at the end).
    std::fs::create_dir_all("/etc/exports.d")?;
    std::fs::write(
        EXPORTS,
        format!(
            "{head_cache} {}(ro,no_subtree_check)\n",
            info.workers[0].fabric_addr
        ),
    )?;

    // 1. The volume is created through the worker's Docker with the seed's options; the engine
    //    image is not on the worker yet, so BuildImage, once it shipped the image, mounts the
    //    volume in a probe container, whose start fails and is classified.
    let rec = Recorder::default();
    let err = plan()
        .run(&Context::new(v.clone(), Arc::new(rec.clone())))
        .await
        .expect_err("this kernel cannot mount NFS");
    assert_eq!(err.failure.step, StepKind::BuildImage);
    let msg = err.to_string();
    assert!(msg.contains("NFS not available on this host"), "{msg}");
    assert!(msg.contains("worker_storage = \"copy\""), "{msg}");
    #[allow(clippy::print_stderr)]
    {
        eprintln!("the mount failure as classified: {msg}");
    }
    let vol = worker
        .inspect_volume(VOLUME)
        .await?
        .ok_or("volume not created")?;
    let want: HashMap<String, String> = HashMap::from([
        ("type".into(), "nfs".into()),
        ("device".into(), format!(":{head_cache}")),
        (
            "o".into(),
            format!(
                "addr={},nfsvers=4.2,ro,nconnect=8,rsize=1048576,wsize=1048576,hard,timeo=600",
                info.head_fabric_addr
            ),
        ),
    ]);
    assert_eq!(vol.driver, "local");
    assert_eq!(vol.options, want);
    assert_eq!(
        vol.labels
            .get("io.spark-deploy.deployment")
            .map(String::as_str),
        Some("sd-testbed")
    );
    let logs: Vec<String> = rec
        .events()
        .iter()
        .filter_map(|e| match e {
            Event::Log { line, .. } => Some(line.clone()),
            _ => None,
        })
        .collect();
    assert!(
        logs.iter()
            .any(|l| l.contains("created through worker-1's Docker")),
        "{logs:#?}"
    );
    // No probe container is left behind.
    assert!(
        worker
            .inspect_container(&format!("{VOLUME}-nfs-check"))
            .await?
            .is_none()
    );

    // 2. A re-run accepts the volume as it is (same device and server) and fails the same way.
    let err = plan()
        .run(&Context::new(v.clone(), Arc::new(Recorder::default())))
        .await
        .expect_err("still no NFS");
    assert!(
        err.to_string().contains("NFS not available on this host"),
        "{err}"
    );

    // 3. A volume of that name with other options is refused with the fix.
    worker.remove_volume(VOLUME).await?;
    worker
        .create_volume(
            VOLUME,
            "local",
            &[
                ("type".to_owned(), "nfs".to_owned()),
                ("device".to_owned(), ":/elsewhere".to_owned()),
                ("o".to_owned(), "addr=192.0.2.9,ro".to_owned()),
            ]
            .into(),
            &Default::default(),
        )
        .await?;
    let err = plan()
        .run(&Context::new(v.clone(), Arc::new(Recorder::default())))
        .await
        .expect_err("conflicting volume");
    let msg = err.to_string();
    assert!(msg.contains(&format!("docker volume rm {VOLUME}")), "{msg}");
    worker.remove_volume(VOLUME).await?;

    #[allow(clippy::print_stderr)]
    {
        eprintln!(
            "NFS mode on this machine: the volume was created and inspected through the worker's \
             SSH-forwarded Docker, and the mount failure was classified. NOT exercised here: the \
             head's export check against a real /etc/exports (no NFS server; parser unit-tested), \
             an actual NFS mount, and the file-by-file comparison of the mounted snapshot (the \
             kernel has no NFS client; the worker shares the head's Docker daemon)."
        );
    }
    drop(hub);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn testbed_nfs_mode_creates_the_volume_through_the_workers_docker() {
    common::testbed::on_testbed(|info, home| async move {
        let r = scenario(&info, &home).await;
        let _ = std::fs::remove_file(EXPORTS);
        r
    })
    .await;
}
