//! spark-deploy core: typed config, the plan as data, steps and effect ports.
pub mod engine;
pub mod hub;
pub mod ports;
