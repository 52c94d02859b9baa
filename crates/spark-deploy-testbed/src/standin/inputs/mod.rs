//! The inputs both ranks load and check before they meet (docs/engine-contract.md, "What each
//! rank reads"): `config.json`, `tokenizer.json`, the token map, the kernel kit, the Engram tables,
//! and the safetensors headers of the checkpoint (for the split proof's full computation).
//!
//! The stand-in does **not** run the engine's config shape guard (the real model's dimensions): it
//! serves test-scale checkpoints. It does require every `config.json` field the engine reads
//! (`REQUIRED`).

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

mod checkpoint;
mod kit;

pub use checkpoint::{Checkpoint, SafetensorsHeader, StTensor};
pub use kit::{KitReport, check_engram, check_kit};

/// Why an input was refused. Each variant carries the engine's error name (`name()`).
#[derive(Debug, thiserror::Error)]
pub enum InputsError {
    /// An input failed a check; `name` is the engine's error name.
    #[error("error.{name}: {path}: {problem}")]
    Refused {
        /// Engine error name (`BadConfig`, `NoKit`, `NoTokenMap`, `MissingEngramTable`, ...).
        name: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
}

impl InputsError {
    fn new(name: &'static str, path: &Path, problem: impl Into<String>) -> Self {
        Self::Refused {
            name,
            path: path.to_path_buf(),
            problem: problem.into(),
        }
    }

    /// The engine's error name.
    #[must_use]
    pub fn name(&self) -> &'static str {
        match self {
            Self::Refused { name, .. } => name,
        }
    }
}

/// The `config.json` fields the stand-in uses.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// `hidden_size`.
    pub hidden: u64,
    /// `vocab_size`.
    pub vocab: u64,
    /// `num_hidden_layers`.
    pub layers: u64,
    /// `num_attention_heads`.
    pub heads: u64,
    /// `head_dim`.
    pub head_dim: u64,
    /// `qk_rope_head_dim`.
    pub rope_dim: u64,
    /// `engram_layer_ids`.
    pub engram_layers: Vec<u64>,
    /// `engram_compressed_vocab_size`.
    pub compressed_vocab: u64,
    /// `config.json` has `vision_config`.
    pub vision: bool,
    /// `model_type`.
    pub model_type: String,
}

/// The `config.json` fields the engine reads, all required (from `text_config` or the top level).
const REQUIRED: &[&str] = &[
    "num_hidden_layers",
    "num_nextn_predict_layers",
    "hidden_size",
    "vocab_size",
    "num_attention_heads",
    "head_dim",
    "qk_rope_head_dim",
    "q_lora_rank",
    "o_lora_rank",
    "o_groups",
    "sliding_window",
    "n_routed_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "n_shared_experts",
    "routed_scaling_factor",
    "swiglu_limit",
    "rms_norm_eps",
    "compress_ratios",
    "kv_source_layer_ids",
    "index_source_layer_ids",
    "index_n_heads",
    "index_head_dim",
    "index_topk",
    "candidate_source_layer_id",
    "candidate_topk_blocks",
    "candidate_block_size",
    "hc_mult",
    "hc_sinkhorn_iters",
    "hc_eps",
    "engram_layer_ids",
    "engram_num_embeddings",
    "engram_max_ngram_size",
    "engram_vocab_size",
    "engram_n_heads",
    "engram_head_dim",
    "engram_pad_token_id",
    "engram_compressed_vocab_size",
    "dspark_block_size",
    "dspark_noise_token_id",
    "dspark_target_layer_ids",
    "dspark_markov_rank",
    "dspark_n_routed_experts",
    "dspark_num_experts_per_tok",
    "max_position_embeddings",
    "rope_theta",
    "rope_scaling",
    "compress_rope_theta",
];

fn read_json(path: &Path, name: &'static str, limit: u64) -> Result<Value, InputsError> {
    super::opened::record(path);
    let meta = std::fs::metadata(path).map_err(|e| InputsError::new(name, path, e.to_string()))?;
    if meta.len() > limit {
        return Err(InputsError::new(
            name,
            path,
            format!("{} bytes exceeds the {limit}-byte limit", meta.len()),
        ));
    }
    let bytes = std::fs::read(path).map_err(|e| InputsError::new(name, path, e.to_string()))?;
    serde_json::from_slice(&bytes).map_err(|e| InputsError::new(name, path, e.to_string()))
}

impl ModelConfig {
    /// Reads `MODEL_DIR/config.json` (`config.zig parse`: dims from `text_config` or the top
    /// level; `model_type`, token ids, `quantization_config`, `vision_config` from the top level).
    ///
    /// # Errors
    /// `BadConfig` naming the missing or malformed field; `UnsupportedModel` for a
    /// `model_type` other than `deepseek_v41` or a quantization other than EXL3 `mul1`.
    pub fn read(model_dir: &Path) -> Result<Self, InputsError> {
        let path = model_dir.join("config.json");
        let v = read_json(&path, "BadConfig", 16 << 20)?;
        let bad =
            |f: &str, what: &str| InputsError::new("BadConfig", &path, format!("{f}: {what}"));
        let top = v
            .as_object()
            .ok_or_else(|| bad("(root)", "not an object"))?;
        let text = top
            .get("text_config")
            .and_then(Value::as_object)
            .unwrap_or(top);
        for f in REQUIRED {
            if !text.contains_key(*f) {
                return Err(bad(f, "missing (required by config.zig parse)"));
            }
        }
        for f in [
            "model_type",
            "bos_token_id",
            "eos_token_id",
            "quantization_config",
        ] {
            if !top.contains_key(f) {
                return Err(bad(f, "missing at the top level"));
            }
        }
        // the family's identity (`config.zig`): dsv41, EXL3 with the mul1 codebook
        let q = &top["quantization_config"];
        for (field, found, want) in [
            ("model_type", &top["model_type"], "deepseek_v41"),
            (
                "quantization_config.quant_method",
                &q["quant_method"],
                "exl3",
            ),
            ("quantization_config.codebook", &q["codebook"], "mul1"),
        ] {
            if found.as_str() != Some(want) {
                return Err(InputsError::new(
                    "UnsupportedModel",
                    &path,
                    format!("{field} is {found}, the dsv41 engine only serves {want}"),
                ));
            }
        }
        for f in [
            "factor",
            "beta_fast",
            "beta_slow",
            "original_max_position_embeddings",
        ] {
            if text["rope_scaling"].get(f).is_none() {
                return Err(bad(&format!("rope_scaling.{f}"), "missing"));
            }
        }
        let u = |f: &str| {
            text[f]
                .as_u64()
                .ok_or_else(|| bad(f, "not a non-negative integer"))
        };
        let ids = |f: &str| -> Result<Vec<u64>, InputsError> {
            text[f]
                .as_array()
                .and_then(|a| a.iter().map(Value::as_u64).collect::<Option<Vec<_>>>())
                .ok_or_else(|| bad(f, "not a list of integers"))
        };
        let engram_layers = ids("engram_layer_ids")?;
        if ids("engram_num_embeddings")?.len() != engram_layers.len() {
            return Err(bad(
                "engram_num_embeddings",
                "needs one row count per Engram layer",
            ));
        }
        Ok(Self {
            hidden: u("hidden_size")?,
            vocab: u("vocab_size")?,
            layers: u("num_hidden_layers")?,
            heads: u("num_attention_heads")?,
            head_dim: u("head_dim")?,
            rope_dim: u("qk_rope_head_dim")?,
            engram_layers,
            compressed_vocab: u("engram_compressed_vocab_size")?,
            vision: top.get("vision_config").is_some_and(|v| !v.is_null()),
            model_type: top["model_type"].as_str().unwrap_or_default().to_owned(),
        })
    }
}

/// `get_vocab_size(with_added_tokens=True)` of `MODEL_DIR/tokenizer.json`: distinct token strings
/// of `model.vocab` and `added_tokens`.
///
/// # Errors
/// `NoTokenizer` when the file is missing or not a tokenizer.
pub fn tokenizer_vocab_size(model_dir: &Path) -> Result<usize, InputsError> {
    let path = model_dir.join("tokenizer.json");
    let v = read_json(&path, "NoTokenizer", 256 << 20)?;
    let mut toks: HashSet<String> = HashSet::new();
    match &v["model"]["vocab"] {
        Value::Object(m) => toks.extend(m.keys().cloned()),
        Value::Array(a) => {
            for (i, p) in a.iter().enumerate() {
                toks.insert(p[0].as_str().map_or_else(|| format!("#{i}"), str::to_owned));
            }
        }
        _ => return Err(InputsError::new("NoTokenizer", &path, "no model.vocab")),
    }
    if let Some(added) = v["added_tokens"].as_array() {
        for a in added {
            if let Some(c) = a["content"].as_str() {
                toks.insert(c.to_owned());
            }
        }
    }
    Ok(toks.len())
}

/// Reads the token map: a JSON list of ints, one per token id (vocabulary including added
/// tokens), each a compressed id below `engram_compressed_vocab_size`. 64 MiB limit.
///
/// # Errors
/// `NoTokenMap` (missing, too large, not a list of ints) or `BadTokenMap` (wrong length, an id
/// out of range).
pub fn read_token_map(
    path: &Path,
    vocab_with_added: usize,
    compressed_vocab: u64,
) -> Result<Vec<i32>, InputsError> {
    let v = read_json(path, "NoTokenMap", 64 << 20)?;
    let list = v
        .as_array()
        .ok_or_else(|| InputsError::new("NoTokenMap", path, "not a JSON list"))?;
    let mut out = Vec::with_capacity(list.len());
    for (i, x) in list.iter().enumerate() {
        let n = x
            .as_i64()
            .and_then(|n| i32::try_from(n).ok())
            .ok_or_else(|| {
                InputsError::new("NoTokenMap", path, format!("entry {i} is not an i32"))
            })?;
        if n < 0 || n as u64 >= compressed_vocab {
            return Err(InputsError::new(
                "BadTokenMap",
                path,
                format!(
                    "entry {i} = {n} is outside 0..{compressed_vocab} (engram_compressed_vocab_size)"
                ),
            ));
        }
        out.push(n);
    }
    if out.len() != vocab_with_added {
        return Err(InputsError::new(
            "BadTokenMap",
            path,
            format!(
                "{} entries, but tokenizer.json has {vocab_with_added} tokens (with added tokens)",
                out.len()
            ),
        ));
    }
    Ok(out)
}

/// Reads an API key file: `label: key` lines; blank lines and `#` comments skipped; a line
/// without a colon is taken whole as a key.
///
/// # Errors
/// `BadApiKeyFile` when unreadable or without any key.
pub fn read_api_keys(path: &Path) -> Result<Vec<String>, InputsError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| InputsError::new("BadApiKeyFile", path, e.to_string()))?;
    let keys: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.split_once(':').map_or(l, |(_, k)| k.trim()).to_owned())
        .filter(|k| !k.is_empty())
        .collect();
    if keys.is_empty() {
        return Err(InputsError::new(
            "BadApiKeyFile",
            path,
            "no `label: key` line",
        ));
    }
    Ok(keys)
}
