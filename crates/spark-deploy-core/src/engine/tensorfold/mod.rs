//! TensorFold's native Zig `dsv41` engine: the TP=2 branch (`tensorfold-dsv41`) and the TP=4
//! branch on two or four nodes (`tensorfold-dsv41-tp4`) (`docs/engine-contract.md`).

mod bias_fetch;
pub mod fingerprint;
mod identity;
pub mod inputs;
pub mod launch;
mod probes;
mod profile;
mod rank_inputs;
mod worker_inputs;

#[cfg(test)]
pub(crate) use profile::build_recipe;
pub use profile::{Branch, TensorfoldDsv41};
pub use rank_inputs::{RankInputs, RankOutput};

/// Rank 1's binary.
pub const FOLLOWER_BIN: &str = "/engine/tf-dsv41-lanes";
/// Rank 0's binary.
pub const SERVER_BIN: &str = "/engine/tensorfold-native";
/// The token map's file name inside the cache directory.
pub const TOKEN_MAP_FILE: &str = "dsv41_token_map.json";
