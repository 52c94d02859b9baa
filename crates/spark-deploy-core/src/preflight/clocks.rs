//! GPU clock caps must be equal on every node: a rank on a slower clock paces the pair.

use super::report::{Check, CheckResult};
use super::smi::GpuClocks;

fn distinct<T: PartialEq + Copy>(vals: &[Option<T>]) -> bool {
    let known: Vec<T> = vals.iter().flatten().copied().collect();
    known.windows(2).any(|w| w[0] != w[1])
}

/// Compares the clock facts of every node (`(node, its GPUs)`, one GPU per Spark).
#[must_use]
pub fn compare(nodes: &[(String, Vec<GpuClocks>)]) -> Vec<CheckResult> {
    let mut out = Vec::new();
    let mut firsts = Vec::new();
    for (node, gpus) in nodes {
        match gpus.first() {
            None => out.push(CheckResult::fail(
                Check::GpuClocks,
                node,
                "no GPU in `nvidia-smi -q -d CLOCK`",
                "install the NVIDIA driver and check `nvidia-smi`",
            )),
            Some(g) => firsts.push((node.as_str(), g)),
        }
    }
    if firsts.len() != nodes.len() {
        return out;
    }
    let show = |v: Option<u32>| v.map_or_else(|| "unknown".to_owned(), |m| format!("{m} MHz"));
    let observed = firsts
        .iter()
        .map(|(n, g)| {
            let lock = g.locked_graphics.map_or_else(
                || "not reported".to_owned(),
                |(a, b)| format!("{a}-{b} MHz"),
            );
            format!(
                "{n}: max {} app {} lock {lock}",
                show(g.max_graphics),
                show(g.app_graphics)
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    // The cap every node can reach: the smallest known max graphics clock.
    let cap = firsts
        .iter()
        .filter_map(|(_, g)| g.locked_graphics.map(|l| l.1).or(g.max_graphics))
        .min();
    let lgc = cap.map_or_else(
        || "sudo nvidia-smi -lgc <MHz>,<MHz> on every node (the same value)".to_owned(),
        |c| format!("run `sudo nvidia-smi -lgc {c},{c}` on every node"),
    );
    let locks: Vec<Option<(u32, u32)>> = firsts.iter().map(|(_, g)| g.locked_graphics).collect();
    let maxes: Vec<Option<u32>> = firsts.iter().map(|(_, g)| g.max_graphics).collect();
    let apps: Vec<Option<u32>> = firsts.iter().map(|(_, g)| g.app_graphics).collect();
    let any_lock_reported = locks.iter().any(Option::is_some);
    if any_lock_reported && (locks.iter().any(Option::is_none) || distinct(&locks)) {
        out.push(CheckResult::fail(
            Check::GpuClocks,
            "all",
            observed,
            format!("locked clocks differ between nodes; {lgc}"),
        ));
    } else if distinct(&maxes) || distinct(&apps) {
        out.push(CheckResult::fail(
            Check::GpuClocks,
            "all",
            observed,
            format!("clock caps differ between nodes; {lgc}"),
        ));
    } else if !any_lock_reported {
        out.push(CheckResult::warn(Check::GpuClocks, "all", observed, format!("the driver reports no clock lock, so equal caps cannot be confirmed; to pin them, {lgc}")));
    } else {
        out.push(CheckResult::ok(Check::GpuClocks, "all", observed));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preflight::report::Verdict;
    use crate::preflight::smi::parse_clocks;

    const FIXTURE: &str =
        include_str!("../../../../tests/fixtures/host-facts/h200x2/nvidia-smi-q-clock.txt");

    fn gpu(max: Option<u32>, app: Option<u32>, lock: Option<(u32, u32)>) -> GpuClocks {
        GpuClocks {
            max_graphics: max,
            app_graphics: app,
            locked_graphics: lock,
            ..GpuClocks::default()
        }
    }

    #[test]
    fn equal_real_nodes_without_lock_warn_with_the_command() {
        let g = parse_clocks(FIXTURE);
        let r = compare(&[("head".into(), g.clone()), ("worker-1".into(), g)]);
        assert_eq!(r[0].verdict, Verdict::Warn);
        assert!(
            r[0].remedy
                .as_ref()
                .unwrap()
                .contains("nvidia-smi -lgc 1980,1980"),
            "{r:?}"
        );
    }

    #[test]
    fn mismatches_fail_and_unknown_is_not_zero() {
        let r = compare(&[
            ("a".into(), vec![gpu(Some(3003), None, Some((2200, 2200)))]),
            ("b".into(), vec![gpu(Some(3003), None, Some((2600, 2600)))]),
        ]);
        assert_eq!(r[0].verdict, Verdict::Fail);
        assert!(
            r[0].remedy.as_ref().unwrap().contains("-lgc 2200,2200"),
            "{r:?}"
        );
        let r = compare(&[
            ("a".into(), vec![gpu(None, None, None)]),
            ("b".into(), vec![gpu(Some(3003), None, None)]),
        ]);
        assert_eq!(
            r[0].verdict,
            Verdict::Warn,
            "unknown max is not a mismatch with a known one: {r:?}"
        );
        assert!(r[0].observed.contains("unknown"));
        let r = compare(&[
            (
                "a".into(),
                vec![gpu(Some(3003), Some(3003), Some((2200, 2200)))],
            ),
            (
                "b".into(),
                vec![gpu(Some(3003), Some(3003), Some((2200, 2200)))],
            ),
        ]);
        assert_eq!(r[0].verdict, Verdict::Ok);
        let r = compare(&[
            ("a".into(), vec![]),
            ("b".into(), vec![gpu(Some(3003), None, None)]),
        ]);
        assert_eq!(r[0].verdict, Verdict::Fail);
    }
}
