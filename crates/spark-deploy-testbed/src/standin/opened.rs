//! Every file the stand-in reads (its content, or its size where that is what the engine checks),
//! recorded so that a deployment test can compare what a rank opened with what was shipped to its
//! node. Rank 1 prints the list in its loaded line (`"opened": [...]`, paths as the container
//! sees them).

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Mutex;

static OPENED: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// Records that `path` was read.
pub(crate) fn record(path: &Path) {
    if let Ok(mut set) = OPENED.lock() {
        set.insert(path.display().to_string());
    }
}

/// Every path recorded so far, sorted.
#[must_use]
pub fn opened() -> Vec<String> {
    OPENED
        .lock()
        .map(|s| s.iter().cloned().collect())
        .unwrap_or_default()
}
