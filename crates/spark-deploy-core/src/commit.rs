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

#[cfg(test)]
mod tests {
    use super::is_commit_id;

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
