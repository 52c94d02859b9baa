//! The testbed cluster against the real Docker daemon, real sshd and real networking.
//!
//! All scenarios share the testbed's fixed names and addresses, so they live in this one test
//! binary and run in order inside a single test; `down` runs at the end even when a scenario
//! fails. Needs root and a Docker daemon; the first run builds the node image with mmdebstrap
//! (installed with apt-get if missing). Run with:
//!
//! ```text
//! cargo test -p spark-deploy-testbed --test cluster -- --nocapture
//! ```

// An integration test: a failed unwrap or expect is the test failure, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::{LogsOptionsBuilder, WaitContainerOptionsBuilder};
use futures::{FutureExt, StreamExt};
use spark_deploy_core::ports::NodeTarget;
use spark_deploy_core::ports::docker::{DockerError, DockerNode};
use spark_deploy_core::ports::exec::{Cmd, Exec, ExecError};
use spark_deploy_testbed::cluster::{self, TestbedInfo, TestbedOptions, labels, worker};

type R = Result<(), Box<dyn std::error::Error + Send + Sync>>;
type RS = Result<String, Box<dyn std::error::Error + Send + Sync>>;

fn options() -> TestbedOptions {
    TestbedOptions {
        install_tools: true,
        ..TestbedOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn testbed_cluster_end_to_end() {
    let opts = options();
    let scenarios = async {
        refuses_a_subnet_routed_elsewhere(&opts).await?;
        let t0 = Instant::now();
        let info = cluster::up(&opts).await?;
        let cold = t0.elapsed();
        let first_image = info.image_source;
        check_info(&info)?;
        ssh_binary_reaches_worker(&info).await?;
        exec_port_on_worker(&info).await?;
        docker_through_worker_ssh(&info).await?;
        rank_container_shares_worker_network(&info).await?;
        // A second `up` replaces the testbed and reuses the image.
        let t1 = Instant::now();
        let info = cluster::up(&opts).await?;
        let warm = t1.elapsed();
        assert_eq!(info.image_source, cluster::ImageSource::Reused);
        assert!(warm < Duration::from_secs(60), "warm up took {warm:?}");
        worker_path_really_goes_through_ssh(&info).await?;
        RS::Ok(format!(
            "first_up={cold:?} ({first_image:?}) second_up={warm:?}"
        ))
    };
    let outcome = tokio::time::timeout(
        Duration::from_secs(900),
        std::panic::AssertUnwindSafe(scenarios).catch_unwind(),
    )
    .await;

    // Always tear down, then check that nothing labelled is left.
    let t_down = Instant::now();
    let down = cluster::down(&opts).await;
    let t_down = t_down.elapsed();
    let leftovers = leftovers().await;

    match outcome {
        Err(_) => panic!("testbed scenarios timed out after 900 s"),
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        Ok(Ok(Err(e))) => panic!("testbed scenario failed: {e}\n{e:?}"),
        Ok(Ok(Ok(timings))) => {
            // Kept next to the build for CI logs and the README's numbers.
            std::fs::write(
                Path::new(env!("CARGO_TARGET_TMPDIR")).join("testbed-timings.txt"),
                format!("{timings} down={t_down:?}\n"),
            )
            .expect("write timings");
        }
    }
    let report = down.expect("down");
    assert!(report.state_dir_removed);
    assert!(
        !report.removed.containers.is_empty() && report.removed.networks.len() == 2,
        "down removed {report:?}"
    );
    assert_eq!(leftovers.expect("listing leftovers"), (0, 0, 0, 0));
    assert!(!opts.state_dir.exists(), "state dir left behind");
}

/// Containers, networks, images and volumes still carrying the testbed label.
async fn leftovers() -> Result<(usize, usize, usize, usize), DockerError> {
    let head = DockerNode::local("head", Path::new("/var/run/docker.sock"))?;
    Ok((
        head.list_containers_by_label(labels::LABEL_FILTER)
            .await?
            .len(),
        head.list_networks_by_label(labels::LABEL_FILTER)
            .await?
            .len(),
        head.list_images_by_label(labels::LABEL_FILTER).await?.len(),
        head.list_volumes_by_label(labels::LABEL_FILTER)
            .await?
            .len(),
    ))
}

fn check_info(info: &TestbedInfo) -> R {
    let w = info.worker();
    assert_eq!(info.head_fabric_addr.to_string(), "198.18.0.1");
    assert_eq!(w.fabric_addr.to_string(), "198.18.0.2");
    assert_eq!(w.ssh_destination, "root@198.18.1.2");
    assert_eq!(w.container, "spark-deploy-testbed-worker-1");
    assert_eq!(w.network_mode, "container:spark-deploy-testbed-worker-1");
    assert!(w.disk_dir.is_absolute() && w.disk_dir.is_dir());
    let kh = std::fs::read_to_string(&w.known_hosts)?;
    assert!(kh.starts_with("198.18.1.2 ssh-ed25519 "), "{kh}");
    // The state file round-trips.
    assert_eq!(&TestbedInfo::load(&info.state_dir)?, info);
    Ok(())
}

fn ssh_command(info: &TestbedInfo, known_hosts: &Path) -> std::process::Command {
    let w = info.worker();
    let mut c = std::process::Command::new("ssh");
    c.args([
        "-F",
        "/dev/null",
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=yes",
    ])
    .arg("-o")
    .arg(format!("UserKnownHostsFile={}", known_hosts.display()))
    .args([
        "-o",
        "GlobalKnownHostsFile=/dev/null",
        "-o",
        "IdentitiesOnly=yes",
    ])
    .args(["-o", "ConnectTimeout=10", "-i"])
    .arg(&w.identity_file)
    .args(["-p", &w.ssh_port.to_string(), &w.ssh_destination]);
    c
}

/// The system `ssh` binary, as an independent check: key auth, strict host keys, BatchMode.
async fn ssh_binary_reaches_worker(info: &TestbedInfo) -> R {
    let w = info.worker().clone();
    let out = ssh_command(info, &w.known_hosts).arg("hostname").output()?;
    assert!(
        out.status.success(),
        "ssh failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.starts_with("worker-1\n"), "{stdout}");

    // Host-key checking is really on: an empty known_hosts is refused.
    let empty = tempfile::NamedTempFile::new()?;
    let out = ssh_command(info, empty.path()).arg("true").output()?;
    assert!(!out.status.success(), "ssh accepted an unknown host key");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("Host key verification failed"), "{stderr}");
    Ok(())
}

/// The Exec port over SSH: commands, files written on the worker appear in the host dir.
async fn exec_port_on_worker(info: &TestbedInfo) -> R {
    let w = info.worker();
    let exec = w.exec().await?;
    let out = exec.run(&Cmd::new("hostname")).await?;
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "worker-1");
    let out = exec
        .run(&Cmd::new("ip").args(["-4", "-o", "addr", "show"]))
        .await?;
    let addrs = String::from_utf8_lossy(&out.stdout);
    assert!(addrs.contains("198.18.0.2/24"), "{addrs}");
    assert!(addrs.contains("198.18.1.2/24"), "{addrs}");

    // Files: written through SSH, seen on the host at the same path, read back.
    let path = w.disk_dir.join("exec/nested/hello.txt");
    let data = b"written over ssh\n\x00\xffbinary".to_vec();
    assert!(!exec.path_exists(&path).await?);
    exec.write_file(&path, &data).await?;
    assert_eq!(
        std::fs::read(&path)?,
        data,
        "host dir does not show the file"
    );
    assert!(exec.path_exists(&path).await?);
    assert_eq!(exec.read_file(&path).await?, data);
    // And a file the head writes is what the worker reads.
    std::fs::write(w.disk_dir.join("from-head.txt"), b"from head")?;
    assert_eq!(
        exec.read_file(&w.disk_dir.join("from-head.txt")).await?,
        b"from head"
    );

    // Failures name the node and the command, with stderr.
    let err = exec
        .read_file(&w.disk_dir.join("missing"))
        .await
        .expect_err("reading a missing file must fail");
    assert!(matches!(err, ExecError::Failed { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.starts_with("worker-1: `cat -- "), "{msg}");
    assert!(msg.contains("No such file"), "{msg}");
    // A few MiB through stdin, to exercise the pipes both ways.
    let big: Vec<u8> = (0..3 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    let big_path = w.disk_dir.join("exec/big.bin");
    exec.write_file(&big_path, &big).await?;
    assert_eq!(std::fs::read(&big_path)?.len(), big.len());
    assert!(exec.read_file(&big_path).await? == big, "big file differs");

    // One SSH master can carry both ports.
    let session = exec.ssh_session().expect("worker exec is over ssh").clone();
    let docker = DockerNode::over_ssh(session, Path::new("/var/run/docker.sock")).await?;
    docker.ping().await?;
    docker.close().await?;
    exec.close().await?;

    // A wrong known_hosts makes the port refuse to connect.
    let empty = tempfile::NamedTempFile::new()?;
    let mut target = w.ssh_target();
    target.known_hosts = Some(empty.path().to_owned());
    let err = Exec::connect("worker-1", &NodeTarget::Ssh(target))
        .await
        .expect_err("connect with an empty known_hosts must fail");
    assert!(matches!(err, ExecError::Connect { .. }), "{err:?}");
    Ok(())
}

/// Docker calls made through the worker's SSH reach the daemon.
async fn docker_through_worker_ssh(info: &TestbedInfo) -> R {
    let w = info.worker();
    let docker = w.docker().await?;
    assert!(
        docker
            .via()
            .to_string()
            .starts_with("SSH tunnel to root@198.18.1.2:22")
    );
    docker.ping().await?;
    let v = docker.version().await?;
    assert!(v.api_version.is_some());
    let names: Vec<String> = docker
        .list_containers_by_label(labels::LABEL_FILTER)
        .await?
        .into_iter()
        .flat_map(|c| c.names.unwrap_or_default())
        .collect();
    assert!(
        names.iter().any(|n| n == "/spark-deploy-testbed-worker-1"),
        "{names:?}"
    );
    assert!(docker.inspect_image(&info.image).await?.is_some());
    assert!(
        docker
            .inspect_image("spark-deploy-testbed/absent:x")
            .await?
            .is_none()
    );
    more_streams_than_max_sessions(info, &docker).await?;
    docker.close().await?;
    Ok(())
}

/// The worker's sshd keeps OpenSSH's default `MaxSessions 10`, as on a Spark. Each bollard
/// request opens its own forwarded-socket channel; hold 12 long requests open at once and check
/// that further calls still go through (forwarding channels are not counted as sessions).
async fn more_streams_than_max_sessions(info: &TestbedInfo, docker: &DockerNode) -> R {
    let name = "spark-deploy-testbed-sleeper";
    docker.remove_container(name).await?;
    docker
        .create_container(
            name,
            ContainerCreateBody {
                image: Some(info.image.clone()),
                cmd: Some(vec!["sleep".into(), "120".into()]),
                labels: Some(labels::labels("probe")),
                host_config: Some(HostConfig {
                    network_mode: Some("none".into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
        )
        .await?;
    docker.start_container(name).await?;
    let mut waiters = Vec::new();
    for _ in 0..12 {
        let d = docker.docker().clone();
        waiters.push(tokio::spawn(async move {
            let mut s = d.wait_container(
                name,
                Some(
                    WaitContainerOptionsBuilder::default()
                        .condition("not-running")
                        .build(),
                ),
            );
            let mut n = 0;
            while s.next().await.is_some() {
                n += 1;
            }
            n
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        waiters.iter().all(|w| !w.is_finished()),
        "a wait returned early"
    );
    for _ in 0..5 {
        docker.ping().await?;
    }
    assert!(docker.inspect_container(name).await?.is_some());
    // Removing the container ends every wait.
    assert!(docker.remove_container(name).await?);
    for w in waiters {
        let n = tokio::time::timeout(Duration::from_secs(20), w).await??;
        assert!(n >= 1, "a wait ended without a result");
    }
    Ok(())
}

/// A rank container started with `network_mode = container:<worker>` (through the worker's
/// SSH) sees 198.18.0.2 as its own address and reaches the head at 198.18.0.1.
async fn rank_container_shares_worker_network(info: &TestbedInfo) -> R {
    let w = info.worker();
    let listener = tokio::net::TcpListener::bind((info.head_fabric_addr, 0)).await?;
    let port = listener.local_addr()?.port();
    let docker = DockerNode::connect(w.name.clone(), &w.node_target()).await?;
    let name = "spark-deploy-testbed-rank1-probe";
    docker.remove_container(name).await?;
    let script = format!(
        "ip -4 -o addr show; echo rank1-says-hello > /dev/tcp/{}/{port}",
        info.head_fabric_addr
    );
    docker
        .create_container(
            name,
            ContainerCreateBody {
                image: Some(info.image.clone()),
                cmd: Some(vec!["/bin/bash".into(), "-c".into(), script]),
                labels: Some(labels::labels("probe")),
                host_config: Some(HostConfig {
                    network_mode: Some(w.network_mode.clone()),
                    ..Default::default()
                }),
                ..Default::default()
            },
        )
        .await?;
    docker.start_container(name).await?;
    let (accepted, _) = tokio::time::timeout(Duration::from_secs(30), listener.accept()).await??;
    assert_eq!(
        accepted.peer_addr()?.ip(),
        std::net::IpAddr::V4(w.fabric_addr)
    );
    let mut msg = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut { accepted }, &mut msg).await?;
    assert_eq!(msg.trim(), "rank1-says-hello");

    let mut wait = docker.docker().wait_container(
        name,
        Some(
            WaitContainerOptionsBuilder::default()
                .condition("not-running")
                .build(),
        ),
    );
    while let Some(r) = wait.next().await {
        r?; // non-zero exits arrive as errors
    }
    let mut logs = docker.docker().logs(
        name,
        Some(
            LogsOptionsBuilder::default()
                .stdout(true)
                .stderr(true)
                .build(),
        ),
    );
    let mut text = String::new();
    while let Some(chunk) = logs.next().await {
        text.push_str(&chunk?.to_string());
    }
    assert!(text.contains("inet 198.18.0.2/24"), "{text}");
    assert!(docker.remove_container(name).await?);
    docker.close().await?;
    Ok(())
}

/// With the worker's sshd stopped, Docker calls for the worker fail with a clear error while
/// the head's still succeed; the worker container keeps running.
async fn worker_path_really_goes_through_ssh(info: &TestbedInfo) -> R {
    let w = info.worker();
    let head = DockerNode::local("head", Path::new("/var/run/docker.sock"))?;
    let remote = DockerNode::connect(w.name.clone(), &w.node_target()).await?;
    remote.ping().await?;
    let exec = Exec::connect(w.name.clone(), &w.node_target()).await?;
    exec.run(&Cmd::new("true")).await?;

    worker::stop_sshd(&head, &w.container).await?;
    let err = exec
        .run(&Cmd::new("true"))
        .await
        .expect_err("exec must fail without sshd");
    assert!(matches!(err, ExecError::Spawn { .. }), "{err:?}");
    assert!(
        err.to_string().starts_with("worker-1: cannot run `true`"),
        "{err}"
    );
    drop(exec);
    let err = remote
        .ping()
        .await
        .expect_err("worker ping must fail without sshd");
    let msg = err.to_string();
    assert!(msg.starts_with("worker-1: "), "{msg}");
    assert!(
        matches!(err, DockerError::TunnelDown { .. }),
        "expected TunnelDown, got {err:?}"
    );
    assert!(
        matches!(err.operation(), DockerError::Ping { .. }),
        "{err:?}"
    );
    assert!(msg.contains("SSH tunnel to root@198.18.1.2:22"), "{msg}");
    // A fresh connection is refused too, naming the node.
    let err = DockerNode::connect(w.name.clone(), &w.node_target())
        .await
        .expect_err("connecting without sshd must fail");
    assert!(matches!(err, DockerError::Ssh { .. }), "{err:?}");
    assert!(err.to_string().starts_with("worker-1: "), "{err}");
    // The head's path is unaffected, and the worker container still runs.
    head.ping().await?;
    let state = head
        .inspect_container(&w.container)
        .await?
        .and_then(|c| c.state)
        .and_then(|s| s.running);
    assert_eq!(state, Some(true));
    drop(remote);

    // sshd back: the worker is reachable again.
    worker::start_sshd(&head, &w.container).await?;
    worker::wait_for_sshd(
        &head,
        &w.container,
        std::net::SocketAddr::from((w.management_addr, w.ssh_port)),
        Duration::from_secs(15),
    )
    .await?;
    let again = DockerNode::connect(w.name.clone(), &w.node_target()).await?;
    again.ping().await?;
    again.close().await?;
    Ok(())
}

/// `up` refuses to start when another interface routes the fabric subnet, naming it.
async fn refuses_a_subnet_routed_elsewhere(opts: &TestbedOptions) -> R {
    let ip = |args: &[&str]| std::process::Command::new("ip").args(args).output();
    let _ = ip(&["link", "del", "sd-test0"]);
    let out = ip(&[
        "link", "add", "sd-test0", "type", "veth", "peer", "name", "sd-test1",
    ])?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Deleted however this function ends (a failed assertion unwinds through it).
    struct Veth;
    impl Drop for Veth {
        fn drop(&mut self) {
            let _ = std::process::Command::new("ip")
                .args(["link", "del", "sd-test0"])
                .output();
        }
    }
    let veth = Veth;
    let result = async {
        let out = ip(&["addr", "add", "198.18.0.77/24", "dev", "sd-test0"])?;
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let out = ip(&["link", "set", "sd-test0", "up"])?;
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let err = cluster::up(opts)
            .await
            .expect_err("up must refuse a subnet that is already routed");
        let msg = err.to_string();
        assert!(
            msg.contains("interface sd-test0 already routes 198.18.0.0/24"),
            "{msg}"
        );
        R::Ok(())
    }
    .await;
    drop(veth);
    let routes = std::fs::read_to_string("/proc/net/route")?;
    assert!(!routes.contains("sd-test0"), "sd-test0 left behind");
    result
}
