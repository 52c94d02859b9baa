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
    /// Largest `--parallel` the kernel kit covers.
    pub max_parallel: u32,
    /// Accepted tensor-parallel world sizes (= node counts).
    pub world_sizes: &'static [usize],
    /// Pools above this leave too little memory headroom on a 128 GB node; warn.
    pub memory_warn_context: u64,
}

impl EngineLimits {
    /// The limits of `profile`.
    #[must_use]
    pub fn of(profile: EngineProfileName) -> Self {
        match profile {
            EngineProfileName::TensorfoldDsv41 => TENSORFOLD_DSV41,
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
    world_sizes: &[2],
    memory_warn_context: 524_288,
};
