//! Ports that must be free on a node (the API on the head, the rendezvous on its fabric address).

use crate::preflight::report::{Check, CheckResult};

/// A TCP port that must be free.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortProbe {
    /// Which port check.
    pub check: Check,
    /// `addr:port`.
    pub addr: String,
    /// Binding it succeeded (or this deployment's own rank holds it).
    pub free: bool,
    /// What to do when it is in use.
    pub remedy: String,
}

pub(super) fn decide(node: &str, p: &PortProbe) -> CheckResult {
    if p.free {
        CheckResult::ok(p.check, node, format!("{} free", p.addr))
    } else {
        CheckResult::fail(
            p.check,
            node,
            format!("{} in use", p.addr),
            p.remedy.clone(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{healthy, pair, remedy, row, seed};
    use super::*;
    use crate::preflight::decide::decide as decide_all;
    use crate::preflight::report::Verdict;

    #[test]
    fn a_port_in_use_fails_with_its_remedy() {
        let (a, b) = pair();
        let mut h = healthy(0, &a);
        h.ports.push(PortProbe {
            check: Check::PortApi,
            addr: "0.0.0.0:8888".into(),
            free: false,
            remedy: "stop what listens there or change serving.port".into(),
        });
        let d = decide_all(&seed(), &[h, healthy(1, &b)]);
        let r = row(&d, Check::PortApi, "head");
        assert_eq!(r.verdict, Verdict::Fail);
        assert_eq!(r.observed, "0.0.0.0:8888 in use");
        assert!(remedy(r).contains("serving.port"));
    }
}
