//! TensorFold's native Zig `dsv41` engine at TP=2 (ENGINE-CONTRACT.md).

pub mod fingerprint;
pub mod inputs;
pub mod launch;

use super::EngineLimits;

/// ENGINE-CONTRACT.md §2.5, §2.11, §7, §8.5, §13.5.
pub const LIMITS: EngineLimits = EngineLimits {
    min_pool: 2048,
    max_pool: 1_114_063,
    max_parallel: 4,
    world_sizes: &[2],
    memory_warn_context: 524_288,
};

/// Rank 1's binary.
pub const FOLLOWER_BIN: &str = "/engine/tf-dsv41-lanes";
/// Rank 0's binary.
pub const SERVER_BIN: &str = "/engine/tensorfold-native";
/// The token map's file name inside the cache directory.
pub const TOKEN_MAP_FILE: &str = "dsv41_token_map.json";
