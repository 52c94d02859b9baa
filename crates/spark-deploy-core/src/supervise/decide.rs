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
mod tests {
    use super::super::sample::RankSample;
    use super::*;

    fn t() -> Thresholds {
        Thresholds::from(&WatchSection::default())
    }

    /// A sample at `s` seconds: both ranks running, `running` requests, `tokens` generated.
    fn at(s: f64, running: f64, tokens: f64) -> Sample {
        Sample {
            ts_ms: (s * 1000.0) as u64,
            ranks: vec![
                RankSample::running(0, "head"),
                RankSample::running(1, "worker-1"),
            ],
            running_requests: Some(running),
            generated_tokens: Some(tokens),
            metrics_error: None,
            probe: None,
        }
    }

    /// Samples every 2 s from 0 to `end` s.
    fn seq(end: u32, f: impl Fn(f64) -> (f64, f64)) -> Vec<Sample> {
        (0..=end / 2)
            .map(|i| {
                let s = f64::from(i * 2);
                let (r, tok) = f(s);
                at(s, r, tok)
            })
            .collect()
    }

    #[test]
    fn a_serving_pair_is_healthy() {
        let w = seq(40, |s| (2.0, s * 10.0));
        assert_eq!(decide(&w, &t()), Finding::Healthy);
    }

    #[test]
    fn an_exited_or_vanished_rank_is_down_at_once() {
        let mut w = seq(10, |s| (1.0, s));
        w.last_mut().unwrap().ranks[1].container = ContainerObs::Exited;
        w.last_mut().unwrap().ranks[1].exit_code = Some(137);
        assert_eq!(
            decide(&w, &t()),
            Finding::RankDown {
                rank: 1,
                node: "worker-1".into(),
                what: "exited (code 137)".into()
            }
        );
        w.last_mut().unwrap().ranks[1].container = ContainerObs::Absent;
        assert!(matches!(
            decide(&w, &t()),
            Finding::RankDown { rank: 1, .. }
        ));
        for r in &mut w.last_mut().unwrap().ranks {
            r.container = ContainerObs::Exited;
        }
        assert_eq!(decide(&w, &t()), Finding::PairDown);
    }

    #[test]
    fn a_restarted_rank_is_down() {
        let mut w = seq(10, |s| (0.0, s));
        w.last_mut().unwrap().ranks[0].started_at = Some("2026-12-01T10:05:00Z".into());
        assert_eq!(
            decide(&w, &t()),
            Finding::RankDown {
                rank: 0,
                node: "head".into(),
                what: "restarted".into()
            }
        );
    }

    #[test]
    fn wedge_needs_the_default_30_s_and_a_probe_sent_half_way_that_does_not_answer() {
        // Tokens move until 20 s (last seen moving at the 18 s sample), then freeze with 3
        // requests running.
        let mut w = seq(32, |s| (3.0, s.min(20.0) * 7.0));
        // At 32 s: frozen at most 14 s — a slow step, nothing to do.
        assert_eq!(decide(&w, &t()), Finding::Healthy);
        w.push(at(34.0, 3.0, 140.0));
        assert_eq!(
            decide(&w, &t()),
            Finding::ProbeDue {
                why: ProbeWhy::Frozen
            },
            "half of W frozen: probe"
        );
        for s in [36.0, 38.0, 40.0, 42.0, 44.0, 46.0] {
            w.push(at(s, 4.0, 140.0));
            w.last_mut().unwrap().probe = Some(ProbeObs::InFlight { since_ms: 34_000 });
            assert_eq!(decide(&w, &t()), Finding::Probing, "at {s} s");
        }
        // W after the counter last moved, the probe unanswered for 14 s (≥ W / 3): a wedge.
        w.push(at(48.0, 4.0, 140.0));
        w.last_mut().unwrap().probe = Some(ProbeObs::InFlight { since_ms: 34_000 });
        match decide(&w, &t()) {
            Finding::Wedge {
                frozen_s, probe, ..
            } => {
                assert!((frozen_s - 30.0).abs() < 1e-9, "{frozen_s}");
                assert!(probe.contains("no answer in 14 s"), "{probe}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            choose(
                &decide(&w, &t()),
                &Circumstances {
                    heals_last_hour: 0,
                    max_heals_per_hour: 3,
                    heal: HealPolicy::Restart,
                    paused_until: None
                }
            ),
            Action::Heal
        );
        // A probe that failed early is remembered until W is reached.
        let mut w = seq(36, |s| (1.0, s.min(20.0)));
        w.last_mut().unwrap().probe = Some(ProbeObs::Failed {
            ms: 300,
            detail: "HTTP 500".into(),
        });
        assert_eq!(decide(&w, &t()), Finding::Probing);
        w.push(at(50.0, 1.0, 20.0));
        assert!(matches!(decide(&w, &t()), Finding::Wedge { .. }));
    }

    #[test]
    fn a_probe_that_answers_ends_the_suspicion() {
        let mut w = seq(52, |s| (1.0, s.min(20.0)));
        w.push(at(54.0, 1.0, 21.0));
        w.last_mut().unwrap().probe = Some(ProbeObs::Ok { ms: 300 });
        assert_eq!(decide(&w, &t()), Finding::Healthy);
    }

    #[test]
    fn one_slow_step_between_moving_samples_is_not_a_wedge() {
        // Frozen 0–30 s with one sample, moving again: the run is one sample long.
        let mut w = vec![at(0.0, 1.0, 5.0), at(40.0, 1.0, 5.0)];
        w.push(at(42.0, 1.0, 6.0));
        assert_eq!(decide(&w, &t()), Finding::Healthy);
        // Frozen without requests running is idle, not wedged.
        let w = seq(40, |_| (0.0, 5.0));
        assert_eq!(
            decide(&w[..=15], &t()),
            Finding::Healthy,
            "30 s idle: no probe yet"
        );
    }

    #[test]
    fn busy_gpus_do_not_make_a_wedge() {
        let mut w = seq(40, |s| (2.0, s.min(4.0)));
        w.last_mut().unwrap().probe = Some(ProbeObs::Failed {
            ms: 20_000,
            detail: "timeout".into(),
        });
        for r in &mut w.last_mut().unwrap().ranks {
            r.gpu_util_pct = Some(99.0);
            r.gpu_power_w = Some(180.0);
        }
        assert!(matches!(decide(&w, &t()), Finding::WedgeUnconfirmed { .. }));
        w.last_mut().unwrap().ranks[1].gpu_util_pct = Some(3.0);
        assert!(matches!(decide(&w, &t()), Finding::Wedge { .. }));
    }

    #[test]
    fn memory_below_the_floor_on_any_node_names_the_node_and_process() {
        let mut w = seq(6, |s| (1.0, s));
        let r = &mut w.last_mut().unwrap().ranks[1];
        r.mem_available_gib = Some(2.5);
        r.top_process = Some("stress-ng (90.1 GiB)".into());
        let f = decide(&w, &t());
        assert_eq!(
            f,
            Finding::Memory {
                node: "worker-1".into(),
                available_gib: 2.5,
                floor_gib: 3.0,
                top_process: Some("stress-ng (90.1 GiB)".into())
            }
        );
        assert!(f.describe().contains("stress-ng"), "{}", f.describe());
        assert!(f.needs_heal());
    }

    #[test]
    fn an_unreachable_worker_while_rank_0_serves_is_a_blip_never_healed() {
        let mut w = seq(10, |s| (1.0, s));
        let r = &mut w.last_mut().unwrap().ranks[1];
        r.container = ContainerObs::Unreachable;
        r.docker_error = Some("ssh: connection refused".into());
        r.exec_error = Some("ssh: connection refused".into());
        r.mem_available_gib = None;
        let f = decide(&w, &t());
        assert!(
            matches!(f, Finding::Blip { ref node, .. } if node == "worker-1"),
            "{f:?}"
        );
        assert!(!f.needs_heal());
        let c = Circumstances {
            heals_last_hour: 0,
            max_heals_per_hour: 3,
            heal: HealPolicy::Restart,
            paused_until: None,
        };
        assert_eq!(choose(&f, &c), Action::Nothing);
    }

    #[test]
    fn an_idle_pair_is_probed_every_probe_idle_s_and_a_failed_probe_is_a_wedge() {
        let mut w = seq(60, |_| (0.0, 100.0));
        assert_eq!(
            decide(&w, &t()),
            Finding::ProbeDue {
                why: ProbeWhy::Idle
            }
        );
        w.push(at(62.0, 0.0, 101.0));
        w.last_mut().unwrap().probe = Some(ProbeObs::Ok { ms: 200 });
        assert_eq!(decide(&w, &t()), Finding::Healthy);
        w.push(at(64.0, 0.0, 101.0));
        assert_eq!(decide(&w, &t()), Finding::Healthy, "the clock restarts");
        w.push(at(66.0, 1.0, 101.0));
        w.last_mut().unwrap().probe = Some(ProbeObs::Failed {
            ms: 20_000,
            detail: "HTTP 500: PeerDown".into(),
        });
        let f = decide(&w, &t());
        assert!(matches!(f, Finding::Wedge { .. }));
        assert_eq!(
            f.describe(),
            "not answering: the idle 1-token probe failed: HTTP 500: PeerDown"
        );
    }

    #[test]
    fn the_flap_limit_the_stop_policy_and_the_lease() {
        let f = Finding::PairDown;
        let mut c = Circumstances {
            heals_last_hour: 2,
            max_heals_per_hour: 3,
            heal: HealPolicy::Restart,
            paused_until: None,
        };
        assert_eq!(choose(&f, &c), Action::Heal);
        c.heals_last_hour = 3;
        match choose(&f, &c) {
            Action::StopForGood { reason } => {
                assert!(reason.contains("max_heals_per_hour = 3"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        c.heals_last_hour = 0;
        c.heal = HealPolicy::Stop;
        assert!(matches!(choose(&f, &c), Action::StopForGood { .. }));
        c.paused_until = Some("2026-12-01T11:00:00Z".into());
        assert!(matches!(choose(&f, &c), Action::Hold { .. }));
        assert_eq!(
            choose(
                &Finding::ProbeDue {
                    why: ProbeWhy::Idle
                },
                &c
            ),
            Action::Probe
        );
        assert_eq!(choose(&Finding::Healthy, &c), Action::Nothing);
    }
}
