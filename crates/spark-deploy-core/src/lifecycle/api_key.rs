//! The API key of a deployment: generated on first `up`, stored mode 0600 as a `label: key` line
//! (the engine's `--api-key-file` format), mounted read-only into rank 0, never passed in argv.

use std::io::{Read as _, Write as _};
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use crate::secret::Secret;

/// The label spark-deploy writes before its key.
pub const LABEL: &str = "spark-deploy";

/// Errors of reading or creating the key file.
#[derive(Debug, thiserror::Error)]
pub enum ApiKeyError {
    /// The file could not be read or written.
    #[error("API key file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is readable by others.
    #[error("API key file {path} has mode {mode:o}; remedy: chmod 600 {path}")]
    Permissions {
        /// The file.
        path: PathBuf,
        /// Its mode bits.
        mode: u32,
    },
    /// The file has no `label: key` line.
    #[error(
        "API key file {path} holds no `label: key` line; remedy: delete it to generate a new key"
    )]
    Empty {
        /// The file.
        path: PathBuf,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ApiKeyError + '_ {
    move |source| ApiKeyError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Reads the first key of `path`.
///
/// # Errors
///
/// [`ApiKeyError`] when unreadable, group/world-accessible or empty.
pub fn read(path: &Path) -> Result<Secret, ApiKeyError> {
    let meta = std::fs::metadata(path).map_err(io(path))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(ApiKeyError::Permissions {
            path: path.to_owned(),
            mode,
        });
    }
    let text = std::fs::read_to_string(path).map_err(io(path))?;
    text.lines()
        .find_map(|l| {
            l.split_once(':')
                .map(|(_, k)| k.trim())
                .filter(|k| !k.is_empty())
                .map(Secret::new)
        })
        .ok_or_else(|| ApiKeyError::Empty {
            path: path.to_owned(),
        })
}

/// Returns the key in `path`, generating one (32 random bytes, hex) when the file is absent.
/// `given` (from `SPARK_DEPLOY_API_KEY`) is written instead of a random key when the file is absent.
///
/// # Errors
///
/// [`ApiKeyError`] on I/O failures or a bad existing file.
pub fn ensure(path: &Path, given: Option<&Secret>) -> Result<Secret, ApiKeyError> {
    if path.exists() {
        return read(path);
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
    }
    let key = match given {
        Some(k) => k.clone(),
        None => {
            let mut bytes = [0u8; 32];
            std::fs::File::open("/dev/urandom")
                .and_then(|mut f| f.read_exact(&mut bytes))
                .map_err(io(Path::new("/dev/urandom")))?;
            Secret::new(format!("sd-{}", hex::encode(bytes)))
        }
    };
    let tmp = path.with_extension("partial");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io(&tmp))?;
    writeln!(f, "{LABEL}: {}", key.expose())
        .and_then(|()| f.sync_all())
        .map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))?;
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_once_private_and_stable() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("state/api-key");
        let k = ensure(&p, None).unwrap();
        assert!(k.expose().starts_with("sd-") && k.expose().len() == 67);
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(ensure(&p, None).unwrap(), k, "the same key on every up");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(read(&p), Err(ApiKeyError::Permissions { .. })));
    }
}
