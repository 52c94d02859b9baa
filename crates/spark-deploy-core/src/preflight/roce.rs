//! RoCE facts of a node's fabric port: the netdev and source address towards the peer, the RoCE devices ("twins") of that port and the RoCE v2 GID index of the
//! fabric address — detected at every start, because the index can move across reboots.

use std::net::Ipv4Addr;
use std::path::PathBuf;

use serde::Serialize;

use super::report::Finding;

/// Read access to a sysfs tree (a real `/sys`, a tree a test built, or a dump taken over SSH).
pub trait Sysfs {
    /// A file's contents, trimmed; `None` when absent.
    fn read(&self, path: &str) -> Option<String>;
    /// Entry names of a directory, sorted; empty when absent.
    fn list(&self, dir: &str) -> Vec<String>;
}

/// A sysfs tree on the local filesystem under `root` (`/` in production).
#[derive(Debug, Clone)]
pub struct DirSysfs {
    root: PathBuf,
}

impl DirSysfs {
    /// Reads paths below `root` (`/sys/...` becomes `<root>/sys/...`).
    #[must_use]
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    fn at(&self, path: &str) -> PathBuf {
        self.root.join(path.trim_start_matches('/'))
    }
}

impl Sysfs for DirSysfs {
    fn read(&self, path: &str) -> Option<String> {
        std::fs::read_to_string(self.at(path))
            .ok()
            .map(|s| s.trim().to_owned())
    }

    fn list(&self, dir: &str) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(self.at(dir))
            .map(|rd| {
                rd.filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }
}

/// The route towards the peer: `ip -o -4 route get <peer>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Route {
    /// Outgoing netdev.
    pub dev: String,
    /// Source address.
    pub src: Ipv4Addr,
}

/// Parses `ip -o -4 route get` output (`<peer> dev <dev> src <src> uid 0 \ cache`).
#[must_use]
pub fn parse_route(text: &str) -> Option<Route> {
    let words: Vec<&str> = text.split_whitespace().collect();
    let after = |k: &str| words.windows(2).find(|w| w[0] == k).map(|w| w[1]);
    Some(Route {
        dev: after("dev")?.to_owned(),
        src: after("src")?.parse().ok()?,
    })
}

/// The detected RoCE configuration of one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RoceFacts {
    /// Fabric netdev (`NCCL_SOCKET_IFNAME`).
    pub netdev: String,
    /// The node's fabric address.
    pub addr: Ipv4Addr,
    /// RoCE devices of the port, primary first (`NCCL_IB_HCA`, `TF_RDMA_DEVICES`).
    pub devices: Vec<String>,
    /// RoCE v2 GID index of `addr`, the same on every device.
    pub gid_index: u32,
    /// Netdev MTU, when readable.
    pub mtu: Option<u32>,
    /// Accepted but risky findings (MTU below 9000, a single rail), each with its remedy.
    pub warnings: Vec<Finding>,
}

/// Why RoCE detection failed; [`RoceError::remedy`] says what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RoceError {
    /// The netdev has no RDMA device.
    #[error("netdev {netdev} has no RDMA device under /sys/class/net/{netdev}/device/infiniband")]
    NoDevice {
        /// Netdev.
        netdev: String,
    },
    /// A device's port is not ACTIVE.
    #[error("RoCE device {device} port 1 is {state:?}, not ACTIVE")]
    NotActive {
        /// Device.
        device: String,
        /// The state read.
        state: String,
    },
    /// No RoCE v2 GID carries the fabric address.
    #[error("RoCE device {device} has no RoCE v2 GID for {addr}")]
    NoGid {
        /// Device.
        device: String,
        /// Address looked for.
        addr: Ipv4Addr,
    },
    /// The twins resolve to different indices.
    #[error("RoCE twins disagree on the GID index ({detail})")]
    TwinsDisagree {
        /// Device → index pairs.
        detail: String,
    },
}

impl RoceError {
    /// What fixes it.
    #[must_use]
    pub fn remedy(&self) -> String {
        match self {
            Self::NoDevice { .. } => "route the fabric address over the ConnectX-7 port: it must be configured on that port's netdev (`ip -4 addr`), and nodes[].fabric_addr (FABRIC_PEER) must name it".to_owned(),
            Self::NotActive { device, .. } => format!("check the cable and the link: `ibv_devinfo -d {device}` must show PORT_ACTIVE"),
            Self::NoGid { addr, .. } => format!("configure {addr} on the device's netdev (`ip -4 addr`); an all-zero or RoCE v1 entry makes NCCL fail a minute into the start"),
            Self::TwinsDisagree { .. } => "give both halves of the port the same address configuration (the same IPv4 on both netdevs), then check `ls /sys/class/infiniband/*/ports/1/gids`".to_owned(),
        }
    }

    /// The error as an observation and its remedy.
    #[must_use]
    pub fn finding(&self) -> Finding {
        Finding {
            observed: self.to_string(),
            remedy: self.remedy(),
        }
    }
}

/// The IPv4-mapped GID string of `addr` as sysfs prints it.
#[must_use]
pub fn mapped_gid(addr: Ipv4Addr) -> String {
    let o = addr.octets();
    format!(
        "0000:0000:0000:0000:0000:ffff:{:02x}{:02x}:{:02x}{:02x}",
        o[0], o[1], o[2], o[3]
    )
}

fn gid_index_of(sys: &dyn Sysfs, device: &str, addr: Ipv4Addr) -> Option<u32> {
    let want = mapped_gid(addr);
    let base = format!("/sys/class/infiniband/{device}/ports/1");
    let mut indices: Vec<u32> = sys
        .list(&format!("{base}/gids"))
        .iter()
        .filter_map(|n| n.parse().ok())
        .collect();
    indices.sort_unstable();
    indices.into_iter().find(|i| {
        sys.read(&format!("{base}/gids/{i}"))
            .is_some_and(|g| g.eq_ignore_ascii_case(&want))
            && sys
                .read(&format!("{base}/gid_attrs/types/{i}"))
                .is_some_and(|t| t.eq_ignore_ascii_case("RoCE v2"))
    })
}

/// Detects the RoCE facts of the port carrying `route`.
///
/// # Errors
///
/// A [`RoceError`] naming the device and what to fix.
pub fn detect(sys: &dyn Sysfs, route: &Route) -> Result<RoceFacts, RoceError> {
    let primary = sys
        .list(&format!("/sys/class/net/{}/device/infiniband", route.dev))
        .into_iter()
        .next()
        .ok_or_else(|| RoceError::NoDevice {
            netdev: route.dev.clone(),
        })?;
    // Twins: other devices whose RoCE v2 table carries the same address.
    let mut devices = vec![primary.clone()];
    devices.extend(
        sys.list("/sys/class/infiniband")
            .into_iter()
            .filter(|d| *d != primary && gid_index_of(sys, d, route.src).is_some()),
    );
    let mut indices = Vec::new();
    for d in &devices {
        let state = sys
            .read(&format!("/sys/class/infiniband/{d}/ports/1/state"))
            .unwrap_or_default();
        if !state.contains("ACTIVE") {
            return Err(RoceError::NotActive {
                device: d.clone(),
                state,
            });
        }
        let i = gid_index_of(sys, d, route.src).ok_or_else(|| RoceError::NoGid {
            device: d.clone(),
            addr: route.src,
        })?;
        indices.push((d.clone(), i));
    }
    if indices.iter().any(|(_, i)| *i != indices[0].1) {
        let detail = indices
            .iter()
            .map(|(d, i)| format!("{d}={i}"))
            .collect::<Vec<_>>()
            .join(", ");
        return Err(RoceError::TwinsDisagree { detail });
    }
    let mtu = sys
        .read(&format!("/sys/class/net/{}/mtu", route.dev))
        .and_then(|m| m.parse().ok());
    let mut warnings = Vec::new();
    if let Some(m) = mtu.filter(|m| *m < 9000) {
        warnings.push(Finding {
            observed: format!(
                "{} MTU {m} < 9000: NCCL all-gather runs ~10 % slower",
                route.dev
            ),
            remedy: format!(
                "`sudo ip link set {} mtu 9000` on both nodes (and persist it in netplan)",
                route.dev
            ),
        });
    }
    if devices.len() == 1 {
        warnings.push(Finding {
            observed: format!(
                "only one RoCE device ({primary}) carries {}: the second rail is unused (about half the bandwidth)",
                route.src
            ),
            remedy: format!(
                "configure {} on the port's second netdev too, so both RoCE devices carry it",
                route.src
            ),
        });
    }
    Ok(RoceFacts {
        netdev: route.dev.clone(),
        addr: route.src,
        devices,
        gid_index: indices[0].1,
        mtu,
        warnings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds a Spark-like sysfs tree: one netdev per twin, both carrying `addr` at `gid`.
    fn spark_tree(addr: Ipv4Addr, gids: &[(&str, &str, u32)], state: &str) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        let w = |p: &str, c: &str| {
            let f = d.path().join(p.trim_start_matches('/'));
            std::fs::create_dir_all(f.parent().unwrap()).unwrap();
            std::fs::write(f, format!("{c}\n")).unwrap();
        };
        for (dev, netdev, idx) in gids {
            w(&format!("/sys/class/net/{netdev}/mtu"), "9000");
            std::fs::create_dir_all(
                d.path()
                    .join(format!("sys/class/net/{netdev}/device/infiniband/{dev}")),
            )
            .unwrap();
            let base = format!("/sys/class/infiniband/{dev}/ports/1");
            w(&format!("{base}/state"), state);
            for i in 0..=*idx + 1 {
                let (gid, ty) = match i {
                    0 => (
                        "fe80:0000:0000:0000:0000:0000:0000:0001".to_owned(),
                        "IB/RoCE v1",
                    ),
                    i if i == *idx - 1 => (mapped_gid(addr), "IB/RoCE v1"),
                    i if i == *idx => (mapped_gid(addr), "RoCE v2"),
                    _ => (
                        "0000:0000:0000:0000:0000:0000:0000:0000".to_owned(),
                        "RoCE v2",
                    ),
                };
                w(&format!("{base}/gids/{i}"), &gid);
                w(&format!("{base}/gid_attrs/types/{i}"), ty);
            }
        }
        d
    }

    #[test]
    fn finds_the_v2_index_on_both_twins() {
        let addr: Ipv4Addr = "198.18.0.1".parse().unwrap();
        let t = spark_tree(
            addr,
            &[
                ("rocep1s0f1", "enp1s0f1np1", 3),
                ("roceP2p1s0f1", "enP2p1s0f1np1", 3),
            ],
            "4: ACTIVE",
        );
        let route =
            parse_route("198.18.0.2 dev enp1s0f1np1 src 198.18.0.1 uid 0 \\    cache ").unwrap();
        let f = detect(&DirSysfs::new(t.path()), &route).unwrap();
        assert_eq!(f.gid_index, 3, "index 2 is RoCE v1, index 3 is v2");
        assert_eq!(f.devices, ["rocep1s0f1", "roceP2p1s0f1"]);
        assert!(f.warnings.is_empty(), "{:?}", f.warnings);
    }

    #[test]
    fn refuses_down_ports_and_disagreeing_twins() {
        let addr: Ipv4Addr = "198.18.0.1".parse().unwrap();
        let route = Route {
            dev: "enp1s0f1np1".into(),
            src: addr,
        };
        let down = spark_tree(addr, &[("rocep1s0f1", "enp1s0f1np1", 3)], "1: DOWN");
        assert!(matches!(
            detect(&DirSysfs::new(down.path()), &route),
            Err(RoceError::NotActive { .. })
        ));
        let split = spark_tree(
            addr,
            &[
                ("rocep1s0f1", "enp1s0f1np1", 3),
                ("roceP2p1s0f1", "enP2p1s0f1np1", 5),
            ],
            "4: ACTIVE",
        );
        let e = detect(&DirSysfs::new(split.path()), &route).unwrap_err();
        assert!(
            e.to_string().contains("rocep1s0f1=3, roceP2p1s0f1=5"),
            "{e}"
        );
        let other: Ipv4Addr = "198.18.0.9".parse().unwrap();
        let e = detect(
            &DirSysfs::new(split.path()),
            &Route {
                dev: "enp1s0f1np1".into(),
                src: other,
            },
        )
        .unwrap_err();
        assert!(matches!(e, RoceError::NoGid { .. }), "{e}");
        let none = tempfile::tempdir().unwrap();
        assert!(matches!(
            detect(&DirSysfs::new(none.path()), &route),
            Err(RoceError::NoDevice { .. })
        ));
    }
}
