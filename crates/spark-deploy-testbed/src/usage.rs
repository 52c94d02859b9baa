//! What the machine did during a benchmark's step: CPU time (the whole machine's, the benchmark
//! process's and the worker containers'), and bytes written to a disk.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cluster::TestbedInfo;

const MIB: u64 = 1 << 20;

/// The load average (1, 5, 15 minutes) as `/proc/loadavg` gives it.
pub fn load_average() -> String {
    fs_err::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_owned())
}

/// The machine a benchmark ran on, in one line: CPU model, clock, cores, kernel. Figures of
/// CPU-bound steps compare across runs only on the same line.
pub fn machine() -> String {
    let cpuinfo = fs_err::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let first = |key: &str| {
        cpuinfo
            .lines()
            .find(|l| l.split(':').next().is_some_and(|k| k.trim() == key))
            .and_then(|l| l.split_once(':'))
            .map_or_else(|| "unknown".to_owned(), |(_, v)| v.trim().to_owned())
    };
    let cores = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let kernel = fs_err::read_to_string("/proc/sys/kernel/osrelease")
        .map_or_else(|_| "unknown".to_owned(), |k| k.trim().to_owned());
    format!(
        "{}, {} MHz, {cores} cores, kernel {kernel}",
        first("model name"),
        first("cpu MHz")
    )
}

/// What the machine did: CPU seconds (busy, iowait, stolen; all cores) and bytes written to one
/// disk.
#[derive(Clone, Copy, Default)]
pub struct Usage {
    /// CPU seconds busy, all cores (user, nice, system, irq, softirq).
    pub busy: f64,
    /// CPU seconds in iowait, all cores.
    pub iowait: f64,
    /// CPU seconds the hypervisor gave to others while this machine's cores had work: on a
    /// virtual machine whose host is busy, a CPU-bound copy slows by about this much.
    pub steal: f64,
    /// This process (the head: file servers, hashing, SSH sessions' I/O).
    pub head: f64,
    /// The testbed's worker containers (the receivers, sshd): their cgroups.
    pub workers: Option<f64>,
    /// Bytes written to the disk.
    pub written: u64,
}

impl Usage {
    /// Now, for the block device holding `dir` and the containers whose cgroups are `cgroups`.
    #[must_use]
    pub fn now(dir: &Path, cgroups: &[PathBuf]) -> Self {
        let ticks = 100.0; // USER_HZ
        let cpu: Vec<f64> = fs_err::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| s.lines().next().map(str::to_owned))
            .map(|l| {
                l.split_whitespace()
                    .skip(1)
                    .filter_map(|v| v.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        let field = |i: usize| cpu.get(i).copied().unwrap_or(0.0) / ticks;
        // user nice system idle iowait irq softirq steal
        let busy = field(0) + field(1) + field(2) + field(5) + field(6);
        // The block device of `dir` (its `stat`'s 7th field: sectors written).
        let sectors: u64 = fs_err::metadata(dir)
            .ok()
            .map(|m| std::os::unix::fs::MetadataExt::dev(&m))
            .and_then(|dev| {
                let (major, minor) = ((dev >> 8) & 0xfff, (dev & 0xff) | ((dev >> 12) & !0xff));
                fs_err::read_to_string(format!("/sys/dev/block/{major}:{minor}/stat")).ok()
            })
            .and_then(|s| s.split_whitespace().nth(6).and_then(|v| v.parse().ok()))
            .unwrap_or(0);
        // utime and stime (fields 14 and 15; the name in field 2 has no spaces here).
        let head = fs_err::read_to_string("/proc/self/stat")
            .ok()
            .map(|s| {
                let v: Vec<&str> = s.split_whitespace().collect();
                let f = |i: usize| v.get(i).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
                (f(13) + f(14)) / ticks
            })
            .unwrap_or(0.0);
        let workers = cgroups
            .iter()
            .map(|c| {
                fs_err::read_to_string(c.join("cpuacct.usage"))
                    .ok()
                    .and_then(|s| s.trim().parse::<f64>().ok())
                    .map(|ns| ns / 1e9)
            })
            .sum::<Option<f64>>()
            .filter(|_| !cgroups.is_empty());
        Self {
            busy,
            iowait: field(4),
            steal: field(7),
            head,
            workers,
            written: sectors * 512,
        }
    }

    /// What happened between `before` and `self`.
    #[must_use]
    pub fn since(self, before: Self) -> Self {
        Self {
            busy: self.busy - before.busy,
            iowait: self.iowait - before.iowait,
            steal: self.steal - before.steal,
            head: self.head - before.head,
            workers: self.workers.zip(before.workers).map(|(a, b)| a - b),
            written: self.written.saturating_sub(before.written),
        }
    }

    /// One line for a benchmark's output.
    #[must_use]
    pub fn show(&self) -> String {
        format!(
            "CPU: machine busy {:.2} s + iowait {:.2} s + stolen {:.2} s, of which head {:.2} s, worker containers {}; {:.0} MiB written to disk",
            self.busy,
            self.iowait,
            self.steal,
            self.head,
            self.workers
                .map_or_else(|| "n/a".to_owned(), |w| format!("{w:.2} s")),
            self.written as f64 / MIB as f64
        )
    }
}

/// The CPU-accounting cgroups of the testbed's worker containers (cgroup v1, as Docker makes
/// them here); none when they cannot be found.
pub fn worker_cgroups(info: &TestbedInfo) -> &'static [PathBuf] {
    static FOUND: std::sync::OnceLock<Vec<PathBuf>> = std::sync::OnceLock::new();
    FOUND.get_or_init(|| find_worker_cgroups(info))
}

fn find_worker_cgroups(info: &TestbedInfo) -> Vec<PathBuf> {
    info.workers
        .iter()
        .filter_map(|w| {
            let out = Command::new("docker")
                .args(["inspect", "-f", "{{.Id}}", &w.container])
                .output()
                .ok()?;
            let id = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            let dir = Path::new("/sys/fs/cgroup/cpuacct/docker").join(id);
            (out.status.success() && dir.join("cpuacct.usage").exists()).then_some(dir)
        })
        .collect()
}
