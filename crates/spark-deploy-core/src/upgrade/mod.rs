//! `upgrade` and `rollback`: a new configuration is prepared beside the serving generation, then
//! switched to, checked (Smoke, `validate`, a short `bench` against the old generation's
//! figures) and accepted — or the old generation is started again from what it recorded.
//!
//! # Guarantees
//!
//! - Preparation (Preflight, fetch, rank inputs, worker storage, image) runs while the old pair
//!   serves; a failure or Ctrl-C there stops nothing.
//! - After the old pair is stopped, the run ends with exactly one generation serving: the new one
//!   when every check passed, else the old one (restarted from its recorded config, image tag and
//!   inputs, which are kept until a new generation is accepted) — or, when even that fails, an
//!   error that says nothing serves.
//! - Downtime is the switch only: stop, start worker-first, Smoke.

mod rollback;

use std::path::Path;
use std::time::Instant;

use serde::Serialize;

use crate::api::{Api, ApiError};
use crate::bench::{self, BenchError};
use crate::config::ValidatedConfig;
use crate::context::Context;
use crate::event::{Event, Level, Source};
use crate::lifecycle::generations::{self, Figures, GenerationsError, History};
use crate::plan::{Plan, StepKind};
use crate::validate;

pub use rollback::{RollbackError, rollback};

/// How an upgrade checks the new generation.
#[derive(Debug, Clone)]
pub struct Options {
    /// Largest accepted drop of decode or prefill against the old generation (0.05 = 5 %).
    pub threshold: f64,
    /// Further bench runs before a shortfall refuses the new generation (the best figures of
    /// all runs count), so that one run slowed by a busy host does not roll back a good one.
    pub confirmations: u32,
    /// The `validate` run.
    pub validate: validate::Options,
    /// The short `bench` run (also the old generation's baseline when it has none).
    pub bench: bench::Options,
    /// Generations kept besides the serving one (their inputs and image tags); older ones are
    /// removed once a new generation is accepted. `None`: `lifecycle.keep_generations`.
    pub keep_generations: Option<usize>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            threshold: 0.05,
            confirmations: 2,
            validate: validate::Options {
                only: Vec::new(),
                skip: Vec::new(),
                needle_tokens: None,
            },
            bench: bench::Options {
                kinds: vec![bench::prompts::Kind::Prose],
                streams: vec![1],
                max_tokens: 128,
                reps: 2,
                prefill: vec![8192],
            },
            keep_generations: None,
        }
    }
}

/// An accepted upgrade.
#[derive(Debug, Clone, Serialize)]
pub struct Upgraded {
    /// The new generation.
    pub generation: u32,
    /// The generation it replaced.
    pub previous: u32,
    /// The new generation's figures.
    pub figures: Figures,
    /// The old generation's figures it was compared with.
    pub baseline: Figures,
    /// Seconds from stopping the old pair to the new one's passing Smoke.
    pub switch_s: f64,
    /// Generations removed by retention.
    pub removed: Vec<u32>,
}

/// Why an upgrade did not end with the new generation serving.
#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    /// No generation serves: there is nothing to upgrade from.
    #[error("no generation is recorded as serving")]
    NothingServing,
    /// The history could not be read or written.
    #[error(transparent)]
    History(#[from] GenerationsError),
    /// The serving generation's recorded config does not validate any more.
    #[error("generation {id}'s recorded config does not validate: {detail}")]
    OldConfig {
        /// The generation.
        id: u32,
        /// Why.
        detail: String,
    },
    /// The new config names another deployment.
    #[error("deployment.name differs ({old} serves, the new config says {new})")]
    NameChanged {
        /// The serving deployment's name.
        old: String,
        /// The new config's.
        new: String,
    },
    /// Measuring the serving generation's baseline failed (nothing was changed).
    #[error("measuring generation {id}'s baseline: {source}")]
    Baseline {
        /// The serving generation.
        id: u32,
        /// Why.
        #[source]
        source: BenchError,
    },
    /// The API of a generation could not be reached.
    #[error(transparent)]
    Api(#[from] ApiError),
    /// Preparing the new generation failed before anything was stopped.
    #[error("preparing the new generation failed at {}: {error}; nothing was stopped, generation {serving} keeps serving", step.title())]
    NotPrepared {
        /// The step that failed.
        step: StepKind,
        /// Its error, one line.
        error: String,
        /// The generation that still serves.
        serving: u32,
        /// The step's remedy.
        remedy: Option<String>,
    },
    /// The new generation was refused and the old one serves again.
    #[error("the new generation was refused ({why}); generation {restored} serves again")]
    RolledBack {
        /// Why it was refused.
        why: String,
        /// The generation serving again.
        restored: u32,
    },
    /// The new generation was refused and restarting the old one failed too.
    #[error(
        "the new generation was refused ({why}), and restarting generation {target} failed: {source}"
    )]
    RollbackFailed {
        /// Why the new one was refused.
        why: String,
        /// The generation that could not be restarted.
        target: u32,
        /// Why.
        #[source]
        source: RollbackError,
    },
}

impl UpgradeError {
    /// What to do about it.
    #[must_use]
    pub fn remedy(&self) -> String {
        match self {
            Self::NothingServing => "run `spark-deploy up` first: an upgrade starts from the generation that serves".into(),
            Self::History(_) => "fix or move aside the file named; `spark-deploy up` starts a new history".into(),
            Self::OldConfig { .. } => "`spark-deploy up` with a config that validates records a new serving generation".into(),
            Self::NameChanged { .. } => "an upgrade replaces the ranks of one deployment: keep deployment.name, or `down` this one and `up` the other".into(),
            Self::Baseline { .. } | Self::Api(_) => "check that the serving pair answers (`spark-deploy status`, `spark-deploy validate`), then upgrade again".into(),
            Self::NotPrepared { remedy, .. } => remedy.clone().unwrap_or_else(|| "fix what the step names, then upgrade again".into()),
            Self::RolledBack { .. } => "see why the new generation was refused (`spark-deploy history`, the events above), fix the new config and upgrade again".into(),
            Self::RollbackFailed { .. } => "nothing serves: `spark-deploy up` with the old config (or the new one once fixed); `spark-deploy logs` shows why the ranks failed".into(),
        }
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn say(ctx: &Context, level: Level, line: String) {
    ctx.emit(Event::Log {
        source: Source::Command("upgrade".into()),
        node: None,
        level,
        line,
    });
}

/// The figures `bench` measured: one stream of prose, and the shortest cold prefill.
#[must_use]
pub fn figures_of(r: &bench::Results) -> Option<Figures> {
    let decode = r
        .decode
        .iter()
        .find(|d| d.streams == 1)
        .map(|d| d.per_stream.median)?;
    Some(Figures {
        decode_tps: decode,
        prefill_tps: r.prefill.first().map(|p| p.rate.median),
    })
}

/// Where `new` falls short of `baseline` by more than `threshold`, in words.
#[must_use]
pub fn shortfall(new: &Figures, baseline: &Figures, threshold: f64) -> Option<String> {
    let drop = |n: f64, b: f64| if b > 0.0 { 1.0 - n / b } else { 0.0 };
    let mut out = Vec::new();
    let d = drop(new.decode_tps, baseline.decode_tps);
    if d > threshold {
        out.push(format!(
            "decode {:.1} tok/s is {:.1} % below the baseline {:.1} tok/s",
            new.decode_tps,
            d * 100.0,
            baseline.decode_tps
        ));
    }
    if let (Some(n), Some(b)) = (new.prefill_tps, baseline.prefill_tps) {
        let p = drop(n, b);
        if p > threshold {
            out.push(format!(
                "prefill {n:.0} tok/s is {:.1} % below the baseline {b:.0} tok/s",
                p * 100.0
            ));
        }
    }
    (!out.is_empty()).then(|| out.join("; "))
}

async fn measure(
    config: &ValidatedConfig,
    opts: &bench::Options,
    ctx: &Context,
) -> Result<Figures, BenchError> {
    let api = Api::from_config(config)?;
    let sink = ctx.sink();
    let r = bench::run(&api, opts, sink.as_ref(), &|| false).await?;
    figures_of(&r).ok_or_else(|| BenchError::Request {
        what: "bench".into(),
        detail: "no one-stream decode row was measured".into(),
    })
}

/// Checks the new generation once it passed Smoke: `validate`, then the short bench against
/// `baseline`. `Err` says why it is refused.
async fn check_new(ctx: &Context, opts: &Options, baseline: &Figures) -> Result<Figures, String> {
    let api = Api::from_config(ctx.config()).map_err(|e| e.to_string())?;
    let sink = ctx.sink();
    let report = validate::run(&api, &opts.validate, sink.as_ref())
        .await
        .map_err(|e| format!("validate: {e}"))?;
    if !report.ok() {
        let failed: Vec<String> = report
            .results
            .iter()
            .filter(|r| r.verdict == validate::Verdict::Fail)
            .map(|r| format!("{}: {}", r.check.name(), r.detail))
            .collect();
        return Err(format!("validate failed: {}", failed.join("; ")));
    }
    let mut figures = measure(ctx.config(), &opts.bench, ctx)
        .await
        .map_err(|e| format!("bench: {e}"))?;
    for again in 1..=opts.confirmations {
        let Some(why) = shortfall(&figures, baseline, opts.threshold) else {
            break;
        };
        say(
            ctx,
            Level::Warn,
            format!(
                "{why}; measuring again ({again} of {}) before refusing",
                opts.confirmations
            ),
        );
        let next = measure(ctx.config(), &opts.bench, ctx)
            .await
            .map_err(|e| format!("bench: {e}"))?;
        figures = best_of(&figures, &next);
    }
    if let Some(why) = shortfall(&figures, baseline, opts.threshold) {
        return Err(why);
    }
    Ok(figures)
}

/// The better of two measurements of one generation, figure by figure: noise on a busy host only
/// ever slows a run down, so the best run is the closest to what the generation can do.
#[must_use]
pub fn best_of(a: &Figures, b: &Figures) -> Figures {
    Figures {
        decode_tps: a.decode_tps.max(b.decode_tps),
        prefill_tps: match (a.prefill_tps, b.prefill_tps) {
            (Some(x), Some(y)) => Some(x.max(y)),
            (x, y) => x.or(y),
        },
    }
}

/// Upgrades the serving generation to `ctx`'s config (see the module docs). `ctx` is the new
/// config's context: cancelling it (Ctrl-C) during preparation stops nothing; during the switch
/// it ends with the old generation serving again.
///
/// # Errors
///
/// [`UpgradeError`]: nothing to upgrade, preparation failed (the old pair serves), the new
/// generation was refused (the old one serves again), or even the rollback failed.
pub async fn upgrade(ctx: &Context, opts: &Options) -> Result<Upgraded, UpgradeError> {
    let new = ctx.config().clone();
    let state_dir = std::path::PathBuf::from(&new.config().deployment.state_dir);
    let history = generations::read(&state_dir)?;
    let serving = history
        .serving()
        .cloned()
        .ok_or(UpgradeError::NothingServing)?;
    let old = rollback::config_of(&serving, &new).map_err(|detail| UpgradeError::OldConfig {
        id: serving.id,
        detail,
    })?;
    if old.config().deployment.name != new.config().deployment.name {
        return Err(UpgradeError::NameChanged {
            old: old.config().deployment.name.clone(),
            new: new.config().deployment.name.clone(),
        });
    }
    let baseline = match serving.figures {
        Some(f) => f,
        None => {
            say(
                ctx,
                Level::Info,
                format!(
                    "measuring generation {}'s baseline while it serves",
                    serving.id
                ),
            );
            let f =
                measure(&old, &opts.bench, ctx)
                    .await
                    .map_err(|source| UpgradeError::Baseline {
                        id: serving.id,
                        source,
                    })?;
            update(&state_dir, |h| {
                if let Some(g) = h.generations.iter_mut().find(|g| g.id == serving.id) {
                    g.figures = Some(f);
                }
            })?;
            f
        }
    };
    say(
        ctx,
        Level::Info,
        format!(
            "generation {} serves ({:.1} tok/s decode); preparing the new configuration beside it",
            serving.id, baseline.decode_tps
        ),
    );
    let t = Instant::now();
    // A running `watch` holds still for the whole upgrade (its pause lease), then resumes on
    // whichever generation serves; heals always start the serving generation.
    let lease = WatchLease::take(&state_dir, ctx);
    // Boxed: a plan run is a large future.
    let plan = Plan::restart(&new);
    let run = Box::pin(plan.run(ctx)).await;
    // The old pair was touched once Stop began (a Stop cancelled before it started touched
    // nothing).
    let switched_at = run.as_ref().map_or_else(
        |e| {
            e.report.steps.iter().any(|s| {
                s.step == StepKind::Stop
                    && !(s.status == crate::run::StepStatus::Failed
                        && s.detail.as_deref() == Some("cancelled before the step started"))
            })
        },
        |_| true,
    );
    let outcome = match run {
        Err(e) if !switched_at => {
            lease.give_back(ctx);
            return Err(UpgradeError::NotPrepared {
                step: e.failure.step,
                error: e.failure.chain(),
                serving: serving.id,
                remedy: e.failure.remedy.clone(),
            });
        }
        Err(e) => Err(format!(
            "{} failed: {}",
            e.failure.step.title(),
            e.failure.chain()
        )),
        Ok(report) => {
            let switch_ms: u64 = report
                .steps
                .iter()
                .filter(|s| {
                    matches!(
                        s.step,
                        StepKind::Stop | StepKind::LaunchRank | StepKind::Smoke
                    )
                })
                .map(|s| s.duration_ms)
                .sum();
            if ctx.is_cancelled() {
                Err("interrupted (Ctrl-C) during the switch".to_owned())
            } else {
                check_new(ctx, opts, &baseline)
                    .await
                    .map(|f| (f, switch_ms))
            }
        }
    };
    let result = Box::pin(finish(
        ctx, opts, &state_dir, &new, &old, &serving, baseline, t, outcome,
    ))
    .await;
    lease.give_back(ctx);
    result
}

/// Accepts the new generation, or restores the old one.
#[allow(clippy::too_many_arguments)]
async fn finish(
    ctx: &Context,
    opts: &Options,
    state_dir: &Path,
    new: &ValidatedConfig,
    old: &ValidatedConfig,
    serving: &generations::Generation,
    baseline: Figures,
    t: Instant,
    outcome: Result<(Figures, u64), String>,
) -> Result<Upgraded, UpgradeError> {
    match outcome {
        Ok((figures, switch_ms)) => {
            let mut removed = Vec::new();
            let mut id = 0;
            update(state_dir, |h| {
                if let Some(g) = h.serving().map(|g| g.id) {
                    id = g;
                }
                if let Some(g) = h.generations.iter_mut().find(|g| g.id == id) {
                    g.figures = Some(figures);
                }
                let keep = opts.keep_generations.unwrap_or_else(|| {
                    usize::try_from(new.config().lifecycle.keep_generations).unwrap_or(usize::MAX)
                });
                removed = h.beyond(keep).iter().map(|g| g.id).collect();
            })?;
            let history = generations::read(state_dir)?;
            rollback::retire(ctx, &history, &removed).await;
            #[allow(clippy::cast_precision_loss)]
            let switch_s = switch_ms as f64 / 1000.0;
            say(
                ctx,
                Level::Info,
                format!(
                    "generation {id} accepted: {:.1} tok/s decode (baseline {:.1}); the switch took {switch_s:.1} s (wall {:.1} s in all)",
                    figures.decode_tps,
                    baseline.decode_tps,
                    t.elapsed().as_secs_f64()
                ),
            );
            Ok(Upgraded {
                generation: id,
                previous: serving.id,
                figures,
                baseline,
                switch_s,
                removed,
            })
        }
        Err(why) => {
            say(
                ctx,
                Level::Warn,
                format!("refused: {why}; restarting generation {}", serving.id),
            );
            let new_sha = crate::lifecycle::launch_record::config_sha256(new);
            // The refused generation is recorded as such (it may never have started).
            update(state_dir, |h| {
                let id = h
                    .generations
                    .iter()
                    .find(|g| g.config_sha256 == new_sha && g.id != serving.id)
                    .map(|g| g.id);
                let at = unix_now();
                match id {
                    Some(id) => h.reject(id, &why, at),
                    None => {
                        let id = h.generations.iter().map(|g| g.id).max().unwrap_or(0) + 1;
                        h.generations.push(generations::Generation {
                            id,
                            state: generations::GenerationState::Rejected,
                            config: serde_json::to_value(new.config()).unwrap_or_default(),
                            config_sha256: new_sha.clone(),
                            fingerprint: String::new(),
                            model_commit: ctx.facts().model_commit.to_string(),
                            images: Vec::new(),
                            served_from: at,
                            served_until: Some(at),
                            figures: None,
                            note: Some(why.clone()),
                        });
                    }
                }
            })?;
            let fresh = Context::new(old.clone(), ctx.sink());
            match Box::pin(rollback::restore(&fresh, serving)).await {
                Ok(()) => Err(UpgradeError::RolledBack {
                    why,
                    restored: serving.id,
                }),
                Err(source) => Err(UpgradeError::RollbackFailed {
                    why,
                    target: serving.id,
                    source,
                }),
            }
        }
    }
}

/// Reads, changes and writes the history.
fn update(state_dir: &Path, f: impl FnOnce(&mut History)) -> Result<(), GenerationsError> {
    let mut h = generations::read(state_dir)?;
    f(&mut h);
    generations::write(state_dir, &h)
}

/// The generation history of `config`'s deployment (what `spark-deploy history` lists).
///
/// # Errors
///
/// [`GenerationsError`] when the file cannot be read.
pub fn history(config: &ValidatedConfig) -> Result<History, GenerationsError> {
    generations::read(Path::new(&config.config().deployment.state_dir))
}

/// The pause lease an upgrade holds on a running `watch`, and the lease it replaced.
struct WatchLease {
    files: crate::lifecycle::watch_state::WatchFiles,
    before: Option<std::time::SystemTime>,
}

impl WatchLease {
    /// How long the lease lasts at most (a crashed upgrade does not pause `watch` for ever).
    const LONGEST: std::time::Duration = std::time::Duration::from_secs(2 * 3600);

    fn take(state_dir: &Path, ctx: &Context) -> Self {
        let files = crate::lifecycle::watch_state::WatchFiles::of(state_dir);
        let now = std::time::SystemTime::now();
        let before = files.read_pause(now);
        if let Err(e) = files.write_pause(now + Self::LONGEST) {
            say(
                ctx,
                Level::Warn,
                format!("pausing watch for the upgrade: {e}"),
            );
        }
        Self { files, before }
    }

    fn give_back(self, ctx: &Context) {
        let r = match self.before {
            Some(until) => self.files.write_pause(until),
            None => self.files.clear_pause(),
        };
        if let Err(e) = r {
            say(
                ctx,
                Level::Warn,
                format!("resuming watch after the upgrade: {e}"),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_best_of_two_runs_takes_each_figure_from_the_faster_run() {
        let a = Figures {
            decode_tps: 70.0,
            prefill_tps: Some(2100.0),
        };
        let b = Figures {
            decode_tps: 74.0,
            prefill_tps: Some(1900.0),
        };
        let best = best_of(&a, &b);
        assert_eq!(best.decode_tps, 74.0);
        assert_eq!(best.prefill_tps, Some(2100.0));
        let base = Figures {
            decode_tps: 75.0,
            prefill_tps: Some(2050.0),
        };
        assert!(
            shortfall(&a, &base, 0.05).is_some(),
            "one slow run falls short"
        );
        assert!(
            shortfall(&best, &base, 0.05).is_none(),
            "the best of both does not"
        );
        let unmeasured = Figures {
            decode_tps: 60.0,
            prefill_tps: None,
        };
        assert_eq!(best_of(&unmeasured, &a).prefill_tps, Some(2100.0));
        assert_eq!(best_of(&unmeasured, &unmeasured).prefill_tps, None);
    }

    #[test]
    fn a_drop_beyond_the_threshold_is_named_and_a_small_one_is_not() {
        let base = Figures {
            decode_tps: 100.0,
            prefill_tps: Some(1000.0),
        };
        let slower = Figures {
            decode_tps: 80.0,
            prefill_tps: Some(990.0),
        };
        let why = shortfall(&slower, &base, 0.05).unwrap();
        assert!(why.contains("decode 80.0 tok/s is 20.0 % below"), "{why}");
        assert!(!why.contains("prefill"), "{why}");
        let close = Figures {
            decode_tps: 96.0,
            prefill_tps: Some(960.0),
        };
        assert_eq!(shortfall(&close, &base, 0.05), None);
        let faster = Figures {
            decode_tps: 130.0,
            prefill_tps: None,
        };
        assert_eq!(shortfall(&faster, &base, 0.05), None);
    }
}
