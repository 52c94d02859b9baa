//! `tf-standin`: the dsv41 engine stand-in. Install it as `tensorfold-native` (rank 0) and
//! `tf-dsv41-lanes` (rank 1); it dispatches on the base name of `argv[0]`
//! (see `spark_deploy_testbed::standin`). Its stdout is the engine's protocol (rank 1's JSON
//! lines), its stderr the engine's `error.Name: …` lines.

use std::process::ExitCode;

fn main() -> ExitCode {
    ExitCode::from(spark_deploy_testbed::standin::run_process())
}
