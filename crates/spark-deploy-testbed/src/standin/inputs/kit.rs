//! The kernel kit (its kernels, RoPE tables and recorded variants) and the Engram tables, as
//! both ranks check them before they meet.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use super::{InputsError, ModelConfig, SafetensorsHeader, read_json};

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
        super::super::opened::record(&p);
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
        super::super::opened::record(&p);
        std::fs::metadata(&p).map_err(|e| InputsError::new("NoKernelImages", &p, e.to_string()))?;
    }
    let cubins = kit.join("cubins");
    if let Ok(rd) = std::fs::read_dir(&cubins) {
        for p in rd.filter_map(Result::ok).map(|e| e.path()) {
            if p.extension().is_some_and(|x| x == "cubin") {
                super::super::opened::record(&p);
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
