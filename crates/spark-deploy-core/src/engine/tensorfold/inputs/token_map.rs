//! The Engram compressed token map every rank reads: for every token id, the id of its
//! normalised text, numbered in order of first appearance.
//!
//! Decoding follows the Hugging Face `tokenizers` library for the tokenizer types supported here:
//! models `BPE`, `WordLevel` (vocab maps) and `Unigram` (vocab list); decoder `ByteLevel` or none.
//! Any other decoder is refused rather than guessed.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::Value;
use unicode_normalization::UnicodeNormalization;
use unicode_normalization::char::is_combining_mark;

/// Why the token map could not be made.
#[derive(Debug, thiserror::Error)]
pub enum TokenMapError {
    /// A file could not be read or written.
    #[error("{path}: {source}; check the model directory and the output path")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A JSON file is malformed.
    #[error("{path}: {problem}; re-download it")]
    Json {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// The tokenizer uses a model or decoder this implementation does not reproduce.
    #[error(
        "{path}: {what} is not supported by the native token map; build it with make_token_map.py (Python `tokenizers`) instead"
    )]
    Unsupported {
        /// tokenizer.json.
        path: PathBuf,
        /// What is unsupported.
        what: String,
    },
    /// The count check failed.
    #[error(
        "{tokenizer}: {found} compressed ids, but config.json's engram_compressed_vocab_size is {expected}; the tokenizer and config.json come from different checkpoints, re-download both"
    )]
    Count {
        /// tokenizer.json.
        tokenizer: PathBuf,
        /// Distinct compressed ids found.
        found: usize,
        /// The config's value.
        expected: usize,
    },
}

/// The token map: `ids[token] = compressed id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenMap {
    /// One compressed id per token id (whole vocabulary, added tokens included).
    pub ids: Vec<u32>,
    /// Number of distinct compressed ids.
    pub compressed: usize,
}

impl TokenMap {
    /// `json.dumps` of the list: `[0, 1, 2]`.
    #[must_use]
    pub fn to_json(&self) -> String {
        let mut s = String::with_capacity(self.ids.len() * 7 + 2);
        s.push('[');
        for (i, v) in self.ids.iter().enumerate() {
            if i > 0 {
                s.push_str(", ");
            }
            s.push_str(&v.to_string());
        }
        s.push(']');
        s
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decoder {
    None,
    ByteLevel,
}

/// The parts of `tokenizer.json` decoding needs.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    /// Token string by id (added tokens take precedence, as in `tokenizers`).
    tokens: HashMap<u32, String>,
    /// `get_vocab_size(with_added_tokens=True)`.
    size: usize,
    decoder: Decoder,
}

impl Tokenizer {
    /// Parses `tokenizer.json`.
    ///
    /// # Errors
    /// I/O or JSON errors, or an unsupported model / decoder type.
    pub fn read(path: &Path) -> Result<Self, TokenMapError> {
        let text =
            crate::safe_fs::read_capped(path, crate::safe_fs::JSON_CAP).map_err(|source| {
                TokenMapError::Io {
                    path: path.to_path_buf(),
                    source,
                }
            })?;
        Self::parse(path, &text)
    }

    /// Parses `tokenizer.json`'s bytes (`path` only for errors).
    ///
    /// # Errors
    /// JSON errors, or an unsupported model / decoder type.
    pub fn parse(path: &Path, text: &[u8]) -> Result<Self, TokenMapError> {
        let bad = |problem: &str| TokenMapError::Json {
            path: path.to_path_buf(),
            problem: problem.to_owned(),
        };
        let unsupported = |what: String| TokenMapError::Unsupported {
            path: path.to_path_buf(),
            what,
        };
        let v: Value = serde_json::from_slice(text).map_err(|e| bad(&e.to_string()))?;
        let model = v.get("model").ok_or_else(|| bad("no model"))?;
        let mtype = model.get("type").and_then(Value::as_str).unwrap_or("BPE");
        let mut model_vocab: HashMap<String, u32> = HashMap::new();
        match mtype {
            "BPE" | "WordLevel" => {
                let vocab = model
                    .get("vocab")
                    .and_then(Value::as_object)
                    .ok_or_else(|| bad("model.vocab is not an object"))?;
                for (tok, id) in vocab {
                    let id = id
                        .as_u64()
                        .ok_or_else(|| bad("a vocab id is not an integer"))?;
                    model_vocab.insert(tok.clone(), id as u32);
                }
            }
            "Unigram" => {
                let vocab = model
                    .get("vocab")
                    .and_then(Value::as_array)
                    .ok_or_else(|| bad("model.vocab is not a list"))?;
                for (id, piece) in vocab.iter().enumerate() {
                    let tok = piece
                        .get(0)
                        .and_then(Value::as_str)
                        .ok_or_else(|| bad("a Unigram piece is not [text, score]"))?;
                    model_vocab.insert(tok.to_owned(), id as u32);
                }
            }
            other => return Err(unsupported(format!("model type {other}"))),
        }
        let decoder = match v.get("decoder") {
            None | Some(Value::Null) => Decoder::None,
            Some(d) => match d.get("type").and_then(Value::as_str) {
                Some("ByteLevel") => Decoder::ByteLevel,
                other => {
                    return Err(unsupported(format!(
                        "decoder {}",
                        other.unwrap_or("without a type")
                    )));
                }
            },
        };
        let mut tokens: HashMap<u32, String> =
            model_vocab.iter().map(|(t, id)| (*id, t.clone())).collect();
        let mut vocab_all = model_vocab;
        if let Some(added) = v.get("added_tokens").and_then(Value::as_array) {
            for a in added {
                let id =
                    a.get("id")
                        .and_then(Value::as_u64)
                        .ok_or_else(|| bad("an added token has no id"))? as u32;
                let content = a
                    .get("content")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad("an added token has no content"))?;
                tokens.insert(id, content.to_owned());
                vocab_all.insert(content.to_owned(), id);
            }
        }
        Ok(Self {
            tokens,
            size: vocab_all.len(),
            decoder,
        })
    }

    /// `get_vocab_size(with_added_tokens=True)`.
    #[must_use]
    pub fn vocab_size(&self) -> usize {
        self.size
    }

    /// `id_to_token(id)`.
    #[must_use]
    pub fn id_to_token(&self, id: u32) -> Option<&str> {
        self.tokens.get(&id).map(String::as_str)
    }

    /// `decode([id], skip_special_tokens=False)`.
    #[must_use]
    pub fn decode_one(&self, id: u32) -> String {
        let Some(tok) = self.id_to_token(id) else {
            return String::new();
        };
        match self.decoder {
            Decoder::None => tok.to_owned(),
            Decoder::ByteLevel => {
                let table = char_to_byte();
                let bytes: Option<Vec<u8>> = tok.chars().map(|c| table.get(&c).copied()).collect();
                let bytes = bytes.unwrap_or_else(|| tok.as_bytes().to_vec());
                String::from_utf8_lossy(&bytes).into_owned()
            }
        }
    }
}

/// GPT-2's byte-to-unicode alphabet, inverted.
fn char_to_byte() -> &'static HashMap<char, u8> {
    static TABLE: std::sync::OnceLock<HashMap<char, u8>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let mut m = HashMap::with_capacity(256);
        let mut n = 0u32;
        for b in 0u32..256 {
            let printable =
                (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
            let c = if printable {
                b
            } else {
                n += 1;
                255 + n
            };
            m.insert(char::from_u32(c).unwrap_or('\0'), b as u8);
        }
        m
    })
}

/// GPT-2's byte-to-unicode alphabet (byte → char), for tokenizer writers.
#[must_use]
pub fn byte_to_char(b: u8) -> char {
    let b = u32::from(b);
    let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    if printable {
        return char::from_u32(b).unwrap_or('\0');
    }
    let mut n = 0u32;
    for x in 0..=b {
        let p = (33..=126).contains(&x) || (161..=172).contains(&x) || (174..=255).contains(&x);
        if !p {
            n += 1;
        }
    }
    char::from_u32(255 + n).unwrap_or('\0')
}

/// The engine's normaliser: NFKC → NFD → strip accents → lowercase → whitespace runs to one space
/// → strip, except that a text that is exactly one space stays one space.
#[must_use]
pub fn normalize(text: &str) -> String {
    let s: String = text
        .nfkc()
        .collect::<String>()
        .nfd()
        .filter(|c| !is_combining_mark(*c))
        .collect();
    let s: String = s.chars().flat_map(char::to_lowercase).collect();
    let mut out = String::with_capacity(s.len());
    let mut in_ws = false;
    for c in s.chars() {
        if matches!(c, ' ' | '\t' | '\r' | '\n') {
            if !in_ws {
                out.push(' ');
            }
            in_ws = true;
        } else {
            out.push(c);
            in_ws = false;
        }
    }
    if out == " " {
        return out;
    }
    out.trim().to_owned()
}

/// Builds the token map of a tokenizer.
#[must_use]
pub fn token_map(tok: &Tokenizer) -> TokenMap {
    let n = tok.vocab_size();
    let mut keys: HashMap<Option<String>, u32> = HashMap::with_capacity(n);
    let mut ids = Vec::with_capacity(n);
    for id in 0..n as u32 {
        let text = tok.decode_one(id);
        let key = if text.contains('\u{FFFD}') {
            tok.id_to_token(id).map(str::to_owned)
        } else {
            let nt = normalize(&text);
            Some(if nt.is_empty() { text } else { nt })
        };
        let next = keys.len() as u32;
        ids.push(*keys.entry(key).or_insert(next));
    }
    TokenMap {
        ids,
        compressed: keys.len(),
    }
}

/// Builds the token map from `tokenizer.json`.
///
/// # Errors
/// See [`Tokenizer::read`].
pub fn build_token_map(tokenizer_json: &Path) -> Result<TokenMap, TokenMapError> {
    Ok(token_map(&Tokenizer::read(tokenizer_json)?))
}

/// `engram_compressed_vocab_size` from `config.json` (under `text_config` when present).
///
/// # Errors
/// I/O or JSON errors, or a config without the field.
pub fn expected_count(config_json: &Path) -> Result<usize, TokenMapError> {
    let text =
        crate::safe_fs::read_capped(config_json, crate::safe_fs::JSON_CAP).map_err(|source| {
            TokenMapError::Io {
                path: config_json.to_path_buf(),
                source,
            }
        })?;
    let v: Value = serde_json::from_slice(&text).map_err(|e| TokenMapError::Json {
        path: config_json.to_path_buf(),
        problem: e.to_string(),
    })?;
    let t = v.get("text_config").filter(|t| t.is_object()).unwrap_or(&v);
    t.get("engram_compressed_vocab_size")
        .and_then(Value::as_u64)
        .map(|n| n as usize)
        .ok_or_else(|| TokenMapError::Json {
            path: config_json.to_path_buf(),
            problem: "no integer engram_compressed_vocab_size".into(),
        })
}

/// `make_token_map.py MODEL_DIR OUT_JSON`: builds the map from `model_dir/tokenizer.json`, checks
/// the count against `model_dir/config.json`, and writes `out` (via a temporary file and rename).
///
/// # Errors
/// [`TokenMapError::Count`] when the counts differ (nothing is written), and I/O or parse errors.
pub fn write_token_map(model_dir: &Path, out: &Path) -> Result<TokenMap, TokenMapError> {
    let tokenizer = model_dir.join("tokenizer.json");
    let map = build_token_map(&tokenizer)?;
    let expected = expected_count(&model_dir.join("config.json"))?;
    if map.compressed != expected {
        return Err(TokenMapError::Count {
            tokenizer,
            found: map.compressed,
            expected,
        });
    }
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| TokenMapError::Io { path, source }
    };
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
    }
    let tmp = out.with_extension("json.partial");
    crate::safe_fs::write_exclusive(&tmp, map.to_json()).map_err(io(&tmp))?;
    std::fs::rename(&tmp, out).map_err(io(out))?;
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normaliser_cases() {
        assert_eq!(normalize(" "), " ");
        assert_eq!(normalize("  "), " ");
        assert_eq!(normalize("\n\t"), " ");
        assert_eq!(normalize(" \u{3000}"), " ");
        assert_eq!(normalize(" \u{85}"), "");
        assert_eq!(normalize(" Café "), "cafe");
        assert_eq!(normalize("ﬁne"), "fine");
        assert_eq!(normalize("ＡＢ"), "ab");
        assert_eq!(normalize("a \n b"), "a b");
        assert_eq!(normalize("ΟΔΟΣ"), "οδοσ");
    }

    #[test]
    fn byte_alphabet_round_trips() {
        let t = char_to_byte();
        for b in 0..=255u8 {
            assert_eq!(t[&byte_to_char(b)], b);
        }
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
    }

    #[test]
    fn byte_level_map_with_added_tokens() {
        let j = r#"{"model": {"type": "BPE", "vocab": {"a": 0, "A": 1, "Ġ": 2, "Ã": 3, "Ã©": 4, "é": 5, "ĠĠ": 6}, "merges": []},
            "decoder": {"type": "ByteLevel"},
            "added_tokens": [{"id": 7, "content": "<s>", "special": true}, {"id": 8, "content": "É", "special": false}]}"#;
        let tok = Tokenizer::parse(Path::new("t.json"), j.as_bytes()).unwrap();
        assert_eq!(tok.vocab_size(), 9);
        assert_eq!(tok.decode_one(4), "é");
        assert_eq!(tok.decode_one(3), "\u{FFFD}");
        let m = token_map(&tok);
        // a, A share; "  " collapses to " "; Ã, é and the added É (lone bytes) key as their own strings.
        assert_eq!(m.ids, vec![0, 0, 1, 2, 3, 4, 1, 5, 6]);
        assert_eq!(m.compressed, 7);
        assert_eq!(m.to_json(), "[0, 0, 1, 2, 3, 4, 1, 5, 6]");
    }
}
