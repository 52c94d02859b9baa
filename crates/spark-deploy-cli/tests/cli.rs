//! The CLI's behaviour: secrets, validation errors and exit codes, init, snapshots.

// An integration test: a failed unwrap or expect is the test failure, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{run, stderr, stdout};

const TOKEN: &str = "hf_secretTOKEN1234567890";
const API_KEY: &str = "sk-apikeyVALUE0987654321";

#[test]
fn secrets_change_no_byte_of_the_plan() {
    let d = tempfile::tempdir().unwrap();
    for args in [
        &["plan", "--json"][..],
        &["plan"][..],
        &["config", "check", "--json"][..],
    ] {
        let a = run(
            d.path(),
            args,
            &[("HF_TOKEN", TOKEN), ("SPARK_DEPLOY_API_KEY", API_KEY)],
        );
        let b = run(
            d.path(),
            args,
            &[("HF_TOKEN", "hf_other"), ("SPARK_DEPLOY_API_KEY", "other")],
        );
        assert!(a.status.success(), "{}", stderr(&a));
        assert_eq!(
            stdout(&a),
            stdout(&b),
            "the secret's value must not influence {args:?}"
        );
        for out in [stdout(&a), stderr(&a)] {
            assert!(
                !out.contains(TOKEN) && !out.contains(API_KEY),
                "secret leaked in {args:?}"
            );
            assert!(!out.contains("hf_secret"), "secret prefix leaked");
        }
        if args[0] == "plan" {
            assert!(stdout(&a).contains("***"), "secrets show as ***");
        }
    }
}

#[test]
fn context_0_plans_the_largest_that_fits_computed_at_preflight() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("spark-deploy.toml"), "").unwrap();
    let o = run(d.path(), &["config", "check"], &[("CONTEXT", "0")]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let p = run(d.path(), &["plan"], &[("CONTEXT", "0")]);
    assert_eq!(p.status.code(), Some(0), "{}", stderr(&p));
    assert!(
        stdout(&p)
            .contains("--context '<largest CONTEXT that fits every node, computed at preflight>'"),
        "{}",
        stdout(&p)
    );
}

#[test]
fn bad_configs_name_the_field_and_exit_3() {
    let d = tempfile::tempdir().unwrap();
    type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);
    let cases: &[Case<'_>] = &[
        ("[serving]\ncontxt = 4096\n", &[], "contxt"),
        ("", &[("CONTEXT", "1")], "serving.context"),
        ("", &[("PARALLEL", "5")], "serving.parallel"),
        (
            "[[nodes]]\nname = \"head\"\nssh = \"local\"\n",
            &[],
            "nodes",
        ),
        ("", &[("CONTEXT", "many")], "CONTEXT"),
    ];
    for (file, env, field) in cases {
        std::fs::write(d.path().join("spark-deploy.toml"), file).unwrap();
        let o = run(d.path(), &["config", "check"], env);
        assert_eq!(o.status.code(), Some(3), "{file} {env:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains(field),
            "message must name {field}: {}",
            stderr(&o)
        );
        let p = run(d.path(), &["plan", "--json"], env);
        assert_eq!(p.status.code(), Some(3));
        let v: serde_json::Value = serde_json::from_str(&stdout(&p)).unwrap();
        assert!(v["error"].as_str().unwrap().contains(field));
    }
    let u = run(d.path(), &["plan", "--no-such-flag"], &[]);
    assert_eq!(u.status.code(), Some(2));
}

#[test]
fn init_writes_a_config_that_checks() {
    let d = tempfile::tempdir().unwrap();
    let o = run(d.path(), &["init"], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(d.path().join("spark-deploy.toml")).unwrap();
    assert!(text.contains("# Shared KV pool"));
    assert!(run(d.path(), &["config", "check"], &[]).status.success());
    assert_eq!(
        run(d.path(), &["init"], &[]).status.code(),
        Some(3),
        "refuses to overwrite"
    );
}

#[test]
fn init_from_recipe_imports_plain_lines_only() {
    let d = tempfile::tempdir().unwrap();
    let recipe = d.path().join("recipe");
    std::fs::create_dir_all(recipe.join("scripts")).unwrap();
    std::fs::write(recipe.join(".env"), "CONTEXT=262144\nNFS_VOLUME=\n").unwrap();
    std::fs::write(
        recipe.join("scripts/local.sh"),
        format!("WORKER=ops@192.0.2.2\nHF_TOKEN={TOKEN}\ntouch pwned\n"),
    )
    .unwrap();
    let o = run(d.path(), &["init", "--from-recipe", "recipe"], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("not imported") && err.contains("local.sh:3"),
        "{err}"
    );
    assert!(
        !d.path().join("pwned").exists() && !recipe.join("pwned").exists(),
        "nothing is executed"
    );
    let text = std::fs::read_to_string(d.path().join("spark-deploy.toml")).unwrap();
    assert!(
        !text.contains(TOKEN) && !err.contains(TOKEN),
        "token never written"
    );
    assert!(
        text.contains("ops@192.0.2.2")
            && text.contains("262144")
            && text.contains("worker_storage = \"copy\""),
        "{text}"
    );
    let plan = common::plan_json(d.path(), &[]);
    assert_eq!(plan["deployment"]["context"], 262_144);
}

#[test]
fn plan_snapshots() {
    let d = tempfile::tempdir().unwrap();
    let json = run(d.path(), &["plan", "--json"], &[]);
    let text = run(d.path(), &["plan"], &[]);
    insta::assert_snapshot!("plan_default_json", stdout(&json));
    insta::assert_snapshot!("plan_default_text", stdout(&text));
}

/// The four-Spark example config, unchanged: `plan` shows every rank's container, followers 3,
/// 2, 1 and then rank 0, each follower joining its own rendezvous port.
#[test]
fn plan_four_nodes_snapshot() {
    let d = tempfile::tempdir().unwrap();
    let example =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/four-sparks.toml");
    std::fs::copy(&example, d.path().join("spark-deploy.toml")).unwrap();
    let check = run(d.path(), &["config", "check"], &[]);
    assert_eq!(check.status.code(), Some(0), "{}", stderr(&check));
    let text = run(d.path(), &["plan"], &[]);
    assert_eq!(text.status.code(), Some(0), "{}", stderr(&text));
    let out = stdout(&text);
    let starts: Vec<&str> = out
        .lines()
        .filter_map(|l| l.trim().strip_prefix('[')?.split_once("] start rank "))
        .map(|(_, rest)| rest)
        .collect();
    assert_eq!(
        starts,
        [
            "3 (dsv41-rank3)",
            "2 (dsv41-rank2)",
            "1 (dsv41-rank1)",
            "0 (dsv41-rank0)"
        ],
        "{out}"
    );
    assert!(
        out.contains("29620, 29621, 29622 (rendezvous) free"),
        "{out}"
    );
    insta::assert_snapshot!("plan_four_nodes_text", out);
}
