//! Rendering for the terminal: failures, warnings and (later) the event stream.

use crate::exit::Failure;

/// Prints a failure: human text on stderr, or one JSON object on stdout with `--json`.
#[allow(clippy::print_stderr, clippy::print_stdout)]
pub(crate) fn failure(f: &Failure, json: bool) {
    if f.reported {
        return;
    }
    if json {
        let v = serde_json::json!({ "error": f.message, "remedy": f.remedy, "exit_code": f.code });
        println!("{v}");
    } else {
        eprintln!("error: {}", f.message);
        if let Some(r) = &f.remedy {
            eprintln!("  remedy: {r}");
        }
    }
}

/// Prints config warnings on stderr (never mixed into JSON on stdout).
#[allow(clippy::print_stderr)]
pub(crate) fn warnings(ws: &[spark_deploy_core::config::ConfigWarning]) {
    for w in ws {
        eprintln!("warning: {w}");
    }
}

/// Prints a result document on stdout.
#[allow(clippy::print_stdout)]
pub(crate) fn out(text: &str) {
    if text.ends_with('\n') {
        print!("{text}");
    } else {
        println!("{text}");
    }
}

/// Writes one line on stdout; `false` once stdout is closed (`| head`), so a caller stops.
pub(crate) fn line(text: &str) -> bool {
    use std::io::Write as _;
    writeln!(std::io::stdout().lock(), "{text}").is_ok()
}

/// Prints an informational note on stderr.
#[allow(clippy::print_stderr)]
pub(crate) fn note(text: &str) {
    eprintln!("{text}");
}
