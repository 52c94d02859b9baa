//! Per-rank inputs of the dsv41 engine: rank weight files (TFDSRK01),
//! token map, RoPE tables, image routing bias and kit verification.
//!
//! Entry points for the `BuildRankCache` step:
//! - [`plan_rank_cache`] (index only: index JSON and expected file name, writes nothing),
//!   [`build_rank_cache`], [`verify_rank_cache`], [`read_sidecar`];
//! - [`token_map::write_token_map`] (with the count check) / [`token_map::build_token_map`];
//! - [`rope::write_rope_tables`] (checks a kit's `rope.json` when present);
//! - [`bias_vl::write_bias_vl`];
//! - [`kit::verify_kit`].
//!
//! Nothing here prints; progress goes through callbacks. Everything is blocking std I/O (positioned
//! reads and writes on a few scoped threads): call it from `tokio::task::spawn_blocking` in async
//! code. Memory: the plan (about 170 MB for the real checkpoint's 143,770 entries) plus, per copy
//! thread, one chunk and at most one scratch buffer (`RankCacheOptions::chunk_bytes`, 8 MiB by
//! default; strided reads use about 2 chunks of scratch).

pub mod bias_vl;
pub mod dtype;
pub mod kit;
pub mod model_config;
pub mod rank_cache;
pub mod rank_file;
pub mod rope;
pub mod safetensors_index;
pub mod split_plan;
pub mod token_map;

pub use model_config::{ModelConfig, ModelConfigError};
pub use rank_cache::{
    Cancelled, ExistingRankFile, ProgressFn, RankCacheError, RankCacheOptions, RankCachePhase,
    RankCachePlan, RankCacheProgress, StreamedRank, VerifyLevel, build_rank_cache,
    build_rank_caches_streaming, open_checkpoint, plan_rank_cache, plan_rank_cache_from,
    read_sidecar, sidecar_path, verify_rank_cache,
};
