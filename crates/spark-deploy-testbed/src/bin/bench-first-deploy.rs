//! Benchmark (not a test): the first deployment against the bare download, side by side in one
//! run on the testbed.
//!
//! The large test-scale checkpoint (about 2.6 GB of shards, plus the Engram tables and the kit) is
//! served by the testbed hub behind one link of `BENCH_LINK_MBPS` MB/s (default 75) shared by
//! every transfer, so the link, not the disk, is the bottleneck, as an Internet download is on a
//! Spark. Timed, each from empty caches:
//!
//! - (a) our fetch alone (the FetchCheckpoint step);
//! - (b) `up` to serving: fetch, rank files, worker copy, image, launch, smoke, with the
//!   preparation steps overlapped (`lifecycle.overlap = true`, the default);
//! - (c) the same `up` with the steps one after the other (`lifecycle.overlap = false`), for
//!   reference (`BENCH_SEQUENTIAL=0` skips it).
//!
//! It prints (b)'s timeline — when each file's download, each rank file's build and each
//! worker copy started and ended, from the run's own progress events — and draws it as a PNG
//! (`BENCH_CHART`, default `target/bench-first-deploy.png`), then (b)'s peak RSS (this process's
//! high-water mark, reset before the run: it includes the in-process hub), and last the ratio.
//!
//! `cargo run --release -p spark-deploy-testbed --bin bench-first-deploy` (needs root and
//! Docker; run under the testbed lock). `BENCH_TEXT_SHARDS` splits the checkpoint's text weights
//! into that many shards instead of the large checkpoint's 8 (the real checkpoint has 39): with
//! the fetch's 4 streams over one link, shards land in waves of 4, and the last wave's work (its
//! rank-file entries, their hashing, their copy) is the tail after the download. The generated
//! hub repositories are kept in `BENCH_REPOS` (default
//! `/var/tmp/spark-deploy-bench-first-deploy-<N>shards`) for the next run. A
//! testbed that is up is reused and left up; otherwise one is brought up and taken down.
#![allow(clippy::print_stdout)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use spark_deploy_core::config::{DeploymentConfig, ValidatedConfig, validate};
use spark_deploy_core::event::{Event, EventSink, Source, StepKind};
use spark_deploy_core::plan::{Plan, Step};
use spark_deploy_core::raster::Canvas;
use spark_deploy_core::run::Context;
use spark_deploy_core::steps::FetchCheckpoint;
use spark_deploy_testbed::checkpoint::CheckpointSpec;
use spark_deploy_testbed::cluster::{self, TestbedInfo, TestbedOptions};
use spark_deploy_testbed::demo;
use spark_deploy_testbed::hub_server::HubOptions;
use spark_deploy_testbed::reuse::{self, Origin};

type R<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Events with the time they arrived.
#[derive(Clone)]
struct Timed {
    start: Instant,
    events: Arc<Mutex<Vec<(f64, Event)>>>,
}

impl Timed {
    fn new() -> Self {
        Self {
            start: Instant::now(),
            events: Arc::default(),
        }
    }

    fn take(&self) -> Vec<(f64, Event)> {
        std::mem::take(
            &mut *self
                .events
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }
}

impl EventSink for Timed {
    fn emit(&self, event: Event) {
        let t = self.start.elapsed().as_secs_f64();
        self.events
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push((t, event));
    }
}

/// One bar of the timeline.
#[derive(Debug, Clone)]
struct Span {
    stage: &'static str,
    label: String,
    start: f64,
    end: f64,
}

fn stage_of(kind: StepKind) -> &'static str {
    match kind {
        StepKind::FetchCheckpoint => "download",
        StepKind::BuildRankCache => "build",
        StepKind::ConfigureWorkerStorage => "copy",
        StepKind::BuildImage => "image",
        StepKind::LaunchRank => "launch",
        StepKind::Smoke => "smoke",
        _ => "other",
    }
}

/// The steps' spans, then every file's (download, rank-file build, worker copy), from the events.
fn spans(events: &[(f64, Event)]) -> Vec<Span> {
    let mut steps: Vec<(StepKind, f64, Option<f64>)> = Vec::new();
    let mut files: BTreeMap<(&'static str, String), (f64, Option<f64>)> = BTreeMap::new();
    for (t, e) in events {
        match e {
            Event::Started {
                source: Source::Step(k),
                ..
            } => {
                steps.push((*k, *t, None));
            }
            Event::Finished {
                source: Source::Step(k),
                ..
            }
            | Event::Skipped {
                source: Source::Step(k),
                ..
            }
            | Event::Failed {
                source: Source::Step(k),
                ..
            } => {
                if let Some(s) = steps.iter_mut().rev().find(|s| s.0 == *k) {
                    s.2 = Some(*t);
                }
            }
            Event::Progress {
                source: Source::Step(k),
                node,
                label,
                bytes_done,
                bytes_total,
                file,
                ..
            } => {
                let (done, total) = file
                    .as_ref()
                    .map_or((*bytes_done, bytes_total.unwrap_or(0)), |f| {
                        (f.done, f.total)
                    });
                let name = match node {
                    Some(n) if *k == StepKind::ConfigureWorkerStorage => format!("{label} -> {n}"),
                    _ => label.clone(),
                };
                let entry = files.entry((stage_of(*k), name)).or_insert((*t, None));
                if done >= total && entry.1.is_none() {
                    entry.1 = Some(*t);
                }
            }
            _ => {}
        }
    }
    let mut out: Vec<Span> = steps
        .into_iter()
        .map(|(k, s, e)| Span {
            stage: stage_of(k),
            label: format!("step {}", k.title()),
            start: s,
            end: e.unwrap_or(s),
        })
        .collect();
    let mut by_file: Vec<Span> = files
        .into_iter()
        .map(|((stage, label), (s, e))| Span {
            stage,
            label,
            start: s,
            end: e.unwrap_or(s),
        })
        .collect();
    by_file.sort_by(|a, b| a.start.total_cmp(&b.start));
    out.extend(by_file);
    out
}

fn color(stage: &str) -> [u8; 3] {
    match stage {
        "download" => [66, 133, 244],
        "build" => [244, 160, 0],
        "copy" => [15, 157, 88],
        "image" => [150, 90, 200],
        "launch" | "smoke" => [120, 120, 120],
        _ => [200, 200, 200],
    }
}

/// The timeline as a PNG: one row per span, time across.
fn chart(spans: &[Span], total: f64, title: &str) -> Vec<u8> {
    let (left, row, top) = (300u32, 12u32, 40u32);
    let width = 1400u32;
    let height = top + row * u32::try_from(spans.len()).unwrap_or(0) + 40;
    let mut c = Canvas::filled(width, height, [255, 255, 255]);
    c.text(title, 10, 10, 2, [0, 0, 0]);
    let plot = f64::from(width - left - 20);
    let x = |t: f64| left + (t / total.max(1e-9) * plot) as u32;
    // A gridline every 10 s.
    let mut s = 0.0;
    while s <= total {
        c.rect(x(s), top - 4, 1, height - top - 30, [225, 225, 225]);
        c.text(&format!("{s:.0}s"), x(s), height - 24, 1, [80, 80, 80]);
        s += 10.0;
    }
    for (i, sp) in spans.iter().enumerate() {
        let y = top + row * u32::try_from(i).unwrap_or(0);
        let label: String = sp.label.chars().take(46).collect();
        c.text(&label, 4, y + 2, 1, [0, 0, 0]);
        let (x0, x1) = (x(sp.start), x(sp.end).max(x(sp.start) + 2));
        c.rect(x0, y + 1, x1 - x0, row - 3, color(sp.stage));
    }
    c.png()
}

/// Empty caches on the head and the worker, and a cold page cache: the next run starts empty.
fn empty_caches(v: &ValidatedConfig, info: &TestbedInfo) {
    spark_deploy_testbed::deployment::remove_deployment_files(v, info);
    let _ = std::process::Command::new("sync").status();
    let _ = fs_err::write("/proc/sys/vm/drop_caches", "1");
}

fn peak_rss_reset() {
    let _ = fs_err::write("/proc/self/clear_refs", "5");
}

fn peak_rss_mib() -> f64 {
    fs_err::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|k| k.parse::<f64>().ok())
            })
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

async fn down(v: &ValidatedConfig) {
    let ctx = Context::new(v.clone(), Arc::new(|_| {}));
    let _ = Plan::teardown(v).run(&ctx).await;
}

/// `up` from empty caches: its wall time and events.
async fn up(
    config: &DeploymentConfig,
    info: &TestbedInfo,
    home: &Path,
    overlap: bool,
) -> R<(f64, Vec<(f64, Event)>)> {
    let mut c = config.clone();
    c.lifecycle.overlap = overlap;
    let v = validate(c.clone(), home)?;
    down(&v).await;
    empty_caches(&v, info);
    let sink = Timed::new();
    let ctx = Context::new(v.clone(), Arc::new(sink.clone()));
    let t = Instant::now();
    let result = Plan::standard(&v).run(&ctx).await;
    let secs = t.elapsed().as_secs_f64();
    let events = sink.take();
    down(&v).await;
    result.map_err(|e| format!("up (overlap = {overlap}): {e}"))?;
    Ok((secs, events))
}

fn main() -> R<()> {
    // This executable is the engine stand-in too (installed under the engine's names, as the
    // `spark-deploy` binary is by `demo`), so the benchmark needs nothing else built.
    let argv0 = std::env::args_os().next().unwrap_or_default();
    let name = Path::new(&argv0)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if spark_deploy_testbed::standin::is_engine_name(&name) {
        std::process::exit(i32::from(spark_deploy_testbed::standin::run_process()));
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(run())
}

async fn run() -> R<()> {
    let opts = TestbedOptions {
        install_tools: true,
        ..TestbedOptions::default()
    };
    let testbed = reuse::up_or_reuse(&opts).await?;
    let result = bench(&testbed.info).await;
    if testbed.origin == Origin::Created {
        cluster::down(&opts).await?;
    }
    result
}

async fn bench(info: &TestbedInfo) -> R<()> {
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    let mbps: u64 = std::env::var("BENCH_LINK_MBPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(75);
    let mut spec = CheckpointSpec::large(5);
    if let Some(n) = std::env::var("BENCH_TEXT_SHARDS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        spec.text_shards = n;
    }
    let repos = std::env::var_os("BENCH_REPOS").map_or_else(
        || {
            PathBuf::from(format!(
                "/var/tmp/spark-deploy-bench-first-deploy-{}shards",
                spec.text_shards
            ))
        },
        PathBuf::from,
    );
    let r = repos.clone();
    tokio::task::spawn_blocking(move || demo::hub_tree_of(&r, &spec)).await??;
    let payload: u64 = [demo::MODEL, demo::ORIGINAL, demo::KIT]
        .iter()
        .map(|repo| {
            spark_deploy_core::transfer::expand(&repos.join(repo), Path::new("/x"))
                .map(|j| j.iter().map(|f| f.size).sum::<u64>())
                .unwrap_or(0)
        })
        .sum();
    let exe = std::env::current_exe()?;
    let (hub, config) = demo::prepare_on(
        info,
        &home,
        Some(&exe),
        &repos,
        HubOptions {
            link_rate: std::num::NonZeroU64::new(mbps * 1_000_000),
            ..HubOptions::default()
        },
    )
    .await?;
    println!(
        "payload: {:.2} GB from the hub over one {mbps} MB/s link (bare minimum {:.1} s); load {}",
        payload as f64 / 1e9,
        payload as f64 / (mbps as f64 * 1e6),
        fs_err::read_to_string("/proc/loadavg")?.trim()
    );

    // (a) Our fetch alone, into an empty cache.
    let v = validate(config.clone(), &home)?;
    down(&v).await;
    empty_caches(&v, info);
    let ctx = Context::new(v.clone(), Arc::new(|_| {}));
    hub.reset_link_idle();
    let t = Instant::now();
    Plan::from_steps(&v, vec![Step::FetchCheckpoint(FetchCheckpoint::new(&v))])
        .run(&ctx)
        .await
        .map_err(|e| format!("fetch: {e}"))?;
    let fetch = t.elapsed().as_secs_f64();
    let fetch_idle = hub.link_idle();
    println!(
        "(a) fetch alone           : {fetch:7.2} s  (link unused {:.2} s between its first and last byte)",
        fetch_idle.as_secs_f64()
    );

    // (b) `up` from empty caches, overlapped.
    peak_rss_reset();
    hub.reset_link_idle();
    let (overlapped, events) = up(&config, info, &home, true).await?;
    let rss = peak_rss_mib();
    let up_idle = hub.link_idle();
    let up_gaps = hub.link_gaps();
    println!(
        "(b) up, overlapped        : {overlapped:7.2} s  (link unused {:.2} s between its first and last byte)",
        up_idle.as_secs_f64()
    );

    // (c) for reference, one step after the other.
    if std::env::var("BENCH_SEQUENTIAL").as_deref() != Ok("0") {
        let (sequential, _) = up(&config, info, &home, false).await?;
        println!(
            "(c) up, one after another : {sequential:7.2} s  ((c)/(a) = {:.2}x)",
            sequential / fetch
        );
    }
    drop(hub);

    let spans = spans(&events);
    println!("timeline of (b), seconds from the start of `up`:");
    for s in &spans {
        println!(
            "  {:>8} {:7.2} {:7.2}  {}",
            s.stage, s.start, s.end, s.label
        );
    }
    // What serialises after the download: each stage's end, from the same spans.
    let end_of = |stage: &str, label: &str| {
        spans
            .iter()
            .filter(|s| s.stage == stage && s.label.contains(label))
            .map(|s| (s.start, s.end))
            .fold(None, |acc: Option<(f64, f64)>, (a, b)| {
                Some(acc.map_or((a, b), |(x, y)| (x.min(a), y.max(b))))
            })
    };
    let fetch_end = end_of("download", "step").map_or(0.0, |s| s.1);
    let ranks_final = end_of("build", "of").map_or(0.0, |s| s.1);
    let rank_copy = end_of("copy", ".bin").unwrap_or((0.0, 0.0));
    let copy_end = end_of("copy", "step").map_or(0.0, |s| s.1);
    let image_end = end_of("image", "step").map_or(0.0, |s| s.1);
    println!(
        "after the download ({fetch_end:.2} s): rank files final +{:.2} s, rank-file copy from +{:.2} to +{:.2} s, every copy done +{:.2} s, image +{:.2} s, serving +{:.2} s",
        ranks_final - fetch_end,
        rank_copy.0 - fetch_end,
        rank_copy.1 - fetch_end,
        copy_end - fetch_end,
        image_end - fetch_end,
        overlapped - fetch_end
    );
    println!(
        "link unused during (b), stretches of 20 ms or more (ending at, seconds from the start of `up`): {}",
        up_gaps
            .iter()
            .map(|(at, gap)| format!(
                "{:.2} ({:.0} ms)",
                at.as_secs_f64(),
                gap.as_secs_f64() * 1e3
            ))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let chart_path = std::env::var_os("BENCH_CHART").map_or_else(
        || PathBuf::from("target/bench-first-deploy.png"),
        PathBuf::from,
    );
    if let Some(dir) = chart_path.parent() {
        fs_err::create_dir_all(dir)?;
    }
    fs_err::write(
        &chart_path,
        chart(
            &spans,
            overlapped,
            &format!(
                "up from empty caches, {mbps} MB/s link: {overlapped:.1} s (fetch alone {fetch:.1} s)"
            ),
        ),
    )?;
    println!("chart: {}", chart_path.display());
    println!("peak RSS during (b): {rss:.0} MiB (limit 512; includes the in-process hub)");
    println!("first deploy / bare download = {:.2}x", overlapped / fetch);
    Ok(())
}
