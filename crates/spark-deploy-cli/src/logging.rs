//! Diagnostics through `tracing` (also what dependencies log through `log`), on stderr:
//! `RUST_LOG` when set; else spark-deploy's own warnings (`-q`: errors), and with `-v` its debug
//! lines plus the dependencies' warnings. Failures reach people as events, once: dependencies
//! (which log their own view of the same failure, e.g. a retried download) stay quiet by default.

use std::io::IsTerminal as _;

use tracing_subscriber::EnvFilter;

use crate::events::Verbosity;

/// Installs the subscriber once, before any command runs.
pub(crate) fn init(verbosity: Verbosity) {
    let default = match verbosity {
        Verbosity::Quiet => "off,spark_deploy=error",
        Verbosity::Normal => "off,spark_deploy=warn",
        Verbosity::Verbose => {
            "warn,spark_deploy=debug,spark_deploy_core=debug,spark_deploy_testbed=debug"
        }
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(true)
        .without_time()
        .try_init();
}
