//! Renders the core's event stream: step lines and progress for people (bars on a terminal, plain
//! lines at an interval otherwise), JSON lines for machines (`--json`). The core never prints;
//! this is the only place events become text. The progress figures come from `progress.rs`.

use std::collections::HashMap;
use std::io::IsTerminal as _;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use spark_deploy_core::event::{Event, EventSink, Level};
use spark_deploy_core::event::{Source, StepKind};

use crate::progress::{Progress, RowView, Update, human_bytes};

/// How much the terminal shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Verbosity {
    /// `-q`: warnings, errors and failures only.
    Quiet,
    /// Steps, decisions, progress.
    Normal,
    /// `-v`: debug lines too.
    Verbose,
}

/// How often plain progress lines are printed when stderr is not a terminal (seconds), unless
/// `SPARK_DEPLOY_PROGRESS_INTERVAL` says otherwise.
const PLAIN_EVERY_S: f64 = 10.0;

fn plain_every() -> Duration {
    std::env::var("SPARK_DEPLOY_PROGRESS_INTERVAL")
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map_or(
            Duration::from_secs_f64(PLAIN_EVERY_S),
            Duration::from_secs_f64,
        )
}

struct State {
    progress: Progress,
    bars: HashMap<String, ProgressBar>,
}

/// An event sink writing to the terminal.
pub(crate) struct TerminalSink {
    json: bool,
    verbosity: Verbosity,
    /// `Some` when stderr is a terminal: bars redrawn in place.
    multi: Option<MultiProgress>,
    state: Mutex<State>,
}

impl TerminalSink {
    pub(crate) fn new(json: bool, verbosity: Verbosity) -> Self {
        let multi = (!json && std::io::stderr().is_terminal())
            .then(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr()));
        Self {
            json,
            verbosity,
            multi,
            state: Mutex::new(State {
                progress: Progress::new(plain_every()),
                bars: HashMap::new(),
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn line(&self, text: &str) {
        // Through the bar manager so lines never tear a bar.
        match &self.multi {
            Some(m) => {
                let _ = m.println(text);
            }
            None => {
                crate::render::note(text);
            }
        }
    }

    fn progress(&self, update: Update) {
        if self.verbosity == Verbosity::Quiet {
            return;
        }
        let now = Instant::now();
        let mut st = self.state();
        st.progress.update(update, now);
        match &self.multi {
            Some(m) => {
                let rows = st.progress.rows(now);
                sync_bars(m, &mut st.bars, &rows);
            }
            None => {
                let lines = st.progress.due_lines(now);
                drop(st);
                for l in lines {
                    self.line(&l);
                }
            }
        }
    }

    fn end_step(&self, step: &Source) {
        let mut st = self.state();
        st.progress.end_step(step);
        if self.multi.is_some() {
            let rows = st.progress.rows(Instant::now());
            if let Some(m) = &self.multi {
                sync_bars(m, &mut st.bars, &rows);
            }
        }
    }

    fn shows(&self, level: Level) -> bool {
        match level {
            Level::Warn | Level::Error => true,
            Level::Info => self.verbosity >= Verbosity::Normal,
            Level::Debug => self.verbosity >= Verbosity::Verbose,
        }
    }
}

/// Makes the bars match `rows`: one per active file, then each step's total.
fn sync_bars(m: &MultiProgress, bars: &mut HashMap<String, ProgressBar>, rows: &[RowView]) {
    bars.retain(|k, pb| {
        let keep = rows.iter().any(|r| &r.key == k);
        if !keep {
            pb.finish_and_clear();
            m.remove(pb);
        }
        keep
    });
    for r in rows {
        let pb = if let Some(pb) = bars.get(&r.key) {
            pb.clone()
        } else {
            let pb = ProgressBar::new(r.total.unwrap_or(0));
            pb.set_style(
                ProgressStyle::with_template("{prefix:<40!} [{bar:24}] {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> "),
            );
            pb.set_prefix(r.name.clone());
            // A file's bar goes above its step's total.
            let group_total = r.key.rsplit_once(' ').map(|(g, _)| format!("{g} total"));
            let pb = match group_total.and_then(|t| bars.get(&t).filter(|_| t != r.key)) {
                Some(total) => m.insert_before(total, pb),
                None => m.add(pb),
            };
            bars.insert(r.key.clone(), pb.clone());
            pb
        };
        if let Some(t) = r.total {
            pb.set_length(t);
        }
        pb.set_position(r.done);
        pb.set_message(r.text.clone());
    }
}

/// What a `Failed` line shows of the error. Preflight streams each check as it is decided
/// (failed checks as error lines, even with `-q`), so its failure shows the summary line only,
/// not the table of the same checks again.
fn failure_text<'a>(source: &Source, error: &'a str) -> &'a str {
    match source.step() {
        Some(StepKind::Preflight) => error.lines().next().unwrap_or(error).trim_end_matches(':'),
        _ => error,
    }
}

impl EventSink for TerminalSink {
    fn emit(&self, event: Event) {
        if self.json {
            crate::render::line(&event.to_json_line());
            return;
        }
        let updates = Update::of(&event);
        if !updates.is_empty() {
            for u in updates {
                self.progress(u);
            }
            return;
        }
        let normal = self.verbosity >= Verbosity::Normal;
        match &event {
            Event::Started { source, message } if normal => {
                self.line(&format!("==> {}: {message}", source.title()));
            }
            Event::Log {
                node, level, line, ..
            } if self.shows(*level) => {
                let tag = match level {
                    Level::Warn => "warning: ",
                    Level::Error => "error: ",
                    Level::Debug => "debug: ",
                    Level::Info => "",
                };
                let who = node
                    .as_ref()
                    .map_or_else(String::new, |n| format!("[{n}] "));
                self.line(&format!("    {who}{tag}{line}"));
            }
            Event::Skipped { source, reason } if normal => {
                self.line(&format!("--- {} skipped: {reason}", source.title()));
            }
            Event::Finished {
                source,
                duration_ms,
                bytes,
            } => {
                self.end_step(source);
                if normal {
                    let b = bytes.map_or_else(String::new, |b| format!(", {}", human_bytes(b)));
                    #[allow(clippy::cast_precision_loss)]
                    let secs = *duration_ms as f64 / 1000.0;
                    self.line(&format!("<== {} done in {secs:.1} s{b}", source.title()));
                }
            }
            // A failure is always shown, and only here: the command does not repeat it.
            Event::Failed {
                source,
                error,
                remedy,
            } => {
                self.end_step(source);
                self.line(&format!(
                    "!!! {} failed: {}",
                    source.title(),
                    failure_text(source, error)
                ));
                if let Some(r) = remedy {
                    self.line(&format!("    remedy: {r}"));
                }
            }
            _ => {}
        }
    }
}
