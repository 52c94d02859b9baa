//! Before anything is copied to a worker: every destination directory must be writable by the
//! SSH user and hold nothing owned by someone else (a cache written by a root container is the
//! usual failure when a node was first set up by hand). Checked on the worker through its Exec port.

use crate::ports::exec::{Cmd, Exec, ExecError};

/// A destination the SSH user cannot write, or that holds files of another owner.
#[derive(Debug, thiserror::Error)]
#[error(
    "{node}: {path} {why} (owner {owner}, SSH user {user}); remedy, on {node}: `sudo chown -R {user}: {root}` (and keep containers from writing there as root)"
)]
pub struct ForeignPath {
    /// Worker.
    pub node: String,
    /// The offending path.
    pub path: String,
    /// `is not writable` or `belongs to another user`.
    pub why: &'static str,
    /// Its owner.
    pub owner: String,
    /// The SSH user.
    pub user: String,
    /// The destination directory to fix.
    pub root: String,
}

/// Errors of the ownership check.
#[derive(Debug, thiserror::Error)]
pub enum OwnershipError {
    /// See [`ForeignPath`].
    #[error(transparent)]
    Foreign(Box<ForeignPath>),
    /// The check could not run.
    #[error("{node}: checking the ownership of the destination directories failed: {source}")]
    Exec {
        /// Worker.
        node: String,
        /// Underlying error.
        #[source]
        source: ExecError,
    },
}

/// For each directory argument: the nearest existing ancestor must be writable, and nothing below
/// it may belong to another user. Prints `NOTW|FOREIGN <tab> root <tab> path <tab> owner` lines and
/// `USER <tab> name` first.
const SCRIPT: &str = r#"me=$(id -un); uid=$(id -u); printf 'USER\t%s\n' "$me"
for d in "$@"; do
  p="$d"; while [ ! -e "$p" ]; do p=$(dirname -- "$p"); done
  [ -w "$p" ] || printf 'NOTW\t%s\t%s\t%s\n' "$d" "$p" "$(stat -c %U -- "$p")"
  [ -d "$d" ] && f=$(find "$d" ! -user "$uid" -print -quit 2>/dev/null) && [ -n "$f" ] && printf 'FOREIGN\t%s\t%s\t%s\n' "$d" "$f" "$(stat -c %U -- "$f")"
done; true"#;

/// The outermost destination directories of `paths` (parents of the files, without those below
/// another one).
#[must_use]
pub fn roots<'a>(paths: impl IntoIterator<Item = &'a std::path::Path>) -> Vec<String> {
    let mut dirs: Vec<&std::path::Path> = paths
        .into_iter()
        .filter_map(std::path::Path::parent)
        .collect();
    dirs.sort();
    dirs.dedup();
    let mut out: Vec<&std::path::Path> = Vec::new();
    for d in dirs {
        if !out.iter().any(|o| d.starts_with(o)) {
            out.push(d);
        }
    }
    out.iter().map(|d| d.display().to_string()).collect()
}

/// Checks `dirs` on worker `node`.
///
/// # Errors
///
/// [`OwnershipError::Foreign`] naming the first offending path and the `chown` that fixes it.
pub async fn check(exec: &Exec, node: &str, dirs: &[String]) -> Result<(), OwnershipError> {
    let out = exec
        .run(&Cmd::shell(SCRIPT).arg("sh").args(dirs.iter().cloned()))
        .await
        .map_err(|source| OwnershipError::Exec {
            node: node.to_owned(),
            source,
        })?;
    decide(node, &String::from_utf8_lossy(&out.stdout))
}

fn decide(node: &str, out: &str) -> Result<(), OwnershipError> {
    let mut user = String::new();
    for line in out.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        match f.as_slice() {
            ["USER", u] => user = (*u).to_owned(),
            [kind @ ("NOTW" | "FOREIGN"), root, path, owner] => {
                return Err(OwnershipError::Foreign(Box::new(ForeignPath {
                    node: node.to_owned(),
                    path: (*path).to_owned(),
                    why: if *kind == "NOTW" {
                        "is not writable"
                    } else {
                        "belongs to another user"
                    },
                    owner: (*owner).to_owned(),
                    user,
                    root: (*root).to_owned(),
                })));
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_file_of_another_owner_is_named_with_the_chown() {
        let t = tempfile::tempdir().unwrap();
        let dest = t.path().join("hf/hub");
        std::fs::create_dir_all(&dest).unwrap();
        let exec = Exec::local("worker-1");
        let dirs = vec![
            dest.display().to_string(),
            t.path().join("not/yet/made").display().to_string(),
        ];
        check(&exec, "worker-1", &dirs).await.unwrap();
        let foreign = dest.join("blob");
        std::fs::write(&foreign, b"x").unwrap();
        // Owned by a uid nobody on this machine has (the tests run as root, who may chown).
        let st = std::process::Command::new("chown")
            .args(["54321:54321", foreign.to_str().unwrap()])
            .status()
            .unwrap();
        assert!(st.success(), "this test chowns a file: it needs root");
        let e = check(&exec, "worker-1", &dirs)
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("belongs to another user"), "{e}");
        assert!(
            e.contains(&format!("sudo chown -R root: {}", dest.display())),
            "{e}"
        );
        let r = roots([
            std::path::Path::new("/d/hf/hub/m/snapshots/c/a.json"),
            std::path::Path::new("/d/hf/hub/m/snapshots/c/sub/b.json"),
            std::path::Path::new("/d/kit/k.bin"),
        ]);
        assert_eq!(r, ["/d/hf/hub/m/snapshots/c", "/d/kit"]);
        let e = decide("w", "USER\tme\nNOTW\t/data/hf\t/data\troot\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("/data is not writable (owner root, SSH user me)"),
            "{e}"
        );
        assert!(e.contains("`sudo chown -R me: /data/hf`"), "{e}");
    }
}
