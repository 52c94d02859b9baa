//! The Hugging Face environment variables, read as `huggingface_hub` reads them.
//!
//! `huggingface_hub` (its `constants.py` and `utils/_auth.py`) decides:
//!
//! | What | Strongest first |
//! |---|---|
//! | hub cache (`…/hub`, holding `models--…`) | `HF_HUB_CACHE`, `HUGGINGFACE_HUB_CACHE`, `$HF_HOME/hub`, `$XDG_CACHE_HOME/huggingface/hub`, `~/.cache/huggingface/hub` |
//! | token file | `HF_TOKEN_PATH`, `$HF_HOME/token`, `$XDG_CACHE_HOME/huggingface/token`, `~/.cache/huggingface/token` |
//! | token | `HF_TOKEN`, `HUGGING_FACE_HUB_TOKEN`, then the token file |
//! | endpoint | `HF_ENDPOINT` (trailing `/` removed) |
//! | offline | `HF_HUB_OFFLINE`, else `TRANSFORMERS_OFFLINE`: `1`, `ON`, `YES`, `TRUE` (any case) |
//!
//! Paths get `~` and `$VAR` expanded. spark-deploy keeps the cache *root* (`hub.cache`, the
//! directory whose `hub/` is the hub cache, mounted into the engine containers and exported to
//! the worker), so `HF_HUB_CACHE` must name a directory called `hub`: its parent is the root.
//! `HF_CACHE`, the bash recipe's name for the root, ranks above `HF_HOME` as it did there.
//! The environment wins over the file, as for every variable; `XDG_CACHE_HOME` only fills what
//! the file leaves empty (it moves a default, it is no setting). An empty variable counts as unset.

use std::path::{Path, PathBuf};

/// The cache root when neither the file nor the environment names one (`huggingface_hub`'s
/// `HF_HOME` default without `XDG_CACHE_HOME`).
pub const DEFAULT_HF_HOME: &str = "~/.cache/huggingface";

/// `<cache home>/huggingface`: the `HF_HOME` that `XDG_CACHE_HOME` implies.
#[must_use]
pub fn hf_home_in(xdg_cache_home: &str) -> String {
    join(xdg_cache_home, "huggingface")
}

/// `<HF_HOME>/token`: the file `hf auth login` writes.
#[must_use]
pub fn token_file_in(hf_home: &str) -> String {
    join(hf_home, "token")
}

fn join(dir: &str, name: &str) -> String {
    format!("{}/{name}", dir.trim_end_matches('/'))
}

/// The cache root of a hub cache directory (`HF_HUB_CACHE`): its parent, when it is named `hub`.
///
/// # Errors
///
/// What would be accepted, when the directory is not named `hub`.
pub fn root_of_hub_cache(hub_cache: &str) -> Result<String, String> {
    let p = Path::new(hub_cache.trim_end_matches('/'));
    match (p.file_name(), p.parent()) {
        (Some(n), Some(parent)) if n == "hub" && !parent.as_os_str().is_empty() => {
            Ok(parent.display().to_string())
        }
        _ => Err(format!(
            "a directory named hub (e.g. {}/hub): spark-deploy mounts and exports the cache root, \
             the parent of the hub cache; or set HF_HOME to the root instead",
            hub_cache.trim_end_matches('/')
        )),
    }
}

/// A token as `huggingface_hub` cleans it: line breaks removed, whitespace trimmed; empty = none.
#[must_use]
pub fn clean_token(raw: &str) -> Option<String> {
    let t: String = raw.chars().filter(|c| !matches!(c, '\r' | '\n')).collect();
    let t = t.trim();
    (!t.is_empty()).then(|| t.to_owned())
}

/// `huggingface_hub`'s truth test of a flag: `1`, `ON`, `YES`, `TRUE` in any case; anything else
/// is false.
#[must_use]
pub fn is_true(v: &str) -> bool {
    ["1", "ON", "YES", "TRUE"]
        .iter()
        .any(|t| v.eq_ignore_ascii_case(t))
}

/// A path variable's value: `$VAR` / `${VAR}` expanded from `lookup` (unknown ones left as they
/// are, like Python's `os.path.expandvars`), then made absolute against the working directory
/// unless it starts with `~` (expanded with the head's home at validation).
#[must_use]
pub fn path(value: &str, lookup: &dyn Fn(&str) -> Option<String>) -> String {
    let v = expand_vars(value.trim(), lookup);
    if v.starts_with('~') || Path::new(&v).is_absolute() {
        return v;
    }
    std::path::absolute(&v)
        .unwrap_or_else(|_| PathBuf::from(&v))
        .display()
        .to_string()
}

/// `$NAME` and `${NAME}` (NAME of ASCII letters, digits and `_`) replaced by their values; an
/// unknown variable is left unchanged.
#[must_use]
pub fn expand_vars(s: &str, lookup: &dyn Fn(&str) -> Option<String>) -> String {
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let (name, token_len) = if let Some(braced) = after.strip_prefix('{') {
            match braced.find('}') {
                Some(end) => (&braced[..end], end + 2),
                None => ("", 0),
            }
        } else {
            let end = after.find(|c: char| !is_name(c)).unwrap_or(after.len());
            (&after[..end], end)
        };
        match (!name.is_empty()).then(|| lookup(name)).flatten() {
            Some(value) => out.push_str(&value),
            None => out.push_str(&rest[i..=i + token_len]),
        }
        rest = &rest[i + 1 + token_len..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_cache_root_is_its_parent() {
        assert_eq!(root_of_hub_cache("/data/hf/hub").unwrap(), "/data/hf");
        assert_eq!(root_of_hub_cache("/data/hf/hub/").unwrap(), "/data/hf");
        assert_eq!(root_of_hub_cache("~/x/hub").unwrap(), "~/x");
        let e = root_of_hub_cache("/data/models").unwrap_err();
        assert!(
            e.contains("named hub") && e.contains("/data/models/hub") && e.contains("HF_HOME"),
            "{e}"
        );
        assert!(root_of_hub_cache("hub").is_err());
    }

    #[test]
    fn tokens_and_flags_as_huggingface_hub_reads_them() {
        assert_eq!(clean_token(" hf_a\r\nb \n").as_deref(), Some("hf_ab"));
        assert_eq!(clean_token(" \n"), None);
        for t in ["1", "on", "Yes", "TRUE"] {
            assert!(is_true(t), "{t}");
        }
        for f in ["0", "", "off", "y", "2"] {
            assert!(!is_true(f), "{f}");
        }
    }

    #[test]
    fn vars_expand_like_expandvars() {
        let env = |k: &str| match k {
            "A" => Some("/a".to_owned()),
            "B_2" => Some("b".to_owned()),
            _ => None,
        };
        assert_eq!(expand_vars("$A/x/${B_2}y", &env), "/a/x/by");
        assert_eq!(expand_vars("$NOPE/${A}", &env), "$NOPE//a");
        assert_eq!(expand_vars("cost$", &env), "cost$");
        assert_eq!(expand_vars("${A", &env), "${A");
        assert_eq!(expand_vars("${}$A", &env), "${}/a");
        assert_eq!(path("~/c", &env), "~/c");
        assert_eq!(path("$A/c", &env), "/a/c");
        let rel = path("rel/hub", &env);
        assert!(
            Path::new(&rel).is_absolute() && rel.ends_with("/rel/hub"),
            "{rel}"
        );
    }
}
