//! `sd-inputs`: a small driver over the generator and the native input builders, for the Python
//! tests (tests/python) until the `spark-deploy rank-cache` CLI is wired.
//!
//! ```text
//! sd-inputs generate small|large SEED OUT_DIR      # test-scale checkpoint (model/, original/, kit/)
//! sd-inputs generate real-sparse SEED OUT_DIR      # real shapes, sparse shards (model/ only)
//! sd-inputs token-map MODEL_DIR OUT_JSON           # §6 token map with the count check
//! sd-inputs rope MODEL_DIR OUT_DIR [ROWS]          # §7 RoPE tables + rope.json
//! sd-inputs bias-vl ORIGINAL_DIR OUT_FILE          # §9 image routing bias
//! sd-inputs verify-kit KIT_DIR                     # §8 MANIFEST check
//! sd-inputs rank-cache build|verify|verify-bytes|index-only MODEL_DIR OUT_DIR RANK WORLD
//!           [--chunk BYTES] [--throttle-ms MS] [--overlay PATH]
//! ```
//! Rank files are built without the engine's shape guard (test-scale checkpoints).
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::Path;
use std::process::ExitCode;

use spark_deploy_core::engine::tensorfold::inputs::{
    RankCacheOptions, VerifyLevel, bias_vl, build_rank_cache, kit, model_config::ModelConfig,
    plan_rank_cache, rope, token_map, verify_rank_cache,
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
        "rank-cache" => {
            let mut opts = RankCacheOptions {
                engine_shape_guard: false,
                ..RankCacheOptions::default()
            };
            let mut throttle = 0u64;
            let mut i = 6;
            while i < args.len() {
                match args[i].as_str() {
                    "--chunk" => opts.chunk_bytes = arg(i + 1)?.parse()?,
                    "--throttle-ms" => throttle = arg(i + 1)?.parse()?,
                    "--overlay" => opts.overlay = Some(arg(i + 1)?.into()),
                    other => return Err(format!("unknown option {other}").into()),
                }
                i += 2;
            }
            if throttle > 0 {
                opts.threads = 1;
            }
            let (model, out) = (Path::new(arg(2)?), Path::new(arg(3)?));
            let (rank, world): (usize, usize) = (arg(4)?.parse()?, arg(5)?.parse()?);
            let plan = plan_rank_cache(model, rank, world, &opts)?;
            let mut progress = |_: &_| {
                std::thread::sleep(std::time::Duration::from_millis(throttle));
                Ok(())
            };
            match arg(1)? {
                "index-only" => {
                    println!("{}", plan.index_json);
                    println!("{}", plan.file_name);
                }
                "build" => {
                    let f = build_rank_cache(&plan, out, &opts, &mut progress)?;
                    println!("{}", plan.summary_json(&f));
                }
                "verify" | "verify-bytes" => {
                    let level = if arg(1)? == "verify" {
                        VerifyLevel::Index
                    } else {
                        VerifyLevel::Bytes
                    };
                    let f = verify_rank_cache(&plan, out, level, &opts, &mut progress)?;
                    println!("{} OK", f.display());
                }
                other => return Err(format!("unknown rank-cache command {other}").into()),
            }
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
