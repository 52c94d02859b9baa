//! Reboot persistence: the systemd units `spark-deploy service install` writes on the head, and
//! the wait for the pair that the units run after boot.
//!
//! Two units per deployment (`<prefix>` is `spark-deploy-<deployment.name>`):
//!
//! - `<prefix>-link.service` (oneshot): waits until the head's fabric netdev is up, every
//!   worker's fabric address answers on its SSH port and every worker's SSH runs a command
//!   (`spark-deploy service wait`).
//! - `<prefix>.service`: after the link unit, `spark-deploy service boot`: the same wait (cheap
//!   once the link is up), then — unless the supervisor's stop marker says to stay down — when
//!   the pair does not really serve ([`serving`]), `restart` (what survived is stopped, then rank
//!   1 starts before rank 0, both or neither), then `watch` in the foreground. Restarted on
//!   failure; enabled for `multi-user.target`.
//!
//! The ranks themselves carry no Docker restart policy (`restart = "no"`): after a reboot only
//! these units bring them back, as a pair.
//!
//! [`units`] is a pure function of the config and the install paths; [`wait_for_pair`] probes
//! through the Exec port and plain TCP, and reports through the context's events.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::config::ValidatedConfig;
use crate::context::{Context, node_target};
use crate::event::{Level, Source};
use crate::lifecycle::launch_record;
use crate::ports::exec::{Cmd, Exec};

/// The default unit directory.
pub const SYSTEM_UNIT_DIR: &str = "/etc/systemd/system";
/// The supervisor's directory under the state directory.
pub const WATCH_DIR: &str = "watch";
/// The stop marker under [`WATCH_DIR`]: while it exists, nothing brings the pair back.
pub const STOP_MARKER: &str = "stop";

/// Errors of the service verbs.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// A unit file could not be written, read or removed.
    #[error(
        "unit file {path}: {source}; remedy: run as root for {SYSTEM_UNIT_DIR}, or pass --unit-dir"
    )]
    Io {
        /// The file.
        path: PathBuf,
        /// Underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The pair did not become reachable in time.
    #[error(
        "after {waited_s} s the pair is not reachable: {pending}; remedy: check the fabric cable \
         and the worker (is it booted, does `ssh` to it work?); the unit retries"
    )]
    NotReachable {
        /// Seconds waited.
        waited_s: u64,
        /// What is still missing, one clause per probe.
        pending: String,
    },
}

/// Where the units point: the binary, the config, who runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitInputs {
    /// The `spark-deploy` executable (absolute).
    pub binary: PathBuf,
    /// The config file (absolute), or `None` for the built-in defaults.
    pub config: Option<PathBuf>,
    /// The user the units run as (the one whose SSH keys and state directory the deployment uses).
    pub user: String,
    /// That user's home (`HOME` for ssh and `~` in the config).
    pub home: PathBuf,
    /// How long `service wait` waits for the pair, seconds.
    pub wait_timeout_s: u64,
}

/// One unit file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unit {
    /// File name (`….service`).
    pub name: String,
    /// The whole file.
    pub text: String,
}

/// `spark-deploy-<deployment.name>`.
#[must_use]
pub fn unit_prefix(config: &ValidatedConfig) -> String {
    format!("spark-deploy-{}", config.config().deployment.name)
}

/// The main unit's name (the one to enable and to ask about).
#[must_use]
pub fn main_unit(config: &ValidatedConfig) -> String {
    format!("{}.service", unit_prefix(config))
}

/// The link unit's name.
#[must_use]
pub fn link_unit(config: &ValidatedConfig) -> String {
    format!("{}-link.service", unit_prefix(config))
}

/// One word of a systemd command line or assignment: `%` doubled, and quoted (with `\` and `"`
/// escaped) when it holds whitespace or quotes.
fn word(s: &str) -> String {
    let s = s.replace('%', "%%");
    if s.is_empty()
        || s.contains(|c: char| c.is_whitespace() || c == '"' || c == '\'' || c == '\\' || c == ';')
    {
        format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
    } else {
        s
    }
}

fn command(inputs: &UnitInputs, verb: &[&str]) -> String {
    let mut words = vec![word(&inputs.binary.display().to_string())];
    if let Some(c) = &inputs.config {
        words.push("--config".into());
        words.push(word(&c.display().to_string()));
    }
    words.extend(verb.iter().map(|v| word(v)));
    words.join(" ")
}

/// The units `service install` writes, link unit first: a pure function of the config and
/// `inputs`.
#[must_use]
pub fn units(config: &ValidatedConfig, inputs: &UnitInputs) -> Vec<Unit> {
    let c = config.config();
    let name = &c.deployment.name;
    let workers: Vec<&str> = c.nodes.iter().skip(1).map(|n| n.name.as_str()).collect();
    let workers = workers.join(", ");
    let head = c.nodes.first().map_or("head", |n| n.name.as_str());
    let header = format!(
        "# Written by `spark-deploy service install` for the deployment {name}; \
         `spark-deploy service uninstall` removes it.\n"
    );
    let run_as = format!(
        "User={}\nEnvironment={}\n",
        word(&inputs.user),
        word(&format!("HOME={}", inputs.home.display()))
    );
    let link = format!(
        "{header}[Unit]\n\
         Description=spark-deploy {name}: wait for the fabric link from {head} to {workers} and their SSH\n\
         Wants=network-online.target\n\
         After=network-online.target\n\
         \n\
         [Service]\n\
         Type=oneshot\n\
         RemainAfterExit=yes\n\
         {run_as}\
         ExecStart={}\n\
         TimeoutStartSec={}\n",
        command(
            inputs,
            &[
                "service",
                "wait",
                "--timeout",
                &inputs.wait_timeout_s.to_string()
            ]
        ),
        inputs.wait_timeout_s + 60,
    );
    let main = format!(
        "{header}[Unit]\n\
         Description=spark-deploy {name}: bring the pair back after boot (rank 1 on {workers}, then rank 0 on {head}) and watch it\n\
         Wants=network-online.target docker.service {link_unit}\n\
         After=network-online.target docker.service {link_unit}\n\
         StartLimitIntervalSec=1h\n\
         StartLimitBurst=5\n\
         \n\
         [Service]\n\
         Type=exec\n\
         {run_as}\
         ExecStart={}\n\
         Restart=on-failure\n\
         RestartSec=30s\n\
         # 3: the configuration is invalid; retrying cannot change that.\n\
         RestartPreventExitStatus=3\n\
         TimeoutStopSec={}\n\
         KillMode=mixed\n\
         KillSignal=SIGINT\n\
         \n\
         [Install]\n\
         WantedBy=multi-user.target\n",
        command(inputs, &["service", "boot"]),
        c.lifecycle.stop_timeout_s.saturating_mul(2) + 30,
        link_unit = link_unit(config),
    );
    vec![
        Unit {
            name: link_unit(config),
            text: link,
        },
        Unit {
            name: main_unit(config),
            text: main,
        },
    ]
}

/// One unit as found in a unit directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InstalledUnit {
    /// File name.
    pub name: String,
    /// Its path.
    pub path: PathBuf,
    /// The file exists.
    pub present: bool,
    /// It holds exactly what `install` would write now (false when absent or stale).
    pub current: bool,
}

/// Writes `units` into `dir` (each atomically: a `.partial` file, then rename).
///
/// # Errors
///
/// [`ServiceError::Io`] when the directory is not writable.
pub fn write_units(dir: &Path, units: &[Unit]) -> Result<Vec<PathBuf>, ServiceError> {
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| ServiceError::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let mut out = Vec::new();
    for u in units {
        let path = dir.join(&u.name);
        let tmp = dir.join(format!(".{}.partial", u.name));
        crate::safe_fs::write_exclusive(&tmp, &u.text).map_err(io(&tmp))?;
        std::fs::rename(&tmp, &path).map_err(io(&path))?;
        out.push(path);
    }
    Ok(out)
}

/// Removes the units named in `units` from `dir`; returns the paths removed (absent ones are
/// not an error).
///
/// # Errors
///
/// [`ServiceError::Io`] when a file exists and cannot be removed.
pub fn remove_units(dir: &Path, units: &[Unit]) -> Result<Vec<PathBuf>, ServiceError> {
    let mut out = Vec::new();
    for u in units {
        let path = dir.join(&u.name);
        match std::fs::remove_file(&path) {
            Ok(()) => out.push(path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(ServiceError::Io { path, source }),
        }
    }
    Ok(out)
}

/// What `dir` holds of `units`.
#[must_use]
pub fn installed(dir: &Path, units: &[Unit]) -> Vec<InstalledUnit> {
    units
        .iter()
        .map(|u| {
            let path = dir.join(&u.name);
            let text = std::fs::read_to_string(&path).ok();
            InstalledUnit {
                name: u.name.clone(),
                present: text.is_some(),
                current: text.as_deref() == Some(u.text.as_str()),
                path,
            }
        })
        .collect()
}

/// The supervisor's stop marker: `Some(reason)` while it exists (the marker's text, or its JSON
/// `reason`; a generic reason for an empty file).
#[must_use]
pub fn stop_marker(state_dir: &Path) -> Option<String> {
    let path = state_dir.join(WATCH_DIR).join(STOP_MARKER);
    let text = std::fs::read_to_string(&path).ok()?;
    let reason = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| v.get("reason").and_then(|r| r.as_str()).map(str::to_owned))
        .unwrap_or_else(|| text.trim().to_owned());
    Some(if reason.is_empty() {
        format!("the stop marker {} is set", path.display())
    } else {
        reason
    })
}

/// One probe of [`wait_for_pair`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Probe {
    /// What was probed (`head fabric netdev enp1s0f0np0`, `worker-1 fabric 10.0.0.2:22`, …).
    pub what: String,
    /// It answered as needed.
    pub ok: bool,
    /// What was seen.
    pub observed: String,
}

/// What [`wait_for_pair`] found when the pair became reachable.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PairReady {
    /// Seconds waited.
    pub waited_s: f64,
    /// The last round of probes (all ok).
    pub probes: Vec<Probe>,
}

/// The source of the events the service verbs emit.
#[must_use]
pub fn source() -> Source {
    Source::Command("service".into())
}

/// Whether the fabric netdev's `operstate` counts as up (`unknown` is what many virtual and
/// some physical drivers report while passing traffic).
#[must_use]
pub fn link_up(operstate: &str) -> bool {
    matches!(operstate.trim(), "up" | "unknown")
}

/// Whether a TCP connect result means the address answers: a connection, or a refusal (the
/// host's stack answered), but not a timeout or an unreachable network.
#[must_use]
pub fn answers(result: &std::io::Result<()>) -> bool {
    match result {
        Ok(()) => true,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionRefused,
    }
}

/// The fabric facts the probes need: the head's netdev and each worker's fabric address, from
/// the config or else the last launch's record.
fn fabric(config: &ValidatedConfig) -> (Option<String>, Vec<Option<Ipv4Addr>>) {
    let c = config.config();
    let record = launch_record::read(Path::new(&c.deployment.state_dir))
        .ok()
        .flatten();
    let recorded = |i: usize| record.as_ref().and_then(|r| r.nodes.get(i));
    let netdev = recorded(0)
        .and_then(|n| n.netdev.known().cloned())
        .filter(|d| !d.is_empty());
    let workers = (1..c.nodes.len())
        .map(|i| {
            c.nodes[i]
                .fabric_addr
                .or_else(|| recorded(i).and_then(|n| n.fabric_addr.known().copied()))
        })
        .collect();
    (netdev, workers)
}

async fn probe_round(ctx: &Context, home: &Path) -> Vec<Probe> {
    let c = ctx.config().config();
    let (netdev, workers) = fabric(ctx.config());
    let mut probes = Vec::new();
    if let Some(dev) = netdev {
        let path = PathBuf::from(format!("/sys/class/net/{dev}/operstate"));
        let (ok, observed) = match Exec::local(&c.nodes[0].name).read_file(&path).await {
            Ok(b) => {
                let s = String::from_utf8_lossy(&b).trim().to_owned();
                (link_up(&s), format!("operstate {s}"))
            }
            Err(e) => (false, e.to_string()),
        };
        probes.push(Probe {
            what: format!("{} fabric netdev {dev}", c.nodes[0].name),
            ok,
            observed,
        });
    }
    for (i, addr) in workers.into_iter().enumerate() {
        let node = &c.nodes[i + 1];
        if let Some(a) = addr {
            let port = node.ssh_port.unwrap_or(22);
            let sa = SocketAddr::from((a, port));
            let r = match tokio::time::timeout(
                Duration::from_secs(2),
                tokio::net::TcpStream::connect(sa),
            )
            .await
            {
                Ok(r) => r.map(drop),
                Err(_) => Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "no answer in 2 s",
                )),
            };
            probes.push(Probe {
                what: format!("{} fabric address {sa}", node.name),
                ok: answers(&r),
                observed: match &r {
                    Ok(()) => "connected".into(),
                    Err(e) => e.to_string(),
                },
            });
        }
        let target = node_target(node, home);
        let (ok, observed) = match tokio::time::timeout(Duration::from_secs(20), async {
            let exec = Exec::connect(node.name.clone(), &target).await?;
            let r = exec.run(&Cmd::new("true")).await.map(drop);
            let _ = exec.close().await;
            r
        })
        .await
        {
            Ok(Ok(())) => (true, "runs commands".to_owned()),
            Ok(Err(e)) => (false, e.to_string()),
            Err(_) => (false, "no answer in 20 s".to_owned()),
        };
        probes.push(Probe {
            what: format!("{} SSH ({})", node.name, node.ssh),
            ok,
            observed,
        });
    }
    probes
}

/// Waits until the head's fabric netdev is up (when known from the last launch), every worker's
/// fabric address answers on its SSH port (when known) and every worker's SSH runs a command;
/// probes every 2 s and reports each change as a `log` event of the `service` command.
///
/// # Errors
///
/// [`ServiceError::NotReachable`] after `timeout`, naming what is still missing.
pub async fn wait_for_pair(ctx: &Context, timeout: Duration) -> Result<PairReady, ServiceError> {
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/"), PathBuf::from);
    let t = Instant::now();
    let mut last: Vec<Probe> = Vec::new();
    loop {
        let probes = probe_round(ctx, &home).await;
        for p in &probes {
            if !last.iter().any(|l| l == p) {
                ctx.log(
                    source(),
                    None,
                    if p.ok { Level::Info } else { Level::Warn },
                    format!(
                        "{}: {}{}",
                        p.what,
                        p.observed,
                        if p.ok { "" } else { " (waiting)" }
                    ),
                );
            }
        }
        if probes.iter().all(|p| p.ok) {
            return Ok(PairReady {
                waited_s: t.elapsed().as_secs_f64(),
                probes,
            });
        }
        if t.elapsed() >= timeout {
            let pending = probes
                .iter()
                .filter(|p| !p.ok)
                .map(|p| format!("{}: {}", p.what, p.observed))
                .collect::<Vec<_>>()
                .join("; ");
            return Err(ServiceError::NotReachable {
                waited_s: t.elapsed().as_secs(),
                pending,
            });
        }
        last = probes;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// Whether the pair really serves: every rank's container runs, the API lists the model, and a
/// real generation through the engine's probe comes back right within `timeout`. Containers
/// that survived a node's restart can look running while their link is gone; only the
/// generation tells.
///
/// # Errors
///
/// Why the pair does not serve (for the log: not an error of the caller).
pub async fn serving(ctx: &Context, timeout: Duration) -> Result<(), String> {
    let s = crate::lifecycle::status::status(ctx).await;
    if s.overall != "running" {
        let ranks = s
            .ranks
            .iter()
            .map(|r| format!("rank {} {}", r.rank, r.state))
            .collect::<Vec<_>>()
            .join(", ");
        return Err(format!("{} ({ranks})", s.overall));
    }
    let c = ctx.config().config();
    let key = crate::lifecycle::api_key::client_key(&c.serving).map_err(|e| e.to_string())?;
    let host = if c.serving.host == "0.0.0.0" {
        "127.0.0.1"
    } else {
        c.serving.host.as_str()
    };
    let api = crate::engine::ApiEndpoint {
        base_url: format!("http://{host}:{}", c.serving.port),
        served_name: c.model.served_name.clone(),
        key,
    };
    let engine = crate::engine::registry::for_config(ctx.config());
    match tokio::time::timeout(timeout, engine.probe_generation(ctx, &api)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(format!("both ranks run but a generation fails: {e}")),
        Err(_) => Err(format!(
            "both ranks run but a generation did not answer in {} s",
            timeout.as_secs()
        )),
    }
}

#[cfg(test)]
mod tests;
