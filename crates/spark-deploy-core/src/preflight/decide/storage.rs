//! Worker storage in `nfs` mode: the head exports the path every worker mounts read-only to that
//! worker's fabric address (the check ConfigureWorkerStorage repeats before it creates the
//! volume, [`check_exports`]), decided here before anything is downloaded.

use super::{Detected, NodeFacts, Settings};
use crate::preflight::exports::check_exports;
use crate::preflight::report::{Check, CheckResult, Finding, Verdict};

/// One row per worker (reported on the head, which must export): its export, or why it is
/// missing with the line that adds it. Nothing in `copy` mode or when the head was not reached.
pub(super) fn decide(s: &Settings, facts: &[NodeFacts], detected: &[Detected]) -> Vec<CheckResult> {
    let (Some(path), Some(head)) = (&s.nfs_export, facts.first()) else {
        return Vec::new();
    };
    let Some(exports) = &head.exports else {
        return Vec::new();
    };
    let n = head.name.as_str();
    let exports = match exports {
        Ok(t) => t,
        Err(why) => {
            return vec![CheckResult::from_finding(
                Check::NfsExport,
                n,
                Verdict::Fail,
                Finding {
                    observed: format!("reading /etc/exports on {n}: {why}"),
                    remedy: format!("/etc/exports must be readable on {n} by its user"),
                },
            )];
        }
    };
    let mut out = Vec::new();
    for (i, w) in facts.iter().enumerate().skip(1) {
        let client = detected
            .get(i)
            .and_then(|d| d.route.as_ref())
            .map(|r| r.src)
            .or(w.fabric_addr);
        let Some(client) = client else {
            out.push(CheckResult::from_finding(
                Check::NfsExport,
                n,
                Verdict::Fail,
                Finding {
                    observed: format!("the fabric address of {} is unknown", w.name),
                    remedy: format!(
                        "set nodes[{i}].fabric_addr, or fix {}'s fabric rows above",
                        w.name
                    ),
                },
            ));
            continue;
        };
        out.push(match check_exports(exports, path, client) {
            Ok(()) => CheckResult::ok(
                Check::NfsExport,
                n,
                format!("{path} exported read-only to {} ({client})", w.name),
            ),
            Err(why) => CheckResult::from_finding(
                Check::NfsExport,
                n,
                Verdict::Fail,
                Finding {
                    observed: format!(
                        "{n} does not export {path} read-only to {} ({client}): {why}",
                        w.name
                    ),
                    remedy: format!(
                        "on {n} as root: `sudo apt install nfs-kernel-server && echo '{path} {client}(ro,no_subtree_check)' | sudo tee -a /etc/exports && sudo exportfs -ra`, or set deployment.worker_storage = \"copy\""
                    ),
                },
            ),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::testing::{healthy, pair, remedy, row, seed};
    use super::super::{Settings, decide};
    use crate::preflight::report::{Check, Verdict};

    fn nfs() -> Settings {
        Settings {
            nfs_export: Some("/home/me/.cache/huggingface".into()),
            ..seed()
        }
    }

    #[test]
    fn the_heads_export_to_the_workers_fabric_address_passes() {
        let (a, b) = pair();
        let mut h = healthy(0, &a);
        h.exports = Some(Ok(
            "/home/me/.cache 198.18.0.0/24(ro,no_subtree_check)\n".to_owned()
        ));
        let d = decide(&nfs(), &[h, healthy(1, &b)]);
        let r = row(&d, Check::NfsExport, "head");
        assert_eq!(r.verdict, Verdict::Ok, "{r:?}");
        assert_eq!(
            r.observed,
            "/home/me/.cache/huggingface exported read-only to worker-1 (198.18.0.2)"
        );
        // Copy mode: no row, even without exports.
        let mut h = healthy(0, &a);
        h.exports = Some(Ok(String::new()));
        let d = decide(&seed(), &[h, healthy(1, &b)]);
        assert!(!d.results.iter().any(|r| r.check == Check::NfsExport));
    }

    #[test]
    fn a_missing_or_read_write_export_fails_with_the_line_that_fixes_it() {
        let (a, b) = pair();
        let mut h = healthy(0, &a);
        h.exports = Some(Ok(String::new()));
        let d = decide(&nfs(), &[h, healthy(1, &b)]);
        let r = row(&d, Check::NfsExport, "head");
        assert_eq!(r.verdict, Verdict::Fail, "{r:?}");
        assert_eq!(
            r.observed,
            "head does not export /home/me/.cache/huggingface read-only to worker-1 (198.18.0.2): no export of /home/me/.cache/huggingface or a parent to 198.18.0.2"
        );
        assert!(
            remedy(r).contains("echo '/home/me/.cache/huggingface 198.18.0.2(ro,no_subtree_check)' | sudo tee -a /etc/exports && sudo exportfs -ra"),
            "{r:?}"
        );
        let mut h = healthy(0, &a);
        h.exports = Some(Ok("/home/me/.cache/huggingface 198.18.0.2(rw)\n".to_owned()));
        let d = decide(&nfs(), &[h, healthy(1, &b)]);
        let r = row(&d, Check::NfsExport, "head");
        assert_eq!(r.verdict, Verdict::Fail);
        assert!(
            r.observed
                .ends_with("it is exported read-write; make it `ro`"),
            "{r:?}"
        );
        // The worker's address comes from its detected route, not only from the config.
        let mut h = healthy(0, &a);
        h.exports = Some(Ok("/home/me/.cache/huggingface 198.18.0.2(ro)\n".to_owned()));
        let mut w = healthy(1, &b);
        w.fabric_addr = None;
        let d = decide(&nfs(), &[h, w]);
        assert_eq!(row(&d, Check::NfsExport, "head").verdict, Verdict::Ok);
    }
}
