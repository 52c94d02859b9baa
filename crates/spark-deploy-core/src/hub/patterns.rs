//! File patterns with the meaning `huggingface_hub` gives its `allow_patterns`, matched by
//! `globset`.
//!
//! The rules (Python's `fnmatch.fnmatchcase` on the repository path, as `snapshot_download` and
//! `filter_repo_objects` apply them):
//! - `*` matches any run of characters **including `/`** (`*.json` selects `a/config.json`);
//!   `**` is the same as `*`, it has no folder meaning of its own;
//! - `?` matches one character, `/` included;
//! - `[abc]`, `[a-z]`, `[!abc]` match one character of (not of) the set; a `]` right after `[`
//!   or `[!` belongs to the set; a `[` with no closing `]` is a plain character;
//! - every other character, `{`, `}`, `,` and `\` included, matches itself; matching is
//!   case-sensitive and on the whole path (a leading `./` is not stripped);
//! - a pattern ending in `/` names a folder and gets a `*` appended;
//! - `\` in patterns and paths is read as `/` first (as recent `huggingface_hub` releases do).
//!
//! Each pattern is rewritten into globset syntax that means exactly that (globset's own `**`,
//! `{a,b}` and `[[:class:]]` never reach it). `?` and `[...]` compare single bytes in globset, so
//! they agree with Python on ASCII paths (all that model repositories use) but a `?` does not
//! match one non-ASCII character.

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};

/// A pattern globset refused (the rewrite should make this impossible).
#[derive(Debug, thiserror::Error)]
#[error(
    "file pattern `{pattern}` cannot be used ({reason}); write it with `*`, `?` and `[...]` only"
)]
pub struct PatternError {
    /// The pattern as given.
    pub pattern: String,
    /// What globset said.
    pub reason: String,
}

/// A set of allow patterns: a path is selected when any pattern matches it.
#[derive(Debug, Clone)]
pub struct AllowPatterns {
    set: GlobSet,
}

impl AllowPatterns {
    /// Compile `patterns` (none: nothing matches).
    ///
    /// # Errors
    /// [`PatternError`] naming the first pattern globset refused.
    pub fn new(patterns: &[String]) -> Result<Self, PatternError> {
        let mut b = GlobSetBuilder::new();
        for p in patterns {
            let Some(glob) = to_globset(p) else {
                continue;
            };
            let err = |e: globset::Error| PatternError {
                pattern: p.clone(),
                reason: e.kind().to_string(),
            };
            b.add(
                GlobBuilder::new(&glob)
                    .literal_separator(false)
                    .backslash_escape(false)
                    .case_insensitive(false)
                    .build()
                    .map_err(err)?,
            );
        }
        let set = b.build().map_err(|e| PatternError {
            pattern: patterns.join(", "),
            reason: e.kind().to_string(),
        })?;
        Ok(Self { set })
    }

    /// Whether any pattern matches the repository path `path`.
    #[must_use]
    pub fn is_match(&self, path: &str) -> bool {
        if path.contains('\\') {
            self.set.is_match(path.replace('\\', "/"))
        } else {
            self.set.is_match(path)
        }
    }
}

/// The globset pattern meaning what `pattern` means to `fnmatch`, or `None` when it can match
/// nothing (an empty set such as `[z-a]`).
fn to_globset(pattern: &str) -> Option<String> {
    let mut pat: Vec<char> = pattern.replace('\\', "/").chars().collect();
    if pat.last() == Some(&'/') {
        pat.push('*');
    }
    let mut out = String::new();
    let mut i = 0;
    while i < pat.len() {
        let c = pat[i];
        i += 1;
        match c {
            '*' => {
                // `**` means `*`; a literal star is written `[*]`, so this only merges wildcards.
                if !out.ends_with('*') {
                    out.push('*');
                }
            }
            '?' => out.push('?'),
            '[' => match class_end(&pat, i) {
                Some(j) => {
                    let (negated, ranges) = class_ranges(&pat[i..j]);
                    out.push_str(&emit_class(negated, ranges)?);
                    i = j + 1;
                }
                None => out.push_str("[[]"),
            },
            c => push_literal(&mut out, c),
        }
    }
    Some(out)
}

/// Where the `]` closing a set that starts at `pat[i]` (just after `[`) is, as fnmatch finds it.
fn class_end(pat: &[char], i: usize) -> Option<usize> {
    let mut j = i;
    if pat.get(j) == Some(&'!') {
        j += 1;
    }
    if pat.get(j) == Some(&']') {
        j += 1;
    }
    (j..pat.len()).find(|&k| pat[k] == ']')
}

/// The members of a set body (between `[` and `]`) as fnmatch reads it: `!` first negates, a `-`
/// between two characters is a range (a reversed range is dropped, merging its neighbours as
/// Python does), any other `-` is a plain character.
fn class_ranges(body: &[char]) -> (bool, Vec<(char, char)>) {
    // Python splits the body at range hyphens into chunks; a range joins the last character of
    // one chunk with the first of the next.
    let start = usize::from(body.first() == Some(&'!'));
    let mut chunks: Vec<Vec<char>> = Vec::new();
    if body.contains(&'-') {
        let mut from = 0;
        let mut k = start + 1;
        while let Some(off) = body.get(k..).and_then(|s| s.iter().position(|&c| c == '-')) {
            let at = k + off;
            chunks.push(body[from..at].to_vec());
            from = at + 1;
            k = at + 3;
        }
        let last = body[from..].to_vec();
        if last.is_empty() {
            if let Some(c) = chunks.last_mut() {
                c.push('-');
            }
        } else {
            chunks.push(last);
        }
        for k in (1..chunks.len()).rev() {
            if let (Some(&a), Some(&b)) = (chunks[k - 1].last(), chunks[k].first())
                && a > b
            {
                let next = chunks.remove(k);
                chunks[k - 1].pop();
                chunks[k - 1].extend_from_slice(&next[1..]);
            }
        }
    } else {
        chunks.push(body.to_vec());
    }
    // Flatten: characters of each chunk, the boundary between two chunks being a range.
    let mut negated = false;
    let mut ranges: Vec<(char, char)> = Vec::new();
    let mut first = true;
    for (n, chunk) in chunks.iter().enumerate() {
        for (m, &c) in chunk.iter().enumerate() {
            if first {
                first = false;
                if c == '!' {
                    negated = true;
                    continue;
                }
            }
            let range_start = n > 0 && m == 0;
            match ranges.last_mut() {
                Some(r) if range_start && r.0 == r.1 => r.1 = c,
                _ => ranges.push((c, c)),
            }
        }
    }
    ranges.retain(|r| r.0 <= r.1);
    (negated, ranges)
}

/// A globset set with exactly these members, or `None` for an empty set (never matches).
fn emit_class(negated: bool, ranges: Vec<(char, char)>) -> Option<String> {
    // `]` and `-` are position-sensitive in globset: split them out of ranges and place them
    // where they are plain characters (`]` first, `-` last).
    let (mut close, mut dash) = (false, false);
    let mut rest: Vec<(char, char)> = Vec::new();
    let mut todo = ranges;
    while let Some((lo, hi)) = todo.pop() {
        let special = [']', '-'].into_iter().find(|c| (lo..=hi).contains(c));
        match special {
            Some(c) => {
                if c == ']' {
                    close = true;
                } else {
                    dash = true;
                }
                let (below, above) = (char::from_u32(c as u32 - 1), char::from_u32(c as u32 + 1));
                if let Some(b) = below.filter(|&b| lo <= b) {
                    todo.push((lo, b));
                }
                if let Some(a) = above.filter(|&a| a <= hi) {
                    todo.push((a, hi));
                }
            }
            None => rest.push((lo, hi)),
        }
    }
    // Sorted, so a `[` is never followed by `:` (globset's `[:alpha:]` classes).
    rest.sort_unstable();
    rest.dedup();
    if !negated && !close && !dash && rest.is_empty() {
        return None;
    }
    if negated && !close && !dash && rest.is_empty() {
        return Some("?".into());
    }
    // A leading `!` or `^` would negate the set in globset: start with `-` instead, or move
    // them to the end.
    let mut dash_first = false;
    if !negated && !close {
        if dash {
            dash_first = true;
        } else {
            for _ in 0..2 {
                if let Some(&(lo, hi)) = rest.first().filter(|r| matches!(r.0, '!' | '^')) {
                    rest.remove(0);
                    if let Some(next) = char::from_u32(lo as u32 + 1).filter(|_| lo != hi) {
                        rest.insert(0, (next, hi));
                    }
                    rest.push((lo, lo));
                }
            }
            if matches!(rest.first(), Some(r) if matches!(r.0, '!' | '^')) {
                // Only `!` and `^` are left: an alternation of the two characters.
                let alts: Vec<String> = rest.iter().map(|r| r.0.to_string()).collect();
                return Some(if alts.len() == 1 {
                    alts.concat()
                } else {
                    format!("{{{}}}", alts.join(","))
                });
            }
        }
    }
    let mut s = String::from("[");
    if negated {
        s.push('!');
    }
    if close {
        s.push(']');
    }
    if dash_first {
        s.push('-');
    }
    for (lo, hi) in rest {
        s.push(lo);
        if lo != hi {
            s.push('-');
            s.push(hi);
        }
    }
    if dash && !dash_first {
        s.push('-');
    }
    s.push(']');
    Some(s)
}

/// `c` as a plain character in globset syntax.
fn push_literal(out: &mut String, c: char) {
    if matches!(c, '?' | '*' | '[' | ']' | '{' | '}' | ',') {
        out.push('[');
        out.push(c);
        out.push(']');
    } else {
        out.push(c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(pattern: &str, path: &str) -> bool {
        AllowPatterns::new(&[pattern.to_owned()])
            .unwrap()
            .is_match(path)
    }

    #[test]
    fn fnmatch_rules() {
        for (pattern, path, want) in [
            ("*.json", "config.json", true),
            ("*.json", "a/config.json", true),
            ("**.json", "a/b/config.json", true),
            ("**/*.json", "config.json", false),
            ("**/*.json", "a/config.json", true),
            ("a/**/b", "a/b", false),
            ("a/**/b", "a/x/b", true),
            ("a/", "a/b/c", true),
            ("a/", "ab", false),
            (
                "model-*-of-*.safetensors",
                "model-00001-of-00039.safetensors",
                true,
            ),
            ("a/?.bin", "a/x.bin", true),
            ("a/?.bin", "a/xy.bin", false),
            ("a?b", "a/b", true),
            ("[ab].txt", "b.txt", true),
            ("[!ab].txt", "b.txt", false),
            ("[!ab].txt", "c.txt", true),
            ("[a-c]x", "bx", true),
            ("[z-a]x", "zx", false),
            ("[]a]x", "]x", true),
            ("[!]a]x", "]x", false),
            ("[a-]x", "-x", true),
            ("[^a]x", "^x", true),
            ("[^a]x", "bx", false),
            ("[!]x", "[!]x", true),
            ("x[1", "x[1", true),
            ("{a,b}.txt", "a.txt", false),
            ("{a,b}.txt", "{a,b}.txt", true),
            ("./config.json", "config.json", false),
            ("README.md", "readme.md", false),
            // A set of `[`, `:`, `a`, `l`, `p`, `h` and then `]x`: no POSIX class.
            ("[[:alpha:]]x", "a]x", true),
            ("[[:alpha:]]x", "b]x", false),
            ("[[:alpha:]]x", ":]x", true),
            ("a\\b.txt", "a/b.txt", true),
            ("a/b.txt", "a\\b.txt", true),
            ("", "x", false),
        ] {
            assert_eq!(m(pattern, path), want, "{pattern} on {path}");
        }
    }

    #[test]
    fn any_pattern_selects_and_none_selects_nothing() {
        let p = AllowPatterns::new(&["*.json".into(), "tokenizer*".into()]).unwrap();
        assert!(p.is_match("tokenizer.model"));
        assert!(p.is_match("x/config.json"));
        assert!(!p.is_match("model.safetensors"));
        assert!(!AllowPatterns::new(&[]).unwrap().is_match("x"));
    }

    /// The table `tests/python/test_allow_patterns.py` checks against `huggingface_hub`.
    #[test]
    fn agrees_with_the_python_table() {
        let table: serde_json::Value = serde_json::from_str(include_str!(
            "../../../../tests/python/allow_patterns_table.json"
        ))
        .unwrap();
        let paths: Vec<String> = serde_json::from_value(table["paths"].clone()).unwrap();
        let cases = table["cases"].as_array().unwrap();
        assert!(cases.len() >= 25 && paths.len() >= 20);
        let mut wrong = Vec::new();
        for case in cases {
            let patterns: Vec<String> = serde_json::from_value(case["patterns"].clone()).unwrap();
            let want: Vec<String> = serde_json::from_value(case["selected"].clone()).unwrap();
            let set = AllowPatterns::new(&patterns).unwrap();
            let got: Vec<String> = paths.iter().filter(|p| set.is_match(p)).cloned().collect();
            if got != want {
                wrong.push(format!(
                    "{patterns:?}: got {got:?}, huggingface_hub {want:?}"
                ));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }
}
