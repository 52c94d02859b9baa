//! Lifecycle helpers shared by `up`, `down`, `restart`, `status` and `logs`: saved-log names and
//! rotation, reading the running ranks' logs, the API key file, the record of the last launch, the last run's events and preflight report.

pub mod api_key;
pub mod generations;
pub mod launch_record;
pub mod lock;
pub mod log_stream;
pub mod log_time;
pub mod logs;
pub mod run_log;
pub mod startup;
pub mod status;
pub mod watch_state;
