//! The whole deployment on the testbed: `Plan::standard` run for real — preflight over SSH,
//! fetch from the HF-compatible hub, rank files built natively, the worker's inputs pulled over
//! the fabric, both stand-in ranks launched through the Docker ports (rank 1 through the worker's
//! SSH), smoke, a chat completion with the split proof, teardown with saved logs, an up-to-date
//! re-run that skips, and both-ranks-or-neither when rank 1 dies.

// An integration test: a failed unwrap or expect is the test failure, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use spark_deploy_core::config::validate;
use spark_deploy_core::event::{Event, Recorder, Source};
use spark_deploy_core::plan::{Plan, StepKind};
use spark_deploy_core::preflight::report::{Check, Verdict};
use spark_deploy_core::run::Context;
use spark_deploy_core::run::StepStatus;
use spark_deploy_testbed::cluster::{self, TestbedOptions};

mod common;

use common::testbed::{any_rank_container, steps};

type R<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn options() -> TestbedOptions {
    TestbedOptions {
        install_tools: true,
        ..TestbedOptions::default()
    }
}

async fn chat(key: &str) -> R<serde_json::Value> {
    let r = reqwest::Client::new()
        .post("http://127.0.0.1:8888/v1/chat/completions")
        .bearer_auth(key)
        .json(&serde_json::json!({"model": "DeepSeek-V4.1-Flash-1017", "messages": [{"role": "user", "content": "What is 12*12?"}], "chat_template_kwargs": {"enable_thinking": false}}))
        .send()
        .await?;
    Ok(serde_json::from_str(&r.text().await?)?)
}

/// Rank 1's opened files, mapped from container paths to the worker's paths through its mounts,
/// against the files ConfigureWorkerStorage shipped to the worker.
async fn opened_is_shipped(ctx: &Context, v: &spark_deploy_core::config::ValidatedConfig) -> R<()> {
    let engine = spark_deploy_core::engine::for_config(v);
    let specs = engine.rank_containers(v, &ctx.facts());
    let rank1 = specs.iter().find(|s| s.rank == 1).ok_or("no rank 1 spec")?;
    let log = ctx.log_tail(1, &rank1.name, 400).await;
    let line = log
        .lines()
        .find(|l| l.contains("\"opened\""))
        .ok_or_else(|| format!("rank 1 printed no opened list: {log}"))?;
    let loaded: serde_json::Value = serde_json::from_str(line.trim())?;
    let opened: std::collections::BTreeSet<PathBuf> = loaded["opened"]
        .as_array()
        .ok_or("opened is not a list")?
        .iter()
        .filter_map(|p| p.as_str())
        .map(|p| {
            let m = rank1
                .mounts
                .iter()
                .filter(|m| p.starts_with(&m.target))
                .max_by_key(|m| m.target.len())
                .ok_or_else(|| format!("{p} is on no mount of rank 1"))?;
            Ok(PathBuf::from(format!(
                "{}{}",
                m.source,
                &p[m.target.len()..]
            )))
        })
        .collect::<Result<_, String>>()?;
    let shipped: std::collections::BTreeSet<PathBuf> = engine
        .worker_jobs(ctx, 1)
        .await?
        .into_iter()
        .map(|j| j.to)
        .collect();
    let missing: Vec<_> = opened.difference(&shipped).collect();
    assert!(
        missing.is_empty(),
        "rank 1 opened files that were not shipped: {missing:?}"
    );
    // In doubt, so shipped: the chat template and the index (small), the kit's rope.json (the
    // tables' metadata) and the vision tower's cubin; spark-deploy reads the kit's MANIFEST on the
    // worker for the fingerprint.
    let in_doubt = [
        "tokenizer_config.json",
        "model.safetensors.index.json",
        "rope.json",
        "torch_fmha_sm120.cubin",
        "MANIFEST",
    ];
    let extra: Vec<_> = shipped
        .difference(&opened)
        .filter(|p| {
            !p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| in_doubt.contains(&n))
        })
        .collect();
    assert!(
        extra.is_empty(),
        "shipped to the worker but never read by rank 1: {extra:?}"
    );
    assert!(
        !shipped
            .iter()
            .any(|p| p.extension().is_some_and(|e| e == "safetensors")
                && p.to_string_lossy().contains("/hub/")),
        "a checkpoint shard was shipped: {shipped:?}"
    );
    Ok(())
}

async fn scenario(info: &cluster::TestbedInfo, home: &Path) -> R<()> {
    // The link paced so that the fetch takes about 3 s: the rank files' first bytes are written
    // from the first verified shard while later files still download (unpaced, the small
    // checkpoint lands before the build has polled for its first shard).
    let (hub, config) =
        spark_deploy_testbed::demo::prepare_paced(info, home, Duration::from_secs(3)).await?;
    let v = validate(config, home)?;

    // 1. The whole standard plan.
    let rec = Recorder::default();
    let ctx = Context::new(v.clone(), Arc::new(rec.clone()));
    let report = Plan::standard(&v).run(&ctx).await.map_err(|e| {
        format!(
            "{e}\n{:#?}",
            rec.events().iter().rev().take(12).collect::<Vec<_>>()
        )
    })?;
    assert_eq!(
        report
            .steps
            .iter()
            .filter(|s| s.status == StepStatus::Failed)
            .count(),
        0
    );
    let ev = rec.events();
    assert!(
        ev.iter().any(|e| matches!(
            e,
            Event::Progress {
                source: Source::Step(StepKind::FetchCheckpoint),
                ..
            }
        )),
        "fetch progress events"
    );
    // Every moving stage reports bytes done of total with its rate and ETA (what a client needs to
    // draw the pipeline), and the preparation steps overlap: rank-file bytes are written before
    // the fetch ends.
    for kind in [
        StepKind::FetchCheckpoint,
        StepKind::BuildRankCache,
        StepKind::ConfigureWorkerStorage,
    ] {
        assert!(
            ev.iter().any(|e| matches!(
                e,
                Event::Progress { source: Source::Step(k), bytes_total: Some(_), rate_bps: Some(r), eta_s: Some(_), .. }
                    if *k == kind && *r > 0.0
            )),
            "{kind:?}: progress with rate and ETA"
        );
    }
    let first_build = ev.iter().position(|e| {
        matches!(e, Event::Progress { source: Source::Step(StepKind::BuildRankCache), bytes_done, .. } if *bytes_done > 0)
    });
    let fetch_done = ev.iter().position(|e| {
        matches!(
            e,
            Event::Finished {
                source: Source::Step(StepKind::FetchCheckpoint),
                ..
            }
        )
    });
    assert!(
        first_build.is_some() && first_build < fetch_done,
        "overlapped: rank-file bytes are written before the fetch ends ({first_build:?}, {fetch_done:?})"
    );
    assert!(
        ev.iter().any(
            |e| matches!(e, Event::Log { line, .. } if line.contains("is running on port 8888"))
        )
    );
    let key =
        spark_deploy_core::lifecycle::api_key::read(Path::new(&v.config().serving.api_key_file))?;
    let reply = chat(key.expose()).await?;
    assert_eq!(
        reply["choices"][0]["message"]["content"]
            .as_str()
            .map(str::trim),
        Some("144"),
        "{reply}"
    );
    let health: serde_json::Value = reqwest::get("http://127.0.0.1:8888/health")
        .await?
        .json()
        .await?;
    assert_eq!(health["status"], "ok", "{health}");
    // The worker's rank file arrived over the fabric and is a regular file on the worker's disk.
    let worker_cache = PathBuf::from(&v.config().nodes[1].data_dir);
    assert!(
        std::fs::read_to_string(worker_cache.join(".spark-deploy-received.tsv"))?
            .contains("rank1of2-")
    );

    // Copy mode shipped what rank 1 reads, no more: every file the stand-in's rank 1 opened (its
    // loaded line, container paths) was shipped to the worker, and what was shipped but not
    // opened is only the small files kept because they are in doubt or spark-deploy itself reads
    // them on the worker (the kit's MANIFEST for the fingerprint).
    opened_is_shipped(&ctx, &v).await?;

    // Smoke measured the startup: port open, then HTTP ready, then the first token, after the
    // launch of the first rank (what `bench` reports next to its throughput).
    let t =
        spark_deploy_core::lifecycle::startup::read(Path::new(&v.config().deployment.state_dir))?
            .ok_or("no startup timings")?;
    assert!(
        t.port_open_s > 0.0 && t.port_open_s <= t.http_ready_s && t.http_ready_s <= t.first_token_s,
        "{t:?}"
    );

    // Preflight decided the GPU and RoCE checks on the facts each node presents (its
    // nvidia-smi, its sysfs tree), the budget on the checkpoint's real size, and handed the GID
    // index it found in each node's sysfs to that node's rank.
    let table = ctx.preflight_report().ok_or("preflight report")?;
    for node in ["head", "worker-1"] {
        let row = |check: Check| {
            table
                .results
                .iter()
                .find(|r| r.check == check && r.node == node)
                .ok_or_else(|| format!("no {check} row for {node}: {table:#?}"))
        };
        assert_eq!(row(Check::Gpu)?.observed, "2 × NVIDIA H200");
        assert!(
            table.results.iter().any(|r| r.check == Check::FabricRoce
                && r.node == node
                && r.observed.starts_with("rocep1s0f1 ACTIVE")),
            "{node}"
        );
        assert_eq!(row(Check::DockerRuntime)?.verdict, Verdict::Ok);
        assert_eq!(row(Check::MemoryBudget)?.verdict, Verdict::Ok);
        for check in [
            Check::GpuProcesses,
            Check::GpuContainers,
            Check::FabricAddr,
            Check::MemoryAvailable,
        ] {
            row(check)?;
        }
    }
    for rank in 0..2 {
        let env = std::process::Command::new("docker")
            .args([
                "inspect",
                "-f",
                "{{json .Config.Env}}",
                &format!("sd-testbed-rank{rank}"),
            ])
            .output()?;
        let env = String::from_utf8_lossy(&env.stdout);
        assert!(
            env.contains("\"NCCL_IB_GID_INDEX=3\""),
            "rank {rank}: {env}"
        );
        assert!(
            env.contains("\"NCCL_IB_HCA=rocep1s0f1\""),
            "rank {rank}: {env}"
        );
    }

    // 2. A second `up` on the running pair skips every step, Preflight included, in seconds.
    let t = std::time::Instant::now();
    let rec = Recorder::default();
    Plan::standard(&v)
        .run(&Context::new(v.clone(), Arc::new(rec.clone())))
        .await?;
    let up_again = t.elapsed();
    let s = steps(&rec.events());
    for k in [
        StepKind::Preflight,
        StepKind::FetchCheckpoint,
        StepKind::BuildRankCache,
        StepKind::ConfigureWorkerStorage,
        StepKind::BuildImage,
        StepKind::LaunchRank,
        StepKind::Smoke,
    ] {
        assert!(
            s.contains(&(k, "skipped")),
            "{k:?} must be skipped while running: {s:?}"
        );
    }
    assert_eq!(s.len(), 7, "{s:?}");
    #[allow(clippy::print_stderr)]
    {
        eprintln!("second up on the running deployment: {up_again:?}");
    }

    // 3. The lock refuses a concurrent run.
    let held = spark_deploy_core::lifecycle::lock::DeploymentLock::acquire(Path::new(
        &v.config().deployment.state_dir,
    ))?;
    let err = Plan::standard(&v)
        .run(&Context::new(v.clone(), Arc::new(Recorder::default())))
        .await
        .expect_err("locked");
    assert!(err.to_string().contains("holds"), "{err}");
    drop(held);

    // 4. A changed CONTEXT restarts the pair with the new pool on both ranks.
    let mut changed = v.config().clone();
    changed.serving.context = 3072;
    let v2 = validate(changed, home)?;
    let rec = Recorder::default();
    Plan::standard(&v2)
        .run(&Context::new(v2.clone(), Arc::new(rec.clone())))
        .await?;
    let s = steps(&rec.events());
    for k in [StepKind::Preflight, StepKind::LaunchRank, StepKind::Smoke] {
        assert!(
            s.contains(&(k, "ran")),
            "{k:?} must run for a changed config: {s:?}"
        );
    }
    let cmd = std::process::Command::new("docker")
        .args(["inspect", "-f", "{{json .Config.Cmd}}", "sd-testbed-rank1"])
        .output()?;
    assert!(
        String::from_utf8_lossy(&cmd.stdout).contains("\"--pool\",\"3072\""),
        "{}",
        String::from_utf8_lossy(&cmd.stdout)
    );

    // 5. Teardown saves both logs.
    let rec2 = Recorder::default();
    let ctx2 = Context::new(v2.clone(), Arc::new(rec2.clone()));
    Plan::teardown(&v2).run(&ctx2).await?;
    let saved: Vec<String> = rec2
        .events()
        .iter()
        .filter_map(|e| match e {
            Event::Log { line, .. } if line.contains("log saved to") => Some(line.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(saved.len(), 2, "{saved:?}");

    // 6. Inputs that differ between the nodes are refused before any container starts.
    let worker_map = PathBuf::from(&v.config().nodes[1].data_dir);
    let tm = std::fs::read_dir(worker_map.join("inputs"))?
        .next()
        .ok_or("inputs dir")??
        .path()
        .join("dsv41_token_map.json");
    let original = std::fs::read(&tm)?;
    std::fs::write(&tm, b"[0]")?;
    let only = |kinds: &[StepKind]| {
        Plan::from_steps(
            &v,
            Plan::standard(&v)
                .steps()
                .iter()
                .filter(|s| kinds.contains(&s.kind()))
                .cloned()
                .collect(),
        )
    };
    let err = only(&[StepKind::Preflight, StepKind::LaunchRank])
        .run(&Context::new(v.clone(), Arc::new(Recorder::default())))
        .await
        .expect_err("mismatch");
    assert!(err.to_string().contains("token_map_sha256"), "{err}");
    assert!(!any_rank_container()?, "nothing started on a mismatch");
    std::fs::write(&tm, &original)?;

    // 7. From stopped, a re-run skips what is up to date.
    let rec3 = Recorder::default();
    let ctx3 = Context::new(v.clone(), Arc::new(rec3.clone()));
    Plan::standard(&v).run(&ctx3).await?;
    let s = steps(&rec3.events());
    for k in [
        StepKind::FetchCheckpoint,
        StepKind::BuildRankCache,
        StepKind::BuildImage,
    ] {
        assert!(
            s.contains(&(k, "skipped")),
            "{k:?} must be skipped on an up-to-date re-run: {s:?}"
        );
    }
    // The worker's token map was rewritten by step 6 (same bytes, new mtime): exactly that one
    // file is verified again and re-sent; nothing else moves.
    let sent: Vec<String> = rec3
        .events()
        .iter()
        .filter_map(|e| match e {
            Event::Log {
                source: Source::Step(StepKind::ConfigureWorkerStorage),
                line,
                ..
            } => Some(line.clone()),
            _ => None,
        })
        .collect();
    assert!(sent.iter().any(|l| l.contains(" 1 sent")), "{sent:?}");
    assert!(s.contains(&(StepKind::LaunchRank, "ran")), "{s:?}");

    // 7b. On the prepared testbed: `up` from stopped, minus the ranks' own load time as the engine
    //     reports it (rank 1's `loaded_s`), and LOG_KEEP: after log_keep + 2 down/up cycles only
    //     log_keep logs per rank remain.
    let mut keep1 = v.config().clone();
    keep1.lifecycle.log_keep = 1;
    let v3 = validate(keep1, home)?;
    for cycle in 0..3 {
        Plan::teardown(&v3)
            .run(&Context::new(v3.clone(), Arc::new(Recorder::default())))
            .await?;
        let t = std::time::Instant::now();
        Plan::standard(&v3)
            .run(&Context::new(v3.clone(), Arc::new(Recorder::default())))
            .await?;
        let wall = t.elapsed().as_secs_f64();
        let log = std::process::Command::new("docker")
            .args(["logs", "sd-testbed-rank1"])
            .output()?;
        let loaded: f64 = String::from_utf8_lossy(&log.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find_map(|j| j["loaded_s"].as_f64())
            .ok_or("rank 1 loaded line")?;
        #[allow(clippy::print_stderr)]
        {
            eprintln!(
                "cycle {cycle}: up from stopped {wall:.2} s, rank 1 loaded_s {loaded:.3} s, overhead {:.2} s",
                wall - loaded
            );
        }
    }
    Plan::teardown(&v3)
        .run(&Context::new(v3.clone(), Arc::new(Recorder::default())))
        .await?;
    let head_logs = PathBuf::from(&v3.config().nodes[0].data_dir).join("logs/sd-testbed");
    let kept: Vec<_> = std::fs::read_dir(&head_logs)?
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .ends_with("-sd-testbed-rank0.log.gz")
        })
        .collect();
    assert_eq!(kept.len(), 1, "log_keep = 1 keeps one rank-0 log");
    let gz = std::fs::read(kept[0].path())?;
    let mut text = String::new();
    std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&gz[..]), &mut text)?;
    assert!(
        text.contains("\"rank\": 0") || text.contains("split_proof"),
        "the engine's output is inside: {}",
        &text[..text.len().min(400)]
    );
    Plan::standard(&v)
        .run(&Context::new(v.clone(), Arc::new(Recorder::default())))
        .await?;

    // 8. Both ranks or neither: kill rank 1, then Smoke fails and stops rank 0 too.
    std::process::Command::new("docker")
        .args(["kill", "sd-testbed-rank1"])
        .output()?;
    let rec4 = Recorder::default();
    let ctx4 = Context::new(v.clone(), Arc::new(rec4.clone()));
    let smoke = Plan::standard(&v)
        .steps()
        .iter()
        .find(|s| s.kind() == StepKind::Smoke)
        .cloned()
        .ok_or("smoke")?;
    let err = Plan::from_steps(&v, vec![smoke])
        .run(&ctx4)
        .await
        .expect_err("smoke must fail with rank 1 dead");
    assert!(err.to_string().contains("rank 1"), "{err}");
    assert!(rec4.events().iter().any(|e| matches!(e, Event::Log { line, .. } if line.contains("stopped sd-testbed-rank0 (all ranks or none)"))), "rank 0 stopped too");
    let ps = std::process::Command::new("docker")
        .args([
            "ps",
            "-aq",
            "--filter",
            "label=io.spark-deploy.deployment=sd-testbed",
        ])
        .output()?;
    assert!(ps.stdout.is_empty(), "no rank container left");
    drop(hub);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn testbed_deploy_end_to_end() {
    let opts = options();
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    let result = async {
        let info = cluster::up(&opts).await?;
        scenario(&info, &home).await
    }
    .await;
    let _ = std::process::Command::new("sh")
        .args([
            "-c",
            "docker rm -f sd-testbed-rank0 sd-testbed-rank1 >/dev/null 2>&1",
        ])
        .status();
    let down = cluster::down(&opts).await;
    result.unwrap();
    down.unwrap();
}
