//! A small but real byte-level BPE `tokenizer.json` (loads in the Python `tokenizers` package):
//! special and added tokens, accented words, compatibility characters, whitespace-only tokens,
//! case variants and lone UTF-8 bytes that decode to U+FFFD.

use std::collections::{BTreeSet, HashMap};

use serde_json::{Value, json};
use spark_deploy_core::engine::tensorfold::inputs::token_map::byte_to_char;

use super::rng::Rng;

/// Special tokens at ids 0, 1, 2 (bos, eos, pad), in the model vocab and in `added_tokens`.
pub(crate) const SPECIALS: [&str; 3] = [
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜▁pad▁｜>",
];

/// Added tokens after the vocabulary: (content, special).
const ADDED: [(&str, bool); 7] = [
    ("<think>", false),
    ("</think>", false),
    ("<｜User｜>", true),
    ("<｜Assistant｜>", true),
    ("<｜tool▁call▁begin｜>", true),
    ("<|image|>", true),
    ("<｜place▁holder▁no▁1｜>", true),
];

/// Texts that exercise the normaliser (each also gets case and leading-space variants).
const SEED_TEXTS: [&str; 34] = [
    "the",
    "The",
    "THE",
    "café",
    "Café",
    "CAFÉ",
    "cafe",
    "naïve",
    "naive",
    "résumé",
    "resume",
    "Ångström",
    "crème",
    "ﬁle",
    "file",
    "ＡＢＣ",
    "abc",
    "Ⅻ",
    "x²",
    "ΟΔΟΣ",
    "οδος",
    "straße",
    "Straße",
    "你好",
    "世界",
    "😀",
    "İstanbul",
    "ǅ",
    "\u{2003}em",
    "tab\there",
    "a\u{00a0}b",
    "ﬀ",
    "№",
    "…",
];

/// Whitespace-only texts.
const SPACES: [&str; 9] = [
    " ", "  ", "   ", "\n", "\n\n", "\t", " \n", "\r\n", "\u{3000}",
];

fn to_byte_level(s: &str) -> String {
    s.bytes().map(byte_to_char).collect()
}

/// Builds `tokenizer.json` with about `target` tokens (never more than `target`). Returns the
/// JSON text, the number of tokens, and the id of `<|image|>`.
#[must_use]
pub(crate) fn build(seed: u64, target: usize) -> (String, usize, usize) {
    let mut rng = Rng::new(seed ^ 0x746f_6b65_6e73);
    let mut vocab: Vec<String> = SPECIALS.iter().map(|s| (*s).to_owned()).collect();
    let mut seen: BTreeSet<String> = vocab.iter().cloned().collect();
    let push = |vocab: &mut Vec<String>, seen: &mut BTreeSet<String>, t: String| {
        if seen.insert(t.clone()) {
            vocab.push(t);
        }
    };
    for b in 0..=255u8 {
        push(&mut vocab, &mut seen, byte_to_char(b).to_string());
    }
    let room = target.saturating_sub(ADDED.len());
    let mut words: Vec<String> = Vec::new();
    for t in SEED_TEXTS {
        words.push(t.to_owned());
        words.push(format!(" {t}"));
    }
    for t in SPACES {
        words.push(t.to_owned());
    }
    // lone lead bytes of multi-byte characters: decode to U+FFFD
    words.push("\u{1F600}".to_owned());
    let syllables = [
        "ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "ze", "qu", "ph", "st",
    ];
    while words.len() < room * 2 {
        let n = 1 + rng.below(3) as usize;
        let mut w: String = (0..n)
            .map(|_| syllables[rng.below(syllables.len() as u64) as usize])
            .collect();
        match rng.below(4) {
            0 => w = format!(" {w}"),
            1 => {
                let mut c = w.chars();
                w = c
                    .next()
                    .map(|f| f.to_uppercase().collect::<String>() + c.as_str())
                    .unwrap_or(w);
            }
            _ => {}
        }
        words.push(w);
    }
    // every prefix of a byte-level word is a token, so each word has a merge path
    let mut merges: Vec<(String, String)> = Vec::new();
    'words: for w in &words {
        let chars: Vec<char> = to_byte_level(w).chars().collect();
        for k in 2..=chars.len() {
            if vocab.len() >= room {
                break 'words;
            }
            let whole: String = chars[..k].iter().collect();
            if seen.contains(&whole) {
                continue;
            }
            let left: String = chars[..k - 1].iter().collect();
            merges.push((left, chars[k - 1].to_string()));
            push(&mut vocab, &mut seen, whole);
        }
    }
    // two lone bytes of a 4-byte character: a token that decodes to U+FFFD
    let emoji: Vec<char> = to_byte_level("\u{1F600}").chars().collect();
    let partial: String = emoji[..2].iter().collect();
    if !seen.contains(&partial) && vocab.len() < room {
        merges.push((emoji[0].to_string(), emoji[1].to_string()));
        push(&mut vocab, &mut seen, partial);
    }
    let mut ids: HashMap<String, usize> = HashMap::new();
    let mut vmap = serde_json::Map::new();
    for (i, t) in vocab.iter().enumerate() {
        ids.insert(t.clone(), i);
        vmap.insert(t.clone(), json!(i));
    }
    let mut added: Vec<Value> = SPECIALS
        .iter()
        .enumerate()
        .map(|(i, s)| added_token(i, s, true))
        .collect();
    let mut image = 0;
    for (k, (content, special)) in ADDED.iter().enumerate() {
        let id = vocab.len() + k;
        if *content == "<|image|>" {
            image = id;
        }
        added.push(added_token(id, content, *special));
    }
    let total = vocab.len() + ADDED.len();
    let merges: Vec<String> = merges
        .into_iter()
        .map(|(a, b)| format!("{a} {b}"))
        .collect();
    let tok = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": null,
            "continuing_subword_prefix": null,
            "end_of_word_suffix": null,
            "fuse_unk": false,
            "byte_fallback": false,
            "ignore_merges": false,
            "vocab": Value::Object(vmap),
            "merges": merges,
        }
    });
    (
        serde_json::to_string_pretty(&tok).unwrap_or_default(),
        total,
        image,
    )
}

fn added_token(id: usize, content: &str, special: bool) -> Value {
    json!({"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": special})
}
