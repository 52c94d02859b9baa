//! Contract tests: the plan's rank containers obey the engine's launch lines (docs/engine-contract.md, "Launch lines"), checked
//! independently of the code that renders them (the rules are restated here from the contract).

// An integration test: a failed unwrap or expect is the test failure, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;

use serde_json::Value;

/// The follower's flags; anything else is `error.BadArgument`.
const FOLLOWER_FLAGS: &[&str] = &[
    "--pool",
    "--drafts",
    "--arena-gib",
    "--engram",
    "--token-map",
    "--rdma",
    "--rdma-kernels",
    "--graphs",
    "--side",
    "--prefetch",
    "--aio",
    "--profile",
    "--serial",
];

#[derive(Debug)]
struct Follower {
    positional: Vec<String>,
    flags: BTreeMap<String, String>,
}

/// Parses rank 1's argv with the engine's strict rules: 7 positionals, then `--key value` pairs,
/// no dangling key, no unknown key, no repeated key.
fn parse_follower(argv: &[String]) -> Result<Follower, String> {
    if !argv[0].ends_with("/tf-dsv41-lanes") {
        return Err(format!("binary {}", argv[0]));
    }
    let rest = &argv[1..];
    if rest.len() < 7 || rest[..7].iter().any(|a| a.starts_with("--")) {
        return Err("fewer than 7 positional arguments".into());
    }
    let mut flags = BTreeMap::new();
    let pairs = &rest[7..];
    if !pairs.len().is_multiple_of(2) {
        return Err(format!("dangling key {}", pairs.last().unwrap()));
    }
    for kv in pairs.chunks(2) {
        if !FOLLOWER_FLAGS.contains(&kv[0].as_str()) {
            return Err(format!("unknown key {}", kv[0]));
        }
        if kv[1].starts_with("--") {
            return Err(format!("{} has no value", kv[0]));
        }
        if flags.insert(kv[0].clone(), kv[1].clone()).is_some() {
            return Err(format!("repeated {}", kv[0]));
        }
    }
    Ok(Follower {
        positional: rest[..7].to_vec(),
        flags,
    })
}

fn containers(plan: &Value) -> Vec<Value> {
    plan["steps"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["actions"].as_array().unwrap().clone())
        .filter(|a| a["detail"]["type"] == "container")
        .map(|a| a["detail"].clone())
        .collect()
}

fn argv(c: &Value) -> Vec<String> {
    c["argv"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect()
}

fn env(c: &Value) -> BTreeMap<String, String> {
    c["env"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
        .collect()
}

fn flag_value(argv: &[String], key: &str) -> Option<String> {
    argv.iter()
        .position(|a| a == key)
        .map(|i| argv[i + 1].clone())
}

fn check_pair(plan: &Value) {
    let cs = containers(plan);
    assert_eq!(cs.len(), 2, "two ranks");
    assert_eq!(cs[0]["rank"], 1, "rank 1 starts first");
    assert_eq!(cs[1]["rank"], 0);
    let (a1, a0) = (argv(&cs[0]), argv(&cs[1]));
    let (e1, e0) = (env(&cs[0]), env(&cs[1]));
    let f = parse_follower(&a1).unwrap_or_else(|e| panic!("rank 1 argv refused: {e}: {a1:?}"));
    assert_eq!(
        &a0[..2],
        &["/engine/tensorfold-native".to_owned(), "serve".to_owned()]
    );

    for k in [
        "TF_TP_WORLD",
        "TF_TP_MASTER",
        "TF_TP_PORT",
        "TF_DS_RANK_CACHE",
        "TF_DS_KIT",
        "TF_DS_ENGRAM",
        "TF_DS_TOKEN_MAP",
    ] {
        assert!(e0.contains_key(k), "rank 0 lacks {k}");
    }
    // What both ranks must agree on: rank 0 value <-> rank 1 value.
    assert_eq!(a0[2], f.positional[0], "MODEL_DIR");
    assert_eq!(e0["TF_DS_RANK_CACHE"], f.positional[1], "rank cache dir");
    assert_eq!(f.positional[2], "1", "RANK");
    assert_eq!(e0["TF_TP_WORLD"], f.positional[3], "WORLD");
    assert_eq!(e0["TF_TP_MASTER"], f.positional[4], "MASTER");
    assert_eq!(e0["TF_TP_PORT"], f.positional[5], "PORT");
    assert_eq!(e0["TF_DS_KIT"], f.positional[6], "KIT");
    assert_eq!(e0["TF_DS_ENGRAM"], f.flags["--engram"]);
    assert_eq!(e0["TF_DS_TOKEN_MAP"], f.flags["--token-map"]);
    assert_eq!(
        flag_value(&a0, "--context").unwrap(),
        f.flags["--pool"],
        "--pool equals --context"
    );
    let drafts_off = a0.contains(&"--no-drafts".to_owned());
    assert_eq!(f.flags["--drafts"], if drafts_off { "0" } else { "1" });
    for (env_name, flag) in [
        ("TF_DS_GRAPHS", "--graphs"),
        ("TF_DS_HC_SIDE", "--side"),
        ("TF_DS_L2_PREFETCH", "--prefetch"),
        ("TF_DS_ENGRAM_AIO", "--aio"),
    ] {
        assert_eq!(e0[env_name], f.flags[flag], "{env_name} vs {flag}");
    }
    match (e0.get("TF_RDMA_DEVICES"), f.flags.get("--rdma")) {
        (Some(d0), Some(d1)) => assert_eq!(
            d0.split(',').count(),
            d1.split(',').count(),
            "RDMA device count"
        ),
        (None, None) => {}
        other => panic!("RDMA devices on one rank only: {other:?}"),
    }
    // Env both ranks read from their environment must be identical.
    for (k, v) in &e0 {
        let per_node = [
            "NCCL_SOCKET_IFNAME",
            "NCCL_IB_HCA",
            "NCCL_IB_GID_INDEX",
            "TF_RDMA_GID_INDEX",
        ]
        .contains(&k.as_str());
        let rank0_only = k.starts_with("TF_TP_")
            || [
                "TF_DS_RANK_CACHE",
                "TF_DS_KIT",
                "TENSORFOLD_CUDA_KERNELS",
                "TF_DS_ENGRAM",
                "TF_DS_TOKEN_MAP",
                "TF_RDMA_DEVICES",
                "TF_DS_GRAPHS",
                "TF_DS_HC_SIDE",
                "TF_DS_L2_PREFETCH",
                "TF_DS_ENGRAM_AIO",
            ]
            .contains(&k.as_str());
        if !per_node && !rank0_only {
            assert_eq!(e1.get(k), Some(v), "{k} must be identical on both ranks");
        }
    }
    // No empty value anywhere.
    for c in &cs {
        for (k, v) in env(c) {
            assert!(!v.is_empty(), "empty env {k}");
        }
        for a in argv(c) {
            assert!(!a.is_empty(), "empty argv element");
        }
    }
}

#[test]
fn default_plan_obeys_the_engine_contract() {
    let d = tempfile::tempdir().unwrap();
    let plan = common::plan_json(d.path(), &[]);
    let kinds: Vec<&str> = plan["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["step"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "preflight",
            "fetch_checkpoint",
            "build_rank_cache",
            "configure_worker_storage",
            "build_image",
            "launch_rank",
            "smoke"
        ]
    );
    check_pair(&plan);
}

#[test]
fn engine_switches_reach_both_ranks_identically() {
    let d = tempfile::tempdir().unwrap();
    let plan = common::plan_json(
        d.path(),
        &[
            ("TF_DS_ENGRAM_LANES", "8"),
            ("TF_DS_IDX_SPLIT", "2"),
            ("PREFILL_INTERLEAVE_MS", "15"),
            ("TF_DS_IMAGE_CACHE", "1"),
            ("CONTEXT", "262144"),
        ],
    );
    check_pair(&plan);
    let cs = containers(&plan);
    for c in &cs {
        let e = env(c);
        assert_eq!(e["TF_DS_ENGRAM_LANES"], "8");
        assert_eq!(e["TF_DS_IDX_SPLIT"], "2");
        assert_eq!(e["PREFILL_INTERLEAVE_MS"], "15");
        assert_eq!(e["TF_DS_IMAGE_CACHE"], "1");
    }
    assert_eq!(flag_value(&argv(&cs[0]), "--pool").unwrap(), "262144");
}

#[test]
fn unset_switches_are_not_emitted_and_drafts_off_pairs() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(
        d.path().join("spark-deploy.toml"),
        "[serving]\ndrafts = false\ncontext = 524288\n",
    )
    .unwrap();
    let plan = common::plan_json(d.path(), &[]);
    check_pair(&plan);
    for c in containers(&plan) {
        assert!(!env(&c).contains_key("TF_DS_IDX_SPLIT"));
    }
}

#[test]
fn the_contract_parser_rejects_what_the_engine_rejects() {
    let base: Vec<String> = [
        "/engine/tf-dsv41-lanes",
        "/m",
        "/c",
        "1",
        "2",
        "198.18.0.1",
        "29620",
        "/kit",
    ]
    .map(str::to_owned)
    .to_vec();
    let with = |extra: &[&str]| {
        base.iter()
            .cloned()
            .chain(extra.iter().map(|s| (*s).to_owned()))
            .collect::<Vec<_>>()
    };
    assert!(parse_follower(&with(&["--pool", "4096"])).is_ok());
    assert!(
        parse_follower(&with(&["--pool"]))
            .unwrap_err()
            .contains("dangling")
    );
    assert!(
        parse_follower(&with(&["--bogus", "1"]))
            .unwrap_err()
            .contains("unknown")
    );
    assert!(parse_follower(&with(&["--graphs", "--side"])).is_err());
}
