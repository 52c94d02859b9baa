//! `spark-deploy watch`: the supervisor that keeps a running pair serving.
//!
//! Every `watch.interval_s` it takes a [`sample`] of every node and of rank 0's counters,
//! [`decide`]s on the window of samples (a pure function), and [`act`]s on all ranks or none:
//! logs saved first, rank 0 stopped before rank 1, rank 1 started before rank 0, then Smoke — the
//! `down` and `up` plans do the work. At most `watch.max_heals_per_hour` heals, then it stops the
//! pair, writes the stop marker and stays down. A pair stopped by `down` (the stop marker) is never
//! healed; a pause lease holds every action. The files it keeps are in
//! [`crate::lifecycle::watch_state`]. Every sample summary, decision and action is an
//! [`Event`] with [`Source::Supervisor`]; nothing is printed.

pub mod act;
pub mod decide;
pub mod sample;

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::api::Api;
use crate::context::Context;
use crate::event::{Event, Level, Source};
use crate::lifecycle::lock::{DeploymentLock, LockError};
use crate::lifecycle::log_time::parse_rfc3339;
use crate::lifecycle::watch_state::{
    STATE_SCHEMA, WatchFileError, WatchFiles, WatchMode, WatchState, dir_stamp, rfc3339, unix_ms,
};
use decide::{Action, Circumstances, Finding, Thresholds, choose, decide};
use sample::{ProbeObs, Sample};

/// The supervisor's name in events (`{"supervisor": "watch"}`).
pub const NAME: &str = "watch";

/// Errors of the supervisor.
#[derive(Debug, thiserror::Error)]
pub enum SuperviseError {
    /// A watch file could not be written.
    #[error(transparent)]
    Files(#[from] WatchFileError),
    /// A saved log could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A pause duration that is no duration.
    #[error("{value:?} is no duration; remedy: give one like `30m`, `2h`, `90s` or `1d`")]
    Duration {
        /// What was given.
        value: String,
    },
}

fn source() -> Source {
    Source::Supervisor(NAME.to_owned())
}

fn log(ctx: &Context, level: Level, line: String) {
    ctx.emit(Event::Log {
        source: source(),
        node: None,
        level,
        line,
    });
}

/// Parses `30s`, `30m`, `2h`, `1d`.
///
/// # Errors
///
/// [`SuperviseError::Duration`].
pub fn parse_duration(value: &str) -> Result<Duration, SuperviseError> {
    let err = || SuperviseError::Duration {
        value: value.to_owned(),
    };
    let v = value.trim();
    let (num, unit) = v.split_at(v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len()));
    let n: u64 = num.parse().map_err(|_| err())?;
    let secs = match unit {
        "s" | "" => n,
        "m" => n * 60,
        "h" => n * 3600,
        "d" => n * 86_400,
        _ => return Err(err()),
    };
    if secs == 0 {
        return Err(err());
    }
    Ok(Duration::from_secs(secs))
}

/// Writes a pause lease of `length` from now; returns its expiry (RFC 3339).
///
/// # Errors
///
/// [`SuperviseError::Files`].
pub fn pause(state_dir: &Path, length: Duration) -> Result<String, SuperviseError> {
    let until = SystemTime::now() + length;
    WatchFiles::of(state_dir).write_pause(until)?;
    Ok(rfc3339(until))
}

/// Ends the pause lease.
///
/// # Errors
///
/// [`SuperviseError::Files`].
pub fn resume(state_dir: &Path) -> Result<(), SuperviseError> {
    Ok(WatchFiles::of(state_dir).clear_pause()?)
}

/// What `status` shows of the watch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WatchStatus {
    /// `running`, `paused`, `stopped`, `exited`, or `not running` (no live supervisor).
    pub state: String,
    /// Why.
    pub reason: String,
    /// The pause lease's expiry, when in force.
    pub paused_until: Option<String>,
    /// The stop marker's text, when present.
    pub stop_marker: Option<String>,
    /// Heals in the last hour.
    pub heals_last_hour: usize,
    /// The supervisor's pid, when it is alive.
    pub pid: Option<u32>,
}

/// The watch state of the deployment whose state directory is `state_dir`.
#[must_use]
pub fn status(state_dir: &Path) -> WatchStatus {
    let files = WatchFiles::of(state_dir);
    let now = SystemTime::now();
    let st = files.read_state();
    let alive = st
        .as_ref()
        .filter(|s| s.state != WatchMode::Exited)
        .map(|s| s.pid)
        .filter(|pid| Path::new(&format!("/proc/{pid}")).exists());
    let (state, reason) = match (&st, alive) {
        (Some(s), Some(_)) => (
            serde_json::to_value(s.state)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
            s.reason.clone(),
        ),
        (Some(s), None) => ("not running".to_owned(), s.reason.clone()),
        (None, _) => ("not running".to_owned(), "never started".to_owned()),
    };
    WatchStatus {
        state,
        reason,
        paused_until: files.read_pause(now).map(rfc3339),
        stop_marker: files.read_stop(),
        heals_last_hour: st.map_or(0, |s| heals_since(&s.heals, now).len()),
        pid: alive,
    }
}

fn heals_since(heals: &[String], now: SystemTime) -> Vec<SystemTime> {
    heals
        .iter()
        .filter_map(|h| parse_rfc3339(h))
        .filter_map(|(s, _)| u64::try_from(s).ok())
        .map(|s| UNIX_EPOCH + Duration::from_secs(s))
        .filter(|t| {
            now.duration_since(*t)
                .is_ok_and(|d| d < Duration::from_secs(3600))
        })
        .collect()
}

struct Probe {
    task: tokio::task::JoinHandle<Result<u64, String>>,
    since_ms: u64,
}

/// The supervisor's state between samples.
struct Watcher {
    files: WatchFiles,
    thresholds: Thresholds,
    interval: Duration,
    window: VecDeque<Sample>,
    keep_ms: u64,
    heals: Vec<SystemTime>,
    probe: Option<Probe>,
    mode: WatchMode,
    reason: String,
    last_finding: Option<Finding>,
}

impl Watcher {
    fn write_state(&self, paused_until: Option<SystemTime>) -> Result<(), WatchFileError> {
        self.files.write_state(&WatchState {
            schema: STATE_SCHEMA.to_owned(),
            state: self.mode,
            reason: self.reason.clone(),
            paused_until: paused_until.map(rfc3339),
            heals: self.heals.iter().map(|t| rfc3339(*t)).collect(),
            pid: std::process::id(),
            updated: rfc3339(SystemTime::now()),
        })
    }

    fn push(&mut self, s: Sample) {
        let newest = s.ts_ms;
        self.window.push_back(s);
        while self
            .window
            .front()
            .is_some_and(|f| newest.saturating_sub(f.ts_ms) > self.keep_ms)
        {
            self.window.pop_front();
        }
    }

    /// The probe's observation for this sample; a finished probe is reported once.
    async fn probe_obs(&mut self) -> Option<ProbeObs> {
        let p = self.probe.as_ref()?;
        if !p.task.is_finished() {
            return Some(ProbeObs::InFlight {
                since_ms: p.since_ms,
            });
        }
        let p = self.probe.take()?;
        let ms = unix_ms(SystemTime::now()).saturating_sub(p.since_ms);
        Some(match p.task.await {
            Ok(Ok(ms)) => ProbeObs::Ok { ms },
            Ok(Err(detail)) => ProbeObs::Failed { ms, detail },
            Err(e) => ProbeObs::Failed {
                ms,
                detail: e.to_string(),
            },
        })
    }
}

/// Supervises the deployment of `ctx` until `ctx` is cancelled (Ctrl-C, Python `cancel`).
///
/// # Errors
///
/// [`SuperviseError::Files`] when the watch directory cannot be written.
pub async fn watch(ctx: &Context) -> Result<(), SuperviseError> {
    let config = ctx.config().clone();
    let c = config.config();
    let state_dir = PathBuf::from(&c.deployment.state_dir);
    let w = &c.watch;
    let thresholds = Thresholds::from(w);
    let interval = Duration::from_secs_f64(w.interval_s);
    let keep_ms = thresholds.wedge_ms.max(thresholds.probe_idle_ms)
        + 4 * u64::try_from(interval.as_millis()).unwrap_or(u64::MAX);
    let files = WatchFiles::of(&state_dir);
    let heals = files
        .read_state()
        .map(|s| heals_since(&s.heals, SystemTime::now()))
        .unwrap_or_default();
    let mut me = Watcher {
        files,
        thresholds,
        interval,
        window: VecDeque::new(),
        keep_ms,
        heals,
        probe: None,
        mode: WatchMode::Running,
        reason: "started".to_owned(),
        last_finding: None,
    };
    me.write_state(None)?;
    let signals = crate::engine::for_config(&config).serving_signals();
    ctx.emit(Event::Started {
        source: source(),
        message: format!(
            "watching {} every {:.1} s (wedge after {:.0} s, memory floor {:.1} GiB, heal = {:?}, at most {} heals per hour)",
            c.deployment.name,
            w.interval_s,
            w.wedge_s,
            w.memory_floor_gib,
            w.heal,
            w.max_heals_per_hour
        ),
    });
    let started = Instant::now();
    // The ports of one sampling context; replaced after a node did not answer, so a worker that
    // came back (a reboot, sshd restarted) is reached over a new SSH session.
    let mut work = Arc::new(Context::new(config.clone(), ctx.sink()));
    let mut last_stop: Option<String> = None;
    while !ctx.is_cancelled() {
        let tick = Instant::now();
        let now = SystemTime::now();
        let paused_until = me.files.read_pause(now);
        if let Some(reason) = me.files.read_stop() {
            if last_stop.as_deref() != Some(reason.as_str()) {
                log(
                    ctx,
                    Level::Info,
                    format!("the pair is down by its stop marker, not healing: {reason}"),
                );
                last_stop = Some(reason.clone());
            }
            me.mode = WatchMode::Stopped;
            me.reason = reason;
            me.window.clear();
            me.probe = None;
            me.write_state(paused_until)?;
            sleep_or_cancel(ctx, me.interval).await;
            continue;
        }
        if last_stop.take().is_some() {
            log(
                ctx,
                Level::Info,
                "the stop marker is gone: watching again".into(),
            );
        }
        me.mode = if paused_until.is_some() {
            WatchMode::Paused
        } else {
            WatchMode::Running
        };
        let api = Api::from_config(&config).ok();
        let mut s = sample::collect(
            &work,
            api.as_ref(),
            &signals,
            me.thresholds.memory_floor_gib,
            unix_ms(now),
        )
        .await;
        s.probe = me.probe_obs().await;
        if s.ranks
            .iter()
            .any(|r| r.docker_error.is_some() || r.exec_error.is_some())
        {
            work = Arc::new(Context::new(config.clone(), ctx.sink()));
        }
        if let Ok(line) = serde_json::to_string(&s)
            && let Err(e) = me.files.append_sample(&line, now)
        {
            log(ctx, Level::Warn, format!("sample not recorded: {e}"));
        }
        log(ctx, Level::Debug, format!("sample: {}", s.summary()));
        me.push(s);
        let window: Vec<Sample> = me.window.iter().cloned().collect();
        let finding = decide(&window, &me.thresholds);
        me.heals.retain(|t| {
            now.duration_since(*t)
                .is_ok_and(|d| d < Duration::from_secs(3600))
        });
        let action = choose(
            &finding,
            &Circumstances {
                heals_last_hour: u32::try_from(me.heals.len()).unwrap_or(u32::MAX),
                max_heals_per_hour: w.max_heals_per_hour,
                heal: w.heal,
                paused_until: paused_until.map(rfc3339),
            },
        );
        let level = match (&finding, &action) {
            (_, Action::Heal | Action::StopForGood { .. }) => Level::Error,
            (Finding::Blip { .. } | Finding::WedgeUnconfirmed { .. }, _)
            | (_, Action::Hold { .. }) => Level::Warn,
            (Finding::ProbeDue { .. }, _) => Level::Info,
            _ => Level::Debug,
        };
        me.reason = match &action {
            Action::Hold { why } => format!("{} — not acting: {why}", finding.describe()),
            _ => finding.describe(),
        };
        let changed = me.last_finding.as_ref() != Some(&finding);
        log(
            ctx,
            if changed { level } else { level.min_debug() },
            format!("decision: {}", me.reason),
        );
        me.last_finding = Some(finding.clone());
        match action {
            Action::Nothing | Action::Hold { .. } => {}
            Action::Probe => {
                if me.probe.is_none()
                    && let Some(api) = api
                {
                    let timeout = Duration::from_secs_f64(w.probe_timeout_s);
                    me.probe = Some(Probe {
                        task: tokio::spawn(async move { sample::probe(&api, timeout).await }),
                        since_ms: unix_ms(SystemTime::now()),
                    });
                }
            }
            Action::Heal | Action::StopForGood { .. } => {
                Box::pin(heal(ctx, &work, &mut me, &finding, &action)).await?;
                work = Arc::new(Context::new(config.clone(), ctx.sink()));
            }
        }
        me.write_state(paused_until)?;
        sleep_or_cancel(ctx, me.interval.saturating_sub(tick.elapsed())).await;
    }
    if let Some(p) = me.probe.take() {
        p.task.abort();
    }
    me.mode = WatchMode::Exited;
    me.reason = "ended (cancelled)".to_owned();
    me.write_state(None)?;
    ctx.emit(Event::Finished {
        source: source(),
        duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        bytes: None,
    });
    Ok(())
}

trait MinDebug {
    fn min_debug(self) -> Self;
}

impl MinDebug for Level {
    /// An unchanged decision is repeated at debug level unless it calls for action.
    fn min_debug(self) -> Self {
        match self {
            Self::Error => Self::Error,
            Self::Debug | Self::Info | Self::Warn => Self::Debug,
        }
    }
}

async fn sleep_or_cancel(ctx: &Context, d: Duration) {
    tokio::select! {
        () = tokio::time::sleep(d) => {}
        () = ctx.cancelled() => {}
    }
}

/// Saves both logs, stops both ranks, and starts them again or writes the stop marker.
async fn heal(
    ctx: &Context,
    work: &Context,
    me: &mut Watcher,
    finding: &Finding,
    action: &Action,
) -> Result<(), SuperviseError> {
    let state_dir = PathBuf::from(&ctx.config().config().deployment.state_dir);
    // A user's up/down/restart in progress: not ours to act on.
    match DeploymentLock::acquire(&state_dir) {
        Err(LockError::Held { .. }) => {
            log(
                ctx,
                Level::Warn,
                format!(
                    "{}: an up/down/restart holds the deployment; not acting",
                    finding.describe()
                ),
            );
            me.window.clear();
            return Ok(());
        }
        Err(LockError::Io { .. }) | Ok(_) => {}
    }
    // A `down` that ended between the sample and now wrote its stop marker under the lock: the
    // marker read before the sample is stale, read it again.
    if me.files.read_stop().is_some() {
        log(
            ctx,
            Level::Info,
            format!(
                "{}: the pair was stopped meanwhile (stop marker); not acting",
                finding.describe()
            ),
        );
        me.window.clear();
        return Ok(());
    }
    let t = Instant::now();
    let what = match action {
        Action::StopForGood { .. } => "stopping the pair for good",
        _ => "healing the pair",
    };
    ctx.emit(Event::Started {
        source: source(),
        message: format!("{what}: {}", finding.describe()),
    });
    let now = SystemTime::now();
    let dir = me.files.heals().join(dir_stamp(now));
    let window: Vec<Sample> = me.window.iter().cloned().collect();
    match act::save_logs(work, &dir, finding, &window).await {
        Ok(saved) => log(
            ctx,
            Level::Info,
            format!(
                "saved every rank's log before stopping them: {}",
                saved
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ),
        Err(e) => log(ctx, Level::Warn, format!("logs not saved: {e}")),
    }
    me.window.clear();
    if let Some(p) = me.probe.take() {
        p.task.abort();
    }
    // Every attempt counts towards the flap limit, a failed one too.
    if !matches!(action, Action::StopForGood { .. }) {
        me.heals.push(now);
    }
    let stopped = act::stop_pair(ctx).await;
    if let Action::StopForGood { reason } = action {
        // Written even when the stop failed: watch stops trying either way.
        me.files.write_stop(reason)?;
        me.mode = WatchMode::Stopped;
        me.reason = reason.clone();
        let error = match &stopped {
            Ok(()) => reason.clone(),
            Err(e) => format!("{reason}; stopping the pair failed too: {e}"),
        };
        ctx.emit(Event::Failed {
            source: source(),
            error,
            remedy: Some(
                "fix the cause, then `spark-deploy up` (it removes the stop marker)".to_owned(),
            ),
        });
        return Ok(());
    }
    if let Err(e) = stopped {
        me.write_state(None)?;
        ctx.emit(Event::Failed {
            source: source(),
            error: format!("stopping the pair failed: {e}"),
            remedy: Some(
                "check every node's Docker; watch tries again (within watch.max_heals_per_hour)"
                    .to_owned(),
            ),
        });
        return Ok(());
    }
    me.write_state(None)?;
    match act::start_pair(ctx).await {
        Ok(()) => {
            log(
                ctx,
                Level::Info,
                format!(
                    "serving again {:.1} s after the heal began (heal {} in the last hour)",
                    t.elapsed().as_secs_f64(),
                    me.heals.len()
                ),
            );
            ctx.emit(Event::Finished {
                source: source(),
                duration_ms: u64::try_from(t.elapsed().as_millis()).unwrap_or(u64::MAX),
                bytes: None,
            });
        }
        Err(e) => ctx.emit(Event::Failed {
            source: source(),
            error: format!("starting the pair again failed: {e}"),
            remedy: Some(
                "watch tries again (within watch.max_heals_per_hour); see `spark-deploy logs`"
                    .to_owned(),
            ),
        }),
    }
    Ok(())
}
