//! The inputs both ranks load and check before they meet (docs/engine-contract.md, "What each
//! rank reads"): `config.json`, `tokenizer.json`, the token map, the kernel kit, the Engram tables,
//! and the safetensors headers of the checkpoint (for the split proof's full computation).
//!
//! The stand-in does **not** run the engine's config shape guard (the real model's dimensions): it
//! serves test-scale checkpoints. It does require every `config.json` field the engine reads
//! (`REQUIRED`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde_json::Value;

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

/// What the kit check found.
#[derive(Debug, Clone, PartialEq)]
pub struct KitReport {
    /// Rows of each RoPE table.
    pub rope_rows: u64,
    /// Engram multiplier rows (one per Engram layer).
    pub engram_layers: usize,
    /// Tensors in `vision/gate_bias_vl.safetensors` (0 without vision).
    pub bias_vl_tensors: usize,
}

const ROPE_FILES: [&str; 4] = [
    "rope-plain-cos.f32",
    "rope-plain-sin.f32",
    "rope-compressed-cos.f32",
    "rope-compressed-sin.f32",
];

/// Checks the kernel kit: the four RoPE tables with at least `pool + 49` rows of
/// `rope_dim / 2` fp32, `engram.json` with one multiplier row per Engram layer, the recorded
/// Triton set `aot.json` in `kernels`, and `vision/gate_bias_vl.safetensors` when the config has
/// `vision_config`.
///
/// # Errors
/// `NoKit`, `NoRopeTables`, `RopeTableTooShort`, `BadEngramJson`, `NoKernelImages`,
/// `NoVisionBias`.
pub fn check_kit(
    kit: &Path,
    kernels: &Path,
    cfg: &ModelConfig,
    pool: u64,
) -> Result<KitReport, InputsError> {
    if !kit.is_dir() {
        return Err(InputsError::new("NoKit", kit, "not a directory"));
    }
    let half = (cfg.rope_dim / 2).max(1);
    let mut rows = u64::MAX;
    for f in ROPE_FILES {
        let p = kit.join(f);
        super::opened::record(&p);
        let len = std::fs::metadata(&p)
            .map_err(|e| InputsError::new("NoRopeTables", &p, e.to_string()))?
            .len();
        if len % (half * 4) != 0 {
            return Err(InputsError::new(
                "NoRopeTables",
                &p,
                format!("{len} bytes is not a whole number of {half}-float rows"),
            ));
        }
        rows = rows.min(len / (half * 4));
    }
    if rows < pool + 49 {
        return Err(InputsError::new(
            "RopeTableTooShort",
            &kit.join(ROPE_FILES[0]),
            format!(
                "{rows} rows, the pool {pool} needs pool + 49 = {}",
                pool + 49
            ),
        ));
    }
    let ej = kit.join("engram.json");
    let v = read_json(&ej, "BadEngramJson", 16 << 20)?;
    let mult = v["multipliers"]
        .as_array()
        .ok_or_else(|| InputsError::new("BadEngramJson", &ej, "no \"multipliers\" list"))?;
    if mult.len() != cfg.engram_layers.len()
        || !mult.iter().all(|r| {
            r.as_array()
                .is_some_and(|r| !r.is_empty() && r.iter().all(|x| x.as_i64().is_some()))
        })
    {
        return Err(InputsError::new(
            "BadEngramJson",
            &ej,
            format!(
                "\"multipliers\" must hold {} lists of i64 (one per Engram layer)",
                cfg.engram_layers.len()
            ),
        ));
    }
    let aot = kernels.join("aot.json");
    let v = read_json(&aot, "NoKernelImages", 64 << 20)?;
    if !v["kernels"].is_array() {
        return Err(InputsError::new(
            "NoKernelImages",
            &aot,
            "no \"kernels\" list",
        ));
    }
    // Kernel images are loaded as modules: every image aot.json lists, and the kit's prebuilt
    // cubins (the engine's linear and expert kernels), must be readable.
    for k in v["kernels"].as_array().into_iter().flatten() {
        let Some(hash) = k["hash"].as_str() else {
            return Err(InputsError::new(
                "NoKernelImages",
                &aot,
                "a kernel without \"hash\"",
            ));
        };
        let p = kernels.join("cubins").join(format!("{hash}.cubin"));
        super::opened::record(&p);
        std::fs::metadata(&p).map_err(|e| InputsError::new("NoKernelImages", &p, e.to_string()))?;
    }
    let cubins = kit.join("cubins");
    if let Ok(rd) = std::fs::read_dir(&cubins) {
        for p in rd.filter_map(Result::ok).map(|e| e.path()) {
            if p.extension().is_some_and(|x| x == "cubin") {
                super::opened::record(&p);
            }
        }
    }
    let mut bias_vl_tensors = 0;
    if cfg.vision {
        let p = kit.join("vision/gate_bias_vl.safetensors");
        let h = SafetensorsHeader::read(&p).map_err(|e| {
            InputsError::new(
                "NoVisionBias",
                &p,
                format!("config.json has vision_config, so the kit needs it: {e}"),
            )
        })?;
        bias_vl_tensors = h
            .tensors
            .keys()
            .filter(|k| k.ends_with("ffn.gate.bias_vl"))
            .count();
        if bias_vl_tensors == 0 {
            return Err(InputsError::new(
                "NoVisionBias",
                &p,
                "no *.ffn.gate.bias_vl tensors",
            ));
        }
    }
    Ok(KitReport {
        rope_rows: rows,
        engram_layers: mult.len(),
        bias_vl_tensors,
    })
}

/// Checks the Engram tables directory: every `*.safetensors` (symlinks followed) is
/// parsed; tensors ending in `engram.embed.weight` / `engram.embed.scale` are keyed by the layer
/// id in `layers.<id>.`; both must exist for every Engram layer, with equal row counts.
///
/// # Errors
/// `NoEngramTables` (directory unreadable, a header that does not parse),
/// `MissingEngramTable`, `EngramRowsDiffer`.
pub fn check_engram(dir: &Path, cfg: &ModelConfig) -> Result<BTreeMap<u64, u64>, InputsError> {
    let rd = std::fs::read_dir(dir)
        .map_err(|e| InputsError::new("NoEngramTables", dir, e.to_string()))?;
    let mut weight: HashMap<u64, u64> = HashMap::new();
    let mut scale: HashMap<u64, u64> = HashMap::new();
    let mut names: Vec<PathBuf> = rd
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    names.sort();
    for p in names {
        let h = SafetensorsHeader::read(&p)
            .map_err(|e| InputsError::new("NoEngramTables", &p, e.to_string()))?;
        for (name, t) in &h.tensors {
            let slot = if name.ends_with("engram.embed.weight") {
                &mut weight
            } else if name.ends_with("engram.embed.scale") {
                &mut scale
            } else {
                continue;
            };
            let id = name
                .split("layers.")
                .nth(1)
                .and_then(|r| r.split('.').next())
                .and_then(|n| n.parse::<u64>().ok());
            if let Some(id) = id {
                slot.insert(id, t.shape.first().copied().unwrap_or(0));
            }
        }
    }
    let mut out = BTreeMap::new();
    for id in &cfg.engram_layers {
        let (Some(w), Some(s)) = (weight.get(id), scale.get(id)) else {
            return Err(InputsError::new(
                "MissingEngramTable",
                dir,
                format!("layer {id}: need both layers.{id}.engram.embed.weight and .scale"),
            ));
        };
        if w != s {
            return Err(InputsError::new(
                "EngramRowsDiffer",
                dir,
                format!("layer {id}: {w} weight rows but {s} scale rows"),
            ));
        }
        out.insert(*id, *w);
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

/// One tensor of a safetensors header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StTensor {
    /// safetensors dtype (`I16`, `F16`, ...).
    pub dtype: String,
    /// Shape.
    pub shape: Vec<u64>,
    /// Absolute file offset of the first byte.
    pub start: u64,
    /// Absolute file offset past the last byte.
    pub end: u64,
}

/// A parsed safetensors header (own parser: u64 LE header length, JSON, data offsets relative to
/// the end of the header).
#[derive(Debug, Clone)]
pub struct SafetensorsHeader {
    /// The file.
    pub path: PathBuf,
    /// Tensors by name.
    pub tensors: BTreeMap<String, StTensor>,
}

impl SafetensorsHeader {
    /// Parses the header of `path` (following symlinks).
    ///
    /// # Errors
    /// A message for a short file, a header over 100 MB, bad JSON or offsets past the end.
    pub fn read(path: &Path) -> Result<Self, String> {
        super::opened::record(path);
        let mut f = File::open(path).map_err(|e| format!("cannot open: {e}"))?;
        let len = f.metadata().map_err(|e| e.to_string())?.len();
        let mut n = [0u8; 8];
        f.read_exact(&mut n)
            .map_err(|e| format!("no header: {e}"))?;
        let n = u64::from_le_bytes(n);
        if n > 100_000_000 || n + 8 > len {
            return Err(format!(
                "header length {n} is not plausible for {len} bytes"
            ));
        }
        let mut h = vec![0u8; n as usize];
        f.read_exact(&mut h).map_err(|e| e.to_string())?;
        let v: Value = serde_json::from_slice(&h).map_err(|e| format!("header JSON: {e}"))?;
        let obj = v.as_object().ok_or("header is not an object")?;
        let base = 8 + n;
        let mut tensors = BTreeMap::new();
        for (name, t) in obj {
            if name == "__metadata__" {
                continue;
            }
            let dtype = t["dtype"].as_str().ok_or(format!("{name}: no dtype"))?;
            let shape: Vec<u64> = t["shape"]
                .as_array()
                .and_then(|a| a.iter().map(Value::as_u64).collect())
                .ok_or(format!("{name}: bad shape"))?;
            let off: Vec<u64> = t["data_offsets"]
                .as_array()
                .and_then(|a| a.iter().map(Value::as_u64).collect())
                .filter(|o: &Vec<u64>| o.len() == 2 && o[0] <= o[1])
                .ok_or(format!("{name}: bad data_offsets"))?;
            if base + off[1] > len {
                return Err(format!("{name}: data past the end of the file"));
            }
            tensors.insert(
                name.clone(),
                StTensor {
                    dtype: dtype.to_owned(),
                    shape,
                    start: base + off[0],
                    end: base + off[1],
                },
            );
        }
        Ok(Self {
            path: path.to_path_buf(),
            tensors,
        })
    }
}

/// The checkpoint in `MODEL_DIR`: `model.safetensors.index.json` and the shard headers, read on
/// demand.
#[derive(Debug)]
pub struct Checkpoint {
    dir: PathBuf,
    weight_map: BTreeMap<String, String>,
    headers: std::sync::Mutex<HashMap<String, SafetensorsHeader>>,
}

impl Checkpoint {
    /// Reads `MODEL_DIR/model.safetensors.index.json`.
    ///
    /// # Errors
    /// `BadCheckpoint` when missing or without a `weight_map`.
    pub fn open(model_dir: &Path) -> Result<Self, InputsError> {
        let p = model_dir.join("model.safetensors.index.json");
        let v = read_json(&p, "BadCheckpoint", 256 << 20)?;
        let weight_map = v["weight_map"]
            .as_object()
            .ok_or_else(|| InputsError::new("BadCheckpoint", &p, "no weight_map"))?
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
            .collect();
        Ok(Self {
            dir: model_dir.to_path_buf(),
            weight_map,
            headers: std::sync::Mutex::new(HashMap::new()),
        })
    }

    /// Reads one whole tensor: its dtype, shape and bytes.
    ///
    /// # Errors
    /// A message when the tensor is not in the index or its shard cannot be read.
    pub fn tensor(&self, name: &str) -> Result<(StTensor, Vec<u8>), String> {
        let shard = self
            .weight_map
            .get(name)
            .ok_or_else(|| format!("{name} is not in model.safetensors.index.json"))?;
        let t = {
            let mut hs = self.headers.lock().map_err(|_| "header cache poisoned")?;
            if !hs.contains_key(shard) {
                let h = SafetensorsHeader::read(&self.dir.join(shard))
                    .map_err(|e| format!("{shard}: {e}"))?;
                hs.insert(shard.clone(), h);
            }
            hs[shard]
                .tensors
                .get(name)
                .cloned()
                .ok_or_else(|| format!("{name} is not in {shard}'s header"))?
        };
        let f = File::open(self.dir.join(shard)).map_err(|e| format!("{shard}: {e}"))?;
        let mut buf = vec![0u8; (t.end - t.start) as usize];
        f.read_exact_at(&mut buf, t.start)
            .map_err(|e| format!("{shard}: {e}"))?;
        Ok((t, buf))
    }
}
