//! Rendering for the terminal: failures, warnings and (later) the event stream.

use crate::exit::Failure;

use std::io::Write as _;
use std::sync::Mutex;

/// The first error writing stdout met (`| head -0` closes it, `> /dev/full` fills it): the
/// command goes on without its output, and ends with [`stdout_failure`]'s exit code instead of
/// the panic `println!` would raise.
static STDOUT_ERROR: Mutex<Option<String>> = Mutex::new(None);

/// Writes `text` to stdout (a newline added when missing) and flushes; `false` when stdout is
/// closed or full, the error being kept for [`stdout_failure`].
fn write_stdout(text: &str) -> bool {
    let mut o = std::io::stdout().lock();
    let nl: &[u8] = if text.ends_with('\n') { b"" } else { b"\n" };
    let r = o
        .write_all(text.as_bytes())
        .and_then(|()| o.write_all(nl))
        .and_then(|()| o.flush());
    match r {
        Ok(()) => true,
        Err(e) => {
            if let Ok(mut slot) = STDOUT_ERROR.lock()
                && slot.is_none()
            {
                *slot = Some(e.to_string());
            }
            false
        }
    }
}

/// The failure a command ends with when its output could not be written (exit 5).
pub(crate) fn stdout_failure() -> Option<Failure> {
    let e = STDOUT_ERROR.lock().ok()?.clone()?;
    Some(Failure::msg(
        crate::exit::RUNTIME,
        format!("cannot write the output to stdout: {e}"),
        Some(
            "read the whole output (a pipe closed early, e.g. `| head`, cuts it), or redirect it to \
             a file on a disk with free space"
                .into(),
        ),
    ))
}

/// Writes to stderr; a closed or full stderr is ignored (there is nowhere else to say it).
fn write_stderr(text: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{text}");
}

/// Prints a failure: human text on stderr, or one JSON object on stdout with `--json`.
pub(crate) fn failure(f: &Failure, json: bool) {
    if f.reported {
        return;
    }
    if json {
        let v = serde_json::json!({ "error": f.message, "remedy": f.remedy, "exit_code": f.code });
        if write_stdout(&v.to_string()) {
            return;
        }
    }
    write_stderr(&format!("error: {}", f.message));
    if let Some(r) = &f.remedy {
        write_stderr(&format!("  remedy: {r}"));
    }
}

/// Prints config warnings on stderr (never mixed into JSON on stdout).
pub(crate) fn warnings(ws: &[spark_deploy_core::config::ConfigWarning]) {
    for w in ws {
        write_stderr(&format!("warning: {w}"));
    }
}

/// Prints a result document on stdout; a closed or full stdout is recorded, never a panic.
pub(crate) fn out(text: &str) {
    write_stdout(text);
}

/// Writes one line on stdout; `false` once stdout is closed (`| head`), so a caller stops.
pub(crate) fn line(text: &str) -> bool {
    write_stdout(text)
}

/// Prints an informational note on stderr.
pub(crate) fn note(text: &str) {
    write_stderr(text);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_error_becomes_a_runtime_failure() {
        assert!(stdout_failure().is_none());
        if let Ok(mut slot) = STDOUT_ERROR.lock() {
            *slot = Some("Broken pipe (os error 32)".into());
        }
        let f = stdout_failure().unwrap();
        assert_eq!(f.code, crate::exit::RUNTIME);
        assert!(f.message.contains("Broken pipe") && f.remedy.is_some());
    }
}
