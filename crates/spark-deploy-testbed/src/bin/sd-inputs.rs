//! `sd-inputs`: a small driver over the test-scale checkpoint generator and the native input
//! builders, for the Python cross-checks (tests/python) against independent references. Rank files
//! are built with `spark-deploy rank-cache` (the same builder).
//!
//! ```text
//! sd-inputs generate small|large SEED OUT_DIR      # test-scale checkpoint (model/, original/, kit/)
//! sd-inputs generate real-sparse SEED OUT_DIR      # real shapes, sparse shards (model/ only)
//! sd-inputs token-map MODEL_DIR OUT_JSON           # token map, with the token-count check
//! sd-inputs rope MODEL_DIR OUT_DIR [ROWS]          # RoPE tables + rope.json
//! sd-inputs bias-vl ORIGINAL_DIR OUT_FILE          # image routing bias (gate_bias_vl.safetensors)
//! sd-inputs verify-kit KIT_DIR                     # the kit's files against its MANIFEST
//! ```
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::Path;
use std::process::ExitCode;

use spark_deploy_core::engine::tensorfold::inputs::{
    bias_vl, kit, model_config::ModelConfig, rope, token_map,
};
use spark_deploy_testbed::checkpoint::{CheckpointSpec, generate, generate_sparse_model};

fn run(args: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    let arg = |i: usize| -> Result<&str, Box<dyn std::error::Error>> {
        args.get(i)
            .map(String::as_str)
            .ok_or_else(|| format!("missing argument {i}; see the usage in the source").into())
    };
    match arg(0)? {
        "generate" => {
            let seed: u64 = arg(2)?.parse()?;
            if arg(1)? == "real-sparse" {
                let m =
                    generate_sparse_model(&CheckpointSpec::real_shapes(seed), Path::new(arg(3)?))?;
                println!("{}", serde_json::json!({"model_dir": m}));
                return Ok(());
            }
            let spec = match arg(1)? {
                "small" => CheckpointSpec::small(seed),
                "large" => CheckpointSpec::large(seed),
                other => return Err(format!("unknown size {other} (small|large)").into()),
            };
            let g = generate(&spec, Path::new(arg(3)?))?;
            println!(
                "{}",
                serde_json::json!({
                    "model_dir": g.model_dir, "original_dir": g.original_dir, "kit_dir": g.kit_dir,
                    "model_bytes": g.model_bytes, "tokens": g.tokens, "compressed_vocab": g.compressed_vocab,
                })
            );
        }
        "token-map" => {
            let m = token_map::write_token_map(Path::new(arg(1)?), Path::new(arg(2)?))?;
            println!(
                "{}: {} token ids -> {} compressed ids",
                arg(2)?,
                m.ids.len(),
                m.compressed
            );
        }
        "rope" => {
            let c = ModelConfig::read(Path::new(arg(1)?))?;
            let rows = args.get(3).map(|r| r.parse()).transpose()?;
            let r = rope::write_rope_tables(&c, Path::new(arg(2)?), rows)?;
            println!("{}", r.rope_json());
        }
        "bias-vl" => {
            let r = bias_vl::write_bias_vl(Path::new(arg(1)?), Path::new(arg(2)?))?;
            println!(
                "{} tensors, {} bytes, sha256 {}",
                r.tensors, r.bytes, r.sha256
            );
        }
        "verify-kit" => {
            let n = kit::verify_kit(Path::new(arg(1)?))?;
            println!("kit OK: {n} files match MANIFEST");
        }
        other => return Err(format!("unknown command {other}").into()),
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
