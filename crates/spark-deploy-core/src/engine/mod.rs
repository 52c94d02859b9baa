//! Engine profiles: everything engine-specific lives behind the [`Engine`] trait — each rank's
//! container (argv, env, mounts, limits, start order), the cross-rank fingerprint, the per-rank
//! inputs to build, verify and ship, the memory model, the readiness and smoke probes, and the
//! serving-side signals a supervisor reads. Steps call the trait; a second engine is a new
//! implementation, not an edit of every step.
//!
//! [`registry::for_config`] maps the configuration's profile name to its implementation and is
//! the only code outside this module's implementations that names one.

pub mod image_context;
pub mod limits;
pub mod profile;
pub mod registry;
pub mod tensorfold;

pub use limits::{EngineLimits, MemoryModel};
pub use profile::{
    ApiEndpoint, BuildRecipe, Engine, FingerprintError, ProbeError, RankSlots, Readiness,
    ServingSignals, StepPlan,
};
pub use registry::for_config;
