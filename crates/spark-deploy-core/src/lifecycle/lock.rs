//! One `up`, `down` or `restart` at a time per deployment: an advisory lock on a file in the
//! head's state directory, released when the holder exits (even if it crashes).

use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};

/// Errors of taking the lock.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another run holds it.
    #[error(
        "another spark-deploy run holds {path}; remedy: wait for it to finish (only one up/down/restart at a time)"
    )]
    Held {
        /// The lock file.
        path: PathBuf,
    },
    /// The lock file could not be opened.
    #[error("cannot open the lock file {path}: {source}")]
    Io {
        /// The lock file.
        path: PathBuf,
        /// Underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// A held lock; released on drop.
#[derive(Debug)]
pub struct DeploymentLock {
    _file: File,
}

impl DeploymentLock {
    /// Takes the lock `<state_dir>/deploy.lock` without waiting.
    ///
    /// # Errors
    ///
    /// [`LockError::Held`] when another process holds it.
    pub fn acquire(state_dir: &Path) -> Result<Self, LockError> {
        let path = state_dir.join("deploy.lock");
        let io = |source| LockError::Io {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(state_dir).map_err(io)?;
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io)?;
        match file.try_lock() {
            Ok(()) => Ok(Self { _file: file }),
            Err(TryLockError::WouldBlock) => Err(LockError::Held { path }),
            Err(TryLockError::Error(e)) => Err(io(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_until_the_first_drops() {
        let d = tempfile::tempdir().unwrap();
        let first = DeploymentLock::acquire(d.path()).unwrap();
        assert!(matches!(
            DeploymentLock::acquire(d.path()),
            Err(LockError::Held { .. })
        ));
        drop(first);
        assert!(DeploymentLock::acquire(d.path()).is_ok());
    }
}
