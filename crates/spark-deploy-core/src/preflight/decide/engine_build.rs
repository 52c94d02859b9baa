//! What BuildImage's engine build needs on the head (with `engine.repo` set), decided before
//! anything is downloaded: the base image the build runs in (never pulled), and the source
//! repository reachable with the commit.

use super::NodeFacts;
use crate::preflight::report::{Check, CheckResult};

/// How the engine's source was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceProbe {
    /// The head's build checkout already holds the commit (nothing to fetch).
    InCheckout,
    /// A local repository holding the commit.
    Local,
    /// A local path that is no repository, or lacks the commit: git's words.
    LocalMissing(String),
    /// A remote repository answered `git ls-remote`; the ref whose tip is the commit, if any.
    Remote(Option<String>),
    /// `git ls-remote` failed: git's words.
    Unreachable(String),
}

/// The head's facts for the engine build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineBuildFacts {
    /// `engine.repo`.
    pub repo: String,
    /// `engine.commit`.
    pub commit: String,
    /// `engine.base_image`.
    pub base_image: String,
    /// The base image's ID in the head's Docker, `None` when absent; `Err` when Docker failed.
    pub base: Result<Option<String>, String>,
    /// The source.
    pub source: SourceProbe,
}

/// The rows: `engine.base_image` and `engine.source`.
#[must_use]
pub fn rows(node: &str, f: &EngineBuildFacts) -> Vec<CheckResult> {
    let b = &f.base_image;
    let base = match &f.base {
        Ok(Some(id)) => CheckResult::ok(
            Check::EngineBaseImage,
            node,
            format!("{b} present ({})", id.get(..19).unwrap_or(id)),
        ),
        Ok(None) => CheckResult::fail(
            Check::EngineBaseImage,
            node,
            format!("{b}, which the engine is built in, is not in {node}'s Docker"),
            format!(
                "load it on {node} (`docker load -i <file>`, or pull it on a machine with registry access and ship it), or set engine.base_image to an image {node} has — spark-deploy never pulls"
            ),
        ),
        Err(why) => CheckResult::fail(
            Check::EngineBaseImage,
            node,
            format!("inspecting {b}: {why}"),
            format!("Docker on {node} must answer `docker image inspect {b}`"),
        ),
    };
    let short: String = f.commit.chars().take(12).collect();
    let repo = &f.repo;
    let source = match &f.source {
        SourceProbe::InCheckout => CheckResult::ok(
            Check::EngineSource,
            node,
            format!("commit {short} already in the build checkout"),
        ),
        SourceProbe::Local => CheckResult::ok(
            Check::EngineSource,
            node,
            format!("{repo} holds commit {short}"),
        ),
        SourceProbe::Remote(Some(r)) => CheckResult::ok(
            Check::EngineSource,
            node,
            format!("{repo} reachable, commit {short} is {r}"),
        ),
        SourceProbe::Remote(None) => CheckResult::ok(
            Check::EngineSource,
            node,
            format!("{repo} reachable; commit {short} is no branch or tag tip, fetched by its ID"),
        ),
        SourceProbe::LocalMissing(why) => CheckResult::fail(
            Check::EngineSource,
            node,
            format!("{repo} does not hold commit {short}: {why}"),
            "set engine.repo to a repository on the head that holds engine.commit (`git -C <repo> cat-file -e <commit>` succeeds), or fix engine.commit",
        ),
        SourceProbe::Unreachable(why) => CheckResult::fail(
            Check::EngineSource,
            node,
            format!("{repo} unreachable from {node}: {why}"),
            format!(
                "`git ls-remote {repo}` must succeed on {node} without a prompt (network, credentials in git's credential helper or SSH agent), or set engine.repo to a local clone"
            ),
        ),
    };
    vec![base, source]
}

pub(super) fn decide(f: &NodeFacts, out: &mut Vec<CheckResult>) {
    if let Some(e) = &f.engine_build {
        out.extend(rows(&f.name, e));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preflight::report::Verdict;

    fn facts(base: Result<Option<String>, String>, source: SourceProbe) -> EngineBuildFacts {
        EngineBuildFacts {
            repo: "https://example.org/tensorfold.git".into(),
            commit: "59402086381a42c74d53053443224eec2790b4c5".into(),
            base_image: "nvcr.io/nvidia/pytorch:26.07-py3".into(),
            base,
            source,
        }
    }

    #[test]
    fn a_missing_base_or_an_unreachable_repo_fails_with_its_remedy() {
        let ok = rows(
            "head",
            &facts(
                Ok(Some("sha256:0123456789abcdef".into())),
                SourceProbe::Remote(Some("refs/heads/main".into())),
            ),
        );
        assert!(ok.iter().all(|r| r.verdict == Verdict::Ok), "{ok:?}");
        assert!(ok[1].observed.contains("refs/heads/main"));
        let bad = rows(
            "head",
            &facts(
                Ok(None),
                SourceProbe::Unreachable("fatal: could not read Username".into()),
            ),
        );
        assert_eq!(bad[0].verdict, Verdict::Fail);
        assert!(
            bad[0]
                .remedy
                .as_deref()
                .unwrap_or("")
                .contains("never pulls")
        );
        assert_eq!(bad[1].check, Check::EngineSource);
        assert_eq!(bad[1].verdict, Verdict::Fail);
        assert!(bad[1].observed.contains("could not read Username"));
        assert!(
            bad[1]
                .remedy
                .as_deref()
                .unwrap_or("")
                .contains("git ls-remote")
        );
        let local = rows(
            "head",
            &facts(
                Ok(Some("sha256:1".into())),
                SourceProbe::LocalMissing("bad object".into()),
            ),
        );
        assert_eq!(local[1].verdict, Verdict::Fail);
        assert!(
            local[1]
                .observed
                .contains("does not hold commit 59402086381a")
        );
    }
}
