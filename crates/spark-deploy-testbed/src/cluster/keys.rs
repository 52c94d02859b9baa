//! SSH keys of the testbed: one client key (the head's identity) and one host key per worker,
//! generated with `ssh-keygen` for every `up`, plus the known_hosts file the tool uses.

use std::io;
use std::net::Ipv4Addr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Errors of key generation.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// `ssh-keygen` could not be run.
    #[error(
        "cannot run ssh-keygen: {source} \
         (remedy: install the OpenSSH client, e.g. `apt-get install -y openssh-client`)"
    )]
    Spawn {
        /// Underlying error.
        #[source]
        source: io::Error,
    },
    /// `ssh-keygen` failed.
    #[error("ssh-keygen failed for {path}: {stderr}")]
    Keygen {
        /// The key being generated.
        path: PathBuf,
        /// Its stderr.
        stderr: String,
    },
    /// A key file could not be read or written.
    #[error("cannot {op} {path}: {source}")]
    File {
        /// `read`, `write`, `remove`.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// Underlying error.
        #[source]
        source: io::Error,
    },
}

/// A private key and its `.pub` next to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPair {
    /// Private key (mode 0600).
    pub private: PathBuf,
    /// Public key (`<private>.pub`).
    pub public: PathBuf,
}

impl KeyPair {
    /// The public key line (`ssh-ed25519 AAAA... comment`).
    ///
    /// # Errors
    ///
    /// [`KeyError::File`] when the `.pub` cannot be read.
    pub fn public_line(&self) -> Result<String, KeyError> {
        std::fs::read_to_string(&self.public)
            .map(|s| s.trim().to_owned())
            .map_err(|source| KeyError::File {
                op: "read",
                path: self.public.clone(),
                source,
            })
    }
}

/// Generates a fresh ed25519 key at `private` (replacing any old one), with `comment`.
///
/// # Errors
///
/// [`KeyError::Spawn`] or [`KeyError::Keygen`].
pub async fn generate(private: &Path, comment: &str) -> Result<KeyPair, KeyError> {
    let public = pub_path(private);
    for p in [private, public.as_path()] {
        match std::fs::remove_file(p) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(KeyError::File {
                    op: "remove",
                    path: p.to_owned(),
                    source,
                });
            }
        }
    }
    let out = tokio::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", comment, "-f"])
        .arg(private)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .map_err(|source| KeyError::Spawn { source })?;
    if !out.status.success() {
        return Err(KeyError::Keygen {
            path: private.to_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    std::fs::set_permissions(private, std::fs::Permissions::from_mode(0o600)).map_err(
        |source| KeyError::File {
            op: "write",
            path: private.to_owned(),
            source,
        },
    )?;
    Ok(KeyPair {
        private: private.to_owned(),
        public,
    })
}

/// The known_hosts line for a host key served at `addr:port`.
pub fn known_hosts_line(addr: Ipv4Addr, port: u16, host_public_line: &str) -> String {
    // Drop the comment: "type base64 [comment]".
    let key: Vec<&str> = host_public_line.split_whitespace().take(2).collect();
    let key = key.join(" ");
    if port == 22 {
        format!("{addr} {key}")
    } else {
        format!("[{addr}]:{port} {key}")
    }
}

fn pub_path(private: &Path) -> PathBuf {
    let mut s = private.as_os_str().to_owned();
    s.push(".pub");
    PathBuf::from(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_hosts_lines() {
        let l = "ssh-ed25519 AAAAC3Nz host@x";
        assert_eq!(
            known_hosts_line(Ipv4Addr::new(198, 18, 1, 2), 22, l),
            "198.18.1.2 ssh-ed25519 AAAAC3Nz"
        );
        assert_eq!(
            known_hosts_line(Ipv4Addr::new(198, 18, 1, 2), 2222, l),
            "[198.18.1.2]:2222 ssh-ed25519 AAAAC3Nz"
        );
    }

    #[tokio::test]
    async fn generates_a_pair() {
        let d = tempfile::tempdir().unwrap();
        let k = generate(&d.path().join("id"), "t").await.unwrap();
        assert!(k.public_line().unwrap().starts_with("ssh-ed25519 "));
        let mode = std::fs::metadata(&k.private).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        // Regenerating replaces the key.
        let before = k.public_line().unwrap();
        let k2 = generate(&k.private, "t").await.unwrap();
        assert_ne!(before, k2.public_line().unwrap());
    }
}
