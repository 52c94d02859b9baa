//! The memory model of one rank of the TP=2 engine: rank weights + device arena + KV cache + RoPE
//! tables for the shared pool, plus a reserve, compared with a node's `MemAvailable`.
//!
//! The inputs are a [`MemoryInputs`]; the arithmetic is [`RankBudget::of`] and
//! [`largest_pool`]. Nothing here knows where the weight bytes came from: preflight measures them
//! (see `steps::preflight`) and passes them in.

use serde::Serialize;

const GIB: u64 = 1 << 30;

/// Rank weight bytes of the checkpoint the engine profile was made for, when nothing on disk
/// tells yet: its rank file is about 106 GB (98.7 GiB; the weights alone are about 97 GiB by
/// design and "~99 GiB a rank" in practice). The engine's own host-memory guard counts the rank
/// file's size, which is why the file size and not the design figure is used.
pub const RANK_WEIGHT_BYTES: u64 = 106_000_000_000;

/// The engine profile's rank weight bytes for `model_id`: [`RANK_WEIGHT_BYTES`] for the
/// checkpoint it was made for (the default `model.id`), nothing for any other model.
#[must_use]
pub fn profile_estimate(model_id: &str) -> Option<u64> {
    (model_id == crate::config::schema::ModelSection::default().id).then_some(RANK_WEIGHT_BYTES)
}

/// Memory kept free on top of weights, arena, KV and RoPE: 4 GiB.
///
/// Why 4 GiB: the engine's CUDA budget keeps at least 4 GiB (its reserve setting cannot go below
/// 2), operators of this engine hold a 4 GiB hard `MemAvailable` floor while serving, and 5 GiB was
/// measured left on the head at `--context 1048576 --parallel 4`. It also covers what the formula
/// leaves out (SWA and DSpark rings, rank 1's frame buffer). With it the seed config (CONTEXT
/// 1,048,576, ~99 GiB a rank) needs 98.7 + 16 + 0.9 + 0.5 + 4 = 120.1 GiB: it fits 125 GiB
/// available, does not fit 110 GiB (where the largest pool that fits is 299,008), and on 100 GiB
/// not even the smallest pool fits (98.7 + 3 + 4 > 100).
pub const RESERVE_BYTES: u64 = 4 * GIB;

/// What the memory model needs. `parallel` is not among them: the streams share one pool of
/// `context` positions and allocate nothing of their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MemoryInputs {
    /// Bytes of the rank's weight file.
    pub weights_per_rank: u64,
    /// The shared pool (`serving.context`).
    pub context: u64,
    /// Bytes kept free on top.
    pub reserve: u64,
}

/// Bytes one rank needs, by term.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RankBudget {
    /// The rank weight file's bytes (the engine counts the file's size).
    pub weights: u64,
    /// Device arena: `2 + ceil(7 · pool / 2^19)` GiB (the engine's default arena for a pool).
    pub arena: u64,
    /// KV cache, replicated on every rank: ~890 B per position of the pool that all streams
    /// share.
    pub kv: u64,
    /// RoPE tables on the device: `4 × (pool + 49) × 128` B.
    pub rope: u64,
    /// Headroom kept free ([`RESERVE_BYTES`]).
    pub reserve: u64,
}

impl RankBudget {
    /// The budget of `inputs`.
    #[must_use]
    pub fn of(inputs: &MemoryInputs) -> Self {
        let pool = inputs.context;
        Self {
            weights: inputs.weights_per_rank,
            arena: (2 + (7 * pool).div_ceil(1 << 19)) * GIB,
            kv: 890 * pool,
            rope: 4 * (pool + 49) * 128,
            reserve: inputs.reserve,
        }
    }

    /// Everything together.
    #[must_use]
    pub fn total(&self) -> u64 {
        self.weights + self.arena + self.kv + self.rope + self.reserve
    }
}

/// The largest pool (a multiple of 2048, at most `max_pool`) whose budget with the weights and
/// reserve of `inputs` fits `available`, if any (`inputs.context` is ignored).
#[must_use]
pub fn largest_pool(inputs: &MemoryInputs, available: u64, max_pool: u64) -> Option<u64> {
    let fits = |p: u64| {
        RankBudget::of(&MemoryInputs {
            context: p,
            ..*inputs
        })
        .total()
            <= available
    };
    let (mut lo, mut hi) = (1u64, max_pool / 2048);
    if !fits(2048) {
        return None;
    }
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if fits(mid * 2048) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    Some(lo * 2048)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(weights: u64, context: u64, reserve: u64) -> RankBudget {
        RankBudget::of(&MemoryInputs {
            weights_per_rank: weights,
            context,
            reserve,
        })
    }

    #[test]
    fn matches_the_engines_arena_table() {
        assert_eq!(at(0, 262_144, 0).arena, 6 * GIB);
        assert_eq!(at(0, 524_288, 0).arena, 9 * GIB);
        assert_eq!(at(0, 1_048_576, 0).arena, 16 * GIB);
        // ~512 MiB of RoPE at a 1M pool.
        assert_eq!(at(0, 1_048_576, 0).rope / (1 << 20), 512);
    }

    #[test]
    fn only_the_profiles_own_model_has_an_estimate() {
        let seed = crate::config::schema::ModelSection::default().id;
        assert_eq!(profile_estimate(&seed), Some(RANK_WEIGHT_BYTES));
        assert_eq!(profile_estimate("testbed/dsv41-exl3"), None);
    }

    #[test]
    fn largest_pool_is_the_boundary() {
        let weights = 106_000_000_000;
        let avail = 116 * GIB;
        let inputs = MemoryInputs {
            weights_per_rank: weights,
            context: 0,
            reserve: 2 * GIB,
        };
        let p = largest_pool(&inputs, avail, 1_114_063).unwrap();
        assert!(at(weights, p, 2 * GIB).total() <= avail);
        assert!(at(weights, p + 2048, 2 * GIB).total() > avail);
        assert!(p < 1_048_576 && p > 524_288, "{p}");
        let none = MemoryInputs {
            reserve: 0,
            ..inputs
        };
        assert_eq!(largest_pool(&none, 90 * GIB, 1_114_063), None);
    }
}
