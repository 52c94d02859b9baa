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
