//! TensorFold's native Zig `dsv41` engine at TP=2 (`docs/engine-contract.md`).

mod bias_fetch;
pub mod fingerprint;
mod identity;
pub mod inputs;
pub mod launch;
mod probes;
mod profile;
mod rank_inputs;
mod worker_inputs;

pub use profile::TensorfoldDsv41;
#[cfg(test)]
pub(crate) use profile::build_recipe;
pub use rank_inputs::{RankInputs, RankOutput};

use super::EngineLimits;

/// The profile's limits.
pub const LIMITS: EngineLimits = crate::engine::limits::TENSORFOLD_DSV41;

/// Rank 1's binary.
pub const FOLLOWER_BIN: &str = "/engine/tf-dsv41-lanes";
/// Rank 0's binary.
pub const SERVER_BIN: &str = "/engine/tensorfold-native";
/// The token map's file name inside the cache directory.
pub const TOKEN_MAP_FILE: &str = "dsv41_token_map.json";
