//! The Hub port: resolve, list, download (resumable, verified) into the standard HF cache,
//! verify a cache offline, and read single tensors of remote safetensors files by byte range.
//!
//! # Usage (the FetchCheckpoint step)
//! ```no_run
//! # async fn f() -> Result<(), Box<dyn std::error::Error>> {
//! use spark_deploy_core::hub::{Hub, HubConfig, NoProgress, select, verify_snapshot};
//! let hub = Hub::new(HubConfig::from_env())?;               // token: HF_TOKEN or $HF_HOME/token
//! let pinned = hub.resolve("org/model", "0123456789abcdef0123456789abcdef01234567").await?;
//! let files = hub.list_files(&pinned).await?;
//! let wanted: Vec<_> = select(&files, &["*.json".into(), "*.safetensors".into()])?
//!     .into_iter().cloned().collect();
//! let report = hub.fetch(&pinned, &wanted, &NoProgress).await?;
//! let _ = report.summary();                                  // "all N files present and verified …"
//! // Air-gapped node: no network at all.
//! let check = verify_snapshot(hub.cache(), "org/model", &pinned.commit, None)?;
//! assert!(check.is_ok());
//! # Ok(()) }
//! ```
//!
//! # Guarantees
//! - Every fetched file is verified (size; sha256 for LFS files, git sha1 for small ones — both
//!   are the Hub's ETag; `.safetensors` structure); a verified blob is never fetched again, a
//!   corrupt one is fetched again.
//! - Partial data only ever sits in `blobs/<etag>.incomplete` and is resumed with range requests.
//! - The token never appears in errors, events or `Debug` output ([`HfToken`]).
//! - The core never prints: progress goes to a [`FetchProgress`] callback.
//! - Offline ([`HubConfig::offline`], `HF_HUB_OFFLINE`), no request is made at all.
//!
//! # Module map
//! [`client`] (Hub connection, resolution, listing, metadata), [`error`] (its errors), [`fetch`] (download loop),
//! [`verify`] (one file: size, digests, safetensors structure), [`snapshot`] (stamps, manifests and the
//! offline check of a cached snapshot), [`cache`] (layout), [`remote`] (tensor byte ranges),
//! [`patterns`] (which files a pattern list selects), the download module (one blob's transfer),
//! [`token`], [`progress`], [`offline`] (`HF_HUB_OFFLINE`: no socket, the verified cache).

pub mod cache;
pub mod client;
mod download;
pub mod error;
pub mod fetch;
pub mod offline;
mod order;
pub mod patterns;
pub mod progress;
pub mod remote;
pub mod snapshot;
pub mod token;
pub mod verify;

pub use cache::{CacheError, HfCache};
pub use client::{FileMeta, Hub, HubConfig, RemoteFile, ResolvedRepo};
pub use error::{HubError, TokenState};
pub use fetch::{FetchError, FetchReport, FetchedFile, select};
pub use patterns::{AllowPatterns, PatternError};
pub use progress::{FetchEvent, FetchProgress, FileOutcome, NoProgress};
pub use remote::{RemoteError, RemoteSafetensors, RemoteTensor, TensorEntry};
pub use snapshot::{VerifyReport, verify_snapshot};
pub use token::{HfToken, TokenSource, default_cache_dir, hf_home};
pub use verify::{Expected, VerifyError, verify_file};
