//! OpenSSH conventions against the testbed's real sshd: a worker named by a `Host` alias of
//! `~/.ssh/config` (a temporary HOME) with its `HostName`, `User`, `Port`, `IdentityFile` and
//! `ProxyJump`; the only accepted key held only by a real `ssh-agent`; explicit fields
//! overriding the alias; and host keys strictly checked whatever the user's config says.
//!
//! The worker container gets a second sshd on port 2222 (same host key, same authorized key),
//! so that `Port` from the ssh config is observable, and is its own ProxyJump host: the jump
//! goes to the worker's sshd on port 22, and from there to 127.0.0.1:2222 inside it, which the
//! head cannot reach directly (nothing listens on the head's 127.0.0.1:2222).

// An integration test: a failed unwrap or expect is the test failure, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use spark_deploy_core::config::{DeploymentConfig, validate};
use spark_deploy_core::ports::docker::{DEFAULT_SOCKET, DockerNode};
use spark_deploy_core::ports::exec::{Cmd, Exec};
use spark_deploy_core::ports::ssh::SshError;
use spark_deploy_core::ports::{NodeTarget, SshTarget};
use spark_deploy_testbed::cluster::keys::known_hosts_line;
use spark_deploy_testbed::cluster::{TestbedInfo, WorkerInfo, labels, worker};
use spark_deploy_testbed::ssh_agent::SshAgent;

mod common;

use common::testbed::{R, on_testbed};

const SECOND_PORT: u16 = 2222;
const OTHER_USER: &str = "sparkuser";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn testbed_ssh_follows_openssh_conventions() {
    on_testbed(|info, _home| async move {
        let w = info.worker().clone();
        prepare_worker(&info, &w).await?;
        let host_key = std::fs::read_to_string(
            info.state_dir
                .join(&w.name)
                .join("ssh_host_ed25519_key.pub"),
        )?;
        alias_from_ssh_config(&w, &host_key).await?;
        only_key_in_ssh_agent(&w, &host_key).await?;
        Ok(())
    })
    .await;
}

/// A second sshd on [`SECOND_PORT`] and a second login user, both started with `docker exec`.
async fn prepare_worker(info: &TestbedInfo, w: &WorkerInfo) -> R<()> {
    let head = DockerNode::local("head", Path::new(DEFAULT_SOCKET))?;
    let config = format!("{}/sshd_config", worker::SSH_DIR_IN_WORKER);
    let port = SECOND_PORT.to_string();
    let (code, out) = worker::docker_exec(
        &head,
        &w.container,
        &[
            "/usr/sbin/sshd",
            "-f",
            &config,
            "-p",
            &port,
            "-o",
            "PidFile=/run/sshd-2222.pid",
        ],
    )
    .await?;
    assert_eq!(code, 0, "second sshd: {out}");
    // sshd_config's AuthorizedKeysFile is one file for every user.
    let line = format!("{OTHER_USER}:x:4242:4242::/tmp:/bin/sh");
    let (code, out) = worker::docker_exec(
        &head,
        &w.container,
        &["sh", "-c", &format!("echo '{line}' >> /etc/passwd")],
    )
    .await?;
    assert_eq!(code, 0, "add {OTHER_USER}: {out}");
    worker::wait_for_sshd(
        &head,
        &w.container,
        SocketAddr::from((w.management_addr, SECOND_PORT)),
        Duration::from_secs(30),
    )
    .await?;
    assert_eq!(info.workers.len(), 1);
    Ok(())
}

/// A temporary HOME with `.ssh/` (0700) and a directory for key material outside it.
fn temp_home() -> R<(tempfile::TempDir, PathBuf)> {
    let home = tempfile::tempdir()?;
    let ssh = home.path().join(".ssh");
    std::fs::create_dir(&ssh)?;
    std::fs::set_permissions(&ssh, std::fs::Permissions::from_mode(0o700))?;
    let keys = home.path().join("keys");
    std::fs::create_dir(&keys)?;
    Ok((home, keys))
}

fn write(path: &Path, text: &str) -> R<PathBuf> {
    std::fs::write(path, text)?;
    Ok(path.to_owned())
}

/// The node target spark-deploy builds for `nodes[1]` of a validated config, with `home`
/// as `$HOME`.
fn target_for(home: &Path, edit: impl FnOnce(&mut DeploymentConfig)) -> R<SshTarget> {
    let mut c = DeploymentConfig::default();
    c.nodes[1].name = "worker-1".into();
    edit(&mut c);
    let v = validate(c, home)?;
    match spark_deploy_core::run::node_target(&v.config().nodes[1], home) {
        NodeTarget::Ssh(t) => Ok(t),
        NodeTarget::Local => Err("a worker must be reached over SSH".into()),
    }
}

/// `echo $SSH_CONNECTION; id -un; hostname` on the node: (client addr, server port, user, host).
async fn whoami(exec: &Exec) -> R<(String, u16, String, String)> {
    let out = exec
        .run(&Cmd::shell("echo $SSH_CONNECTION; id -un; hostname"))
        .await?;
    let text = String::from_utf8(out.stdout)?;
    let mut lines = text.lines();
    let conn: Vec<&str> = lines.next().unwrap_or("").split_whitespace().collect();
    assert_eq!(conn.len(), 4, "SSH_CONNECTION: {text}");
    Ok((
        conn[0].to_owned(),
        conn[3].parse()?,
        lines.next().unwrap_or("").to_owned(),
        lines.next().unwrap_or("").to_owned(),
    ))
}

/// The worker's containers, listed through its Docker socket forwarded over `target`.
async fn worker_containers(target: &SshTarget) -> R<Vec<String>> {
    let docker = DockerNode::connect("worker-1", &NodeTarget::Ssh(target.clone())).await?;
    let names = docker
        .list_containers_by_label(labels::LABEL_FILTER)
        .await?
        .into_iter()
        .flat_map(|c| c.names.unwrap_or_default())
        .collect();
    docker.close().await?;
    Ok(names)
}

/// (a) The worker named by aliases of a temporary HOME's `~/.ssh/config`.
async fn alias_from_ssh_config(w: &WorkerInfo, host_key: &str) -> R<()> {
    let (home, keys) = temp_home()?;
    let addr = w.management_addr;
    let id = w.identity_file.display().to_string();
    // Only the second sshd's entry: if `Port` were ignored, port 22's key would be unknown.
    let kh_sparky = write(
        &keys.join("kh_sparky"),
        &(known_hosts_line(addr, SECOND_PORT, host_key) + "\n"),
    )?;
    let kh_jump = write(
        &keys.join("kh_jump"),
        &(known_hosts_line(addr, 22, host_key) + "\n"),
    )?;
    let kh_behind = write(
        &keys.join("kh_behind"),
        &(known_hosts_line(Ipv4Addr::LOCALHOST, SECOND_PORT, host_key) + "\n"),
    )?;
    let kh_empty = write(&keys.join("kh_empty"), "")?;
    let (kh_sparky, kh_jump, kh_behind, kh_empty) = (
        kh_sparky.display(),
        kh_jump.display(),
        kh_behind.display(),
        kh_empty.display(),
    );
    write(
        &home.path().join(".ssh/config"),
        &format!(
            "Host sparky\n  HostName {addr}\n  User root\n  Port {SECOND_PORT}\n  \
             IdentityFile {id}\n  UserKnownHostsFile {kh_sparky}\n\n\
             Host sparky-as-user\n  HostName {addr}\n  User {OTHER_USER}\n  Port {SECOND_PORT}\n  \
             IdentityFile {id}\n  UserKnownHostsFile {kh_sparky}\n\n\
             Host sparky-jump\n  HostName {addr}\n  User root\n  IdentityFile {id}\n  \
             UserKnownHostsFile {kh_jump}\n\n\
             Host sparky-behind\n  HostName 127.0.0.1\n  Port {SECOND_PORT}\n  User root\n  \
             ProxyJump sparky-jump\n  IdentityFile {id}\n  UserKnownHostsFile {kh_behind}\n\n\
             # The user's config relaxes host-key checking: spark-deploy must not.\n\
             Host sparky-lax\n  HostName {addr}\n  User root\n  IdentityFile {id}\n  \
             UserKnownHostsFile {kh_empty}\n  StrictHostKeyChecking no\n\n\
             Host sparky-lax-jump\n  HostName {addr}\n  User root\n  IdentityFile {id}\n  \
             UserKnownHostsFile {kh_empty}\n  StrictHostKeyChecking accept-new\n\n\
             Host sparky-behind-lax-jump\n  HostName 127.0.0.1\n  Port {SECOND_PORT}\n  \
             User root\n  ProxyJump sparky-lax-jump\n  IdentityFile {id}\n  \
             UserKnownHostsFile {kh_behind}\n"
        ),
    )?;
    let h = home.path();
    // An empty agent stands in for any agent this test inherited, so the key that logs in is
    // the alias's IdentityFile.
    let no_keys = SshAgent::start().await?;
    let quiet = |t: SshTarget| SshTarget {
        agent_socket: Some(no_keys.socket().to_owned()),
        ..t
    };

    // `ssh = "sparky"`, no ssh_port, identity_file or known_hosts: all from the alias.
    let t = quiet(target_for(h, |c| c.nodes[1].ssh = "sparky".into())?);
    assert_eq!(
        (t.port, &t.identity_file, &t.known_hosts),
        (None, &None, &None)
    );
    let exec = Exec::connect("worker-1", &NodeTarget::Ssh(t.clone())).await?;
    let (_, port, user, host) = whoami(&exec).await?;
    assert_eq!(
        (port, user.as_str(), host.as_str()),
        (SECOND_PORT, "root", "worker-1")
    );
    exec.close().await?;
    let names = worker_containers(&t).await?;
    assert!(
        names.iter().any(|n| n == &format!("/{}", w.container)),
        "{names:?}"
    );

    // The alias's `User`.
    let t = quiet(target_for(h, |c| c.nodes[1].ssh = "sparky-as-user".into())?);
    let exec = Exec::connect("worker-1", &NodeTarget::Ssh(t)).await?;
    let (_, _, user, _) = whoami(&exec).await?;
    assert_eq!(user, OTHER_USER);
    exec.close().await?;

    // `ProxyJump`: the session arrives from inside the worker (127.0.0.1), and Docker works
    // through it too.
    let t = quiet(target_for(h, |c| c.nodes[1].ssh = "sparky-behind".into())?);
    let exec = Exec::connect("worker-1", &NodeTarget::Ssh(t.clone())).await?;
    let (client, port, _, host) = whoami(&exec).await?;
    assert_eq!(
        (client.as_str(), port, host.as_str()),
        ("127.0.0.1", SECOND_PORT, "worker-1")
    );
    exec.close().await?;
    let names = worker_containers(&t).await?;
    assert!(
        names.iter().any(|n| n == &format!("/{}", w.container)),
        "{names:?}"
    );

    // Explicit fields override the alias: port 22 with the testbed's own known_hosts.
    let t = quiet(target_for(h, |c| {
        c.nodes[1].ssh = "sparky".into();
        c.nodes[1].ssh_port = Some(22);
        c.nodes[1].known_hosts = w.known_hosts.display().to_string();
    })?);
    let exec = Exec::connect("worker-1", &NodeTarget::Ssh(t)).await?;
    let (_, port, _, _) = whoami(&exec).await?;
    assert_eq!(port, 22);
    exec.close().await?;

    // Host keys stay strictly checked though the user's config says otherwise.
    let t = quiet(target_for(h, |c| c.nodes[1].ssh = "sparky-lax".into())?);
    let err = Exec::connect("worker-1", &NodeTarget::Ssh(t))
        .await
        .expect_err("an unknown host key must be refused");
    let ssh = ssh_error(&err)?;
    let msg = ssh.to_string();
    assert!(matches!(ssh, SshError::HostKey { .. }), "{msg}");
    for want in [
        "worker-1: the host key of sparky-lax ",
        &format!("root@{addr} port 22"),
        "host keys are always checked",
        "Host key verification failed",
        &format!("`ssh-keyscan -H {addr} >> {kh_empty}`"),
        "ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub",
    ] {
        assert!(msg.contains(want), "missing {want:?} in: {msg}");
    }
    assert!(
        std::fs::read_to_string(keys.join("kh_empty"))?.is_empty(),
        "nothing was added to known_hosts"
    );
    // ... and on the ProxyJump host too, named as the hop that fails.
    let t = quiet(target_for(h, |c| {
        c.nodes[1].ssh = "sparky-behind-lax-jump".into()
    })?);
    let err = Exec::connect("worker-1", &NodeTarget::Ssh(t))
        .await
        .expect_err("an unknown jump host key must be refused");
    let ssh = ssh_error(&err)?;
    let msg = ssh.to_string();
    assert!(matches!(ssh, SshError::HostKey { .. }), "{msg}");
    for want in [
        "worker-1: the host key of sparky-lax-jump",
        "the ProxyJump host sparky-lax-jump fails",
        "Host key verification failed",
        &format!("`ssh-keyscan -H {addr} >> {kh_empty}`"),
    ] {
        assert!(msg.contains(want), "missing {want:?} in: {msg}");
    }
    assert!(
        std::fs::read_to_string(keys.join("kh_empty"))?.is_empty(),
        "accept-new did not add the jump host's key"
    );
    Ok(())
}

fn ssh_error(err: &spark_deploy_core::ports::ExecError) -> R<&SshError> {
    // The Exec port boxes it.
    Ok(std::error::Error::source(err)
        .and_then(|s| s.downcast_ref::<Box<SshError>>())
        .map(AsRef::as_ref)
        .ok_or_else(|| format!("not an SSH error: {err:?}"))?)
}

/// (b) The only key the worker accepts, held only by an ssh-agent: no identity file in the
/// config, in the ssh config or in `~/.ssh`.
async fn only_key_in_ssh_agent(w: &WorkerInfo, host_key: &str) -> R<()> {
    let (home, keys) = temp_home()?;
    let kh = write(
        &keys.join("known_hosts"),
        &(known_hosts_line(w.management_addr, SECOND_PORT, host_key) + "\n"),
    )?;
    write(
        &home.path().join(".ssh/config"),
        &format!(
            "Host sparky\n  HostName {}\n  Port {SECOND_PORT}\n  UserKnownHostsFile {}\n",
            w.management_addr,
            kh.display()
        ),
    )?;
    let agent = SshAgent::start().await?;
    agent.add(&w.identity_file).await?;
    assert_eq!(agent.list().await?.len(), 1);

    let mut t = target_for(home.path(), |c| c.nodes[1].ssh = "root@sparky".into())?;
    assert_eq!((&t.identity_file, &t.known_hosts), (&None, &None));
    // What `SSH_AUTH_SOCK` in the environment does; set on the target so the test does not
    // change its own environment.
    t.agent_socket = Some(agent.socket().to_owned());
    let exec = Exec::connect("worker-1", &NodeTarget::Ssh(t.clone())).await?;
    let (_, port, user, host) = whoami(&exec).await?;
    assert_eq!(
        (port, user.as_str(), host.as_str()),
        (SECOND_PORT, "root", "worker-1")
    );
    exec.close().await?;
    let names = worker_containers(&t).await?;
    assert!(
        names.iter().any(|n| n == &format!("/{}", w.container)),
        "{names:?}"
    );

    // The agent is what authenticated: emptied, the same target is refused.
    agent.remove_all().await?;
    let err = Exec::connect("worker-1", &NodeTarget::Ssh(t))
        .await
        .expect_err("without the agent's key the worker must refuse");
    let msg = ssh_error(&err)?.to_string();
    assert!(
        matches!(ssh_error(&err)?, SshError::Connect { .. }),
        "{msg}"
    );
    assert!(msg.contains("Permission denied"), "{msg}");
    assert!(msg.contains("ssh-agent's keys"), "{msg}");
    Ok(())
}
