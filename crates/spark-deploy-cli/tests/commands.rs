//! The command line's conventions: help, flags, exit codes, `--json`, output modes.

// An integration test: a failed unwrap or expect is the test failure, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{run, stderr, stdout};

/// The verbs `--help` lists (clap's own `help` aside).
fn verbs(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .filter(|v| v != "help")
        .collect()
}

#[test]
fn help_says_what_the_tool_does_and_the_readme_lists_every_verb() {
    let d = tempfile::tempdir().unwrap();
    let o = run(d.path(), &["--help"], &[]);
    assert!(o.status.success());
    let help = stdout(&o);
    assert!(
        help.starts_with("Deploy one large model across NVIDIA DGX Sparks")
            && help.contains("OpenAI-compatible API"),
        "{help}"
    );
    let verbs = verbs(&help);
    assert!(verbs.len() >= 14, "{verbs:?}");
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let table: Vec<&str> = readme
        .lines()
        .skip_while(|l| !l.starts_with("| Command | What it does |"))
        .take_while(|l| l.starts_with('|'))
        .collect();
    for v in &verbs {
        assert!(
            table
                .iter()
                .any(|row| row.starts_with(&format!("| `spark-deploy {v}"))),
            "the README's command table has no row for `{v}`"
        );
    }
}

#[test]
fn fetch_takes_a_revision_flag_that_replaces_model_revision() {
    let d = tempfile::tempdir().unwrap();
    let help = stdout(&run(d.path(), &["fetch", "--help"], &[]));
    assert!(help.contains("--revision <REV>"), "{help}");
    // The flag reaches the configuration: a value no revision can have is refused by name,
    // before anything touches the network.
    let o = run(d.path(), &["fetch", "--revision", "not a revision!"], &[]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("model.revision") && stderr(&o).contains("not a revision!"),
        "{}",
        stderr(&o)
    );
    // ...and wins over the environment's MODEL_REVISION.
    let o = run(
        d.path(),
        &["fetch", "--revision", "bad rev"],
        &[("MODEL_REVISION", "0123456789abcdef0123456789abcdef01234567")],
    );
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(stderr(&o).contains("bad rev"), "{}", stderr(&o));
}

#[test]
fn logs_refuses_a_rank_the_deployment_does_not_have_and_a_bad_since() {
    let d = tempfile::tempdir().unwrap();
    let o = run(d.path(), &["logs", "--rank", "9"], &[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("--rank 9") && e.contains("0 (head) and 1 (") && e.contains("remedy"),
        "the error names the valid ranks: {e}"
    );
    let o = run(d.path(), &["logs", "--since", "yesterday-ish"], &[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("10m"), "{}", stderr(&o));
}

/// A deployment whose head Docker socket does not exist, whose worker's SSH port refuses, whose
/// Hub refuses and whose API nobody serves: every command fails fast, touching nothing.
fn unreachable_config(dir: &std::path::Path) {
    std::fs::write(
        dir.join("spark-deploy.toml"),
        format!(
            "[deployment]\nstate_dir = \"{0}\"\n[hub]\ncache = \"{0}/hf\"\n\
             endpoint = \"http://127.0.0.1:1\"\n[lifecycle]\nmin_avail_gib = 1\n\
             [serving]\nport = 1\n\
             [[nodes]]\nname = \"head\"\nssh = \"local\"\ndocker_socket = \"{0}/none.sock\"\n\
             [[nodes]]\nname = \"w\"\nssh = \"nobody@127.0.0.1\"\nssh_port = 1\n\
             fabric_addr = \"198.18.9.2\"\n",
            dir.display()
        ),
    )
    .unwrap();
}

#[test]
fn status_exits_1_when_nothing_serves() {
    let d = tempfile::tempdir().unwrap();
    unreachable_config(d.path());
    let o = run(d.path(), &["status"], &[]);
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains(": down"), "{}", stdout(&o));
    assert!(
        !stderr(&o).contains("error"),
        "not serving is a state, not an error: {}",
        stderr(&o)
    );
    let o = run(d.path(), &["status", "--json"], &[]);
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["overall"], "down");
}

/// A config whose key file lives in `dir`, with `extra` appended to `[serving]`.
fn keyed_config(dir: &std::path::Path, extra: &str) {
    std::fs::write(
        dir.join("spark-deploy.toml"),
        format!(
            "[deployment]\nstate_dir = \"{}\"\n[serving]\n{extra}\n",
            dir.display()
        ),
    )
    .unwrap();
}

#[test]
fn the_api_key_variable_and_the_key_file_never_disagree_silently() {
    use std::os::unix::fs::PermissionsExt as _;
    let d = tempfile::tempdir().unwrap();
    keyed_config(d.path(), "");
    let file = d.path().join("api-key");
    std::fs::write(&file, "spark-deploy: sk-the-files-key\n").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let o = run(d.path(), &["api-key"], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "sk-the-files-key\n");
    let o = run(
        d.path(),
        &["api-key"],
        &[("SPARK_DEPLOY_API_KEY", "sk-the-files-key")],
    );
    assert_eq!(stdout(&o), "sk-the-files-key\n", "{}", stderr(&o));
    let o = run(
        d.path(),
        &["api-key", "--json"],
        &[("SPARK_DEPLOY_API_KEY", "sk-the-files-key")],
    );
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["api_key"], "sk-the-files-key");
    // Another key in the environment is an error naming both sources, showing neither key.
    let o = run(
        d.path(),
        &["api-key"],
        &[("SPARK_DEPLOY_API_KEY", "sk-another-key")],
    );
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("SPARK_DEPLOY_API_KEY differs from the key in")
            && e.contains(&file.display().to_string())
            && e.contains("remedy"),
        "{e}"
    );
    assert!(
        !e.contains("sk-") && stdout(&o).is_empty(),
        "no key shown: {e}"
    );
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "spark-deploy: sk-the-files-key\n",
        "the file is unchanged"
    );
}

#[test]
fn auth_none_gives_rank_0_no_key_and_is_warned_beyond_loopback() {
    let d = tempfile::tempdir().unwrap();
    keyed_config(d.path(), "");
    let keyed = stdout(&run(d.path(), &["plan", "--json"], &[]));
    assert!(keyed.contains("--api-key-file") && keyed.contains("/run/spark-deploy/api-key"));

    keyed_config(d.path(), "auth = \"none\"");
    let o = run(d.path(), &["plan", "--json"], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let open = stdout(&o);
    assert!(
        !open.contains("--api-key-file") && !open.contains("/run/spark-deploy/api-key"),
        "rank 0 gets neither the flag nor the file"
    );
    let o = run(d.path(), &["config", "check"], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("serving.auth") && stderr(&o).contains("0.0.0.0"),
        "bound to every address without a key is warned: {}",
        stderr(&o)
    );
    let o = run(d.path(), &["api-key"], &[]);
    assert_eq!(o.status.code(), Some(3));
    assert!(
        stderr(&o).contains("serving.auth = \"none\""),
        "{}",
        stderr(&o)
    );

    keyed_config(d.path(), "auth = \"none\"\nhost = \"127.0.0.1\"");
    let o = run(d.path(), &["config", "check"], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        !stderr(&o).contains("serving.auth"),
        "loopback only: {}",
        stderr(&o)
    );

    keyed_config(d.path(), "auth = \"maybe\"");
    let o = run(d.path(), &["config", "check"], &[]);
    assert_eq!(o.status.code(), Some(3));
    assert!(stderr(&o).contains("auth"), "{}", stderr(&o));
}

#[test]
fn up_refuses_a_differing_api_key_variable_before_touching_anything() {
    use std::os::unix::fs::PermissionsExt as _;
    let d = tempfile::tempdir().unwrap();
    keyed_config(d.path(), "");
    let file = d.path().join("api-key");
    std::fs::write(&file, "spark-deploy: sk-the-files-key\n").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    for verb in ["up", "restart"] {
        let o = run(
            d.path(),
            &[verb],
            &[("SPARK_DEPLOY_API_KEY", "sk-another-key")],
        );
        assert_eq!(o.status.code(), Some(3), "{verb}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("SPARK_DEPLOY_API_KEY differs"),
            "{}",
            stderr(&o)
        );
        assert!(
            !stderr(&o).contains("==> Preflight"),
            "nothing ran: {}",
            stderr(&o)
        );
    }
}

#[test]
fn every_failure_is_printed_once_and_quiet_shows_only_failures() {
    let d = tempfile::tempdir().unwrap();
    unreachable_config(d.path());
    let o = run(d.path(), &["up"], &[]);
    assert_eq!(o.status.code(), Some(4), "{}", stderr(&o));
    let e = stderr(&o);
    assert_eq!(e.matches("Preflight failed").count(), 1, "{e}");
    assert_eq!(
        e.matches("cannot connect for remote commands").count(),
        1,
        "the worker's failed check once: {e}"
    );
    assert!(e.contains("==> Preflight"), "{e}");

    let q = run(d.path(), &["-q", "up"], &[]);
    assert_eq!(q.status.code(), Some(4));
    let e = stderr(&q);
    assert!(
        !e.contains("==>") && !e.contains("exec: local"),
        "quiet: {e}"
    );
    assert_eq!(e.matches("Preflight failed").count(), 1, "{e}");
    assert_eq!(
        e.matches("cannot connect for remote commands").count(),
        1,
        "{e}"
    );

    // A download failure: the step's failure once, not also the Hub client's own log of it.
    let f = run(d.path(), &["fetch"], &[]);
    assert_eq!(f.status.code(), Some(5), "{}", stderr(&f));
    let e = stderr(&f);
    assert_eq!(e.matches("FetchCheckpoint failed").count(), 1, "{e}");
    // The cause is shown once, and no dependency's own log line repeats it.
    assert_eq!(
        e.matches("Connection refused").count(),
        1,
        "no dependency log lines: {e}"
    );
}

#[test]
fn verbose_and_rust_log_show_debug_lines_through_tracing() {
    let d = tempfile::tempdir().unwrap();
    let plain = run(d.path(), &["plan"], &[]);
    assert!(plain.status.success());
    assert!(!stderr(&plain).contains("DEBUG"), "{}", stderr(&plain));
    for (args, env) in [
        (&["-v", "plan"][..], &[][..]),
        (&["plan"][..], &[("RUST_LOG", "spark_deploy=debug")][..]),
    ] {
        let o = run(d.path(), args, env);
        assert!(o.status.success(), "{}", stderr(&o));
        let e = stderr(&o);
        assert!(
            e.contains("DEBUG") && e.contains("command=Plan"),
            "{args:?} {env:?}: {e}"
        );
        assert!(
            !e.contains('\u{1b}'),
            "no colour codes off a terminal: {e:?}"
        );
    }
    let o = run(d.path(), &["-q", "-v", "plan"], &[]);
    assert_eq!(o.status.code(), Some(2), "-q and -v conflict");
}

#[test]
fn every_verb_honours_json_or_refuses_it() {
    let d = tempfile::tempdir().unwrap();
    unreachable_config(d.path());
    let fresh = tempfile::tempdir().unwrap();
    let o = run(fresh.path(), &["init", "--json"], &[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--json: `init`"), "{}", stderr(&o));
    assert!(
        !fresh.path().join("spark-deploy.toml").exists(),
        "refused: nothing written"
    );
    // Every other verb that runs here (demo and testbed bring the testbed up: see the testbed
    // tests) prints only JSON on stdout, whether it succeeds or fails.
    let missing = d.path().join("no-model").display().to_string();
    let units = d.path().join("units").display().to_string();
    let bundle = d.path().join("b.tar.gz").display().to_string();
    let cases: &[&[&str]] = &[
        &["config", "check", "--json"],
        &["plan", "--json"],
        &["status", "--json"],
        &["logs", "--json"],
        &["api-key", "--json"],
        &["preflight", "--json"],
        &["up", "--json"],
        &["down", "--json"],
        &["restart", "--json"],
        &["fetch", "--json"],
        &["fetch", "--verify-only", "--json"],
        &["service", "status", "--unit-dir", &units, "--json"],
        &["support-bundle", "--out", &bundle, "--json"],
        &[
            "rank-cache",
            "index-only",
            &missing,
            "/tmp",
            "0",
            "2",
            "--json",
        ],
    ];
    for args in cases {
        let o = run(d.path(), args, &[]);
        let out = stdout(&o);
        assert!(
            !out.trim().is_empty(),
            "{args:?} printed nothing on stdout: {}",
            stderr(&o)
        );
        for line in out.lines().filter(|l| !l.trim().is_empty()) {
            assert!(
                serde_json::from_str::<serde_json::Value>(line).is_ok()
                    || serde_json::from_str::<serde_json::Value>(&out).is_ok(),
                "{args:?}: not JSON: {line}"
            );
        }
    }
    // Failures covered by the --json document too.
    let o = run(d.path(), &["up", "--json"], &[]);
    assert_eq!(o.status.code(), Some(4));
    let last = stdout(&o).lines().last().unwrap().to_owned();
    let v: serde_json::Value = serde_json::from_str(&last).unwrap();
    assert_eq!(v["exit_code"], 4, "{last}");
}

#[test]
fn dry_run_prints_the_plan_and_changes_nothing() {
    let d = tempfile::tempdir().unwrap();
    unreachable_config(d.path());
    for verb in ["up", "restart", "down"] {
        let o = run(d.path(), &[verb], &[("DRY_RUN", "1")]);
        let (out, err) = (stdout(&o), stderr(&o));
        assert_eq!(o.status.code(), Some(0), "DRY_RUN=1 {verb}: {out}{err}");
        assert!(
            err.contains("DRY_RUN=1: printing the plan; nothing is stopped, started or prepared"),
            "{verb}: {err}"
        );
        let last = if verb == "down" { "Stop" } else { "Smoke" };
        assert!(out.contains(last), "DRY_RUN=1 {verb} shows its plan: {out}");
        // The unreachable worker's checks failed, and were shown, not fatal.
        if verb != "down" {
            assert!(err.contains("w"), "{err}");
        }
    }
    // Nothing was created: no cache, no lock, no key.
    let left: Vec<String> = std::fs::read_dir(d.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        left,
        vec!["spark-deploy.toml".to_owned()],
        "a dry run created files"
    );
    // --dry-run is the same switch; --json gives the plan and the checks as one document.
    let o = run(d.path(), &["up", "--dry-run", "--json"], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let doc = stdout(&o);
    let last = doc.lines().last().unwrap();
    let v: serde_json::Value = serde_json::from_str(last).unwrap();
    assert!(v["dry_run"]["plan"]["steps"].is_array(), "{v}");
    assert!(v["dry_run"]["preflight"]["results"].is_array(), "{v}");
    // DRY_RUN=0 is a real run (it fails the unreachable worker's preflight: exit 4).
    let o = run(d.path(), &["up"], &[("DRY_RUN", "0")]);
    assert_eq!(o.status.code(), Some(4), "{}", stderr(&o));
}

#[test]
fn watch_pause_resume_status_and_ctrl_c_exits_130() {
    let d = tempfile::tempdir().unwrap();
    unreachable_config(d.path());
    let o = run(d.path(), &["watch", "pause", "30m"], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("watch paused until"), "{}", stdout(&o));
    assert!(d.path().join("watch/pause").is_file());
    let o = run(d.path(), &["watch", "pause", "soon"], &[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let o = run(d.path(), &["status", "--json"], &[]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["watch"]["state"], "not running");
    assert!(v["watch"]["paused_until"].is_string(), "{v}");

    // Foreground: samples until Ctrl-C, then exits 130 with its state written.
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_spark-deploy"))
        .current_dir(d.path())
        .env_clear()
        .env("HOME", "/home/spark")
        .env("PATH", "/usr/bin:/bin")
        .args(["watch", "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let state = d.path().join("watch/state.json");
    let t = std::time::Instant::now();
    while !d.path().join("watch/samples.jsonl").is_file() && t.elapsed().as_secs() < 20 {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let pid = i32::try_from(child.id()).unwrap();
    assert!(
        std::process::Command::new("kill")
            .args(["-INT", &pid.to_string()])
            .status()
            .unwrap()
            .success()
    );
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(130), "{}", stderr(&o));
    let events = stdout(&o);
    assert!(
        events.contains("\"supervisor\":\"watch\"") && events.contains("not acting: paused until"),
        "{events}"
    );
    let st: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&state).unwrap()).unwrap();
    assert_eq!(st["state"], "exited");

    let o = run(d.path(), &["watch", "resume"], &[]);
    assert!(o.status.success());
    assert!(!d.path().join("watch/pause").exists());
}
