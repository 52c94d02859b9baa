//! The stand-in's API surface and performance model over HTTP, on loopback (both ranks, no
//! testbed): streamed timing follows the set rates, usage and the `tensorfold` block, the prompt
//! cache, `"draft": false` giving the same tokens, `/tokenize`, `/metrics`.

// An integration test: a failed unwrap or expect is the test failure, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Instant;

use serde_json::{Value, json};
use spark_deploy_testbed::standin::loopback::{LoopbackInputs, LoopbackOptions, LoopbackPair};

const KEY: &str = "sk-api-test";

fn pair(env: &[(&str, &str)]) -> (LoopbackInputs, LoopbackPair) {
    let inputs =
        LoopbackInputs::generate(Path::new(env!("CARGO_BIN_EXE_tf-standin")), 65_536).unwrap();
    let opts = LoopbackOptions {
        key: KEY.into(),
        env: env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..LoopbackOptions::default()
    };
    let p = LoopbackPair::start(&inputs, &opts).unwrap();
    (inputs, p)
}

async fn post(base: &str, path: &str, body: &Value) -> (u16, String, Vec<(Instant, String)>) {
    let r = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .bearer_auth(KEY)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let mut r = r;
    let mut text = String::new();
    let mut events = Vec::new();
    let mut buf = String::new();
    while let Some(c) = r.chunk().await.unwrap() {
        let now = Instant::now();
        let s = String::from_utf8_lossy(&c).into_owned();
        text.push_str(&s);
        buf.push_str(&s);
        while let Some(i) = buf.find("\n\n") {
            let ev = buf[..i].trim().to_owned();
            buf = buf[i + 2..].to_owned();
            if let Some(d) = ev.strip_prefix("data: ") {
                events.push((now, d.to_owned()));
            }
        }
    }
    (status, text, events)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_follow_the_performance_model_and_report_usage() {
    let (_i, p) = pair(&[
        ("TF_STANDIN_DECODE_TPS", "100"),
        ("TF_STANDIN_PREFILL_TPS", "5000"),
        ("TF_STANDIN_TIME_SCALE", "4"),
        ("TF_STANDIN_ACCEPT", "code=2,prose=1.5,random=1"),
    ]);
    let base = p.base_url();
    let code =
        "fn add(a: i32, b: i32) -> i32 { a + b } // (variant 1) complete: let v = vec![1, 2];";
    let body = json!({"model": p.served_name, "messages": [{"role": "user", "content": code}],
        "max_tokens": 401, "ignore_eos": true, "reasoning_effort": "none", "stream": true,
        "stream_options": {"include_usage": true}});
    let t0 = Instant::now();
    let (status, _, events) = post(&base, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200);
    assert_eq!(events.last().unwrap().1, "[DONE]");
    let parsed: Vec<(Instant, Value)> = events[..events.len() - 1]
        .iter()
        .map(|(t, e)| (*t, serde_json::from_str(e).unwrap()))
        .collect();
    let generated: Vec<&(Instant, Value)> = parsed
        .iter()
        .filter(|(_, v)| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .is_some_and(|c| !c.is_empty())
        })
        .collect();
    let usage = &parsed
        .iter()
        .find(|(_, v)| v.get("usage").is_some())
        .unwrap()
        .1["usage"];
    assert_eq!(usage["completion_tokens"], 401);
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(usage["completion_tokens_details"]["reasoning_tokens"], 0);
    let span = generated.last().unwrap().0 - generated[0].0;
    let rate = 400.0 / span.as_secs_f64();
    // code, drafts: 100 × 2 × 4 = 800 tok/s. Never faster than the model (deadlines are
    // absolute); a loaded machine can only make it late, so the lower bound has room (a
    // wall-clock test with a 5% band both ways failed under a busy CI run).
    assert!(
        rate <= 800.0 * 1.05,
        "decode {rate} faster than the model's 800"
    );
    assert!(
        rate >= 800.0 * 0.7,
        "decode {rate} far below the model's 800"
    );
    let ttft = generated[0].0 - t0;
    let prompt = usage["prompt_tokens"].as_f64().unwrap();
    let expect = prompt / 20_000.0;
    assert!(ttft.as_secs_f64() >= expect, "{ttft:?} < {expect}");
    let last = &parsed
        .iter()
        .find(|(_, v)| v.get("tensorfold").is_some())
        .unwrap()
        .1;
    assert_eq!(last["tensorfold"]["kind"], "code");
    assert!(last["tensorfold"]["prefill_s"].as_f64().unwrap() >= expect);
    let sha = last["tensorfold"]["token_sha"].as_str().unwrap().to_owned();
    // the same prompt again is resumed from the prompt cache
    let mut again = body.clone();
    again["stream"] = json!(false);
    let (_, text, _) = post(&base, "/v1/chat/completions", &again).await;
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        v["usage"]["prompt_tokens_details"]["cached_tokens"],
        usage["prompt_tokens"].as_u64().unwrap() - 1
    );
    assert_eq!(v["tensorfold"]["token_sha"], sha.as_str());
    // "draft": false: the same tokens, serially (slower)
    let mut serial = again.clone();
    serial["draft"] = json!(false);
    let t = Instant::now();
    let (_, text, _) = post(&base, "/v1/chat/completions", &serial).await;
    let serial_s = t.elapsed().as_secs_f64();
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["tensorfold"]["token_sha"], sha.as_str());
    assert_eq!(v["tensorfold"]["draft"], false);
    assert!(
        serial_s > 0.9,
        "400 serial tokens at 400 tok/s took {serial_s}"
    );
    // tokenize: BOS 0 first, count = len(tokens) = the chat's prompt tokens
    let (st, text, _) = post(
        &base,
        "/tokenize",
        &json!({"messages": [{"role": "user", "content": code}]}),
    )
    .await;
    assert_eq!(st, 200);
    let t: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(t["tokens"][0], 0);
    assert_eq!(
        t["count"].as_u64().unwrap() as usize,
        t["tokens"].as_array().unwrap().len()
    );
    assert_eq!(t["count"], usage["prompt_tokens"]);
    // metrics: the vLLM-compatible counters the core's serving signals name
    let m = reqwest::Client::new()
        .get(format!("{base}/metrics"))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(m.contains("vllm:num_requests_running 0"), "{m}");
    assert!(m.contains("vllm:generation_tokens_total 1203"), "{m}");
}
