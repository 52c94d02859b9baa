//! The API key of a deployment: generated on first `up`, stored mode 0600 as a `label: key` line
//! (the engine's `--api-key-file` format), mounted read-only into rank 0, never passed in argv.
//!
//! `serving.auth = "none"` serves without a key: rank 0 gets no key file and clients send none.
//! `SPARK_DEPLOY_API_KEY` gives the key: it is written when the file is absent, and a file that
//! holds a different key is an error (never silently one or the other).

use std::io::Read as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use crate::config::ApiAuth;
use crate::config::schema::ServingSection;
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
    /// `SPARK_DEPLOY_API_KEY` and the key file disagree.
    #[error(
        "SPARK_DEPLOY_API_KEY differs from the key in {path}; remedy: unset SPARK_DEPLOY_API_KEY \
         to keep the deployment's key, or delete {path} and run `spark-deploy restart` to make the \
         variable's key the deployment's"
    )]
    Mismatch {
        /// The file.
        path: PathBuf,
    },
    /// The deployment serves without a key.
    #[error(
        "serving.auth = \"none\": the API takes no key; remedy: set serving.auth = \"key\" and run \
         `spark-deploy restart` to require one"
    )]
    NoAuth,
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
    // One open, checked on the descriptor: a FIFO or a device is refused without blocking, and
    // the mode checked is the mode of the file read.
    let file = crate::safe_fs::open_regular(path).map_err(io(path))?;
    let meta = file.metadata().map_err(io(path))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(ApiKeyError::Permissions {
            path: path.to_owned(),
            mode,
        });
    }
    let mut text = String::new();
    file.take(64 * 1024)
        .read_to_string(&mut text)
        .map_err(io(path))?;
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

/// Reads the key of `path` and checks it against `given` (from `SPARK_DEPLOY_API_KEY`).
fn read_matching(path: &Path, given: Option<&Secret>) -> Result<Secret, ApiKeyError> {
    let key = read(path)?;
    match given {
        Some(g) if *g != key => Err(ApiKeyError::Mismatch {
            path: path.to_owned(),
        }),
        _ => Ok(key),
    }
}

/// Returns the key in `path`, generating one (32 random bytes, hex) when the file is absent.
/// `given` (from `SPARK_DEPLOY_API_KEY`) is written instead of a random key when the file is absent.
///
/// # Errors
///
/// [`ApiKeyError`] on I/O failures, a bad existing file, or an existing file holding a key other
/// than `given` ([`ApiKeyError::Mismatch`]).
pub fn ensure(path: &Path, given: Option<&Secret>) -> Result<Secret, ApiKeyError> {
    if path.exists() {
        return read_matching(path, given);
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
    // Exclusive, mode 0600 from the start, never through a symlink planted at the partial.
    crate::safe_fs::write_atomic(
        &tmp,
        path,
        format!("{LABEL}: {}\n", key.expose()).as_bytes(),
        0o600,
    )
    .map_err(io(path))?;
    Ok(key)
}

/// The key rank 0 is launched with: created on the first launch (see [`ensure`]); `None` with
/// `serving.auth = "none"`, when rank 0 gets no key file.
///
/// # Errors
///
/// As [`ensure`].
pub fn for_launch(serving: &ServingSection) -> Result<Option<Secret>, ApiKeyError> {
    match serving.auth {
        ApiAuth::None => Ok(None),
        ApiAuth::Key => {
            ensure(Path::new(&serving.api_key_file), serving.api_key.as_ref()).map(Some)
        }
    }
}

/// The key of the running deployment, as `spark-deploy api-key` prints it.
///
/// # Errors
///
/// [`ApiKeyError::NoAuth`] with `serving.auth = "none"`; as [`read`]; [`ApiKeyError::Mismatch`]
/// when `SPARK_DEPLOY_API_KEY` holds another key.
pub fn current(serving: &ServingSection) -> Result<Secret, ApiKeyError> {
    match serving.auth {
        ApiAuth::None => Err(ApiKeyError::NoAuth),
        ApiAuth::Key => read_matching(Path::new(&serving.api_key_file), serving.api_key.as_ref()),
    }
}

/// The key a client of the API sends: `None` with `serving.auth = "none"`.
///
/// # Errors
///
/// As [`current`], except that no key is not an error.
pub fn client_key(serving: &ServingSection) -> Result<Option<Secret>, ApiKeyError> {
    match current(serving) {
        Err(ApiKeyError::NoAuth) => Ok(None),
        other => other.map(Some),
    }
}

/// Adds the bearer token to a request when there is a key.
pub fn authorize(
    request: reqwest::RequestBuilder,
    key: Option<&Secret>,
) -> reqwest::RequestBuilder {
    match key {
        Some(k) => request.bearer_auth(k.expose()),
        None => request,
    }
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

    #[test]
    fn a_planted_partial_symlink_and_a_fifo_key_file_are_harmless() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("api-key");
        let victim = d.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        std::os::unix::fs::symlink(&victim, d.path().join("api-key.partial")).unwrap();
        let k = ensure(&p, None).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert_eq!(read(&p).unwrap(), k);
        let fifo = d.path().join("fifo-key");
        let st = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(st.success());
        let e = read(&fifo).unwrap_err();
        assert!(e.to_string().contains("FIFO"), "{e}");
    }

    #[test]
    fn the_variable_and_the_file_never_disagree_silently() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("api-key");
        let mine = Secret::new("sk-from-the-environment");
        assert_eq!(
            ensure(&p, Some(&mine)).unwrap(),
            mine,
            "written when absent"
        );
        assert_eq!(
            ensure(&p, Some(&mine)).unwrap(),
            mine,
            "the same key agrees"
        );
        assert_eq!(
            ensure(&p, None).unwrap(),
            mine,
            "no variable: the file's key"
        );
        let other = Secret::new("sk-another");
        let e = ensure(&p, Some(&other)).unwrap_err();
        assert!(matches!(e, ApiKeyError::Mismatch { .. }), "{e}");
        let text = e.to_string();
        assert!(
            text.contains("remedy") && !text.contains("sk-"),
            "no key in errors: {text}"
        );
        assert_eq!(read(&p).unwrap(), mine, "the file is left as it was");
    }

    #[test]
    fn no_auth_means_no_key_anywhere() {
        let d = tempfile::tempdir().unwrap();
        let serving = ServingSection {
            auth: ApiAuth::None,
            api_key_file: d.path().join("api-key").display().to_string(),
            ..ServingSection::default()
        };
        assert_eq!(for_launch(&serving).unwrap(), None);
        assert!(!d.path().join("api-key").exists(), "no file is created");
        assert_eq!(client_key(&serving).unwrap(), None);
        assert!(matches!(current(&serving), Err(ApiKeyError::NoAuth)));
        let keyed = ServingSection {
            auth: ApiAuth::Key,
            ..serving
        };
        let k = for_launch(&keyed).unwrap().unwrap();
        assert_eq!(client_key(&keyed).unwrap(), Some(k.clone()));
        assert_eq!(current(&keyed).unwrap(), k);
    }
}
