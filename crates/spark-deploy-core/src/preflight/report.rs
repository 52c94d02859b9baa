//! The preflight table: check, node, observed value, verdict, remedy.

use std::fmt::{self, Write as _};

use serde::{Deserialize, Serialize};

/// A check's outcome (`ok`, `warn`, `fail` in JSON).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Fine.
    Ok,
    /// Accepted, with a risk the remedy explains.
    Warn,
    /// The deployment would fail; nothing is changed.
    Fail,
}

/// Which check a row reports. JSON and the table show the dotted names (`gpu.clocks`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Check {
    /// The head's local Exec port runs commands.
    #[serde(rename = "exec")]
    Exec,
    /// A worker's SSH login (BatchMode, host key checked).
    #[serde(rename = "ssh")]
    Ssh,
    /// Passwordless sudo (informational: non-sudo paths exist).
    #[serde(rename = "sudo")]
    Sudo,
    /// The Docker daemon answers.
    #[serde(rename = "docker")]
    Docker,
    /// The container runtime the ranks use is registered in the daemon.
    #[serde(rename = "docker.runtime")]
    DockerRuntime,
    /// No other container holds the GPU.
    #[serde(rename = "gpu.containers")]
    GpuContainers,
    /// The driver answers and names the GPU model.
    #[serde(rename = "gpu")]
    Gpu,
    /// No compute process holds the GPU.
    #[serde(rename = "gpu.processes")]
    GpuProcesses,
    /// Clock caps are equal on every node.
    #[serde(rename = "gpu.clocks")]
    GpuClocks,
    /// `MemAvailable` reaches the floor.
    #[serde(rename = "memory.available")]
    MemoryAvailable,
    /// Weights, arena, KV, RoPE and the reserve fit `MemAvailable`.
    #[serde(rename = "memory.budget")]
    MemoryBudget,
    /// `serving.context = 0`: the largest pool whose budget fits every node.
    #[serde(rename = "memory.context")]
    MemoryContext,
    /// Free space for what is still missing.
    #[serde(rename = "disk")]
    Disk,
    /// The engine binaries the image step ships are in the head's engine directory.
    #[serde(rename = "engine.binaries")]
    EngineBinaries,
    /// The base image the engine image is built `FROM` is in the head's Docker.
    #[serde(rename = "docker.base_image")]
    BaseImage,
    /// `nfs` mode: the head exports the cache read-only to the worker's fabric address.
    #[serde(rename = "storage.nfs_export")]
    NfsExport,
    /// The route to the peer leaves from the fabric address.
    #[serde(rename = "fabric.addr")]
    FabricAddr,
    /// There is a route to the peer.
    #[serde(rename = "fabric.route")]
    FabricRoute,
    /// RoCE devices ACTIVE with a RoCE v2 GID for the fabric address.
    #[serde(rename = "fabric.roce")]
    FabricRoce,
    /// The fabric MTU is the same on every node.
    #[serde(rename = "fabric.mtu")]
    FabricMtu,
    /// The API port is free on the head.
    #[serde(rename = "port.api")]
    PortApi,
    /// The rendezvous port is free on the head's fabric address.
    #[serde(rename = "port.rendezvous")]
    PortRendezvous,
    /// The image the engine is built in is present on the head.
    #[serde(rename = "engine.base_image")]
    EngineBaseImage,
    /// The engine's repository is reachable and holds the commit.
    #[serde(rename = "engine.source")]
    EngineSource,
}

impl Check {
    /// The dotted name (`gpu.clocks`), as in JSON.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Exec => "exec",
            Self::Ssh => "ssh",
            Self::Sudo => "sudo",
            Self::Docker => "docker",
            Self::DockerRuntime => "docker.runtime",
            Self::GpuContainers => "gpu.containers",
            Self::Gpu => "gpu",
            Self::GpuProcesses => "gpu.processes",
            Self::GpuClocks => "gpu.clocks",
            Self::MemoryAvailable => "memory.available",
            Self::MemoryBudget => "memory.budget",
            Self::MemoryContext => "memory.context",
            Self::Disk => "disk",
            Self::EngineBinaries => "engine.binaries",
            Self::BaseImage => "docker.base_image",
            Self::NfsExport => "storage.nfs_export",
            Self::FabricAddr => "fabric.addr",
            Self::FabricRoute => "fabric.route",
            Self::FabricRoce => "fabric.roce",
            Self::FabricMtu => "fabric.mtu",
            Self::PortApi => "port.api",
            Self::PortRendezvous => "port.rendezvous",
            Self::EngineBaseImage => "engine.base_image",
            Self::EngineSource => "engine.source",
        }
    }
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A finding with what to do about it: the observation and its remedy kept apart, so a row never
/// has to recover one from the other's text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    /// What was observed.
    pub observed: String,
    /// What to do.
    pub remedy: String,
}

/// One row of the table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckResult {
    /// Which check.
    pub check: Check,
    /// Node it ran on (`all` for cross-node checks).
    pub node: String,
    /// What was observed.
    pub observed: String,
    /// The verdict.
    pub verdict: Verdict,
    /// What to do: always present for warn and fail, absent for ok.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remedy: Option<String>,
}

impl CheckResult {
    /// A passing check.
    #[must_use]
    pub fn ok(check: Check, node: &str, observed: impl Into<String>) -> Self {
        Self {
            check,
            node: node.into(),
            observed: observed.into(),
            verdict: Verdict::Ok,
            remedy: None,
        }
    }

    /// A warning with its remedy.
    #[must_use]
    pub fn warn(
        check: Check,
        node: &str,
        observed: impl Into<String>,
        remedy: impl Into<String>,
    ) -> Self {
        Self {
            check,
            node: node.into(),
            observed: observed.into(),
            verdict: Verdict::Warn,
            remedy: Some(remedy.into()),
        }
    }

    /// A warning or failure from a [`Finding`] (its observation and remedy).
    #[must_use]
    pub fn from_finding(check: Check, node: &str, verdict: Verdict, finding: Finding) -> Self {
        Self {
            check,
            node: node.into(),
            observed: finding.observed,
            verdict,
            remedy: Some(finding.remedy),
        }
    }

    /// A failure with its remedy.
    #[must_use]
    pub fn fail(
        check: Check,
        node: &str,
        observed: impl Into<String>,
        remedy: impl Into<String>,
    ) -> Self {
        Self {
            check,
            node: node.into(),
            observed: observed.into(),
            verdict: Verdict::Fail,
            remedy: Some(remedy.into()),
        }
    }
}

/// The whole table.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
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
            w(|r| r.check.name().len(), 5),
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
                r.check.name(),
                r.node,
                r.observed,
                v,
                r.remedy.as_deref().unwrap_or("")
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_keeps_the_dotted_check_names_and_snake_case_verdicts() {
        let r = CheckResult::fail(Check::GpuClocks, "all", "x", "do y");
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["check"], "gpu.clocks");
        assert_eq!(v["verdict"], "fail");
        assert_eq!(v["remedy"], "do y");
        let back: CheckResult = serde_json::from_value(v).unwrap();
        assert_eq!(back, r);
        let ok = serde_json::to_value(CheckResult::ok(Check::PortApi, "head", "free")).unwrap();
        assert_eq!(ok["check"], "port.api");
        assert!(ok.get("remedy").is_none(), "{ok}");
        for c in [Check::DockerRuntime, Check::FabricRoce, Check::MemoryBudget] {
            assert_eq!(serde_json::to_value(c).unwrap(), c.name());
        }
    }
}
