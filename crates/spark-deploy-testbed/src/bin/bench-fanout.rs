//! Benchmark (not a test): ConfigureWorkerStorage's fan-out, the time to feed three workers
//! against the time to feed one, side by side in one run on the testbed (`transfer::fan_out`, the
//! code the step runs: a file server per worker on the head's fabric address, every worker
//! pulling and verifying at once, the shared files' head hashes read once).
//!
//! Each worker receives what a four-node deployment ships it: its own rank file
//! (`BENCH_RANK_MIB`, default 128 MiB) and the files every worker shares (kit, Engram tables,
//! token map: `BENCH_SHARED_MIB`, default 64 MiB in 4 files). A rank file carries the sidecar a
//! rank-file build leaves (`rank_cache::content::record_sha256`, fed by a hash taken while the file
//! was written), so the head reads only the shared files' hashes, as on a real deployment. Both
//! runs start from an empty head hash cache and empty destinations, and include the `sync` that
//! puts the bytes on disk. Each run's head hashing and transfer are also shown apart, with the
//! transfer-only ratio.
//!
//! The testbed's workers share one disk and the machine's cores: each run also prints the CPU time
//! the whole machine spent (busy, iowait and stolen, from `/proc/stat`) and the bytes written to
//! the disk (from the block device's `stat`), and a reference measured in the same run: the same
//! bytes copied locally onto the workers' disk (`cp`, one per worker at once, then `sync`), the
//! floor of that disk for one and for three destinations. The last line is the whole step's ratio.
//!
//! `cargo run --release -p spark-deploy-testbed --bin bench-fanout` (needs root and Docker; run
//! under the testbed lock). A testbed with three workers that is already up is reused and left
//! up (only the benchmark's files go); otherwise one is brought up and taken down again.
#![allow(clippy::print_stdout)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use spark_deploy_core::engine::tensorfold::inputs::rank_cache::content;
use spark_deploy_core::ports::exec::Exec;
use spark_deploy_core::transfer::{FileJob, expand, fan_out, pull};
use spark_deploy_testbed::cluster::{self, TestbedInfo, TestbedOptions};
use spark_deploy_testbed::reuse::{self, Origin};
use spark_deploy_testbed::usage::{Usage, load_average, worker_cgroups};

type R<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const MIB: u64 = 1 << 20;

fn env_mib(key: &str, default: u64) -> u64 {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn sync_fs() {
    let _ = Command::new("sync").status();
}

/// A file of `mib` MiB whose bytes differ by `seed` (no two files alike). Returns its sha256,
/// taken from the bytes as they are written.
fn write_file(path: &Path, mib: u64, seed: u64) -> R<String> {
    use sha2::Digest as _;
    use std::io::Write as _;
    let mut sum = sha2::Sha256::new();
    let mut f = std::io::BufWriter::new(fs_err::File::create(path)?);
    let mut block = vec![0u8; MIB as usize];
    for i in 0..mib {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ i;
        for chunk in block.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
        }
        f.write_all(&block)?;
        sum.update(&block);
    }
    f.flush()?;
    Ok(hex::encode(sum.finalize()))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> R<()> {
    let opts = TestbedOptions {
        install_tools: true,
        workers: 3,
        ..TestbedOptions::default()
    };
    let testbed = reuse::up_or_reuse(&opts).await?;
    if testbed.origin == Origin::Reused {
        println!(
            "reusing the testbed that is up ({}): it stays up, only the benchmark's files go",
            opts.state_dir.display()
        );
    }
    let result = bench(&testbed.info).await;
    remove_bench_files(&testbed.info);
    if testbed.origin == Origin::Created {
        cluster::down(&opts).await?;
    }
    result
}

fn remove_bench_files(info: &TestbedInfo) {
    let _ = fs_err::remove_dir_all(info.state_dir.join("bench-fanout"));
    for w in &info.workers {
        let _ = fs_err::remove_dir_all(w.disk_dir.join("bench-fanout"));
    }
}

/// How long one run took: reading the head's source hashes (an empty cache: every file without a
/// recorded sum is read once), then the transfers (`sync` included); and what the machine did.
struct Timing {
    hash: f64,
    transfer: f64,
    usage: Usage,
}

impl Timing {
    fn total(&self) -> f64 {
        self.hash + self.transfer
    }
}

/// Feeds `workers` (indices into `info.workers`) their jobs at once.
async fn feed(
    info: &TestbedInfo,
    execs: &[Exec],
    workers: &[usize],
    jobs: &[Vec<FileJob>],
    run: &str,
) -> R<Timing> {
    let manifests: Vec<PathBuf> = workers
        .iter()
        .map(|&i| {
            info.workers[i]
                .disk_dir
                .join("bench-fanout")
                .join(run)
                .join(".manifest.tsv")
        })
        .collect();
    let targets: Vec<fan_out::Target<'_>> = workers
        .iter()
        .zip(&manifests)
        .map(|(&i, manifest)| fan_out::Target {
            exec: &execs[i],
            jobs: &jobs[i],
            manifest,
        })
        .collect();
    let cache = info
        .state_dir
        .join("bench-fanout")
        .join(format!("hashes-{run}.tsv"));
    sync_fs();
    let before = Usage::now(&info.workers[workers[0]].disk_dir, worker_cgroups(info));
    // What `feed` does first, timed on its own: the head's hashes of every source, read once.
    let t = Instant::now();
    let mut sources: Vec<PathBuf> = workers
        .iter()
        .flat_map(|&i| jobs[i].iter().map(|j| j.from.clone()))
        .collect();
    sources.sort();
    sources.dedup();
    pull::source_hashes(sources, &cache).await?;
    let hash = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let results = fan_out::feed(
        info.head_fabric_addr.into(),
        &targets,
        &cache,
        4,
        &|_, _| {},
        std::future::pending(),
    )
    .await?;
    sync_fs();
    let transfer = t.elapsed().as_secs_f64();
    let usage = Usage::now(&info.workers[workers[0]].disk_dir, worker_cgroups(info)).since(before);
    for r in results {
        let s = r?;
        if s.sent != s.files {
            return Err(format!(
                "{run}: {} of {} files sent (destinations not empty?)",
                s.sent, s.files
            )
            .into());
        }
    }
    Ok(Timing {
        hash,
        transfer,
        usage,
    })
}

/// The reference: every worker's payload copied locally (a `cp` a worker, all at once) into its
/// disk directory, then `sync`. Returns the seconds and what the machine did.
fn local_copy(info: &TestbedInfo, src: &Path, workers: &[usize]) -> R<(f64, Usage)> {
    sync_fs();
    let before = Usage::now(&info.workers[workers[0]].disk_dir, worker_cgroups(info));
    let t = Instant::now();
    let children = workers
        .iter()
        .map(|&i| {
            let dest = info.workers[i]
                .disk_dir
                .join("bench-fanout")
                .join(format!("cp-{}", workers.len()));
            fs_err::create_dir_all(&dest)?;
            Ok(Command::new("cp")
                .arg("-r")
                .arg(src.join("shared"))
                .arg(src.join(format!("rank{}of4.bin", i + 1)))
                .arg(&dest)
                .spawn()?)
        })
        .collect::<R<Vec<_>>>()?;
    for mut c in children {
        if !c.wait()?.success() {
            return Err("cp failed".into());
        }
    }
    sync_fs();
    let secs = t.elapsed().as_secs_f64();
    Ok((
        secs,
        Usage::now(&info.workers[workers[0]].disk_dir, worker_cgroups(info)).since(before),
    ))
}

async fn bench(info: &TestbedInfo) -> R<()> {
    if info.workers.len() < 3 {
        return Err(format!(
            "the testbed has {} worker(s); the benchmark needs 3",
            info.workers.len()
        )
        .into());
    }
    let rank_mib = env_mib("BENCH_RANK_MIB", 128);
    let shared_mib = env_mib("BENCH_SHARED_MIB", 64);
    let src = info.state_dir.join("bench-fanout").join("src");
    let _ = fs_err::remove_dir_all(info.state_dir.join("bench-fanout"));
    fs_err::create_dir_all(src.join("shared"))?;
    for i in 0..4 {
        write_file(
            &src.join("shared").join(format!("shared-{i}.bin")),
            shared_mib / 4,
            100 + i,
        )?;
    }
    for rank in 1..=3u64 {
        let file = src.join(format!("rank{rank}of4.bin"));
        let sum = write_file(&file, rank_mib, rank)?;
        // The sidecar a rank-file build leaves: the sum taken as the file was written.
        content::record_sha256(&file, &sum)?;
    }
    sync_fs();
    let mut execs = Vec::with_capacity(info.workers.len());
    for w in &info.workers {
        execs.push(Exec::connect(w.name.clone(), &w.node_target()).await?);
    }
    // Per run, each worker's own destination tree (no run finds another's files).
    let jobs_for = |run: &str| -> R<Vec<Vec<FileJob>>> {
        info.workers
            .iter()
            .enumerate()
            .take(3)
            .map(|(i, w)| {
                let dest = w.disk_dir.join("bench-fanout").join(run);
                let mut j = expand(&src.join("shared"), &dest.join("shared"))?;
                j.extend(expand(
                    &src.join(format!("rank{}of4.bin", i + 1)),
                    &dest.join(format!("rank{}of4.bin", i + 1)),
                )?);
                Ok(j)
            })
            .collect()
    };
    let per_worker = rank_mib + shared_mib;
    println!(
        "payload per worker: its own rank file {rank_mib} MiB + {shared_mib} MiB shared (4 files); head {}, workers {}",
        info.head_fabric_addr,
        info.workers
            .iter()
            .take(3)
            .map(|w| w.fabric_addr.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let load = load_average();
    let one = feed(info, &execs, &[0], &jobs_for("one")?, "one").await?;
    let three = feed(info, &execs, &[0, 1, 2], &jobs_for("three")?, "three").await?;
    let local_one = local_copy(info, &src, &[0])?;
    let local_three = local_copy(info, &src, &[0, 1, 2])?;
    let rate = |mib: u64, s: f64| mib as f64 / s;
    println!(
        "load average before the runs: {load}; after: {}",
        load_average()
    );
    println!(
        "one worker   : {:7.2} s  {:8.1} MiB/s  ({per_worker} MiB to worker-1; head hashes {:.2} s + transfer {:.2} s; {})",
        one.total(),
        rate(per_worker, one.total()),
        one.hash,
        one.transfer,
        one.usage.show()
    );
    println!(
        "three workers: {:7.2} s  {:8.1} MiB/s  ({per_worker} MiB to each of worker-1..3 at once; head hashes {:.2} s + transfer {:.2} s; {})",
        three.total(),
        rate(3 * per_worker, three.total()),
        three.hash,
        three.transfer,
        three.usage.show()
    );
    println!(
        "disk floor, local cp of the same bytes onto the workers' disk + sync: one {:.2} s, three {:.2} s = {:.2}x ({} / {})",
        local_one.0,
        local_three.0,
        local_three.0 / local_one.0,
        local_one.1.show(),
        local_three.1.show()
    );
    println!(
        "transfer only (hashes already known): three / one = {:.2}x",
        three.transfer / one.transfer
    );
    println!(
        "three workers / one worker = {:.2}x",
        three.total() / one.total()
    );
    Ok(())
}
