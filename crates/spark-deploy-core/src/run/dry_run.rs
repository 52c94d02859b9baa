//! A dry run (`DRY_RUN=1`, `--dry-run`): what a plan would do, with the facts a read-only
//! preflight detects filled in, and nothing changed — no download, build, copy, start or stop.

use serde::Serialize;

use crate::context::Context;
use crate::describe::PlanDescription;
use crate::event::StepKind;
use crate::plan::Plan;
use crate::preflight::report::PreflightReport;
use crate::steps::Preflight;

/// What a dry run found.
#[derive(Debug, Clone, Serialize)]
pub struct DryRun {
    /// The plan, with what the checks detected in place of placeholders (those they could not
    /// detect — an unreachable worker's fabric address, the checkpoint's commit before a fetch —
    /// remain placeholders).
    pub plan: PlanDescription,
    /// The checks' table, when the plan starts with Preflight (a failed row is shown, not fatal).
    pub preflight: Option<PreflightReport>,
}

impl Plan {
    /// Describes what [`Plan::run`] would do on these nodes without changing anything: when the
    /// plan has a Preflight, its checks run read-only (no directory is created, no wait for
    /// memory) and what they detect fills the plan.
    pub async fn dry_run(&self, ctx: &Context) -> DryRun {
        ctx.set_dry_run();
        let preflight = if self.steps().iter().any(|s| s.kind() == StepKind::Preflight) {
            // A failed check is part of what the dry run shows, not an error of the dry run.
            let _ = Preflight::new(ctx.config())
                .check(ctx, self.engine().as_ref())
                .await;
            ctx.preflight_report()
        } else {
            None
        };
        DryRun {
            plan: self.with_facts(ctx.facts()).describe(),
            preflight,
        }
    }
}
