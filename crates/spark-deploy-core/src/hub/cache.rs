//! The standard Hugging Face cache layout, shared with `huggingface_hub` and `hf-hub`.
//!
//! ```text
//! <cache>/models--{owner}--{name}/
//!     blobs/<etag>                 file contents, named by ETag (sha256 for LFS files, git sha1 otherwise)
//!     blobs/<etag>.incomplete      a download in progress (the name the Python client uses)
//!     snapshots/<commit>/<path>    relative symlink -> ../../blobs/<etag> (one more ../ per directory)
//!     refs/<branch>                the commit a branch resolved to (no trailing newline)
//!     .sd-verified/<etag>          our "verified" stamp (size + mtime of the blob when verified)
//!     .sd-verified/<commit>.json   our manifest of a fetched snapshot (paths, ETags, sizes, sha256)
//! ```
//! `.sd-verified` lives inside the repo folder: `huggingface_hub`'s `scan_cache_dir` ignores
//! unknown folders there (it reports unknown entries at the cache root as corrupted repos), and
//! deleting a repo from the cache (`hf cache delete`) removes our stamps with it.

use std::path::{Component, Path, PathBuf};

/// Errors of cache operations.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// A repository-relative path from the Hub would escape the snapshot directory.
    #[error(
        "unsafe file path `{}` in repository {repo}: it would leave the snapshot directory; the repository cannot be fetched as is",
        path.escape_debug()
    )]
    UnsafePath {
        /// Repository id.
        repo: String,
        /// The offending path.
        path: String,
    },
    /// A file-system operation on the cache failed.
    #[error("cache I/O failed on {path}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CacheError + '_ {
    move |source| CacheError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A Hugging Face hub cache directory (the one holding `models--…` folders).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HfCache {
    root: PathBuf,
}

impl HfCache {
    /// A cache rooted at `root` (e.g. `$HF_HOME/hub`).
    #[must_use]
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The cache directory.
    #[must_use]
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `models--{owner}--{name}` for `owner/name`.
    #[must_use]
    pub fn repo_folder(repo: &str) -> String {
        format!("models--{}", repo.replace('/', "--"))
    }

    /// `<cache>/models--{owner}--{name}`.
    #[must_use]
    pub fn repo_dir(&self, repo: &str) -> PathBuf {
        self.root.join(Self::repo_folder(repo))
    }

    /// `…/blobs/<etag>`.
    #[must_use]
    pub fn blob_path(&self, repo: &str, etag: &str) -> PathBuf {
        self.repo_dir(repo).join("blobs").join(etag)
    }

    /// `…/blobs/<etag>.incomplete`.
    #[must_use]
    pub fn incomplete_path(&self, repo: &str, etag: &str) -> PathBuf {
        self.repo_dir(repo)
            .join("blobs")
            .join(format!("{etag}.incomplete"))
    }

    /// `…/snapshots/<commit>`.
    #[must_use]
    pub fn snapshot_dir(&self, repo: &str, commit: &str) -> PathBuf {
        self.repo_dir(repo).join("snapshots").join(commit)
    }

    /// `…/snapshots/<commit>/<file>`.
    ///
    /// # Errors
    /// [`CacheError::UnsafePath`] if `file` is absolute or contains `..`.
    pub fn snapshot_path(
        &self,
        repo: &str,
        commit: &str,
        file: &str,
    ) -> Result<PathBuf, CacheError> {
        check_rel(repo, file)?;
        Ok(self.snapshot_dir(repo, commit).join(file))
    }

    /// `…/refs/<branch>`.
    #[must_use]
    pub fn ref_path(&self, repo: &str, branch: &str) -> PathBuf {
        self.repo_dir(repo).join("refs").join(branch)
    }

    /// The commit recorded for a branch, if any.
    ///
    /// # Errors
    /// [`CacheError::Io`] if the ref exists but cannot be read.
    pub fn read_ref(&self, repo: &str, branch: &str) -> Result<Option<String>, CacheError> {
        let p = self.ref_path(repo, branch);
        refuse_bad_ref(&p, branch)?;
        match crate::safe_fs::read_to_string_capped(&p, 4096) {
            Ok(s) => Ok(Some(s.trim().to_owned())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io(&p)(e)),
        }
    }

    /// Record `commit` for `branch` (atomically, no trailing newline, as the Python client does).
    ///
    /// # Errors
    /// [`CacheError::Io`] on a file-system failure.
    pub fn write_ref(&self, repo: &str, branch: &str, commit: &str) -> Result<(), CacheError> {
        let p = self.ref_path(repo, branch);
        refuse_bad_ref(&p, branch)?;
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        let tmp = p.with_extension("sd-tmp");
        crate::safe_fs::write_exclusive(&tmp, commit).map_err(io(&tmp))?;
        std::fs::rename(&tmp, &p).map_err(io(&p))
    }

    /// Point `snapshots/<commit>/<file>` at `blobs/<etag>` with a relative symlink
    /// (replacing whatever was there).
    ///
    /// # Errors
    /// [`CacheError::UnsafePath`] for a bad `file`, [`CacheError::Io`] on a file-system failure.
    pub fn link_snapshot(
        &self,
        repo: &str,
        commit: &str,
        file: &str,
        etag: &str,
    ) -> Result<PathBuf, CacheError> {
        let link = self.snapshot_path(repo, commit, file)?;
        let depth = file.split('/').count() - 1;
        let mut target = PathBuf::from("../..");
        for _ in 0..depth {
            target.push("..");
        }
        target.push("blobs");
        target.push(etag);
        if let Some(parent) = link.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        if std::fs::read_link(&link).is_ok_and(|t| t == target) {
            return Ok(link);
        }
        let tmp = link.with_file_name(format!(
            ".{}.sd-tmp",
            link.file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
        ));
        let _ = std::fs::remove_file(&tmp);
        symlink(&target, &tmp).map_err(io(&tmp))?;
        std::fs::rename(&tmp, &link).map_err(io(&link))?;
        Ok(link)
    }

    /// The blob name (ETag) a snapshot entry points to, if it is a symlink into `blobs/`.
    #[must_use]
    pub fn linked_etag(path: &Path) -> Option<String> {
        let t = std::fs::read_link(path).ok()?;
        let parent = t.parent()?.file_name()?;
        (parent == "blobs").then(|| t.file_name().map(|n| n.to_string_lossy().into_owned()))?
    }

    /// `<cache>/models--{owner}--{name}/.sd-verified`.
    #[must_use]
    pub fn stamp_dir(&self, repo: &str) -> PathBuf {
        self.repo_dir(repo).join(".sd-verified")
    }
}

#[cfg(unix)]
fn symlink(target: &Path, link: &Path) -> std::io::Result<()> {
    std::os::unix::fs::symlink(target, link)
}

#[cfg(not(unix))]
fn symlink(_target: &Path, _link: &Path) -> std::io::Result<()> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "snapshot symlinks need a unix file system",
    ))
}

pub(crate) fn check_rel(repo: &str, file: &str) -> Result<(), CacheError> {
    let p = Path::new(file);
    let ok = !file.is_empty()
        && !file.contains('\\')
        && p.components().all(|c| matches!(c, Component::Normal(_)));
    if ok {
        Ok(())
    } else {
        Err(CacheError::UnsafePath {
            repo: repo.to_owned(),
            path: file.to_owned(),
        })
    }
}

/// A branch name that could leave `refs/` (`..`, a leading `/`) is never joined into a path that
/// is read or written (the config refuses it first; this holds for every other caller).
fn refuse_bad_ref(p: &Path, branch: &str) -> Result<(), CacheError> {
    crate::commit::check_ref_name(branch).map_err(|why| {
        io(p)(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{branch:?} is not a ref name: it {why}"),
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refs_never_leave_the_cache_nor_write_through_a_planted_symlink() {
        let d = tempfile::tempdir().unwrap();
        let c = HfCache::new(d.path().join("hub"));
        let repo = "org/name";
        assert!(c.write_ref(repo, "../../../escape", "c0").is_err());
        assert!(c.read_ref(repo, "/etc/passwd").is_err());
        assert!(!d.path().join("escape").exists());
        let victim = d.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let tmp = c.ref_path(repo, "main").with_extension("sd-tmp");
        std::fs::create_dir_all(tmp.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(&victim, &tmp).unwrap();
        c.write_ref(repo, "main", "c1").unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert_eq!(c.read_ref(repo, "main").unwrap().as_deref(), Some("c1"));
    }

    #[test]
    fn layout_and_links() {
        let d = tempfile::tempdir().unwrap();
        let c = HfCache::new(d.path());
        let repo = "org/name";
        assert_eq!(
            c.blob_path(repo, "abc"),
            d.path().join("models--org--name/blobs/abc")
        );
        std::fs::create_dir_all(c.blob_path(repo, "x").parent().unwrap()).unwrap();
        std::fs::write(c.blob_path(repo, "e1"), b"hi").unwrap();
        let l = c.link_snapshot(repo, "c0", "a/b/f.bin", "e1").unwrap();
        assert_eq!(
            std::fs::read_link(&l).unwrap(),
            PathBuf::from("../../../../blobs/e1")
        );
        assert_eq!(std::fs::read(&l).unwrap(), b"hi");
        assert_eq!(HfCache::linked_etag(&l).as_deref(), Some("e1"));
        let l2 = c.link_snapshot(repo, "c0", "top.json", "e1").unwrap();
        assert_eq!(
            std::fs::read_link(&l2).unwrap(),
            PathBuf::from("../../blobs/e1")
        );
        c.write_ref(repo, "main", "c0").unwrap();
        assert_eq!(c.read_ref(repo, "main").unwrap().as_deref(), Some("c0"));
        assert!(c.read_ref(repo, "dev").unwrap().is_none());
        assert!(c.snapshot_path(repo, "c0", "../x").is_err());
        assert!(c.snapshot_path(repo, "c0", "/etc/x").is_err());
    }
}
