//! spark-deploy core: deploy one large model across NVIDIA DGX Sparks.
//!
//! The flow: a [`config::DeploymentConfig`] (TOML + the recipe's environment names) is validated
//! once into a [`config::ValidatedConfig`]; [`plan::Plan::standard`] turns it into ordered, typed
//! steps (Preflight → FetchCheckpoint → BuildRankCache → ConfigureWorkerStorage → BuildImage →
//! LaunchRank → Smoke) that can describe themselves without side effects. Effects go through
//! three ports ([`ports`] for Exec and Docker, [`hub`] for the Hub); progress leaves as
//! [`event::Event`]s, never as prints. Everything engine-specific lives behind
//! [`engine::Engine`].
//!
//! # Layers
//!
//! Bottom to top; a module uses only its own layer and the ones below (checked by
//! `scripts/check-layers`, which CI runs):
//!
//! 0. [`secret`], [`container`], [`event`], [`causes`] — vocabulary every layer may use;
//!    [`safe_fs`] — input files opened and temporaries created safely.
//! 1. [`ports`] (Exec, Docker), [`hub`], [`config`], [`transfer`], the shared [`digest`],
//!    [`backoff`], [`commit`] and [`safetensors_header`] helpers, the engine's data
//!    (`engine::limits`, `engine::tensorfold::inputs`, `engine::image_context`) and local state
//!    files (`lifecycle::{lock, api_key, logs, log_time, startup, run_log, watch_state}`), the
//!    serving API's client ([`api`]),
//!    a small PNG canvas ([`raster`]).
//! 2. [`facts`], [`layout`], [`preflight`] (pure decisions over gathered facts), [`describe`]
//!    (plan descriptions), `lifecycle::launch_record`, `lifecycle::generations`.
//! 3. [`context`] — what a running step may touch: config, ports per node, facts, events,
//!    cancellation.
//! 4. [`engine`] — the [`engine::Engine`] trait, its implementations and the registry.
//! 5. [`steps`] — the typed steps, calling the engine through the trait.
//! 6. [`plan`] — plans composed of steps; [`export`] — the plan as a Kubernetes
//!    `LeaderWorkerSet` or per-node compose files.
//! 7. [`run`] — running a plan: all ranks or none, the run report.
//! 8. [`lifecycle`] (status and what acts on running deployments), [`supervise`] (`watch`:
//!    samples, pure decisions, heals of all ranks or none), [`service`] (the systemd units
//!    that bring the pair back after a reboot, and the wait they run), [`bundle`] (the support
//!    bundle), [`validate`] and [`bench`] (what is served, and how fast, through the API),
//!    [`upgrade`] (a new generation beside the serving one, accepted or rolled back).
//! 9. [`error`] — the crate-level error.

#![warn(missing_docs)]

pub mod api;
pub mod backoff;
pub mod bench;
pub mod bundle;
pub mod causes;
pub mod commit;
pub mod config;
pub mod container;
pub mod context;
pub mod describe;
pub mod digest;
pub mod engine;
pub mod error;
pub mod event;
pub mod export;
pub mod facts;
pub mod hub;
pub mod layout;
pub mod lifecycle;
pub mod plan;
pub mod ports;
pub mod preflight;
pub mod raster;
pub mod run;
pub mod safe_fs;
pub mod safetensors_header;
pub mod secret;
pub mod service;
pub mod steps;
pub mod supervise;
pub mod transfer;
pub mod upgrade;
pub mod validate;

pub use error::Error;
