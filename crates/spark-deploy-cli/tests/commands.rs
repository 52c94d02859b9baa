//! The command line's conventions: help, flags, exit codes, `--json`, output modes.

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

#[test]
fn status_exits_1_when_nothing_serves() {
    let d = tempfile::tempdir().unwrap();
    // A head whose Docker socket does not exist, a worker whose SSH port refuses, no API.
    std::fs::write(
        d.path().join("spark-deploy.toml"),
        format!(
            "[deployment]\nstate_dir = \"{0}\"\n[serving]\nport = 1\n\
             [[nodes]]\nname = \"head\"\nssh = \"local\"\ndocker_socket = \"{0}/none.sock\"\n\
             [[nodes]]\nname = \"w\"\nssh = \"nobody@127.0.0.1\"\nssh_port = 1\n\
             fabric_addr = \"198.18.9.2\"\n",
            d.path().display()
        ),
    )
    .unwrap();
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
