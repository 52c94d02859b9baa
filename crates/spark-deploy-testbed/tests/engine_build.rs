//! BuildImage builds the engine on the testbed, for real: a local git repository holds the C engine
//! (`spark_deploy_testbed::engine_build`) and a patch series; the TensorFold profile's build
//! command runs in a throwaway container of the build base (tcc compiles, the `zig` front end
//! accepts only the profile's command) and the pair deployed from the built binaries serves
//! through the stand-in to a passing Smoke. Then: a re-run builds nothing (0 s of build); a changed
//! patch rebuilds, changes the content label and re-ships the image and the binaries to the
//! worker; a patch that does not apply is named with its file and hunk; a failing build keeps its
//! log and names it.

// An integration test: a failed unwrap or expect is the test failure, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use spark_deploy_core::config::{ValidatedConfig, validate};
use spark_deploy_core::engine::Engine;
use spark_deploy_core::engine::tensorfold::TensorfoldDsv41;
use spark_deploy_core::event::{Event, Recorder};
use spark_deploy_core::layout::NodeLayout;
use spark_deploy_core::plan::{Plan, StepKind};
use spark_deploy_core::ports::docker::DockerNode;
use spark_deploy_core::run::{Context, RunError, RunReport, StepStatus};
use spark_deploy_testbed::cluster::TestbedInfo;
use spark_deploy_testbed::engine_build::{self, EngineRepo, engine_source, mark_bytes};

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

fn contains(bytes: &[u8], needle: &str) -> bool {
    bytes.windows(needle.len()).any(|w| w == needle.as_bytes())
}

async fn run_steps(
    v: &ValidatedConfig,
    kinds: Option<&[StepKind]>,
) -> (Result<RunReport, RunError>, Recorder) {
    let steps = Plan::standard(v)
        .steps()
        .iter()
        .filter(|s| kinds.is_none_or(|k| k.contains(&s.kind())))
        .cloned()
        .collect();
    let rec = Recorder::default();
    let r = Plan::from_steps(v, steps)
        .run(&Context::new(v.clone(), Arc::new(rec.clone())))
        .await;
    (r, rec)
}

const IMAGE_ONLY: &[StepKind] = &[StepKind::Preflight, StepKind::BuildImage];

fn failure_text(e: &RunError) -> String {
    format!(
        "{e}\nremedy: {}",
        e.failure.remedy.clone().unwrap_or_default()
    )
}

async fn scenario(info: &TestbedInfo, home: &Path) -> R<()> {
    let (hub, mut config) = spark_deploy_testbed::demo::prepare(info, home).await?;
    let head = DockerNode::connect("head", &spark_deploy_core::ports::NodeTarget::Local).await?;
    let standin = spark_deploy_testbed::standin::locate_binary().ok_or("tf-standin not built")?;
    let recipe = TensorfoldDsv41::TP2
        .build_recipe(&validate(config.clone(), home)?)
        .ok_or("the profile has a build")?;
    let t = Instant::now();
    engine_build::build_base(&head, &info.image, &standin, &recipe).await?;
    eprintln!("build base image: {:.1} s", t.elapsed().as_secs_f64());

    // The engine's repository and its patch series (the second depends on the first).
    let repo = EngineRepo::create(&info.state_dir.join("engine-src"))?;
    let pdir = info.state_dir.join("engine-patches");
    std::fs::create_dir_all(&pdir)?;
    let p1 = repo.write_patch(
        &pdir.join("0001-mark.patch"),
        &engine_source("base"),
        &engine_source("patch-1"),
    )?;
    let p2 = repo.write_patch(
        &pdir.join("0002-mark.patch"),
        &engine_source("patch-1"),
        &engine_source("patch-2"),
    )?;
    config.engine.repo = repo.dir.display().to_string();
    config.engine.commit.clone_from(&repo.commit);
    config.engine.base_image = engine_build::BUILD_BASE.to_owned();
    config.engine.patches = vec![p1.display().to_string(), p2.display().to_string()];
    let v = validate(config.clone(), home)?;
    let head_layout = NodeLayout::of(&v, &v.config().nodes[0]);
    let worker_layout = NodeLayout::of(&v, &v.config().nodes[1]);
    let worker = DockerNode::connect(
        &v.config().nodes[1].name,
        &spark_deploy_core::run::node_target(&v.config().nodes[1], home),
    )
    .await?;
    let engine_dir = Path::new(&head_layout.engine_dir);
    let worker_dir = Path::new(&worker_layout.engine_dir);
    let _ = std::fs::remove_dir_all(engine_dir);

    // 1. A clean build, and the pair deployed from it serves (Smoke passes through the stand-in).
    let t = Instant::now();
    let (r, rec) = run_steps(&v, None).await;
    let report = r.map_err(|e| failure_text(&e))?;
    let cold = t.elapsed().as_secs_f64();
    assert!(
        report.steps.iter().all(|s| s.status == StepStatus::Ran),
        "{report:?}"
    );
    let lines = logs(&rec);
    let built = lines
        .iter()
        .find(|l| l.starts_with("engine built in "))
        .ok_or_else(|| format!("no build line: {lines:#?}"))?;
    for expected in [
        "zig (testbed): building in /src for /out",
        "tcc: src/engine.c -> /out/bin/tensorfold-native",
        "applied ",
    ] {
        assert!(
            lines.iter().any(|l| l.contains(expected)),
            "the build's output streams as log events: {expected:?} in {lines:#?}"
        );
    }
    let bin = std::fs::read(engine_dir.join("tensorfold-native"))?;
    assert!(
        contains(&bin, &mark_bytes("patch-2")),
        "both patches, in order"
    );
    assert!(!contains(&bin, &mark_bytes("base")));
    let sha = |p: &Path| spark_deploy_core::digest::sha256_file(p).unwrap();
    for b in ["tensorfold-native", "tf-dsv41-lanes"] {
        assert_eq!(sha(&engine_dir.join(b)), sha(&worker_dir.join(b)), "{b}");
    }
    let c1 = label(&head, &head_layout.image).await?.ok_or("label")?;
    let build_s: f64 = built
        .trim_start_matches("engine built in ")
        .split(' ')
        .next()
        .ok_or("seconds")?
        .parse()?;
    eprintln!("{built}; clean up (build + deploy to Smoke): {cold:.1} s");

    // 2. A re-run builds nothing.
    let t = Instant::now();
    let (r, rec) = run_steps(&v, Some(IMAGE_ONLY)).await;
    let report = r.map_err(|e| failure_text(&e))?;
    let cached_s = t.elapsed().as_secs_f64();
    assert_eq!(report.steps[1].status, StepStatus::Skipped, "{report:?}");
    let detail = report.steps[1].detail.clone().unwrap_or_default();
    assert!(detail.contains("0 s of build"), "{detail}");
    let lines = logs(&rec);
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("engine build cached (key ") && l.ends_with("0 s of build")),
        "{lines:#?}"
    );
    assert!(!lines.iter().any(|l| l.starts_with("tcc: ")), "{lines:#?}");
    eprintln!(
        "engine build: cold {build_s:.1} s of build; cached re-run (Preflight + BuildImage) {cached_s:.1} s, 0 s of build"
    );

    // 3. A changed patch rebuilds; the content label changes; the worker gets the new image and
    //    binaries.
    repo.write_patch(&p2, &engine_source("patch-1"), &engine_source("patch-2b"))?;
    let (r, rec) = run_steps(&v, Some(IMAGE_ONLY)).await;
    let report = r.map_err(|e| failure_text(&e))?;
    assert_eq!(report.steps[1].status, StepStatus::Ran, "{report:?}");
    let lines = logs(&rec);
    assert!(
        lines.iter().any(|l| l.starts_with("engine built in ")),
        "{lines:#?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with(&format!("image {} shipped: ", worker_layout.image))),
        "{lines:#?}"
    );
    let c2 = label(&head, &head_layout.image).await?.ok_or("label")?;
    assert_ne!(c1, c2, "the content label covers the binaries");
    assert_eq!(
        label(&worker, &worker_layout.image).await?.as_deref(),
        Some(c2.as_str())
    );
    let wbin = std::fs::read(worker_dir.join("tf-dsv41-lanes"))?;
    assert!(contains(&wbin, &mark_bytes("patch-2b")));

    // 4. A patch that does not apply is named, with its hunk.
    let stale = repo.write_patch(
        &pdir.join("0003-stale.patch"),
        &engine_source("somewhere-else"),
        &engine_source("never"),
    )?;
    let mut bad = config.clone();
    bad.engine.patches.push(stale.display().to_string());
    let (r, _) = run_steps(&validate(bad, home)?, Some(IMAGE_ONLY)).await;
    let e = r.expect_err("a stale patch");
    let text = failure_text(&e);
    eprintln!("{text}");
    assert!(
        text.contains("0003-stale.patch")
            && text.contains("engine.patches[2]")
            && text.contains("hunk #1 for src/engine.c")
            && text.contains("patch does not apply"),
        "{text}"
    );
    assert!(text.contains("git apply --check"), "{text}");

    // 5. A build that fails keeps its log and says where.
    let broken = repo.write_patch(
        &pdir.join("0003-break.patch"),
        &engine_source("patch-2b"),
        &format!(
            "{}\n#error the testbed's broken engine\n",
            engine_source("patch-2b")
        ),
    )?;
    let mut bad = config.clone();
    bad.engine.patches.push(broken.display().to_string());
    let (r, _) = run_steps(&validate(bad, home)?, Some(IMAGE_ONLY)).await;
    let e = r.expect_err("a broken build");
    let text = failure_text(&e);
    eprintln!("{text}");
    let log = text
        .split("its log is kept at ")
        .nth(1)
        .and_then(|s| s.split(';').next())
        .ok_or_else(|| format!("no log path: {text}"))?;
    let kept = std::fs::read_to_string(log)?;
    assert!(kept.contains("the testbed's broken engine"), "{kept}");
    assert!(
        text.contains("the testbed's broken engine"),
        "the tail: {text}"
    );
    assert!(
        text.contains(&format!("read the build log {log}")),
        "{text}"
    );
    // The pair still runs the last good build.
    assert!(contains(
        &std::fs::read(engine_dir.join("tensorfold-native"))?,
        &mark_bytes("patch-2b")
    ));
    drop(hub);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn testbed_engine_build_from_a_repo_with_patches() {
    common::testbed::on_testbed(|info, home| async move { scenario(&info, &home).await }).await;
}
