//! Lifecycle helpers shared by `up`, `down`, `restart` and `status`: saved-log names and rotation,
//! the API key file.

pub mod api_key;
pub mod lock;
pub mod logs;
pub mod status;
