//! What a window of samples means ([`decide`]) and what to do about it ([`choose`]): pure
//! functions, tested over recorded sample sequences like preflight's decisions.
//!
//! Precedence, first match wins: a rank down (its container exited, vanished or restarted) → the
//! memory floor → a wedge → a control-plane blip → a probe that is due → healthy.

use serde::Serialize;

use super::sample::{ContainerObs, ProbeObs, Sample};
use crate::config::{HealPolicy, WatchSection};

/// The thresholds [`decide`] applies (from `[watch]`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Thresholds {
    /// Frozen-counter time before a wedge is suspected, ms.
    pub wedge_ms: u64,
    /// Idle time before a probe is due, ms.
    pub probe_idle_ms: u64,
    /// `MemAvailable` floor, GiB.
    pub memory_floor_gib: f64,
    /// Every measured GPU at or above this utilisation means "busy, not wedged", %.
    pub gpu_busy_pct: f64,
}

impl From<&WatchSection> for Thresholds {
    fn from(w: &WatchSection) -> Self {
        let ms = |s: f64| (s * 1000.0).round() as u64;
        Self {
            wedge_ms: ms(w.wedge_s),
            probe_idle_ms: ms(w.probe_idle_s),
            memory_floor_gib: w.memory_floor_gib,
            gpu_busy_pct: 90.0,
        }
    }
}

/// Why a probe is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProbeWhy {
    /// No request for `probe_idle_s`.
    Idle,
    /// Requests running and the token counter frozen for `wedge_s`.
    Frozen,
}

/// What a window of samples shows.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "finding", rename_all = "snake_case")]
pub enum Finding {
    /// Both ranks run, rank 0 serves.
    Healthy,
    /// No rank runs (a reboot, a crash of both, or a stop that was not `down`).
    PairDown,
    /// A rank's container exited, vanished or restarted while the other ran.
    RankDown {
        /// The rank.
        rank: usize,
        /// Its node.
        node: String,
        /// `exited (code N)`, `absent`, `restarted`.
        what: String,
    },
    /// `MemAvailable` below the floor on a node.
    Memory {
        /// The node.
        node: String,
        /// `MemAvailable`, GiB.
        available_gib: f64,
        /// The floor, GiB.
        floor_gib: f64,
        /// The host process holding the most memory, when read.
        top_process: Option<String>,
    },
    /// Requests running, the token counter frozen, a probe failed.
    Wedge {
        /// How long the counter has been frozen, s.
        frozen_s: f64,
        /// Requests running.
        running: f64,
        /// The probe's failure.
        probe: String,
    },
    /// The counters look wedged but every measured GPU is busy: reported, not acted on.
    WedgeUnconfirmed {
        /// How long the counter has been frozen, s.
        frozen_s: f64,
        /// Why it is not a wedge.
        why: String,
    },
    /// A node's SSH or Docker did not answer while rank 0 serves: reported, never healed.
    Blip {
        /// The node.
        node: String,
        /// What did not answer.
        what: String,
    },
    /// A 1-token probe is due.
    ProbeDue {
        /// Why.
        why: ProbeWhy,
    },
    /// A probe is in flight; nothing to conclude yet.
    Probing,
}

impl Finding {
    /// Whether the finding asks for both ranks to be stopped (and, by policy, started).
    #[must_use]
    pub fn needs_heal(&self) -> bool {
        matches!(
            self,
            Self::PairDown | Self::RankDown { .. } | Self::Memory { .. } | Self::Wedge { .. }
        )
    }

    /// One line for people.
    #[must_use]
    pub fn describe(&self) -> String {
        match self {
            Self::Healthy => "healthy".to_owned(),
            Self::PairDown => "no rank is running".to_owned(),
            Self::RankDown { rank, node, what } => format!("rank {rank} on {node} {what}"),
            Self::Memory {
                node,
                available_gib,
                floor_gib,
                top_process,
            } => format!(
                "MemAvailable on {node} is {available_gib:.1} GiB, below the floor of {floor_gib:.1} GiB{}",
                top_process
                    .as_ref()
                    .map(|p| format!("; largest host process: {p}"))
                    .unwrap_or_default()
            ),
            Self::Wedge {
                frozen_s,
                running,
                probe,
            } if *frozen_s > 0.0 => format!(
                "wedged: {running:.0} request(s) running and no token for {frozen_s:.0} s; the 1-token probe failed: {probe}"
            ),
            Self::Wedge { probe, .. } => {
                format!("not answering: the idle 1-token probe failed: {probe}")
            }
            Self::WedgeUnconfirmed { frozen_s, why } => {
                format!("no token for {frozen_s:.0} s, not a wedge: {why}")
            }
            Self::Blip { node, what } => {
                format!("control-plane blip on {node}: {what} (rank 0 serves; not acting)")
            }
            Self::ProbeDue { why } => match why {
                ProbeWhy::Idle => "idle: sending a 1-token probe".to_owned(),
                ProbeWhy::Frozen => "token counter frozen: sending a 1-token probe".to_owned(),
            },
            Self::Probing => "a probe is in flight".to_owned(),
        }
    }
}

fn rank_down(window: &[Sample]) -> Option<Finding> {
    let last = window.last()?;
    let running = |s: &Sample| {
        s.ranks
            .iter()
            .filter(|r| r.container == ContainerObs::Running)
            .count()
    };
    let answered = last
        .ranks
        .iter()
        .all(|r| r.container != ContainerObs::Unreachable);
    if answered && running(last) == 0 {
        return Some(Finding::PairDown);
    }
    for r in &last.ranks {
        let what = match r.container {
            ContainerObs::Exited => Some(format!(
                "exited{}",
                r.exit_code
                    .map(|c| format!(" (code {c})"))
                    .unwrap_or_default()
            )),
            ContainerObs::Absent => Some("is gone (container absent)".to_owned()),
            ContainerObs::Running => {
                // A start time that changed since an earlier sample: restarted.
                let before = window.iter().rev().skip(1).find_map(|s| {
                    s.ranks
                        .iter()
                        .find(|p| p.rank == r.rank && p.container == ContainerObs::Running)
                        .and_then(|p| p.started_at.clone())
                });
                match (before, &r.started_at) {
                    (Some(b), Some(now)) if &b != now => Some("restarted".to_owned()),
                    _ => None,
                }
            }
            ContainerObs::Unreachable => None,
        };
        if let Some(what) = what {
            return Some(Finding::RankDown {
                rank: r.rank,
                node: r.node.clone(),
                what,
            });
        }
    }
    None
}

fn memory(last: &Sample, t: &Thresholds) -> Option<Finding> {
    last.ranks
        .iter()
        .filter_map(|r| r.mem_available_gib.map(|g| (r, g)))
        .filter(|(_, g)| *g < t.memory_floor_gib)
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(r, g)| Finding::Memory {
            node: r.node.clone(),
            available_gib: g,
            floor_gib: t.memory_floor_gib,
            top_process: r.top_process.clone(),
        })
}

/// The samples, newest last, over which requests ran and the token counter stayed at the
/// newest sample's value; and when the counter was last seen at another value (the sample before
/// them: the last token came after it), else the first of them.
fn frozen_run(window: &[Sample]) -> (&[Sample], Option<u64>) {
    let Some(tokens) = window.last().and_then(|s| s.generated_tokens) else {
        return (&[], None);
    };
    let n = window
        .iter()
        .rev()
        .take_while(|s| {
            s.generated_tokens == Some(tokens) && s.running_requests.is_some_and(|r| r > 0.0)
        })
        .count();
    let start = window.len() - n;
    let since = start
        .checked_sub(1)
        .and_then(|i| window.get(i))
        .filter(|s| s.generated_tokens.is_some_and(|t| t < tokens))
        .or_else(|| window.get(start))
        .map(|s| s.ts_ms);
    (&window[start..], since)
}

/// A wedge: over at least two samples and `wedge_ms` since the counter last moved, requests ran
/// and the token counter stayed put, and the 1-token probe sent half-way (at `wedge_ms / 2`)
/// failed or has not answered for `wedge_ms / 3`. So the default 30 s finds a wedge 30 s after
/// its onset (within one sample), not 30 s plus a probe timeout.
fn wedge(window: &[Sample], t: &Thresholds) -> Option<Finding> {
    let (run, since) = frozen_run(window);
    let last = run.last()?;
    let frozen_ms = last.ts_ms.saturating_sub(since?);
    if run.len() < 2 || frozen_ms < t.wedge_ms / 2 {
        return None;
    }
    let frozen_s = frozen_ms as f64 / 1000.0;
    let probe = run.iter().rev().find_map(|s| s.probe.clone());
    let failed = match probe {
        None => {
            return Some(Finding::ProbeDue {
                why: ProbeWhy::Frozen,
            });
        }
        Some(ProbeObs::Ok { .. }) => return None,
        Some(ProbeObs::Failed { detail, .. }) => detail,
        Some(ProbeObs::InFlight { since_ms }) => {
            let waited = last.ts_ms.saturating_sub(since_ms);
            if waited < t.wedge_ms / 3 {
                return Some(Finding::Probing);
            }
            format!("no answer in {:.0} s", waited as f64 / 1000.0)
        }
    };
    if frozen_ms < t.wedge_ms {
        return Some(Finding::Probing);
    }
    let gpus: Vec<f64> = last.ranks.iter().filter_map(|r| r.gpu_util_pct).collect();
    if !gpus.is_empty() && gpus.iter().all(|u| *u >= t.gpu_busy_pct) {
        return Some(Finding::WedgeUnconfirmed {
            frozen_s,
            why: format!(
                "every measured GPU is busy (≥ {:.0}% utilisation)",
                t.gpu_busy_pct
            ),
        });
    }
    Some(Finding::Wedge {
        frozen_s,
        running: last.running_requests.unwrap_or(0.0),
        probe: failed,
    })
}

fn blip(last: &Sample) -> Option<Finding> {
    last.ranks.iter().find_map(|r| {
        let what = match (&r.docker_error, &r.exec_error) {
            (Some(d), _) => format!("Docker did not answer: {d}"),
            (None, Some(e)) => format!("the Exec port (SSH) did not answer: {e}"),
            (None, None) => return None,
        };
        Some(Finding::Blip {
            node: r.node.clone(),
            what,
        })
    })
}

/// An idle probe is due when, over at least `probe_idle_ms` of samples, nothing ran, the counter
/// did not move and no probe ended.
fn idle_probe(window: &[Sample], t: &Thresholds) -> Option<Finding> {
    let last = window.last()?;
    if let Some(ProbeObs::InFlight { .. }) = &last.probe {
        return Some(Finding::Probing);
    }
    // An idle probe that failed: the pair does not answer with nothing else to blame.
    if let Some(ProbeObs::Failed { detail, .. }) = &last.probe
        && last.running_requests.is_none_or(|r| r <= 1.0)
    {
        return Some(Finding::Wedge {
            frozen_s: 0.0,
            running: 0.0,
            probe: detail.clone(),
        });
    }
    let tokens = last.generated_tokens?;
    let quiet = window
        .iter()
        .rev()
        .take_while(|s| {
            s.generated_tokens == Some(tokens)
                && s.running_requests.is_some_and(|r| r <= 0.0)
                && !matches!(s.probe, Some(ProbeObs::Ok { .. } | ProbeObs::Failed { .. }))
        })
        .count();
    let run = &window[window.len() - quiet..];
    let span = match (run.first(), run.last()) {
        (Some(a), Some(b)) => b.ts_ms.saturating_sub(a.ts_ms),
        _ => 0,
    };
    (span >= t.probe_idle_ms).then_some(Finding::ProbeDue {
        why: ProbeWhy::Idle,
    })
}

/// What the window of samples (oldest first) shows.
#[must_use]
pub fn decide(window: &[Sample], t: &Thresholds) -> Finding {
    let Some(last) = window.last() else {
        return Finding::Healthy;
    };
    rank_down(window)
        .or_else(|| memory(last, t))
        .or_else(|| wedge(window, t))
        .or_else(|| blip(last))
        .or_else(|| idle_probe(window, t))
        .unwrap_or(Finding::Healthy)
}

/// What the supervisor does about a finding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Action {
    /// Nothing (healthy, or only reported).
    Nothing,
    /// Send a 1-token probe.
    Probe,
    /// Not acting on a finding that needs it.
    Hold {
        /// Why (the pause lease).
        why: String,
    },
    /// Save both logs, stop rank 0 then rank 1, start rank 1 then rank 0, smoke.
    Heal,
    /// Save both logs, stop both ranks, write the stop marker and stay down.
    StopForGood {
        /// The marker's text.
        reason: String,
    },
}

/// What the supervisor knows besides the samples.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Circumstances {
    /// Heals in the last hour.
    pub heals_last_hour: u32,
    /// `watch.max_heals_per_hour`.
    pub max_heals_per_hour: u32,
    /// `watch.heal`.
    pub heal: HealPolicy,
    /// The pause lease, when one is in force (its expiry, for people).
    pub paused_until: Option<String>,
}

/// The action for `finding`.
#[must_use]
pub fn choose(finding: &Finding, c: &Circumstances) -> Action {
    if matches!(finding, Finding::ProbeDue { .. }) {
        return Action::Probe;
    }
    if !finding.needs_heal() {
        return Action::Nothing;
    }
    if let Some(until) = &c.paused_until {
        return Action::Hold {
            why: format!("paused until {until} (`spark-deploy watch resume` ends the lease)"),
        };
    }
    match c.heal {
        HealPolicy::Stop => Action::StopForGood {
            reason: format!(
                "watch stopped the pair (watch.heal = \"stop\"): {}",
                finding.describe()
            ),
        },
        HealPolicy::Restart if c.heals_last_hour >= c.max_heals_per_hour => Action::StopForGood {
            reason: format!(
                "watch stopped the pair: {} heal(s) in the last hour reached watch.max_heals_per_hour = {}; last finding: {}; run `spark-deploy up` after fixing the cause",
                c.heals_last_hour,
                c.max_heals_per_hour,
                finding.describe()
            ),
        },
        HealPolicy::Restart => Action::Heal,
    }
}

#[cfg(test)]
mod tests;
