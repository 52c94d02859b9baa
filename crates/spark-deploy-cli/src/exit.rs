//! Documented exit codes.

/// `status`: the pair is not serving (down or degraded), like `systemctl is-active`.
pub(crate) const NOT_SERVING: u8 = 1;
/// Bad command line.
pub(crate) const USAGE: u8 = 2;
/// The configuration is unreadable or invalid.
pub(crate) const CONFIG: u8 = 3;
/// A preflight check failed: nothing was changed.
pub(crate) const PREFLIGHT: u8 = 4;
/// A step failed while running.
pub(crate) const RUNTIME: u8 = 5;
/// Interrupted by Ctrl-C (SIGINT), as shells report it: 128 + 2.
pub(crate) const INTERRUPTED: u8 = 130;

/// The exit-code table shown in `--help`.
pub(crate) const HELP: &str = "Exit codes: 0 success, 1 `status`: not serving, 2 usage, 3 configuration, \
                                4 preflight (nothing changed), 5 runtime, 130 interrupted (Ctrl-C).";

/// A failed command: the exit code, the message chain and the remedy.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) code: u8,
    pub(crate) message: String,
    pub(crate) remedy: Option<String>,
    /// Already shown to the user (by the event stream or the command's own output): only the
    /// exit code remains, so the failure is printed once.
    pub(crate) reported: bool,
}

impl Failure {
    pub(crate) fn new(code: u8, error: &dyn std::error::Error, remedy: Option<String>) -> Self {
        let mut message = error.to_string();
        let mut source = error.source();
        while let Some(s) = source {
            // A cause the message already spells out (`{source}` in its format) is not repeated.
            let text = s.to_string();
            if !message.contains(&text) {
                message.push_str(&format!("\n  caused by: {text}"));
            }
            source = s.source();
        }
        Self {
            code,
            message,
            remedy,
            reported: false,
        }
    }

    /// A failure with a plain message.
    pub(crate) fn msg(code: u8, message: impl Into<String>, remedy: Option<String>) -> Self {
        Self {
            code,
            message: message.into(),
            remedy,
            reported: false,
        }
    }

    /// Only an exit code: what went wrong has been shown already.
    pub(crate) fn reported(code: u8) -> Self {
        Self {
            code,
            message: String::new(),
            remedy: None,
            reported: true,
        }
    }

    /// A bad command line (exit 2).
    pub(crate) fn usage(message: impl Into<String>, remedy: impl Into<String>) -> Self {
        Self::msg(USAGE, message, Some(remedy.into()))
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
