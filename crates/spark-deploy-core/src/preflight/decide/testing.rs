//! Built facts for the decision tests: a healthy Spark pair and Spark-like sysfs trees.

use std::net::Ipv4Addr;

use super::{
    Decision, DiskFacts, DockerProbe, EngineFiles, NodeFacts, RankWeights, Settings, WeightsSource,
};
const RANK_WEIGHT_BYTES: u64 = crate::engine::limits::TENSORFOLD_DSV41
    .memory
    .rank_weights_estimate;
use crate::preflight::report::{Check, CheckResult};
use crate::preflight::roce::{DirSysfs, mapped_gid};

pub(super) const GIB: u64 = 1 << 30;

pub(super) const SMI: &str =
    include_str!("../../../../../tests/fixtures/host-facts/h200x2/nvidia-smi-q-clock.txt");

/// The seed configuration's settings (ranks under the NVIDIA runtime, CONTEXT 1,048,576).
pub(super) fn seed() -> Settings {
    Settings {
        runtime: "nvidia".into(),
        min_avail_gib: 100,
        context: 1_048_576,
        max_tokens: 32_768,
        max_pool: 1_114_063,
        memory: crate::engine::limits::TENSORFOLD_DSV41.memory,
        engine_commit: "0123456789abcdef0123456789abcdef01234567".into(),
        base_image: "nvcr.io/nvidia/pytorch:25.09-py3".into(),
        nfs_export: None,
    }
}

pub(super) fn ip(s: &str) -> Ipv4Addr {
    s.parse().unwrap()
}

/// A DGX Spark's `/sys` below a temporary root: per device `(hca, netdev, port state, v2)`,
/// MTU 9000, GIDs 0 (fe80, v1), 1 (fe80, v2), 2 (`addr`, v1) and 3 (`addr` as RoCE v2 when
/// `v2`, else all zero).
pub(super) fn tree(addr: Ipv4Addr, devs: &[(&str, &str, &str, bool)]) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    let w = |p: String, c: &str| {
        let f = d.path().join(p);
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(f, format!("{c}\n")).unwrap();
    };
    let fe80 = "fe80:0000:0000:0000:0000:0000:0000:0001".to_owned();
    let zero = "0000:0000:0000:0000:0000:0000:0000:0000".to_owned();
    for &(hca, netdev, state, v2) in devs {
        w(format!("sys/class/net/{netdev}/mtu"), "9000");
        w(
            format!("sys/class/net/{netdev}/device/infiniband/{hca}/ibdev"),
            hca,
        );
        let base = format!("sys/class/infiniband/{hca}/ports/1");
        w(format!("{base}/state"), state);
        let v2_gid = if v2 { mapped_gid(addr) } else { zero.clone() };
        let entries = [
            (fe80.clone(), "IB/RoCE v1"),
            (fe80.clone(), "RoCE v2"),
            (mapped_gid(addr), "IB/RoCE v1"),
            (v2_gid, "RoCE v2"),
        ];
        for (i, (gid, ty)) in entries.iter().enumerate() {
            w(format!("{base}/gids/{i}"), gid);
            w(format!("{base}/gid_attrs/types/{i}"), ty);
        }
    }
    d
}

pub(super) const RAILS: [(&str, &str, &str, bool); 2] = [
    ("rocep1s0f1", "enp1s0f1np1", "4: ACTIVE", true),
    ("roceP2p1s0f1", "enP2p1s0f1np1", "4: ACTIVE", true),
];

/// A healthy node; `t` must outlive the facts' use (the sysfs reads it lazily).
pub(super) fn healthy(index: usize, t: &tempfile::TempDir) -> NodeFacts {
    let (name, ssh, me, peer) = if index == 0 {
        ("head", "local", "198.18.0.1", "198.18.0.2")
    } else {
        ("worker-1", "me@spark-2", "198.18.0.2", "198.18.0.1")
    };
    let mut f = NodeFacts::new(name, index, ssh);
    f.fabric_addr = Some(ip(me));
    f.peer = Some(ip(peer));
    f.reach = Ok(());
    f.sudo = true;
    f.docker = DockerProbe::Reachable;
    f.smi = Some(Ok(SMI.to_owned()));
    f.gpu_model = Some(Ok("NVIDIA GB10\n".to_owned()));
    f.gpu_processes = Some(Ok(String::new()));
    f.runtimes = Some(Ok(vec![
        "io.containerd.runc.v2".into(),
        "nvidia".into(),
        "runc".into(),
    ]));
    f.gpu_containers = Some(Ok(Vec::new()));
    f.meminfo = Ok(format!(
        "MemTotal: 130000000 kB\nMemAvailable: {} kB\n",
        125 * 1024 * 1024
    ));
    f.rank_weights = Some(RankWeights {
        bytes: RANK_WEIGHT_BYTES,
        source: WeightsSource::RankFile,
    });
    f.disks = vec![DiskFacts {
        dir: "/data/spark-deploy".into(),
        df: Ok(format!(
            "/dev/nvme0n1p2 3000000000 1000000000 {} 34% /",
            500 * 1024 * 1024
        )),
        missing: Vec::new(),
        linked_from: None,
    }];
    f.route = Some(Ok(format!(
        "{peer} dev enp1s0f1np1 src {me} uid 1000 \\    cache "
    )));
    f.mtu = Some(Ok("9000\n".to_owned()));
    f.sysfs = Some(Ok(Box::new(DirSysfs::new(t.path()))));
    f.infiniband = true;
    if index == 0 {
        f.engine_files = Some(EngineFiles {
            dir: "/data/spark-deploy/engine/0123456789ab".into(),
            found: Ok(vec![
                ("tensorfold-native".into(), true),
                ("tf-dsv41-lanes".into(), true),
            ]),
        });
        f.base_image = Some(Ok(Some(7 * GIB)));
    }
    f
}

pub(super) fn pair() -> (tempfile::TempDir, tempfile::TempDir) {
    (
        tree(ip("198.18.0.1"), &RAILS),
        tree(ip("198.18.0.2"), &RAILS),
    )
}

pub(super) fn row<'a>(d: &'a Decision, check: Check, node: &str) -> &'a CheckResult {
    d.results
        .iter()
        .find(|r| r.check == check && r.node == node)
        .unwrap_or_else(|| panic!("no {check} row for {node}: {:#?}", d.results))
}

pub(super) fn remedy(r: &CheckResult) -> &str {
    r.remedy.as_deref().unwrap_or("")
}
