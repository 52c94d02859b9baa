//! Repositories on disk and the Hub-style identifiers computed from their content.
//!
//! A repository is a directory `<root>/<owner>/<name>/` holding the files of exactly one commit.
//! Its commit sha is computed deterministically from the file list and the files' git object ids,
//! so the same bytes always give the same revision.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use sha1::Digest as _;

use super::HubServerError;

/// Files larger than this are always LFS-like, as on the Hub (which refuses non-LFS files > 10 MB).
pub const LFS_SIZE_THRESHOLD: u64 = 10 * 1024 * 1024;

/// File extensions that are LFS-tracked regardless of size (the Hub's default `.gitattributes`).
const LFS_EXTENSIONS: &[&str] = &[
    "safetensors",
    "bin",
    "pt",
    "pth",
    "ckpt",
    "gguf",
    "onnx",
    "msgpack",
    "h5",
    "npy",
    "npz",
    "pkl",
    "zip",
    "tar",
    "gz",
    "zst",
    "model",
    "parquet",
    "arrow",
];

/// One file of a repository at its single commit.
#[derive(Debug, Clone)]
pub struct RepoFile {
    /// Repository-relative path with `/` separators.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// Git object id (sha1 of the blob, or of the LFS pointer for LFS-like files).
    pub git_oid: String,
    /// SHA-256 of the content for LFS-like files.
    pub lfs_sha256: Option<String>,
    /// Size of the LFS pointer file, for LFS-like files.
    pub lfs_pointer_size: Option<u64>,
    /// Where the bytes live on disk.
    pub disk_path: PathBuf,
}

impl RepoFile {
    /// The ETag the Hub sends for this file: the sha256 for LFS files, the git blob sha1 otherwise.
    #[must_use]
    pub fn etag(&self) -> &str {
        self.lfs_sha256.as_deref().unwrap_or(&self.git_oid)
    }
}

/// A repository served at one commit.
#[derive(Debug, Clone)]
pub struct Repo {
    /// `owner/name`.
    pub id: String,
    /// 40-hex commit sha, deterministic from the content.
    pub commit: String,
    /// Files sorted by path.
    pub files: BTreeMap<String, RepoFile>,
}

impl Repo {
    /// Scan one repository directory and compute all identifiers.
    ///
    /// # Errors
    /// [`HubServerError::Scan`] when a file cannot be read.
    pub fn scan(id: &str, dir: &Path) -> Result<Self, HubServerError> {
        let mut paths = Vec::new();
        walk(dir, dir, &mut paths).map_err(|source| HubServerError::Scan {
            path: dir.to_path_buf(),
            source,
        })?;
        let mut files = BTreeMap::new();
        for (rel, disk) in paths {
            let file = hash_file(&rel, &disk).map_err(|source| HubServerError::Scan {
                path: disk.clone(),
                source,
            })?;
            files.insert(rel, file);
        }
        let mut h = sha1::Sha1::new();
        h.update(b"spark-deploy-testbed hub commit v1\n");
        for f in files.values() {
            h.update(f.path.as_bytes());
            h.update(b"\0");
            h.update(f.git_oid.as_bytes());
            h.update(b"\n");
        }
        let commit = hex::encode(h.finalize());
        Ok(Self {
            id: id.to_owned(),
            commit,
            files,
        })
    }

    /// The directories implied by the file paths (without the root).
    #[must_use]
    pub fn directories(&self) -> Vec<String> {
        let mut dirs = std::collections::BTreeSet::new();
        for p in self.files.keys() {
            let mut acc = String::new();
            let parts: Vec<&str> = p.split('/').collect();
            for part in &parts[..parts.len() - 1] {
                if !acc.is_empty() {
                    acc.push('/');
                }
                acc.push_str(part);
                dirs.insert(acc.clone());
            }
        }
        dirs.into_iter().collect()
    }
}

/// Scan `<root>/<owner>/<name>/` for every repository.
///
/// # Errors
/// [`HubServerError::Scan`] when the tree cannot be read.
pub fn scan_root(root: &Path) -> Result<BTreeMap<String, Repo>, HubServerError> {
    let scan_err = |path: &Path, source| HubServerError::Scan {
        path: path.to_path_buf(),
        source,
    };
    let mut repos = BTreeMap::new();
    for owner in std::fs::read_dir(root).map_err(|e| scan_err(root, e))? {
        let owner = owner.map_err(|e| scan_err(root, e))?;
        if !owner.path().is_dir() || hidden(&owner.file_name()) {
            continue;
        }
        for name in std::fs::read_dir(owner.path()).map_err(|e| scan_err(&owner.path(), e))? {
            let name = name.map_err(|e| scan_err(&owner.path(), e))?;
            if !name.path().is_dir() || hidden(&name.file_name()) {
                continue;
            }
            let id = format!(
                "{}/{}",
                owner.file_name().to_string_lossy(),
                name.file_name().to_string_lossy()
            );
            let repo = Repo::scan(&id, &name.path())?;
            repos.insert(id, repo);
        }
    }
    Ok(repos)
}

fn hidden(name: &std::ffi::OsStr) -> bool {
    name.to_string_lossy().starts_with('.')
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, PathBuf)>) -> std::io::Result<()> {
    let mut entries: Vec<_> = fs_err::read_dir(dir)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(fs_err::DirEntry::file_name);
    for e in entries {
        let p = e.path();
        if e.file_name() == ".git" {
            continue;
        }
        let meta = fs_err::metadata(&p)?;
        if meta.is_dir() {
            walk(root, &p, out)?;
        } else if meta.is_file() {
            let rel = p
                .strip_prefix(root)
                .map_err(std::io::Error::other)?
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join("/");
            out.push((rel, p));
        }
    }
    Ok(())
}

fn is_lfs(path: &str, size: u64) -> bool {
    if size > LFS_SIZE_THRESHOLD {
        return true;
    }
    let ext = path.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase());
    ext.is_some_and(|e| LFS_EXTENSIONS.contains(&e.as_str()))
}

/// Git's object id of a blob: `sha1("blob <len>\0" + content)`.
#[must_use]
pub fn git_blob_sha1(content: &[u8]) -> String {
    let mut h = sha1::Sha1::new();
    h.update(format!("blob {}\0", content.len()).as_bytes());
    h.update(content);
    hex::encode(h.finalize())
}

fn hash_file(rel: &str, disk: &Path) -> std::io::Result<RepoFile> {
    let size = fs_err::metadata(disk)?.len();
    let lfs = is_lfs(rel, size);
    let mut f = fs_err::File::open(disk)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut sha256 = <sha2::Sha256 as sha2::Digest>::new();
    let mut blob = sha1::Sha1::new();
    blob.update(format!("blob {size}\0").as_bytes());
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        if lfs {
            sha2::Digest::update(&mut sha256, &buf[..n]);
        } else {
            blob.update(&buf[..n]);
        }
    }
    if lfs {
        let sha = hex::encode(sha2::Digest::finalize(sha256));
        let pointer =
            format!("version https://git-lfs.github.com/spec/v1\noid sha256:{sha}\nsize {size}\n");
        Ok(RepoFile {
            path: rel.to_owned(),
            size,
            git_oid: git_blob_sha1(pointer.as_bytes()),
            lfs_sha256: Some(sha),
            lfs_pointer_size: Some(pointer.len() as u64),
            disk_path: disk.to_path_buf(),
        })
    } else {
        Ok(RepoFile {
            path: rel.to_owned(),
            size,
            git_oid: hex::encode(blob.finalize()),
            lfs_sha256: None,
            lfs_pointer_size: None,
            disk_path: disk.to_path_buf(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn git_blob_sha1_matches_git() {
        // `printf 'hello\n' | git hash-object --stdin`
        assert_eq!(
            git_blob_sha1(b"hello\n"),
            "ce013625030ba8dba906f756967f9e9ca394464a"
        );
    }

    #[test]
    fn commit_is_deterministic_and_content_dependent() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path().join("o/n");
        std::fs::create_dir_all(r.join("sub")).unwrap();
        std::fs::write(r.join("a.json"), b"{}").unwrap();
        std::fs::write(r.join("sub/w.safetensors"), b"xyz").unwrap();
        let a = Repo::scan("o/n", &r).unwrap();
        let b = Repo::scan("o/n", &r).unwrap();
        assert_eq!(a.commit, b.commit);
        assert_eq!(a.commit.len(), 40);
        assert!(a.files["sub/w.safetensors"].lfs_sha256.is_some());
        assert!(a.files["a.json"].lfs_sha256.is_none());
        assert_eq!(a.directories(), vec!["sub".to_owned()]);
        std::fs::write(r.join("a.json"), b"{ }").unwrap();
        let c = Repo::scan("o/n", &r).unwrap();
        assert_ne!(a.commit, c.commit);
    }
}
