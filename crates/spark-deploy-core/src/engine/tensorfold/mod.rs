//! TensorFold `dsv41` engine profile.
pub mod inputs;
