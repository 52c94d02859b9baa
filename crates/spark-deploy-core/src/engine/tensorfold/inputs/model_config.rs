//! The dsv41 checkpoint's `config.json` as the engine reads it, and the engine's shape guard (the
//! one checkpoint shape it serves).

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

/// Why `config.json` was refused. Every variant names the file and the field path.
#[derive(Debug, thiserror::Error)]
pub enum ModelConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}; check that the checkpoint download finished")]
    Read {
        /// The config file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not JSON.
    #[error("{path} is not valid JSON: {source}; re-download config.json")]
    Json {
        /// The config file.
        path: PathBuf,
        /// The parse error.
        source: serde_json::Error,
    },
    /// A required field is missing.
    #[error("{path}: field `{field}` is missing; this is not a DeepSeek-V4.1 EXL3 config.json")]
    Missing {
        /// The config file.
        path: PathBuf,
        /// The field path, e.g. `text_config.hidden_size`.
        field: String,
    },
    /// A field has the wrong type or an impossible value.
    #[error("{path}: field `{field}` {problem}; fix or re-download config.json")]
    Invalid {
        /// The config file.
        path: PathBuf,
        /// The field path.
        field: String,
        /// What is wrong.
        problem: String,
    },
    /// The engine's shape guard refuses the config.
    #[error(
        "{path}: field `{field}` is {found}, the TensorFold dsv41 engine only serves {expected}; use the DeepSeek-V4.1-Flash EXL3 mul1 checkpoint"
    )]
    Shape {
        /// The config file.
        path: PathBuf,
        /// The field path.
        field: String,
        /// The value found.
        found: String,
        /// The value the engine requires.
        expected: String,
    },
}

/// The dimensions the split plan, the token map and the RoPE tables take from `config.json`.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub struct ModelConfig {
    pub model_type: String,
    pub quant_method: String,
    pub codebook: String,
    pub layers: usize,
    pub draft_layers: usize,
    pub hidden: usize,
    pub vocab: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub rope_dim: usize,
    pub q_lora: usize,
    pub o_lora: usize,
    pub o_groups: usize,
    pub window: usize,
    pub experts: usize,
    pub top_k: usize,
    pub expert_width: usize,
    pub shared_experts: usize,
    pub routed_scaling: f64,
    pub swiglu_limit: f64,
    pub eps: f64,
    /// Compression ratio per block (targets, then DSpark blocks).
    pub ratios: Vec<u8>,
    pub kv_sources: Vec<usize>,
    pub index_sources: Vec<usize>,
    pub index_heads: usize,
    pub index_head_dim: usize,
    pub index_topk: usize,
    pub candidate_source: usize,
    pub candidate_blocks: usize,
    pub candidate_block: usize,
    pub hc: usize,
    pub hc_iters: usize,
    pub hc_eps: f64,
    pub engram_layers: Vec<usize>,
    pub engram_rows: Vec<u64>,
    pub engram_heads: usize,
    pub engram_head_dim: usize,
    pub engram_ngram: usize,
    pub engram_vocab: usize,
    pub engram_pad: usize,
    pub engram_compressed_vocab: usize,
    pub dspark_block: usize,
    pub dspark_noise: usize,
    pub dspark_taps: Vec<usize>,
    pub markov_rank: usize,
    pub draft_experts: usize,
    pub draft_top_k: usize,
    pub max_position: usize,
    pub rope_theta: f64,
    pub rope_factor: f64,
    pub beta_fast: f64,
    pub beta_slow: f64,
    pub original_max_position: usize,
    pub compress_rope_theta: f64,
    pub bos: usize,
    pub eos: usize,
    pub image_token: Option<usize>,
    pub vision: bool,
}

/// The largest value each dimension of `config.json` may claim: several times the real
/// checkpoint's, and small enough that every product the split plan, the token map and the RoPE
/// tables form of them fits in 64 bits and no list they size can exhaust memory. Checked while the
/// file is parsed, before anything is sized from it. Fields not listed (token ids, counts of
/// iterations) are at most 2^32.
pub const DIMENSION_LIMITS: &[(&str, u64)] = &[
    ("num_hidden_layers", 256),
    ("num_nextn_predict_layers", 16),
    ("hidden_size", 1 << 16),
    ("vocab_size", 1 << 22),
    ("num_attention_heads", 1 << 10),
    ("head_dim", 1 << 12),
    ("qk_rope_head_dim", 1 << 12),
    ("q_lora_rank", 1 << 16),
    ("o_lora_rank", 1 << 16),
    ("o_groups", 1 << 10),
    ("sliding_window", 1 << 20),
    ("n_routed_experts", 1 << 12),
    ("num_experts_per_tok", 1 << 12),
    ("moe_intermediate_size", 1 << 16),
    ("n_shared_experts", 64),
    ("index_n_heads", 1 << 10),
    ("index_head_dim", 1 << 12),
    ("index_topk", 1 << 20),
    ("candidate_topk_blocks", 1 << 20),
    ("candidate_block_size", 1 << 12),
    ("hc_mult", 64),
    ("engram_n_heads", 1 << 10),
    ("engram_head_dim", 1 << 12),
    ("engram_max_ngram_size", 64),
    ("dspark_block_size", 1 << 10),
    ("dspark_markov_rank", 1 << 16),
    ("dspark_n_routed_experts", 1 << 12),
    ("dspark_num_experts_per_tok", 1 << 12),
    ("max_position_embeddings", 1 << 26),
    ("original_max_position_embeddings", 1 << 26),
    ("engram_num_embeddings", 1 << 40),
];

/// The default limit of a field [`DIMENSION_LIMITS`] does not list.
pub const OTHER_FIELD_LIMIT: u64 = 1 << 32;

/// At most this many expert blocks in all (`num_hidden_layers × (n_routed_experts + 1) +
/// num_nextn_predict_layers × (dspark_n_routed_experts + 1)`; 15,787 in the real checkpoint): each
/// is 9 entries of the rank file's plan.
pub const MAX_EXPERT_BLOCKS: u64 = 1 << 16;

fn limit_of(key: &str) -> u64 {
    DIMENSION_LIMITS
        .iter()
        .find(|(k, _)| *k == key)
        .map_or(OTHER_FIELD_LIMIT, |(_, max)| *max)
}

struct Fields<'a> {
    path: &'a Path,
    prefix: &'a str,
    obj: &'a Map<String, Value>,
}

impl Fields<'_> {
    fn name(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }
    fn get(&self, key: &str) -> Result<&Value, ModelConfigError> {
        self.obj.get(key).ok_or_else(|| ModelConfigError::Missing {
            path: self.path.to_path_buf(),
            field: self.name(key),
        })
    }
    fn invalid(&self, key: &str, problem: &str) -> ModelConfigError {
        ModelConfigError::Invalid {
            path: self.path.to_path_buf(),
            field: self.name(key),
            problem: problem.to_owned(),
        }
    }
    fn uint(&self, key: &str) -> Result<usize, ModelConfigError> {
        let v = self
            .get(key)?
            .as_u64()
            .ok_or_else(|| self.invalid(key, "is not a non-negative integer"))?;
        let max = limit_of(key);
        if v > max {
            return Err(self.invalid(
                key,
                &format!("is {v}, more than the {max} spark-deploy accepts"),
            ));
        }
        usize::try_from(v).map_err(|_| self.invalid(key, "does not fit this machine's usize"))
    }
    fn number(&self, key: &str) -> Result<f64, ModelConfigError> {
        self.get(key)?
            .as_f64()
            .ok_or_else(|| self.invalid(key, "is not a number"))
    }
    fn string(&self, key: &str) -> Result<String, ModelConfigError> {
        self.get(key)?
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| self.invalid(key, "is not a string"))
    }
    fn uints(&self, key: &str, max_len: Option<usize>) -> Result<Vec<u64>, ModelConfigError> {
        let arr = self
            .get(key)?
            .as_array()
            .ok_or_else(|| self.invalid(key, "is not a list"))?;
        if let Some(max) = max_len
            && arr.len() > max
        {
            return Err(self.invalid(key, &format!("lists {} values, at most {max}", arr.len())));
        }
        let max = limit_of(key);
        arr.iter()
            .map(|v| match v.as_u64() {
                Some(v) if v <= max => Ok(v),
                Some(v) => Err(self.invalid(
                    key,
                    &format!("holds {v}, more than the {max} spark-deploy accepts"),
                )),
                None => Err(self.invalid(key, "holds a value that is not a non-negative integer")),
            })
            .collect()
    }
    fn ids(&self, key: &str) -> Result<Vec<usize>, ModelConfigError> {
        self.uints(key, Some(8))?
            .into_iter()
            .map(|v| usize::try_from(v).map_err(|_| self.invalid(key, "holds an id above usize")))
            .collect()
    }
    fn object(&self, key: &str) -> Result<&Map<String, Value>, ModelConfigError> {
        self.get(key)?
            .as_object()
            .ok_or_else(|| self.invalid(key, "is not an object"))
    }
}

impl ModelConfig {
    /// Reads and parses `dir/config.json`.
    ///
    /// # Errors
    /// [`ModelConfigError::Read`] / [`ModelConfigError::Json`] when the file is unreadable, and the
    /// errors of [`ModelConfig::parse`].
    pub fn read(dir: &Path) -> Result<Self, ModelConfigError> {
        let path = dir.join("config.json");
        let text =
            crate::safe_fs::read_capped(&path, crate::safe_fs::JSON_CAP).map_err(|source| {
                ModelConfigError::Read {
                    path: path.clone(),
                    source,
                }
            })?;
        Self::parse(&path, &text)
    }

    /// Parses `config.json`'s bytes (`path` is only used in errors): the dimensions from
    /// `text_config` (or the top level), the rest from the top level, as the engine's `config.zig`.
    /// No shape guard; see [`ModelConfig::check_engine_shapes`].
    ///
    /// # Errors
    /// A missing or ill-typed field, with its path; `compress_ratios` not one per block;
    /// `engram_num_embeddings` not one per Engram layer.
    pub fn parse(path: &Path, text: &[u8]) -> Result<Self, ModelConfigError> {
        let root: Value =
            serde_json::from_slice(text).map_err(|source| ModelConfigError::Json {
                path: path.to_path_buf(),
                source,
            })?;
        let empty = Map::new();
        let top_obj = root.as_object().unwrap_or(&empty);
        if root.as_object().is_none() {
            return Err(ModelConfigError::Invalid {
                path: path.to_path_buf(),
                field: "(root)".into(),
                problem: "is not a JSON object".into(),
            });
        }
        let top = Fields {
            path,
            prefix: "",
            obj: top_obj,
        };
        let (prefix, obj) = match top_obj.get("text_config") {
            Some(Value::Object(o)) => ("text_config.", o),
            _ => ("", top_obj),
        };
        let t = Fields { path, prefix, obj };
        let q = Fields {
            path,
            prefix: "quantization_config.",
            obj: top.object("quantization_config")?,
        };
        let rope = Fields {
            path,
            prefix: if prefix.is_empty() {
                "rope_scaling."
            } else {
                "text_config.rope_scaling."
            },
            obj: t.object("rope_scaling")?,
        };
        let c = ModelConfig {
            model_type: top.string("model_type")?,
            quant_method: q.string("quant_method")?,
            codebook: q.string("codebook")?,
            layers: t.uint("num_hidden_layers")?,
            draft_layers: t.uint("num_nextn_predict_layers")?,
            hidden: t.uint("hidden_size")?,
            vocab: t.uint("vocab_size")?,
            heads: t.uint("num_attention_heads")?,
            head_dim: t.uint("head_dim")?,
            rope_dim: t.uint("qk_rope_head_dim")?,
            q_lora: t.uint("q_lora_rank")?,
            o_lora: t.uint("o_lora_rank")?,
            o_groups: t.uint("o_groups")?,
            window: t.uint("sliding_window")?,
            experts: t.uint("n_routed_experts")?,
            top_k: t.uint("num_experts_per_tok")?,
            expert_width: t.uint("moe_intermediate_size")?,
            shared_experts: t.uint("n_shared_experts")?,
            routed_scaling: t.number("routed_scaling_factor")?,
            swiglu_limit: t.number("swiglu_limit")?,
            eps: t.number("rms_norm_eps")?,
            ratios: Vec::new(),
            kv_sources: t.ids("kv_source_layer_ids")?,
            index_sources: t.ids("index_source_layer_ids")?,
            index_heads: t.uint("index_n_heads")?,
            index_head_dim: t.uint("index_head_dim")?,
            index_topk: t.uint("index_topk")?,
            candidate_source: t.uint("candidate_source_layer_id")?,
            candidate_blocks: t.uint("candidate_topk_blocks")?,
            candidate_block: t.uint("candidate_block_size")?,
            hc: t.uint("hc_mult")?,
            hc_iters: t.uint("hc_sinkhorn_iters")?,
            hc_eps: t.number("hc_eps")?,
            engram_layers: t.ids("engram_layer_ids")?,
            engram_rows: t.uints("engram_num_embeddings", Some(2))?,
            engram_heads: t.uint("engram_n_heads")?,
            engram_head_dim: t.uint("engram_head_dim")?,
            engram_ngram: t.uint("engram_max_ngram_size")?,
            engram_vocab: t.uint("engram_vocab_size")?,
            engram_pad: t.uint("engram_pad_token_id")?,
            engram_compressed_vocab: t.uint("engram_compressed_vocab_size")?,
            dspark_block: t.uint("dspark_block_size")?,
            dspark_noise: t.uint("dspark_noise_token_id")?,
            dspark_taps: t.ids("dspark_target_layer_ids")?,
            markov_rank: t.uint("dspark_markov_rank")?,
            draft_experts: t.uint("dspark_n_routed_experts")?,
            draft_top_k: t.uint("dspark_num_experts_per_tok")?,
            max_position: t.uint("max_position_embeddings")?,
            rope_theta: t.number("rope_theta")?,
            rope_factor: rope.number("factor")?,
            beta_fast: rope.number("beta_fast")?,
            beta_slow: rope.number("beta_slow")?,
            original_max_position: rope.uint("original_max_position_embeddings")?,
            compress_rope_theta: t.number("compress_rope_theta")?,
            bos: top.uint("bos_token_id")?,
            eos: top.uint("eos_token_id")?,
            image_token: top_obj
                .get("image_token_id")
                .and_then(Value::as_u64)
                .and_then(|v| usize::try_from(v).ok()),
            vision: top_obj.contains_key("vision_config"),
        };
        let blocks = (c.layers as u64) * (c.experts as u64 + 1)
            + (c.draft_layers as u64) * (c.draft_experts as u64 + 1);
        if blocks > MAX_EXPERT_BLOCKS {
            return Err(t.invalid(
                "num_hidden_layers",
                &format!(
                    "is {} with {} routed experts (and {} DSpark blocks of {}): {blocks} expert blocks, more than the {MAX_EXPERT_BLOCKS} spark-deploy accepts",
                    c.layers, c.experts, c.draft_layers, c.draft_experts
                ),
            ));
        }
        let ratios = t.uints("compress_ratios", Some(c.layers + c.draft_layers))?;
        if ratios.len() != c.layers + c.draft_layers {
            return Err(t.invalid(
                "compress_ratios",
                &format!(
                    "lists {} ratios for {} layers and {} DSpark blocks",
                    ratios.len(),
                    c.layers,
                    c.draft_layers
                ),
            ));
        }
        if let Some(bad) = ratios.iter().find(|r| **r > 2) {
            return Err(t.invalid(
                "compress_ratios",
                &format!("holds {bad}, ratios are 0, 1 or 2"),
            ));
        }
        if c.engram_rows.len() != c.engram_layers.len() || c.engram_rows.len() > 2 {
            return Err(t.invalid(
                "engram_num_embeddings",
                &format!(
                    "lists {} row counts for {} Engram layers (at most 2)",
                    c.engram_rows.len(),
                    c.engram_layers.len()
                ),
            ));
        }
        Ok(ModelConfig {
            ratios: ratios.into_iter().map(|r| r as u8).collect(),
            ..c
        })
    }

    /// What the engine refuses for every checkpoint, test-scale or not (`config.zig` `parse`):
    /// `model_type` other than `deepseek_v41`, quantization other than EXL3 with the `mul1` codebook.
    ///
    /// # Errors
    /// [`ModelConfigError::Shape`] naming the field.
    pub fn check_model_kind(&self, path: &Path) -> Result<(), ModelConfigError> {
        let s = |field: &str, found: &str, expected: &str| ModelConfigError::Shape {
            path: path.to_path_buf(),
            field: field.to_owned(),
            found: format!("`{found}`"),
            expected: format!("`{expected}`"),
        };
        if self.model_type != "deepseek_v41" {
            return Err(s("model_type", &self.model_type, "deepseek_v41"));
        }
        if self.quant_method != "exl3" {
            return Err(s(
                "quantization_config.quant_method",
                &self.quant_method,
                "exl3",
            ));
        }
        if self.codebook != "mul1" {
            return Err(s("quantization_config.codebook", &self.codebook, "mul1"));
        }
        Ok(())
    }

    /// The engine's guard (`config.zig` `parse` + `checkShapes`): model type, EXL3 mul1, and the
    /// exact shapes of DeepSeek-V4.1-Flash. Run it for the real profile before writing anything;
    /// test-scale checkpoints skip it.
    ///
    /// # Errors
    /// [`ModelConfigError::Shape`] naming the first field that differs.
    pub fn check_engine_shapes(&self, path: &Path) -> Result<(), ModelConfigError> {
        let s = |field: &str, found: String, expected: &str| ModelConfigError::Shape {
            path: path.to_path_buf(),
            field: field.to_owned(),
            found,
            expected: expected.to_owned(),
        };
        self.check_model_kind(path)?;
        let checks: [(&str, usize, usize); 27] = [
            ("num_hidden_layers", self.layers, 40),
            ("num_nextn_predict_layers", self.draft_layers, 3),
            ("hidden_size", self.hidden, 5120),
            ("vocab_size", self.vocab, 129_280),
            ("num_attention_heads", self.heads, 64),
            ("head_dim", self.head_dim, 512),
            ("qk_rope_head_dim", self.rope_dim, 64),
            ("q_lora_rank", self.q_lora, 1280),
            ("o_lora_rank", self.o_lora, 1024),
            ("o_groups", self.o_groups, 8),
            ("sliding_window", self.window, 128),
            ("n_routed_experts", self.experts, 384),
            ("num_experts_per_tok", self.top_k, 6),
            ("moe_intermediate_size", self.expert_width, 2304),
            ("n_shared_experts", self.shared_experts, 1),
            ("index_n_heads", self.index_heads, 32),
            ("index_head_dim", self.index_head_dim, 128),
            ("index_topk", self.index_topk, 512),
            ("candidate_topk_blocks", self.candidate_blocks, 2048),
            ("candidate_block_size", self.candidate_block, 8),
            ("hc_mult", self.hc, 4),
            ("engram_layer_ids (count)", self.engram_layers.len(), 2),
            ("engram_n_heads", self.engram_heads, 8),
            ("engram_head_dim", self.engram_head_dim, 256),
            ("dspark_block_size", self.dspark_block, 5),
            ("dspark_markov_rank", self.markov_rank, 256),
            ("dspark_n_routed_experts", self.draft_experts, 128),
        ];
        for (field, found, want) in checks {
            if found != want {
                return Err(s(
                    &format!("text_config.{field}"),
                    found.to_string(),
                    &want.to_string(),
                ));
            }
        }
        if self.draft_top_k != 3 {
            return Err(s(
                "text_config.dspark_num_experts_per_tok",
                self.draft_top_k.to_string(),
                "3",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The real checkpoint's config, trimmed to the fields the engine reads.
    pub(crate) const FLASH: &str = r#"{"model_type": "deepseek_v41", "bos_token_id": 0, "eos_token_id": 1, "image_token_id": 129264,
 "quantization_config": {"quant_method": "exl3", "codebook": "mul1"},
 "text_config": {"vocab_size": 129280, "hidden_size": 5120, "moe_intermediate_size": 2304,
  "num_hidden_layers": 40, "num_attention_heads": 64, "head_dim": 512, "qk_rope_head_dim": 64,
  "q_lora_rank": 1280, "o_lora_rank": 1024, "o_groups": 8, "swiglu_limit": 10.0, "rms_norm_eps": 1e-20,
  "max_position_embeddings": 1048576, "rope_theta": 10000,
  "rope_scaling": {"factor": 16, "beta_fast": 32, "beta_slow": 1, "original_max_position_embeddings": 65536},
  "n_routed_experts": 384, "n_shared_experts": 1, "num_experts_per_tok": 6, "routed_scaling_factor": 1.5,
  "sliding_window": 128,
  "compress_ratios": [0,0,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,0,0,0],
  "compress_rope_theta": 160000, "kv_source_layer_ids": [2, 8, 14, 20],
  "index_source_layer_ids": [2, 8, 14, 20, 24, 28, 32, 36], "index_n_heads": 32, "index_head_dim": 128,
  "index_topk": 512, "candidate_source_layer_id": 20, "candidate_topk_blocks": 2048, "candidate_block_size": 8,
  "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-06, "engram_layer_ids": [1, 14],
  "engram_num_embeddings": [384006168, 384016682], "engram_max_ngram_size": 4, "engram_vocab_size": 16000000,
  "engram_n_heads": 8, "engram_head_dim": 256, "engram_pad_token_id": 2, "engram_compressed_vocab_size": 99092,
  "num_nextn_predict_layers": 3, "dspark_block_size": 5, "dspark_noise_token_id": 128799,
  "dspark_target_layer_ids": [37, 38, 39], "dspark_markov_rank": 256, "dspark_n_routed_experts": 128,
  "dspark_num_experts_per_tok": 3},
 "vision_config": {"num_hidden_layers": 32}}"#;

    pub(crate) fn flash() -> ModelConfig {
        ModelConfig::parse(Path::new("config.json"), FLASH.as_bytes()).unwrap()
    }

    #[test]
    fn parses_the_real_config_and_passes_the_guard() {
        let c = flash();
        c.check_engine_shapes(Path::new("config.json")).unwrap();
        assert_eq!(c.ratios[2], 2);
        assert_eq!(c.ratios[39], 1);
        assert_eq!(c.ratios[42], 0);
        assert_eq!(c.engram_rows[1], 384_016_682);
        assert_eq!(c.image_token, Some(129_264));
        assert!(c.vision);
        assert_eq!(c.original_max_position, 65536);
    }

    #[test]
    fn missing_and_bad_fields_name_their_path() {
        let text = FLASH.replace("\"hidden_size\": 5120, ", "");
        let e = ModelConfig::parse(Path::new("c.json"), text.as_bytes()).unwrap_err();
        assert!(e.to_string().contains("text_config.hidden_size"), "{e}");
        let text = FLASH.replace("\"beta_fast\": 32", "\"beta_fast\": \"x\"");
        let e = ModelConfig::parse(Path::new("c.json"), text.as_bytes()).unwrap_err();
        assert!(
            e.to_string().contains("text_config.rope_scaling.beta_fast"),
            "{e}"
        );
        let text = FLASH.replace("2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,", "2,");
        let e = ModelConfig::parse(Path::new("c.json"), text.as_bytes()).unwrap_err();
        assert!(e.to_string().contains("compress_ratios"), "{e}");
    }

    #[test]
    fn guard_refuses_other_shapes_with_the_field() {
        let text = FLASH.replace("\"num_experts_per_tok\": 6", "\"num_experts_per_tok\": 8");
        let c = ModelConfig::parse(Path::new("c.json"), text.as_bytes()).unwrap();
        let e = c.check_engine_shapes(Path::new("c.json")).unwrap_err();
        assert!(
            e.to_string().contains("text_config.num_experts_per_tok"),
            "{e}"
        );
        let text = FLASH.replace("\"mul1\"", "\"mcg\"");
        let c = ModelConfig::parse(Path::new("c.json"), text.as_bytes()).unwrap();
        let e = c.check_engine_shapes(Path::new("c.json")).unwrap_err();
        assert!(
            e.to_string().contains("quantization_config.codebook"),
            "{e}"
        );
    }

    #[test]
    fn absurd_dimensions_are_refused_while_parsing_naming_the_field() {
        for (from, to, field) in [
            (
                "\"n_routed_experts\": 384",
                "\"n_routed_experts\": 1000000000",
                "text_config.n_routed_experts",
            ),
            (
                "\"num_hidden_layers\": 40",
                "\"num_hidden_layers\": 1000000",
                "text_config.num_hidden_layers",
            ),
            (
                "\"hidden_size\": 5120",
                "\"hidden_size\": 18446744073709551615",
                "text_config.hidden_size",
            ),
            (
                "\"max_position_embeddings\": 1048576",
                "\"max_position_embeddings\": 9223372036854775807",
                "text_config.max_position_embeddings",
            ),
            (
                "\"qk_rope_head_dim\": 64",
                "\"qk_rope_head_dim\": 4294967296",
                "text_config.qk_rope_head_dim",
            ),
            (
                "\"engram_num_embeddings\": [384006168, 384016682]",
                "\"engram_num_embeddings\": [1, 2, 3]",
                "text_config.engram_num_embeddings",
            ),
            (
                "\"engram_num_embeddings\": [384006168, 384016682]",
                "\"engram_num_embeddings\": [2199023255553, 1]",
                "text_config.engram_num_embeddings",
            ),
            (
                "\"bos_token_id\": 0",
                "\"bos_token_id\": 4294967297",
                "bos_token_id",
            ),
        ] {
            assert!(FLASH.contains(from), "{from}");
            let text = FLASH.replace(from, to);
            let e = ModelConfig::parse(Path::new("c.json"), text.as_bytes()).unwrap_err();
            assert!(
                matches!(&e, ModelConfigError::Invalid { field: f, .. } if f == field),
                "{to}: {e}"
            );
            assert!(e.to_string().contains(field), "{e}");
        }
        // Layers and experts each within their limits, but too many expert blocks together.
        let text = FLASH
            .replace("\"num_hidden_layers\": 40", "\"num_hidden_layers\": 200")
            .replace("\"n_routed_experts\": 384", "\"n_routed_experts\": 4000");
        let e = ModelConfig::parse(Path::new("c.json"), text.as_bytes()).unwrap_err();
        assert!(e.to_string().contains("expert blocks"), "{e}");
        // A million compress ratios are refused by their count, before they are collected.
        let ratios = vec!["0"; 1_000_000].join(",");
        let text = FLASH.replace(
            "\"compress_ratios\": [0,0,2",
            &format!("\"compress_ratios\": [{ratios},0,0,2"),
        );
        let e = ModelConfig::parse(Path::new("c.json"), text.as_bytes()).unwrap_err();
        assert!(
            e.to_string().contains("compress_ratios") && e.to_string().contains("at most 43"),
            "{e}"
        );
    }
}
