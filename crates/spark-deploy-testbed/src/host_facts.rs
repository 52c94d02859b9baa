//! The GPU and RoCE facts the testbed's hosts present: each node gets a facts directory holding
//! an `nvidia-smi` executable that prints outputs captured on a real NVIDIA host
//! (`tests/fixtures/host-facts`), and a sysfs tree in which the node's real fabric netdev (its
//! real `mtu` file, linked) carries a ConnectX-7-like RoCE device with a RoCE v2 GID for the
//! node's real fabric address.
//!
//! Each node's `meminfo` is read below its `proc_root` setting: `proc/meminfo` in the facts
//! directory, a link to the node's real `/proc/meminfo` until a test lowers it
//! ([`lower_meminfo`]) — the same Exec read preflight, `status` and `watch` make on a Spark.
//!
//! Preflight reads them exactly as on a Spark: the worker's `nvidia-smi` is on its default PATH
//! (`/usr/local/bin`), the head's is found through the head's `path` setting (the head is this
//! machine, whose own PATH is left alone), and both nodes' sysfs through their `sysfs_root`
//! setting ([`configure`]). Nothing in the core knows it runs on the testbed; a test changes a
//! fact by rewriting these files.

use std::net::Ipv4Addr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use spark_deploy_core::config::DeploymentConfig;
use spark_deploy_core::ports::exec::{Cmd, Exec};
use spark_deploy_core::preflight::roce::{mapped_gid, parse_route};

use crate::cluster::TestbedInfo;
use crate::cluster::worker::docker_exec;

/// `nvidia-smi -q -d CLOCK` of a two-GPU H200 host.
pub const SMI_CLOCK: &str =
    include_str!("../../../tests/fixtures/host-facts/h200x2/nvidia-smi-q-clock.txt");
/// `nvidia-smi --query-gpu=...` of the same host, with its CSV header.
const SMI_QUERY: &str =
    include_str!("../../../tests/fixtures/host-facts/h200x2/nvidia-smi-query.csv");

/// The clock output, as the node's `nvidia-smi -q -d CLOCK` prints it.
pub const CLOCK_FILE: &str = "nvidia-smi-q-clock.txt";
/// The GPU names, one per line (`--query-gpu=name --format=csv,noheader`).
pub const NAMES_FILE: &str = "gpu-names.txt";
/// The compute processes (`--query-compute-apps=...`; empty: the GPU is idle).
pub const APPS_FILE: &str = "compute-apps.csv";
/// Power draw and utilisation per GPU (`--query-gpu=power.draw,utilization.gpu`), idle.
pub const POWER_FILE: &str = "gpu-power.csv";

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Where node `index` keeps its facts: the head below the state directory, a worker on its disk
/// (mounted at the same path inside the worker, so one path serves both sides).
#[must_use]
pub fn facts_dir(info: &TestbedInfo, index: usize) -> PathBuf {
    match index.checked_sub(1).and_then(|w| info.workers.get(w)) {
        Some(w) => w.disk_dir.join("facts"),
        None => info.state_dir.join("head").join("facts"),
    }
}

/// The sysfs tree of node `index` (its `sysfs_root`).
#[must_use]
pub fn sysfs_root(info: &TestbedInfo, index: usize) -> PathBuf {
    facts_dir(info, index).join("sys")
}

/// The procfs of node `index` as its `proc_root` setting names it.
#[must_use]
pub fn proc_root(info: &TestbedInfo, index: usize) -> PathBuf {
    facts_dir(info, index).join("proc")
}

/// Makes node `index`'s `meminfo` the real one (a link to `/proc/meminfo`, read on the node).
///
/// # Errors
///
/// File-system errors.
pub fn restore_meminfo(info: &TestbedInfo, index: usize) -> std::io::Result<()> {
    link_meminfo(&proc_root(info, index))
}

fn link_meminfo(proc: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(proc)?;
    let f = proc.join("meminfo");
    match std::fs::remove_file(&f) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    std::os::unix::fs::symlink("/proc/meminfo", f)
}

/// Gives node `index` a `meminfo` whose `MemAvailable` is `available_gib` (the rest as this
/// machine's), as a host process taking memory would.
///
/// # Errors
///
/// File-system errors.
pub fn lower_meminfo(info: &TestbedInfo, index: usize, available_gib: f64) -> std::io::Result<()> {
    let real = std::fs::read_to_string("/proc/meminfo")?;
    let kib = (available_gib * 1024.0 * 1024.0) as u64;
    let text: String = real
        .lines()
        .map(|l| {
            if l.starts_with("MemAvailable:") {
                format!("MemAvailable:   {kib} kB\n")
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    let f = proc_root(info, index).join("meminfo");
    let tmp = f.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(tmp, f)
}

/// Points a deployment config at the facts the testbed's hosts present: every node's
/// `sysfs_root`, the head's `path` (its `nvidia-smi`), and the container runtime the ranks use —
/// the testbed's daemon has no NVIDIA runtime, and the stand-in engine needs no GPU, so its ranks
/// run under `runc` and preflight checks that one.
pub fn configure(info: &TestbedInfo, config: &mut DeploymentConfig) {
    config.engine.runtime = "runc".into();
    for (i, node) in config.nodes.iter_mut().enumerate() {
        node.sysfs_root = sysfs_root(info, i).display().to_string();
        node.proc_root = proc_root(info, i).display().to_string();
        if i == 0 {
            node.path = vec![facts_dir(info, 0).join("bin").display().to_string()];
        }
    }
}

/// The GPU names column of [`SMI_QUERY`], as `--query-gpu=name --format=csv,noheader` prints it.
fn gpu_names() -> String {
    SMI_QUERY
        .lines()
        .skip(1)
        .filter_map(|l| l.split(", ").nth(1))
        .map(|n| format!("{n}\n"))
        .collect()
}

/// The `nvidia-smi` of a node whose facts are in `dir`: the three queries preflight makes, each
/// answered from its file; anything else is refused like an unsupported option.
fn smi_script(dir: &Path) -> String {
    let d = dir.display();
    format!(
        r#"#!/bin/sh
# nvidia-smi of a spark-deploy testbed node: outputs captured on an NVIDIA host, from {d}
d='{d}'
case "$*" in
"-q -d CLOCK") exec cat "$d/{CLOCK_FILE}" ;;
"--query-gpu=name --format=csv,noheader") exec cat "$d/{NAMES_FILE}" ;;
"--query-compute-apps=pid,process_name,used_memory --format=csv,noheader") exec cat "$d/{APPS_FILE}" ;;
"--query-gpu=power.draw,utilization.gpu --format=csv,noheader,nounits") exec cat "$d/{POWER_FILE}" ;;
*) echo "nvidia-smi (testbed): no captured output for: $*" >&2; exit 2 ;;
esac
"#
    )
}

/// One RoCE device of a tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rail<'a> {
    /// HCA name (`rocep1s0f1`).
    pub hca: &'a str,
    /// Its netdev (`enp1s0f1np1`): the node's real fabric netdev, whose real `mtu` file the
    /// tree links to.
    pub netdev: &'a str,
    /// Port state as sysfs prints it (`4: ACTIVE`).
    pub state: &'a str,
    /// Whether GID 3 carries the address as RoCE v2 (else an all-zero RoCE v2 entry).
    pub v2: bool,
}

/// Writes a sysfs tree at `root` (which plays `/sys`), replacing one that is there: per rail
/// `class/net/<netdev>/{mtu → /sys/class/net/<netdev>/mtu, device/infiniband/<hca>}` and
/// `class/infiniband/<hca>/ports/1/{state, gids/0..3, gid_attrs/types/0..3}` with GIDs 0 (fe80,
/// RoCE v1), 1 (fe80, RoCE v2), 2 (`addr`, RoCE v1), 3 (`addr` as RoCE v2 when `v2`).
///
/// # Errors
///
/// File-system errors.
pub fn write_tree(root: &Path, addr: Ipv4Addr, rails: &[Rail<'_>]) -> std::io::Result<()> {
    match fs_err::remove_dir_all(root) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let w = |p: &str, c: &str| -> std::io::Result<()> {
        let f = root.join(p);
        if let Some(dir) = f.parent() {
            fs_err::create_dir_all(dir)?;
        }
        fs_err::write(f, format!("{c}\n"))
    };
    let fe80 = "fe80:0000:0000:0000:0000:0000:0000:0001".to_owned();
    let zero = "0000:0000:0000:0000:0000:0000:0000:0000".to_owned();
    for r in rails {
        let net = root.join("class/net").join(r.netdev);
        fs_err::create_dir_all(net.join("device/infiniband").join(r.hca))?;
        let mtu = net.join("mtu");
        if fs_err::symlink_metadata(&mtu).is_err() {
            fs_err::os::unix::fs::symlink(format!("/sys/class/net/{}/mtu", r.netdev), &mtu)?;
        }
        let base = format!("class/infiniband/{}/ports/1", r.hca);
        w(&format!("{base}/state"), r.state)?;
        let entries = [
            (fe80.clone(), "IB/RoCE v1"),
            (fe80.clone(), "RoCE v2"),
            (mapped_gid(addr), "IB/RoCE v1"),
            (
                if r.v2 { mapped_gid(addr) } else { zero.clone() },
                "RoCE v2",
            ),
        ];
        for (i, (gid, ty)) in entries.iter().enumerate() {
            w(&format!("{base}/gids/{i}"), gid)?;
            w(&format!("{base}/gid_attrs/types/{i}"), ty)?;
        }
    }
    Ok(())
}

/// The fabric netdev of a node: the device of its route to `peer`, asked on the node itself.
async fn fabric_netdev(exec: &Exec, node: &str, peer: Ipv4Addr) -> Result<String, BoxError> {
    let out = exec
        .run(&Cmd::new("ip").args(["-o", "-4", "route", "get", &peer.to_string()]))
        .await?;
    Ok(parse_route(&String::from_utf8_lossy(&out.stdout))
        .ok_or_else(|| format!("{node}: no route to {peer}"))?
        .dev)
}

/// Writes node `index`'s facts: its `nvidia-smi` and GPU outputs, its `meminfo` (linked to the
/// real one), and a sysfs tree with one ACTIVE rail on its fabric netdev.
fn write_node(dir: &Path, addr: Ipv4Addr, netdev: &str) -> Result<(), BoxError> {
    fs_err::create_dir_all(dir.join("bin"))?;
    fs_err::write(dir.join(CLOCK_FILE), SMI_CLOCK)?;
    fs_err::write(dir.join(NAMES_FILE), gpu_names())?;
    fs_err::write(dir.join(APPS_FILE), "")?;
    fs_err::write(dir.join(POWER_FILE), "41.20, 0\n38.50, 0\n")?;
    link_meminfo(&dir.join("proc"))?;
    let smi = dir.join("bin/nvidia-smi");
    fs_err::write(&smi, smi_script(dir))?;
    fs_err::set_permissions(&smi, std::fs::Permissions::from_mode(0o755))?;
    let rail = Rail {
        hca: "rocep1s0f1",
        netdev,
        state: "4: ACTIVE",
        v2: true,
    };
    write_tree(&dir.join("sys"), addr, &[rail])?;
    Ok(())
}

/// Gives every node of a running testbed its facts (see the module doc); a worker's
/// `nvidia-smi` is linked into its `/usr/local/bin`.
///
/// # Errors
///
/// SSH to a worker, a node without a route to its peer, `docker exec`, or file-system errors.
pub async fn install(info: &TestbedInfo) -> Result<(), BoxError> {
    let first_worker = info.workers.first().ok_or("testbed without workers")?;
    let head = Exec::local("head");
    let netdev = fabric_netdev(&head, "head", first_worker.fabric_addr).await?;
    write_node(&facts_dir(info, 0), info.head_fabric_addr, &netdev)?;
    let docker = info.head_docker()?;
    for (i, w) in info.workers.iter().enumerate() {
        let exec = w.exec().await?;
        let netdev = fabric_netdev(&exec, &w.name, info.head_fabric_addr).await?;
        let dir = facts_dir(info, i + 1);
        write_node(&dir, w.fabric_addr, &netdev)?;
        let smi = dir.join("bin/nvidia-smi").display().to_string();
        let (code, out) = docker_exec(
            &docker,
            &w.container,
            &["ln", "-sf", &smi, "/usr/local/bin/nvidia-smi"],
        )
        .await?;
        if code != 0 {
            return Err(format!("{}: linking nvidia-smi failed: {out}", w.container).into());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_names_are_the_query_column() {
        assert_eq!(super::gpu_names(), "NVIDIA H200\nNVIDIA H200\n");
    }

    #[test]
    fn the_nvidia_smi_script_answers_the_preflight_queries_only() {
        let t = tempfile::tempdir().unwrap();
        write_node(t.path(), "198.18.0.1".parse().unwrap(), "lo").unwrap();
        let smi = t.path().join("bin/nvidia-smi");
        let run = |args: &[&str]| {
            std::process::Command::new(&smi)
                .args(args)
                .output()
                .unwrap()
        };
        let o = run(&["-q", "-d", "CLOCK"]);
        assert!(o.status.success());
        assert_eq!(String::from_utf8_lossy(&o.stdout), SMI_CLOCK);
        let o = run(&["--query-gpu=name", "--format=csv,noheader"]);
        assert_eq!(
            String::from_utf8_lossy(&o.stdout),
            "NVIDIA H200\nNVIDIA H200\n"
        );
        let o = run(&["-L"]);
        assert!(!o.status.success());
        assert!(String::from_utf8_lossy(&o.stderr).contains("no captured output"));
        // The tree's MTU is the real netdev's.
        let mtu = std::fs::read_to_string(t.path().join("sys/class/net/lo/mtu")).unwrap();
        assert_eq!(
            mtu,
            std::fs::read_to_string("/sys/class/net/lo/mtu").unwrap()
        );
    }
}
