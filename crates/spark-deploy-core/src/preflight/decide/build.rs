//! What the image step needs on the head, decided before anything is downloaded: the engine
//! binaries it ships from the head's engine directory, and the base image it builds `FROM` in the
//! head's Docker (never pulled).

use super::{NodeFacts, Settings, gib};
use crate::preflight::report::{Check, CheckResult, Finding, Verdict};

/// The engine binaries of the head: its engine directory and, per binary, whether it is a file
/// there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineFiles {
    /// The head's engine directory (`<data_dir>/engine/<commit>`).
    pub dir: String,
    /// Each binary the engine names, and whether it is there; `Err` when the directory could not
    /// be read.
    pub found: Result<Vec<(String, bool)>, String>,
}

/// The engine binaries row: every one present, or the missing ones with how to build them.
#[must_use]
pub fn engine_binaries(s: &Settings, node: &str, e: &EngineFiles) -> CheckResult {
    let build = format!(
        "build engine {} (`zig build install native ...` in a throwaway container of {}, see docs/engine-contract.md) into {} on {node}",
        s.engine_commit, s.base_image, e.dir
    );
    let found = match &e.found {
        Ok(f) => f,
        Err(why) => {
            return CheckResult::from_finding(
                Check::EngineBinaries,
                node,
                Verdict::Fail,
                Finding {
                    observed: format!("{} unreadable: {why}", e.dir),
                    remedy: build,
                },
            );
        }
    };
    let missing: Vec<&str> = found
        .iter()
        .filter(|(_, there)| !there)
        .map(|(b, _)| b.as_str())
        .collect();
    if missing.is_empty() {
        let names: Vec<&str> = found.iter().map(|(b, _)| b.as_str()).collect();
        return CheckResult::ok(
            Check::EngineBinaries,
            node,
            format!("{} in {}", names.join(", "), e.dir),
        );
    }
    CheckResult::from_finding(
        Check::EngineBinaries,
        node,
        Verdict::Fail,
        Finding {
            observed: format!(
                "missing on {node}: {}",
                missing
                    .iter()
                    .map(|b| format!("{}/{b}", e.dir))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            remedy: build,
        },
    )
}

/// The base image row: present in the head's daemon, absent, or the daemon did not answer.
#[must_use]
pub fn base_image(s: &Settings, node: &str, probe: &Result<Option<u64>, String>) -> CheckResult {
    let b = &s.base_image;
    match probe {
        Ok(Some(size)) => CheckResult::ok(
            Check::BaseImage,
            node,
            format!("{b} present ({} GiB)", gib(*size)),
        ),
        Ok(None) => CheckResult::from_finding(
            Check::BaseImage,
            node,
            Verdict::Fail,
            Finding {
                observed: format!("{b} is not in {node}'s Docker"),
                remedy: format!(
                    "load it on {node} (`docker load -i <file>`, or pull {b} on a machine with registry access and ship it), or set engine.base_image to an image {node} has — spark-deploy never pulls"
                ),
            },
        ),
        Err(why) => CheckResult::from_finding(
            Check::BaseImage,
            node,
            Verdict::Fail,
            Finding {
                observed: format!("inspecting {b}: {why}"),
                remedy: format!("Docker on {node} must answer `docker image inspect {b}`"),
            },
        ),
    }
}

pub(super) fn decide(s: &Settings, f: &NodeFacts, out: &mut Vec<CheckResult>) {
    // With `engine.repo` set, BuildImage builds the binaries; its own rows (`engine_build`) check
    // the base image and the source instead.
    if f.engine_build.is_some() {
        return;
    }
    if let Some(e) = &f.engine_files {
        out.push(engine_binaries(s, &f.name, e));
    }
    if let Some(probe) = &f.base_image {
        out.push(base_image(s, &f.name, probe));
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{GIB, healthy, pair, remedy, row, seed};
    use crate::preflight::decide::decide;
    use crate::preflight::report::{Check, Verdict};

    #[test]
    fn present_binaries_and_base_image_pass() {
        let (a, b) = pair();
        let d = decide(&seed(), &[healthy(0, &a), healthy(1, &b)]);
        let r = row(&d, Check::EngineBinaries, "head");
        assert_eq!(r.verdict, Verdict::Ok, "{r:?}");
        assert_eq!(
            r.observed,
            "tensorfold-native, tf-dsv41-lanes in /data/spark-deploy/engine/0123456789ab"
        );
        let r = row(&d, Check::BaseImage, "head");
        assert_eq!(r.verdict, Verdict::Ok, "{r:?}");
        assert_eq!(
            r.observed,
            "nvcr.io/nvidia/pytorch:25.09-py3 present (7.0 GiB)"
        );
        // Only the head builds the image.
        assert!(
            !d.results.iter().any(|r| r.node == "worker-1"
                && matches!(r.check, Check::EngineBinaries | Check::BaseImage))
        );
    }

    #[test]
    fn a_missing_binary_fails_naming_the_file_and_how_to_build_it() {
        let (a, b) = pair();
        let mut h = healthy(0, &a);
        if let Some(e) = h.engine_files.as_mut()
            && let Ok(found) = e.found.as_mut()
        {
            found[1].1 = false;
        }
        let d = decide(&seed(), &[h, healthy(1, &b)]);
        let r = row(&d, Check::EngineBinaries, "head");
        assert_eq!(r.verdict, Verdict::Fail, "{r:?}");
        assert_eq!(
            r.observed,
            "missing on head: /data/spark-deploy/engine/0123456789ab/tf-dsv41-lanes"
        );
        assert!(
            remedy(r).starts_with("build engine 0123456789abcdef")
                && remedy(r).ends_with("into /data/spark-deploy/engine/0123456789ab on head"),
            "{r:?}"
        );
    }

    #[test]
    fn a_missing_base_image_fails_saying_it_is_never_pulled() {
        let (a, b) = pair();
        let mut h = healthy(0, &a);
        h.base_image = Some(Ok(None));
        let d = decide(&seed(), &[h, healthy(1, &b)]);
        let r = row(&d, Check::BaseImage, "head");
        assert_eq!(r.verdict, Verdict::Fail, "{r:?}");
        assert_eq!(
            r.observed,
            "nvcr.io/nvidia/pytorch:25.09-py3 is not in head's Docker"
        );
        assert!(remedy(r).contains("docker load -i"), "{r:?}");
        assert!(remedy(r).contains("never pulls"), "{r:?}");
        let mut h = healthy(0, &a);
        h.base_image = Some(Err("connection refused".into()));
        let d = decide(&seed(), &[h, healthy(1, &b)]);
        let r = row(&d, Check::BaseImage, "head");
        assert_eq!(r.verdict, Verdict::Fail);
        assert!(remedy(r).contains("docker image inspect"), "{r:?}");
        let _ = GIB;
    }
}
