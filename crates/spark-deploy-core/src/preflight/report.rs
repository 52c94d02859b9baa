//! The preflight table: check, node, observed value, verdict, remedy.

use std::fmt::Write as _;

use serde::Serialize;

/// A check's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Fine.
    Ok,
    /// Accepted, with a risk the remedy explains.
    Warn,
    /// The deployment would fail; nothing is changed.
    Fail,
}

/// One row of the table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckResult {
    /// Check name (`gpu.clocks`, `memory.available`, ...).
    pub check: String,
    /// Node it ran on (`all` for cross-node checks).
    pub node: String,
    /// What was observed.
    pub observed: String,
    /// The verdict.
    pub verdict: Verdict,
    /// What to do, for warn and fail.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remedy: Option<String>,
}

impl CheckResult {
    /// A passing check.
    #[must_use]
    pub fn ok(check: &str, node: &str, observed: impl Into<String>) -> Self {
        Self {
            check: check.into(),
            node: node.into(),
            observed: observed.into(),
            verdict: Verdict::Ok,
            remedy: None,
        }
    }

    /// A warning with its remedy.
    #[must_use]
    pub fn warn(
        check: &str,
        node: &str,
        observed: impl Into<String>,
        remedy: impl Into<String>,
    ) -> Self {
        Self {
            check: check.into(),
            node: node.into(),
            observed: observed.into(),
            verdict: Verdict::Warn,
            remedy: Some(remedy.into()),
        }
    }

    /// A failure with its remedy.
    #[must_use]
    pub fn fail(
        check: &str,
        node: &str,
        observed: impl Into<String>,
        remedy: impl Into<String>,
    ) -> Self {
        Self {
            check: check.into(),
            node: node.into(),
            observed: observed.into(),
            verdict: Verdict::Fail,
            remedy: Some(remedy.into()),
        }
    }
}

/// The whole table.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PreflightReport {
    /// Rows in check order.
    pub results: Vec<CheckResult>,
}

impl PreflightReport {
    /// The worst verdict.
    #[must_use]
    pub fn verdict(&self) -> Verdict {
        self.results
            .iter()
            .map(|r| r.verdict)
            .max()
            .unwrap_or(Verdict::Ok)
    }

    /// The rows that failed.
    #[must_use]
    pub fn failures(&self) -> Vec<&CheckResult> {
        self.results
            .iter()
            .filter(|r| r.verdict == Verdict::Fail)
            .collect()
    }

    /// A fixed-width text table.
    #[must_use]
    pub fn to_table(&self) -> String {
        let w = |f: fn(&CheckResult) -> usize, h: usize| {
            self.results.iter().map(f).max().unwrap_or(0).max(h)
        };
        let (wc, wn, wo) = (
            w(|r| r.check.len(), 5),
            w(|r| r.node.len(), 4),
            w(|r| r.observed.len().min(60), 8),
        );
        let mut s = format!(
            "{:wc$}  {:wn$}  {:wo$}  {:7}  remedy\n",
            "check", "node", "observed", "verdict"
        );
        for r in &self.results {
            let v = match r.verdict {
                Verdict::Ok => "ok",
                Verdict::Warn => "warn",
                Verdict::Fail => "FAIL",
            };
            let _ = writeln!(
                s,
                "{:wc$}  {:wn$}  {:wo$}  {:7}  {}",
                r.check,
                r.node,
                r.observed,
                v,
                r.remedy.as_deref().unwrap_or("")
            );
        }
        s
    }
}
