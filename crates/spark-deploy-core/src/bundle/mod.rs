//! The support bundle: one `.tar.gz` with what it takes to understand a deployment's trouble
//! without access to its machines.
//!
//! Every member lives under one top directory `spark-deploy-bundle-<name>-<stamp>/`:
//!
//! | Member | What |
//! |---|---|
//! | `index.json` | the members with their sizes, and every expected member that is absent with why |
//! | `config.toml`, `plan.json`, `plan.txt` | the validated config and the standard plan |
//! | `status.json` | both ranks' containers, the API, memory, as `status` shows them |
//! | `state/launched.json`, `state/preflight.json`, `state/startup.json` | the last launch with its facts, the last preflight report with the facts known after its run ([`keep_preflight`]), the startup timings |
//! | `state/last-run.events.jsonl` | the events of the last `up`/`down`/`restart`/… run |
//! | `watch/…` | the supervisor's files (samples, state, stop marker, pause lease, logs saved by heals) |
//! | `ranks/rank<N>.log` | each rank's current log (timestamps, last 20 000 lines) |
//! | `nodes/<node>/saved-logs/<file>.log` | the logs `down` and heals saved on the node, unpacked |
//! | `nodes/<node>/meminfo.txt`, `dmesg.txt`, `nvrm.txt`, `ip-s-link.txt`, `fabric-counters.txt` | the node's memory, kernel log tail and its NVIDIA driver (`NVRM`) lines, link counters |
//!
//! Secrets never enter it: the config and plan show them as `***`, and every member's bytes are
//! scrubbed of the HF token and the API key (the configured values, the token file's and the key
//! file's) before they are written. The archive is written as `<out>.partial` and renamed when
//! complete. A member that cannot be read (a node unreachable, `dmesg` not permitted) is listed
//! as absent with the reason; only a failure to write the archive is an error.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::Serialize;

use crate::container::rank_container_name;
use crate::context::Context;
use crate::layout::NodeLayout;
use crate::lifecycle::{launch_record, run_log, startup};
use crate::plan::Plan;
use crate::ports::exec::Cmd;
use crate::secret::Secret;

/// Schema of `index.json`.
pub const INDEX_SCHEMA: &str = "spark-deploy.bundle/v1";
/// Lines of each rank's current log.
const LOG_TAIL: usize = 20_000;
/// Lines of `dmesg` kept.
const DMESG_TAIL: usize = 2_000;
/// A larger local file is cut to its last bytes.
const MAX_FILE: usize = 64 << 20;
/// Bound of one remote read.
const REMOTE: Duration = Duration::from_secs(30);

/// Errors of writing a bundle.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    /// The archive could not be written.
    #[error("support bundle {path}: {source}; remedy: pass --out with a writable path")]
    Io {
        /// The file.
        path: PathBuf,
        /// Underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// One member of the archive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Member {
    /// Path below the top directory.
    pub name: String,
    /// Size in bytes (after redaction).
    pub bytes: u64,
}

/// An expected member that is not in the archive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Absent {
    /// Path it would have.
    pub name: String,
    /// Why it is absent.
    pub why: String,
}

/// What was written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BundleReport {
    /// The archive.
    pub path: PathBuf,
    /// Its top directory.
    pub top: String,
    /// Members in archive order (`index.json` last).
    pub members: Vec<Member>,
    /// Expected members that are absent, with why.
    pub absent: Vec<Absent>,
}

/// `<state_dir>/bundles/<name>-<YYYYmmdd-HHMMSS>.tar.gz`.
#[must_use]
pub fn default_path(state_dir: &Path, name: &str, at: SystemTime) -> PathBuf {
    state_dir.join("bundles").join(format!(
        "{name}-{}.tar.gz",
        crate::lifecycle::logs::stamp(at)
    ))
}

/// Every secret the deployment knows: the configured HF token and API key, credentials in the
/// hub endpoint, the token file's token and the key file's key.
fn secrets(ctx: &Context) -> Vec<Secret> {
    let c = ctx.config().config();
    let mut out: Vec<Secret> = c.secrets();
    if let Some(t) = crate::hub::HfToken::from_file(Path::new(&c.hub.token_file)) {
        out.push(Secret::new(t.expose()));
    }
    if let Ok(k) = crate::lifecycle::api_key::read(Path::new(&c.serving.api_key_file)) {
        out.push(k);
    }
    out.retain(|s| !s.expose().is_empty());
    // Longest first, so that a secret containing another is replaced whole.
    out.sort_by_key(|s| std::cmp::Reverse(s.expose().len()));
    out.dedup();
    out
}

/// The members gathered so far.
struct Collector {
    secrets: Vec<Secret>,
    members: Vec<(String, Vec<u8>)>,
    absent: Vec<Absent>,
}

impl Collector {
    fn add(&mut self, name: impl Into<String>, bytes: &[u8]) {
        let clean = self
            .secrets
            .iter()
            .fold(bytes.to_vec(), |b, s| s.redact_bytes(&b));
        self.members.push((name.into(), clean));
    }

    fn absent(&mut self, name: impl Into<String>, why: impl Into<String>) {
        self.absent.push(Absent {
            name: name.into(),
            why: why.into(),
        });
    }

    /// A local file, or its absence with why.
    fn file(&mut self, name: &str, path: &Path) {
        match read_capped(path) {
            Ok(b) => self.add(name, &b),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.absent(name, format!("{} does not exist", path.display()));
            }
            Err(e) => self.absent(name, format!("{}: {e}", path.display())),
        }
    }

    /// Every file below `dir` as `<prefix>/<relative path>`.
    fn tree(&mut self, prefix: &str, dir: &Path) -> usize {
        let mut n = 0;
        let Ok(entries) = std::fs::read_dir(dir) else {
            return 0;
        };
        let mut entries: Vec<_> = entries.filter_map(Result::ok).collect();
        entries.sort_by_key(std::fs::DirEntry::file_name);
        for e in entries {
            let name = format!("{prefix}/{}", e.file_name().to_string_lossy());
            let path = e.path();
            if path.is_dir() {
                n += self.tree(&name, &path);
            } else if path.is_file() {
                self.file(&name, &path);
                n += 1;
            }
        }
        n
    }
}

/// A file's bytes, only the last [`MAX_FILE`] of a larger one.
fn read_capped(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Seek as _;
    let mut f = std::fs::File::open(path)?;
    let len = f.metadata()?.len();
    let cap = MAX_FILE as u64;
    if len > cap {
        f.seek(std::io::SeekFrom::Start(len - cap))?;
    }
    let mut out = Vec::new();
    f.read_to_end(&mut out)?;
    Ok(out)
}

fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let from = lines.len().saturating_sub(n);
    let mut out = lines[from..].join("\n");
    out.push('\n');
    out
}

/// The NVIDIA driver's lines of a kernel log.
#[must_use]
pub fn nvrm_lines(dmesg: &str) -> String {
    dmesg
        .lines()
        .filter(|l| l.contains("NVRM") || l.contains("Xid"))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// The shell command listing the fabric counters of `netdev` (every netdev's when unknown) and
/// every RDMA port's counters, one `path value` line each.
fn counters_script(netdev: Option<&str>) -> String {
    let net = netdev.map_or_else(
        || "/sys/class/net/*/statistics/*".to_owned(),
        |d| format!("/sys/class/net/{d}/statistics/*"),
    );
    format!(
        "for f in {net} /sys/class/infiniband/*/ports/*/counters/* \
         /sys/class/infiniband/*/ports/*/hw_counters/*; do \
         [ -f \"$f\" ] && [ -r \"$f\" ] && printf '%s %s\\n' \"$f\" \"$(cat \"$f\" 2>/dev/null)\"; \
         done; true"
    )
}

async fn bounded<T, E: std::fmt::Display>(
    f: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, String> {
    match tokio::time::timeout(REMOTE, f).await {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(_) => Err(format!("no answer in {} s", REMOTE.as_secs())),
    }
}

/// Each node: memory, kernel log, link counters, saved rank logs; through the node's Exec port.
async fn nodes(ctx: &Context, col: &mut Collector, netdevs: &[Option<String>]) {
    let c = ctx.config().config();
    for (i, node) in c.nodes.iter().enumerate() {
        let dir = format!("nodes/{}", node.name);
        let exec = match bounded(ctx.exec(i)).await {
            Ok(e) => e,
            Err(e) => {
                col.absent(format!("{dir}/"), format!("the node is unreachable: {e}"));
                continue;
            }
        };
        match bounded(exec.read_file(Path::new("/proc/meminfo"))).await {
            Ok(b) => col.add(format!("{dir}/meminfo.txt"), &b),
            Err(e) => col.absent(format!("{dir}/meminfo.txt"), e),
        }
        match bounded(exec.run(&Cmd::new("dmesg").arg("--ctime"))).await {
            Ok(o) => {
                let text = String::from_utf8_lossy(&o.stdout);
                col.add(
                    format!("{dir}/dmesg.txt"),
                    last_lines(&text, DMESG_TAIL).as_bytes(),
                );
                col.add(format!("{dir}/nvrm.txt"), nvrm_lines(&text).as_bytes());
            }
            Err(e) => {
                let why = format!("dmesg is not readable here: {e}");
                col.absent(format!("{dir}/dmesg.txt"), why.clone());
                col.absent(format!("{dir}/nvrm.txt"), why);
            }
        }
        match bounded(exec.run(&Cmd::new("ip").args(["-s", "link"]))).await {
            Ok(o) => col.add(format!("{dir}/ip-s-link.txt"), &o.stdout),
            Err(e) => col.absent(format!("{dir}/ip-s-link.txt"), e),
        }
        let netdev = netdevs.get(i).and_then(Option::as_deref);
        match bounded(exec.run(&Cmd::shell(counters_script(netdev)))).await {
            Ok(o) => col.add(format!("{dir}/fabric-counters.txt"), &o.stdout),
            Err(e) => col.absent(format!("{dir}/fabric-counters.txt"), e),
        }
        saved_logs(ctx, col, i, &dir).await;
    }
}

/// The rank logs saved on node `i` (gzipped there), unpacked.
async fn saved_logs(ctx: &Context, col: &mut Collector, i: usize, dir: &str) {
    let c = ctx.config().config();
    let Ok(exec) = ctx.exec(i).await else { return };
    let log_dir = NodeLayout::of(ctx.config(), &c.nodes[i]).log_dir;
    let name = format!("{dir}/saved-logs/");
    let listing = match bounded(exec.run(&Cmd::new("ls").arg("-1").arg(&log_dir))).await {
        Ok(o) => String::from_utf8_lossy(&o.stdout).into_owned(),
        Err(e) => {
            col.absent(name, format!("{log_dir}: {e}"));
            return;
        }
    };
    let prefix = format!("{}-rank", c.deployment.name);
    let files: Vec<&str> = listing
        .lines()
        .filter(|f| f.ends_with(".log.gz") && f.contains(&prefix))
        .collect();
    if files.is_empty() {
        col.absent(name, format!("no saved log in {log_dir}"));
        return;
    }
    for f in files {
        let path = PathBuf::from(format!("{}/{f}", log_dir.trim_end_matches('/')));
        let member = format!("{dir}/saved-logs/{}", f.trim_end_matches(".gz"));
        match bounded(exec.read_file(&path)).await {
            Ok(gz) => {
                let mut text = Vec::new();
                match flate2::read::MultiGzDecoder::new(&gz[..]).read_to_end(&mut text) {
                    Ok(_) => col.add(member, &text),
                    Err(e) => col.absent(member, format!("{}: not gzip: {e}", path.display())),
                }
            }
            Err(e) => col.absent(member, e),
        }
    }
}

/// Each rank's current log through its node's Docker port.
async fn rank_logs(ctx: &Context, col: &mut Collector) {
    let c = ctx.config().config();
    for (rank, node) in c.nodes.iter().enumerate() {
        let member = format!("ranks/rank{rank}.log");
        let container = rank_container_name(&c.deployment.name, rank);
        let docker = match bounded(ctx.docker(rank)).await {
            Ok(d) => d,
            Err(e) => {
                col.absent(
                    member,
                    format!("Docker on {} is unreachable: {e}", node.name),
                );
                continue;
            }
        };
        match bounded(docker.inspect_container(&container)).await {
            Ok(Some(_)) => {}
            Ok(None) => {
                col.absent(member, format!("no container {container} on {}", node.name));
                continue;
            }
            Err(e) => {
                col.absent(member, e);
                continue;
            }
        }
        match bounded(docker.logs(&container, true, Some(LOG_TAIL))).await {
            Ok(b) => col.add(member, &b),
            Err(e) => col.absent(member, e),
        }
    }
}

/// Keeps the preflight report of the run `ctx` carried (if its Preflight ran) with the facts
/// known after the run as `<state_dir>/preflight.json`, for the next bundle. Callers that run
/// plans call it after the run (the command line, Python); a dry run does not.
///
/// # Errors
///
/// [`run_log::RunLogError`] when the state directory is not writable.
pub fn keep_preflight(ctx: &Context) -> Result<(), run_log::RunLogError> {
    let Some(report) = ctx.preflight_report() else {
        return Ok(());
    };
    let doc = serde_json::json!({
        "at_unix": SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        "verdict": report.verdict(),
        "report": report,
        "facts": ctx.facts(),
    });
    let state_dir = Path::new(&ctx.config().config().deployment.state_dir);
    run_log::write_json(state_dir, run_log::PREFLIGHT_FILE, &doc)
}

/// Writes the support bundle of the deployment to `out` (default: [`default_path`]).
///
/// # Errors
///
/// [`BundleError::Io`] when the archive cannot be written; nothing stays under `out` then.
pub async fn write(ctx: &Context, out: Option<&Path>) -> Result<BundleReport, BundleError> {
    let now = SystemTime::now();
    let c = ctx.config().config();
    let state_dir = PathBuf::from(&c.deployment.state_dir);
    let path = out.map_or_else(
        || default_path(&state_dir, &c.deployment.name, now),
        Path::to_path_buf,
    );
    let top = format!(
        "spark-deploy-bundle-{}-{}",
        c.deployment.name,
        crate::lifecycle::logs::stamp(now)
    );
    let mut col = Collector {
        secrets: secrets(ctx),
        members: Vec::new(),
        absent: Vec::new(),
    };

    match toml::to_string_pretty(c) {
        Ok(t) => col.add("config.toml", t.as_bytes()),
        Err(e) => col.absent("config.toml", e.to_string()),
    }
    let plan = Plan::standard(ctx.config()).describe();
    col.add("plan.json", plan.to_json().as_bytes());
    col.add(
        "plan.txt",
        crate::describe::render::render_text(&plan).as_bytes(),
    );
    let status = crate::lifecycle::status::status(ctx).await;
    col.add(
        "status.json",
        serde_json::to_string_pretty(&status)
            .unwrap_or_default()
            .as_bytes(),
    );
    for file in [
        launch_record::FILE,
        run_log::PREFLIGHT_FILE,
        startup::FILE,
        run_log::EVENTS_FILE,
    ] {
        col.file(&format!("state/{file}"), &state_dir.join(file));
    }
    let watch = state_dir.join(crate::service::WATCH_DIR);
    if col.tree("watch", &watch) == 0 {
        col.absent(
            "watch/",
            format!(
                "{} holds nothing: the supervisor (`spark-deploy watch`) has not run",
                watch.display()
            ),
        );
    }
    rank_logs(ctx, &mut col).await;
    let record = launch_record::read(&state_dir).ok().flatten();
    let netdevs: Vec<Option<String>> = (0..c.nodes.len())
        .map(|i| {
            record
                .as_ref()
                .and_then(|r| r.nodes.get(i))
                .and_then(|n| n.netdev.known().cloned())
                .filter(|d| !d.is_empty())
        })
        .collect();
    nodes(ctx, &mut col, &netdevs).await;

    let mut members: Vec<Member> = col
        .members
        .iter()
        .map(|(name, b)| Member {
            name: name.clone(),
            bytes: b.len() as u64,
        })
        .collect();
    let index = serde_json::json!({
        "schema": INDEX_SCHEMA,
        "deployment": c.deployment.name,
        "created_unix": now.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        "spark_deploy": env!("CARGO_PKG_VERSION"),
        "members": members,
        "absent": col.absent,
        "redacted": "the HF token and the API key are replaced by *** in every member",
    });
    let index = serde_json::to_vec_pretty(&index).unwrap_or_default();
    col.add("index.json", &index);
    members.push(Member {
        name: "index.json".into(),
        bytes: index.len() as u64,
    });
    write_archive(&path, &top, &col.members, now)?;
    Ok(BundleReport {
        path,
        top,
        members,
        absent: col.absent,
    })
}

/// Writes the members as `<path>.partial`, then renames it to `path`.
fn write_archive(
    path: &Path,
    top: &str,
    members: &[(String, Vec<u8>)],
    now: SystemTime,
) -> Result<(), BundleError> {
    let partial = PathBuf::from(format!("{}.partial", path.display()));
    let io = |p: &Path| {
        let p = p.to_owned();
        move |source| BundleError::Io { path: p, source }
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
    }
    let mtime = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let result = (|| {
        let file = crate::safe_fs::create_exclusive(&partial, 0o644)?;
        let gz = flate2::write::GzEncoder::new(file, flate2::Compression::default());
        let mut tar = tar::Builder::new(gz);
        for (name, bytes) in members {
            let mut h = tar::Header::new_gnu();
            h.set_size(bytes.len() as u64);
            h.set_mode(0o644);
            h.set_mtime(mtime);
            h.set_entry_type(tar::EntryType::Regular);
            tar.append_data(&mut h, format!("{top}/{name}"), &bytes[..])?;
        }
        let gz = tar.into_inner()?;
        let file = gz.finish()?;
        file.sync_all()
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&partial);
        return Err(io(&partial)(e));
    }
    std::fs::rename(&partial, path).map_err(io(path))
}

#[cfg(test)]
mod tests;
