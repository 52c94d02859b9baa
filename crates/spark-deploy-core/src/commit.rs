//! The one rule for a pinned git commit id (model revisions, the engine commit, what the Hub
//! resolves a branch to).
//!
//! A commit id is exactly 40 lowercase hex digits, the form git and the Hub print. Uppercase is
//! not accepted as a commit: an uppercase 40-character string is never what either tool wrote,
//! so treating it as a branch or tag name (resolved once, with a warning) is the safe reading,
//! and comparing ids stays plain string equality.

/// Whether `s` is a full commit id: 40 lowercase hex digits.
#[must_use]
pub fn is_commit_id(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Longest ref name accepted (git's own limit on a path component is the filesystem's).
pub const MAX_REF_LEN: usize = 255;

/// Checks a branch or tag name by git's `check-ref-format` rules, narrowed to the characters the
/// Hub's names use (`A-Z a-z 0-9 - _ . /`): not empty, at most [`MAX_REF_LEN`] bytes, not
/// starting with `-` (as `git branch` refuses), no `..`,
/// no leading, trailing or doubled `/`, no component starting with `.` or ending with `.lock`,
/// not ending with `.`. What passes is safe to join below a cache directory (`refs/<name>`): it
/// can never climb out of it or be an absolute path.
///
/// # Errors
///
/// What the name breaks, as a phrase ("contains `..`").
pub fn check_ref_name(s: &str) -> Result<(), &'static str> {
    if s.is_empty() {
        return Err("is empty");
    }
    if s.len() > MAX_REF_LEN {
        return Err("is longer than 255 bytes");
    }
    if s.bytes().any(|b| b.is_ascii_control()) {
        return Err("contains a control character");
    }
    if !s
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-_./".contains(&b))
    {
        return Err("contains a character other than A-Z, a-z, 0-9, '-', '_', '.', '/'");
    }
    if s.starts_with('-') {
        return Err("starts with '-' (git reads it as an option)");
    }
    if s.contains("..") {
        return Err("contains `..`");
    }
    if s.starts_with('/') || s.ends_with('/') || s.contains("//") {
        return Err("starts or ends with '/' or contains '//'");
    }
    if s.ends_with('.') {
        return Err("ends with '.'");
    }
    if s.split('/')
        .any(|c| c.starts_with('.') || c.ends_with(".lock"))
    {
        return Err("has a component starting with '.' or ending with '.lock'");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{check_ref_name, is_commit_id};

    #[test]
    fn ref_names_follow_git_rules_and_never_leave_a_directory() {
        for ok in ["main", "v1.0", "refs/pr/1", "release-2026_01", "a.b/c-d"] {
            assert_eq!(check_ref_name(ok), Ok(()), "{ok}");
        }
        for (bad, why) in [
            ("", "empty"),
            ("../../etc", ".."),
            ("a/../b", ".."),
            ("/abs", "'/'"),
            ("trailing/", "'/'"),
            ("a//b", "'//'"),
            (".hidden", "'.'"),
            ("a/.b", "'.'"),
            ("x.lock", ".lock"),
            ("end.", "ends with"),
            ("new\nline", "control"),
            ("nul\0", "control"),
            ("sp ace", "character other"),
            ("caf\u{e9}", "character other"),
            ("a@{1}", "character other"),
            ("-rf", "'-'"),
        ] {
            let e = check_ref_name(bad).unwrap_err();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
        assert!(check_ref_name(&"a".repeat(256)).is_err());
    }

    #[test]
    fn only_forty_lowercase_hex_digits_are_a_commit() {
        for (s, want) in [
            ("0123456789abcdef0123456789abcdef01234567", true),
            ("ffffffffffffffffffffffffffffffffffffffff", true),
            ("0123456789ABCDEF0123456789abcdef01234567", false),
            ("0123456789abcdef0123456789abcdef0123456", false),
            ("0123456789abcdef0123456789abcdef012345678", false),
            ("0123456789abcdef0123456789abcdef0123456g", false),
            ("main", false),
            ("", false),
        ] {
            assert_eq!(is_commit_id(s), want, "{s}");
        }
    }
}
