//! Diagnostics through `tracing` (also what dependencies log through `log`), on stderr:
//! `RUST_LOG` when set; else spark-deploy's own warnings (`-q`: errors), and with `-v` its debug
//! lines plus the dependencies' warnings. Failures reach people as events, once: dependencies
//! (which log their own view of the same failure, e.g. a retried download) stay quiet by default.

use std::io::{IsTerminal as _, Write as _};
use std::sync::RwLock;

use spark_deploy_core::secret::Secret;
use tracing_subscriber::EnvFilter;

use crate::events::Verbosity;

/// The secrets of the loaded config (HF token, API key, credentials in `hub.endpoint`): every
/// log line is scrubbed of them before it reaches stderr, as events are.
static SECRETS: RwLock<Vec<Secret>> = RwLock::new(Vec::new());

/// Registers secrets to scrub from every log line from now on.
pub(crate) fn redact(secrets: Vec<Secret>) {
    if let Ok(mut s) = SECRETS.write() {
        s.extend(secrets);
    }
}

/// One log line, buffered, scrubbed and written to stderr when dropped.
struct Line(Vec<u8>);

impl std::io::Write for Line {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        let bytes = match SECRETS.read() {
            Ok(s) => s
                .iter()
                .fold(std::mem::take(&mut self.0), |b, sec| sec.redact_bytes(&b)),
            Err(_) => std::mem::take(&mut self.0),
        };
        // A closed or full stderr: nowhere else to say it.
        let _ = std::io::stderr().lock().write_all(&bytes);
    }
}

fn line_writer() -> Line {
    Line(Vec::new())
}

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
        .with_writer(line_writer)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(true)
        .without_time()
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_lines_are_scrubbed_of_registered_secrets() {
        redact(vec![Secret::new("bob:pa55word")]);
        let mut l = Line(Vec::new());
        l.write_all(b"GET https://bob:pa55word@hub/x").unwrap();
        let scrubbed = SECRETS
            .read()
            .unwrap()
            .iter()
            .fold(std::mem::take(&mut l.0), |b, s| s.redact_bytes(&b));
        assert_eq!(scrubbed, b"GET https://***@hub/x");
    }
}
