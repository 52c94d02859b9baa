//! The generated kernel kit: RoPE tables + rope.json, engram.json, the image routing bias, fake
//! cubins and an `aot.json`, and a `MANIFEST` over all of them.

use std::path::Path;

use serde_json::json;
use spark_deploy_core::engine::tensorfold::inputs::model_config::ModelConfig;
use spark_deploy_core::engine::tensorfold::inputs::{bias_vl, kit, rope};

use super::rng::Rng;
use super::{CheckpointError, CheckpointSpec, io_err, write_json};

fn inputs(what: &'static str) -> impl FnOnce(String) -> CheckpointError {
    move |message| CheckpointError::Inputs { what, message }
}

fn fake_cubin(rng: &mut Rng, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    rng.fill(&mut b);
    b[..4].copy_from_slice(b"\x7fELF");
    b
}

pub(crate) fn write_kit(
    spec: &CheckpointSpec,
    model_dir: &Path,
    original_dir: &Path,
    kit_dir: &Path,
) -> Result<(), CheckpointError> {
    let mut rng = Rng::new(spec.seed ^ 0x006b_6974);
    let config = ModelConfig::read(model_dir).map_err(|e| inputs("the kit")(e.to_string()))?;
    rope::write_rope_tables(&config, kit_dir, None)
        .map_err(|e| inputs("the RoPE tables")(e.to_string()))?;
    let multipliers: Vec<Vec<i64>> = spec
        .engram_layers
        .iter()
        .map(|_| {
            (0..spec.engram_ngram)
                .map(|_| (rng.next_u64() >> 2) as i64 | 1)
                .collect()
        })
        .collect();
    write_json(
        &kit_dir.join("engram.json"),
        &json!({"multipliers": multipliers, "seed": spec.seed, "layers": spec.engram_layers}),
    )?;
    bias_vl::write_bias_vl(
        original_dir,
        &kit_dir.join("vision/gate_bias_vl.safetensors"),
    )
    .map_err(|e| inputs("the bias_vl file")(e.to_string()))?;
    for (dir, names) in [
        (
            "cubins",
            &[
                "linear.cubin",
                "linear_grouped.cubin",
                "experts.cubin",
                "experts_cb.cubin",
            ][..],
        ),
        ("vision", &["torch_fmha_sm120.cubin"][..]),
    ] {
        let d = kit_dir.join(dir);
        std::fs::create_dir_all(&d).map_err(io_err(&d))?;
        for n in names {
            let p = d.join(n);
            std::fs::write(&p, fake_cubin(&mut rng, 4096)).map_err(io_err(&p))?;
        }
    }
    let aot = kit_dir.join("aot/cubins");
    std::fs::create_dir_all(&aot).map_err(io_err(&aot))?;
    let mut kernels = Vec::new();
    for name in ["topk_sel_16x256", "rmsnorm_16"] {
        let bytes = fake_cubin(&mut rng, 2048);
        use sha2::Digest;
        let hash = hex::encode(sha2::Sha256::digest(&bytes));
        let p = aot.join(format!("{hash}.cubin"));
        std::fs::write(&p, &bytes).map_err(io_err(&p))?;
        kernels.push(json!({"fn": name, "hash": hash, "name": name, "num_warps": 4, "num_ctas": 1, "shared": 0,
            "global_scratch": 0, "global_align": 1, "profile_scratch": 0, "pdl": false,
            "params": [{"name": "x", "type": "*fp32", "div16": true, "nospec": false}], "consts": {"BLOCK": {"int": 16}}}));
    }
    write_json(
        &kit_dir.join("aot/aot.json"),
        &json!({"generator": "zig/tests/cuda/nemotron/aot_pack.py", "kernels": kernels}),
    )?;
    let manifest = kit::manifest_for(kit_dir).map_err(io_err(kit_dir))?;
    let p = kit_dir.join("MANIFEST");
    std::fs::write(&p, manifest).map_err(io_err(&p))?;
    Ok(())
}
