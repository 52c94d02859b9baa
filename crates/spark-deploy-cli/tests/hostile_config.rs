//! Hostile inputs for `config check`, `plan`, `fetch --verify-only` and `init --from-recipe`:
//! generated configs (overflowing numbers, NaN, path-climbing revisions and repo ids, NUL and
//! control characters, option-looking ssh destinations, injected NFS options, non-HTTP
//! endpoints), environment overrides, recipe imports, and files that are not regular files (FIFOs,
//! directories, devices, oversized or non-UTF-8 files).
//!
//! Every case runs the real binary in its own directory (HOME inside it) and asserts: the exit
//! code (3: configuration), no panic, a message naming the field, variable, file or line with a
//! remedy, no secret echoed, no hang (10 s), and that nothing outside the case's directory
//! changed (the shared parent, holding a victim file, is snapshotted before and after each case).

// Helpers of a test binary: a failed unwrap is a test failure with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

/// What a case puts in its working directory before running.
#[derive(Clone)]
enum Entry {
    Text(String),
    Bytes(Vec<u8>),
    Fifo,
    Dir,
    Symlink(PathBuf),
}

#[derive(Clone)]
struct Case {
    name: String,
    files: Vec<(String, Entry)>,
    args: Vec<String>,
    env: Vec<(String, String)>,
    code: i32,
    /// Every group must match; a group matches when the message (stderr, or the JSON failure on
    /// stdout) contains any of its strings.
    needles: Vec<Vec<String>>,
    /// Never in stdout or stderr (secrets).
    forbidden: Vec<String>,
    /// Paths (relative to the working directory) that must not exist afterwards.
    absent: Vec<String>,
}

impl Case {
    fn new(name: impl Into<String>, args: &[&str]) -> Self {
        Self {
            name: name.into(),
            files: Vec::new(),
            args: args.iter().map(|s| (*s).to_owned()).collect(),
            env: Vec::new(),
            code: 3,
            needles: Vec::new(),
            forbidden: Vec::new(),
            absent: Vec::new(),
        }
    }
    fn file(mut self, path: &str, e: Entry) -> Self {
        self.files.push((path.to_owned(), e));
        self
    }
    fn env(mut self, k: &str, v: &str) -> Self {
        self.env.push((k.to_owned(), v.to_owned()));
        self
    }
    fn needs_any(mut self, any: &[&str]) -> Self {
        self.needles
            .push(any.iter().map(|s| (*s).to_owned()).collect());
        self
    }
    fn forbid(mut self, s: &str) -> Self {
        self.forbidden.push(s.to_owned());
        self
    }
    fn absent(mut self, p: &str) -> Self {
        self.absent.push(p.to_owned());
        self
    }
}

/// A TOML basic string holding `s` exactly (control characters escaped).
fn q(s: &str) -> String {
    let mut out = String::from("\"");
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// (path, listing) of every entry under `dir` except `skip`: size, mode and mtime.
fn snapshot(dir: &Path, skip: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p == skip {
                continue;
            }
            let m = std::fs::symlink_metadata(&p).unwrap();
            let mtime = m
                .modified()
                .ok()
                .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok());
            out.insert(
                p.clone(),
                format!("{:?} {} {mtime:?}", m.file_type(), m.len()),
            );
            if m.is_dir() {
                stack.push(p);
            }
        }
    }
    out
}

fn mkfifo(p: &Path) {
    let st = Command::new("mkfifo").arg(p).status().unwrap();
    assert!(st.success());
}

/// Runs every case; returns the failures (empty when all held).
fn run_all(cases: &[Case]) -> Vec<String> {
    let outer = tempfile::tempdir().unwrap();
    let victim = outer.path().join("victim");
    std::fs::write(&victim, b"must stay unchanged").unwrap();
    let mut failures = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let case_dir = outer.path().join(format!("case-{i}"));
        let work = case_dir.join("work");
        let home = case_dir.join("home");
        std::fs::create_dir_all(&work).unwrap();
        std::fs::create_dir_all(&home).unwrap();
        for (rel, e) in &c.files {
            let p = work.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            match e {
                Entry::Text(t) => std::fs::write(&p, t).unwrap(),
                Entry::Bytes(b) => std::fs::write(&p, b).unwrap(),
                Entry::Fifo => mkfifo(&p),
                Entry::Dir => std::fs::create_dir_all(&p).unwrap(),
                Entry::Symlink(t) => std::os::unix::fs::symlink(t, &p).unwrap(),
            }
        }
        let before = snapshot(outer.path(), &case_dir);
        let out_path = case_dir.join("stdout");
        let err_path = case_dir.join("stderr");
        // SPARK_DEPLOY_HOSTILE_BIN runs the suite against another build (an older one, to see
        // what it let through).
        let bin = std::env::var_os("SPARK_DEPLOY_HOSTILE_BIN").map_or_else(
            || PathBuf::from(env!("CARGO_BIN_EXE_spark-deploy")),
            PathBuf::from,
        );
        let mut cmd = Command::new(bin);
        cmd.current_dir(&work)
            .env_clear()
            .env("HOME", &home)
            .env("PATH", "/usr/bin:/bin")
            .args(&c.args)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out_path).unwrap())
            .stderr(std::fs::File::create(&err_path).unwrap());
        for (k, v) in &c.env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let start = Instant::now();
        let status = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break Some(st);
            }
            if start.elapsed() > Duration::from_secs(10) {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(2));
        };
        let stdout = String::from_utf8_lossy(&std::fs::read(&out_path).unwrap()).into_owned();
        let stderr = String::from_utf8_lossy(&std::fs::read(&err_path).unwrap()).into_owned();
        let mut why = Vec::new();
        match status.map(|s| s.code()) {
            None => why.push("hung for 10 s".to_owned()),
            Some(code) if code != Some(c.code) => {
                why.push(format!("exit {code:?}, expected {}", c.code));
            }
            Some(_) => {}
        }
        // With --json the failure is one JSON object on stdout.
        let shown = format!("{stderr}{stdout}");
        if shown.contains("panicked") {
            why.push("panicked".to_owned());
        }
        if !shown.contains("remedy") {
            why.push("no remedy".to_owned());
        }
        for group in &c.needles {
            if !group.iter().any(|n| shown.contains(n.as_str())) {
                why.push(format!("the message names none of {group:?}"));
            }
        }
        for f in &c.forbidden {
            if stdout.contains(f.as_str()) || stderr.contains(f.as_str()) {
                why.push(format!("printed the secret {f:?}"));
            }
        }
        for a in &c.absent {
            if std::fs::symlink_metadata(work.join(a)).is_ok() {
                why.push(format!("{a} was written"));
            }
        }
        let after = snapshot(outer.path(), &case_dir);
        if before != after {
            why.push("something outside the case's directory changed".to_owned());
        }
        if !why.is_empty() {
            failures.push(format!(
                "case {i} {:?} ({}): {}\n  stderr: {}",
                c.name,
                c.args.join(" "),
                why.join("; "),
                stderr.trim_end().replace('\n', "\n          ")
            ));
        }
        std::fs::remove_dir_all(&case_dir).unwrap();
    }
    assert_eq!(
        std::fs::read(&victim).unwrap(),
        b"must stay unchanged",
        "the victim outside every case's directory"
    );
    assert!(
        !Path::new("/tmp/sd-hostile-pwned").exists(),
        "an injection ran"
    );
    failures
}

fn check(cases: &[Case], at_least: usize) {
    assert!(cases.len() >= at_least, "{} cases", cases.len());
    let failures = run_all(cases);
    assert!(
        failures.is_empty(),
        "{} of {} hostile cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

const NODES_HEAD: &str = "[[nodes]]\nname = \"head\"\nssh = \"local\"\n";
const NODES_WORKER: &str = "[[nodes]]\nname = \"worker-1\"\nssh = \"ops@spark-2\"\n";

/// `(field path, TOML document, key)` for each hostile value of each field.
fn toml_documents() -> Vec<(String, String, String)> {
    let mut docs = Vec::new();
    let mut add = |section: &str, key: &str, values: &[String], prefix: &str| {
        for v in values {
            docs.push((
                format!("{section}.{key}"),
                format!("[{section}]\n{prefix}{key} = {v}\n"),
                key.to_owned(),
            ));
        }
    };
    let s = |xs: &[&str]| xs.iter().map(|x| q(x)).collect::<Vec<_>>();
    let raw = |xs: &[&str]| xs.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
    let nan = raw(&["nan", "inf", "-inf", "-1.0", "1e308"]);
    // [serving]
    add(
        "serving",
        "max_tokens",
        &raw(&[
            "18446744073709551615",
            "9223372036854775807",
            "9223372036854775790",
            "0",
            "-1",
            "1114064",
        ]),
        "",
    );
    add(
        "serving",
        "context",
        &raw(&["9223372036854775807", "1", "2047", "-5", "1.5"]),
        "",
    );
    add(
        "serving",
        "parallel",
        &raw(&["0", "4294967296", "-1", "99"]),
        "",
    );
    add(
        "serving",
        "port",
        &raw(&["0", "65536", "-1", "\"8888\""]),
        "",
    );
    add("serving", "top_k", &raw(&["0", "-1", "4294967296"]), "");
    add(
        "serving",
        "temperature",
        &raw(&["nan", "inf", "-inf", "-0.1", "2.1"]),
        "",
    );
    add("serving", "top_p", &raw(&["nan", "0.0", "1.5", "-inf"]), "");
    add(
        "serving",
        "host",
        &s(&["0.0.0.0\n", "", "localhost; rm -rf /", "999.1.1.1"]),
        "",
    );
    add("serving", "api_key_file", &s(&["", "a\0b", "a\nb"]), "");
    // [watch]
    add("watch", "interval_s", &nan, "");
    add("watch", "wedge_s", &raw(&["nan", "inf", "0.0"]), "");
    add("watch", "probe_idle_s", &raw(&["nan", "inf"]), "");
    add("watch", "probe_timeout_s", &raw(&["nan", "-inf"]), "");
    add(
        "watch",
        "memory_floor_gib",
        &raw(&["nan", "-inf", "129.0"]),
        "",
    );
    add("watch", "max_heals_per_hour", &raw(&["61", "-1"]), "");
    // [lifecycle]
    add(
        "lifecycle",
        "min_avail_gib",
        &raw(&["0", "4294967296", "129"]),
        "",
    );
    add("lifecycle", "log_keep", &raw(&["1001", "-1"]), "");
    add(
        "lifecycle",
        "ready_timeout_s",
        &raw(&["0", "9223372036854775807"]),
        "",
    );
    add("lifecycle", "stop_timeout_s", &raw(&["0", "3601"]), "");
    add("lifecycle", "keep_generations", &raw(&["101"]), "");
    // [model]: revisions joined into cache paths, repo ids into Hub URLs and cache folders
    let refs = s(&[
        "../../escape",
        "/etc",
        "a/../../b",
        "x\0",
        "main\n",
        "a//b",
        ".hidden",
        "x.lock",
        "caf\u{e9}",
        "a b",
        "$(touch /tmp/sd-hostile-pwned)",
        "-rf",
        "",
        "refs/",
    ]);
    for key in ["revision", "kit_revision", "engram_revision"] {
        add("model", key, &refs, "");
    }
    add("model", "ablit_revision", &refs[..7], "ablit = true\n");
    let repos = s(&[
        "../..", "a/../b", "/abs/x", "noslash", "a/b/c", "-a/b", "a--b/c", "a/b\n", "a/b;rm",
        ".a/b",
    ]);
    for key in ["id", "engram_repo", "kit_repo"] {
        add("model", key, &repos, "");
    }
    add("model", "ablit_id", &repos[..4], "ablit = true\n");
    add(
        "model",
        "engram_files",
        &raw(&[
            "[\"../../x.safetensors\"]",
            "[\"/etc/passwd\"]",
            "[\"\"]",
            "[\"a/./b\"]",
            "[]",
            "[\"a\\u0000b\"]",
        ]),
        "",
    );
    add(
        "model",
        "served_name",
        &s(&["", "a b", "x\n", &"a".repeat(129)]),
        "",
    );
    // [engine]
    add(
        "engine",
        "commit",
        &s(&[
            "main",
            &"\u{e9}".repeat(20),
            &"\u{e9}".repeat(40),
            "5940208638",
            "59402086381a42c74d53053443224eec2790b4c",
            "59402086381a42c74d53053443224eec2790b4c55",
            "59402086381A42C74D53053443224EEC2790B4C5",
            "../../../../etc/passwd00000000000000000",
        ]),
        "",
    );
    add(
        "engine",
        "rendezvous_port",
        &raw(&["0", "8888", "70000"]),
        "",
    );
    add("engine", "runtime", &s(&["", "nvidia runc", "a;b"]), "");
    add(
        "engine",
        "repo",
        &s(&[
            "relative/path",
            "/a\0b",
            "--upload-pack=touch /tmp/sd-hostile-pwned:x",
            "ext::sh -c touch% /tmp/sd-hostile-pwned",
            "https://host/a b",
        ]),
        "",
    );
    add(
        "engine",
        "patches",
        &raw(&["[\"\"]", "[\"/p\\u0000\"]", "[\"--exec=x\"]"]),
        "",
    );
    // [deployment]
    add(
        "deployment",
        "name",
        &s(&["", "A", "../x", "-x", &"a".repeat(41), "x y"]),
        "",
    );
    add(
        "deployment",
        "state_dir",
        &s(&["", "/a\0b", "a\nb", "   "]),
        "",
    );
    add("deployment", "engine", &s(&["vllm"]), "");
    add("deployment", "worker_storage", &s(&["ftp"]), "");
    // [hub]
    add("hub", "cache", &s(&["/a\0b", "  ", "x\ny"]), "");
    add("hub", "ablit_cache", &s(&["", "\0"]), "");
    add("hub", "token_file", &s(&["/t\0"]), "");
    add(
        "hub",
        "endpoint",
        &s(&[
            "file:///etc/passwd",
            "ftp://hub.example",
            "http://",
            "javascript:alert(1)",
            "http://a b",
            "hub.example",
        ]),
        "",
    );
    // [storage]
    add(
        "storage",
        "head_nfs_server",
        &s(&[
            "198.18.0.1,nolock",
            "nfs.example",
            "198.18.0.1 ",
            "1.2.3.4\nx",
            "-o",
        ]),
        "",
    );
    add("storage", "nfs_volume", &s(&["", "/abs"]), "");
    add("storage", "nfs_path", &s(&["/x\0"]), "");
    docs
}

/// `(field, document, key)` for the `[[nodes]]` entries.
fn node_documents() -> Vec<(String, String, String)> {
    let mut docs = Vec::new();
    let mut worker = |key: &str, values: &[String]| {
        for v in values {
            docs.push((
                format!("nodes[1].{key}"),
                format!(
                    "{NODES_HEAD}[[nodes]]\nname = \"worker-1\"\n{}{key} = {v}\n",
                    if key == "ssh" {
                        ""
                    } else {
                        "ssh = \"ops@spark-2\"\n"
                    }
                ),
                key.to_owned(),
            ));
        }
    };
    let s = |xs: &[&str]| xs.iter().map(|x| q(x)).collect::<Vec<_>>();
    worker(
        "ssh",
        &s(&[
            "-oProxyCommand=touch /tmp/sd-hostile-pwned",
            "a b",
            "a\nb",
            "a\0b",
            "'x'",
            "",
            "local",
            "ops@",
            "x\"y",
        ]),
    );
    worker(
        "known_hosts",
        &s(&[
            "/k\"\nProxyCommand touch /tmp/sd-hostile-pwned",
            "%h",
            "${HOME}/kh",
            "-x",
            "/a\\b",
        ]),
    );
    worker("identity_file", &s(&["/id\n", "%d/id", "-i"]));
    worker("data_dir", &s(&["", "/a\0b", " "]));
    worker("hf_cache", &s(&["/a\0"]));
    worker("docker_socket", &s(&[""]));
    worker("network_mode", &s(&["bridge", "container:"]));
    worker("sysfs_root", &s(&["sys", ""]));
    worker("proc_root", &s(&["proc"]));
    worker("path", &["[\"/a:/b\"]".into(), "[\"rel\"]".into()]);
    worker(
        "fabric_addr",
        &s(&["127.0.0.1", "0.0.0.0", "224.0.0.1", "255.255.255.255", "x"]),
    );
    worker("ssh_port", &["0".into(), "65536".into(), "-22".into()]);
    worker("name", &s(&["head", "UPPER", ""]));
    docs.push((
        "nodes[0].ssh".into(),
        format!("[[nodes]]\nname = \"head\"\nssh = \"me@elsewhere\"\n{NODES_WORKER}"),
        "ssh".into(),
    ));
    docs.push(("nodes".into(), NODES_HEAD.to_owned(), "nodes".into()));
    docs.push((
        "nodes".into(),
        format!("{NODES_HEAD}{NODES_WORKER}[[nodes]]\nname = \"w2\"\nssh = \"w2\"\n"),
        "nodes".into(),
    ));
    docs
}

fn config_case(verb: &[&str], field: &str, doc: &str, key: &str) -> Case {
    let mut args = vec!["-c", "cfg.toml"];
    args.extend_from_slice(verb);
    Case::new(format!("{field}: {doc:?}"), &args)
        .file("cfg.toml", Entry::Text(doc.to_owned()))
        .needs_any(&[field, key])
        .env("HF_TOKEN", "hf_hostilesecret")
        .forbid("hf_hostilesecret")
}

#[test]
fn hostile_config_files_get_a_clear_error_from_config_check() {
    let cases: Vec<Case> = toml_documents()
        .into_iter()
        .chain(node_documents())
        .map(|(field, doc, key)| config_case(&["config", "check"], &field, &doc, &key))
        .collect();
    check(&cases, 250);
}

#[test]
fn hostile_config_files_get_the_same_error_from_plan_and_fetch() {
    let docs: Vec<_> = toml_documents()
        .into_iter()
        .chain(node_documents())
        .collect();
    let mut cases: Vec<Case> = docs
        .iter()
        .step_by(4)
        .map(|(field, doc, key)| config_case(&["plan"], field, doc, key))
        .collect();
    cases.extend(
        docs.iter()
            .skip(2)
            .step_by(9)
            .map(|(field, doc, key)| config_case(&["plan", "--json"], field, doc, key)),
    );
    // `fetch --revision` replaces model.revision: validated before any cache path is built.
    for rev in ["../../escape", "/etc", "a/../../b", "-x", "main/", "x.lock"] {
        cases.push(
            Case::new(
                format!("fetch --revision {rev}"),
                &["fetch", "--verify-only", &format!("--revision={rev}")],
            )
            .env("HF_HUB_OFFLINE", "1")
            .needs_any(&["model.revision"]),
        );
    }
    check(&cases, 90);
}

/// `(variable, value, what the message names)`.
const ENV_VALUES: &[(&str, &str, &str)] = &[
    ("MAX_TOKENS", "18446744073709551615", "serving.max_tokens"),
    ("MAX_TOKENS", "18446744073709551616", "MAX_TOKENS"),
    ("MAX_TOKENS", "18446744073709551598", "serving.max_tokens"),
    ("MAX_TOKENS", "-1", "MAX_TOKENS"),
    ("MAX_TOKENS", "0x10", "MAX_TOKENS"),
    ("CONTEXT", "18446744073709551615", "serving.context"),
    ("CONTEXT", "1e9", "CONTEXT"),
    ("PARALLEL", "4294967296", "PARALLEL"),
    ("PARALLEL", "0", "serving.parallel"),
    ("PORT", "65536", "PORT"),
    ("PORT", "0", "serving.port"),
    ("MASTER_PORT", "8888", "engine.rendezvous_port"),
    ("MIN_AVAIL_GIB", "4294967296", "MIN_AVAIL_GIB"),
    ("MIN_AVAIL_GIB", "0", "lifecycle.min_avail_gib"),
    ("LOG_KEEP", "99999", "lifecycle.log_keep"),
    (
        "WAIT_TIMEOUT",
        "18446744073709551615",
        "lifecycle.ready_timeout_s",
    ),
    ("STOP_TIMEOUT", "0", "lifecycle.stop_timeout_s"),
    (
        "WORKER",
        "-oProxyCommand=touch /tmp/sd-hostile-pwned",
        "nodes[1].ssh",
    ),
    ("WORKER", "a\nb", "nodes[1].ssh"),
    ("WORKER", "ops@host name", "nodes[1].ssh"),
    ("WORKER", "local", "nodes[1].ssh"),
    ("FABRIC_PEER", "1.2.3", "FABRIC_PEER"),
    ("FABRIC_PEER", "127.0.0.1", "nodes[1].fabric_addr"),
    ("MODEL_REVISION", "../../escape", "model.revision"),
    ("MODEL_REVISION", "/etc/passwd", "model.revision"),
    ("MODEL_ID", "../../x", "model.id"),
    ("ABLIT", "2", "ABLIT"),
    ("SERVED_NAME", "a b", "model.served_name"),
    (
        "HEAD_NFS_SERVER",
        "198.18.0.1,nolock",
        "storage.head_nfs_server",
    ),
    ("HEAD_NFS_SERVER", "nfs.example", "storage.head_nfs_server"),
    ("HF_ENDPOINT", "file:///etc/passwd", "hub.endpoint"),
    ("HF_HUB_CACHE", "/data/not-named-hub", "HF_HUB_CACHE"),
    ("WORKER_WEIGHTS", "ftp", "WORKER_WEIGHTS"),
    ("PREPARE", "maybe", "PREPARE"),
    ("THINKING", "perhaps", "THINKING"),
    ("IMAGE", "", "engine.image"),
    ("TF_DS_IDX_SPLIT", "", "engine.switches.TF_DS_IDX_SPLIT"),
];

#[test]
fn hostile_environment_overrides_name_the_variable_or_the_field() {
    let mut cases: Vec<Case> = ENV_VALUES
        .iter()
        .map(|(var, value, names)| {
            Case::new(format!("{var}={value:?}"), &["config", "check"])
                .env(var, value)
                .env("HF_TOKEN", "hf_hostilesecret")
                .needs_any(&[names, var])
                .forbid("hf_hostilesecret")
        })
        .collect();
    // Credentials in a refused endpoint are never echoed.
    cases.push(
        Case::new("HF_ENDPOINT with credentials", &["config", "check"])
            .env("HF_ENDPOINT", "ftp://alice:topsecretpw@hub.example")
            .needs_any(&["hub.endpoint"])
            .forbid("topsecretpw"),
    );
    cases.push(
        Case::new("HF_ENDPOINT with credentials, plan", &["plan"])
            .env("HF_ENDPOINT", "https://alice:topsecretpw@hub.example")
            .env("MAX_TOKENS", "0")
            .needs_any(&["serving.max_tokens"])
            .forbid("topsecretpw"),
    );
    // The same values through `plan`.
    cases.extend(ENV_VALUES.iter().step_by(3).map(|(var, value, names)| {
        Case::new(format!("plan {var}={value:?}"), &["plan"])
            .env(var, value)
            .needs_any(&[names, var])
    }));
    check(&cases, 45);
}

fn recipe_case(name: String, files: Vec<(String, Entry)>, needles: &[&str]) -> Case {
    let mut c = Case::new(name, &["init", "--from-recipe", "recipe"])
        .needs_any(needles)
        .absent("spark-deploy.toml")
        .absent(".spark-deploy.toml.partial");
    for (p, e) in files {
        c = c.file(&format!("recipe/{p}"), e);
    }
    c
}

#[test]
fn hostile_recipes_are_blamed_on_their_file_and_line_and_write_nothing() {
    let mut cases = Vec::new();
    for (n, (var, value, _)) in ENV_VALUES.iter().enumerate() {
        // Values the recipe reader skips (they would need a shell) or that hold a newline are
        // not assignments; the rest are imported and must be refused with file and line.
        if value.contains(['$', '`', ';', '(', '\n']) || value.is_empty() {
            continue;
        }
        let line = 1 + n % 5;
        let body = format!("{}{var}={value}\n", "# comment\n".repeat(line - 1));
        let (file, shown) = if n % 2 == 0 {
            (".env", format!(".env:{line}"))
        } else {
            ("scripts/local.sh", format!("local.sh:{line}"))
        };
        cases.push(recipe_case(
            format!("{file}:{line}: {var}={value:?}"),
            vec![(file.to_owned(), Entry::Text(body.clone()))],
            &[&shown],
        ));
        // Quoted and exported forms are the same assignment.
        cases.push(recipe_case(
            format!("{file}:{line}: export {var}=\"{value}\""),
            vec![(
                file.to_owned(),
                Entry::Text(format!(
                    "{}export {var}=\"{value}\"\n",
                    "# comment\n".repeat(line - 1)
                )),
            )],
            &[&shown],
        ));
    }
    // A NUL byte in a recipe value (a file can hold one, the environment cannot).
    for (body, shown) in [
        ("WORKER=ops@spark\0-2\n", ".env:1"),
        ("# x\nHF_HOME=/data/hf\0x\n", ".env:2"),
        ("\n\n\nMODEL_REVISION=main\0\n", ".env:4"),
    ] {
        cases.push(recipe_case(
            format!("NUL in {body:?}"),
            vec![(".env".into(), Entry::Text(body.into()))],
            &[shown],
        ));
    }
    // local.sh overrides .env: the winning line is blamed.
    cases.push(recipe_case(
        "local.sh wins and is blamed".into(),
        vec![
            (".env".into(), Entry::Text("PORT=8000\n".into())),
            (
                "scripts/local.sh".into(),
                Entry::Text("\n\nPORT=0\n".into()),
            ),
        ],
        &["local.sh:3"],
    ));
    // Not a recipe, or not regular files.
    cases.push(
        Case::new("no recipe directory", &["init", "--from-recipe", "nowhere"])
            .needs_any(&["nowhere", "no bash recipe"])
            .absent("spark-deploy.toml"),
    );
    cases.push(recipe_case(
        "empty recipe directory".into(),
        vec![("README".into(), Entry::Text("x".into()))],
        &["no bash recipe"],
    ));
    for (what, e, names) in [
        ("FIFO", Entry::Fifo, "FIFO"),
        ("directory", Entry::Dir, "directory"),
        (
            "device",
            Entry::Symlink(PathBuf::from("/dev/zero")),
            "character device",
        ),
        (
            "oversized",
            Entry::Bytes(b"# x\n".repeat(300_000)),
            "larger than",
        ),
        (
            "not UTF-8",
            Entry::Bytes(b"PORT=\xff\xfe\n".to_vec()),
            "UTF-8",
        ),
    ] {
        for file in [".env", "scripts/local.sh"] {
            cases.push(recipe_case(
                format!("{file} is a {what}"),
                vec![(file.into(), e.clone())],
                &[names],
            ));
        }
    }
    check(&cases, 70);
}

#[test]
fn config_files_that_are_not_regular_files_are_refused_without_blocking() {
    let mut cases = Vec::new();
    for (what, e, names) in [
        ("FIFO", Entry::Fifo, "FIFO"),
        ("directory", Entry::Dir, "directory"),
        (
            "device",
            Entry::Symlink(PathBuf::from("/dev/zero")),
            "character device",
        ),
        (
            "oversized",
            Entry::Bytes(b"# x\n".repeat(300_000)),
            "larger than",
        ),
        (
            "not UTF-8",
            Entry::Bytes(b"[serving]\nhost = \"\xff\"\n".to_vec()),
            "UTF-8",
        ),
        (
            "dangling symlink",
            Entry::Symlink(PathBuf::from("nowhere.toml")),
            "cfg.toml",
        ),
    ] {
        for verb in [&["config", "check"][..], &["plan"], &["plan", "--json"]] {
            let mut args = vec!["-c", "cfg.toml"];
            args.extend_from_slice(verb);
            cases.push(
                Case::new(format!("config is a {what}"), &args)
                    .file("cfg.toml", e.clone())
                    .needs_any(&[names])
                    .needs_any(&["cfg.toml"]),
            );
        }
    }
    // Unknown keys and wrong types name the key.
    for (doc, key) in [
        ("[serving]\nbogus = 1\n", "bogus"),
        ("[bogus]\n", "bogus"),
        ("serving = 3\n", "serving"),
        ("[serving]\nport = \"x\"\n", "port"),
        ("[[nodes]]\nname = \"h\"\n", "ssh"),
        ("[serving\n", "serving"),
    ] {
        cases.push(
            Case::new(
                format!("parse: {doc:?}"),
                &["-c", "cfg.toml", "config", "check"],
            )
            .file("cfg.toml", Entry::Text(doc.into()))
            .needs_any(&[key]),
        );
    }
    // `init` never overwrites without --force.
    cases.push(
        Case::new("init over an existing file", &["init"])
            .file("spark-deploy.toml", Entry::Text("# mine\n".into()))
            .needs_any(&["already exists"]),
    );
    check(&cases, 24);
}

/// A closed pipe (`plan | head -0`) or a full disk (`plan > /dev/full`) ends the command with
/// exit 5 and a remedy, never the panic of `println!`.
#[test]
fn a_closed_or_full_stdout_ends_with_exit_5_not_a_panic() {
    let d = tempfile::tempdir().unwrap();
    let mut n = 0;
    for args in [
        &["plan"][..],
        &["plan", "--json"],
        &["config", "check"],
        &["config", "check", "--json"],
        &["init", "--stdout"],
    ] {
        for sink in ["closed pipe", "/dev/full"] {
            let stdout = if sink == "/dev/full" {
                Stdio::from(
                    std::fs::OpenOptions::new()
                        .write(true)
                        .open("/dev/full")
                        .unwrap(),
                )
            } else {
                let (reader, writer) = std::io::pipe().unwrap();
                drop(reader);
                Stdio::from(writer)
            };
            let o = Command::new(env!("CARGO_BIN_EXE_spark-deploy"))
                .current_dir(d.path())
                .env_clear()
                .env("HOME", d.path())
                .env("PATH", "/usr/bin:/bin")
                .env("WORKER", "ops@spark-2")
                .args(args)
                .stdin(Stdio::null())
                .stdout(stdout)
                .stderr(Stdio::piped())
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(5), "{args:?} > {sink}: {err}");
            assert!(
                err.contains("cannot write the output to stdout")
                    && err.contains("remedy")
                    && !err.contains("panicked"),
                "{args:?} > {sink}: {err}"
            );
            n += 1;
        }
    }
    assert_eq!(n, 10);
}

/// A FIFO where the token file or the API key file is expected never blocks: `config check`
/// reports the token as absent, `api-key` refuses the file (exit 3, naming it).
#[test]
fn a_fifo_as_the_token_or_the_key_file_never_blocks() {
    let d = tempfile::tempdir().unwrap();
    let fifo = d.path().join("fifo");
    mkfifo(&fifo);
    let cfg = d.path().join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "[deployment]\nstate_dir = {}\n[serving]\napi_key_file = {}\n",
            q(&d.path().display().to_string()),
            q(&fifo.display().to_string())
        ),
    )
    .unwrap();
    for (args, code, needle) in [(&["config", "check"][..], 0, ""), (&["api-key"], 3, "FIFO")] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_spark-deploy"))
            .current_dir(d.path())
            .env_clear()
            .env("HOME", d.path())
            .env("PATH", "/usr/bin:/bin")
            .env("HF_TOKEN_PATH", &fifo)
            .arg("-c")
            .arg(&cfg)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let start = Instant::now();
        while child.try_wait().unwrap().is_none() {
            if start.elapsed() > Duration::from_secs(10) {
                let _ = child.kill();
                panic!("{args:?} blocked on a FIFO");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(code), "{args:?}: {err}");
        assert!(err.contains(needle) && !err.contains("panicked"), "{err}");
    }
}
