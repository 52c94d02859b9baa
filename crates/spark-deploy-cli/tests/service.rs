//! `service install|status|uninstall|boot|wait` without a testbed: the unit files systemd would
//! load (checked by `systemd-analyze verify`), the stop marker, the wait for an unreachable
//! worker. The bring-back on a real pair is `testbed_service_boot_brings_the_pair_back_after_a_worker_restart`
//! in `testbed_cli.rs`.

// An integration test: a failed unwrap or expect is the test failure, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;

use common::{run, stderr, stdout};

/// A deployment whose worker's SSH port refuses (fails fast, touches nothing).
fn config(dir: &Path) {
    std::fs::write(
        dir.join("spark-deploy.toml"),
        format!(
            "[deployment]\nname = \"svc-test\"\nstate_dir = \"{0}/state\"\n\
             [hub]\ncache = \"{0}/hf\"\nendpoint = \"http://127.0.0.1:1\"\n\
             [serving]\nport = 1\n\
             [[nodes]]\nname = \"head\"\nssh = \"local\"\ndocker_socket = \"{0}/none.sock\"\n\
             [[nodes]]\nname = \"w\"\nssh = \"nobody@127.0.0.1\"\nssh_port = 1\n",
            dir.display()
        ),
    )
    .unwrap();
}

#[test]
fn service_install_writes_units_that_systemd_analyze_verify_accepts() {
    let d = tempfile::tempdir().unwrap();
    config(d.path());
    let units = d.path().join("units");
    let u = units.display().to_string();
    let o = run(d.path(), &["service", "install", "--unit-dir", &u], &[]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("systemctl daemon-reload && systemctl enable spark-deploy-svc-test.service"),
        "not the system directory: says what to run: {out}"
    );
    let main = units.join("spark-deploy-svc-test.service");
    let link = units.join("spark-deploy-svc-test-link.service");
    let text = std::fs::read_to_string(&main).unwrap();
    let exe = std::fs::canonicalize(env!("CARGO_BIN_EXE_spark-deploy")).unwrap();
    let cfg = std::fs::canonicalize(d.path().join("spark-deploy.toml")).unwrap();
    assert!(
        text.contains(&format!(
            "ExecStart={} --config {} service boot\n",
            exe.display(),
            cfg.display()
        )),
        "{text}"
    );
    assert!(
        text.contains(
            "After=network-online.target docker.service spark-deploy-svc-test-link.service"
        ),
        "{text}"
    );
    assert!(
        std::fs::read_to_string(&link)
            .unwrap()
            .contains("service wait --timeout 900")
    );

    // systemd's own checker: syntax, known settings, the ExecStart binaries exist.
    let v = std::process::Command::new("systemd-analyze")
        .arg("verify")
        .args([&link, &main])
        .output()
        .unwrap();
    let (vo, ve) = (
        String::from_utf8_lossy(&v.stdout),
        String::from_utf8_lossy(&v.stderr),
    );
    assert!(
        v.status.success() && ve.trim().is_empty() && vo.trim().is_empty(),
        "systemd-analyze verify: {vo}{ve}"
    );

    let o = run(
        d.path(),
        &["service", "status", "--unit-dir", &u, "--json"],
        &[],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let s: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert!(
        s["units"]
            .as_array()
            .unwrap()
            .iter()
            .all(|u| u["present"] == true && u["current"] == true),
        "{s}"
    );
    assert_eq!(s["stop_marker"], serde_json::Value::Null);

    let o = run(d.path(), &["service", "uninstall", "--unit-dir", &u], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        std::fs::read_dir(&units).unwrap().count(),
        0,
        "both units removed"
    );
    let o = run(d.path(), &["service", "status", "--unit-dir", &u], &[]);
    assert_eq!(o.status.code(), Some(1), "not installed: {}", stdout(&o));
    assert!(stdout(&o).contains("not installed"), "{}", stdout(&o));
}

#[test]
fn service_boot_stays_down_under_the_stop_marker_and_names_an_unreachable_worker() {
    let d = tempfile::tempdir().unwrap();
    config(d.path());
    // Unreachable worker: the wait gives up naming the worker's SSH, exit 5 (the unit retries).
    let o = run(
        d.path(),
        &["service", "boot", "--timeout", "1", "--no-watch"],
        &[],
    );
    assert_eq!(o.status.code(), Some(5), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stderr(&o).contains("the pair is not reachable") && stderr(&o).contains("w SSH"),
        "{}",
        stderr(&o)
    );
    // The supervisor's stop marker: stay down, exit 0 (the unit does not retry), say why.
    let marker = d.path().join("state/watch/stop");
    std::fs::create_dir_all(marker.parent().unwrap()).unwrap();
    std::fs::write(&marker, r#"{"reason": "3 heals within an hour"}"#).unwrap();
    let o = run(d.path(), &["service", "boot", "--timeout", "1"], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("staying down: 3 heals within an hour"),
        "{}",
        stderr(&o)
    );
    let o = run(
        d.path(),
        &[
            "service",
            "status",
            "--unit-dir",
            &d.path().join("u").display().to_string(),
        ],
        &[],
    );
    assert!(
        stdout(&o).contains("stop marker: set (3 heals within an hour)"),
        "{}",
        stdout(&o)
    );
}
