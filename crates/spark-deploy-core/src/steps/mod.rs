//! The typed steps. Each holds the data it needs (computed from the validated config when the plan
//! is built) and can describe its actions per node; running them goes through the effect ports.

pub mod engine_build;
mod fetch;
mod image;
mod launch;
pub mod nfs_volume;
mod preflight;
mod rank_cache;
mod ranks;
mod send_ahead;
mod smoke;
mod stop;
mod storage;

pub use crate::layout::{hub_dir, snapshot_dir};
pub use fetch::{CacheProblems, FetchCheckpoint, RepoFetch};
pub use image::BuildImage;
pub use launch::{LaunchError, LaunchRank};
pub use preflight::{Preflight, PreflightFailed};
pub use rank_cache::BuildRankCache;
pub use ranks::RankOpError;
pub use smoke::{Smoke, SmokeError};
pub use stop::Stop;
pub use storage::{ConfigureWorkerStorage, WorkerPlan};

pub(crate) use ranks::{stop_deployment, stop_started as stop_started_ranks};
