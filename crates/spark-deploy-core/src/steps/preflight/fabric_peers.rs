//! The fabric addresses the config leaves to detection (`nodes[].fabric_addr` unset), found before
//! the nodes' facts are collected, because each node's route check needs its peer's address:
//!
//! - a follower's address given, the head's not: the head's is the source of its route to that
//!   follower (`ip -o -4 route get <follower>`);
//! - a follower's address not given: among the follower's IPv4 addresses on RoCE netdevs (those
//!   with `device/infiniband` below its `sysfs_root`), the first that the head reaches directly
//!   (no `via`) out of a RoCE netdev of its own; the head's address is that route's source.
//!
//! What is not found stays unknown, and the fabric check then says so with its remedy.

use std::net::Ipv4Addr;

use crate::config::NodeConfig;
use crate::context::Context;
use crate::ports::exec::{Cmd, Exec};
use crate::preflight::roce;

/// Lists `dev addr` for every IPv4 address on a netdev that has an RDMA device below the sysfs
/// root `$1`.
const ROCE_ADDRS_SCRIPT: &str = r#"ip -o -4 addr show | while read -r _ dev _ cidr _; do
  dev=${dev%%@*}
  [ -d "$1/class/net/$dev/device/infiniband" ] && printf '%s %s\n' "$dev" "${cidr%%/*}"
done; true"#;

/// Parses [`ROCE_ADDRS_SCRIPT`]'s output into addresses, in the order listed.
fn parse_roce_addrs(text: &str) -> Vec<Ipv4Addr> {
    text.lines()
        .filter_map(|l| l.split_whitespace().nth(1)?.parse().ok())
        .collect()
}

/// `ip -o -4 route get` output names a gateway: the peer is not on a directly attached link.
fn routed_via_gateway(route_text: &str) -> bool {
    route_text.split_whitespace().any(|w| w == "via")
}

async fn stdout(exec: &Exec, cmd: &Cmd) -> Option<String> {
    exec.run(cmd)
        .await
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
}

/// The head's route towards `peer` when it leaves directly from a RoCE netdev: its source.
async fn head_source_towards(head: &Exec, node: &NodeConfig, peer: Ipv4Addr) -> Option<Ipv4Addr> {
    let text = stdout(
        head,
        &Cmd::new("ip").args(["-o", "-4", "route", "get", &peer.to_string()]),
    )
    .await?;
    if routed_via_gateway(&text) {
        return None;
    }
    let route = roce::parse_route(&text)?;
    let root = node.sysfs_root.trim_end_matches('/');
    let is_roce = head
        .path_exists(std::path::Path::new(&format!(
            "{root}/class/net/{}/device/infiniband",
            route.dev
        )))
        .await
        .unwrap_or(false);
    is_roce.then_some(route.src)
}

/// Each node's fabric address, as configured or detected (`None`: not found).
pub(super) async fn resolve(ctx: &Context) -> Vec<Option<Ipv4Addr>> {
    let c = ctx.config().config();
    let mut addrs: Vec<Option<Ipv4Addr>> = c.nodes.iter().map(|n| n.fabric_addr).collect();
    let Ok(head) = ctx.exec(0).await else {
        return addrs;
    };
    for i in 1..c.nodes.len() {
        if addrs[i].is_none() {
            let Ok(exec) = ctx.exec(i).await else {
                continue;
            };
            let root = c.nodes[i].sysfs_root.trim_end_matches('/').to_owned();
            let listed = stdout(exec, &Cmd::shell(ROCE_ADDRS_SCRIPT).args(["sh", &root])).await;
            for cand in parse_roce_addrs(listed.as_deref().unwrap_or_default()) {
                if let Some(src) = head_source_towards(head, &c.nodes[0], cand).await {
                    addrs[i] = Some(cand);
                    addrs[0] = addrs[0].or(Some(src));
                    break;
                }
            }
        }
        if addrs[0].is_none()
            && let Some(follower) = addrs[i]
        {
            addrs[0] = head_source_towards(head, &c.nodes[0], follower).await;
        }
    }
    addrs
}

/// Each node's peer for the route check: the head's is the first follower, a follower's the head.
pub(super) fn peers(addrs: &[Option<Ipv4Addr>]) -> Vec<Option<Ipv4Addr>> {
    (0..addrs.len())
        .map(|i| {
            if i == 0 {
                addrs.get(1).copied().flatten()
            } else {
                addrs[0]
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roce_addresses_are_read_in_order_and_junk_is_skipped() {
        let text = "rocep1s0f1 198.18.0.3\nenp1s0f1np1 198.18.1.3\nbroken\nx not-an-ip\n";
        assert_eq!(
            parse_roce_addrs(text),
            vec![Ipv4Addr::new(198, 18, 0, 3), Ipv4Addr::new(198, 18, 1, 3)]
        );
    }

    #[test]
    fn a_gateway_in_the_route_means_not_directly_attached() {
        assert!(routed_via_gateway(
            "10.0.0.9 via 192.0.2.1 dev eth0 src 192.0.2.5 uid 0 \\    cache"
        ));
        assert!(!routed_via_gateway(
            "198.18.0.3 dev eth1 src 198.18.0.1 uid 0 \\    cache"
        ));
    }

    #[test]
    fn the_head_peers_with_the_first_follower_and_followers_with_the_head() {
        let h = Ipv4Addr::new(198, 18, 0, 1);
        let w = Ipv4Addr::new(198, 18, 0, 2);
        assert_eq!(peers(&[Some(h), Some(w)]), vec![Some(w), Some(h)]);
        assert_eq!(peers(&[None, Some(w)]), vec![Some(w), None]);
    }
}
