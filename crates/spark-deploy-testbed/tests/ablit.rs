//! ABLIT on the testbed: the gated overlay served by the testbed hub is fetched with the token,
//! merged into rank files of their own inputs directory and served; `ABLIT=0` switches the running
//! pair back to the genuine weights; a start whose inputs were prepared for the other value is
//! refused before any container starts. Which weights the ranks loaded is read from the stand-in
//! (a sha256 per rank-file entry of the overlaid tensors, in rank 1's loaded line and rank 0's
//! first line) and compared with the same slices cut here from the overlay file and from the
//! genuine checkpoint.

// An integration test: a failed unwrap or expect is the test failure, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest, Sha256};
use spark_deploy_core::config::{ValidatedConfig, validate};
use spark_deploy_core::event::{Event, Recorder};
use spark_deploy_core::layout::NodeLayout;
use spark_deploy_core::plan::{Plan, StepKind};
use spark_deploy_core::run::Context;
use spark_deploy_core::secret::Secret;
use spark_deploy_testbed::checkpoint::{OVERLAID, OVERLAY_FILE};
use spark_deploy_testbed::demo::{ABLIT, ABLIT_TOKEN, MODEL};
use spark_deploy_testbed::standin::inputs::{Checkpoint, SafetensorsHeader};
use spark_deploy_testbed::standin::rank_file::Entry;

use common::testbed::{R, any_rank_container, on_testbed, steps};

/// Where a tensor's bytes come from: the genuine checkpoint or the overlay file.
enum Weights {
    Genuine(Checkpoint),
    Overlay(PathBuf, SafetensorsHeader),
}

impl Weights {
    fn tensor(&self, name: &str) -> (Vec<u64>, Vec<u8>) {
        match self {
            Self::Genuine(c) => {
                let (t, data) = c.tensor(name).unwrap();
                (t.shape, data)
            }
            Self::Overlay(path, h) => {
                let t = h
                    .tensors
                    .get(name)
                    .unwrap_or_else(|| panic!("{name} not in the overlay"));
                let all = std::fs::read(path).unwrap();
                (
                    t.shape.clone(),
                    all[t.start as usize..t.end as usize].to_vec(),
                )
            }
        }
    }
}

/// sha256 of the part of the source tensor a rank-file key names, sliced here from the format
/// (trellis `[K/16, N/16, 16·bits]` int16: a column range takes N-tiles from every row, a row range
/// takes K-tile rows; `suh` `[K]` follows the rows, `svh` `[N]` the columns; unsplit = whole).
fn expected(key: &str, w: &Weights) -> String {
    let k = Entry {
        key: key.to_owned(),
        dtype: String::new(),
        shape: Vec::new(),
        offset: 0,
        bytes: 0,
    }
    .exl3()
    .unwrap_or_else(|| panic!("{key} is not an EXL3 part key"));
    let suffix = match k.part.as_str() {
        "tr" => "trellis",
        other => other,
    };
    let (shape, data) = w.tensor(&format!("{}.{suffix}", k.prefix));
    let part: Vec<u8> = match (k.part.as_str(), k.cols, k.rows) {
        ("tr", Some((c0, c1)), None) => {
            let word = shape[2] as usize * 2;
            let row = shape[1] as usize * word;
            data.chunks_exact(row)
                .flat_map(|r| r[c0 as usize / 16 * word..c1 as usize / 16 * word].to_vec())
                .collect()
        }
        ("tr", None, Some((r0, r1))) => {
            let row = (shape[1] * shape[2]) as usize * 2;
            data[r0 as usize / 16 * row..r1 as usize / 16 * row].to_vec()
        }
        ("suh", _, Some((r0, r1))) | ("svh", Some((r0, r1)), _) => {
            data[r0 as usize * 2..r1 as usize * 2].to_vec()
        }
        ("suh" | "svh", _, _) => data,
        _ => panic!("{key}: a trellis split by neither or both"),
    };
    hex::encode(Sha256::digest(&part))
}

/// The digests a rank printed: rank 1's loaded line, rank 0's first line.
fn printed(rank: usize) -> BTreeMap<String, String> {
    let out = std::process::Command::new("docker")
        .args(["logs", &format!("sd-testbed-rank{rank}")])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|j| j["rank"] == rank && j.get("loaded_s").is_some())
        .unwrap_or_else(|| panic!("rank {rank} printed no loaded line: {text}"));
    serde_json::from_value(line["digest"].clone()).unwrap()
}

/// Both ranks loaded exactly the overlaid tensors' slices of `w` (and not those of `other`).
fn assert_loaded(w: &Weights, other: &Weights, what: &str) {
    for rank in 0..2 {
        let got = printed(rank);
        for t in OVERLAID {
            assert!(
                got.keys()
                    .any(|k| k.starts_with(&format!("{t}|")) && k.ends_with("|tr")),
                "rank {rank} digested no trellis of {t}: {got:?}"
            );
        }
        for (key, digest) in &got {
            assert_eq!(
                digest,
                &expected(key, w),
                "rank {rank} {key}: not the {what} weights"
            );
            if key.ends_with("|tr") {
                assert_ne!(digest, &expected(key, other), "{key}: overlay = genuine?");
            }
        }
    }
}

async fn up(v: &ValidatedConfig) -> R<Vec<Event>> {
    let rec = Recorder::default();
    Plan::standard(v)
        .run(&Context::new(v.clone(), Arc::new(rec.clone())))
        .await
        .map_err(|e| format!("{e} (remedy: {:?})", e.failure.remedy))?;
    Ok(rec.events())
}

async fn chat(v: &ValidatedConfig) -> R<String> {
    let key =
        spark_deploy_core::lifecycle::api_key::read(Path::new(&v.config().serving.api_key_file))?;
    let r: serde_json::Value = reqwest::Client::new()
        .post("http://127.0.0.1:8888/v1/chat/completions")
        .bearer_auth(key.expose())
        .json(&serde_json::json!({"model": "DeepSeek-V4.1-Flash-1017", "messages": [{"role": "user", "content": "What is 12*12?"}], "chat_template_kwargs": {"enable_thinking": false}}))
        .send()
        .await?
        .json()
        .await?;
    Ok(r["choices"][0]["message"]["content"]
        .as_str()
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|| r.to_string()))
}

/// Preflight and LaunchRank only: a start on inputs prepared earlier. Returns the failure's
/// message and remedy.
async fn start(v: &ValidatedConfig) -> (String, String) {
    let steps = Plan::standard(v)
        .steps()
        .iter()
        .filter(|s| matches!(s.kind(), StepKind::Preflight | StepKind::LaunchRank))
        .cloned()
        .collect();
    let e = Plan::from_steps(v, steps)
        .run(&Context::new(v.clone(), Arc::new(Recorder::default())))
        .await
        .expect_err("a start on inputs prepared for the other ABLIT value");
    (e.to_string(), e.failure.remedy.clone().unwrap_or_default())
}

fn nothing_running() {
    assert!(
        !any_rank_container().unwrap(),
        "a rank container exists after a refusal"
    );
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

async fn scenario(info: &spark_deploy_testbed::cluster::TestbedInfo, home: &Path) -> R<()> {
    let (hub, config) = spark_deploy_testbed::demo::prepare(info, home).await?;
    let repos = info.state_dir.join("hub-repos");
    let genuine = Weights::Genuine(Checkpoint::open(&repos.join(MODEL))?);
    let overlay_file = repos.join(ABLIT).join(OVERLAY_FILE);
    let overlay = Weights::Overlay(
        overlay_file.clone(),
        SafetensorsHeader::read(&overlay_file)?,
    );
    let v0 = validate(config.clone(), home)?;
    let mut c1 = config;
    c1.model.ablit = true;
    c1.hub.token = Some(Secret::new(ABLIT_TOKEN));
    let v1 = validate(c1, home)?;
    let head0 = NodeLayout::of(&v0, &v0.config().nodes[0]);
    let head1 = NodeLayout::of(&v1, &v1.config().nodes[0]);
    assert_ne!(
        head0.inputs_dir, head1.inputs_dir,
        "ABLIT has its own inputs"
    );

    // 1. Prepared with ABLIT=0, started with ABLIT=1: refused, naming ABLIT and the remedy.
    Plan::prepare(&v0)
        .run(&Context::new(v0.clone(), Arc::new(Recorder::default())))
        .await
        .map_err(|e| e.to_string())?;
    let (msg, remedy) = start(&v1).await;
    assert!(
        msg.contains("prepared with ABLIT=0") && msg.contains("this start has ABLIT=1"),
        "{msg}"
    );
    assert!(
        msg.contains(&head0.inputs_dir),
        "names the prepared inputs: {msg}"
    );
    assert!(
        remedy.contains("spark-deploy prepare") && remedy.contains("ABLIT=1"),
        "{remedy}"
    );
    nothing_running();

    // 2. Genuine rank files in the ABLIT inputs directory (what `up` built before the overlay was
    //    merged): refused too — the sidecar says what they were built from.
    copy_dir(
        &Path::new(&head0.inputs_dir).join("rank-cache"),
        &Path::new(&head1.inputs_dir).join("rank-cache"),
    );
    copy_dir(Path::new(&head0.inputs_dir), Path::new(&head1.inputs_dir));
    let (msg, remedy) = start(&v1).await;
    assert!(
        msg.contains("prepared with ABLIT=0 (the genuine weights"),
        "{msg}"
    );
    assert!(remedy.contains("ABLIT=1"), "{remedy}");
    nothing_running();

    // 3. ABLIT=1 up: the overlay is fetched with the token, those rank files are rebuilt with it,
    //    both ranks load the overlay's slices, and the split proof (of genuine tensors) holds.
    let ev = up(&v1).await?;
    let s = steps(&ev);
    assert!(s.contains(&(StepKind::BuildRankCache, "ran")), "{s:?}");
    assert!(
        ev.iter().any(|e| matches!(e, Event::Log { line, .. } if line.contains("rebuilding from") && line.contains("+ablit"))),
        "the genuine files in the ABLIT directory were rebuilt"
    );
    assert!(
        Path::new(&v1.config().hub.ablit_cache)
            .join("hub/models--testbed--dsv41-ablit")
            .is_dir()
    );
    assert_loaded(&overlay, &genuine, "overlay");
    assert_eq!(chat(&v1).await?, "144", "ABLIT=1 serves");

    // 4. ABLIT=0 up: the running overlay pair is replaced by the genuine one.
    let ev = up(&v0).await?;
    let s = steps(&ev);
    assert!(s.contains(&(StepKind::BuildRankCache, "skipped")), "{s:?}");
    assert!(
        s.contains(&(StepKind::LaunchRank, "ran")),
        "switched back: {s:?}"
    );
    assert_loaded(&genuine, &overlay, "genuine");
    assert_eq!(chat(&v0).await?, "144", "ABLIT=0 serves");

    // 5. And back to ABLIT=1 with both prepared: nothing is rebuilt, the overlay is served again.
    let ev = up(&v1).await?;
    let s = steps(&ev);
    assert!(s.contains(&(StepKind::BuildRankCache, "skipped")), "{s:?}");
    assert!(s.contains(&(StepKind::LaunchRank, "ran")), "{s:?}");
    assert_loaded(&overlay, &genuine, "overlay");

    Plan::teardown(&v1)
        .run(&Context::new(v1.clone(), Arc::new(Recorder::default())))
        .await?;
    drop(hub);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn testbed_ablit_serves_the_overlay_switches_back_and_refuses_a_mixed_start() {
    on_testbed(|info, home| async move {
        // A failed assertion becomes the scenario's error, so the testbed still comes down.
        let r =
            futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(scenario(&info, &home)))
                .await
                .unwrap_or_else(|p| {
                    Err(p
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                        .unwrap_or_else(|| "the scenario panicked".to_owned())
                        .into())
                });
        let _ = std::process::Command::new("sh")
            .args([
                "-c",
                "docker rm -f sd-testbed-rank0 sd-testbed-rank1 >/dev/null 2>&1",
            ])
            .status();
        r
    })
    .await;
}
