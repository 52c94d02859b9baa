//! spark-deploy core: deploy one large model across NVIDIA DGX Sparks.
//!
//! The flow: a [`config::DeploymentConfig`] (TOML + the recipe's environment names) is validated
//! once into a [`config::ValidatedConfig`]; [`plan::Plan::standard`] turns it into ordered, typed
//! steps (Preflight → FetchCheckpoint → BuildRankCache → ConfigureWorkerStorage → BuildImage →
//! LaunchRank → Smoke) that can describe themselves without side effects. Effects go through
//! three ports ([`ports`] for Exec and Docker, [`hub`] for the Hub); progress leaves as
//! [`event::Event`]s, never as prints. Everything TensorFold-specific lives in [`engine`].

#![warn(missing_docs)]

pub mod backoff;
pub mod commit;
pub mod config;
pub mod container;
pub mod digest;
pub mod engine;
pub mod error;
pub mod event;
pub mod facts;
pub mod hub;
pub mod layout;
pub mod lifecycle;
pub mod plan;
pub mod ports;
pub mod preflight;
pub mod run;
pub mod safetensors_header;
pub mod secret;
pub mod steps;
pub mod transfer;

pub use error::Error;
