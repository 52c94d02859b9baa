//! Kernel kit verification: every file the kit's `MANIFEST` lists (`sha256sum` format,
//! `<sha256>  <path>` per line) must be present with that sha256.

use std::path::{Path, PathBuf};

/// Why the kit was refused.
#[derive(Debug, thiserror::Error)]
pub enum KitError {
    /// The MANIFEST could not be read.
    #[error("{path}: {source}; download the kit (it ships a MANIFEST)")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A MANIFEST line is not `<sha256>  <path>`.
    #[error("{path} line {line}: {problem}; re-download the kit")]
    Manifest {
        /// The MANIFEST.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        problem: String,
    },
    /// Files are missing or differ.
    #[error("kit {dir}: {} missing, {} differ ({}); re-download the kit, or regenerate the RoPE tables / bias file and compare again", missing.len(), differs.len(), missing.iter().map(|m| format!("MISSING {m}")).chain(differs.iter().map(|d| format!("DIFFERS {d}"))).collect::<Vec<_>>().join(", "))]
    Mismatch {
        /// The kit directory.
        dir: PathBuf,
        /// Paths listed but absent.
        missing: Vec<String>,
        /// Paths whose sha256 differs.
        differs: Vec<String>,
    },
}

use crate::digest::sha256_file;

/// Parses a `sha256sum` file: `(sha256, relative path)` per line (a leading `*` marks binary mode).
///
/// # Errors
/// [`KitError::Manifest`] for a malformed line or an absolute / `..` path.
pub fn parse_manifest(path: &Path, text: &str) -> Result<Vec<(String, String)>, KitError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = |problem: &str| KitError::Manifest {
            path: path.to_path_buf(),
            line: i + 1,
            problem: problem.to_owned(),
        };
        let (hash, rest) = line
            .split_once(' ')
            .ok_or_else(|| bad("no space after the hash"))?;
        if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad("not a sha256 hex digest"));
        }
        let file = rest
            .strip_prefix(' ')
            .or_else(|| rest.strip_prefix('*'))
            .unwrap_or(rest);
        let file = file.strip_prefix("./").unwrap_or(file);
        if file.is_empty() || file.starts_with('/') || file.split('/').any(|c| c == "..") {
            return Err(bad("path is empty, absolute or leaves the kit"));
        }
        out.push((hash.to_ascii_lowercase(), file.to_owned()));
    }
    Ok(out)
}

/// Verifies every `MANIFEST` entry of `kit_dir` (the native `verify_kit.sh`). Returns the number
/// of files checked.
///
/// # Errors
/// An unreadable or malformed MANIFEST, or [`KitError::Mismatch`] listing every missing and
/// differing file.
pub fn verify_kit(kit_dir: &Path) -> Result<usize, KitError> {
    let mpath = kit_dir.join("MANIFEST");
    let text = crate::safe_fs::read_to_string_capped(&mpath, crate::safe_fs::JSON_CAP).map_err(
        |source| KitError::Io {
            path: mpath.clone(),
            source,
        },
    )?;
    let entries = parse_manifest(&mpath, &text)?;
    let (mut missing, mut differs) = (Vec::new(), Vec::new());
    for (hash, file) in &entries {
        match sha256_file(&kit_dir.join(file)) {
            Ok(h) if &h == hash => {}
            Ok(_) => differs.push(file.clone()),
            Err(_) => missing.push(file.clone()),
        }
    }
    if missing.is_empty() && differs.is_empty() {
        Ok(entries.len())
    } else {
        Err(KitError::Mismatch {
            dir: kit_dir.to_path_buf(),
            missing,
            differs,
        })
    }
}

/// Checks one kit file (e.g. a generated `vision/gate_bias_vl.safetensors` or RoPE table)
/// against the kit's `MANIFEST`, when the kit has one. Returns `false` when there is no MANIFEST
/// or it does not list the file (nothing to compare with), `true` when the file matches.
///
/// # Errors
/// A malformed MANIFEST, or [`KitError::Mismatch`] when the file is missing or differs (the fix:
/// use the kit's published file instead of the generated one).
pub fn check_file(kit_dir: &Path, rel: &str) -> Result<bool, KitError> {
    let mpath = kit_dir.join("MANIFEST");
    let Ok(text) = crate::safe_fs::read_to_string_capped(&mpath, crate::safe_fs::JSON_CAP) else {
        return Ok(false);
    };
    let Some((hash, _)) = parse_manifest(&mpath, &text)?
        .into_iter()
        .find(|(_, f)| f == rel)
    else {
        return Ok(false);
    };
    match sha256_file(&kit_dir.join(rel)) {
        Ok(h) if h == hash => Ok(true),
        Ok(_) => Err(KitError::Mismatch {
            dir: kit_dir.to_path_buf(),
            missing: Vec::new(),
            differs: vec![rel.to_owned()],
        }),
        Err(_) => Err(KitError::Mismatch {
            dir: kit_dir.to_path_buf(),
            missing: vec![rel.to_owned()],
            differs: Vec::new(),
        }),
    }
}

/// A `MANIFEST` text for every regular file under `kit_dir` except `MANIFEST` itself, sorted by
/// path (for kits built locally and for tests).
///
/// # Errors
/// I/O errors.
pub fn manifest_for(kit_dir: &Path) -> std::io::Result<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) -> std::io::Result<()> {
        for e in std::fs::read_dir(dir)? {
            let e = e?;
            let p = e.path();
            if e.file_type()?.is_dir() {
                walk(root, &p, out)?;
            } else if e.file_type()?.is_file() {
                let rel = p
                    .strip_prefix(root)
                    .unwrap_or(&p)
                    .to_string_lossy()
                    .into_owned();
                if rel != "MANIFEST" {
                    out.push(rel);
                }
            }
        }
        Ok(())
    }
    let mut files = Vec::new();
    walk(kit_dir, kit_dir, &mut files)?;
    files.sort();
    let mut text = String::new();
    for f in files {
        text.push_str(&sha256_file(&kit_dir.join(&f))?);
        text.push_str("  ");
        text.push_str(&f);
        text.push('\n');
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_round_trip_and_mismatch() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("aot/cubins")).unwrap();
        std::fs::write(d.path().join("rope.json"), "{}").unwrap();
        std::fs::write(d.path().join("aot/cubins/x.cubin"), b"\x7fELF").unwrap();
        let m = manifest_for(d.path()).unwrap();
        std::fs::write(d.path().join("MANIFEST"), &m).unwrap();
        assert_eq!(verify_kit(d.path()).unwrap(), 2);
        std::fs::write(d.path().join("rope.json"), "{ }").unwrap();
        std::fs::remove_file(d.path().join("aot/cubins/x.cubin")).unwrap();
        let e = verify_kit(d.path()).unwrap_err();
        let s = e.to_string();
        assert!(
            s.contains("MISSING aot/cubins/x.cubin") && s.contains("DIFFERS rope.json"),
            "{s}"
        );
        assert!(parse_manifest(Path::new("M"), "abc  x\n").is_err());
        assert!(matches!(
            check_file(d.path(), "rope.json"),
            Err(KitError::Mismatch { .. })
        ));
        assert!(!check_file(d.path(), "not/listed").unwrap());
        assert!(parse_manifest(Path::new("M"), &format!("{}  ../x\n", "0".repeat(64))).is_err());
    }
}
