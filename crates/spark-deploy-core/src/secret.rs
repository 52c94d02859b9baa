//! Secrets (HF token, API key): a type that never prints its value.
//!
//! `Secret` implements `Debug`, `Display` and `Serialize` as `***`, so a secret that ends up in a
//! plan, an event, an error or a log line shows only the marker. The value is reachable only through
//! [`Secret::expose`], which makes every use greppable.

use std::fmt;

/// The marker every rendering of a secret shows instead of its value.
pub const REDACTED: &str = "***";

/// A secret string (token, API key).
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a value.
    #[must_use]
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret value; use only where the value must leave the process (an HTTP header, a 0600
    /// file), never for display.
    #[must_use]
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Replaces every occurrence of this secret in `text` by [`REDACTED`].
    #[must_use]
    pub fn redact_in(&self, text: &str) -> String {
        if self.0.is_empty() {
            text.to_owned()
        } else {
            text.replace(&self.0, REDACTED)
        }
    }

    /// Replaces every occurrence of this secret in `bytes` (any content, UTF-8 or not) by
    /// [`REDACTED`].
    #[must_use]
    pub fn redact_bytes(&self, bytes: &[u8]) -> Vec<u8> {
        let needle = self.0.as_bytes();
        if needle.is_empty() {
            return bytes.to_vec();
        }
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i..].starts_with(needle) {
                out.extend_from_slice(REDACTED.as_bytes());
                i += needle.len();
            } else {
                out.push(bytes[i]);
                i += 1;
            }
        }
        out
    }
}

/// The user-info part of a URL (`user:pass` in `https://user:pass@host/…`), where credentials
/// sit; `None` when the URL has none.
fn userinfo(url: &str) -> Option<(usize, usize)> {
    let start = url.find("://")? + 3;
    let rest = &url[start..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let at = rest[..authority_end].rfind('@')?;
    (at > 0).then_some((start, start + at))
}

/// The credentials embedded in a URL (`user:pass` of `https://user:pass@host/`) as a secret, so
/// they are redacted wherever the HF token and the API key are.
#[must_use]
pub fn url_credentials(url: &str) -> Option<Secret> {
    userinfo(url).map(|(a, b)| Secret::new(&url[a..b]))
}

/// `url` with its embedded credentials shown as [`REDACTED`] (`https://***@host/`).
#[must_use]
pub fn redact_url(url: &str) -> String {
    match userinfo(url) {
        Some((a, b)) => format!("{}{REDACTED}{}", &url[..a], &url[b..]),
        None => url.to_owned(),
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl serde::Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(REDACTED)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_prints_its_value() {
        let s = Secret::new("hf_supersecret");
        assert_eq!(format!("{s} {s:?}"), "*** ***");
        assert_eq!(serde_json::to_string(&s).unwrap(), "\"***\"");
        assert_eq!(s.redact_in("token=hf_supersecret;"), "token=***;");
        assert_eq!(s.expose(), "hf_supersecret");
        assert_eq!(
            s.redact_bytes(b"\xff hf_supersecrethf_supersecret hf_super"),
            b"\xff ****** hf_super"
        );
        assert_eq!(Secret::new("").redact_bytes(b"abc"), b"abc");
    }

    #[test]
    fn url_credentials_are_found_and_redacted() {
        let u = "https://alice:s3cr%40t@hub.example:8443/api?x=a@b";
        assert_eq!(url_credentials(u).unwrap().expose(), "alice:s3cr%40t");
        assert_eq!(redact_url(u), "https://***@hub.example:8443/api?x=a@b");
        assert_eq!(redact_url("http://hub.local/a@b"), "http://hub.local/a@b");
        assert!(url_credentials("http://hub.local/a@b").is_none());
        assert!(url_credentials("not a url @ all").is_none());
        assert_eq!(redact_url("http://tok@h"), "http://***@h");
    }
}
