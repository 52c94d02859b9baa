//! Lifecycle helpers shared by `up`, `down`, `restart` and `status`: saved-log names and rotation,
//! the API key file, the record of the last launch.

pub mod api_key;
pub mod launch_record;
pub mod lock;
pub mod logs;
pub mod status;
