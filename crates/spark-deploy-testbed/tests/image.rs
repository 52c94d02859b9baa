//! BuildImage on the testbed: the stand-in engine image is built on the head from the context the
//! tool generates (FROM the stand-in base, with a patch file), identified by its content label,
//! and shipped to the worker through the worker's SSH-forwarded Docker under the worker's own tag
//! (the testbed's worker shares the head's daemon, so only that shipment can create the tag); a
//! re-run changes nothing; a changed patch file changes the label, rebuilds and re-ships.

// An integration test: a failed unwrap or expect is the test failure, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;

use spark_deploy_core::config::validate;
use spark_deploy_core::event::{Event, Recorder};
use spark_deploy_core::layout::NodeLayout;
use spark_deploy_core::plan::{Plan, StepKind};
use spark_deploy_core::ports::docker::DockerNode;
use spark_deploy_core::run::Context;
use spark_deploy_core::run::StepStatus;
use spark_deploy_testbed::cluster::TestbedInfo;

mod common;

use common::testbed::R;

const CONTENT: &str = "io.spark-deploy.content";

async fn label(d: &DockerNode, image: &str) -> R<Option<String>> {
    Ok(d.inspect_image(image)
        .await?
        .and_then(|i| i.config)
        .and_then(|c| c.labels)
        .and_then(|l| l.get(CONTENT).cloned()))
}

fn logs(rec: &Recorder) -> Vec<String> {
    rec.events()
        .iter()
        .filter_map(|e| match e {
            Event::Log { line, .. } => Some(line.clone()),
            _ => None,
        })
        .collect()
}

async fn scenario(info: &TestbedInfo, home: &Path) -> R<()> {
    let (hub, mut config) = spark_deploy_testbed::demo::prepare(info, home).await?;
    let patch = info.state_dir.join("engine-fix.patch");
    std::fs::write(
        &patch,
        "--- a/zig/src/x.zig\n+++ b/zig/src/x.zig\n@@ -1 +1 @@\n-a\n+b\n",
    )?;
    config.engine.patches = vec![patch.display().to_string()];
    let v = validate(config, home)?;
    let head_image = NodeLayout::of(&v, &v.config().nodes[0]).image;
    let worker_image = NodeLayout::of(&v, &v.config().nodes[1]).image;
    assert_ne!(
        head_image, worker_image,
        "the testbed worker gets its own tag"
    );
    let head = DockerNode::connect("head", &spark_deploy_core::ports::NodeTarget::Local).await?;
    let worker = DockerNode::connect(
        &v.config().nodes[1].name,
        &spark_deploy_core::run::node_target(&v.config().nodes[1], home),
    )
    .await?;
    for image in [&head_image, &worker_image] {
        let _ = head.remove_image(image).await;
    }
    let run = |v: spark_deploy_core::config::ValidatedConfig| async move {
        let steps = Plan::standard(&v)
            .steps()
            .iter()
            .filter(|s| [StepKind::Preflight, StepKind::BuildImage].contains(&s.kind()))
            .cloned()
            .collect();
        let rec = Recorder::default();
        let report = Plan::from_steps(&v, steps)
            .run(&Context::new(v.clone(), Arc::new(rec.clone())))
            .await?;
        R::Ok((report, rec))
    };

    // 1. Built on the head, shipped to the worker under its own tag through its Docker.
    let (report, rec) = run(v.clone()).await?;
    assert_eq!(report.steps[1].status, StepStatus::Ran, "{report:?}");
    let c1 = label(&head, &head_image)
        .await?
        .ok_or("head image has no content label")?;
    assert_eq!(
        label(&worker, &worker_image).await?.as_deref(),
        Some(c1.as_str())
    );
    let lines = logs(&rec);
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with(&format!("building {head_image} FROM"))),
        "{lines:#?}"
    );
    let shipped = lines
        .iter()
        .find(|l| l.starts_with(&format!("image {worker_image} shipped: ")))
        .ok_or_else(|| format!("no shipment line: {lines:#?}"))?;
    let bytes: u64 = shipped.split_whitespace().nth(3).ok_or("bytes")?.parse()?;
    assert!(bytes > 1 << 20, "{shipped}");
    assert!(
        shipped.contains("(SSH tunnel to "),
        "the bytes went through the worker's SSH: {shipped}"
    );
    #[allow(clippy::print_stderr)]
    {
        eprintln!("{shipped}");
    }
    // The patch is in the image, in the order given.
    let patched = head.inspect_image(&head_image).await?.ok_or("head image")?;
    assert_eq!(
        patched
            .config
            .and_then(|c| c.labels)
            .and_then(|l| l.get("io.spark-deploy.engine-commit").cloned()),
        Some(v.config().engine.commit.clone())
    );

    // 2. A re-run builds and ships nothing.
    let (report, _) = run(v.clone()).await?;
    assert_eq!(report.steps[1].status, StepStatus::Skipped, "{report:?}");

    // 3. A changed patch file changes the label: rebuilt on the head, re-shipped to the worker.
    std::fs::write(
        &patch,
        "--- a/zig/src/x.zig\n+++ b/zig/src/x.zig\n@@ -1 +1 @@\n-a\n+c\n",
    )?;
    let (report, rec) = run(v.clone()).await?;
    assert_eq!(report.steps[1].status, StepStatus::Ran, "{report:?}");
    let c2 = label(&head, &head_image).await?.ok_or("label")?;
    assert_ne!(c1, c2);
    assert_eq!(
        label(&worker, &worker_image).await?.as_deref(),
        Some(c2.as_str())
    );
    let lines = logs(&rec);
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with(&format!("image {worker_image} shipped: "))),
        "{lines:#?}"
    );

    // 4. A missing patch file is named with the field.
    std::fs::remove_file(&patch)?;
    let err = run(v.clone()).await.expect_err("missing patch").to_string();
    assert!(
        err.contains("engine.patches") && err.contains("engine-fix.patch"),
        "{err}"
    );
    drop(hub);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn testbed_image_is_built_by_content_and_shipped_through_the_workers_ssh() {
    common::testbed::on_testbed(|info, home| async move { scenario(&info, &home).await }).await;
}
