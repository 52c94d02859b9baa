//! Test-scale dsv41 checkpoint generator (docs/testbed.md, "Fixtures").
//!
//! [`generate`] writes three directories under `out_dir`, deterministic from the spec's seed:
//! - `model/`: the EXL3 export as TensorFold reads it — the real tensor names, dtypes and EXL3
//!   part layout (`.trellis` int16 `[K/16, N/16, 16·bits]`, `.suh` f16 `[K]`, `.svh` f16 `[N]`),
//!   tiny dimensions declared in `config.json` with the real field names, a real byte-level BPE
//!   `tokenizer.json`, `model.safetensors.index.json`, N shards `model-0000i-of-0000N.safetensors`
//!   whose last one holds a vision tower;
//! - `original/`: the "original model" repo with the Engram tables
//!   (`layers.<id>.engram.embed.weight` F8_E4M3, `.engram.embed.scale` F8_E8M0) in two shards, the
//!   `*.ffn.gate.bias_vl` f32 tensors, its own index and `config.json`;
//! - `kit/`: `MANIFEST` (sha256sum format), RoPE tables + `rope.json`, `engram.json`,
//!   `vision/gate_bias_vl.safetensors`, and a few fake cubins.
//!
//! Shards are written streaming (bounded buffers), so the large spec never sits in memory.

mod kit;
mod overlay;
mod rng;
mod tensors;
mod tokenizer;
mod writer;

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use spark_deploy_core::engine::tensorfold::inputs::dtype::DType;
use spark_deploy_core::engine::tensorfold::inputs::token_map;

pub use overlay::{OVERLAID, OVERLAY_FILE, generate_overlay};
pub use rng::Rng;

/// Why a checkpoint could not be generated.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// Writing a file failed.
    #[error("cannot write {path}: {source}; check free space under the output directory")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The spec is inconsistent (a split boundary off a 16-tile, an id out of range, ...).
    #[error("invalid checkpoint spec: {0}; fix the CheckpointSpec")]
    Spec(String),
    /// A core input builder failed on the generated files.
    #[error("building {what} for the generated checkpoint failed: {message}")]
    Inputs {
        /// What was being built.
        what: &'static str,
        /// The error.
        message: String,
    },
}

/// The dimensions and seed of a generated checkpoint.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub struct CheckpointSpec {
    pub seed: u64,
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
    pub experts: usize,
    pub draft_experts: usize,
    pub expert_width: usize,
    pub index_heads: usize,
    pub index_head_dim: usize,
    pub hc: usize,
    pub kv_sources: Vec<usize>,
    pub index_sources: Vec<usize>,
    /// One per target layer and DSpark block.
    pub ratios: Vec<u8>,
    pub engram_layers: Vec<usize>,
    pub engram_rows: Vec<u64>,
    pub engram_heads: usize,
    pub engram_head_dim: usize,
    pub engram_ngram: usize,
    pub dspark_taps: Vec<usize>,
    pub markov_rank: usize,
    pub max_position: usize,
    pub original_max_position: usize,
    /// EXL3 bits per weight (trellis words per 16×16 tile = 16·bits).
    pub bits: usize,
    /// Text shards (the vision shard comes on top).
    pub text_shards: usize,
    /// Tokens in tokenizer.json (at most `vocab`).
    pub tokenizer_tokens: usize,
    /// Bytes of vision tower weights.
    pub vision_bytes: usize,
    pub top_k: usize,
    pub draft_top_k: usize,
    pub index_topk: usize,
    pub candidate_blocks: usize,
    pub engram_vocab: usize,
}

impl CheckpointSpec {
    /// A small checkpoint (about 10 MB) for tests: 4 layers, 2 DSpark blocks, 16 experts.
    #[must_use]
    pub fn small(seed: u64) -> Self {
        Self {
            seed,
            layers: 4,
            draft_layers: 2,
            hidden: 256,
            vocab: 1024,
            heads: 4,
            head_dim: 64,
            rope_dim: 32,
            q_lora: 128,
            o_lora: 64,
            // 4, not 2: every split dimension divides at W=4 as well (four testbed nodes).
            o_groups: 4,
            experts: 16,
            draft_experts: 8,
            expert_width: 256,
            index_heads: 2,
            index_head_dim: 64,
            hc: 4,
            kv_sources: vec![1, 2],
            index_sources: vec![1, 2, 3],
            ratios: vec![0, 2, 1, 0, 0, 0],
            engram_layers: vec![1, 3],
            engram_rows: vec![5003, 5011],
            engram_heads: 4,
            engram_head_dim: 64,
            engram_ngram: 4,
            dspark_taps: vec![1, 2, 3],
            markov_rank: 32,
            max_position: 4096,
            original_max_position: 1024,
            bits: 3,
            text_shards: 4,
            tokenizer_tokens: 900,
            vision_bytes: 1 << 20,
            top_k: 2,
            draft_top_k: 2,
            index_topk: 64,
            candidate_blocks: 64,
            engram_vocab: 4000,
        }
    }

    /// A medium checkpoint (about 330 MB): the small one with 256 experts of width 1024 in 8
    /// text shards (two waves of the fetch's 4 streams, so a rank file's start is final before
    /// the download ends), for the tests that interrupt a first deployment and count what it
    /// moved twice.
    #[must_use]
    pub fn medium(seed: u64) -> Self {
        Self {
            experts: 256,
            expert_width: 1024,
            text_shards: 8,
            ..Self::small(seed)
        }
    }

    /// A large checkpoint (about 2.6 GB of shards) for the rank-cache benchmark.
    #[must_use]
    pub fn large(seed: u64) -> Self {
        Self {
            seed,
            layers: 8,
            draft_layers: 2,
            hidden: 1024,
            vocab: 8192,
            heads: 8,
            head_dim: 128,
            rope_dim: 64,
            q_lora: 512,
            o_lora: 256,
            o_groups: 4,
            experts: 256,
            draft_experts: 64,
            expert_width: 1024,
            index_heads: 4,
            index_head_dim: 128,
            hc: 4,
            kv_sources: vec![2, 4],
            index_sources: vec![2, 4, 6],
            ratios: vec![0, 0, 2, 2, 1, 1, 1, 1, 0, 0],
            engram_layers: vec![1, 6],
            engram_rows: vec![20011, 20021],
            engram_heads: 8,
            engram_head_dim: 64,
            engram_ngram: 4,
            dspark_taps: vec![5, 6, 7],
            markov_rank: 64,
            max_position: 4096,
            original_max_position: 1024,
            bits: 3,
            text_shards: 8,
            tokenizer_tokens: 4000,
            vision_bytes: 16 << 20,
            top_k: 4,
            draft_top_k: 2,
            index_topk: 128,
            candidate_blocks: 256,
            engram_vocab: 40000,
        }
    }

    /// The real DeepSeek-V4.1-Flash shapes (its `config.json` dimensions; passes the engine's shape
    /// guard), with 3-bit trellises. Only for [`generate_sparse_model`]: the shards would be
    /// about 200 GiB.
    #[must_use]
    pub fn real_shapes(seed: u64) -> Self {
        let mut ratios = vec![0u8, 0];
        ratios.extend([2u8; 18]);
        ratios.extend([1u8; 20]);
        ratios.extend([0u8; 3]);
        Self {
            seed,
            layers: 40,
            draft_layers: 3,
            hidden: 5120,
            vocab: 129_280,
            heads: 64,
            head_dim: 512,
            rope_dim: 64,
            q_lora: 1280,
            o_lora: 1024,
            o_groups: 8,
            experts: 384,
            draft_experts: 128,
            expert_width: 2304,
            index_heads: 32,
            index_head_dim: 128,
            hc: 4,
            kv_sources: vec![2, 8, 14, 20],
            index_sources: vec![2, 8, 14, 20, 24, 28, 32, 36],
            ratios,
            engram_layers: vec![1, 14],
            engram_rows: vec![384_006_168, 384_016_682],
            engram_heads: 8,
            engram_head_dim: 256,
            engram_ngram: 4,
            dspark_taps: vec![37, 38, 39],
            markov_rank: 256,
            max_position: 1_048_576,
            original_max_position: 65536,
            bits: 3,
            text_shards: 39,
            tokenizer_tokens: 2000,
            vision_bytes: 1 << 20,
            top_k: 6,
            draft_top_k: 3,
            index_topk: 512,
            candidate_blocks: 2048,
            engram_vocab: 16_000_000,
        }
    }

    fn check(&self) -> Result<(), CheckpointError> {
        let bad = |m: String| Err(CheckpointError::Spec(m));
        let blocks = self.layers + self.draft_layers;
        if self.ratios.len() != blocks {
            return bad(format!("{} ratios for {blocks} blocks", self.ratios.len()));
        }
        for ids in [
            &self.kv_sources,
            &self.index_sources,
            &self.engram_layers,
            &self.dspark_taps,
        ] {
            if ids.iter().any(|i| *i >= self.layers) || ids.len() > 8 {
                return bad(format!(
                    "layer ids {ids:?} out of range for {} layers",
                    self.layers
                ));
            }
        }
        if self.engram_rows.len() != self.engram_layers.len() {
            return bad("one engram row count per Engram layer".into());
        }
        // Every split dimension divides into whole 16-element tiles at world 2 and at world 4.
        let engram_cols = (self.engram_ngram - 1) * self.engram_heads;
        for (what, whole, per_rank) in [
            ("heads", self.heads, 1),
            ("o_groups", self.o_groups, 1),
            ("engram hash columns", engram_cols, 1),
            ("vocab", self.vocab, 16),
            ("heads*head_dim", self.heads * self.head_dim, 16),
            ("o_groups*o_lora", self.o_groups * self.o_lora, 16),
            ("expert_width", self.expert_width, 16),
            ("engram rows", engram_cols * self.engram_head_dim, 16),
        ] {
            for world in [2, 4] {
                if whole % world != 0 || (whole / world) % per_rank != 0 {
                    return bad(format!(
                        "{what} = {whole} does not split into {world} parts{}",
                        if per_rank > 1 {
                            " of whole 16-element tiles"
                        } else {
                            ""
                        }
                    ));
                }
            }
        }
        for (what, v) in [
            ("hidden", self.hidden),
            ("q_lora", self.q_lora),
            ("index_head_dim", self.index_head_dim),
            ("head_dim", self.head_dim),
        ] {
            if v == 0 || v % 16 != 0 {
                return bad(format!("{what} = {v} is not a positive multiple of 16"));
            }
        }
        if self.tokenizer_tokens > self.vocab {
            return bad("tokenizer_tokens > vocab".into());
        }
        Ok(())
    }
}

/// One tensor to generate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    /// Name.
    pub name: String,
    /// Stored dtype.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<usize>,
}

impl TensorSpec {
    /// Byte length.
    #[must_use]
    pub fn bytes(&self) -> u64 {
        self.shape.iter().product::<usize>() as u64 * self.dtype.size() as u64
    }
}

/// What [`generate`] wrote.
#[derive(Debug, Clone)]
pub struct GeneratedRepos {
    /// The EXL3 checkpoint (`MODEL_DIR`).
    pub model_dir: PathBuf,
    /// The original-model repo (Engram tables, `bias_vl`).
    pub original_dir: PathBuf,
    /// The kernel kit.
    pub kit_dir: PathBuf,
    /// Bytes of all model shards.
    pub model_bytes: u64,
    /// Shard files of the model, in name order.
    pub shards: Vec<PathBuf>,
    /// Tokens in tokenizer.json.
    pub tokens: usize,
    /// `engram_compressed_vocab_size` (what the token map yields).
    pub compressed_vocab: usize,
}

/// The deterministic bytes of a generated tensor (for tests that compare without re-reading).
///
/// # Errors
/// Never in practice (the sink only collects).
pub fn tensor_data(seed: u64, t: &TensorSpec) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(t.bytes() as usize);
    writer::tensor_bytes(seed, t, |b| {
        out.extend_from_slice(b);
        Ok(())
    })?;
    Ok(out)
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn write_json(path: &Path, v: &Value) -> Result<(), CheckpointError> {
    let text = serde_json::to_string_pretty(v).unwrap_or_default();
    std::fs::write(path, text).map_err(io_err(path))
}

/// `config.json` of the EXL3 export, with the real field names the engine reads.
fn model_config(s: &CheckpointSpec, compressed: usize, image_token: usize) -> Value {
    json!({
        "architectures": ["DeepseekV41ForCausalLM"],
        "model_type": "deepseek_v41",
        "bos_token_id": 0,
        "eos_token_id": 1,
        "image_token_id": image_token,
        "quantization_config": {"quant_method": "exl3", "codebook": "mul1", "bits": s.bits, "version": "0.0.x"},
        "text_config": {
            "vocab_size": s.vocab,
            "hidden_size": s.hidden,
            "moe_intermediate_size": s.expert_width,
            "num_hidden_layers": s.layers,
            "num_attention_heads": s.heads,
            "head_dim": s.head_dim,
            "qk_rope_head_dim": s.rope_dim,
            "q_lora_rank": s.q_lora,
            "o_lora_rank": s.o_lora,
            "o_groups": s.o_groups,
            "swiglu_limit": 10.0,
            "rms_norm_eps": 1e-20,
            "max_position_embeddings": s.max_position,
            "rope_theta": 10000,
            "rope_scaling": {"type": "yarn", "factor": 16, "beta_fast": 32, "beta_slow": 1,
                             "original_max_position_embeddings": s.original_max_position},
            "n_routed_experts": s.experts,
            "n_shared_experts": 1,
            "num_experts_per_tok": s.top_k,
            "routed_scaling_factor": 1.5,
            "sliding_window": 128,
            "compress_ratios": s.ratios,
            "compress_rope_theta": 160000,
            "kv_source_layer_ids": s.kv_sources,
            "index_source_layer_ids": s.index_sources,
            "index_n_heads": s.index_heads,
            "index_head_dim": s.index_head_dim,
            "index_topk": s.index_topk,
            "candidate_source_layer_id": s.kv_sources.last().copied().unwrap_or(0),
            "candidate_topk_blocks": s.candidate_blocks,
            "candidate_block_size": 8,
            "hc_mult": s.hc,
            "hc_sinkhorn_iters": 20,
            "hc_eps": 1e-6,
            "engram_layer_ids": s.engram_layers,
            "engram_num_embeddings": s.engram_rows,
            "engram_max_ngram_size": s.engram_ngram,
            "engram_vocab_size": s.engram_vocab,
            "engram_n_heads": s.engram_heads,
            "engram_head_dim": s.engram_head_dim,
            "engram_pad_token_id": 2,
            "engram_compressed_vocab_size": compressed,
            "num_nextn_predict_layers": s.draft_layers,
            "dspark_block_size": 5,
            "dspark_noise_token_id": s.vocab - 1,
            "dspark_target_layer_ids": s.dspark_taps,
            "dspark_markov_rank": s.markov_rank,
            "dspark_n_routed_experts": s.draft_experts,
            "dspark_num_experts_per_tok": s.draft_top_k
        },
        "vision_config": {"num_hidden_layers": 2, "hidden_size": 128}
    })
}

/// Splits `tensors` (in model order) into `n` shards of roughly equal bytes.
fn assign_shards(tensors: Vec<TensorSpec>, n: usize) -> Vec<Vec<TensorSpec>> {
    let total: u64 = tensors.iter().map(TensorSpec::bytes).sum();
    let per = total.div_ceil(n as u64).max(1);
    let mut out: Vec<Vec<TensorSpec>> = vec![Vec::new(); n];
    let mut acc = 0u64;
    for t in tensors {
        let k = ((acc / per) as usize).min(n - 1);
        acc += t.bytes();
        out[k].push(t);
    }
    out
}

fn write_repo(
    dir: &Path,
    seed: u64,
    shards: Vec<Vec<TensorSpec>>,
    threads: usize,
    sparse: bool,
) -> Result<(Vec<PathBuf>, u64), CheckpointError> {
    let n = shards.len();
    let mut weight_map = serde_json::Map::new();
    let mut jobs = Vec::new();
    for (i, mut list) in shards.into_iter().enumerate() {
        let name = format!("model-{:05}-of-{:05}.safetensors", i + 1, n);
        writer::safetensors_order(&mut list);
        for t in &list {
            weight_map.insert(t.name.clone(), json!(name));
        }
        jobs.push((dir.join(name), list));
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<Result<u64, CheckpointError>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads.max(1))
            .map(|_| {
                s.spawn(|| {
                    let mut out = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some((path, list)) = jobs.get(i) else {
                            break;
                        };
                        out.push(writer::write_shard(path, seed, list, sparse));
                    }
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| {
                h.join().unwrap_or_else(|_| {
                    vec![Err(CheckpointError::Spec("writer thread panicked".into()))]
                })
            })
            .collect()
    });
    let mut total = 0u64;
    for r in results {
        total += r?;
    }
    let data_size: u64 = jobs
        .iter()
        .flat_map(|(_, l)| l.iter().map(TensorSpec::bytes))
        .sum();
    write_json(
        &dir.join("model.safetensors.index.json"),
        &json!({"metadata": {"total_size": data_size}, "weight_map": Value::Object(weight_map)}),
    )?;
    Ok((jobs.into_iter().map(|(p, _)| p).collect(), total))
}

/// Writes only the EXL3 export (`out_dir/model`: config, tokenizer, index and shards) with sparse
/// shards: real headers, data left as holes (reads give zeros), so a checkpoint of the real shapes
/// costs no disk. For index-only planning and the engine's shape guard; never for data checks.
///
/// # Errors
/// As [`generate`].
pub fn generate_sparse_model(
    spec: &CheckpointSpec,
    out_dir: &Path,
) -> Result<PathBuf, CheckpointError> {
    spec.check()?;
    let model_dir = out_dir.join("model");
    std::fs::create_dir_all(&model_dir).map_err(io_err(&model_dir))?;
    let (tok_text, _, image_token) = tokenizer::build(spec.seed, spec.tokenizer_tokens);
    let tok_path = model_dir.join("tokenizer.json");
    std::fs::write(&tok_path, &tok_text).map_err(io_err(&tok_path))?;
    let tok = token_map::Tokenizer::parse(&tok_path, tok_text.as_bytes()).map_err(|e| {
        CheckpointError::Inputs {
            what: "the token map",
            message: e.to_string(),
        }
    })?;
    let config = model_config(spec, token_map::token_map(&tok).compressed, image_token);
    write_json(&model_dir.join("config.json"), &config)?;
    let mut shards = assign_shards(tensors::model_tensors(spec), spec.text_shards.max(1));
    shards.push(tensors::vision_tensors(spec));
    write_repo(&model_dir, spec.seed, shards, 1, true)?;
    Ok(model_dir)
}

/// Generates the three repos under `out_dir` (`model/`, `original/`, `kit/`).
///
/// # Errors
/// [`CheckpointError::Spec`] for an inconsistent spec, I/O errors, or a core input builder
/// failing on the generated files.
pub fn generate(spec: &CheckpointSpec, out_dir: &Path) -> Result<GeneratedRepos, CheckpointError> {
    spec.check()?;
    let model_dir = out_dir.join("model");
    let original_dir = out_dir.join("original");
    let kit_dir = out_dir.join("kit");
    for d in [&model_dir, &original_dir, &kit_dir] {
        std::fs::create_dir_all(d).map_err(io_err(d))?;
    }
    // tokenizer first: the config declares what its token map yields
    let (tok_text, tokens, image_token) = tokenizer::build(spec.seed, spec.tokenizer_tokens);
    let tok_path = model_dir.join("tokenizer.json");
    std::fs::write(&tok_path, &tok_text).map_err(io_err(&tok_path))?;
    let tok = token_map::Tokenizer::parse(&tok_path, tok_text.as_bytes()).map_err(|e| {
        CheckpointError::Inputs {
            what: "the token map",
            message: e.to_string(),
        }
    })?;
    let compressed = token_map::token_map(&tok).compressed;
    let config = model_config(spec, compressed, image_token);
    write_json(&model_dir.join("config.json"), &config)?;
    write_json(
        &model_dir.join("tokenizer_config.json"),
        &json!({"bos_token": tokenizer::SPECIALS[0], "eos_token": tokenizer::SPECIALS[1], "model_max_length": spec.max_position}),
    )?;

    let threads = 2;
    let mut shards = assign_shards(tensors::model_tensors(spec), spec.text_shards.max(1));
    shards.push(tensors::vision_tensors(spec));
    let (shard_paths, model_bytes) = write_repo(&model_dir, spec.seed, shards, threads, false)?;

    let (orig_a, orig_b) = tensors::original_tensors(spec);
    write_repo(
        &original_dir,
        spec.seed,
        vec![orig_a, orig_b],
        threads,
        false,
    )?;
    let mut orig_config = config.clone();
    if let Some(o) = orig_config.as_object_mut() {
        o.insert(
            "quantization_config".into(),
            json!({"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}),
        );
    }
    write_json(&original_dir.join("config.json"), &orig_config)?;

    kit::write_kit(spec, &model_dir, &original_dir, &kit_dir)?;

    Ok(GeneratedRepos {
        model_dir,
        original_dir,
        kit_dir,
        model_bytes,
        shards: shard_paths,
        tokens,
        compressed_vocab: compressed,
    })
}
