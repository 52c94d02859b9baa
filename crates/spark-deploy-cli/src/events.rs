//! Renders the core's event stream: progress bars and step lines for people, JSON lines for
//! machines (`--json`). The core never prints; this is the only place events become text.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use spark_deploy_core::event::{Event, EventSink, Level};

/// An event sink writing to the terminal.
pub(crate) struct TerminalSink {
    json: bool,
    bars: MultiProgress,
    active: Mutex<HashMap<String, ProgressBar>>,
}

impl TerminalSink {
    pub(crate) fn new(json: bool) -> Self {
        let bars = if json {
            MultiProgress::with_draw_target(ProgressDrawTarget::hidden())
        } else {
            MultiProgress::new()
        };
        Self {
            json,
            bars,
            active: Mutex::new(HashMap::new()),
        }
    }

    fn line(&self, text: &str) {
        // Through the bar manager so lines never tear a bar; it falls back to stderr without a TTY.
        if self.bars.is_hidden() {
            #[allow(clippy::print_stderr)]
            {
                eprintln!("{text}");
            }
        } else {
            let _ = self.bars.println(text);
        }
    }

    fn bar(&self, key: &str, total: Option<u64>) -> ProgressBar {
        let mut active = self
            .active
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        active
            .entry(key.to_owned())
            .or_insert_with(|| {
                let pb = self.bars.add(total.map_or_else(ProgressBar::no_length, ProgressBar::new));
                pb.set_style(
                    ProgressStyle::with_template("{prefix:>12} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta} {msg}")
                        .unwrap_or_else(|_| ProgressStyle::default_bar())
                        .progress_chars("=> "),
                );
                pb.set_prefix(key.chars().take(12).collect::<String>());
                pb.enable_steady_tick(Duration::from_millis(250));
                pb
            })
            .clone()
    }

    fn finish_bars(&self) {
        let mut active = self
            .active
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (_, pb) in active.drain() {
            pb.finish_and_clear();
        }
    }
}

fn human_bytes(n: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    #[allow(clippy::cast_precision_loss)]
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < units.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", units[u])
}

impl EventSink for TerminalSink {
    fn emit(&self, event: Event) {
        if self.json {
            #[allow(clippy::print_stdout)]
            {
                println!("{}", event.to_json_line());
            }
            return;
        }
        match &event {
            Event::Started { source, message } => {
                self.line(&format!("==> {}: {message}", source.title()))
            }
            Event::Progress {
                node,
                label,
                bytes_done,
                bytes_total,
                ..
            } => {
                let key = node
                    .as_ref()
                    .map_or_else(|| label.clone(), |n| format!("{n}:{label}"));
                let pb = self.bar(&key, *bytes_total);
                if let Some(t) = bytes_total {
                    pb.set_length(*t);
                }
                pb.set_position(*bytes_done);
            }
            Event::Log {
                node, level, line, ..
            } => {
                let tag = match level {
                    Level::Warn => "warning: ",
                    Level::Error => "error: ",
                    Level::Info | Level::Debug => "",
                };
                let who = node
                    .as_ref()
                    .map_or_else(String::new, |n| format!("[{n}] "));
                self.line(&format!("    {who}{tag}{line}"));
            }
            Event::Skipped { source, reason } => {
                self.line(&format!("--- {} skipped: {reason}", source.title()))
            }
            Event::Finished {
                source,
                duration_ms,
                bytes,
            } => {
                self.finish_bars();
                let b = bytes.map_or_else(String::new, |b| format!(", {}", human_bytes(b)));
                #[allow(clippy::cast_precision_loss)]
                let secs = *duration_ms as f64 / 1000.0;
                self.line(&format!("<== {} done in {secs:.1} s{b}", source.title()));
            }
            Event::Failed {
                source,
                error,
                remedy,
            } => {
                self.finish_bars();
                self.line(&format!("!!! {} failed: {error}", source.title()));
                if let Some(r) = remedy {
                    self.line(&format!("    remedy: {r}"));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn bytes_are_readable() {
        assert_eq!(super::human_bytes(1536), "1.5 KiB");
        assert_eq!(super::human_bytes(3 << 30), "3.0 GiB");
    }
}
