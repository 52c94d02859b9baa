//! Preflight facts and decisions: parsers of real host outputs (`nvidia-smi`, `/proc/meminfo`,
//! `ip route`, sysfs), the engine's memory model, and the rules that turn them into verdicts.
//! Collection goes through the Exec and Docker ports (`steps::preflight`); everything here is pure
//! so it is tested on real captured outputs.

pub mod budget;
pub mod clocks;
pub mod decide;
pub mod exports;
pub mod inputs;
pub mod meminfo;
pub mod report;
pub mod roce;
pub mod smi;
pub mod sysfs_dump;
