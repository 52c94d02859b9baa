//! The Hub access token: where it comes from, and a wrapper that never prints it.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::config::schema::HubSection;

/// A Hugging Face access token. `Debug` and `Display` print `***`; only
/// [`HfToken::expose`] gives the secret, for building the `Authorization` header.
#[derive(Clone, PartialEq, Eq)]
pub struct HfToken(String);

impl HfToken {
    /// Wrap a token, cleaned as `huggingface_hub` cleans it (line breaks removed, surrounding
    /// whitespace trimmed).
    #[must_use]
    pub fn new(token: impl Into<String>) -> Self {
        Self(crate::config::hf_env::clean_token(&token.into()).unwrap_or_default())
    }

    /// The secret itself. Use only to build a request header; never log it.
    #[must_use]
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The token the standard tools would use, looked up as `huggingface_hub` does:
    /// env `HF_TOKEN` (then its legacy name `HUGGING_FACE_HUB_TOKEN`), then the file named by
    /// env `HF_TOKEN_PATH`, then `$HF_HOME/token`
    /// (the file `hf auth login` writes; `HF_HOME` defaults to `$XDG_CACHE_HOME/huggingface`,
    /// then `~/.cache/huggingface`). Empty values count as absent; a non-empty
    /// `HF_HUB_DISABLE_IMPLICIT_TOKEN` disables the lookup, as in both Hub clients.
    #[must_use]
    pub fn from_env() -> Option<Self> {
        if std::env::var_os("HF_HUB_DISABLE_IMPLICIT_TOKEN").is_some_and(|v| !v.is_empty()) {
            return None;
        }
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        if let Some(t) = env("HF_TOKEN").or_else(|| env("HUGGING_FACE_HUB_TOKEN")) {
            return Some(Self::new(t));
        }
        let path = env("HF_TOKEN_PATH")
            .map(PathBuf::from)
            .unwrap_or_else(|| hf_home().join("token"));
        Self::from_file(&path)
    }

    /// Read a token file (as written by `hf auth login`). `None` if absent or empty.
    #[must_use]
    pub fn from_file(path: &Path) -> Option<Self> {
        let s = crate::safe_fs::read_to_string_capped(path, 64 * 1024).ok()?;
        crate::config::hf_env::clean_token(&s).map(Self)
    }

    /// The token of a deployment's `[hub]` and where it comes from: `HF_TOKEN` (already in
    /// [`HubSection::token`]), else the token file. The source never holds the token.
    #[must_use]
    pub fn configured(hub: &HubSection) -> (Option<Self>, TokenSource) {
        if let Some(t) = &hub.token {
            return (Some(Self::new(t.expose())), TokenSource::Environment);
        }
        let path = hub.token_file.clone();
        match Self::from_file(Path::new(&path)) {
            Some(t) => (Some(t), TokenSource::File { path }),
            None => (None, TokenSource::Absent { looked_in: path }),
        }
    }
}

/// Where a deployment's Hub token comes from (`config check`); never the token itself.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "from", rename_all = "snake_case")]
pub enum TokenSource {
    /// `HF_TOKEN` (or `HUGGING_FACE_HUB_TOKEN`) in the environment.
    Environment,
    /// The token file.
    File {
        /// Its path.
        path: String,
    },
    /// No token: no variable, and the token file is absent or empty.
    Absent {
        /// The token file looked at.
        looked_in: String,
    },
}

impl fmt::Debug for HfToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("HfToken(***)")
    }
}

impl fmt::Display for HfToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// `$HF_HOME`, else `$XDG_CACHE_HOME/huggingface`, else `~/.cache/huggingface`.
#[must_use]
pub fn hf_home() -> PathBuf {
    if let Some(h) = std::env::var_os("HF_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(h);
    }
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(x).join("huggingface");
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
    home.join(".cache").join("huggingface")
}

/// The hub cache directory the standard tools use: `$HF_HUB_CACHE`, else
/// `$HUGGINGFACE_HUB_CACHE`, else `$HF_HOME/hub`.
#[must_use]
pub fn default_cache_dir() -> PathBuf {
    for k in ["HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"] {
        if let Some(v) = std::env::var_os(k).filter(|v| !v.is_empty()) {
            return PathBuf::from(v);
        }
    }
    hf_home().join("hub")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_never_prints() {
        let t = HfToken::new(" hf_secret_value \n");
        assert_eq!(t.expose(), "hf_secret_value");
        assert_eq!(format!("{t}"), "***");
        assert_eq!(format!("{t:?}"), "HfToken(***)");
        assert!(!format!("{:?}", Some(t)).contains("secret"));
    }

    #[test]
    fn token_file() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("token");
        assert!(HfToken::from_file(&p).is_none());
        std::fs::write(&p, "hf_abc\n").unwrap();
        assert_eq!(HfToken::from_file(&p).unwrap().expose(), "hf_abc");
        std::fs::write(&p, "  \n").unwrap();
        assert!(HfToken::from_file(&p).is_none());
    }
}
