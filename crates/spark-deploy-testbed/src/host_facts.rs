//! The GPU and RoCE facts the testbed cannot have, as fixtures on each node: preflight reads them
//! through the node's Exec port in place of `nvidia-smi` and `/sys`, decides on them like on a
//! Spark, and labels those rows "testbed fixture" in its report.
//!
//! The GPU outputs are real ones captured on an NVIDIA machine (`tests/fixtures/host-facts`). The
//! RoCE tree is built for the node's real fabric netdev (asked with `ip route get <peer>` on the
//! node itself) and real MTU, with a RoCE v2 GID carrying the node's real fabric address.

use std::path::Path;

use spark_deploy_core::config::DeploymentConfig;
use spark_deploy_core::ports::exec::{Cmd, Exec};
use spark_deploy_core::preflight::fixture::{Rail, TESTBED_DIR, write_tree};
use spark_deploy_core::preflight::roce::parse_route;

/// `nvidia-smi -q -d CLOCK` of a two-GPU H200 host.
pub const SMI_CLOCK: &str =
    include_str!("../../../tests/fixtures/host-facts/h200x2/nvidia-smi-q-clock.txt");
/// `nvidia-smi --query-gpu=...` of the same host, with its CSV header.
const SMI_QUERY: &str =
    include_str!("../../../tests/fixtures/host-facts/h200x2/nvidia-smi-query.csv");

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The GPU names column of [`SMI_QUERY`], as `--query-gpu=name --format=csv,noheader` prints it.
fn gpu_names() -> String {
    SMI_QUERY
        .lines()
        .skip(1)
        .filter_map(|l| l.split(", ").nth(1))
        .map(|n| format!("{n}\n"))
        .collect()
}

/// Writes every node's fixture directory (`<data_dir>/testbed-facts`; the workers' data dirs are
/// bind mounts of this machine's directories at the same path).
///
/// # Errors
///
/// SSH to a worker, a node without a route to its peer, or file-system errors.
pub async fn install(config: &DeploymentConfig, home: &Path) -> Result<(), BoxError> {
    let addrs: Vec<_> = config.nodes.iter().map(|n| n.fabric_addr).collect();
    for (i, node) in config.nodes.iter().enumerate() {
        let me = node
            .fabric_addr
            .ok_or("testbed node without a fabric address")?;
        let peer = if i == 0 { addrs.get(1) } else { addrs.first() }
            .copied()
            .flatten()
            .ok_or("testbed peer without a fabric address")?;
        let exec = if i == 0 {
            Exec::local(&node.name)
        } else {
            Exec::connect(&node.name, &spark_deploy_core::run::node_target(node, home)).await?
        };
        let out = exec
            .run(&Cmd::new("ip").args(["-o", "-4", "route", "get", &peer.to_string()]))
            .await?;
        let route = parse_route(&String::from_utf8_lossy(&out.stdout))
            .ok_or_else(|| format!("{}: no route to {peer}", node.name))?;
        let mtu = exec
            .read_file(&Path::new("/sys/class/net").join(&route.dev).join("mtu"))
            .await?;
        let mtu: u32 = String::from_utf8_lossy(&mtu).trim().parse()?;
        let dir = Path::new(&node.data_dir).join(TESTBED_DIR);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("nvidia-smi-q-clock.txt"), SMI_CLOCK)?;
        std::fs::write(dir.join("gpu-names.txt"), gpu_names())?;
        std::fs::write(dir.join("compute-apps.csv"), "")?;
        let rail = Rail {
            hca: "rocep1s0f1",
            netdev: &route.dev,
            state: "4: ACTIVE",
            v2: true,
            mtu,
        };
        write_tree(&dir, me, &[rail])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn gpu_names_are_the_query_column() {
        assert_eq!(super::gpu_names(), "NVIDIA H200\nNVIDIA H200\n");
    }
}
