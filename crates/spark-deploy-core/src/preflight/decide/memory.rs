//! Memory: `MemAvailable` against the configured floor, and the rank's budget (the engine's
//! memory model, `preflight::budget`) against `MemAvailable`.

use super::{NodeFacts, RankWeights, Settings, gib};
use crate::preflight::budget::{self, MemoryInputs, RankBudget};
use crate::preflight::meminfo;
use crate::preflight::report::{Check, CheckResult};

/// The memory budget row of one node: the arithmetic in the observed text; on failure the
/// largest CONTEXT that fits there, or that none does.
#[must_use]
pub fn memory_budget(
    settings: &Settings,
    node: &str,
    weights: RankWeights,
    available: u64,
) -> CheckResult {
    let inputs = MemoryInputs {
        weights_per_rank: weights.bytes,
        context: settings.context,
        model: settings.memory,
    };
    let b = RankBudget::of(&inputs);
    let observed = format!(
        "weights {} ({}) + arena {} + KV {} + RoPE {} + reserve {} = {} GiB vs MemAvailable {} GiB (CONTEXT {})",
        gib(b.weights),
        weights.source.describe(),
        gib(b.arena),
        gib(b.kv),
        gib(b.rope),
        gib(b.reserve),
        gib(b.total()),
        gib(available),
        settings.context
    );
    if b.total() <= available {
        return CheckResult::ok(Check::MemoryBudget, node, observed);
    }
    let remedy = budget::largest_pool(&inputs, available, settings.max_pool).map_or_else(
        || {
            format!(
                "no CONTEXT fits: even the smallest pool (2048) needs more than {} GiB; free memory on this node (stop other GPU work, `sync; echo 3 | sudo tee /proc/sys/vm/drop_caches`)",
                gib(available)
            )
        },
        |p| {
            let fit = RankBudget::of(&MemoryInputs {
                context: p,
                ..inputs
            });
            format!(
                "set CONTEXT ≤ {p}, the largest pool that fits here ({} GiB), or free memory",
                gib(fit.total())
            )
        },
    );
    CheckResult::fail(Check::MemoryBudget, node, observed, remedy)
}

/// `serving.context = 0`: the largest pool (a multiple of 2048, at most the engine's largest)
/// whose budget fits `MemAvailable` on every node, and its row. `None` when a node's weights or
/// memory are unknown, when no pool fits some node, or when the largest that fits cannot hold one
/// reply of `serving.max_tokens`.
#[must_use]
pub fn largest_context(s: &Settings, facts: &[NodeFacts]) -> (CheckResult, Option<u64>) {
    let fail = |observed: String, remedy: String| {
        (
            CheckResult::fail(Check::MemoryContext, "all", observed, remedy),
            None,
        )
    };
    let mut per_node = Vec::new();
    for f in facts {
        let n = f.name.as_str();
        let Some(avail) = f
            .meminfo
            .as_ref()
            .ok()
            .and_then(|m| meminfo::mem_available(m))
        else {
            return fail(
                format!("context 0: MemAvailable of {n} unknown"),
                format!("make /proc/meminfo readable on {n} (see its rows), or set CONTEXT"),
            );
        };
        let Some(w) = f.rank_weights else {
            return fail(
                format!("context 0: the rank weight bytes of {n} are unknown"),
                "run `spark-deploy fetch` (or make the Hub reachable) so preflight knows the weights, or set CONTEXT".to_owned(),
            );
        };
        let inputs = MemoryInputs {
            weights_per_rank: w.bytes,
            context: 0,
            model: s.memory,
        };
        let Some(p) = budget::largest_pool(&inputs, avail, s.max_pool) else {
            return fail(
                format!(
                    "context 0: no pool fits {n} (MemAvailable {} GiB, weights {} GiB)",
                    gib(avail),
                    gib(w.bytes)
                ),
                format!(
                    "free memory on {n} (stop other GPU work, `sync; echo 3 | sudo tee /proc/sys/vm/drop_caches`)"
                ),
            );
        };
        per_node.push((n, p, avail));
    }
    let Some(&(_, fits, _)) = per_node.iter().min_by_key(|(_, p, _)| *p) else {
        return fail("context 0: no node".into(), "configure nodes".into());
    };
    let shown = per_node
        .iter()
        .map(|(n, p, a)| format!("{n} {p} of MemAvailable {} GiB", gib(*a)))
        .collect::<Vec<_>>()
        .join(", ");
    let extent = (s.max_tokens + 18).div_ceil(2048) * 2048;
    if fits < extent {
        return fail(
            format!(
                "context 0 → {fits} tokens (largest that fits: {shown}), below one reply's extent {extent}"
            ),
            format!(
                "lower serving.max_tokens to at most {} or free memory",
                fits.saturating_sub(18)
            ),
        );
    }
    (
        CheckResult::ok(
            Check::MemoryContext,
            "all",
            format!("context 0 → {fits} tokens (largest that fits: {shown})"),
        ),
        Some(fits),
    )
}

pub(super) fn decide(s: &Settings, f: &NodeFacts, out: &mut Vec<CheckResult>) {
    let n = f.name.as_str();
    let minimum = u64::from(s.min_avail_gib) << 30;
    let avail = match &f.meminfo {
        Ok(m) => meminfo::mem_available(m),
        Err(e) => {
            out.push(CheckResult::fail(
                Check::MemoryAvailable,
                n,
                e.clone(),
                format!("/proc/meminfo must be readable on {n} by the SSH user"),
            ));
            return;
        }
    };
    let Some(avail) = avail else {
        out.push(CheckResult::fail(
            Check::MemoryAvailable,
            n,
            "no readable MemAvailable in /proc/meminfo (missing, or not a count of kB below 2^64 bytes)",
            format!(
                "check /proc/meminfo on {n}: it needs a `MemAvailable: <n> kB` line (Linux ≥ 3.14)"
            ),
        ));
        return;
    };
    let shown = format!(
        "MemAvailable {} GiB (floor {} GiB)",
        gib(avail),
        s.min_avail_gib
    );
    out.push(if avail >= minimum {
        CheckResult::ok(Check::MemoryAvailable, n, shown)
    } else {
        CheckResult::fail(
            Check::MemoryAvailable,
            n,
            shown,
            format!(
                "free memory to reach {} GiB: stop other GPU work, `sync; echo 3 | sudo tee /proc/sys/vm/drop_caches`, wait for the page cache to drop",
                s.min_avail_gib
            ),
        )
    });
    if s.context == 0 {
        // CONTEXT 0 and no pool fits: the `memory.context` row says why.
        return;
    }
    out.push(match f.rank_weights {
        Some(w) => memory_budget(s, n, w, avail),
        None => CheckResult::warn(
            Check::MemoryBudget,
            n,
            "the rank's weight bytes are unknown: no rank file, no cached checkpoint index, and the Hub did not list the checkpoint",
            "run `spark-deploy fetch` (or make the Hub reachable), then `spark-deploy preflight` again to check the budget",
        ),
    });
}

#[cfg(test)]
mod tests {
    use super::super::WeightsSource;
    use super::super::testing::{GIB, healthy, pair, remedy, row, seed};
    use super::*;
    const RANK_WEIGHT_BYTES: u64 = crate::engine::limits::TENSORFOLD_DSV41
        .memory
        .rank_weights_estimate;
    use crate::preflight::decide::decide as decide_all;
    use crate::preflight::report::Verdict;

    fn rank_file(bytes: u64) -> RankWeights {
        RankWeights {
            bytes,
            source: WeightsSource::RankFile,
        }
    }

    #[test]
    fn seed_budget_passes_on_125_gib() {
        let r = memory_budget(&seed(), "n", rank_file(RANK_WEIGHT_BYTES), 125 * GIB);
        assert_eq!(r.verdict, Verdict::Ok, "{r:?}");
        assert_eq!(
            r.observed,
            "weights 98.7 (rank file) + arena 16.0 + KV 0.9 + RoPE 0.5 + reserve 4.0 = 120.1 GiB vs MemAvailable 125.0 GiB (CONTEXT 1048576)"
        );
    }

    #[test]
    fn seed_budget_fails_on_110_gib_naming_the_largest_context() {
        let r = memory_budget(&seed(), "n", rank_file(RANK_WEIGHT_BYTES), 110 * GIB);
        assert_eq!(r.verdict, Verdict::Fail, "{r:?}");
        assert!(
            r.observed.contains("= 120.1 GiB vs MemAvailable 110.0 GiB"),
            "{r:?}"
        );
        let inputs = MemoryInputs {
            weights_per_rank: RANK_WEIGHT_BYTES,
            context: 0,
            model: crate::engine::limits::TENSORFOLD_DSV41.memory,
        };
        let p = budget::largest_pool(&inputs, 110 * GIB, 1_114_063).unwrap();
        assert_eq!(p, 299_008, "arena 6 GiB is the last step that fits 7.3 GiB");
        assert!(remedy(&r).contains(&format!("set CONTEXT ≤ {p},")), "{r:?}");
        let over = RankBudget::of(&MemoryInputs {
            context: p + 2048,
            ..inputs
        });
        assert!(over.total() > 110 * GIB, "{p} is the boundary");
    }

    #[test]
    fn seed_budget_on_100_gib_says_no_context_fits() {
        let r = memory_budget(&seed(), "n", rank_file(RANK_WEIGHT_BYTES), 100 * GIB);
        assert_eq!(r.verdict, Verdict::Fail, "{r:?}");
        assert!(remedy(&r).starts_with("no CONTEXT fits"), "{r:?}");
    }

    #[test]
    fn the_budget_uses_each_nodes_measured_weights() {
        // A small checkpoint fits where the seed's would not: the weights come from the inputs,
        // not from a constant.
        let (a, b) = pair();
        let mut h = healthy(0, &a);
        h.meminfo = Ok(format!("MemAvailable: {} kB\n", 12 * 1024 * 1024));
        h.rank_weights = Some(RankWeights {
            bytes: 300 << 20,
            source: WeightsSource::Checkpoint,
        });
        let s = Settings {
            context: 4096,
            min_avail_gib: 1,
            ..seed()
        };
        let d = decide_all(&s, &[h, healthy(1, &b)]);
        let r = row(&d, Check::MemoryBudget, "head");
        assert_eq!(r.verdict, Verdict::Ok, "{r:?}");
        assert!(
            r.observed
                .starts_with("weights 0.3 (cached checkpoint / ranks) + arena 3.0"),
            "{r:?}"
        );
        // The same node with the seed's rank file does not fit.
        let mut h = healthy(0, &a);
        h.meminfo = Ok(format!("MemAvailable: {} kB\n", 12 * 1024 * 1024));
        let d = decide_all(&s, &[h, healthy(1, &b)]);
        assert_eq!(row(&d, Check::MemoryBudget, "head").verdict, Verdict::Fail);
        // Unknown weights: a warning that says how to get them, not a pass.
        let mut h = healthy(0, &a);
        h.rank_weights = None;
        let d = decide_all(&seed(), &[h, healthy(1, &b)]);
        let r = row(&d, Check::MemoryBudget, "head");
        assert_eq!(r.verdict, Verdict::Warn, "{r:?}");
        assert!(remedy(r).contains("spark-deploy fetch"), "{r:?}");
    }

    #[test]
    fn context_0_is_the_largest_pool_that_fits_every_node() {
        let (a, b) = pair();
        let mut w = healthy(1, &b);
        w.meminfo = Ok(format!("MemAvailable: {} kB\n", 110 * 1024 * 1024));
        let s = Settings {
            context: 0,
            ..seed()
        };
        let d = decide_all(&s, &[healthy(0, &a), w]);
        // The worker's 110 GiB bounds it (299,008, as the budget's boundary test shows); the
        // head alone would take more.
        assert_eq!(d.context, Some(299_008));
        let r = row(&d, Check::MemoryContext, "all");
        assert_eq!(r.verdict, Verdict::Ok, "{r:?}");
        assert!(
            r.observed
                .starts_with("context 0 → 299008 tokens (largest that fits: head "),
            "{r:?}"
        );
        assert!(
            r.observed
                .ends_with("worker-1 299008 of MemAvailable 110.0 GiB)"),
            "{r:?}"
        );
        // Every node's budget row is decided at that pool, and passes.
        for n in ["head", "worker-1"] {
            let b = row(&d, Check::MemoryBudget, n);
            assert_eq!(b.verdict, Verdict::Ok, "{b:?}");
            assert!(b.observed.ends_with("(CONTEXT 299008)"), "{b:?}");
        }
        // One step more does not fit the worker.
        let over = RankBudget::of(&MemoryInputs {
            weights_per_rank: RANK_WEIGHT_BYTES,
            context: 299_008 + 2048,
            model: s.memory,
        });
        assert!(over.total() > 110 * GIB);
        // A configured CONTEXT computes nothing.
        let d = decide_all(&seed(), &[healthy(0, &a), healthy(1, &b)]);
        assert_eq!(d.context, None);
        assert!(!d.results.iter().any(|r| r.check == Check::MemoryContext));
    }

    #[test]
    fn context_0_fails_when_nothing_fits_or_the_weights_are_unknown() {
        let (a, b) = pair();
        let s = Settings {
            context: 0,
            ..seed()
        };
        let mut w = healthy(1, &b);
        w.meminfo = Ok(format!("MemAvailable: {} kB\n", 100 * 1024 * 1024));
        let d = decide_all(&s, &[healthy(0, &a), w]);
        assert_eq!(d.context, None);
        let r = row(&d, Check::MemoryContext, "all");
        assert_eq!(r.verdict, Verdict::Fail, "{r:?}");
        assert!(r.observed.contains("no pool fits worker-1"), "{r:?}");
        assert!(remedy(r).contains("free memory on worker-1"), "{r:?}");
        assert!(!d.results.iter().any(|r| r.check == Check::MemoryBudget));
        let mut h = healthy(0, &a);
        h.rank_weights = None;
        let d = decide_all(&s, &[h, healthy(1, &b)]);
        let r = row(&d, Check::MemoryContext, "all");
        assert_eq!(r.verdict, Verdict::Fail);
        assert!(remedy(r).contains("spark-deploy fetch"), "{r:?}");
        // The largest that fits must still hold one reply.
        let long = Settings {
            max_tokens: 400_000,
            ..s
        };
        let mut w = healthy(1, &b);
        w.meminfo = Ok(format!("MemAvailable: {} kB\n", 110 * 1024 * 1024));
        let d = decide_all(&long, &[healthy(0, &a), w]);
        let r = row(&d, Check::MemoryContext, "all");
        assert_eq!(r.verdict, Verdict::Fail);
        assert!(
            remedy(r).contains("lower serving.max_tokens to at most 298990"),
            "{r:?}"
        );
    }

    #[test]
    fn mem_available_below_the_floor_fails() {
        let (a, b) = pair();
        let s = Settings {
            min_avail_gib: 200, // above the machine's memory
            ..seed()
        };
        let d = decide_all(&s, &[healthy(0, &a), healthy(1, &b)]);
        let r = row(&d, Check::MemoryAvailable, "worker-1");
        assert_eq!(r.verdict, Verdict::Fail);
        assert!(r.observed.contains("MemAvailable 125.0 GiB"), "{r:?}");
        assert!(remedy(r).contains("drop_caches"), "{r:?}");
    }
}
