//! The tensor-parallel split plan: every tensor rank R of world W loads, in the
//! engine's load order, with the engine's keys. Pure data from `config.json`.

use super::dtype::DType;
use super::model_config::ModelConfig;

/// Why no plan can be made for this rank and world.
#[derive(Debug, thiserror::Error)]
pub enum SplitPlanError {
    /// `rank` is not below `world`, or `world` is not 1, 2 or 4.
    #[error(
        "rank {rank} of world {world} is not a valid split (world is 1, 2 or 4, rank below it); fix RANK/WORLD"
    )]
    BadRank {
        /// The rank.
        rank: usize,
        /// The world.
        world: usize,
    },
    /// A dimension does not split into equal parts on 16-element tile boundaries.
    #[error(
        "{what} = {value} does not split into {world} parts on 16-element tiles (rank {rank}); this config cannot be served at world {world}"
    )]
    Indivisible {
        /// The quantity.
        what: &'static str,
        /// Its value.
        value: usize,
        /// The rank.
        rank: usize,
        /// The world.
        world: usize,
    },
    /// A product of `config.json` dimensions does not fit in a `usize`.
    #[error(
        "{what} = {a} × {b} overflows; config.json's dimensions are impossible, re-download it"
    )]
    Overflow {
        /// The product.
        what: &'static str,
        /// Its first factor.
        a: usize,
        /// Its second factor.
        b: usize,
    },
}

/// `a × b`, or [`SplitPlanError::Overflow`] naming `what`.
fn mul(what: &'static str, a: usize, b: usize) -> Result<usize, SplitPlanError> {
    a.checked_mul(b)
        .ok_or(SplitPlanError::Overflow { what, a, b })
}

/// Which EXL3 part an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// `<prefix>.trellis`, int16 `[K/16, N/16, 16·bits]`.
    Tr,
    /// `<prefix>.suh`, f16 `[K]`.
    Suh,
    /// `<prefix>.svh`, f16 `[N]`.
    Svh,
}

impl Part {
    /// The key's part name.
    #[must_use]
    pub fn key_name(self) -> &'static str {
        match self {
            Self::Tr => "tr",
            Self::Suh => "suh",
            Self::Svh => "svh",
        }
    }

    /// The source tensor's suffix.
    #[must_use]
    pub fn tensor_suffix(self) -> &'static str {
        match self {
            Self::Tr => "trellis",
            Self::Suh => "suh",
            Self::Svh => "svh",
        }
    }
}

/// What one planned entry takes from its source tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WantKind {
    /// A plain tensor, whole; `target` is the dtype the key names (`None`: the stored dtype,
    /// which must be bf16).
    Plain {
        /// `torch.float32` / `torch.float16`, or `None`.
        target: Option<DType>,
        /// The shape `config.json` gives the source tensor.
        shape: Vec<usize>,
    },
    /// One part of an EXL3 linear, sliced by input rows and/or output columns.
    Exl3 {
        /// The part.
        part: Part,
        /// Output column range (half-open).
        cols: Option<(usize, usize)>,
        /// Input row range (half-open).
        rows: Option<(usize, usize)>,
        /// Expected K/16 of the written trellis (from the split or the config), if fixed.
        k16: Option<usize>,
        /// Expected N/16 of the written trellis, if fixed.
        n16: Option<usize>,
        /// The linear's whole input size K (the trellis' first dimension × 16, `suh`'s length),
        /// when `config.json` fixes it.
        k: Option<usize>,
        /// The linear's whole output size N (the trellis' second dimension × 16, `svh`'s
        /// length), when `config.json` fixes it.
        n: Option<usize>,
    },
}

/// One entry of a rank file, before the checkpoint is consulted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Want {
    /// The index key (`"name|None"`, `"prefix|(a, b)|None|tr"`, ...).
    pub key: String,
    /// The source tensor's name in the checkpoint.
    pub tensor: String,
    /// How it is taken.
    pub kind: WantKind,
}

fn range_text(r: Option<(usize, usize)>) -> String {
    r.map_or_else(|| "None".to_owned(), |(a, b)| format!("({a}, {b})"))
}

struct Builder {
    out: Vec<Want>,
}

impl Builder {
    fn plain(&mut self, tensor: String, target: Option<DType>, shape: Vec<usize>) {
        let t = match target {
            None => "None",
            Some(DType::F32) => "torch.float32",
            Some(_) => "torch.float16",
        };
        self.out.push(Want {
            key: format!("{tensor}|{t}"),
            tensor,
            kind: WantKind::Plain { target, shape },
        });
    }

    fn exl3(
        &mut self,
        prefix: &str,
        cols: Option<(usize, usize)>,
        rows: Option<(usize, usize)>,
        k: Option<usize>,
        n: Option<usize>,
    ) {
        let k16 = rows.map(|r| (r.1 - r.0) / 16).or(k.map(|k| k / 16));
        let n16 = cols.map(|c| (c.1 - c.0) / 16).or(n.map(|n| n / 16));
        for part in [Part::Tr, Part::Suh, Part::Svh] {
            let is_tr = part == Part::Tr;
            self.out.push(Want {
                key: format!(
                    "{prefix}|{}|{}|{}",
                    range_text(cols),
                    range_text(rows),
                    part.key_name()
                ),
                tensor: format!("{prefix}.{}", part.tensor_suffix()),
                kind: WantKind::Exl3 {
                    part,
                    cols,
                    rows,
                    k16: if is_tr { k16 } else { None },
                    n16: if is_tr { n16 } else { None },
                    k,
                    n,
                },
            });
        }
    }
}

struct Split {
    rank: usize,
    world: usize,
}

impl Split {
    fn range(&self, per: usize) -> (usize, usize) {
        (self.rank * per, (self.rank + 1) * per)
    }

    /// `total / world`, refusing a remainder or a part that is not a multiple of `tile`.
    fn part(&self, what: &'static str, total: usize, tile: usize) -> Result<usize, SplitPlanError> {
        let per = total / self.world;
        if !total.is_multiple_of(self.world) || !per.is_multiple_of(tile) {
            return Err(SplitPlanError::Indivisible {
                what,
                value: total,
                rank: self.rank,
                world: self.world,
            });
        }
        Ok(per)
    }
}

/// Every entry rank `rank` of `world` loads, in load order (`dspark`: the DSpark blocks and heads
/// too, as the reference writer does without `--no-dspark`).
///
/// # Errors
/// [`SplitPlanError::BadRank`] for an invalid rank/world, [`SplitPlanError::Indivisible`] when a
/// split dimension does not divide into 16-element tiles.
pub fn plan(
    c: &ModelConfig,
    rank: usize,
    world: usize,
    dspark: bool,
) -> Result<Vec<Want>, SplitPlanError> {
    if !matches!(world, 1 | 2 | 4) || rank >= world {
        return Err(SplitPlanError::BadRank { rank, world });
    }
    let s = Split { rank, world };
    // Validate every split quantity up front (each boundary a multiple of 16).
    // A rank's share of a product must itself be a multiple of 16.
    let by_16 = |what: &'static str, share: usize, value: usize| {
        if share.is_multiple_of(16) {
            Ok(share)
        } else {
            Err(SplitPlanError::Indivisible {
                what,
                value,
                rank,
                world,
            })
        }
    };
    s.part("num_attention_heads", c.heads, 1)?;
    let q_all = mul("num_attention_heads × head_dim", c.heads, c.head_dim)?;
    let q_cols = by_16("num_attention_heads × head_dim", q_all / world, q_all)?;
    let groups_per = s.part("o_groups", c.o_groups, 1)?;
    let wo_b_all = mul("o_groups × o_lora_rank", c.o_groups, c.o_lora)?;
    let wo_b_rows = by_16("o_groups × o_lora_rank", wo_b_all / world, wo_b_all)?;
    let inter = s.part("moe_intermediate_size", c.expert_width, 16)?;
    let vocab = s.part("vocab_size", c.vocab, 16)?;
    let what = "(engram_max_ngram_size − 1) × engram_n_heads";
    let engram_cols = mul(what, c.engram_ngram.saturating_sub(1), c.engram_heads)?;
    let engram_all = mul("engram hash rows", engram_cols, c.engram_head_dim)?;
    let engram_rows = if c.engram_layers.is_empty() {
        0
    } else {
        s.part(what, engram_cols, 1)?;
        let all = engram_all;
        let rows = all / world;
        if !rows.is_multiple_of(16) {
            return Err(SplitPlanError::Indivisible {
                what: "engram hash rows",
                value: all,
                rank,
                world,
            });
        }
        rows
    };
    let wo_a_k = mul(
        "num_attention_heads / o_groups × head_dim",
        c.heads / c.o_groups.max(1),
        c.head_dim,
    )?;
    let main_proj_k = mul(
        "dspark_target_layer_ids (count) × hidden_size",
        c.dspark_taps.len(),
        c.hidden,
    )?;
    let d = c.hidden;
    let hc_rows = mul("(2 + hc_mult) × hc_mult", c.hc.saturating_add(2), c.hc)?;
    let hc_cols = mul("hc_mult × hidden_size", c.hc, d)?;
    let indexer_n = mul(
        "index_n_heads × index_head_dim",
        c.index_heads,
        c.index_head_dim,
    )?;
    let bf16 = None;

    let mut b = Builder { out: Vec::new() };
    b.plain("embed.weight".into(), bf16, vec![c.vocab, d]);
    b.plain("norm.weight".into(), bf16, vec![d]);
    b.exl3("head", Some(s.range(vocab)), None, Some(d), Some(c.vocab));
    let block = |b: &mut Builder, p: &str, i: usize, experts: usize| {
        for hc in ["hc_attn", "hc_ffn"] {
            let f32 = Some(DType::F32);
            b.plain(format!("{p}.{hc}_fn"), f32, vec![hc_rows, hc_cols]);
            b.plain(format!("{p}.{hc}_scale"), f32, vec![3]);
            b.plain(format!("{p}.{hc}_base"), f32, vec![hc_rows]);
        }
        b.plain(format!("{p}.attn_norm.weight"), bf16, vec![d]);
        b.plain(format!("{p}.ffn_norm.weight"), bf16, vec![d]);
        b.exl3(
            &format!("{p}.attn.wq_a"),
            None,
            None,
            Some(d),
            Some(c.q_lora),
        );
        b.plain(format!("{p}.attn.q_norm.weight"), bf16, vec![c.q_lora]);
        b.exl3(
            &format!("{p}.attn.wq_b"),
            Some(s.range(q_cols)),
            None,
            Some(c.q_lora),
            Some(q_all),
        );
        b.exl3(
            &format!("{p}.attn.wkv"),
            None,
            None,
            Some(d),
            Some(c.head_dim),
        );
        b.plain(format!("{p}.attn.kv_norm.weight"), bf16, vec![c.head_dim]);
        b.plain(
            format!("{p}.attn.attn_sink"),
            Some(DType::F32),
            vec![c.heads],
        );
        for g in rank * groups_per..(rank + 1) * groups_per {
            b.exl3(
                &format!("{p}.attn.wo_a.slice.{g}"),
                None,
                None,
                Some(wo_a_k),
                Some(c.o_lora),
            );
        }
        b.exl3(
            &format!("{p}.attn.wo_b"),
            None,
            Some(s.range(wo_b_rows)),
            Some(wo_b_all),
            Some(d),
        );
        let kv = c.kv_sources.contains(&i);
        if kv {
            // The compressor's output width is not a config field: its trellis, suh and svh
            // must agree with each other (checked when the plan meets the checkpoint).
            b.exl3(
                &format!("{p}.attn.compressor.wkv"),
                None,
                None,
                Some(d),
                None,
            );
            b.plain(
                format!("{p}.attn.compressor.norm.weight"),
                bf16,
                vec![c.head_dim],
            );
            if c.ratios.get(i).copied().unwrap_or(0) > 1 {
                b.exl3(
                    &format!("{p}.attn.compressor.wgate"),
                    None,
                    None,
                    Some(d),
                    None,
                );
            }
        }
        if c.index_sources.contains(&i) {
            b.exl3(
                &format!("{p}.attn.indexer.wq_b"),
                None,
                None,
                Some(c.q_lora),
                Some(indexer_n),
            );
            b.plain(
                format!("{p}.attn.indexer.weights_proj.weight"),
                Some(DType::F32),
                vec![c.index_heads, d],
            );
            if kv {
                b.exl3(
                    &format!("{p}.attn.indexer.wk"),
                    None,
                    None,
                    Some(c.head_dim),
                    Some(c.index_head_dim),
                );
                b.plain(
                    format!("{p}.attn.indexer.k_norm.weight"),
                    bf16,
                    vec![c.index_head_dim],
                );
            }
        }
        b.plain(
            format!("{p}.ffn.gate.weight"),
            Some(DType::F16),
            vec![experts, d],
        );
        b.plain(
            format!("{p}.ffn.gate.bias"),
            Some(DType::F32),
            vec![experts],
        );
        let cols = s.range(inter);
        let width = Some(c.expert_width);
        for e in 0..=experts {
            let ep = if e < experts {
                format!("{p}.ffn.experts.{e}")
            } else {
                format!("{p}.ffn.shared_experts")
            };
            b.exl3(&format!("{ep}.w1"), Some(cols), None, Some(d), width);
            b.exl3(&format!("{ep}.w3"), Some(cols), None, Some(d), width);
            b.exl3(&format!("{ep}.w2"), None, Some(cols), width, Some(d));
        }
        if c.engram_layers.contains(&i) {
            b.exl3(
                &format!("{p}.engram.wkv"),
                None,
                Some(s.range(engram_rows)),
                Some(engram_all),
                None,
            );
            let f32 = Some(DType::F32);
            b.plain(format!("{p}.engram.q_weight"), f32, vec![c.hc, d]);
            b.plain(format!("{p}.engram.k_weight"), f32, vec![c.hc, d]);
        }
    };
    for i in 0..c.layers {
        block(&mut b, &format!("layers.{i}"), i, c.experts);
    }
    if dspark && c.dspark_block > 0 && c.draft_layers > 0 {
        for j in 0..c.draft_layers {
            block(&mut b, &format!("mtp.{j}"), c.layers + j, c.draft_experts);
        }
        let last = format!("mtp.{}", c.draft_layers - 1);
        b.exl3("mtp.0.main_proj", None, None, Some(main_proj_k), Some(d));
        b.plain("mtp.0.main_norm.weight".into(), bf16, vec![d]);
        b.plain(format!("{last}.norm.weight"), bf16, vec![d]);
        let markov = vec![c.vocab, c.markov_rank];
        b.plain(
            format!("{last}.markov_head.embed.weight"),
            bf16,
            markov.clone(),
        );
        b.plain(format!("{last}.markov_head.head.weight"), bf16, markov);
        b.plain(
            format!("{last}.confidence_head.proj.weight"),
            bf16,
            vec![1, d],
        );
    }
    Ok(b.out)
}

#[cfg(test)]
mod tests {
    use super::super::model_config::tests::flash;
    use super::*;

    fn find<'a>(w: &'a [Want], key: &str) -> &'a Want {
        w.iter()
            .find(|x| x.key == key)
            .unwrap_or_else(|| panic!("no {key}"))
    }

    #[test]
    fn real_config_rank1_matches_the_engines_pins() {
        let c = flash();
        let w = plan(&c, 1, 2, true).unwrap();
        assert_eq!(w[0].key, "embed.weight|None");
        assert_eq!(w[2].key, "head|(64640, 129280)|None|tr");
        assert!(matches!(
            w[2].kind,
            WantKind::Exl3 {
                n16: Some(4040),
                ..
            }
        ));
        assert_eq!(w[5].key, "layers.0.hc_attn_fn|torch.float32");
        assert!(matches!(
            find(&w, "layers.0.attn.wq_b|(16384, 32768)|None|tr").kind,
            WantKind::Exl3 {
                k16: Some(80),
                n16: Some(1024),
                ..
            }
        ));
        assert!(matches!(
            find(&w, "layers.3.ffn.experts.383.w2|None|(1152, 2304)|tr").kind,
            WantKind::Exl3 {
                k16: Some(72),
                n16: Some(320),
                ..
            }
        ));
        assert!(matches!(
            find(&w, "layers.14.engram.wkv|None|(3072, 6144)|tr").kind,
            WantKind::Exl3 { k16: Some(192), .. }
        ));
        let wo_a = w
            .iter()
            .filter(|x| x.key.starts_with("layers.0.attn.wo_a.slice.") && x.key.ends_with("|tr"))
            .count();
        assert_eq!(wo_a, 4);
        assert_eq!(
            w.last().unwrap().key,
            "mtp.2.confidence_head.proj.weight|None"
        );
        assert_eq!(
            find(&w, "layers.0.ffn.gate.weight|torch.float16").tensor,
            "layers.0.ffn.gate.weight"
        );
        assert_eq!(
            find(&w, "layers.2.attn.compressor.wgate|None|None|svh").tensor,
            "layers.2.attn.compressor.wgate.svh"
        );
        assert!(
            !w.iter()
                .any(|x| x.key.starts_with("layers.20.attn.compressor.wgate"))
        );
        assert!(
            w.iter()
                .any(|x| x.key.starts_with("layers.24.attn.indexer.wq_b"))
        );
        assert!(
            !w.iter()
                .any(|x| x.key.starts_with("layers.24.attn.indexer.wk"))
        );
        // every key unique
        let mut keys: Vec<_> = w.iter().map(|x| &x.key).collect();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), w.len());
        let no_dspark = plan(&c, 1, 2, false).unwrap();
        assert!(!no_dspark.iter().any(|x| x.key.starts_with("mtp.")));
    }

    #[test]
    fn bad_rank_and_indivisible_dims_are_refused() {
        let c = flash();
        assert!(matches!(
            plan(&c, 2, 2, true),
            Err(SplitPlanError::BadRank { .. })
        ));
        assert!(matches!(
            plan(&c, 0, 3, true),
            Err(SplitPlanError::BadRank { .. })
        ));
        let mut odd = c.clone();
        odd.expert_width = 2320; // 1160 a rank: not a 16-multiple
        assert!(matches!(
            plan(&odd, 0, 2, true),
            Err(SplitPlanError::Indivisible { .. })
        ));
    }

    #[test]
    fn products_of_dimensions_are_checked_naming_them() {
        // A config built in memory (not parsed: parsing bounds every dimension).
        let mut c = flash();
        c.heads = usize::MAX / 2 + 1;
        c.head_dim = 4;
        let e = plan(&c, 0, 2, true).unwrap_err();
        assert!(
            matches!(e, SplitPlanError::Overflow { what, .. } if what.contains("head_dim")),
            "{e}"
        );
        let mut c = flash();
        c.engram_heads = usize::MAX / 2;
        let e = plan(&c, 0, 2, true).unwrap_err();
        assert!(e.to_string().contains("engram"), "{e}");
        let mut c = flash();
        c.hidden = usize::MAX / 2;
        assert!(plan(&c, 0, 2, true).is_err());
    }
}
