//! The testbed: two Sparks on one machine.
#![recursion_limit = "256"]
pub mod checkpoint;
pub mod cluster;
pub mod demo;
pub mod deployment;
pub mod direct_write;
pub mod engine;
pub mod engine_build;
pub mod host_facts;
pub mod hub_server;
pub mod poller;
pub mod reuse;
pub mod ssh_agent;
pub mod standin;
pub mod usage;
