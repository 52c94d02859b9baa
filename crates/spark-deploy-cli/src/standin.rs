//! The engine stand-in inside the `spark-deploy` binary (feature `testbed`).
//!
//! `spark-deploy demo` installs this very executable in the testbed's engine directory under the
//! engine's two names, so the README's first command needs nothing else built. Invoked under one
//! of those names, the binary is the stand-in (dispatch on the base name of `argv[0]`, as a
//! multi-call binary does) and never parses the `spark-deploy` command line.

use std::path::Path;
use std::process::ExitCode;

use spark_deploy_testbed::standin;

/// Runs the stand-in when `argv[0]` names an engine binary; `None` otherwise.
pub(crate) fn dispatch() -> Option<ExitCode> {
    let argv0 = std::env::args_os().next()?;
    let name = Path::new(&argv0)
        .file_name()?
        .to_string_lossy()
        .into_owned();
    standin::is_engine_name(&name).then(|| ExitCode::from(standin::run_process()))
}
