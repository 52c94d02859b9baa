//! The testbed: two Sparks on one machine.
pub mod checkpoint;
pub mod cluster;
pub mod hub_server;
