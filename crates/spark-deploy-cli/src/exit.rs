//! Documented exit codes.

/// Bad command line.
pub(crate) const USAGE: u8 = 2;
/// The configuration is unreadable or invalid.
pub(crate) const CONFIG: u8 = 3;
/// A preflight check failed: nothing was changed.
#[allow(dead_code)]
pub(crate) const PREFLIGHT: u8 = 4;
/// A step failed while running.
pub(crate) const RUNTIME: u8 = 5;

/// The exit-code table shown in `--help`.
pub(crate) const HELP: &str =
    "Exit codes: 0 success, 2 usage, 3 configuration, 4 preflight (nothing changed), 5 runtime.";

/// A failed command: the exit code, the message chain and the remedy.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) code: u8,
    pub(crate) message: String,
    pub(crate) remedy: Option<String>,
}

impl Failure {
    pub(crate) fn new(code: u8, error: &dyn std::error::Error, remedy: Option<String>) -> Self {
        let mut message = error.to_string();
        let mut source = error.source();
        while let Some(s) = source {
            message.push_str(&format!("\n  caused by: {s}"));
            source = s.source();
        }
        Self {
            code,
            message,
            remedy,
        }
    }
}

impl From<spark_deploy_core::Error> for Failure {
    fn from(e: spark_deploy_core::Error) -> Self {
        let code = match e {
            spark_deploy_core::Error::Config(_) => CONFIG,
        };
        let remedy = e.remedy();
        Self::new(code, &e, remedy)
    }
}

impl From<spark_deploy_core::config::ConfigError> for Failure {
    fn from(e: spark_deploy_core::config::ConfigError) -> Self {
        spark_deploy_core::Error::from(e).into()
    }
}
