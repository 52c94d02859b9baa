//! Engine profiles.
pub mod tensorfold;
