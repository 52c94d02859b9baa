use super::*;
use crate::config::{DeploymentConfig, validate};
use crate::event::Recorder;

#[test]
fn nvrm_lines_and_tails() {
    let d =
        "[Mon] eth up\n[Mon] NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus\n[Mon] x\n";
    assert_eq!(
        nvrm_lines(d),
        "[Mon] NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus\n"
    );
    assert_eq!(last_lines("a\nb\nc\n", 2), "b\nc\n");
    assert!(
        counters_script(Some("enp1s0f0np0")).contains("/sys/class/net/enp1s0f0np0/statistics/*")
    );
}

/// A deployment with nothing running and an unreachable worker still gets its bundle: the
/// head's members, the absent ones named with why, both secrets nowhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bundle_without_a_running_pair_names_what_is_absent_and_holds_no_secret() {
    let d = tempfile::tempdir().unwrap();
    let mut raw = DeploymentConfig::default();
    raw.deployment.name = "bundle-unit".into();
    raw.deployment.state_dir = d.path().join("state").display().to_string();
    raw.hub.token = Some(Secret::new("hf_unit_token_123456"));
    raw.serving.api_key = Some(Secret::new("sk-unit-key-654321"));
    raw.nodes[0].docker_socket = d.path().join("no-docker.sock").display().to_string();
    let w = &mut raw.nodes[1];
    w.ssh = "root@127.0.0.1".into();
    w.ssh_port = Some(9);
    let (id, kh) = (d.path().join("id"), d.path().join("known_hosts"));
    std::fs::write(&id, "").unwrap();
    std::fs::write(&kh, "").unwrap();
    w.identity_file = id.display().to_string();
    w.known_hosts = kh.display().to_string();
    let v = validate(raw, d.path()).unwrap();
    let state = PathBuf::from(&v.config().deployment.state_dir);
    std::fs::create_dir_all(state.join("watch/heals/20261201-000000")).unwrap();
    std::fs::write(
        state.join("watch/heals/20261201-000000/rank1.log"),
        "Bearer sk-unit-key-654321\n",
    )
    .unwrap();
    std::fs::write(
        state.join(run_log::EVENTS_FILE),
        "{\"hf\":\"hf_unit_token_123456\"}\n",
    )
    .unwrap();
    let ctx = Context::new(v, std::sync::Arc::new(Recorder::default()));
    let out = d.path().join("out/b.tar.gz");
    let r = write(&ctx, Some(&out)).await.unwrap();
    assert_eq!(r.path, out);
    assert!(!d.path().join("out/b.tar.gz.partial").exists());
    let mut names = Vec::new();
    let mut ar = tar::Archive::new(flate2::read::GzDecoder::new(
        std::fs::File::open(&out).unwrap(),
    ));
    for e in ar.entries().unwrap() {
        let mut e = e.unwrap();
        let name = e.path().unwrap().display().to_string();
        let mut b = Vec::new();
        e.read_to_end(&mut b).unwrap();
        let text = String::from_utf8_lossy(&b);
        assert!(
            !text.contains("hf_unit_token_123456") && !text.contains("sk-unit-key-654321"),
            "{name}: {text}"
        );
        names.push(name.trim_start_matches(&format!("{}/", r.top)).to_owned());
    }
    for m in [
        "config.toml",
        "plan.json",
        "plan.txt",
        "status.json",
        "index.json",
        "state/last-run.events.jsonl",
        "watch/heals/20261201-000000/rank1.log",
        "nodes/head/meminfo.txt",
    ] {
        assert!(names.iter().any(|n| n == m), "{m} in {names:?}");
    }
    let absent: Vec<&str> = r.absent.iter().map(|a| a.name.as_str()).collect();
    for a in [
        "state/launched.json",
        "ranks/rank0.log",
        "ranks/rank1.log",
        "nodes/worker-1/",
    ] {
        assert!(absent.contains(&a), "{a} absent: {:?}", r.absent);
    }
}
