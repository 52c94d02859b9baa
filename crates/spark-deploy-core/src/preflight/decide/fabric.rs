//! The fabric: the route to the peer leaves from the fabric address, the RoCE devices of that
//! port are ACTIVE with a RoCE v2 GID for it, and (across nodes) the fabric MTU is the same.

use super::{Detected, NodeFacts};
use crate::preflight::report::{Check, CheckResult, Verdict};
use crate::preflight::roce;

pub(super) fn decide(f: &NodeFacts, out: &mut Vec<CheckResult>, d: &mut Detected) {
    let n = f.name.as_str();
    let (Some(peer), Some(route_text)) = (f.peer, &f.route) else {
        out.push(CheckResult::fail(
            Check::FabricAddr,
            n,
            "the peer's fabric address is unknown",
            if f.index == 0 {
                "set nodes[1].fabric_addr (FABRIC_PEER) to the first worker's ConnectX-7 address".to_owned()
            } else {
                format!(
                    "set nodes[{}].fabric_addr to this worker's ConnectX-7 address and nodes[0].fabric_addr to the head's",
                    f.index
                )
            },
        ));
        return;
    };
    let Some(route) = route_text.as_ref().ok().and_then(|t| roce::parse_route(t)) else {
        out.push(CheckResult::fail(
            Check::FabricRoute,
            n,
            format!("no route to {peer}"),
            format!("connect the fabric link and configure its address (`ip -4 addr`; `ip route get {peer}` must name the ConnectX-7 netdev)"),
        ));
        return;
    };
    match f.fabric_addr {
        Some(expected) if expected != route.src => out.push(CheckResult::fail(
            Check::FabricAddr,
            n,
            format!("route to {peer} leaves from {} via {}, not from the fabric address {expected}", route.src, route.dev),
            format!(
                "the peer is reachable only over another network (management?): nodes[{}].fabric_addr {expected} must be configured on the ConnectX-7 netdev and the peer's fabric address must be on its subnet (`ip -4 addr`, `ip route get {peer}`)",
                f.index
            ),
        )),
        _ => out.push(CheckResult::ok(
            Check::FabricAddr,
            n,
            format!("{} on {} reaches {peer}", route.src, route.dev),
        )),
    }
    match &f.sysfs {
        Some(Ok(sys)) => match roce::detect(sys.as_ref(), &route) {
            Ok(r) => {
                for w in &r.warnings {
                    out.push(CheckResult::from_finding(
                        Check::FabricRoce,
                        n,
                        Verdict::Warn,
                        w.clone(),
                    ));
                }
                out.push(CheckResult::ok(
                    Check::FabricRoce,
                    n,
                    format!(
                        "{} ACTIVE, RoCE v2 GID index {}",
                        r.devices.join(","),
                        r.gid_index
                    ),
                ));
                d.roce = Some(r);
            }
            Err(e) => out.push(CheckResult::from_finding(
                Check::FabricRoce,
                n,
                Verdict::Fail,
                e.finding(),
            )),
        },
        Some(Err(e)) => out.push(CheckResult::fail(
            Check::FabricRoce,
            n,
            e.clone(),
            format!("the sysfs dump (sh, ls, head over the node's sysfs_root) must run on {n}: check that the SSH user's shell is POSIX"),
        )),
        None => out.push(CheckResult::fail(
            Check::FabricRoce,
            n,
            "sysfs not collected",
            format!("the sysfs dump (sh, ls, head over the node's sysfs_root) must run on {n}"),
        )),
    }
    d.route = Some(route);
}

/// Fabric MTU across nodes: every node's fabric netdev must have the same MTU (a mismatch drops
/// jumbo frames on the larger side).
pub(super) fn compare_mtu(facts: &[NodeFacts], detected: &[Detected]) -> Option<CheckResult> {
    let mtus: Vec<(&str, &str, u32)> = facts
        .iter()
        .zip(detected)
        .filter_map(|(f, d)| {
            let route = d.route.as_ref()?;
            let mtu = f.mtu.as_ref()?.as_ref().ok()?.trim().parse().ok()?;
            Some((f.name.as_str(), route.dev.as_str(), mtu))
        })
        .collect();
    if mtus.len() < 2 {
        return None;
    }
    let observed = mtus
        .iter()
        .map(|(n, dev, m)| format!("{n} {dev} {m}"))
        .collect::<Vec<_>>()
        .join("; ");
    let max = mtus.iter().map(|m| m.2).max().unwrap_or(0);
    if mtus.iter().all(|m| m.2 == max) {
        return Some(CheckResult::ok(Check::FabricMtu, "all", observed));
    }
    let fixes = mtus
        .iter()
        .filter(|m| m.2 != max)
        .map(|(n, dev, _)| format!("on {n}: `sudo ip link set {dev} mtu {max}`"))
        .collect::<Vec<_>>()
        .join("; ");
    Some(CheckResult::fail(
        Check::FabricMtu,
        "all",
        observed,
        format!(
            "the fabric MTU must be the same on every node; {fixes} (and persist it in netplan)"
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::super::testing::{RAILS, healthy, ip, pair, remedy, row, seed, tree};
    use super::*;
    use crate::preflight::decide::decide as decide_all;
    use crate::preflight::roce::DirSysfs;

    #[test]
    fn a_healthy_pair_has_no_failure_and_detects_the_gid() {
        let (a, b) = pair();
        let d = decide_all(&seed(), &[healthy(0, &a), healthy(1, &b)]);
        assert!(
            d.results.iter().all(|r| r.verdict != Verdict::Fail),
            "{:#?}",
            d.results
        );
        let roce = d.detected[0].roce.as_ref().unwrap();
        assert_eq!(roce.gid_index, 3);
        assert_eq!(roce.devices, ["rocep1s0f1", "roceP2p1s0f1"]);
        assert_eq!(row(&d, Check::FabricMtu, "all").verdict, Verdict::Ok);
        assert!(d.detected.iter().all(|d| d.gpu));
        // Every warning and failure carries its own remedy.
        assert!(
            d.results
                .iter()
                .all(|r| (r.verdict == Verdict::Ok) == r.remedy.is_none()),
            "{:#?}",
            d.results
        );
    }

    #[test]
    fn peer_reachable_only_over_the_management_address_fails() {
        let (a, b) = pair();
        let mut h = healthy(0, &a);
        h.route = Some(Ok(
            "198.18.0.2 via 10.0.0.1 dev eno1 src 10.0.0.5 uid 1000 \\    cache ".into(),
        ));
        let d = decide_all(&seed(), &[h, healthy(1, &b)]);
        let r = row(&d, Check::FabricAddr, "head");
        assert_eq!(r.verdict, Verdict::Fail, "{r:?}");
        assert!(r.observed.contains("10.0.0.5 via eno1"), "{r:?}");
        assert!(remedy(r).contains("management"), "{r:?}");
    }

    #[test]
    fn mtu_mismatch_between_the_nodes_fails() {
        let (a, b) = pair();
        let mut w = healthy(1, &b);
        w.mtu = Some(Ok("1500".into()));
        let d = decide_all(&seed(), &[healthy(0, &a), w]);
        let r = row(&d, Check::FabricMtu, "all");
        assert_eq!(r.verdict, Verdict::Fail, "{r:?}");
        assert!(r.observed.contains("worker-1 enp1s0f1np1 1500"), "{r:?}");
        assert!(
            remedy(r).contains("on worker-1: `sudo ip link set enp1s0f1np1 mtu 9000`"),
            "{r:?}"
        );
    }

    #[test]
    fn a_gid_table_without_a_roce_v2_ipv4_entry_fails() {
        let a = tree(
            ip("198.18.0.1"),
            &[("rocep1s0f1", "enp1s0f1np1", "4: ACTIVE", false)],
        );
        let b = tree(ip("198.18.0.2"), &RAILS);
        let d = decide_all(&seed(), &[healthy(0, &a), healthy(1, &b)]);
        let r = row(&d, Check::FabricRoce, "head");
        assert_eq!(r.verdict, Verdict::Fail, "{r:?}");
        assert_eq!(
            r.observed,
            "RoCE device rocep1s0f1 has no RoCE v2 GID for 198.18.0.1"
        );
        assert!(remedy(r).contains("RoCE v1"), "{r:?}");
        assert!(d.detected[0].roce.is_none());
    }

    #[test]
    fn a_second_rail_down_fails_naming_it() {
        let a = tree(
            ip("198.18.0.1"),
            &[RAILS[0], ("roceP2p1s0f1", "enP2p1s0f1np1", "1: DOWN", true)],
        );
        let b = tree(ip("198.18.0.2"), &RAILS);
        let d = decide_all(&seed(), &[healthy(0, &a), healthy(1, &b)]);
        let r = row(&d, Check::FabricRoce, "head");
        assert_eq!(r.verdict, Verdict::Fail, "{r:?}");
        assert!(
            r.observed.contains("roceP2p1s0f1 port 1 is \"1: DOWN\""),
            "{r:?}"
        );
        assert!(remedy(r).contains("ibv_devinfo -d roceP2p1s0f1"), "{r:?}");
    }

    #[test]
    fn a_single_rail_warns_with_its_own_remedy() {
        let a = tree(ip("198.18.0.1"), &[RAILS[0]]);
        let b = tree(ip("198.18.0.2"), &RAILS);
        let mut h = healthy(0, &a);
        h.sysfs = Some(Ok(Box::new(DirSysfs::new(a.path()))));
        let d = decide_all(&seed(), &[h, healthy(1, &b)]);
        let warn = d
            .results
            .iter()
            .find(|r| r.check == Check::FabricRoce && r.verdict == Verdict::Warn)
            .unwrap_or_else(|| panic!("{:#?}", d.results));
        assert!(
            warn.observed.starts_with("only one RoCE device"),
            "{warn:?}"
        );
        assert!(remedy(warn).contains("second netdev"), "{warn:?}");
        assert!(!warn.observed.contains("remedy"), "{warn:?}");
    }
}
