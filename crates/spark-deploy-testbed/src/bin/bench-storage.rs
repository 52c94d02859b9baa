//! Benchmark (not a test): copy-mode throughput to the testbed worker, measured side by side in
//! one run against `rsync -a --whole-file` over SSH to the worker's fabric address and a local `cp`
//! onto the worker's disk directory (the testbed's physical limit: the same disk).
//!
//! `cargo run --release -p spark-deploy-testbed --bin bench-storage` (the large test-scale
//! checkpoint's model files, 2.49 GiB; `BENCH_CHECKPOINT=small` for a quick run). Ours ships them
//! as the step does, from HF-cache blobs named by their sha256; rsync and cp copy the same bytes
//! from the plain files. Needs root, Docker and `rsync`.
//!
//! A testbed that is already up (a `spark-deploy demo` deployment, say) is reused and left up,
//! with only the benchmark's own files removed; a testbed the benchmark brought up, it takes down.
#![allow(clippy::print_stdout)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use spark_deploy_core::ports::exec::Exec;
use spark_deploy_core::transfer::{expand, pull, server::FileServer};
use spark_deploy_testbed::checkpoint::{CheckpointSpec, generate};
use spark_deploy_testbed::cluster::{self, TestbedOptions};
use spark_deploy_testbed::reuse::{self, Origin};

type R<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn dir_bytes(p: &Path) -> u64 {
    expand(p, Path::new("/x"))
        .map(|j| j.iter().map(|f| f.size).sum())
        .unwrap_or(0)
}

fn sync_fs() {
    let _ = Command::new("sync").status();
}

/// The load average (1, 5, 15 minutes) as `/proc/loadavg` gives it.
fn load_average() -> String {
    fs_err::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_owned())
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
    let dirs = ["bench-src", "bench-blobs", "bench-39"]
        .map(|d| info.state_dir.join(d))
        .into_iter()
        .chain(["bench-ours", "bench-rsync", "bench-cp", "bench-39"].map(|d| w.disk_dir.join(d)));
    for d in dirs {
        let _ = fs_err::remove_dir_all(d);
    }
    let _ = fs_err::remove_file(info.state_dir.join("hashes.tsv"));
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
    let mib = |secs: f64| bytes as f64 / secs / f64::from(1u32 << 20);

    // 1. Ours: head file server on the fabric address, worker pulls with curl, sha256 verified.
    let dest = w.disk_dir.join("bench-ours");
    let server = FileServer::start(SocketAddr::new(info.head_fabric_addr.into(), 0)).await?;
    let exec = Exec::connect(w.name.clone(), &w.node_target()).await?;
    // The checkpoint as ConfigureWorkerStorage ships it: from the head's HF cache, where each
    // file is a blob named by its sha256 (the Hub's LFS oid), so the head does not re-hash it.
    // The blobs are hard links of the generated files (hashed here, untimed).
    let blobs = info.state_dir.join("bench-blobs");
    let _ = fs_err::remove_dir_all(&blobs);
    fs_err::create_dir_all(&blobs)?;
    let mut jobs = expand(&data, &dest)?;
    for j in &mut jobs {
        use sha2::Digest as _;
        use std::io::Read as _;
        let mut h = sha2::Sha256::new();
        let mut f = fs_err::File::open(&j.from)?;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
        }
        let blob = blobs.join(hex::encode(h.finalize()));
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
    let t = Instant::now();
    let stats = pull::transfer(
        &exec,
        &server,
        &jobs,
        &dest.join(".manifest.tsv"),
        &info.state_dir.join("hashes.tsv"),
        streams,
        &|_| {},
    )
    .await?;
    sync_fs();
    let ours = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let again = pull::transfer(
        &exec,
        &server,
        &jobs,
        &dest.join(".manifest.tsv"),
        &info.state_dir.join("hashes.tsv"),
        4,
        &|_| {},
    )
    .await?;
    let rerun = t.elapsed().as_secs_f64();

    // 2. rsync -a --whole-file over SSH to the worker's fabric address.
    let rdest = w.disk_dir.join("bench-rsync");
    let ssh = format!(
        "ssh -i {} -o BatchMode=yes -o UserKnownHostsFile={} -o HostKeyAlias={} -o StrictHostKeyChecking=yes",
        w.identity_file.display(),
        w.known_hosts.display(),
        w.management_addr
    );
    let t = Instant::now();
    let st = Command::new("rsync")
        .args(["-a", "--whole-file", "-e", &ssh])
        .arg(format!("{}/", data.display()))
        .arg(format!("root@{}:{}/", w.fabric_addr, rdest.display()))
        .status()?;
    sync_fs();
    let rsync = t.elapsed().as_secs_f64();
    if !st.success() {
        return Err("rsync failed".into());
    }

    // 3. Local cp onto the worker's disk directory (same disk).
    let cdest: PathBuf = w.disk_dir.join("bench-cp");
    let t = Instant::now();
    let st = Command::new("cp")
        .arg("-r")
        .arg(&data)
        .arg(&cdest)
        .status()?;
    sync_fs();
    let cp = t.elapsed().as_secs_f64();
    if !st.success() {
        return Err("cp failed".into());
    }

    println!(
        "ours  : {ours:7.2} s  {:8.1} MiB/s  ({} of {} files sent, sha256 verified on both ends)",
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
    go().await?;
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
        "ratio ours/rsync = {:.2}x   ours/cp = {:.2}x",
        rsync / ours,
        cp / ours
    );
    Ok(())
}
