//! The build cache: the key a build is filed under, the record it leaves in `cache/<key>/`, the
//! check that a cached build is intact, and installing a binary into place.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{BuildError, io};
use crate::digest::sha256_file;
use crate::engine::BuildRecipe;

/// The cache key of a build: sha256 over the commit, each patch's name and sha256 in order, the
/// base image's ID on the head, the build command, its environment and what it collects.
#[must_use]
pub fn cache_key(
    commit: &str,
    patches: &[(String, String)],
    base_id: &str,
    recipe: &BuildRecipe,
) -> String {
    let mut parts = vec![format!("commit {commit}"), format!("base {base_id}")];
    parts.extend(patches.iter().map(|(n, s)| format!("patch {n} {s}")));
    parts.push(format!("command {}", serde_json::json!(recipe.command)));
    parts.extend(recipe.env.iter().map(|(k, v)| format!("env {k}={v}")));
    parts.extend(
        recipe
            .outputs
            .iter()
            .map(|(p, n)| format!("output {p} {n}")),
    );
    crate::digest::sha256_hex(parts.join("\n"))
}

/// What a finished (or cached) build left, recorded as `cache/<key>/build.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BuildRecord {
    /// [`cache_key`].
    pub key: String,
    /// `engine.repo`.
    pub repo: String,
    /// `engine.commit`.
    pub commit: String,
    /// `(name, sha256)` of each patch, in order.
    pub patches: Vec<(String, String)>,
    /// `engine.base_image` and its ID.
    pub base_image: String,
    /// The base image's ID on the head.
    pub base_id: String,
    /// The build command.
    pub command: Vec<String>,
    /// `(name, sha256)` of each engine binary, in the recipe's order.
    pub binaries: Vec<(String, String)>,
    /// How long the build ran, seconds.
    pub build_s: f64,
}

/// The cached build of `key`, when its record is readable and every binary still has its sha256.
pub(super) fn cached(entry: &Path, key: &str) -> Option<BuildRecord> {
    let text =
        crate::safe_fs::read_capped(&entry.join("build.json"), crate::safe_fs::JSON_CAP).ok()?;
    let record: BuildRecord = serde_json::from_slice(&text).ok()?;
    let intact = record.key == key
        && record.binaries.iter().all(|(name, sha)| {
            sha256_file(&entry.join("engine").join(name)).is_ok_and(|s| s == *sha)
        });
    intact.then_some(record)
}

/// Copies `from` to `to` through a `.partial` file renamed into place (never writing into a file
/// that may be a hard link or mapped by a running rank), mode 0755.
pub(super) fn install(from: &Path, to: &Path) -> Result<(), BuildError> {
    let dir = to.parent().unwrap_or_else(|| Path::new("."));
    std::fs::create_dir_all(dir).map_err(io("create", dir))?;
    let name = to
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let partial = dir.join(format!(".{name}.partial"));
    crate::safe_fs::copy_exclusive(from, &partial, 0o755).map_err(io("copy to", &partial))?;
    std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(0o755))
        .map_err(io("chmod", &partial))?;
    std::fs::rename(&partial, to).map_err(io("rename", to))
}
