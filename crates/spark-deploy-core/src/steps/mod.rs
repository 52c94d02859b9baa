//! The typed steps. Each holds the data it needs (computed from the validated config when the plan
//! is built) and can describe its actions per node; running them goes through the effect ports.

mod fetch;
mod image;
mod launch;
mod preflight;
mod rank_cache;
mod smoke;
mod stop;
mod storage;

pub use fetch::{FetchCheckpoint, RepoFetch};
pub use image::BuildImage;
pub use launch::LaunchRank;
pub use preflight::Preflight;
pub use rank_cache::{BuildRankCache, RankOutput};
pub use smoke::Smoke;
pub use stop::Stop;
pub use storage::{ConfigureWorkerStorage, WorkerPlan};
