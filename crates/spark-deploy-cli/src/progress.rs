//! The progress model behind the terminal: each active file with its own bytes, rate and ETA,
//! and a total per step and node; plain lines at an interval when the output is not a terminal.
//!
//! Only [`Update::of`] knows the shape of the core's progress events; the rest works on
//! [`Update`]s, so a change of the event format touches one function.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use spark_deploy_core::event::Event;
use spark_deploy_core::event::{Source, StepKind};

/// What a progress figure measures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Scope {
    /// One file (or rank file, or image) on its own.
    File(String),
    /// The whole step on one node; `current` names the file that moved last.
    Total {
        /// The file that moved last.
        current: String,
    },
}

/// One progress figure, whatever the event format.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Update {
    /// Step and node it belongs to (the row group).
    pub(crate) group: String,
    /// File or total.
    pub(crate) scope: Scope,
    /// Bytes done.
    pub(crate) done: u64,
    /// Bytes in all, when known.
    pub(crate) total: Option<u64>,
    /// Rate reported by the step, bytes per second.
    pub(crate) rate: Option<f64>,
}

impl Update {
    /// The figures an event carries. Downloads and copies report the step's running total (with
    /// the file that moved last) and that file's own bytes; rank files and the image report
    /// each item's own bytes. Not a progress event: empty.
    pub(crate) fn of(event: &Event) -> Vec<Self> {
        let Event::Progress {
            source,
            node,
            label,
            bytes_done,
            bytes_total,
            rate_bps,
            file,
            ..
        } = event
        else {
            return Vec::new();
        };
        let group = match node {
            Some(n) => format!("[{n}] {}", source.title()),
            None => source.title().to_owned(),
        };
        let scope = match source.step() {
            Some(StepKind::FetchCheckpoint | StepKind::ConfigureWorkerStorage) => Scope::Total {
                current: label.clone(),
            },
            _ => Scope::File(label.clone()),
        };
        let mut out = Vec::with_capacity(2);
        if let (Scope::Total { .. }, Some(f)) = (&scope, file) {
            out.push(Self {
                group: group.clone(),
                scope: Scope::File(label.clone()),
                done: f.done,
                total: Some(f.total),
                rate: None,
            });
        }
        out.push(Self {
            group,
            scope,
            done: *bytes_done,
            total: *bytes_total,
            rate: *rate_bps,
        });
        out
    }
}

/// A row's figures over time.
#[derive(Debug, Clone)]
struct Row {
    done: u64,
    total: Option<u64>,
    reported_rate: Option<f64>,
    first: (Instant, u64),
    note: String,
}

impl Row {
    fn new(now: Instant, done: u64) -> Self {
        Self {
            done,
            total: None,
            reported_rate: None,
            first: (now, done),
            note: String::new(),
        }
    }

    /// The step's rate when it gave one, else the average since the row appeared.
    fn rate(&self, now: Instant) -> Option<f64> {
        if self.complete() && self.reported_rate.is_none() {
            return None;
        }
        self.reported_rate.filter(|r| *r > 0.0).or_else(|| {
            let secs = now.duration_since(self.first.0).as_secs_f64();
            #[allow(clippy::cast_precision_loss)]
            let moved = self.done.saturating_sub(self.first.1) as f64;
            (secs >= 0.5 && moved > 0.0).then(|| moved / secs)
        })
    }

    fn eta(&self, now: Instant) -> Option<f64> {
        let left = self.total?.checked_sub(self.done)?;
        #[allow(clippy::cast_precision_loss)]
        self.rate(now).filter(|r| *r > 0.0).map(|r| left as f64 / r)
    }

    fn complete(&self) -> bool {
        self.total.is_some_and(|t| self.done >= t)
    }
}

/// Rows of one step on one node.
#[derive(Debug, Default)]
struct Group {
    files: BTreeMap<String, Row>,
    total: Option<Row>,
}

/// Every active row, and when plain lines were printed last.
#[derive(Debug)]
pub(crate) struct Progress {
    groups: BTreeMap<String, Group>,
    every: Duration,
    last_print: Option<Instant>,
}

pub(crate) fn human_bytes(n: u64) -> String {
    #[allow(clippy::cast_precision_loss)]
    human(n as f64)
}

fn human(mut v: f64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut u = 0;
    while v >= 1024.0 && u < units.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", units[u])
}

fn human_secs(s: f64) -> String {
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let s = s.round().max(0.0) as u64;
    match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

/// `1.2 GiB / 4.0 GiB (30%), 45.0 MiB/s, ETA 1m03s`.
fn figures(row: &Row, now: Instant) -> String {
    let mut out = human_bytes(row.done);
    if let Some(t) = row.total {
        #[allow(clippy::cast_precision_loss)]
        let pct = if t == 0 {
            100.0
        } else {
            row.done as f64 * 100.0 / t as f64
        };
        out.push_str(&format!(" / {} ({pct:.0}%)", human_bytes(t)));
    }
    if let Some(r) = row.rate(now) {
        out.push_str(&format!(", {}/s", human(r)));
    }
    if let Some(e) = row.eta(now) {
        out.push_str(&format!(", ETA {}", human_secs(e)));
    }
    out
}

/// A row as the terminal shows it: its name and figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RowView {
    /// `group file` or `group total`.
    pub(crate) key: String,
    /// File name, or `total`.
    pub(crate) name: String,
    /// Bytes, rate, ETA (and the current file for a step total).
    pub(crate) text: String,
    /// Bytes done and in all, for a bar.
    pub(crate) done: u64,
    /// Bytes in all.
    pub(crate) total: Option<u64>,
}

impl Progress {
    /// Plain lines at most every `every`.
    pub(crate) fn new(every: Duration) -> Self {
        Self {
            groups: BTreeMap::new(),
            every,
            last_print: None,
        }
    }

    /// Records an update.
    pub(crate) fn update(&mut self, u: Update, now: Instant) {
        let g = self.groups.entry(u.group).or_default();
        let row = match &u.scope {
            Scope::File(name) => g
                .files
                .entry(name.clone())
                .or_insert_with(|| Row::new(now, u.done)),
            Scope::Total { .. } => g.total.get_or_insert_with(|| Row::new(now, u.done)),
        };
        row.done = u.done;
        row.total = u.total.or(row.total);
        row.reported_rate = u.rate.filter(|r| *r > 0.0);
        if let Scope::Total { current } = u.scope {
            row.note = current;
        }
    }

    /// Forgets a step's rows (it finished or failed); the next step's first figures are due at
    /// once.
    pub(crate) fn end_step(&mut self, source: &Source) {
        let title = source.title();
        self.groups
            .retain(|k, _| k != title && !k.ends_with(&format!("] {title}")));
        self.last_print = None;
    }

    /// Every row to show: each active file, then the group's total (given by the step, or the
    /// sum of its files when there are several).
    pub(crate) fn rows(&self, now: Instant) -> Vec<RowView> {
        let mut out = Vec::new();
        for (group, g) in &self.groups {
            for (name, row) in g.files.iter().filter(|(_, r)| !r.complete()) {
                out.push(RowView {
                    key: format!("{group} {name}"),
                    name: format!("{group} {name}"),
                    text: figures(row, now),
                    done: row.done,
                    total: row.total,
                });
            }
            let summed;
            let total = match &g.total {
                Some(t) => Some(t),
                None if g.files.len() > 1 => {
                    summed = Row {
                        done: g.files.values().map(|r| r.done).sum(),
                        total: g.files.values().map(|r| r.total).sum::<Option<u64>>(),
                        reported_rate: g
                            .files
                            .values()
                            .filter_map(|r| r.rate(now))
                            .reduce(|a, b| a + b),
                        first: (now, 0),
                        note: String::new(),
                    };
                    Some(&summed)
                }
                None => None,
            };
            if let Some(t) = total {
                let mut text = figures(t, now);
                if !t.note.is_empty() && !t.complete() {
                    text.push_str(&format!(" — {}", t.note));
                }
                out.push(RowView {
                    key: format!("{group} total"),
                    name: format!("{group} total"),
                    text,
                    done: t.done,
                    total: t.total,
                });
            }
        }
        out
    }

    /// The plain lines due at `now`: every row, when `every` has passed since the last lines
    /// (or none were printed yet); else nothing.
    pub(crate) fn due_lines(&mut self, now: Instant) -> Vec<String> {
        if self
            .last_print
            .is_some_and(|t| now.duration_since(t) < self.every)
        {
            return Vec::new();
        }
        let rows = self.rows(now);
        if !rows.is_empty() {
            self.last_print = Some(now);
        }
        rows.into_iter()
            .map(|r| format!("    {}: {}", r.name, r.text))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(group: &str, name: &str, done: u64, total: u64) -> Update {
        Update {
            group: group.into(),
            scope: Scope::File(name.into()),
            done,
            total: Some(total),
            rate: None,
        }
    }

    #[test]
    fn bytes_and_times_are_readable() {
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(3 << 30), "3.0 GiB");
        assert_eq!(human_secs(63.2), "1m03s");
        assert_eq!(human_secs(7300.0), "2h01m");
    }

    #[test]
    fn each_active_file_has_its_own_figures_and_a_total_line_follows() {
        let t0 = Instant::now();
        let mut p = Progress::new(Duration::from_secs(10));
        p.update(file("[head] BuildRankCache", "rank0of2", 0, 1000), t0);
        p.update(file("[head] BuildRankCache", "rank1of2", 0, 3000), t0);
        let t1 = t0 + Duration::from_secs(2);
        p.update(file("[head] BuildRankCache", "rank0of2", 500, 1000), t1);
        p.update(file("[head] BuildRankCache", "rank1of2", 600, 3000), t1);
        let rows = p.rows(t1);
        let text: Vec<String> = rows
            .iter()
            .map(|r| format!("{}: {}", r.name, r.text))
            .collect();
        assert_eq!(
            text,
            [
                "[head] BuildRankCache rank0of2: 500.0 B / 1000.0 B (50%), 250.0 B/s, ETA 2 s",
                "[head] BuildRankCache rank1of2: 600.0 B / 2.9 KiB (20%), 300.0 B/s, ETA 8 s",
                "[head] BuildRankCache total: 1.1 KiB / 3.9 KiB (28%), 550.0 B/s, ETA 5 s",
            ]
        );
        // A finished file leaves the active rows; the total stays until the step ends.
        p.update(file("[head] BuildRankCache", "rank0of2", 1000, 1000), t1);
        let names: Vec<String> = p.rows(t1).into_iter().map(|r| r.name).collect();
        assert_eq!(
            names,
            [
                "[head] BuildRankCache rank1of2",
                "[head] BuildRankCache total"
            ]
        );
        p.end_step(&StepKind::BuildRankCache.into());
        assert!(p.rows(t1).is_empty());
    }

    #[test]
    fn concurrent_downloads_each_get_a_row_above_the_steps_total() {
        use spark_deploy_core::event::FileBytes;
        let t0 = Instant::now();
        let mut p = Progress::new(Duration::from_secs(10));
        let ev = |label: &str, done: u64, file: (u64, u64)| Event::Progress {
            source: StepKind::FetchCheckpoint.into(),
            node: Some("head".into()),
            label: label.into(),
            bytes_done: done,
            bytes_total: Some(10_000),
            rate_bps: Some(1000.0),
            eta_s: None,
            file: Some(FileBytes {
                done: file.0,
                total: file.1,
            }),
        };
        for e in [
            ev("model-00001.safetensors", 1500, (1000, 4000)),
            ev("model-00002.safetensors", 2000, (500, 5000)),
        ] {
            for u in Update::of(&e) {
                p.update(u, t0);
            }
        }
        let rows: Vec<(String, String)> =
            p.rows(t0).into_iter().map(|r| (r.name, r.text)).collect();
        assert_eq!(rows.len(), 3, "{rows:?}");
        assert_eq!(rows[0].0, "[head] FetchCheckpoint model-00001.safetensors");
        assert!(
            rows[0].1.starts_with("1000.0 B / 3.9 KiB (25%)"),
            "{rows:?}"
        );
        assert_eq!(rows[1].0, "[head] FetchCheckpoint model-00002.safetensors");
        assert!(rows[1].1.starts_with("500.0 B / 4.9 KiB (10%)"), "{rows:?}");
        assert_eq!(rows[2].0, "[head] FetchCheckpoint total");
        assert!(
            rows[2].1.starts_with("2.0 KiB / 9.8 KiB (20%), 1000.0 B/s"),
            "{rows:?}"
        );
        // The first file lands: its row goes, the other and the total stay.
        for u in Update::of(&ev("model-00001.safetensors", 5000, (4000, 4000))) {
            p.update(u, t0);
        }
        let names: Vec<String> = p.rows(t0).into_iter().map(|r| r.name).collect();
        assert_eq!(
            names,
            [
                "[head] FetchCheckpoint model-00002.safetensors",
                "[head] FetchCheckpoint total"
            ]
        );
    }

    #[test]
    fn a_step_total_shows_the_file_that_moved_last() {
        let t0 = Instant::now();
        let mut p = Progress::new(Duration::from_secs(10));
        p.update(
            Update {
                group: "[head] FetchCheckpoint".into(),
                scope: Scope::Total {
                    current: "model-00001.safetensors".into(),
                },
                done: 1 << 30,
                total: Some(4 << 30),
                rate: Some(f64::from(50u32 << 20)),
            },
            t0,
        );
        let rows = p.rows(t0);
        assert_eq!(rows.len(), 1);
        assert_eq!(
            rows[0].text,
            "1.0 GiB / 4.0 GiB (25%), 50.0 MiB/s, ETA 1m01s — model-00001.safetensors"
        );
    }

    #[test]
    fn plain_lines_come_at_most_every_interval() {
        let t0 = Instant::now();
        let mut p = Progress::new(Duration::from_secs(10));
        assert!(
            p.due_lines(t0).is_empty(),
            "nothing active, nothing printed"
        );
        p.update(file("[w] BuildImage", "image", 1, 10), t0);
        assert_eq!(p.due_lines(t0).len(), 1, "the first figures at once");
        for s in 1..10 {
            p.update(
                file("[w] BuildImage", "image", s, 10),
                t0 + Duration::from_secs(s),
            );
            assert!(p.due_lines(t0 + Duration::from_secs(s)).is_empty(), "{s} s");
        }
        let lines = p.due_lines(t0 + Duration::from_secs(10));
        assert_eq!(
            lines,
            ["    [w] BuildImage image: 9.0 B / 10.0 B (90%), 0.8 B/s, ETA 1 s"]
        );
        assert!(
            lines
                .iter()
                .all(|l| !l.contains('\r') && !l.contains('\u{1b}')),
            "plain text"
        );
        // The next step's first figures come at once.
        p.end_step(&StepKind::BuildImage.into());
        let t = t0 + Duration::from_secs(11);
        p.update(file("[head] BuildRankCache", "rank0of2", 1, 10), t);
        assert_eq!(p.due_lines(t).len(), 1);
    }
}
