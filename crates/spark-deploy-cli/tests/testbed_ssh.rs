//! The `spark-deploy` binary reaches a worker the way `ssh` does, from its environment: `HOME`
//! (whose `~/.ssh/config` names the worker by an alias) and `SSH_AUTH_SOCK` (an agent holding
//! the only key the worker accepts). The config names no port, identity file or known_hosts.
//! Runs on the testbed (`testbed up` / `testbed down` of the same binary).

// An integration test: a failed unwrap or expect is the test failure, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![cfg(feature = "testbed")]

mod common;

use std::path::Path;

use common::{run, stderr, stdout};
use spark_deploy_testbed::ssh_agent::SshAgent;

type R<T> = Result<T, Box<dyn std::error::Error>>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn testbed_cli_reaches_the_worker_by_alias_with_the_agents_key() {
    let work = tempfile::tempdir().unwrap();
    let path = std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into());
    let up = run(
        work.path(),
        &["testbed", "up", "--write-config", "testbed.toml"],
        &[("PATH", &path)],
    );
    let result = if up.status.success() {
        scenario(work.path(), &path).await
    } else {
        Err(format!("testbed up failed: {}", stderr(&up)).into())
    };
    let down = run(work.path(), &["testbed", "down"], &[("PATH", &path)]);
    result.unwrap();
    assert!(down.status.success(), "testbed down: {}", stderr(&down));
}

async fn scenario(work: &Path, path: &str) -> R<()> {
    // The worker as `testbed up` wrote it, then reduced to an alias.
    let mut config: toml::Table = std::fs::read_to_string(work.join("testbed.toml"))?.parse()?;
    let worker = config["nodes"]
        .as_array_mut()
        .and_then(|n| n.get_mut(1))
        .and_then(toml::Value::as_table_mut)
        .ok_or("no worker in the testbed config")?;
    let destination = worker["ssh"].as_str().ok_or("ssh")?.to_owned();
    let addr = destination
        .rsplit('@')
        .next()
        .unwrap_or(&destination)
        .to_owned();
    let identity = worker
        .remove("identity_file")
        .and_then(|v| v.as_str().map(str::to_owned))
        .ok_or("identity_file")?;
    let known_hosts = worker
        .remove("known_hosts")
        .and_then(|v| v.as_str().map(str::to_owned))
        .ok_or("known_hosts")?;
    worker.remove("ssh_port");
    worker.insert("ssh".into(), "sparky".into());
    std::fs::write(work.join("alias.toml"), toml::to_string(&config)?)?;

    let home = work.join("home");
    std::fs::create_dir_all(home.join(".ssh"))?;
    std::fs::write(
        home.join(".ssh/config"),
        format!(
            "Host sparky\n  HostName {addr}\n  User root\n  UserKnownHostsFile {known_hosts}\n"
        ),
    )?;
    let agent = SshAgent::start().await?;
    agent.add(Path::new(&identity)).await?;

    let preflight = |env: &[(&str, &str)]| {
        let out = run(
            work,
            &["--config", "alias.toml", "--json", "preflight"],
            env,
        );
        // The preflight table is the stdout line carrying "preflight" (a failed run ends with the
        // error object after it).
        let text = stdout(&out);
        let last = text
            .lines()
            .find(|l| {
                serde_json::from_str::<serde_json::Value>(l)
                    .is_ok_and(|v| v.get("preflight").is_some())
            })
            .or_else(|| text.lines().last())
            .unwrap_or("")
            .to_owned();
        (out, last)
    };
    let sock = agent.socket().display().to_string();
    let home_s = home.display().to_string();
    let env = [
        ("PATH", path),
        ("HOME", home_s.as_str()),
        ("SSH_AUTH_SOCK", sock.as_str()),
    ];

    // This config names the real model on a small machine, so the memory budget and the disk
    // rows fail (exit 4) whatever SSH does; what matters here is the worker's ssh and docker rows.
    let (out, last) = preflight(&env);
    assert!(
        matches!(out.status.code(), Some(0 | 4)),
        "preflight: {}\n{last}",
        stderr(&out)
    );
    let rows = worker_rows(&last)?;
    for check in ["ssh", "docker"] {
        let row = rows
            .iter()
            .find(|r| r["check"] == check)
            .ok_or_else(|| format!("no {check} row for worker-1: {last}"))?;
        assert_eq!(row["verdict"], "ok", "{row}");
    }

    // The agent's key is what logged in: with an empty agent the same run is refused.
    agent.remove_all().await?;
    let (out, _) = preflight(&env);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let text = stdout(&out);
    let last = text
        .lines()
        .find(|l| {
            serde_json::from_str::<serde_json::Value>(l).is_ok_and(|v| v.get("error").is_some())
        })
        .unwrap_or("")
        .to_owned();
    let v: serde_json::Value = serde_json::from_str(&last)?;
    let table = v["error"]
        .as_str()
        .ok_or_else(|| format!("no error: {last}"))?;
    let ssh_row = table
        .lines()
        .find(|l| l.starts_with("ssh ") && l.contains("worker-1"))
        .ok_or_else(|| format!("no ssh row: {table}"))?;
    for want in [
        "cannot open an SSH session to sparky (root@",
        "Permission denied (publickey)",
        "FAIL",
    ] {
        assert!(ssh_row.contains(want), "missing {want:?} in: {ssh_row}");
    }
    Ok(())
}

/// The preflight rows of `worker-1` in the final JSON line.
fn worker_rows(last: &str) -> R<Vec<serde_json::Value>> {
    let v: serde_json::Value = serde_json::from_str(last)?;
    Ok(v["preflight"]["results"]
        .as_array()
        .ok_or_else(|| format!("no preflight results: {last}"))?
        .iter()
        .filter(|r| r["node"] == "worker-1")
        .cloned()
        .collect())
}
