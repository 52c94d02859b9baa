//! Benchmark (not a test): copy-mode throughput to the testbed worker, measured side by side in
//! one run against `rsync -a --whole-file` over SSH to the worker's fabric address and a local `cp`
//! onto the worker's disk directory (the testbed's physical limit: the same disk).
//!
//! A fourth way, `disk`, is the disk's own speed for the worker's write pattern: the same files
//! written from the head's page cache by 4 threads the way the worker's receiver writes (4 MiB
//! blocks with `O_DIRECT`), with no network and no hash (`spark_deploy_testbed::direct_write`).
//!
//! `cargo run --release -p spark-deploy-testbed --bin bench-storage` (the large test-scale
//! checkpoint's model files, 2.49 GiB; `BENCH_CHECKPOINT=small` for a quick run). It runs
//! `BENCH_ROUNDS` rounds (2 unless set), each copying the payload all four ways, the even rounds
//! in the reverse order, and reports each copy and each way's median; `BENCH_STREAMS` sets ours's
//! streams (4, the step's setting). Ours ships them
//! as the step does, from HF-cache blobs named by their sha256; rsync and cp copy the same bytes
//! from the plain files. Needs root, Docker and `rsync`.
//!
//! Each copy also prints what the machine did meanwhile (CPU seconds busy, in iowait and stolen by
//! the hypervisor, over all cores, of which this process, the head, and the worker's container;
//! bytes written to the disk), to tell a copy bound by the cores from one bound by the disk or
//! slowed by a busy host. A first line names the machine (CPU, clock, cores, kernel): figures
//! compare across runs only on the same one. `BENCH_WAYS=ours` (a comma-separated subset of
//! `ours,rsync,cp,disk`) runs only those ways, to profile one; `BENCH_TRACE=1` prints after each
//! copy of ours when each file first moved and when it landed (the first seen at the transfer's
//! half-second progress ticks).
//!
//! After the rounds, `hash` is the worker's sha256 alone: as many bytes hashed in memory by
//! `BENCH_STREAMS` processes of the worker's `python3`, no network and no disk. Ours verifies
//! what arrives, so on a host of few cores this is the floor under ours, whatever the disk.
//!
//! A testbed that is already up (a `spark-deploy demo` deployment, say) is reused and left up,
//! with only the benchmark's own files removed; a testbed the benchmark brought up, it takes down.
#![allow(clippy::print_stdout)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::Instant;

use spark_deploy_core::bench::Stat;
use spark_deploy_core::ports::exec::{Cmd, Exec};
use spark_deploy_core::transfer::{expand, pull, server::FileServer};
use spark_deploy_testbed::checkpoint::{CheckpointSpec, generate};
use spark_deploy_testbed::cluster::{self, TestbedOptions};
use spark_deploy_testbed::direct_write;
use spark_deploy_testbed::reuse::{self, Origin};
use spark_deploy_testbed::usage::{Usage, load_average, machine, worker_cgroups};

type R<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn dir_bytes(p: &Path) -> u64 {
    expand(p, Path::new("/x"))
        .map(|j| j.iter().map(|f| f.size).sum())
        .unwrap_or(0)
}

fn sync_fs() {
    let _ = Command::new("sync").status();
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> R<()> {
    let opts = TestbedOptions {
        install_tools: true,
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

/// Everything the benchmark writes, on the head and on the worker's disk.
fn remove_bench_files(info: &cluster::TestbedInfo) {
    let w = info.worker();
    let dirs = ["bench-src", "bench-hf", "bench-39"]
        .map(|d| info.state_dir.join(d))
        .into_iter()
        .chain(
            [
                "bench-ours",
                "bench-rsync",
                "bench-cp",
                "bench-disk",
                "bench-39",
            ]
            .map(|d| w.disk_dir.join(d)),
        );
    for d in dirs {
        let _ = fs_err::remove_dir_all(d);
    }
    let _ = fs_err::remove_file(info.state_dir.join("hashes.tsv"));
}

/// What the worker's sha256 alone costs: wall and CPU seconds.
struct Hashed {
    wall: f64,
    cpu: f64,
}

/// Hashes `bytes` in memory on the worker, split over `procs` processes, with the worker's
/// `python3` (the receiver's hash): the floor, on the worker's cores, of any copy that verifies
/// the sha256 of what arrives. Prints `<wall> <cpu>` seconds.
const HASH_ALONE: &str = r"
import hashlib, mmap, os, sys, time
total, procs = int(sys.argv[1]), int(sys.argv[2])
block = mmap.mmap(-1, 4 << 20)
block.write(os.urandom(4 << 20))
view = memoryview(block)
start = time.monotonic()
for p in range(procs):
    if os.fork() == 0:
        h, left = hashlib.sha256(), total // procs
        while left > 0:
            h.update(view[:min(left, len(view))])
            left -= len(view)
        os._exit(0)
for p in range(procs):
    os.wait()
wall = time.monotonic() - start
t = os.times()
print(wall, t.children_user + t.children_system)
";

async fn hash_alone(exec: &Exec, bytes: u64, procs: usize) -> R<Hashed> {
    let cmd = Cmd::new("python3")
        .arg("-c")
        .arg(HASH_ALONE)
        .arg(bytes.to_string())
        .arg(procs.to_string());
    let out = exec.run(&cmd).await?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut f = text.split_whitespace().map(str::parse::<f64>);
    match (f.next(), f.next()) {
        (Some(Ok(wall)), Some(Ok(cpu))) => Ok(Hashed { wall, cpu }),
        _ => Err(format!("the worker's hash printed {text:?}, not `<wall> <cpu>`").into()),
    }
}

/// When each file of a copy of ours first moved and when its last byte arrived, in seconds
/// since the copy started.
struct FileTimeline {
    start: Instant,
    files: Mutex<Vec<Moved>>,
}

/// One file of a [`FileTimeline`]: where it went, its size, when it first moved and landed.
struct Moved {
    to: PathBuf,
    size: u64,
    first: f64,
    landed: Option<f64>,
}

impl FileTimeline {
    fn new(start: Instant) -> Self {
        Self {
            start,
            files: Mutex::new(Vec::new()),
        }
    }

    fn saw(&self, p: &pull::TransferProgress<'_>) {
        let now = self.start.elapsed().as_secs_f64();
        let Ok(mut files) = self.files.lock() else {
            return;
        };
        let at = match files.iter().position(|f| f.to == p.file) {
            Some(i) => i,
            None => {
                files.push(Moved {
                    to: p.file.to_owned(),
                    size: p.file_total,
                    first: now,
                    landed: None,
                });
                files.len() - 1
            }
        };
        if p.file_done == p.file_total {
            files[at].landed.get_or_insert(now);
        }
    }

    fn show(&self) -> String {
        let Ok(files) = self.files.lock() else {
            return String::new();
        };
        files
            .iter()
            .map(|f| {
                let name =
                    f.to.file_name()
                        .map(|n| n.to_string_lossy())
                        .unwrap_or_default();
                let landed = f
                    .landed
                    .map_or_else(|| "-".to_owned(), |l| format!("{l:.2}"));
                format!(
                    "  {name:<44} {:7.1} MiB  {:5.2} s -> {landed:>5} s\n",
                    f.size as f64 / f64::from(1u32 << 20),
                    f.first
                )
            })
            .collect()
    }
}

/// One way of copying the payload to the worker's disk.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Way {
    Ours,
    Rsync,
    Cp,
    Disk,
}

impl Way {
    fn name(self) -> &'static str {
        match self {
            Self::Ours => "ours",
            Self::Rsync => "rsync",
            Self::Cp => "cp",
            Self::Disk => "disk",
        }
    }

    /// Its destination directory under the worker's disk directory.
    fn dir(self) -> &'static str {
        match self {
            Self::Ours => "bench-ours",
            Self::Rsync => "bench-rsync",
            Self::Cp => "bench-cp",
            Self::Disk => "bench-disk",
        }
    }
}

async fn bench(info: &cluster::TestbedInfo) -> R<()> {
    let w = info.worker();
    let src = info.state_dir.join("bench-src");
    let spec = if std::env::var("BENCH_CHECKPOINT").as_deref() == Ok("small") {
        CheckpointSpec::small(3)
    } else {
        CheckpointSpec::large(3)
    };
    let g = generate(&spec, &src)?;
    let data = g.model_dir.clone();
    let bytes = dir_bytes(&data);
    println!(
        "payload: {} files, {:.2} GiB ({})",
        expand(&data, Path::new("/x"))?.len(),
        bytes as f64 / f64::from(1u32 << 30),
        data.display()
    );
    println!("machine: {}", machine());
    let mib = |secs: f64| bytes as f64 / secs / f64::from(1u32 << 20);

    let server = FileServer::start(SocketAddr::new(info.head_fabric_addr.into(), 0)).await?;
    let exec = Exec::connect(w.name.clone(), &w.node_target()).await?;
    // The checkpoint as ConfigureWorkerStorage ships it: from the head's HF cache, where each
    // file is a blob named by its sha256 (the Hub's LFS oid), so the head does not re-hash it.
    // The blobs are hard links of the generated files (hashed here, untimed), in a directory
    // named `blobs` as in the HF cache: the step trusts such a name and reads none of them.
    let hf = info.state_dir.join("bench-hf");
    let _ = fs_err::remove_dir_all(&hf);
    let blobs = hf.join("blobs");
    fs_err::create_dir_all(&blobs)?;
    let mut jobs = expand(&data, &w.disk_dir.join(Way::Ours.dir()))?;
    for j in &mut jobs {
        let blob = blobs.join(spark_deploy_core::digest::sha256_file(&j.from)?);
        if !blob.exists() {
            fs_err::hard_link(&j.from, &blob)?;
        }
        j.from = blob;
    }
    sync_fs();
    let load = load_average();
    let streams: usize = std::env::var("BENCH_STREAMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2)
        .max(1);
    let ssh = format!(
        "ssh -i {} -o BatchMode=yes -o UserKnownHostsFile={} -o HostKeyAlias={} -o StrictHostKeyChecking=yes",
        w.identity_file.display(),
        w.known_hosts.display(),
        w.management_addr
    );
    // `BENCH_WAYS` (a comma-separated subset of ours,rsync,cp,disk) runs only those: for profiling
    // one way; the ratios then print NaN for the others.
    let ways = std::env::var("BENCH_WAYS").unwrap_or_else(|_| "ours,rsync,cp,disk".to_owned());
    let hashes = info.state_dir.join("hashes.tsv");
    // `BENCH_TRACE=1` prints, after each copy of ours, when each file started and landed.
    let trace = std::env::var("BENCH_TRACE").is_ok_and(|v| v == "1");
    let mut times: Vec<(Way, f64)> = Vec::new();
    let mut stats = None;
    for round in 1..=rounds {
        // Odd rounds run ours, rsync, cp, disk; even rounds the reverse, so whatever the machine
        // makes a round's first copy pay falls on each way in turn.
        let mut order = [Way::Ours, Way::Rsync, Way::Cp, Way::Disk];
        if round % 2 == 0 {
            order.reverse();
        }
        for way in order.into_iter().filter(|w| ways.contains(w.name())) {
            let dest = w.disk_dir.join(way.dir());
            let _ = fs_err::remove_dir_all(&dest);
            sync_fs();
            let before = Usage::now(&w.disk_dir, worker_cgroups(info));
            let t = Instant::now();
            match way {
                // 1. Ours: the head's file server on the fabric address, the worker pulls,
                //    sha256 verified on arrival.
                Way::Ours => {
                    let timeline = trace.then(|| FileTimeline::new(t));
                    let s = pull::transfer(
                        &exec,
                        &server,
                        &jobs,
                        &dest.join(".manifest.tsv"),
                        &hashes,
                        streams,
                        &|p| {
                            if let Some(timeline) = &timeline {
                                timeline.saw(p);
                            }
                        },
                    )
                    .await?;
                    if let Some(timeline) = &timeline {
                        print!("{}", timeline.show());
                    }
                    stats = Some(s);
                }
                // 2. rsync -a --whole-file over SSH to the worker's fabric address.
                Way::Rsync => {
                    let st = Command::new("rsync")
                        .args(["-a", "--whole-file", "-e", &ssh])
                        .arg(format!("{}/", data.display()))
                        .arg(format!("root@{}:{}/", w.fabric_addr, dest.display()))
                        .status()?;
                    if !st.success() {
                        return Err("rsync failed".into());
                    }
                }
                // 3. A local cp onto the worker's disk directory (the same disk).
                Way::Cp => {
                    let st = Command::new("cp")
                        .arg("-r")
                        .arg(&data)
                        .arg(&dest)
                        .status()?;
                    if !st.success() {
                        return Err("cp failed".into());
                    }
                }
                // 4. The disk alone, written as the worker's receiver writes.
                Way::Disk => {
                    let pairs: Vec<_> = expand(&data, &dest)?
                        .into_iter()
                        .map(|j| (j.from, j.to))
                        .collect();
                    tokio::task::spawn_blocking(move || direct_write::copy_all(&pairs, streams))
                        .await??;
                }
            }
            sync_fs();
            let secs = t.elapsed().as_secs_f64();
            let usage = Usage::now(&w.disk_dir, worker_cgroups(info)).since(before);
            println!(
                "round {round}: {:<5} {secs:7.2} s  {:8.1} MiB/s  {}",
                way.name(),
                mib(secs),
                usage.show()
            );
            times.push((way, secs));
        }
        let this = |way: Way| {
            times
                .iter()
                .rev()
                .take(order.len())
                .find(|(w, _)| *w == way)
                .map_or(f64::NAN, |(_, s)| *s)
        };
        println!(
            "round {round}: ours/rsync = {:.2}x   ours/cp = {:.2}x   ours/disk = {:.2}x",
            this(Way::Rsync) / this(Way::Ours),
            this(Way::Cp) / this(Way::Ours),
            this(Way::Disk) / this(Way::Ours)
        );
    }
    let median = |way: Way| {
        let of_way = times.iter().filter(|(w, _)| *w == way).map(|(_, s)| *s);
        Stat::of(of_way.collect()).median
    };
    let (ours, rsync, cp, disk) = (
        median(Way::Ours),
        median(Way::Rsync),
        median(Way::Cp),
        median(Way::Disk),
    );
    let stats = stats.ok_or("no round ran")?;
    let t = Instant::now();
    let again = pull::transfer(
        &exec,
        &server,
        &jobs,
        &w.disk_dir.join(Way::Ours.dir()).join(".manifest.tsv"),
        &hashes,
        4,
        &|_| {},
    )
    .await?;
    let rerun = t.elapsed().as_secs_f64();
    let hash = hash_alone(&exec, bytes, streams).await?;

    println!("medians over {rounds} round(s):");
    println!(
        "ours  : {ours:7.2} s  {:8.1} MiB/s  ({} of {} files sent, {streams} streams, sha256 verified on arrival)",
        mib(ours),
        stats.sent,
        stats.files
    );
    println!(
        "rsync : {rsync:7.2} s  {:8.1} MiB/s  (-a --whole-file over SSH to {})",
        mib(rsync),
        w.fabric_addr
    );
    println!(
        "cp    : {cp:7.2} s  {:8.1} MiB/s  (local, same disk)",
        mib(cp)
    );
    println!(
        "disk  : {disk:7.2} s  {:8.1} MiB/s  (the same files written as the receiver writes: {streams} streams, 4 MiB O_DIRECT blocks, no network, no hash)",
        mib(disk)
    );
    println!(
        "hash  : {:7.2} s  {:8.1} MiB/s  (the worker's sha256 alone: the same number of bytes hashed in memory by {streams} processes, no network, no disk; {:.2} CPU s)",
        hash.wall,
        mib(hash.wall),
        hash.cpu
    );
    println!(
        "up-to-date re-run: {} of {} files sent in {rerun:.2} s",
        again.sent, again.files
    );
    // 4. An up-to-date re-run over 39 files (the checkpoint's shard count).
    let many = info.state_dir.join("bench-39");
    fs_err::create_dir_all(&many)?;
    for i in 0..39u32 {
        fs_err::write(
            many.join(format!("model-{:05}-of-00039.safetensors", i + 1)),
            vec![u8::try_from(i).unwrap_or(0); 1 << 20],
        )?;
    }
    let mdest = w.disk_dir.join("bench-39");
    let mjobs = expand(&many, &mdest)?;
    let (mmanifest, mhashes) = (
        mdest.join(".manifest.tsv"),
        info.state_dir.join("hashes.tsv"),
    );
    let go = || pull::transfer(&exec, &server, &mjobs, &mmanifest, &mhashes, 4, &|_| {});
    let t = Instant::now();
    let first39 = go().await?;
    println!(
        "first copy, 39 files of 1 MiB: {} sent in {:.2} s",
        first39.sent,
        t.elapsed().as_secs_f64()
    );
    let t = Instant::now();
    let again39 = go().await?;
    println!(
        "up-to-date re-run, 39 files: {} sent, {} bytes, in {:.2} s",
        again39.sent,
        again39.bytes_sent,
        t.elapsed().as_secs_f64()
    );
    println!(
        "load average before the copies: {load}; after: {}",
        load_average()
    );
    println!(
        "ratio ours/rsync = {:.2}x   ours/cp = {:.2}x   ours/disk = {:.2}x",
        rsync / ours,
        cp / ours,
        disk / ours
    );
    Ok(())
}
