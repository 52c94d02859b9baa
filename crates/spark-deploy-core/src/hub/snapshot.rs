//! A cached snapshot as a whole: the stamps that spare re-hashing a verified blob, the manifest
//! each fetch records, and [`verify_snapshot`], the offline check of a cached snapshot.

use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use serde::{Deserialize, Serialize};

use super::cache::HfCache;
use super::verify::{Expected, VerifyError, verify_file};

/// A "verified" stamp: the blob's size and modification time when it was last verified.
fn stamp_value(path: &Path) -> Option<String> {
    let m = std::fs::metadata(path).ok()?;
    let mtime = m.modified().ok()?.duration_since(UNIX_EPOCH).ok()?;
    Some(format!("{} {}", m.len(), mtime.as_nanos()))
}

/// Record that the blob `etag` of `repo` was verified as it is now.
pub(crate) fn write_stamp(cache: &HfCache, repo: &str, etag: &str) {
    let blob = cache.blob_path(repo, etag);
    if let Some(v) = stamp_value(&blob) {
        let dir = cache.stamp_dir(repo);
        if std::fs::create_dir_all(&dir).is_ok() {
            let _ = crate::safe_fs::write_exclusive(&dir.join(etag), v);
        }
    }
}

/// Whether the blob is unchanged since it was verified (same size and mtime).
pub(crate) fn stamp_ok(cache: &HfCache, repo: &str, etag: &str) -> bool {
    let blob = cache.blob_path(repo, etag);
    let stamp = std::fs::read_to_string(cache.stamp_dir(repo).join(etag)).ok();
    stamp.is_some() && stamp == stamp_value(&blob)
}

pub(crate) fn remove_stamp(cache: &HfCache, repo: &str, etag: &str) {
    let _ = std::fs::remove_file(cache.stamp_dir(repo).join(etag));
}

/// One file of a snapshot manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestEntry {
    /// Repository-relative path.
    pub path: String,
    /// Blob name (ETag).
    pub etag: String,
    /// What the file must be.
    pub expected: Expected,
}

pub(crate) fn manifest_path(cache: &HfCache, repo: &str, commit: &str) -> PathBuf {
    cache.stamp_dir(repo).join(format!("{commit}.json"))
}

/// Merge `entries` into the manifest of `repo@commit` (written by every fetch).
pub(crate) fn update_manifest(
    cache: &HfCache,
    repo: &str,
    commit: &str,
    entries: &[ManifestEntry],
) {
    let p = manifest_path(cache, repo, commit);
    let mut all: Vec<ManifestEntry> = crate::safe_fs::read_capped(&p, crate::safe_fs::JSON_CAP)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    for e in entries {
        all.retain(|x| x.path != e.path);
        all.push(e.clone());
    }
    all.sort_by(|a, b| a.path.cmp(&b.path));
    if let (Some(dir), Ok(json)) = (p.parent(), serde_json::to_vec_pretty(&all))
        && std::fs::create_dir_all(dir).is_ok()
    {
        let tmp = p.with_extension("json.sd-tmp");
        if crate::safe_fs::write_exclusive(&tmp, json).is_ok() {
            let _ = std::fs::rename(&tmp, &p);
        }
    }
}

/// Result of verifying a cached snapshot.
#[derive(Debug)]
pub struct VerifyReport {
    /// Repository id.
    pub repo: String,
    /// The commit verified.
    pub commit: String,
    /// Files found and verified.
    pub verified: Vec<String>,
    /// Problems found, one per bad or missing file.
    pub problems: Vec<VerifyError>,
}

impl VerifyReport {
    /// Whether every file is present and verified.
    #[must_use]
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Verify a cached snapshot with no network: every file `wanted` (default: the files our last
/// fetch recorded for this commit, plus whatever the snapshot directory holds) must be present
/// and its blob must hash to its name (sha256 or git sha1 ETag), match the recorded size and
/// sha256, and pass the safetensors check. Works on caches written by `huggingface_hub` too.
/// Stamps are refreshed for good blobs and removed for bad ones, so a normal fetch re-fetches them.
///
/// `revision` is a commit or a branch recorded under `refs/`.
///
/// # Errors
/// [`VerifyError::NoSnapshot`] when the snapshot (or the branch ref) is not in the cache; every
/// per-file problem is returned in [`VerifyReport::problems`] instead.
pub fn verify_snapshot(
    cache: &HfCache,
    repo: &str,
    revision: &str,
    wanted: Option<&[String]>,
) -> Result<VerifyReport, VerifyError> {
    let commit = if crate::commit::is_commit_id(revision) {
        revision.to_owned()
    } else {
        cache
            .read_ref(repo, revision)
            .ok()
            .flatten()
            .ok_or_else(|| VerifyError::NoSnapshot {
                repo: repo.to_owned(),
                revision: revision.to_owned(),
                path: cache.ref_path(repo, revision),
            })?
    };
    let snap = cache.snapshot_dir(repo, &commit);
    if !snap.is_dir() {
        return Err(VerifyError::NoSnapshot {
            repo: repo.to_owned(),
            revision: revision.to_owned(),
            path: snap,
        });
    }
    let manifest: Vec<ManifestEntry> = crate::safe_fs::read_capped(
        &manifest_path(cache, repo, &commit),
        crate::safe_fs::JSON_CAP,
    )
    .ok()
    .and_then(|b| serde_json::from_slice(&b).ok())
    .unwrap_or_default();
    // huggingface_hub >= 2 caches the Hub's listing in `trees/<commit>.json`: use its sizes and
    // hashes for files our own manifest does not cover (a cache written by the Python client).
    let python_tree = read_python_tree(&cache.repo_dir(repo), &commit);
    let mut files: Vec<String> = match wanted {
        Some(w) => w.to_vec(),
        None => {
            let mut f: Vec<String> = manifest.iter().map(|m| m.path.clone()).collect();
            list_snapshot(&snap, &snap, &mut f);
            f
        }
    };
    files.sort();
    files.dedup();
    let mut report = VerifyReport {
        repo: repo.to_owned(),
        commit: commit.clone(),
        verified: Vec::new(),
        problems: Vec::new(),
    };
    for file in files {
        let missing = || VerifyError::Missing {
            repo: repo.to_owned(),
            revision: commit.clone(),
            file: file.clone(),
        };
        let Ok(path) = cache.snapshot_path(repo, &commit, &file) else {
            report.problems.push(missing());
            continue;
        };
        if !path.is_file() {
            report.problems.push(missing());
            continue;
        }
        let etag = HfCache::linked_etag(&path);
        let mut exp = etag.as_deref().map(Expected::from_etag).unwrap_or_default();
        if let Some(m) = manifest.iter().find(|m| m.path == file) {
            exp.size = m.expected.size.or(exp.size);
            exp.sha256 = m.expected.sha256.clone().or(exp.sha256);
        } else if let Some(t) = python_tree.get(&file) {
            exp.size = Some(t.size);
            match &t.lfs_sha256 {
                Some(sha) => exp.sha256 = Some(sha.to_ascii_lowercase()),
                None => exp.git_sha1 = Some(t.blob_id.to_ascii_lowercase()),
            }
        }
        match verify_file(&path, &file, &exp) {
            Ok(()) => {
                if let Some(e) = &etag {
                    write_stamp(cache, repo, e);
                }
                report.verified.push(file);
            }
            Err(e) => {
                if let Some(t) = &etag {
                    remove_stamp(cache, repo, t);
                }
                report.problems.push(e);
            }
        }
    }
    Ok(report)
}

/// The paths our manifest of `repo@commit` records.
pub(crate) fn manifest_paths(cache: &HfCache, repo: &str, commit: &str) -> Vec<String> {
    crate::safe_fs::read_capped(
        &manifest_path(cache, repo, commit),
        crate::safe_fs::JSON_CAP,
    )
    .ok()
    .and_then(|b| serde_json::from_slice::<Vec<ManifestEntry>>(&b).ok())
    .unwrap_or_default()
    .into_iter()
    .map(|m| m.path)
    .collect()
}

/// The paths `huggingface_hub`'s cached listing of `repo@commit` names.
pub(crate) fn python_tree_paths(cache: &HfCache, repo: &str, commit: &str) -> Vec<String> {
    read_python_tree(&cache.repo_dir(repo), commit)
        .into_keys()
        .collect()
}

/// Every file below a snapshot directory, relative to it.
pub(crate) fn snapshot_files(snap: &Path) -> Vec<String> {
    let mut out = Vec::new();
    list_snapshot(snap, snap, &mut out);
    out
}

#[derive(Deserialize)]
struct PyTreeEntry {
    size: u64,
    blob_id: String,
    lfs_sha256: Option<String>,
}

#[derive(Deserialize)]
struct PyTree {
    format_version: u32,
    files: std::collections::BTreeMap<String, PyTreeEntry>,
}

fn read_python_tree(
    repo_dir: &Path,
    commit: &str,
) -> std::collections::BTreeMap<String, PyTreeEntry> {
    crate::safe_fs::read_capped(
        &repo_dir.join("trees").join(format!("{commit}.json")),
        crate::safe_fs::JSON_CAP,
    )
    .ok()
    .and_then(|b| serde_json::from_slice::<PyTree>(&b).ok())
    .filter(|t| t.format_version == 1)
    .map(|t| t.files)
    .unwrap_or_default()
}

fn list_snapshot(root: &Path, dir: &Path, out: &mut Vec<String>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() && !p.is_symlink() {
            list_snapshot(root, &p, out);
        } else if let Ok(rel) = p.strip_prefix(root) {
            let rel = rel.to_string_lossy().replace('\\', "/");
            if !rel
                .rsplit('/')
                .next()
                .is_some_and(|n| n.starts_with('.') && n.ends_with(".sd-tmp"))
            {
                out.push(rel);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_tree_listing_adds_expectations() {
        let d = tempfile::tempdir().unwrap();
        let cache = HfCache::new(d.path());
        let (repo, commit) = ("o/n", "0123456789012345678901234567890123456789");
        std::fs::create_dir_all(cache.blob_path(repo, "x").parent().unwrap()).unwrap();
        // A blob whose name is no hash we know (as with an unusual mirror): only the Python
        // tree listing can tell its size is wrong.
        std::fs::write(cache.blob_path(repo, "opaque-etag"), b"12345").unwrap();
        cache
            .link_snapshot(repo, commit, "a.txt", "opaque-etag")
            .unwrap();
        assert!(verify_snapshot(&cache, repo, commit, None).unwrap().is_ok());
        let trees = cache.repo_dir(repo).join("trees");
        std::fs::create_dir_all(&trees).unwrap();
        std::fs::write(
            trees.join(format!("{commit}.json")),
            r#"{"format_version":1,"files":{"a.txt":{"size":6,"blob_id":"00"}}}"#,
        )
        .unwrap();
        let r = verify_snapshot(&cache, repo, commit, None).unwrap();
        assert!(
            matches!(
                r.problems.as_slice(),
                [VerifyError::Size { expected: 6, .. }]
            ),
            "{:?}",
            r.problems
        );
    }
}
