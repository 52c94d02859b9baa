//! The patches of an engine build: read with their sha256, and `git apply --check`'s complaint
//! read back into the file, line and hunk that failed.

use std::path::Path;

use super::BuildError;

/// Where a patch failed, as git reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatchFailure {
    /// The file in the source tree the failing hunk is for.
    pub file: Option<String>,
    /// The line in that file the hunk starts at (git's `patch failed: FILE:LINE`).
    pub line: Option<u32>,
    /// The hunk's number among the patch's hunks for that file (1-based) and the line of its
    /// `@@` header in the patch file, when found there.
    pub hunk: Option<(usize, usize)>,
    /// git's error lines.
    pub message: String,
}

impl std::fmt::Display for PatchFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.file, self.line, self.hunk) {
            (Some(file), Some(line), Some((n, at))) => write!(
                f,
                "hunk #{n} for {file} (line {at} of the patch) does not match {file} at line {line}"
            )?,
            (Some(file), Some(line), None) => {
                write!(f, "the hunk for {file} at line {line} does not match")?;
            }
            (Some(file), None, _) => write!(f, "{file}")?,
            _ => {}
        }
        if self.file.is_some() {
            write!(f, " (git: {})", self.message)
        } else {
            write!(f, "git: {}", self.message)
        }
    }
}

/// Reads `git apply --check`'s error output (and the patch text, to number the hunk).
#[must_use]
pub fn parse_apply_error(stderr: &str, patch: &str) -> PatchFailure {
    let errors: Vec<&str> = stderr
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("error:") || l.starts_with("fatal:"))
        .collect();
    let message = if errors.is_empty() {
        stderr.trim().to_owned()
    } else {
        errors.join("; ")
    };
    let mut file = None;
    let mut line = None;
    for e in &errors {
        if let Some(rest) = e.strip_prefix("error: patch failed: ")
            && let Some((f, l)) = rest.rsplit_once(':')
        {
            file = Some(f.to_owned());
            line = l.trim().parse().ok();
            break;
        }
        // "error: FILE: No such file or directory", "error: FILE: already exists in working directory"
        if let Some(rest) = e.strip_prefix("error: ")
            && let Some((f, why)) = rest.split_once(": ")
            && !f.contains(' ')
            && !why.is_empty()
            && file.is_none()
        {
            file = Some(f.to_owned());
        }
    }
    let hunk = match (&file, line) {
        (Some(f), Some(l)) => locate_hunk(patch, f, l),
        _ => None,
    };
    PatchFailure {
        file,
        line,
        hunk,
        message,
    }
}

/// The hunk of `patch` for `file` whose old range starts at `line`: its number among that file's
/// hunks and the 1-based line of its `@@` header.
fn locate_hunk(patch: &str, file: &str, line: u32) -> Option<(usize, usize)> {
    let mut in_file = false;
    let mut n = 0;
    for (i, l) in patch.lines().enumerate() {
        if let Some(path) = l.strip_prefix("+++ ") {
            let path = path.split('\t').next().unwrap_or(path).trim();
            let path = path
                .strip_prefix("b/")
                .or_else(|| path.strip_prefix("a/"))
                .unwrap_or(path);
            in_file = path == file;
            n = 0;
        } else if in_file && let Some(rest) = l.strip_prefix("@@ -") {
            n += 1;
            let start: u32 = rest
                .split([',', ' '])
                .next()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            if start == line {
                return Some((n, i + 1));
            }
        }
    }
    None
}

/// Reads the patch files: `(name, sha256, text)` in order.
pub(super) fn read_patches(paths: &[String]) -> Result<Vec<(String, String, String)>, BuildError> {
    paths
        .iter()
        .map(|p| {
            let bytes = crate::safe_fs::read_capped(Path::new(p), crate::safe_fs::PATCH_CAP)
                .map_err(|source| BuildError::PatchRead {
                    path: p.clone(),
                    source,
                })?;
            let name = Path::new(p)
                .file_name()
                .map_or_else(|| p.clone(), |n| n.to_string_lossy().into_owned());
            Ok((
                name,
                crate::digest::sha256_hex(&bytes),
                String::from_utf8_lossy(&bytes).into_owned(),
            ))
        })
        .collect()
}
