//! Spark-like sysfs trees for the places that cannot have a ConnectX-7: tests of the RoCE
//! decisions and the testbed, whose preflight reads its GPU and RoCE facts from fixtures and says
//! so in the report. The shape follows a DGX Spark's `/sys/class/{net,infiniband}`.

use std::net::Ipv4Addr;
use std::path::Path;

use super::roce::mapped_gid;

/// Where a testbed node keeps the fixture inputs of its GPU and RoCE checks, below its data dir:
/// `nvidia-smi-q-clock.txt` (`nvidia-smi -q -d CLOCK`), `gpu-names.txt` (`nvidia-smi
/// --query-gpu=name --format=csv,noheader`), `compute-apps.csv` (`--query-compute-apps`) and a
/// `sys/` tree ([`write_tree`]). Preflight reads them through the node's Exec port like the real
/// commands, and labels every row decided on them.
pub const TESTBED_DIR: &str = "testbed-facts";

/// One RoCE device of a tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rail<'a> {
    /// HCA name (`rocep1s0f1`).
    pub hca: &'a str,
    /// Its netdev (`enp1s0f1np1`).
    pub netdev: &'a str,
    /// Port state as sysfs prints it (`4: ACTIVE`).
    pub state: &'a str,
    /// Whether GID 3 carries the address as RoCE v2 (else an all-zero RoCE v2 entry).
    pub v2: bool,
    /// The netdev's MTU.
    pub mtu: u32,
}

/// Writes a tree below `root` (which plays `/`): per rail `sys/class/net/<netdev>/{mtu,
/// device/infiniband/<hca>}` and `sys/class/infiniband/<hca>/ports/1/{state, gids/0..3,
/// gid_attrs/types/0..3}` with GIDs 0 (fe80, RoCE v1), 1 (fe80, RoCE v2), 2 (`addr`, RoCE v1),
/// 3 (`addr` as RoCE v2 when `v2`).
///
/// # Errors
///
/// File-system errors.
pub fn write_tree(root: &Path, addr: Ipv4Addr, rails: &[Rail<'_>]) -> std::io::Result<()> {
    let w = |p: &str, c: &str| -> std::io::Result<()> {
        let f = root.join(p.trim_start_matches('/'));
        if let Some(dir) = f.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(f, format!("{c}\n"))
    };
    let fe80 = "fe80:0000:0000:0000:0000:0000:0000:0001".to_owned();
    let zero = "0000:0000:0000:0000:0000:0000:0000:0000".to_owned();
    for r in rails {
        w(
            &format!("/sys/class/net/{}/mtu", r.netdev),
            &r.mtu.to_string(),
        )?;
        w(
            &format!(
                "/sys/class/net/{}/device/infiniband/{}/ibdev",
                r.netdev, r.hca
            ),
            r.hca,
        )?;
        let base = format!("/sys/class/infiniband/{}/ports/1", r.hca);
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
