//! `tf-standin`: the dsv41 engine stand-in. Install it as `tensorfold-native` (rank 0) and
//! `tf-dsv41-lanes` (rank 1); it dispatches on the base name of `argv[0]`
//! (see `spark_deploy_testbed::standin`). Its stdout is the engine's protocol (rank 1's JSON
//! lines), its stderr the engine's `error.Name: …` lines.

use std::process::ExitCode;

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let env = std::env::vars_os()
        .map(|(k, v)| {
            (
                k.to_string_lossy().into_owned(),
                v.to_string_lossy().into_owned(),
            )
        })
        .collect();
    let mut out = std::io::stdout();
    let mut err = std::io::stderr();
    ExitCode::from(spark_deploy_testbed::standin::run(
        &argv, &env, &mut out, &mut err,
    ))
}
