//! The tensor lists of the generated repos: names, dtypes and shapes as the real checkpoints store
//! them (the dimensions are the spec's).

use spark_deploy_core::engine::tensorfold::inputs::dtype::DType;

use super::{CheckpointSpec, TensorSpec};

struct List(Vec<TensorSpec>);

impl List {
    fn t(&mut self, name: String, dtype: DType, shape: Vec<usize>) {
        self.0.push(TensorSpec { name, dtype, shape });
    }

    /// An EXL3 linear with input size `k` and output size `n`.
    fn exl3(&mut self, prefix: &str, k: usize, n: usize, bits: usize) {
        self.t(
            format!("{prefix}.trellis"),
            DType::I16,
            vec![k / 16, n / 16, 16 * bits],
        );
        self.t(format!("{prefix}.suh"), DType::F16, vec![k]);
        self.t(format!("{prefix}.svh"), DType::F16, vec![n]);
    }
}

fn block(l: &mut List, s: &CheckpointSpec, p: &str, i: usize, experts: usize) {
    let d = s.hidden;
    let b = s.bits;
    let hc_rows = (2 + s.hc) * s.hc;
    for hc in ["hc_attn", "hc_ffn"] {
        l.t(format!("{p}.{hc}_fn"), DType::F16, vec![hc_rows, s.hc * d]);
        l.t(format!("{p}.{hc}_scale"), DType::F16, vec![3]);
        l.t(format!("{p}.{hc}_base"), DType::F16, vec![hc_rows]);
    }
    l.t(format!("{p}.attn_norm.weight"), DType::Bf16, vec![d]);
    l.t(format!("{p}.ffn_norm.weight"), DType::Bf16, vec![d]);
    l.exl3(&format!("{p}.attn.wq_a"), d, s.q_lora, b);
    l.t(
        format!("{p}.attn.q_norm.weight"),
        DType::Bf16,
        vec![s.q_lora],
    );
    l.exl3(&format!("{p}.attn.wq_b"), s.q_lora, s.heads * s.head_dim, b);
    l.exl3(&format!("{p}.attn.wkv"), d, s.head_dim, b);
    l.t(
        format!("{p}.attn.kv_norm.weight"),
        DType::Bf16,
        vec![s.head_dim],
    );
    l.t(format!("{p}.attn.attn_sink"), DType::F16, vec![s.heads]);
    for g in 0..s.o_groups {
        l.exl3(
            &format!("{p}.attn.wo_a.slice.{g}"),
            s.heads / s.o_groups * s.head_dim,
            s.o_lora,
            b,
        );
    }
    l.exl3(&format!("{p}.attn.wo_b"), s.o_groups * s.o_lora, d, b);
    let kv = s.kv_sources.contains(&i);
    if kv {
        l.exl3(&format!("{p}.attn.compressor.wkv"), d, 2 * s.head_dim, b);
        l.t(
            format!("{p}.attn.compressor.norm.weight"),
            DType::Bf16,
            vec![s.head_dim],
        );
        if s.ratios[i] > 1 {
            l.exl3(&format!("{p}.attn.compressor.wgate"), d, 2 * s.head_dim, b);
        }
        // the compressor's position bias (not loaded by the TP split)
        l.t(
            format!("{p}.attn.compressor.ape"),
            DType::F32,
            vec![usize::from(s.ratios[i].max(1)), 2 * s.head_dim],
        );
    }
    if s.index_sources.contains(&i) {
        l.exl3(
            &format!("{p}.attn.indexer.wq_b"),
            s.q_lora,
            s.index_heads * s.index_head_dim,
            b,
        );
        l.t(
            format!("{p}.attn.indexer.weights_proj.weight"),
            DType::F32,
            vec![s.index_heads, d],
        );
        if kv {
            l.exl3(
                &format!("{p}.attn.indexer.wk"),
                s.head_dim,
                s.index_head_dim,
                b,
            );
            l.t(
                format!("{p}.attn.indexer.k_norm.weight"),
                DType::Bf16,
                vec![s.index_head_dim],
            );
        }
    }
    l.t(format!("{p}.ffn.gate.weight"), DType::F16, vec![experts, d]);
    l.t(format!("{p}.ffn.gate.bias"), DType::F16, vec![experts]);
    for e in 0..=experts {
        let ep = if e < experts {
            format!("{p}.ffn.experts.{e}")
        } else {
            format!("{p}.ffn.shared_experts")
        };
        l.exl3(&format!("{ep}.w1"), d, s.expert_width, b);
        l.exl3(&format!("{ep}.w3"), d, s.expert_width, b);
        l.exl3(&format!("{ep}.w2"), s.expert_width, d, b);
    }
    if s.engram_layers.contains(&i) {
        let k = (s.engram_ngram - 1) * s.engram_heads * s.engram_head_dim;
        l.exl3(&format!("{p}.engram.wkv"), k, (s.hc + 1) * d, b);
        l.t(format!("{p}.engram.q_weight"), DType::F16, vec![s.hc, d]);
        l.t(format!("{p}.engram.k_weight"), DType::F16, vec![s.hc, d]);
    }
}

/// The EXL3 export's text tensors, in model order.
pub(crate) fn model_tensors(s: &CheckpointSpec) -> Vec<TensorSpec> {
    let mut l = List(Vec::new());
    l.t("embed.weight".into(), DType::Bf16, vec![s.vocab, s.hidden]);
    for i in 0..s.layers {
        block(&mut l, s, &format!("layers.{i}"), i, s.experts);
    }
    for j in 0..s.draft_layers {
        let p = format!("mtp.{j}");
        block(&mut l, s, &p, s.layers + j, s.draft_experts);
        // per-block tensors the TP split does not load
        l.t(format!("{p}.hnorm.weight"), DType::Bf16, vec![s.hidden]);
    }
    if s.draft_layers > 0 {
        let last = format!("mtp.{}", s.draft_layers - 1);
        l.exl3(
            "mtp.0.main_proj",
            s.dspark_taps.len() * s.hidden,
            s.hidden,
            s.bits,
        );
        l.t("mtp.0.main_norm.weight".into(), DType::Bf16, vec![s.hidden]);
        l.t(format!("{last}.norm.weight"), DType::Bf16, vec![s.hidden]);
        l.t(
            format!("{last}.markov_head.embed.weight"),
            DType::Bf16,
            vec![s.vocab, s.markov_rank],
        );
        l.t(
            format!("{last}.markov_head.head.weight"),
            DType::Bf16,
            vec![s.vocab, s.markov_rank],
        );
        l.t(
            format!("{last}.confidence_head.proj.weight"),
            DType::Bf16,
            vec![1, s.hidden],
        );
    }
    l.t("norm.weight".into(), DType::Bf16, vec![s.hidden]);
    l.exl3("head", s.hidden, s.vocab, s.bits);
    l.0
}

/// The vision tower (its own shard, last in the index).
pub(crate) fn vision_tensors(s: &CheckpointSpec) -> Vec<TensorSpec> {
    let mut l = List(Vec::new());
    let width = 128usize;
    let per_block = 4 * width * width * 2 + 2 * width * 2;
    let blocks = (s.vision_bytes / per_block).max(1);
    l.t(
        "vision.patch_embed.proj.weight".into(),
        DType::Bf16,
        vec![width, 3 * 14 * 14],
    );
    for b in 0..blocks {
        l.t(
            format!("vision.blocks.{b}.attn.qkv.weight"),
            DType::Bf16,
            vec![3 * width, width],
        );
        l.t(
            format!("vision.blocks.{b}.attn.proj.weight"),
            DType::Bf16,
            vec![width, width],
        );
        l.t(
            format!("vision.blocks.{b}.norm1.weight"),
            DType::F32,
            vec![width],
        );
        l.t(
            format!("vision.blocks.{b}.norm2.weight"),
            DType::F32,
            vec![width],
        );
    }
    l.t(
        "vision.merger.proj.weight".into(),
        DType::Bf16,
        vec![s.hidden, width],
    );
    l.0
}

/// The original model's two shards: Engram tables (one layer a shard) and the `bias_vl` vectors.
pub(crate) fn original_tensors(s: &CheckpointSpec) -> (Vec<TensorSpec>, Vec<TensorSpec>) {
    let mut a = List(Vec::new());
    let mut b = List(Vec::new());
    let scales = (s.engram_head_dim / 32).max(1);
    for (k, (&layer, &rows)) in s.engram_layers.iter().zip(&s.engram_rows).enumerate() {
        let l = if k == 0 { &mut a } else { &mut b };
        l.t(
            format!("layers.{layer}.engram.embed.weight"),
            DType::F8E4M3,
            vec![rows as usize, s.engram_head_dim],
        );
        l.t(
            format!("layers.{layer}.engram.embed.scale"),
            DType::F8E8M0,
            vec![rows as usize, scales],
        );
    }
    for i in 0..s.layers {
        let l = if i < s.layers / 2 { &mut a } else { &mut b };
        l.t(
            format!("layers.{i}.ffn.gate.bias_vl"),
            DType::F32,
            vec![s.experts],
        );
        l.t(
            format!("layers.{i}.ffn.gate.bias"),
            DType::F32,
            vec![s.experts],
        );
    }
    for j in 0..s.draft_layers {
        b.t(
            format!("mtp.{j}.ffn.gate.bias_vl"),
            DType::F32,
            vec![s.draft_experts],
        );
    }
    (a.0, b.0)
}
