//! `spark-deploy validate` and `spark-deploy bench` as a user runs them: a config whose
//! serving.host/port and key file point at the stand-in on loopback (this very binary installed
//! under the engine's names, both ranks, no testbed).
#![cfg(feature = "testbed")]
// An integration test: a failed unwrap or expect is the test failure, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use spark_deploy_testbed::standin::loopback::{LoopbackInputs, LoopbackOptions, LoopbackPair};

const BIN: &str = env!("CARGO_BIN_EXE_spark-deploy");
const POOL: u64 = 65_536;

fn inputs() -> &'static LoopbackInputs {
    static I: OnceLock<LoopbackInputs> = OnceLock::new();
    I.get_or_init(|| LoopbackInputs::generate(Path::new(BIN), POOL).unwrap())
}

struct Deployed {
    _pair: LoopbackPair,
    state: tempfile::TempDir,
    config: PathBuf,
}

fn deploy(fault: Option<&str>) -> Deployed {
    let mut env = vec![("TF_STANDIN_TIME_SCALE".to_owned(), "20".to_owned())];
    if let Some(f) = fault {
        env.push(("TF_STANDIN_FAULT".into(), f.into()));
    }
    let pair = LoopbackPair::start(
        inputs(),
        &LoopbackOptions {
            pool: POOL,
            env,
            ..LoopbackOptions::default()
        },
    )
    .unwrap();
    let state = tempfile::tempdir().unwrap();
    let config = state.path().join("spark-deploy.toml");
    std::fs::write(&config, pair.config_toml(state.path(), POOL, 4)).unwrap();
    Deployed {
        _pair: pair,
        state,
        config,
    }
}

fn cli(d: &Deployed, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN)
        .arg("--config")
        .arg(&d.config)
        .args(args)
        .env_remove("SPARK_DEPLOY_CONFIG")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn validate_prints_one_line_per_check_and_fails_on_a_broken_engine() {
    let d = deploy(None);
    let (code, out, err) = cli(&d, &["validate"]);
    assert_eq!(code, 0, "{out}{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 10, "{out}");
    for l in &lines {
        assert!(l.split_whitespace().nth(1) == Some("PASS"), "{l}");
        assert!(
            l.split_whitespace().nth(2).unwrap().ends_with('s'),
            "timing in {l}"
        );
    }
    // --only/--skip and --json
    let (code, out, _) = cli(
        &d,
        &[
            "--json",
            "validate",
            "--only",
            "tokenizer,text",
            "--skip",
            "text",
        ],
    );
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["results"].as_array().unwrap().len(), 1);
    assert_eq!(v["results"][0]["check"], "tokenizer");
    assert_eq!(v["results"][0]["verdict"], "pass");
    // unknown check: usage
    let (code, _, err) = cli(&d, &["validate", "--only", "vibes"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("vibes") && err.contains("remedy"), "{err}");
    // a needle that cannot fit the pool is refused before any request
    let (code, _, err) = cli(&d, &["validate", "--needle", "250000"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--needle"), "{err}");
    // a broken engine: exit 5, the failed check named
    let broken = deploy(Some("lost_needle"));
    let (code, out, err) = cli(&broken, &["validate", "--only", "needle,text"]);
    assert_eq!(code, 5, "{out}{err}");
    assert!(out.contains("needle FAIL"), "{out}");
    assert!(out.contains("text PASS"), "{out}");
    assert!(err.contains("1 check(s) failed: needle"), "{err}");
}

#[test]
fn bench_prints_the_table_stores_by_fingerprint_and_compares() {
    let d = deploy(None);
    let args = [
        "bench",
        "--streams",
        "1,2",
        "--kinds",
        "prose,code",
        "--reps",
        "1",
        "--max-tokens",
        "64",
        "--prefill",
        "8192,262144",
    ];
    let (code, out, err) = cli(&d, &args);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("| prose | 1 |") && out.contains("| code | 2 |"),
        "{out}"
    );
    assert!(out.contains("| 8192 |"), "{out}");
    assert!(
        out.contains("left out (do not fit the pool): [262144]"),
        "{out}"
    );
    let bench_dir = d.state.path().join("bench");
    let fps: Vec<_> = std::fs::read_dir(&bench_dir).unwrap().flatten().collect();
    assert_eq!(fps.len(), 1, "one fingerprint");
    let mut with_compare = args.to_vec();
    with_compare.push("--compare");
    let (code, out, err) = cli(
        &d,
        &["--json"]
            .iter()
            .chain(&with_compare)
            .copied()
            .collect::<Vec<_>>(),
    );
    assert_eq!(code, 0, "{err}");
    let json_end = out.find("\n}\n").unwrap() + 3;
    let v: serde_json::Value = serde_json::from_str(&out[..json_end]).unwrap();
    assert!(
        v["benchmarks"][0]["tg_throughput"]["mean"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    assert!(
        out[json_end..].contains("| prose × 1 per-stream |"),
        "{out}"
    );
    let files: Vec<String> = std::fs::read_dir(fps[0].path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let count = |ext: &str| files.iter().filter(|f| f.ends_with(ext)).count();
    assert_eq!(
        (count(".json"), count(".png"), count(".html")),
        (2, 2, 2),
        "{files:?}"
    );
    assert!(!files.iter().any(|f| f.ends_with(".partial")), "{files:?}");
    let html = files.iter().find(|f| f.ends_with(".html")).unwrap();
    let html = std::fs::read_to_string(fps[0].path().join(html)).unwrap();
    assert!(html.contains("<svg") && html.contains("prose aggregate") && !html.contains("<script"));
}
