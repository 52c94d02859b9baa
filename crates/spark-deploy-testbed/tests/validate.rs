//! `validate` against the stand-in on loopback (both ranks, no testbed): every check passes on
//! a healthy pair and fails on the fault mode that breaks it. The API is reached only through a
//! spark-deploy config (serving.host/port, served name, key file), as the command does.

// An integration test: a failed unwrap or expect is the test failure, with its location; the
// measured lines go to stderr (shown with --no-capture).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::path::Path;
use std::sync::OnceLock;

use spark_deploy_core::api::Api;
use spark_deploy_core::event::Recorder;
use spark_deploy_core::validate::{self, Check, Options, Verdict};
use spark_deploy_testbed::standin::loopback::{LoopbackInputs, LoopbackOptions, LoopbackPair};

fn inputs() -> &'static LoopbackInputs {
    static I: OnceLock<LoopbackInputs> = OnceLock::new();
    I.get_or_init(|| {
        LoopbackInputs::generate(Path::new(env!("CARGO_BIN_EXE_tf-standin")), 65_536).unwrap()
    })
}

/// A pair with `fault` (or none), fast (time scale 20), and the API its config names.
fn pair(fault: Option<&str>) -> (LoopbackPair, Api, tempfile::TempDir) {
    let mut env = vec![("TF_STANDIN_TIME_SCALE".to_owned(), "20".to_owned())];
    if let Some(f) = fault {
        env.push(("TF_STANDIN_FAULT".into(), f.into()));
    }
    let p = LoopbackPair::start(
        inputs(),
        &LoopbackOptions {
            env,
            ..LoopbackOptions::default()
        },
    )
    .unwrap();
    let state = tempfile::tempdir().unwrap();
    let file = state.path().join("spark-deploy.toml");
    std::fs::write(&file, p.config_toml(state.path(), 65_536, 4)).unwrap();
    let raw = spark_deploy_core::config::load_with_env(Some(&file), &|_| None).unwrap();
    let config = spark_deploy_core::config::validate(raw, state.path()).unwrap();
    let api = Api::from_config(&config).unwrap();
    (p, api, state)
}

async fn run(api: &Api, only: &[Check]) -> validate::Report {
    let opts = Options {
        only: only.to_vec(),
        skip: vec![],
        needle_tokens: None,
    };
    validate::run(api, &opts, &Recorder::default())
        .await
        .unwrap()
}

fn lines(r: &validate::Report) -> String {
    r.results
        .iter()
        .map(|c| {
            format!(
                "{} {} {:.2}s {}",
                c.check.name(),
                c.verdict.label(),
                c.seconds,
                c.detail
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_check_passes_on_a_healthy_stand_in() {
    let (_p, api, _s) = pair(None);
    let r = run(&api, &[]).await;
    eprintln!("{}", lines(&r));
    assert_eq!(r.results.len(), Check::ALL.len());
    for c in &r.results {
        assert_eq!(c.verdict, Verdict::Pass, "{}", lines(&r));
    }
    assert!(r.ok());
    let needle = r.results.iter().find(|c| c.check == Check::Needle).unwrap();
    assert!(needle.detail.contains("prefill"), "{}", needle.detail);
}

/// Each fault mode fails exactly the checks it targets (`json_schema` refused is unsupported).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_fault_mode_fails_its_check() {
    let cases: &[(&str, &[Check], Verdict)] = &[
        ("wrong_answer", &[Check::Text], Verdict::Fail),
        (
            "thinking_leak",
            &[Check::ThinkingOn, Check::ThinkingOff],
            Verdict::Fail,
        ),
        ("no_tool_call", &[Check::ToolCall], Verdict::Fail),
        ("tool_args_string", &[Check::ToolArray], Verdict::Fail),
        ("bad_json_schema", &[Check::JsonSchema], Verdict::Fail),
        ("no_json_schema", &[Check::JsonSchema], Verdict::Unsupported),
        ("tokenize_mismatch", &[Check::Tokenizer], Verdict::Fail),
        ("bad_image", &[Check::Image], Verdict::Fail),
        ("lost_needle", &[Check::Needle], Verdict::Fail),
        ("draft_mismatch", &[Check::Exactness], Verdict::Fail),
    ];
    for (fault, checks, want) in cases {
        let (p, api, _s) = pair(Some(fault));
        let r = run(&api, checks).await;
        eprintln!("TF_STANDIN_FAULT={fault}\n{}", lines(&r));
        for c in &r.results {
            assert_eq!(
                c.verdict,
                *want,
                "{fault}: {}\n{}",
                lines(&r),
                p.rank0_stderr()
            );
        }
        assert_eq!(r.ok(), *want != Verdict::Fail, "{fault}");
        // a fault breaks only its own check: the tool-array fault leaves a plain tool call working
        if *fault == "tool_args_string" {
            let r = run(&api, &[Check::ToolCall]).await;
            assert_eq!(r.results[0].verdict, Verdict::Pass, "{}", lines(&r));
        }
    }
}
