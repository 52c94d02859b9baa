use super::*;
use crate::config::{DeploymentConfig, validate};

fn config() -> ValidatedConfig {
    let mut raw = DeploymentConfig::default();
    raw.deployment.name = "dsv41".into();
    raw.deployment.state_dir = "/home/spark/.local/state/spark-deploy".into();
    validate(raw, Path::new("/home/spark")).unwrap()
}

fn inputs() -> UnitInputs {
    UnitInputs {
        binary: PathBuf::from("/usr/local/bin/spark-deploy"),
        config: Some(PathBuf::from("/home/spark/dsv41 pair/spark-deploy.toml")),
        user: "spark".into(),
        home: PathBuf::from("/home/spark"),
        wait_timeout_s: 900,
    }
}

#[test]
fn the_units_as_written() {
    let units = units(&config(), &inputs());
    let names: Vec<&str> = units.iter().map(|u| u.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "spark-deploy-dsv41-link.service",
            "spark-deploy-dsv41.service"
        ]
    );
    for u in &units {
        insta::assert_snapshot!(u.name.clone(), u.text);
    }
}

#[test]
fn words_are_quoted_and_percent_escaped() {
    assert_eq!(word("/usr/bin/x"), "/usr/bin/x");
    assert_eq!(word("/a b/c"), "\"/a b/c\"");
    assert_eq!(word("100%"), "100%%");
    assert_eq!(word("a\"b"), "\"a\\\"b\"");
    assert_eq!(word(""), "\"\"");
}

#[test]
fn write_install_state_and_remove() {
    let d = tempfile::tempdir().unwrap();
    let c = config();
    let us = units(&c, &inputs());
    assert!(installed(d.path(), &us).iter().all(|u| !u.present));
    write_units(d.path(), &us).unwrap();
    assert!(
        installed(d.path(), &us)
            .iter()
            .all(|u| u.present && u.current)
    );
    let other = units(
        &c,
        &UnitInputs {
            binary: PathBuf::from("/opt/sd/spark-deploy"),
            ..inputs()
        },
    );
    assert!(
        installed(d.path(), &other)
            .iter()
            .all(|u| u.present && !u.current),
        "another binary: stale"
    );
    let removed = remove_units(d.path(), &us).unwrap();
    assert_eq!(removed.len(), 2);
    assert_eq!(
        std::fs::read_dir(d.path()).unwrap().count(),
        0,
        "nothing left"
    );
    assert!(remove_units(d.path(), &us).unwrap().is_empty());
}

#[test]
fn the_stop_marker_gives_its_reason() {
    let d = tempfile::tempdir().unwrap();
    assert_eq!(stop_marker(d.path()), None);
    let m = d.path().join(WATCH_DIR);
    std::fs::create_dir_all(&m).unwrap();
    std::fs::write(m.join(STOP_MARKER), "").unwrap();
    assert!(stop_marker(d.path()).unwrap().contains("stop marker"));
    std::fs::write(
        m.join(STOP_MARKER),
        r#"{"reason": "3 heals in the last hour", "at_unix": 1}"#,
    )
    .unwrap();
    assert_eq!(
        stop_marker(d.path()).as_deref(),
        Some("3 heals in the last hour")
    );
    std::fs::write(m.join(STOP_MARKER), "user ran down\n").unwrap();
    assert_eq!(stop_marker(d.path()).as_deref(), Some("user ran down"));
}

#[test]
fn probe_verdicts() {
    assert!(link_up("up\n") && link_up("unknown") && !link_up("down") && !link_up("dormant"));
    assert!(answers(&Ok(())));
    assert!(answers(&Err(std::io::ErrorKind::ConnectionRefused.into())));
    assert!(!answers(&Err(std::io::ErrorKind::TimedOut.into())));
    assert!(!answers(&Err(std::io::ErrorKind::HostUnreachable.into())));
}

#[tokio::test]
async fn an_unreachable_worker_times_out_naming_it() {
    let d = tempfile::tempdir().unwrap();
    let mut raw = DeploymentConfig::default();
    raw.deployment.state_dir = d.path().join("state").display().to_string();
    // A port nothing listens on, on loopback: connection refused at once.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let w = &mut raw.nodes[1];
    w.ssh = "root@127.0.0.1".into();
    w.ssh_port = Some(port);
    let (id, kh) = (d.path().join("id"), d.path().join("known_hosts"));
    std::fs::write(&id, "").unwrap();
    std::fs::write(&kh, "").unwrap();
    w.identity_file = id.display().to_string();
    w.known_hosts = kh.display().to_string();
    let v = validate(raw, d.path()).unwrap();
    // The worker's fabric address as the last launch recorded it.
    let mut facts = crate::facts::DeploymentFacts::placeholders(&v);
    facts.nodes[1].fabric_addr = crate::facts::Detected::Known(std::net::Ipv4Addr::LOCALHOST);
    let record = launch_record::LaunchRecord {
        config_sha256: launch_record::config_sha256(&v),
        fingerprint: String::new(),
        model_commit: facts.model_commit.to_string(),
        nodes: facts.nodes,
        ranks: Vec::new(),
        gpu_clocks: None,
        context: None,
        at_unix: 0,
    };
    launch_record::write(Path::new(&v.config().deployment.state_dir), &record).unwrap();
    let rec = crate::event::Recorder::default();
    let ctx = Context::new(v, std::sync::Arc::new(rec.clone()));
    let e = wait_for_pair(&ctx, Duration::from_millis(10))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("worker-1 SSH") && e.contains("remedy"), "{e}");
    assert!(
        !e.contains(&format!("fabric address 127.0.0.1:{port}")),
        "a refusal means the address answers: {e}"
    );
    let lines: Vec<String> = rec
        .events()
        .iter()
        .filter_map(|ev| match ev {
            crate::event::Event::Log { line, .. } => Some(line.clone()),
            _ => None,
        })
        .collect();
    assert!(
        lines
            .iter()
            .any(|l| l.contains(&format!("worker-1 fabric address 127.0.0.1:{port}"))),
        "the fabric probe ran: {lines:?}"
    );
}
