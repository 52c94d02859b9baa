//! Rank-file verification benchmark (not a timed test): what it costs `up` to check a rank file
//! before launch. Generates the large test-scale checkpoint in a scratch directory, builds rank 0
//! once, then times, alternating, `verify_rank_cache` at each level:
//! - `Index` (footer and index only: blind to flipped data bytes),
//! - `Checksums` (every block against its build-time CRC-32: one read of the rank file; what `up`
//!   runs),
//! - `Bytes` (every byte against the checkpoint: `PREPARE=1`),
//!
//! and `cat FILE > /dev/null` (a plain read of the rank file, the floor for any full check). Prints
//! each median and, on the last line, the ratio Checksums / Bytes. Everything it wrote is deleted.
//!
//! ```text
//! bench-rank-verify [SCRATCH_DIR] [--cold] [--rounds N]
//! ```
//! `--cold` drops the page cache before each run (root only).
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::Instant;

use spark_deploy_core::engine::tensorfold::inputs::{
    RankCacheOptions, VerifyLevel, build_rank_cache, plan_rank_cache, verify_rank_cache,
};
use spark_deploy_testbed::checkpoint::{CheckpointSpec, generate};

fn drop_caches(cold: bool) {
    if cold {
        let _ = Command::new("sync").status();
        if fs_err::write("/proc/sys/vm/drop_caches", "3").is_err() {
            eprintln!("warning: cannot drop the page cache (not root?); the run is warm");
        }
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let cold = args.iter().any(|a| a == "--cold");
    let rounds: usize = args
        .iter()
        .position(|a| a == "--rounds")
        .and_then(|i| args.get(i + 1))
        .map_or(Ok(3), |r| r.parse())?;
    let base = args
        .iter()
        .skip(1)
        .find(|a| !a.starts_with("--") && a.parse::<usize>().is_err())
        .map_or_else(std::env::temp_dir, PathBuf::from);
    let scratch = base.join(format!("bench-rank-verify-{}", std::process::id()));
    fs_err::create_dir_all(&scratch)?;
    let result = (|| -> Result<(), Box<dyn std::error::Error>> {
        let g = generate(&CheckpointSpec::large(1), &scratch.join("ckpt"))?;
        let opts = RankCacheOptions {
            engine_shape_guard: false,
            ..RankCacheOptions::default()
        };
        let plan = plan_rank_cache(&g.model_dir, 0, 2, &opts)?;
        let out = scratch.join("rank-cache");
        let file = build_rank_cache(&plan, &out, &opts, &mut |_| Ok(()))?;
        let _ = Command::new("sync").status();
        let mib = fs_err::metadata(&file)?.len() as f64 / (1 << 20) as f64;
        println!(
            "rank 0 of 2 of the large checkpoint: {mib:.0} MiB, {} entries; {} threads",
            plan.entries.len(),
            opts.threads
        );
        let levels = [
            ("index", Some(VerifyLevel::Index)),
            ("checksums", Some(VerifyLevel::Checksums)),
            ("bytes", Some(VerifyLevel::Bytes)),
            ("cat", None),
        ];
        let mut secs = vec![Vec::new(); levels.len()];
        for round in 0..rounds {
            for (i, (name, level)) in levels.iter().enumerate() {
                drop_caches(cold);
                let t = Instant::now();
                match level {
                    Some(level) => {
                        verify_rank_cache(&plan, &file, *level, &opts, &mut |_| Ok(()))?;
                    }
                    None => {
                        let st = Command::new("sh")
                            .arg("-c")
                            .arg("cat -- \"$1\" > /dev/null")
                            .arg("sh")
                            .arg(&file)
                            .status()?;
                        if !st.success() {
                            return Err("cat failed".into());
                        }
                    }
                }
                let s = t.elapsed().as_secs_f64();
                println!("round {round} {name}: {s:.3} s ({:.0} MiB/s)", mib / s);
                secs[i].push(s);
            }
        }
        let m: Vec<f64> = secs.iter_mut().map(|v| median(v)).collect();
        println!(
            "medians ({} page cache, {rounds} runs each): index {:.3} s | checksums {:.3} s ({:.0} MiB/s) | bytes {:.3} s ({:.0} MiB/s) | cat {:.3} s ({:.0} MiB/s)",
            if cold { "cold" } else { "warm" },
            m[0],
            m[1],
            mib / m[1],
            m[2],
            mib / m[2],
            m[3],
            mib / m[3],
        );
        println!(
            "checksums/cat {:.2} (a full check's floor is one read); checksums/bytes ratio {:.2}",
            m[1] / m[3],
            m[1] / m[2]
        );
        Ok(())
    })();
    let _ = fs_err::remove_dir_all(&scratch);
    result
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
