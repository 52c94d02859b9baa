//! The engine stand-in end to end, on loopback: both ranks are the built `tf-standin` binary
//! installed under the engine's two names in a temporary engine dir, fed a generated test-scale
//! checkpoint and rank files from the native rank-cache builder.
//!
//! Every wait is bounded by `STANDIN_TEST_TIMEOUT_S` (default 90 s); every child is killed by a
//! guard on drop.
//!
//! Longer than the ~600-line rule on purpose: one test binary for the stand-in (each binary in
//! `tests/` links the whole testbed again, which costs minutes on two cores), its tests sharing
//! the loopback fixtures and bounded waits above. A split would be into modules of this binary
//! (`tests/standin/main.rs` + one file per concern), not into more binaries.

// An integration test: a failed unwrap or expect is the test failure, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use spark_deploy_core::engine::tensorfold::inputs::{model_config, rope};
use spark_deploy_testbed::standin::loopback::LoopbackInputs;
use spark_deploy_testbed::standin::rank_file::RankFile;

const POOL: u64 = 4096;
const KEY: &str = "sk-standin-test";

fn timeout() -> Duration {
    Duration::from_secs(
        std::env::var("STANDIN_TEST_TIMEOUT_S")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(90),
    )
}

// ---- fixture ------------------------------------------------------------------------------------

struct Fixture {
    _inputs: LoopbackInputs,
    engine: PathBuf,
    model: PathBuf,
    original: PathBuf,
    kit: PathBuf,
    token_map: PathBuf,
    cache0: PathBuf,
    cache1: PathBuf,
    key_file: PathBuf,
}

/// The small checkpoint, its token map, both rank files and the built stand-in installed as the
/// engine ([`LoopbackInputs`], as the loopback pair uses them), plus an API key file.
fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let inputs =
            LoopbackInputs::generate(Path::new(env!("CARGO_BIN_EXE_tf-standin")), 0).unwrap();
        for name in ["tensorfold-native", "tf-dsv41-lanes"] {
            assert!(inputs.engine().join(name).is_file(), "{name} installed");
        }
        let key_file = inputs.dir().join("api-keys");
        std::fs::write(&key_file, format!("# keys\ntests: {KEY}\n")).unwrap();
        Fixture {
            engine: inputs.engine().to_owned(),
            model: inputs.model().to_owned(),
            original: inputs.original().to_owned(),
            kit: inputs.kit().to_owned(),
            token_map: inputs.token_map().to_owned(),
            cache0: inputs.cache(0).to_owned(),
            cache1: inputs.cache(1).to_owned(),
            key_file,
            _inputs: inputs,
        }
    })
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A transport port whose `followers` ports from it up (follower `g` listens on port + g - 1)
/// are free, and a free HTTP port outside them: all held open while chosen, so the HTTP port
/// is never one a follower binds.
fn free_ports(followers: u16) -> (u16, u16) {
    loop {
        let first = TcpListener::bind("127.0.0.1:0").unwrap();
        let tp = first.local_addr().unwrap().port();
        let rest: Option<Vec<TcpListener>> = (1..followers)
            .map(|k| {
                tp.checked_add(k)
                    .and_then(|p| TcpListener::bind(("127.0.0.1", p)).ok())
            })
            .collect();
        if rest.is_none() {
            continue;
        }
        let http = free_port();
        return (tp, http);
    }
}

fn tmp_copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let p = e.path();
        if e.file_type().unwrap().is_dir() {
            tmp_copy_dir(&p, &to.join(e.file_name()));
        } else {
            std::fs::copy(&p, to.join(e.file_name())).unwrap();
        }
    }
}

// ---- processes ----------------------------------------------------------------------------------

/// A child process killed (and reaped) on drop, with its stdout lines on a channel and its
/// stderr collected.
struct Proc {
    child: Child,
    lines: Receiver<String>,
    stderr: Arc<Mutex<String>>,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proc {
    fn spawn(mut cmd: Command) -> Self {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let (tx, lines) = channel();
        let out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let err = child.stderr.take().unwrap();
        let sink = stderr.clone();
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = BufReader::new(err).read_to_string(&mut s);
            sink.lock().unwrap().push_str(&s);
        });
        Self {
            child,
            lines,
            stderr,
        }
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// The next stdout line that parses as JSON and satisfies `pred`.
    fn wait_json(&self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let end = Instant::now() + timeout();
        let mut seen = Vec::new();
        while let Some(left) = end.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    if let Ok(v) = serde_json::from_str::<Value>(&l)
                        && pred(&v)
                    {
                        return v;
                    }
                    seen.push(l);
                }
                Err(_) => break,
            }
        }
        panic!(
            "no stdout line {what}; saw {seen:?}; stderr: {}",
            self.stderr()
        );
    }

    fn wait_exit(&mut self) -> ExitStatus {
        let end = Instant::now() + timeout();
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                // let the stderr reader finish
                std::thread::sleep(Duration::from_millis(100));
                return s;
            }
            assert!(
                Instant::now() < end,
                "process did not exit; stderr: {}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([format!("-{sig}"), self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{sig}");
    }
}

struct Ranks {
    rank0: Option<Proc>,
    rank1: Proc,
    http: u16,
}

struct Setup<'a> {
    cache0: &'a Path,
    cache1: &'a Path,
    kit: &'a Path,
    context: u64,
    pool: u64,
    /// `TF_STANDIN_PROOF` for both ranks.
    proof: Option<&'a str>,
}

impl Default for Setup<'static> {
    fn default() -> Self {
        let f = fixture();
        Self {
            cache0: &f.cache0,
            cache1: &f.cache1,
            kit: &f.kit,
            context: POOL,
            pool: POOL,
            proof: None,
        }
    }
}

fn rank1_cmd(cache: &Path, kit: &Path, port: u16, extra: &[&str]) -> Command {
    let f = fixture();
    let mut c = Command::new(f.engine.join("tf-dsv41-lanes"));
    c.env_clear()
        .env("TF_DS_REPLAY_FLOOR", "1")
        .env("TF_STANDIN_CONNECT_TIMEOUT_S", "30")
        .arg(&f.model)
        .arg(cache)
        .args(["1", "2", "127.0.0.1", &port.to_string()])
        .arg(kit)
        .arg("--engram")
        .arg(&f.original)
        .arg("--token-map")
        .arg(&f.token_map)
        .args(extra);
    c
}

fn rank0_env(cache: &Path, kit: &Path, port: u16) -> HashMap<String, String> {
    let f = fixture();
    let mut e = HashMap::new();
    for (k, v) in [
        ("TF_DS_REPLAY_FLOOR", "1".to_owned()),
        ("TF_TP_WORLD", "2".into()),
        ("TF_TP_MASTER", "127.0.0.1".into()),
        ("TF_TP_PORT", port.to_string()),
        ("TF_DS_RANK_CACHE", cache.display().to_string()),
        ("TF_DS_KIT", kit.display().to_string()),
        (
            "TENSORFOLD_CUDA_KERNELS",
            kit.join("aot").display().to_string(),
        ),
        ("TF_DS_ENGRAM", f.original.display().to_string()),
        ("TF_DS_TOKEN_MAP", f.token_map.display().to_string()),
        ("TF_DS_GRAPHS", "1".into()),
        ("TF_RDMA_DEVICES", "lo0,lo1".into()),
        ("NCCL_SOCKET_IFNAME", "lo".into()),
    ] {
        e.insert(k.to_owned(), v);
    }
    e
}

fn rank0_cmd(env: &HashMap<String, String>, http: u16, context: u64, extra: &[&str]) -> Command {
    let f = fixture();
    let mut c = Command::new(f.engine.join("tensorfold-native"));
    c.env_clear()
        .envs(env)
        .arg("serve")
        .arg(&f.model)
        .args(["--host", "127.0.0.1", "--port", &http.to_string()])
        .args(["--name", "DeepSeek-V4.1-Flash-TF", "--alias", "dsv41"])
        .arg("--api-key-file")
        .arg(&f.key_file)
        .args([
            "--context",
            &context.to_string(),
            "--parallel",
            "4",
            "--thinking",
        ])
        .args([
            "--max-tokens",
            "512",
            "--temperature",
            "1.0",
            "--top-p",
            "0.95",
        ])
        .args(["--top-k", "20", "--backend", "cuda"])
        .args(extra);
    c
}

fn start(s: &Setup<'_>) -> Ranks {
    let (tp, http) = free_ports(1);
    let pool = s.pool.to_string();
    let mut c1 = rank1_cmd(
        s.cache1,
        s.kit,
        tp,
        &[
            "--pool",
            &pool,
            "--rdma",
            "lo0,lo1",
            "--graphs",
            "1",
            "--side",
            "1",
            "--prefetch",
            "1",
            "--aio",
            "1",
        ],
    );
    if let Some(p) = s.proof {
        c1.env("TF_STANDIN_PROOF", p);
    }
    let rank1 = Proc::spawn(c1);
    let loaded = rank1.wait_json("loaded", |v| v.get("loaded_s").is_some());
    assert_eq!(loaded["rank"], 1);
    assert_eq!(loaded["pool"], s.pool);
    let mut env0 = rank0_env(s.cache0, s.kit, tp);
    if let Some(p) = s.proof {
        env0.insert("TF_STANDIN_PROOF".into(), p.into());
    }
    let rank0 = Proc::spawn(rank0_cmd(&env0, http, s.context, &[]));
    rank0.wait_json("serving", |v| v.get("serving").is_some());
    Ranks {
        rank0: Some(rank0),
        rank1,
        http,
    }
}

// ---- a small HTTP/1.1 client (loopback only) ---------------------------------------------------

struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The `data:` payloads of an SSE body.
    fn events(&self) -> Vec<String> {
        self.body
            .split("\n\n")
            .filter_map(|e| e.trim().strip_prefix("data: ").map(str::to_owned))
            .collect()
    }
}

fn http(port: u16, method: &str, path: &str, key: Option<&str>, body: Option<&Value>) -> Reply {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(timeout())).unwrap();
    let body = body.map(Value::to_string).unwrap_or_default();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    if let Some(k) = key {
        req.push_str(&format!("Authorization: Bearer {k}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(&body);
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, rest) = text.split_once("\r\n\r\n").expect("an HTTP reply");
    let mut lines = head.lines();
    let status: u16 = lines
        .next()
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    let body = if chunked {
        let mut out = String::new();
        let mut r = rest;
        while let Some((n, tail)) = r.split_once("\r\n") {
            let n = usize::from_str_radix(n.trim(), 16).unwrap_or(0);
            if n == 0 {
                break;
            }
            out.push_str(&tail[..n]);
            r = &tail[n + 2..];
        }
        out
    } else {
        rest.to_owned()
    };
    Reply {
        status,
        headers,
        body,
    }
}

fn chat(port: u16, body: &Value) -> Reply {
    http(port, "POST", "/v1/chat/completions", Some(KEY), Some(body))
}

fn ask(q: &str) -> Value {
    json!({"model": "DeepSeek-V4.1-Flash-TF", "messages": [{"role": "user", "content": q}], "max_tokens": 64})
}

// ---- tests --------------------------------------------------------------------------------------

fn run_to_exit(mut c: Command) -> (i32, String, String) {
    let mut p = Proc::spawn({
        c.stdin(Stdio::null());
        c
    });
    let st = p.wait_exit();
    let mut out = Vec::new();
    while let Ok(l) = p.lines.try_recv() {
        out.push(l);
    }
    (st.code().unwrap_or(-1), out.join("\n"), p.stderr())
}

#[test]
fn argv_and_env_are_parsed_as_strictly_as_the_engine() {
    let f = fixture();
    // rank 1: an unknown key is error.BadArgument, exit 1
    let (code, _, err) = run_to_exit(rank1_cmd(&f.cache1, &f.kit, 1, &["--bogus", "1"]));
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("BadArgument") && err.contains("--bogus"),
        "{err}"
    );
    // TP=4-only keys are unknown to the TP=2 build
    let (code, _, err) = run_to_exit(rank1_cmd(&f.cache1, &f.kit, 1, &["--round-rows", "48"]));
    assert_eq!(code, 1);
    assert!(err.contains("BadArgument"), "{err}");
    // bare flag (no value) in the middle eats the next key as its value: --graphs --pool → bad value
    let (code, _, err) = run_to_exit(rank1_cmd(
        &f.cache1,
        &f.kit,
        1,
        &["--graphs", "--pool", "4096"],
    ));
    assert_eq!(code, 1);
    assert!(err.contains("BadArgument"), "{err}");
    // a dangling last key is silently ignored: it loads, prints its line and then fails to connect
    let port = free_port();
    let mut c = rank1_cmd(&f.cache1, &f.kit, port, &["--pool", "4096", "--aio"]);
    c.env("TF_STANDIN_CONNECT_TIMEOUT_S", "1");
    let (code, out, err) = run_to_exit(c);
    assert_eq!(code, 1, "{out} {err}");
    let loaded: Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert_eq!(loaded["pool"], 4096);
    assert_eq!(loaded["drafts"], 1);
    assert!(err.contains("ConnectFailed"), "{err}");
    // rank 1 without --engram
    let mut c = Command::new(f.engine.join("tf-dsv41-lanes"));
    c.env_clear()
        .arg(&f.model)
        .arg(&f.cache1)
        .args(["1", "2", "127.0.0.1", "29620"])
        .arg(&f.kit)
        .args(["--pool", "4096"]);
    let (code, _, err) = run_to_exit(c);
    assert_eq!(code, 1);
    assert!(err.contains("NoEngramTables"), "{err}");
    // rank 0: an unknown serve flag exits 2
    let env = rank0_env(&f.cache0, &f.kit, 1);
    let (code, _, err) = run_to_exit(rank0_cmd(&env, 1, POOL, &["--bogus-flag", "1"]));
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--bogus-flag is not served by the native engine yet"),
        "{err}"
    );
    let (code, _, err) = run_to_exit(rank0_cmd(&env, 1, POOL, &["--tp", "2"]));
    assert_eq!(code, 2, "{err}");
    // rank 0: missing required env, each with the engine's error name
    for (var, name) in [
        ("TF_TP_MASTER", "NoTpMaster"),
        ("TF_DS_RANK_CACHE", "NoRankCache"),
        ("TF_DS_KIT", "NoKit"),
        ("TF_DS_ENGRAM", "NoEngramTables"),
        ("TF_DS_TOKEN_MAP", "NoTokenMap"),
    ] {
        let mut e = env.clone();
        e.remove(var);
        let (code, _, err) = run_to_exit(rank0_cmd(&e, 1, POOL, &[]));
        assert_eq!(code, 1, "{var}: {err}");
        assert!(err.contains(name), "{var}: {err}");
    }
    let mut e = env.clone();
    e.insert("TF_TP_WORLD".into(), "3".into());
    let (code, _, err) = run_to_exit(rank0_cmd(&e, 1, POOL, &[]));
    assert_eq!(code, 1);
    assert!(err.contains("NotPortedYet"), "{err}");
    let mut e = env.clone();
    e.insert("TF_TP_MASTER".into(), "localhost".into());
    let (code, _, err) = run_to_exit(rank0_cmd(&e, 1, POOL, &[]));
    assert_eq!(code, 1);
    assert!(err.contains("BadIp"), "{err}");
    // --parallel above TF_DS_STREAMS
    let (code, _, err) = run_to_exit(rank0_cmd(&env, 1, POOL, &["--parallel", "5"]));
    assert_eq!(code, 1);
    assert!(err.contains("NoFreeSlot"), "{err}");
    // settings the TP=2 kit has no Triton variants for, on either rank
    let mut e = env.clone();
    e.insert("TF_DS_ROUND_ROWS".into(), "48".into());
    let (code, _, err) = run_to_exit(rank0_cmd(&e, 1, POOL, &[]));
    assert_eq!(code, 1);
    assert!(err.contains("MissingTritonVariant"), "{err}");
    let mut c = rank1_cmd(&f.cache1, &f.kit, 1, &["--pool", "4096"]);
    c.env("TF_DS_STREAMS", "8");
    let (code, _, err) = run_to_exit(c);
    assert_eq!(code, 1);
    assert!(err.contains("MissingTritonVariant"), "{err}");
    // an unknown argv[0]
    let (code, _, _) = run_to_exit(Command::new(env!("CARGO_BIN_EXE_tf-standin")));
    assert_eq!(code, 2);
}

/// Runs rank 1 (which loads everything before connecting) against a modified input; returns
/// (exit code, stderr).
fn rank1_load(cache: &Path, kit: &Path, token_map: Option<&Path>) -> (i32, String) {
    let mut c = rank1_cmd(cache, kit, free_port(), &["--pool", "4096"]);
    if let Some(tm) = token_map {
        c.arg("--token-map").arg(tm); // a later pair wins
    }
    c.env("TF_STANDIN_CONNECT_TIMEOUT_S", "1");
    let (code, _, err) = run_to_exit(c);
    (code, err)
}

#[test]
fn inputs_are_checked_like_the_engine() {
    let f = fixture();
    let dir = tempfile::tempdir().unwrap();
    let rank_file = std::fs::read_dir(&f.cache1)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "bin"))
        .unwrap();
    let name = rank_file.file_name().unwrap().to_owned();
    // a symlink is invisible
    let d = dir.path().join("symlink");
    std::fs::create_dir_all(&d).unwrap();
    std::os::unix::fs::symlink(&rank_file, d.join(&name)).unwrap();
    let (code, err) = rank1_load(&d, &f.kit, None);
    assert_eq!(code, 1);
    assert!(err.contains("NoRankCache"), "{err}");
    // two files
    let d = dir.path().join("two");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::copy(&rank_file, d.join(&name)).unwrap();
    std::fs::copy(&rank_file, d.join("rank1of2-00000000000000000000.bin")).unwrap();
    let (code, err) = rank1_load(&d, &f.kit, None);
    assert_eq!(code, 1);
    assert!(err.contains("SeveralRankCaches"), "{err}");
    // a name whose hash is not the index's
    let d = dir.path().join("renamed");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::copy(&rank_file, d.join("rank1of2-0123456789abcdef0123.bin")).unwrap();
    let (code, err) = rank1_load(&d, &f.kit, None);
    assert_eq!(code, 1);
    assert!(
        err.contains("BadRankCache") && err.contains("hash"),
        "{err}"
    );
    // a broken magic
    let d = dir.path().join("magic");
    std::fs::create_dir_all(&d).unwrap();
    let mut bytes = std::fs::read(&rank_file).unwrap();
    let n = bytes.len();
    bytes[n - 1] = b'2';
    std::fs::write(d.join(&name), &bytes).unwrap();
    let (code, err) = rank1_load(&d, &f.kit, None);
    assert_eq!(code, 1);
    assert!(
        err.contains("BadRankCache") && err.contains("TFDSRK01"),
        "{err}"
    );
    // rank 0's file in rank 1's directory: no rank1of2 file
    let (code, err) = rank1_load(&f.cache0, &f.kit, None);
    assert_eq!(code, 1);
    assert!(err.contains("NoRankCache"), "{err}");
    // rank 0's file renamed for rank 1 (the hash is the index's, so the name is valid): its
    // ranges are rank 0's half, which rank 1 refuses at load
    let r0 = std::fs::read_dir(&f.cache0)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "bin"))
        .unwrap();
    let d = dir.path().join("other-rank");
    std::fs::create_dir_all(&d).unwrap();
    let renamed = r0
        .file_name()
        .unwrap()
        .to_string_lossy()
        .replace("rank0of2-", "rank1of2-");
    std::fs::copy(&r0, d.join(renamed)).unwrap();
    let (code, err) = rank1_load(&d, &f.kit, None);
    assert_eq!(code, 1);
    assert!(
        err.contains("MissingTensor") && err.contains("rank 1's share"),
        "{err}"
    );
    // config.json: another family, and a missing required field
    for (edit, name) in [
        ("model_type", "UnsupportedModel"),
        ("index_topk", "BadConfig"),
    ] {
        let m = dir.path().join(format!("model-{edit}"));
        std::fs::create_dir_all(&m).unwrap();
        std::fs::copy(f.model.join("tokenizer.json"), m.join("tokenizer.json")).unwrap();
        let mut cfg: Value =
            serde_json::from_slice(&std::fs::read(f.model.join("config.json")).unwrap()).unwrap();
        if edit == "model_type" {
            cfg["model_type"] = json!("deepseek_v3");
        } else {
            cfg["text_config"].as_object_mut().unwrap().remove(edit);
        }
        std::fs::write(m.join("config.json"), cfg.to_string()).unwrap();
        let c = rank1_cmd(&f.cache1, &f.kit, free_port(), &["--pool", "4096"]);
        let mut args: Vec<std::ffi::OsString> = c.get_args().map(ToOwned::to_owned).collect();
        args[0] = m.clone().into_os_string();
        let mut c = Command::new(f.engine.join("tf-dsv41-lanes"));
        c.env_clear().args(args);
        let (code, _, err) = run_to_exit(c);
        assert_eq!(code, 1);
        assert!(err.contains(name) && err.contains(edit), "{err}");
    }
    // Engram tables: a directory of symlinks to the shards is fine; without one shard a layer
    // is missing
    let shards: Vec<PathBuf> = std::fs::read_dir(&f.original)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    let links = dir.path().join("engram-links");
    std::fs::create_dir_all(&links).unwrap();
    for s in &shards {
        std::os::unix::fs::symlink(s, links.join(s.file_name().unwrap())).unwrap();
    }
    let engram_run = |engram: &Path| {
        let c = rank1_cmd(&f.cache1, &f.kit, free_port(), &["--pool", "4096"]);
        let mut args: Vec<std::ffi::OsString> = c.get_args().map(ToOwned::to_owned).collect();
        let at = args.iter().position(|a| a == "--engram").unwrap();
        args[at + 1] = engram.as_os_str().to_owned();
        let mut c = Command::new(f.engine.join("tf-dsv41-lanes"));
        c.env_clear()
            .env("TF_STANDIN_CONNECT_TIMEOUT_S", "1")
            .args(args);
        run_to_exit(c)
    };
    let (code, out, err) = engram_run(&links);
    assert_eq!(code, 1);
    assert!(
        out.contains("loaded_s") && err.contains("ConnectFailed"),
        "{out} {err}"
    );
    let half = dir.path().join("engram-half");
    std::fs::create_dir_all(&half).unwrap();
    let with_table = shards
        .iter()
        .find(|s| {
            spark_deploy_testbed::standin::inputs::SafetensorsHeader::read(s)
                .unwrap()
                .tensors
                .keys()
                .any(|k| k.ends_with("engram.embed.weight"))
        })
        .unwrap();
    std::os::unix::fs::symlink(with_table, half.join("only.safetensors")).unwrap();
    let h = spark_deploy_testbed::standin::inputs::SafetensorsHeader::read(with_table).unwrap();
    let layers = h
        .tensors
        .keys()
        .filter(|k| k.ends_with("engram.embed.weight"))
        .count();
    assert_eq!(
        layers, 1,
        "the generator puts one Engram layer in each shard"
    );
    let (code, _, err) = engram_run(&half);
    assert_eq!(code, 1);
    assert!(err.contains("MissingEngramTable"), "{err}");
    let (code, _, err) = engram_run(&dir.path().join("no-such-dir"));
    assert_eq!(code, 1);
    assert!(err.contains("NoEngramTables"), "{err}");
    // a token map one entry short
    let tm: Vec<i64> = serde_json::from_slice(&std::fs::read(&f.token_map).unwrap()).unwrap();
    let short = dir.path().join("short.json");
    std::fs::write(&short, serde_json::to_vec(&tm[1..]).unwrap()).unwrap();
    let (code, err) = rank1_load(&f.cache1, &f.kit, Some(&short));
    assert_eq!(code, 1);
    assert!(err.contains("BadTokenMap"), "{err}");
    // a kit without vision/ for a vision checkpoint
    let kit = dir.path().join("kit-novision");
    tmp_copy_dir(&f.kit, &kit);
    std::fs::remove_dir_all(kit.join("vision")).unwrap();
    let (code, err) = rank1_load(&f.cache1, &kit, None);
    assert_eq!(code, 1);
    assert!(err.contains("NoVisionBias"), "{err}");
    // the pool needs pool + 49 RoPE rows
    let mut c = rank1_cmd(&f.cache1, &f.kit, free_port(), &["--pool", "1048576"]);
    c.env("TF_STANDIN_CONNECT_TIMEOUT_S", "1");
    let (code, _, err) = run_to_exit(c);
    assert_eq!(code, 1);
    assert!(err.contains("RopeTableTooShort"), "{err}");
}

#[test]
fn two_ranks_serve_the_api_with_the_split_proof_passing() {
    let mut r = start(&Setup::default());
    let port = r.http;
    // /health is open even with keys, and shows the proof
    let h = http(port, "GET", "/health", None, None);
    assert_eq!(h.status, 200, "{}", h.body);
    let h = h.json();
    assert_eq!(h["status"], "ok");
    assert_eq!(h["split_proof"]["ok"], true, "{h}");
    let tensors = h["split_proof"]["tensors"].as_array().unwrap();
    let split_of = |name: &str| {
        tensors
            .iter()
            .find(|t| t["tensor"] == name)
            .unwrap_or_else(|| panic!("{name} not proved: {h}"))["split"]
            .clone()
    };
    assert_eq!(split_of("layers.0.attn.wq_b"), "column");
    assert_eq!(split_of("layers.0.attn.wo_b"), "row");
    assert_eq!(split_of("head"), "column");
    assert_eq!(split_of("layers.0.ffn.experts.0.w2"), "row");
    // auth: every other route needs the key
    for (m, p) in [
        ("GET", "/v1/models"),
        ("GET", "/metrics"),
        ("POST", "/v1/chat/completions"),
    ] {
        let r = http(port, m, p, None, Some(&ask("hi")));
        assert_eq!(r.status, 401, "{m} {p}");
        assert_eq!(r.header("www-authenticate"), Some("Bearer"));
        let r = http(port, m, p, Some("wrong"), Some(&ask("hi")));
        assert_eq!(r.status, 401, "{m} {p}");
    }
    // x-api-key works too
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(timeout())).unwrap();
    write!(
        s,
        "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\nx-api-key: {KEY}\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    assert!(raw.starts_with("HTTP/1.1 200"), "{raw}");
    let models = http(port, "GET", "/v1/models", Some(KEY), None).json();
    assert_eq!(models["data"][0]["id"], "DeepSeek-V4.1-Flash-TF");
    assert_eq!(models["data"][1]["id"], "dsv41");
    // a chat: thinking on by default → reasoning_content, the product as the answer
    let c = chat(port, &ask("What is 17*23?"));
    assert_eq!(c.status, 200, "{}", c.body);
    let c = c.json();
    assert_eq!(c["object"], "chat.completion");
    assert_eq!(c["choices"][0]["message"]["content"], "391");
    assert!(
        c["choices"][0]["message"]["reasoning_content"]
            .as_str()
            .unwrap()
            .contains("391")
    );
    assert_eq!(c["choices"][0]["finish_reason"], "stop");
    assert_eq!(c["split_proof"]["ok"], true);
    assert!(
        c["usage"]["completion_tokens_details"]["reasoning_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );
    // deterministic
    let again = chat(port, &ask("What is 17*23?")).json();
    assert_eq!(again["choices"], c["choices"]);
    // thinking off, two ways
    let mut q = ask("What is 6*7?");
    q["chat_template_kwargs"] = json!({"enable_thinking": false});
    let c = chat(port, &q).json();
    assert_eq!(c["choices"][0]["message"]["content"], "42");
    assert!(
        c["choices"][0]["message"]
            .get("reasoning_content")
            .is_none(),
        "{c}"
    );
    let mut q = ask("hello");
    q["reasoning_effort"] = json!("none");
    let c = chat(port, &q).json();
    assert!(
        c["choices"][0]["message"]
            .get("reasoning_content")
            .is_none()
    );
    assert!(
        c["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .contains("stand-in")
    );
    // SSE with usage
    let mut q = ask("What is 12*12?");
    q["stream"] = json!(true);
    q["stream_options"] = json!({"include_usage": true});
    let s = chat(port, &q);
    assert_eq!(s.status, 200);
    assert!(
        s.header("content-type")
            .unwrap()
            .starts_with("text/event-stream")
    );
    let ev = s.events();
    assert_eq!(ev.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = ev[..ev.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    let reasoning: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["reasoning_content"].as_str())
        .collect();
    assert_eq!(content, "144");
    assert!(reasoning.contains("144"));
    let usage = chunks.iter().find(|c| c.get("usage").is_some()).unwrap();
    assert!(usage["usage"]["total_tokens"].as_u64().unwrap() > 0);
    assert!(
        chunks
            .iter()
            .any(|c| c["choices"][0]["finish_reason"] == "stop")
    );
    // tools → tool_calls with arguments from the schema's required properties
    let mut q = ask("What's the weather in Paris?");
    q["tools"] = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
        "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city", "days", "unit"]}}}]);
    let c = chat(port, &q).json();
    assert_eq!(c["choices"][0]["finish_reason"], "tool_calls", "{c}");
    let call = &c["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "get_weather");
    assert!(call["id"].as_str().unwrap().starts_with("call_"));
    let args: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"city": "stand-in", "days": 1, "unit": "c"}));
    // after the tool result it answers in text
    q["messages"] = json!([{"role": "user", "content": "weather?"},
        {"role": "assistant", "content": null, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}]);
    let c = chat(port, &q).json();
    assert_eq!(c["choices"][0]["finish_reason"], "stop");
    // an image part (a 1×1 PNG) is accepted
    let png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==";
    let q = json!({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{png}")}}]}],
        "max_tokens": 64});
    let c = chat(port, &q);
    assert_eq!(c.status, 200, "{}", c.body);
    let c = c.json();
    assert_eq!(c["tensorfold"]["images"][0]["bytes"], 70);
    assert_eq!(c["tensorfold"]["images"][0]["width"], 1);
    assert!(
        c["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .contains("1x1 PNG")
    );
    let bad = json!({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "https://example.invalid/x.png"}}]}]});
    assert_eq!(chat(port, &bad).status, 400);
    // context_length_exceeded: alignUp(prompt + max_tokens + 18, 2048) > pool
    let mut q = ask("hi");
    q["max_tokens"] = json!(POOL - 18 - 1);
    assert_eq!(chat(port, &q).status, 200);
    q["max_tokens"] = json!(POOL - 18);
    let e = chat(port, &q);
    assert_eq!(e.status, 400, "{}", e.body);
    assert_eq!(e.json()["error"]["code"], "context_length_exceeded");
    let long = "x".repeat(4 * 4100); // 4100 tokens + 64 + 18 > 4096
    let e = chat(port, &ask(&long));
    assert_eq!(e.json()["error"]["code"], "context_length_exceeded");
    // metrics
    let m = http(port, "GET", "/metrics", Some(KEY), None);
    assert_eq!(m.status, 200);
    assert!(m.body.contains("tensorfold:split_proof_ok 1"), "{}", m.body);
    // SIGTERM on rank 0: it sends done, exits 0; rank 1 prints followed and exits 0
    let mut rank0 = r.rank0.take().unwrap();
    rank0.signal("TERM");
    assert_eq!(rank0.wait_exit().code(), Some(0), "{}", rank0.stderr());
    r.rank1.wait_json("followed", |v| v["followed"] == true);
    assert_eq!(r.rank1.wait_exit().code(), Some(0));
}

/// Copies both rank files and swaps the bytes of one tensor's `tr` part between them (the index,
/// and so the names, stay valid): each rank then holds the other rank's half.
fn swapped_caches(root: &Path, prefixes: &[&str]) -> (PathBuf, PathBuf) {
    let f = fixture();
    let mut files = Vec::new();
    for (i, src) in [&f.cache0, &f.cache1].into_iter().enumerate() {
        let d = root.join(format!("swapped-{i}"));
        tmp_copy_dir(src, &d);
        let p = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.extension().is_some_and(|x| x == "bin"))
            .unwrap();
        files.push((d, p));
    }
    let mut bytes: Vec<Vec<u8>> = files
        .iter()
        .map(|(_, p)| std::fs::read(p).unwrap())
        .collect();
    for prefix in prefixes {
        let ranges: Vec<(usize, usize)> = files
            .iter()
            .map(|(_, p)| {
                let rf = RankFile::open(p).unwrap();
                let e = rf
                    .entries
                    .iter()
                    .find(|e| {
                        e.exl3()
                            .is_some_and(|k| k.prefix == *prefix && k.part == "tr")
                    })
                    .unwrap();
                (e.offset as usize, e.bytes as usize)
            })
            .collect();
        assert_eq!(ranges[0].1, ranges[1].1);
        let a = bytes[0][ranges[0].0..ranges[0].0 + ranges[0].1].to_vec();
        let b = bytes[1][ranges[1].0..ranges[1].0 + ranges[1].1].to_vec();
        assert_ne!(a, b);
        bytes[0][ranges[0].0..ranges[0].0 + ranges[0].1].copy_from_slice(&b);
        bytes[1][ranges[1].0..ranges[1].0 + ranges[1].1].copy_from_slice(&a);
    }
    for ((_, p), b) in files.iter().zip(&bytes) {
        std::fs::write(p, b).unwrap();
    }
    (files[0].0.clone(), files[1].0.clone())
}

#[test]
fn wrongly_split_files_fail_the_proof_and_every_chat() {
    let dir = tempfile::tempdir().unwrap();
    let (c0, c1) = swapped_caches(dir.path(), &["layers.0.attn.wq_b", "layers.0.attn.wo_b"]);
    let r = start(&Setup {
        cache0: &c0,
        cache1: &c1,
        ..Setup::default()
    });
    let h = http(r.http, "GET", "/health", None, None);
    assert_eq!(h.status, 200);
    let h = h.json();
    assert_eq!(h["split_proof"]["ok"], false, "{h}");
    for t in h["split_proof"]["tensors"].as_array().unwrap() {
        let bad = t["tensor"] == "layers.0.attn.wq_b" || t["tensor"] == "layers.0.attn.wo_b";
        assert_eq!(t["ok"], !bad, "{t}");
    }
    let c = chat(r.http, &ask("What is 17*23?"));
    assert_eq!(c.status, 500, "{}", c.body);
    let msg = c.json()["error"]["message"].as_str().unwrap().to_owned();
    assert!(
        msg.contains("layers.0.attn.wq_b") || msg.contains("layers.0.attn.wo_b"),
        "{msg}"
    );
    let mut q = ask("hi");
    q["stream"] = json!(true);
    assert_eq!(chat(r.http, &q).status, 500);
}

#[test]
fn rank_1_dying_makes_every_request_fail_with_peer_down() {
    let mut r = start(&Setup::default());
    assert_eq!(chat(r.http, &ask("What is 2*3?")).status, 200);
    r.rank1.signal("KILL");
    r.rank1.wait_exit();
    let c = chat(r.http, &ask("What is 2*3?"));
    assert_eq!(c.status, 500, "{}", c.body);
    assert_eq!(c.json()["error"]["code"], "PeerDown");
    let mut q = ask("What is 2*3?");
    q["stream"] = json!(true);
    let s = chat(r.http, &q);
    let ev = s.events();
    assert!(ev[0].contains("PeerDown"), "{ev:?}");
    assert_eq!(ev.last().unwrap(), "[DONE]");
    // and the next one too; /health stays ok; rank 0 keeps running
    assert_eq!(chat(r.http, &ask("hi")).json()["error"]["code"], "PeerDown");
    let h = http(r.http, "GET", "/health", None, None);
    assert_eq!(h.status, 200);
    assert_eq!(h.json()["status"], "ok");
    let rank0 = r.rank0.as_mut().unwrap();
    assert!(rank0.child.try_wait().unwrap().is_none(), "rank 0 exited");
    let m = http(r.http, "GET", "/metrics", Some(KEY), None);
    assert!(m.body.contains("tensorfold:peer_down 1"), "{}", m.body);
}

/// The TP=4 build on loopback: followers 3, 2, 1 then rank 0, each follower on its own port
/// (PORT + g − 1), the split proof over the four W=4 rank files; then one follower dies: every
/// request fails with `PeerDown`, and the other followers stay (only the deployer stops them).
#[test]
fn four_ranks_serve_with_the_proof_and_one_dead_follower_fails_every_request() {
    let f = fixture();
    let caches = f._inputs.rank_caches_at(4).unwrap();
    let (tp, http_port) = free_ports(3);
    let pool = POOL.to_string();
    let tp4_env = [
        ("TF_DS_WINDOW", pool.as_str()),
        ("TF_DS_ROUND_ROWS", "16"),
        ("TF_DS_STREAMS", "4"),
    ];
    let mut followers = Vec::new();
    for g in [3u32, 2, 1] {
        let mut c = Command::new(f.engine.join("tf-dsv41-lanes"));
        c.env_clear()
            .env("TF_STANDIN_CONNECT_TIMEOUT_S", "30")
            .envs(tp4_env)
            .arg(&f.model)
            .arg(&caches[g as usize])
            .args([&g.to_string(), "4", "127.0.0.1", &tp.to_string()])
            .arg(&f.kit)
            .arg("--engram")
            .arg(&f.original)
            .arg("--token-map")
            .arg(&f.token_map)
            .args(["--pool", &pool, "--round-rows", "16", "--streams", "4"])
            .args(["--context", &pool]);
        let p = Proc::spawn(c);
        let loaded = p.wait_json("loaded", |v| v.get("loaded_s").is_some());
        assert_eq!(loaded["rank"], g);
        followers.push((g, p));
    }
    let mut env0 = rank0_env(&caches[0], &f.kit, tp);
    env0.insert("TF_TP_WORLD".into(), "4".into());
    env0.remove("TF_RDMA_DEVICES");
    for (k, v) in tp4_env {
        env0.insert(k.into(), v.into());
    }
    let rank0 = Proc::spawn(rank0_cmd(&env0, http_port, POOL, &[]));
    let loaded = rank0.wait_json("loaded", |v| v.get("loaded_s").is_some());
    assert_eq!(
        (loaded["world"].as_u64(), loaded["pool"].as_u64()),
        (Some(4), Some(POOL))
    );
    let serving = rank0.wait_json("serving", |v| v.get("serving").is_some());
    assert_eq!(serving["split_proof"]["ok"], true, "{serving}");
    let c = chat(http_port, &ask("What is 17*23?"));
    assert_eq!(c.status, 200, "{}", c.body);
    // Follower 2 dies: rank 0 fails every request with PeerDown and keeps running.
    let (_, two) = followers.iter_mut().find(|(g, _)| *g == 2).unwrap();
    two.signal("KILL");
    two.wait_exit();
    let c = chat(http_port, &ask("What is 2*3?"));
    assert_eq!(c.status, 500, "{}", c.body);
    assert_eq!(c.json()["error"]["code"], "PeerDown");
    std::thread::sleep(Duration::from_millis(300));
    for (g, p) in followers.iter_mut().filter(|(g, _)| *g != 2) {
        assert!(
            p.child.try_wait().unwrap().is_none(),
            "follower {g} exited on its own"
        );
    }
    // The TP=2 build's follower (no TF_DS_WINDOW) refuses world 4.
    let mut c = Command::new(f.engine.join("tf-dsv41-lanes"));
    c.env_clear()
        .arg(&f.model)
        .arg(&caches[1])
        .args(["1", "4", "127.0.0.1", &tp.to_string()])
        .arg(&f.kit);
    let (code, _, err) = run_to_exit(c);
    assert_eq!(code, 1);
    assert!(err.contains("error.NotPortedYet"), "{err}");
}

#[test]
fn rank_0_dying_makes_rank_1_exit_1_with_peer_down() {
    let mut r = start(&Setup::default());
    r.rank0.take().unwrap().signal("KILL");
    r.rank1.wait_json("follow", |v| v["follow"] == "PeerDown");
    assert_eq!(r.rank1.wait_exit().code(), Some(1));
}

#[test]
fn the_proof_can_cover_every_split_tensor() {
    let r = start(&Setup {
        proof: Some("all"),
        ..Setup::default()
    });
    let h = http(r.http, "GET", "/health", None, None).json();
    let tensors = h["split_proof"]["tensors"].as_array().unwrap();
    assert!(tensors.len() > 100, "{}", tensors.len());
    assert_eq!(h["split_proof"]["ok"], true, "{h}");
    for kind in ["column", "row"] {
        assert!(tensors.iter().any(|t| t["split"] == kind), "{kind}");
    }
}

#[test]
fn different_rdma_device_counts_stop_both_ranks_with_bad_info() {
    let f = fixture();
    let tp = free_port();
    let mut rank1 = Proc::spawn(rank1_cmd(
        &f.cache1,
        &f.kit,
        tp,
        &["--pool", "4096", "--rdma", "mlx5_0,mlx5_1"],
    ));
    rank1.wait_json("loaded", |v| v.get("loaded_s").is_some());
    let mut env = rank0_env(&f.cache0, &f.kit, tp);
    env.insert("TF_RDMA_DEVICES".into(), "mlx5_0".into());
    let mut rank0 = Proc::spawn(rank0_cmd(&env, free_port(), POOL, &[]));
    assert_eq!(rank0.wait_exit().code(), Some(1));
    assert!(rank0.stderr().contains("BadInfo"), "{}", rank0.stderr());
    assert_eq!(rank1.wait_exit().code(), Some(1));
    assert!(rank1.stderr().contains("BadInfo"), "{}", rank1.stderr());
}

#[test]
fn rank_0_stops_cleanly_while_waiting_for_rank_1() {
    let f = fixture();
    let (tp, http) = free_ports(1);
    let mut r0 = Proc::spawn(rank0_cmd(
        &rank0_env(&f.cache0, &f.kit, tp),
        http,
        POOL,
        &[],
    ));
    r0.wait_json("rendezvous", |v| v.get("rendezvous").is_some());
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        r0.child.try_wait().unwrap().is_none(),
        "waits with no timeout"
    );
    r0.signal("TERM");
    assert_eq!(r0.wait_exit().code(), Some(0), "{}", r0.stderr());
}

#[test]
fn a_larger_rank_0_pool_is_frame_too_long_on_rank_1() {
    let f = fixture();
    let dir = tempfile::tempdir().unwrap();
    // a kit with RoPE tables long enough for a 32768 pool
    let kit = dir.path().join("kit");
    tmp_copy_dir(&f.kit, &kit);
    for e in std::fs::read_dir(&kit).unwrap() {
        let p = e.unwrap().path();
        let n = p.file_name().unwrap().to_string_lossy().into_owned();
        if n.starts_with("rope") {
            std::fs::remove_file(p).unwrap();
        }
    }
    let cfg = model_config::ModelConfig::read(&f.model).unwrap();
    rope::write_rope_tables(&cfg, &kit, Some(40_000)).unwrap();
    let r = start(&Setup {
        kit: &kit,
        context: 32_768,
        pool: POOL,
        ..Setup::default()
    });
    let mut rank1 = r.rank1;
    rank1.wait_json("follow", |v| v["follow"] == "FrameTooLong");
    assert_eq!(rank1.wait_exit().code(), Some(1));
    let h = http(r.http, "GET", "/health", None, None).json();
    assert_eq!(h["split_proof"]["ok"], false);
    assert_eq!(chat(r.http, &ask("hi")).status, 500);
    // a smaller rank 0 pool is not noticed (no settings handshake)
    let r = start(&Setup {
        kit: &kit,
        context: POOL,
        pool: 32_768,
        ..Setup::default()
    });
    assert_eq!(
        chat(r.http, &ask("What is 3*3?")).json()["choices"][0]["message"]["content"],
        "9"
    );
}

#[test]
fn the_rootfs_tar_holds_what_the_binary_needs() {
    let bin = Path::new(env!("CARGO_BIN_EXE_tf-standin"));
    assert_eq!(
        spark_deploy_testbed::standin::locate_binary().map(|p| p.canonicalize().unwrap()),
        Some(bin.canonicalize().unwrap())
    );
    let tar = spark_deploy_testbed::standin::rootfs_tar(bin).unwrap();
    // walk the ustar entries
    let mut names = Vec::new();
    let dir = tempfile::tempdir().unwrap();
    let mut at = 0;
    while at + 512 <= tar.len() && tar[at] != 0 {
        let h = &tar[at..at + 512];
        let field = |r: std::ops::Range<usize>| {
            String::from_utf8_lossy(&h[r])
                .trim_end_matches('\0')
                .to_owned()
        };
        let name = {
            let (p, n) = (field(345..500), field(0..100));
            if p.is_empty() { n } else { format!("{p}/{n}") }
        };
        let size = usize::from_str_radix(field(124..136).trim(), 8).unwrap();
        let sum: u32 = h
            .iter()
            .enumerate()
            .map(|(i, b)| {
                if (148..156).contains(&i) {
                    32
                } else {
                    u32::from(*b)
                }
            })
            .sum();
        assert_eq!(
            u32::from_str_radix(field(148..154).trim(), 8).unwrap(),
            sum,
            "checksum of {name}"
        );
        if h[156] == b'0' {
            let p = dir.path().join(&name);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, &tar[at + 512..at + 512 + size]).unwrap();
        }
        names.push((name, h[156]));
        at += 512 + size.div_ceil(512) * 512;
    }
    assert!(names.contains(&("tmp/".to_owned(), b'5')), "{names:?}");
    let loader = names
        .iter()
        .find(|(n, _)| n.contains("ld-linux"))
        .unwrap_or_else(|| panic!("no dynamic loader in {names:?}"))
        .0
        .clone();
    assert!(
        names.iter().any(|(n, _)| n.ends_with("libc.so.6")),
        "{names:?}"
    );
    // the loader and libraries from the tar run the binary (as rank 1, refusing a bad key)
    let ld = dir.path().join(&loader);
    std::fs::set_permissions(&ld, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let lib_dirs: Vec<String> = names
        .iter()
        .filter(|(n, t)| *t == b'0' && n.contains(".so"))
        .map(|(n, _)| dir.path().join(n).parent().unwrap().display().to_string())
        .collect();
    let mut c = Command::new(&ld);
    c.env_clear()
        .arg("--library-path")
        .arg(lib_dirs.join(":"))
        .args(["--argv0", "/engine/tf-dsv41-lanes"])
        .arg(bin)
        .args([
            "/m",
            "/c",
            "1",
            "2",
            "127.0.0.1",
            "29620",
            "/k",
            "--nope",
            "1",
        ]);
    let (code, _, err) = run_to_exit(c);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("BadArgument"), "{err}");
}

// ---- the FROM-scratch image, when a Docker daemon is reachable ----------------------------------

/// Removes a container and an image on drop.
struct DockerGuard {
    image: String,
    container: String,
}

impl Drop for DockerGuard {
    fn drop(&mut self) {
        let _ = Command::new("docker")
            .args(["rm", "-f", &self.container])
            .output();
        let _ = Command::new("docker")
            .args(["rmi", "-f", &self.image])
            .output();
    }
}

fn docker_ok() -> bool {
    if std::env::var_os("STANDIN_NO_DOCKER").is_some() {
        return false;
    }
    let Ok(mut c) = Command::new("docker")
        .args(["version", "--format", "{{.Server.Version}}"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
    else {
        return false;
    };
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(Some(s)) = c.try_wait() {
            return s.success();
        }
        if Instant::now() > end {
            let _ = c.kill();
            let _ = c.wait();
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Rank 1 runs in a container of the imported rootfs (binary mounted at /engine, inputs mounted
/// at their host paths, host network for the loopback rendezvous), rank 0 on the host.
#[test]
#[allow(clippy::print_stderr)]
fn rank_1_runs_in_the_from_scratch_image() {
    if !docker_ok() {
        eprintln!("skipped: no Docker daemon (set nothing; STANDIN_NO_DOCKER skips on purpose)");
        return;
    }
    let f = fixture();
    let tag = format!("spark-deploy-standin-test:{}", std::process::id());
    let g = DockerGuard {
        image: tag.clone(),
        container: format!("spark-deploy-standin-test-{}", std::process::id()),
    };
    let programs: Vec<&Path> = spark_deploy_testbed::standin::SHELL_PROGRAMS
        .iter()
        .map(Path::new)
        .collect();
    let tar = spark_deploy_testbed::standin::rootfs_tar_with(
        Path::new(env!("CARGO_BIN_EXE_tf-standin")),
        &programs,
    )
    .unwrap();
    let mut imp = Command::new("docker")
        .args([
            "import",
            "--change",
            "LABEL spark-deploy.test=standin",
            "-",
            &tag,
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    imp.stdin.take().unwrap().write_all(&tar).unwrap();
    assert!(imp.wait().unwrap().success(), "docker import");
    // strict argv inside the image: exit 1 with BadArgument
    let out = Command::new("docker")
        .args(["run", "--rm", "--network", "none", "-v"])
        .arg(format!("{}:/engine:ro", f.engine.display()))
        .args([
            &tag,
            "/engine/tf-dsv41-lanes",
            "/m",
            "/c",
            "1",
            "2",
            "127.0.0.1",
            "29620",
            "/k",
            "--nope",
            "1",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("BadArgument"));
    // a real rank 1 in the image follows a rank 0 on the host
    let (tp, http_port) = free_ports(1);
    let mut c = Command::new("docker");
    c.args(["run", "--rm", "--name", &g.container, "--network", "host"])
        .args(["-e", "TF_STANDIN_CONNECT_TIMEOUT_S=30"]);
    let model_root = f.model.parent().unwrap();
    for d in [
        &f.engine,
        &model_root.to_path_buf(),
        &f.cache1,
        &f.token_map.parent().unwrap().to_path_buf(),
    ] {
        c.arg("-v")
            .arg(format!("{}:{}:ro", d.display(), d.display()));
    }
    c.arg("-v")
        .arg(format!("{}:/engine:ro", f.engine.display()));
    let logs = tempfile::tempdir().unwrap();
    c.arg("-v").arg(format!("{}:/logs", logs.path().display()));
    // the bash recipe's container command, run by the image's bash and tee
    let q = |p: &Path| format!("'{}'", p.display());
    let cmd = format!(
        "/engine/tf-dsv41-lanes {} {} 1 2 127.0.0.1 {tp} {} --engram {} --token-map {} --pool {POOL} --rdma lo0,lo1",
        q(&f.model),
        q(&f.cache1),
        q(&f.kit),
        q(&f.original),
        q(&f.token_map)
    );
    c.arg(&tag).args([
        "bash",
        "-c",
        &format!("( {cmd} ) 2>&1 | tee /logs/rank1.log"),
    ]);
    let mut rank1 = Proc::spawn(c);
    rank1.wait_json("loaded", |v| v.get("loaded_s").is_some());
    let mut rank0 = Proc::spawn(rank0_cmd(
        &rank0_env(&f.cache0, &f.kit, tp),
        http_port,
        POOL,
        &[],
    ));
    rank0.wait_json("serving", |v| v.get("serving").is_some());
    let h = http(http_port, "GET", "/health", None, None).json();
    assert_eq!(h["split_proof"]["ok"], true, "{h}");
    let c = chat(http_port, &ask("What is 17*23?")).json();
    assert_eq!(c["choices"][0]["message"]["content"], "391");
    rank0.signal("TERM");
    assert_eq!(rank0.wait_exit().code(), Some(0));
    rank1.wait_json("followed", |v| v["followed"] == true);
    assert_eq!(rank1.wait_exit().code(), Some(0), "{}", rank1.stderr());
    let log = std::fs::read_to_string(logs.path().join("rank1.log")).unwrap();
    assert!(log.contains("\"followed\": true"), "{log}");
    drop(g);
}
