use super::*;

fn check(f: impl FnOnce(&mut DeploymentConfig)) -> Result<ValidatedConfig, ConfigError> {
    let mut c = DeploymentConfig::default();
    f(&mut c);
    validate(c, Path::new("/home/spark"))
}

fn refused_field(f: impl FnOnce(&mut DeploymentConfig)) -> String {
    match check(f) {
        Err(ConfigError::Invalid { problems }) => problems[0].field.clone(),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn watch_fields_are_checked_by_name() {
    assert_eq!(
        refused_field(|c| c.watch.interval_s = 0.0),
        "watch.interval_s"
    );
    assert_eq!(
        refused_field(|c| c.watch.memory_floor_gib = -1.0),
        "watch.memory_floor_gib"
    );
    assert_eq!(
        refused_field(|c| c.watch.max_heals_per_hour = 61),
        "watch.max_heals_per_hour"
    );
    assert_eq!(refused_field(|c| c.watch.wedge_s = 3.0), "watch.wedge_s");
    assert_eq!(
        refused_field(|c| c.nodes[1].proc_root = "proc".into()),
        "nodes[1].proc_root"
    );
    let mut raw = DeploymentConfig::default();
    raw.watch.heal = crate::config::HealPolicy::Stop;
    assert!(validate(raw, Path::new("/home/u")).is_ok());
}

#[test]
fn runtime_sysfs_root_and_path_are_checked() {
    assert_eq!(
        refused_field(|c| c.engine.runtime = "nvidia runc".into()),
        "engine.runtime"
    );
    assert_eq!(
        refused_field(|c| c.nodes[1].sysfs_root = "sys".into()),
        "nodes[1].sysfs_root"
    );
    assert_eq!(
        refused_field(|c| c.nodes[0].path = vec!["/a:/b".into()]),
        "nodes[0].path"
    );
    let v = check(|c| {
        c.engine.runtime = "runc".into();
        c.nodes[0].path = vec!["/usr/local/nvidia/bin".into()];
        c.nodes[1].sysfs_root = "/srv/facts/sys".into();
    })
    .unwrap();
    assert_eq!(v.config().nodes[1].sysfs_root, "/srv/facts/sys");
}

#[test]
fn engine_repo_is_a_url_or_an_absolute_path() {
    assert_eq!(
        refused_field(|c| c.engine.repo = "engine-src".into()),
        "engine.repo"
    );
    for ok in [
        "",
        "/srv/tensorfold",
        "https://example.org/tensorfold.git",
        "ssh://git@example.org/tensorfold.git",
        "git@example.org:org/tensorfold.git",
    ] {
        assert!(check(|c| c.engine.repo = ok.into()).is_ok(), "{ok}");
    }
    assert!(crate::config::repo_is_remote("git@example.org:org/x.git"));
    assert!(!crate::config::repo_is_remote("/srv/a:b/x"));
}

#[test]
fn defaults_pass_with_warnings() {
    let v = check(|_| {}).unwrap();
    let fields: Vec<_> = v.warnings().iter().map(|w| w.field.as_str()).collect();
    assert!(fields.contains(&"serving.context"), "{fields:?}");
    assert!(fields.contains(&"model.revision"), "{fields:?}");
    assert_eq!(
        v.config().nodes[1].data_dir,
        "/home/spark/.cache/spark-deploy"
    );
    assert_eq!(
        v.config().serving.api_key_file,
        "/home/spark/.local/state/spark-deploy/api-key"
    );
}

#[test]
fn context_0_asks_preflight_for_the_largest_that_fits() {
    let v = check(|c| c.serving.context = 0).unwrap();
    assert_eq!(v.config().serving.context, 0);
}

#[test]
fn engine_limits_are_refused_with_the_field() {
    assert_eq!(refused_field(|c| c.serving.context = 1), "serving.context");
    assert_eq!(
        refused_field(|c| c.serving.context = 1_114_064),
        "serving.context"
    );
    assert_eq!(
        refused_field(|c| c.serving.parallel = 5),
        "serving.parallel"
    );
    assert_eq!(refused_field(|c| c.nodes.truncate(1)), "nodes");
    assert_eq!(
        refused_field(|c| {
            c.engine.env.insert("TF_DS_ROUND_ROWS".into(), "48".into());
        }),
        "engine.env.TF_DS_ROUND_ROWS"
    );
    assert_eq!(
        refused_field(|c| {
            c.engine.env.insert("TF_TP_MASTER".into(), "1.2.3.4".into());
        }),
        "engine.env.TF_TP_MASTER"
    );
    assert_eq!(
        refused_field(|c| c.nodes[0].ssh = "me@elsewhere".into()),
        "nodes[0].ssh"
    );
    assert_eq!(
        refused_field(|c| c.nodes[1].network_mode = "bridge".into()),
        "nodes[1].network_mode"
    );
    assert_eq!(
        refused_field(|c| c.serving.max_tokens = 40_000_000),
        "serving.max_tokens"
    );
    assert_eq!(
        refused_field(|c| c.engine.commit = "59402086381A42C74D53053443224EEC2790B4C5".into()),
        "engine.commit"
    );
}

#[test]
fn ssh_values_that_ssh_would_misread_are_refused_with_the_reason() {
    let e = check(|c| c.nodes[1].ssh = "-oProxyCommand=touch /tmp/x".into())
        .unwrap_err()
        .to_string();
    assert!(e.contains("nodes[1].ssh = "), "{e}");
    assert!(e.contains("starts with '-'"), "{e}");
    assert!(e.contains("Host alias of ~/.ssh/config"), "{e}");
    let e = check(|c| c.nodes[1].known_hosts = "/k/kh\nProxyCommand x".into())
        .unwrap_err()
        .to_string();
    assert!(e.contains("nodes[1].known_hosts = "), "{e}");
    assert!(e.contains("newline"), "{e}");
    assert_eq!(
        refused_field(|c| c.nodes[1].identity_file = "/k/%h".into()),
        "nodes[1].identity_file"
    );
    assert_eq!(
        refused_field(|c| c.nodes[1].ssh_port = Some(0)),
        "nodes[1].ssh_port"
    );
    // An alias, no port, no key, no known_hosts: all left to ssh.
    let v = check(|c| c.nodes[1].ssh = "sparky".into()).unwrap();
    let w = &v.config().nodes[1];
    assert_eq!((w.ssh_port, w.identity_file.as_str()), (None, ""));
}

#[test]
fn message_carries_value_and_range() {
    let e = check(|c| c.serving.parallel = 9).unwrap_err().to_string();
    assert!(e.contains("serving.parallel = 9: allowed 1..=4"), "{e}");
}

#[test]
fn a_huge_reply_budget_is_refused_without_overflow() {
    for v in [u64::MAX, u64::MAX - 17, u64::MAX / 2] {
        assert_eq!(
            refused_field(|c| c.serving.max_tokens = v),
            "serving.max_tokens"
        );
    }
    assert_eq!(refused_field(|c| c.serving.top_k = 0), "serving.top_k");
    assert!(check(|c| c.serving.top_k = 1).is_ok());
}

#[test]
fn nan_and_infinity_are_outside_every_range() {
    assert_eq!(
        refused_field(|c| c.watch.interval_s = f64::NAN),
        "watch.interval_s"
    );
    assert_eq!(
        refused_field(|c| c.watch.probe_idle_s = f64::INFINITY),
        "watch.probe_idle_s"
    );
    assert_eq!(
        refused_field(|c| c.serving.temperature = f64::NAN),
        "serving.temperature"
    );
}

#[test]
fn revisions_are_a_commit_or_a_git_ref_name() {
    for bad in [
        "../../etc",
        "/abs",
        "a/../b",
        "x.lock",
        "main\n",
        "a//b",
        "",
        "caf\u{e9}",
    ] {
        assert_eq!(
            refused_field(|c| c.model.revision = bad.into()),
            "model.revision",
            "{bad:?}"
        );
        assert_eq!(
            refused_field(|c| c.model.kit_revision = bad.into()),
            "model.kit_revision"
        );
        assert_eq!(
            refused_field(|c| c.model.engram_revision = bad.into()),
            "model.engram_revision"
        );
        assert_eq!(
            refused_field(|c| {
                c.model.ablit = true;
                c.model.ablit_revision = bad.into();
            }),
            "model.ablit_revision"
        );
    }
    let v = check(|c| c.model.revision = "refs/pr/12".into()).unwrap();
    assert!(v.warnings().iter().any(|w| w.field == "model.revision"));
    let msg = check(|c| c.model.revision = "../x".into())
        .unwrap_err()
        .to_string();
    assert!(msg.contains("contains `..`"), "{msg}");
}

#[test]
fn engine_commit_is_forty_hex_and_non_ascii_is_refused() {
    for bad in ["é".repeat(20), "main".into(), "5940208638".into()] {
        assert_eq!(refused_field(|c| c.engine.commit = bad), "engine.commit");
    }
}

#[test]
fn paths_are_refused_when_empty_or_holding_nul_or_control_characters() {
    assert_eq!(
        refused_field(|c| c.deployment.state_dir = String::new()),
        "deployment.state_dir"
    );
    assert_eq!(
        refused_field(|c| c.nodes[1].data_dir = String::new()),
        "nodes[1].data_dir"
    );
    assert_eq!(
        refused_field(|c| c.hub.ablit_cache = String::new()),
        "hub.ablit_cache"
    );
    assert_eq!(refused_field(|c| c.hub.cache = "  ".into()), "hub.cache");
    assert_eq!(refused_field(|c| c.hub.cache = "/a\0b".into()), "hub.cache");
    assert_eq!(
        refused_field(|c| c.nodes[0].data_dir = "/x\ny".into()),
        "nodes[0].data_dir"
    );
    assert_eq!(
        refused_field(|c| c.nodes[1].ssh = "ops@spark\0-2".into()),
        "nodes[1].ssh"
    );
    // Empty hub.cache keeps its documented meaning: huggingface_hub's default.
    let v = check(|c| c.hub.cache = String::new()).unwrap();
    assert_eq!(v.config().hub.cache, "/home/spark/.cache/huggingface");
}

#[test]
fn endpoint_nfs_server_repo_ids_and_repo_files_are_checked() {
    assert_eq!(
        refused_field(|c| c.hub.endpoint = "file:///etc".into()),
        "hub.endpoint"
    );
    assert_eq!(
        refused_field(|c| c.hub.endpoint = "http://h\n.x".into()),
        "hub.endpoint"
    );
    let msg = check(|c| c.hub.endpoint = "ftp://u:topsecret@h".into())
        .unwrap_err()
        .to_string();
    assert!(!msg.contains("topsecret"), "{msg}");
    assert!(check(|c| c.hub.endpoint = "https://u:p@hub.example:8443".into()).is_ok());
    assert_eq!(
        refused_field(|c| c.storage.head_nfs_server = "10.0.0.1,nolock".into()),
        "storage.head_nfs_server"
    );
    assert!(check(|c| c.storage.head_nfs_server = "198.18.0.1".into()).is_ok());
    for bad in ["../..", "a/..", "-x/y", "a--b/c", "a/b/c", "a/.b"] {
        assert_eq!(
            refused_field(|c| c.model.id = bad.into()),
            "model.id",
            "{bad}"
        );
    }
    assert_eq!(
        refused_field(|c| c.model.engram_files = vec!["../../x.safetensors".into()]),
        "model.engram_files[0]"
    );
    assert_eq!(
        refused_field(|c| c.model.engram_files = vec!["/etc/passwd".into()]),
        "model.engram_files[0]"
    );
}

#[test]
fn engine_repo_and_patches_are_never_read_as_git_options() {
    for bad in [
        "--upload-pack=touch /tmp/x:y",
        "-oProxyCommand=x:y",
        "ext::sh -c touch% /tmp/x",
        "fd::17",
        "https://host/a b",
        "git@host:repo\n",
    ] {
        assert_eq!(
            refused_field(|c| c.engine.repo = bad.into()),
            "engine.repo",
            "{bad}"
        );
    }
    for ok in [
        "https://github.com/o/r.git",
        "git@host:o/r.git",
        "/srv/git/engine",
    ] {
        assert!(check(|c| c.engine.repo = ok.into()).is_ok(), "{ok}");
    }
    assert_eq!(
        refused_field(|c| c.engine.patches = vec!["--exec=x".into()]),
        "engine.patches[0]"
    );
}

/// Four nodes under the TP=4 profile: the head and three workers.
pub(crate) fn four_nodes(c: &mut DeploymentConfig) {
    c.deployment.engine = crate::config::EngineProfileName::TensorfoldDsv41Tp4;
    for i in 2..4 {
        let mut w = c.nodes[1].clone();
        w.name = format!("worker-{i}");
        w.ssh = format!("spark-{}", i + 1);
        c.nodes.push(w);
    }
}

#[test]
fn four_nodes_need_the_tp4_profile_which_takes_two_or_four() {
    let e = check(|c| {
        four_nodes(c);
        c.deployment.engine = crate::config::EngineProfileName::TensorfoldDsv41;
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains("nodes = 4 node(s): allowed [2] nodes"), "{e}");
    assert!(
        e.contains("four Sparks take deployment.engine = \"tensorfold-dsv41-tp4\""),
        "{e}"
    );
    let v = check(four_nodes).unwrap();
    assert_eq!(v.config().nodes.len(), 4);
    assert!(v.limits().tp4_branch);
    check(|c| c.deployment.engine = crate::config::EngineProfileName::TensorfoldDsv41Tp4).unwrap();
    let e = check(|c| {
        four_nodes(c);
        c.nodes.truncate(3);
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains("nodes = 3 node(s): allowed [2, 4] nodes"), "{e}");
}

#[test]
fn the_tp4_profile_takes_its_own_settings_and_refuses_what_it_sets_itself() {
    let v = check(|c| {
        four_nodes(c);
        c.serving.parallel = 16;
        c.engine.env.insert("TF_DS_ROUND_ROWS".into(), "48".into());
        c.engine.env.insert("TF_DS_STREAMS".into(), "16".into());
    })
    .unwrap();
    assert_eq!(v.config().serving.parallel, 16);
    for (k, val) in [
        ("TF_DS_ROUND_ROWS", "64"),
        ("TF_DS_WINDOW", "2097152"),
        ("TF_DS_2D_GU", "parity"),
    ] {
        assert_eq!(
            refused_field(|c| {
                four_nodes(c);
                c.engine.env.insert(k.into(), val.into());
            }),
            format!("engine.env.{k}")
        );
    }
    // Follower g joins rendezvous_port + g − 1: three ports that must leave out the API's.
    let e = check(|c| {
        four_nodes(c);
        c.engine.rendezvous_port = c.serving.port - 2;
    })
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("(one per follower) that leaves out serving.port"),
        "{e}"
    );
    check(|c| {
        four_nodes(c);
        c.engine.rendezvous_port = c.serving.port - 3;
    })
    .unwrap();
}
