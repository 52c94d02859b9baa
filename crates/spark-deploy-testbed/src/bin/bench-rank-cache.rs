//! Rank-cache build benchmark (not a timed test): generates the large test-scale checkpoint in a
//! scratch directory on the same disk, then in one run measures
//! - the native rank-file build (in a child process, so its peak RSS — `VmHWM` — is its own),
//! - `cp` of the same number of bytes on the same disk (+ fsync, as the build fsyncs),
//!
//! and prints throughput, the ratio build/cp (goal ≥ 0.9) and the peak RSS (goal ≤ 512 MiB).
//! Everything it wrote is deleted at the end.
//!
//! ```text
//! bench-rank-cache [SCRATCH_DIR] [--cold] [--rounds N]
//! ```
//! `--cold` drops the page cache before each run (root only). Each round builds rank 0 and rank 1
//! and copies each file with `cp`, alternating, so load from other processes hits both alike; the
//! ratio is taken from the medians.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

use spark_deploy_core::engine::tensorfold::inputs::{
    RankCacheOptions, build_rank_cache, plan_rank_cache,
};
use spark_deploy_testbed::checkpoint::{CheckpointSpec, generate};

fn vm_hwm_kib() -> u64 {
    fs_err::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

/// Child: build one rank file, print `seconds bytes vmhwm_kib`.
fn child(model: &Path, out: &Path, rank: usize) -> Result<(), Box<dyn std::error::Error>> {
    let opts = RankCacheOptions {
        engine_shape_guard: false,
        ..RankCacheOptions::default()
    };
    let t0 = Instant::now();
    let plan = plan_rank_cache(model, rank, 2, &opts)?;
    let t_plan = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let file = build_rank_cache(&plan, out, &opts, &mut |_| Ok(()))?;
    let secs = t1.elapsed().as_secs_f64();
    let len = fs_err::metadata(&file)?.len();
    println!("{secs} {len} {} {t_plan} {}", vm_hwm_kib(), file.display());
    Ok(())
}

fn drop_caches(cold: bool) {
    if cold {
        let _ = Command::new("sync").status();
        if fs_err::write("/proc/sys/vm/drop_caches", "3").is_err() {
            eprintln!("warning: cannot drop the page cache (not root?); the run is warm");
        }
    }
}

fn cp_with_fsync(src: &Path, dst: &Path) -> Result<f64, Box<dyn std::error::Error>> {
    let t = Instant::now();
    let st = Command::new("cp").arg(src).arg(dst).status()?;
    if !st.success() {
        return Err("cp failed".into());
    }
    fs_err::File::open(dst)?.sync_all()?;
    Ok(t.elapsed().as_secs_f64())
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--child") {
        return child(Path::new(&args[2]), Path::new(&args[3]), args[4].parse()?);
    }
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
    let scratch = base.join(format!("bench-rank-cache-{}", std::process::id()));
    fs_err::create_dir_all(&scratch)?;
    let result = (|| -> Result<(), Box<dyn std::error::Error>> {
        let t = Instant::now();
        let g = generate(&CheckpointSpec::large(1), &scratch.join("ckpt"))?;
        let gen_secs = t.elapsed().as_secs_f64();
        println!(
            "generated large checkpoint: {:.2} GiB in {} shards, {:.1} s ({:.0} MiB/s)",
            g.model_bytes as f64 / (1u64 << 30) as f64,
            g.shards.len(),
            gen_secs,
            g.model_bytes as f64 / (1 << 20) as f64 / gen_secs
        );
        // let the generator's dirty pages reach the disk before anything is timed
        let _ = Command::new("sync").status();
        let me = std::env::current_exe()?;
        let (mut build_tput, mut cp_tput, mut with_plan) = (Vec::new(), Vec::new(), Vec::new());
        let mut peak = 0u64;
        for (round, rank) in (0..rounds).flat_map(|r| [(r, 0usize), (r, 1)]) {
            let out = scratch.join(format!("rank{rank}"));
            drop_caches(cold);
            let o = Command::new(&me)
                .arg("--child")
                .arg(&g.model_dir)
                .arg(&out)
                .arg(rank.to_string())
                .output()?;
            if !o.status.success() {
                return Err(
                    format!("build child failed: {}", String::from_utf8_lossy(&o.stderr)).into(),
                );
            }
            let line = String::from_utf8(o.stdout)?;
            let f: Vec<&str> = line.split_whitespace().collect();
            let (secs, len, hwm, plan_secs): (f64, u64, u64, f64) =
                (f[0].parse()?, f[1].parse()?, f[2].parse()?, f[3].parse()?);
            let file = PathBuf::from(f[4]);
            peak = peak.max(hwm);
            drop_caches(cold);
            let cp_secs = cp_with_fsync(&file, &scratch.join(format!("cp-{rank}.bin")))?;
            fs_err::remove_file(scratch.join(format!("cp-{rank}.bin")))?;
            fs_err::remove_dir_all(&out)?;
            let mib = len as f64 / (1 << 20) as f64;
            build_tput.push(mib / secs);
            with_plan.push(mib / (secs + plan_secs));
            cp_tput.push(mib / cp_secs);
            println!(
                "round {round} rank {rank}/2: {mib:.0} MiB rank file; plan {plan_secs:.2} s; build {secs:.2} s = {:.0} MiB/s; cp+fsync {cp_secs:.2} s = {:.0} MiB/s; child peak RSS (VmHWM) {:.1} MiB",
                mib / secs,
                mib / cp_secs,
                hwm as f64 / 1024.0
            );
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            let n = v.len();
            if n % 2 == 1 {
                v[n / 2]
            } else {
                (v[n / 2 - 1] + v[n / 2]) / 2.0
            }
        };
        let (b, c, bp) = (
            median(&mut build_tput),
            median(&mut cp_tput),
            median(&mut with_plan),
        );
        println!(
            "summary: median build {b:.0} MiB/s ({bp:.0} MiB/s counting the plan), median cp+fsync {c:.0} MiB/s, ratio {:.2} ({:.2} counting the plan; goal >= 0.9); peak RSS {:.1} MiB (goal <= 512); {} page cache; {} runs each",
            b / c,
            bp / c,
            peak as f64 / 1024.0,
            if cold { "cold" } else { "warm" },
            build_tput.len()
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
