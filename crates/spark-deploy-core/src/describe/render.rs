//! Human-readable rendering of a plan description (a `String`; the core never prints).

use std::fmt::Write as _;

use super::{ActionDetail, PlanDescription};
use crate::container::ContainerSpec;

/// Quotes an argument the way a shell would need it.
fn shell_word(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./:=,@+%".contains(&b))
    {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

fn container(out: &mut String, c: &ContainerSpec) {
    let _ = writeln!(
        out,
        "      container {} (rank {}) image {}",
        c.name, c.rank, c.image
    );
    let _ = writeln!(
        out,
        "        network {}  ipc {}  runtime {}  gpus {}  devices [{}]  cap-add [{}]  oom-score-adj {}  restart {}",
        c.network_mode,
        c.ipc_mode,
        c.runtime,
        c.gpus,
        c.devices.join(", "),
        c.cap_add.join(", "),
        c.oom_score_adj,
        c.restart
    );
    let ul: Vec<String> = c
        .ulimits
        .iter()
        .map(|u| format!("{}={}:{}", u.name, u.soft, u.hard))
        .collect();
    let _ = writeln!(out, "        ulimits {}", ul.join(" "));
    for m in &c.mounts {
        let kind = if m.volume { "volume " } else { "" };
        let _ = writeln!(
            out,
            "        mount {kind}{} -> {}{}",
            m.source,
            m.target,
            if m.read_only { " (ro)" } else { "" }
        );
    }
    for (k, v) in &c.env {
        let _ = writeln!(out, "        env {k}={}", shell_word(v));
    }
    let argv: Vec<String> = c.argv.iter().map(|a| shell_word(a)).collect();
    let _ = writeln!(out, "        argv {}", argv.join(" "));
    let labels: Vec<String> = c.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let _ = writeln!(out, "        labels {}", labels.join(" "));
}

/// Renders the plan as indented text.
#[must_use]
pub fn render_text(plan: &PlanDescription) -> String {
    let d = &plan.deployment;
    let mut out = String::new();
    let _ = writeln!(out, "deployment {} ({})", d.name, d.engine);
    let _ = writeln!(
        out,
        "  model {} @ {} (commit {})",
        d.model, d.revision, d.model_commit
    );
    let _ = writeln!(
        out,
        "  serves {} at {}  context {}  parallel {}  worker storage {}",
        d.served_name, d.api, d.context, d.parallel, d.worker_storage
    );
    let secrets: Vec<String> = d.secrets.iter().map(|(k, v)| format!("{k} {v}")).collect();
    let _ = writeln!(out, "  secrets: {}", secrets.join(", "));
    for w in &plan.warnings {
        let _ = writeln!(out, "  warning: {w}");
    }
    let _ = writeln!(out, "nodes");
    for n in &plan.nodes {
        let _ = writeln!(
            out,
            "  {} rank {}  ssh {}  fabric {}  network {}",
            n.name, n.rank, n.ssh, n.fabric_addr, n.network_mode
        );
    }
    for (i, s) in plan.steps.iter().enumerate() {
        let _ = writeln!(out, "{}. {}: {}", i + 1, s.step.title(), s.summary);
        for a in &s.actions {
            let _ = writeln!(out, "    [{}] {}", a.node, a.action);
            match &a.detail {
                None => {}
                Some(ActionDetail::Checks { checks }) => {
                    for c in checks {
                        let _ = writeln!(out, "      - {c}");
                    }
                }
                Some(ActionDetail::Fetch {
                    repo,
                    revision,
                    files,
                    cache,
                    gated,
                }) => {
                    let g = if *gated {
                        " (gated: needs HF_TOKEN)"
                    } else {
                        ""
                    };
                    let _ = writeln!(out, "      {repo}@{revision} -> {cache}{g}");
                    for f in files {
                        let _ = writeln!(out, "      - {f}");
                    }
                }
                Some(ActionDetail::Outputs { files }) => {
                    for f in files {
                        let _ = writeln!(out, "      -> {f}");
                    }
                }
                Some(ActionDetail::Volume {
                    name,
                    driver,
                    options,
                }) => {
                    let _ = writeln!(out, "      volume {name} driver {driver}");
                    for (k, v) in options {
                        let _ = writeln!(out, "        {k}={v}");
                    }
                }
                Some(ActionDetail::Transfer { via, files }) => {
                    let _ = writeln!(out, "      via {via}");
                    for f in files {
                        let _ = writeln!(out, "      - {}: {} -> {}", f.what, f.from, f.to);
                    }
                }
                Some(ActionDetail::Container(c)) => container(&mut out, c),
                Some(ActionDetail::Http {
                    method,
                    url,
                    expect,
                }) => {
                    let _ = writeln!(out, "      {method} {url}: {expect}");
                }
            }
        }
    }
    out
}
