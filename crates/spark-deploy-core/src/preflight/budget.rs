//! The memory budget of one rank (ENGINE-CONTRACT.md §13): weights + device arena + KV cache +
//! RoPE tables for the shared pool, plus a reserve, against a node's `MemAvailable`.

use serde::Serialize;

const GIB: u64 = 1 << 30;

/// Bytes one rank needs at `pool` positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RankBudget {
    /// The rank weight file's bytes (ENGINE-CONTRACT.md §13.4; the server counts the file size, §13.6).
    pub weights: u64,
    /// Device arena: `2 + ceil(7 · pool / 2^19)` GiB (ENGINE-CONTRACT.md §13.2 `defaultArenaGib`).
    pub arena: u64,
    /// KV cache, replicated on every rank: ~890 B per position of the pool that all PARALLEL
    /// streams share (ENGINE-CONTRACT.md §13.3, §13.1).
    pub kv: u64,
    /// RoPE tables on the device: `4 × (pool + 49) × 128` B (ENGINE-CONTRACT.md §13.3).
    pub rope: u64,
    /// Headroom kept free (see `decide::RESERVE_BYTES`, ENGINE-CONTRACT.md §13.5–§13.7).
    pub reserve: u64,
}

impl RankBudget {
    /// The budget for `weights` bytes of rank file at `pool` positions with `reserve` bytes free.
    #[must_use]
    pub fn new(weights: u64, pool: u64, reserve: u64) -> Self {
        Self {
            weights,
            arena: (2 + (7 * pool).div_ceil(1 << 19)) * GIB,
            kv: 890 * pool,
            rope: 4 * (pool + 49) * 128,
            reserve,
        }
    }

    /// Everything together.
    #[must_use]
    pub fn total(&self) -> u64 {
        self.weights + self.arena + self.kv + self.rope + self.reserve
    }
}

/// The largest pool (a multiple of 2048, at most `max_pool`) whose budget fits `available`, if any.
#[must_use]
pub fn largest_pool(weights: u64, reserve: u64, available: u64, max_pool: u64) -> Option<u64> {
    let fits = |p: u64| RankBudget::new(weights, p, reserve).total() <= available;
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

    #[test]
    fn matches_the_contract_table() {
        assert_eq!(RankBudget::new(0, 262_144, 0).arena, 6 * GIB);
        assert_eq!(RankBudget::new(0, 524_288, 0).arena, 9 * GIB);
        assert_eq!(RankBudget::new(0, 1_048_576, 0).arena, 16 * GIB);
        // ~512 MiB of RoPE at a 1M pool.
        assert_eq!(RankBudget::new(0, 1_048_576, 0).rope / (1 << 20), 512);
    }

    #[test]
    fn largest_pool_is_the_boundary() {
        let weights = 106_000_000_000;
        let avail = 116 * GIB;
        let p = largest_pool(weights, 2 * GIB, avail, 1_114_063).unwrap();
        assert!(RankBudget::new(weights, p, 2 * GIB).total() <= avail);
        assert!(RankBudget::new(weights, p + 2048, 2 * GIB).total() > avail);
        assert!(p < 1_048_576 && p > 524_288, "{p}");
        assert_eq!(largest_pool(weights, 0, 90 * GIB, 1_114_063), None);
    }
}
