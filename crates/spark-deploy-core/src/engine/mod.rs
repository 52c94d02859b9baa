//! Engine profiles: everything engine-specific (argv/env of each rank, per-rank inputs, limits,
//! readiness) lives behind a profile, so a second engine is a new module, not an edit of every step.

pub mod image_context;
pub mod tensorfold;

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
            EngineProfileName::TensorfoldDsv41 => tensorfold::LIMITS,
        }
    }
}
