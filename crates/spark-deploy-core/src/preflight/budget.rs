//! The memory model of one rank of the TP=2 engine: rank weights + device arena + KV cache + RoPE
//! tables for the shared pool, plus a reserve, compared with a node's `MemAvailable`.
//!
//! The inputs are a [`MemoryInputs`]; the arithmetic is [`RankBudget::of`] and
//! [`largest_pool`]. Nothing here knows where the weight bytes came from: preflight measures them
//! (see `steps::preflight`) and passes them in.

use serde::Serialize;

pub use crate::engine::limits::MemoryModel;

const GIB: u64 = 1 << 30;

/// The profile's rank weight bytes for `model_id`: the estimate of `model` for the checkpoint the
/// profile was made for, nothing for any other model.
#[must_use]
pub fn profile_estimate(model_id: &str, model: &MemoryModel) -> Option<u64> {
    (model_id == model.estimate_for_model).then_some(model.rank_weights_estimate)
}

/// What the memory model needs. `parallel` is not among them: the streams share one pool of
/// `context` positions and allocate nothing of their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MemoryInputs {
    /// Bytes of the rank's weight file.
    pub weights_per_rank: u64,
    /// The shared pool (`serving.context`).
    pub context: u64,
    /// The engine's memory model (arena, KV, RoPE, reserve).
    pub model: MemoryModel,
}

/// Bytes one rank needs, by term.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RankBudget {
    /// The rank weight file's bytes (the engine counts the file's size).
    pub weights: u64,
    /// Device arena (the engine's default arena for a pool).
    pub arena: u64,
    /// KV cache, replicated on every rank, for the pool all streams share.
    pub kv: u64,
    /// RoPE tables on the device.
    pub rope: u64,
    /// Headroom kept free.
    pub reserve: u64,
}

impl RankBudget {
    /// The budget of `inputs`.
    #[must_use]
    pub fn of(inputs: &MemoryInputs) -> Self {
        let (pool, m) = (inputs.context, &inputs.model);
        Self {
            weights: inputs.weights_per_rank,
            arena: (m.arena_base_gib + (m.arena_gib_per_step * pool).div_ceil(1 << 19)) * GIB,
            kv: m.kv_bytes_per_position * pool,
            rope: m.rope_bytes_per_row * (pool + m.rope_extra_rows),
            reserve: m.reserve,
        }
    }

    /// Everything together.
    #[must_use]
    pub fn total(&self) -> u64 {
        // The weights are a file size read from the node: a sum past 2^64 saturates (and fails
        // every budget) instead of wrapping.
        [self.arena, self.kv, self.rope, self.reserve]
            .into_iter()
            .fold(self.weights, u64::saturating_add)
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

    const MODEL: MemoryModel = crate::engine::limits::TENSORFOLD_DSV41.memory;

    fn with_reserve(reserve: u64) -> MemoryModel {
        MemoryModel { reserve, ..MODEL }
    }

    fn at(weights: u64, context: u64, reserve: u64) -> RankBudget {
        RankBudget::of(&MemoryInputs {
            weights_per_rank: weights,
            context,
            model: with_reserve(reserve),
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
        assert_eq!(
            profile_estimate(&seed, &MODEL),
            Some(MODEL.rank_weights_estimate)
        );
        assert_eq!(profile_estimate("testbed/dsv41-exl3", &MODEL), None);
    }

    #[test]
    fn largest_pool_is_the_boundary() {
        let weights = 106_000_000_000;
        let avail = 116 * GIB;
        let inputs = MemoryInputs {
            weights_per_rank: weights,
            context: 0,
            model: with_reserve(2 * GIB),
        };
        let p = largest_pool(&inputs, avail, 1_114_063).unwrap();
        assert!(at(weights, p, 2 * GIB).total() <= avail);
        assert!(at(weights, p + 2048, 2 * GIB).total() > avail);
        assert!(p < 1_048_576 && p > 524_288, "{p}");
        let none = MemoryInputs {
            model: with_reserve(0),
            ..inputs
        };
        assert_eq!(largest_pool(&none, 90 * GIB, 1_114_063), None);
    }
}
