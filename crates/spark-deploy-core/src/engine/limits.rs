//! What an engine accepts, as data: validation refuses the rest before anything runs. Kept apart
//! from the profiles so configuration validation (a lower layer) can use it.

use crate::config::EngineProfileName;

/// What an engine accepts; validation refuses the rest before anything runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineLimits {
    /// Smallest pool (`--context`) worth serving: one 2048-position extent.
    pub min_pool: u64,
    /// Largest pool the RoPE tables cover.
    pub max_pool: u64,
    /// Largest `--parallel` the kernel kit covers (also the largest `TF_DS_STREAMS`).
    pub max_parallel: u32,
    /// Largest rows per round (`TF_DS_ROUND_ROWS`) the kernel kit covers; the engine's default
    /// is 16.
    pub max_round_rows: u32,
    /// Whether the build is the TP=4 branch: it reads `TF_DS_WINDOW` and its followers take
    /// `--round-rows/--streams/--context`.
    pub tp4_branch: bool,
    /// Accepted tensor-parallel world sizes (= node counts).
    pub world_sizes: &'static [usize],
    /// Pools above this leave too little memory headroom on a 128 GB node; warn.
    pub memory_warn_context: u64,
    /// What one rank needs in memory, for preflight's budget.
    pub memory: MemoryModel,
}

/// The memory one rank of an engine needs, as the engine declares it: weights, a device arena,
/// KV cache and RoPE tables that grow with the shared pool, and a reserve kept free. Preflight's
/// budget does the arithmetic ([`crate::preflight::budget`]); the numbers are the engine's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct MemoryModel {
    /// Rank weight bytes of the checkpoint the profile was made for, used only for that model
    /// and only while nothing on disk tells.
    pub rank_weights_estimate: u64,
    /// The model id that estimate is for.
    pub estimate_for_model: &'static str,
    /// Device arena: `arena_base_gib + ceil(arena_gib_per_step · pool / 2^19)` GiB.
    pub arena_base_gib: u64,
    /// See [`MemoryModel::arena_base_gib`].
    pub arena_gib_per_step: u64,
    /// KV cache bytes per position of the shared pool (replicated on every rank).
    pub kv_bytes_per_position: u64,
    /// RoPE table bytes per row; the tables hold `pool + rope_extra_rows` rows.
    pub rope_bytes_per_row: u64,
    /// See [`MemoryModel::rope_bytes_per_row`].
    pub rope_extra_rows: u64,
    /// Bytes kept free on top of everything the formula counts.
    pub reserve: u64,
}

impl EngineLimits {
    /// The limits of `profile` serving `world` ranks (the memory estimate is per rank, so it
    /// depends on how many share the weights).
    #[must_use]
    pub fn of(profile: EngineProfileName, world: usize) -> Self {
        match profile {
            EngineProfileName::TensorfoldDsv41 => TENSORFOLD_DSV41,
            EngineProfileName::TensorfoldDsv41Tp4 if world == 4 => TENSORFOLD_DSV41_TP4,
            EngineProfileName::TensorfoldDsv41Tp4 => EngineLimits {
                memory: TENSORFOLD_DSV41.memory,
                ..TENSORFOLD_DSV41_TP4
            },
        }
    }
}

/// TensorFold dsv41 at TP=2: pools from one 2048-position extent up to what the RoPE tables
/// cover, at most 4 streams with the TP=2 kernel kit, and too little headroom on a 128 GB node
/// above a 524,288-position pool.
pub const TENSORFOLD_DSV41: EngineLimits = EngineLimits {
    min_pool: 2048,
    max_pool: 1_114_063,
    max_parallel: 4,
    max_round_rows: 16,
    tp4_branch: false,
    world_sizes: &[2],
    memory_warn_context: 524_288,
    memory: MemoryModel {
        // A rank file is about 106 GB (98.7 GiB; the weights alone are ~97 GiB by design and
        // "~99 GiB a rank" in practice); the engine's host-memory guard counts the file's size.
        rank_weights_estimate: 106_000_000_000,
        estimate_for_model: "Mia-AiLab/DeepSeek-V4.1-Flash-1017-EXL3-EAQ-v1-2.9-bpw",
        // The engine's default arena for a pool: 6 GiB at 256K, 9 at 512K, 16 at 1M.
        arena_base_gib: 2,
        arena_gib_per_step: 7,
        kv_bytes_per_position: 890,
        // fp32 cos/sin of 64 rope dims: 4 × 128 B per row, pool + 49 rows.
        rope_bytes_per_row: 512,
        rope_extra_rows: 49,
        // 4 GiB: the engine's CUDA budget keeps at least that, operators of this engine hold a
        // 4 GiB MemAvailable floor while serving, and 5 GiB was measured left on the head at a
        // 1M pool with 4 streams; it also covers the rings and frame buffers the formula leaves
        // out.
        reserve: 4 << 30,
    },
};

/// TensorFold dsv41 from the TP=4 branch on four nodes: two or four ranks, up to 16 streams and
/// 48-row rounds (the TP=4 kit's recorded variants), and a quarter of the weights per rank (a rank
/// file of about 56.2 GB per node at W=4).
pub const TENSORFOLD_DSV41_TP4: EngineLimits = EngineLimits {
    max_parallel: 16,
    max_round_rows: 48,
    tp4_branch: true,
    world_sizes: &[2, 4],
    memory: MemoryModel {
        rank_weights_estimate: 56_200_000_000,
        ..TENSORFOLD_DSV41.memory
    },
    ..TENSORFOLD_DSV41
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tp4_profile_takes_two_or_four_nodes_and_splits_its_weights_by_the_world() {
        let four = EngineLimits::of(EngineProfileName::TensorfoldDsv41Tp4, 4);
        let two = EngineLimits::of(EngineProfileName::TensorfoldDsv41Tp4, 2);
        assert_eq!(four.world_sizes, &[2, 4]);
        assert!(four.tp4_branch && two.tp4_branch);
        assert!(four.memory.rank_weights_estimate < two.memory.rank_weights_estimate);
        assert_eq!(
            EngineLimits::of(EngineProfileName::TensorfoldDsv41, 4).world_sizes,
            &[2]
        );
    }
}
