//! A [`Sysfs`] view of a remote node: one shell script dumps the RoCE-relevant part of `/sys`
//! through the Exec port, and the dump is parsed into a map.

use std::collections::BTreeMap;

use super::roce::Sysfs;

/// The dump script: `D\t<dir>\t<entries>` and `F\t<file>\t<content>` lines. `$1` is the sysfs
/// root (the node's `sysfs_root`, default `/sys`); paths are printed as below `/sys` either way.
pub const SCRIPT: &str = r#"R="${1:-/sys}"
d() { [ -d "$1" ] && printf 'D\t/sys%s\t%s\n' "${1#"$R"}" "$(ls -1 "$1" 2>/dev/null | tr '\n' ' ')"; }
f() { [ -f "$1" ] && printf 'F\t/sys%s\t%s\n' "${1#"$R"}" "$(head -c 200 "$1" 2>/dev/null | tr '\n\t' '  ')"; }
d "$R/class/infiniband"
for n in "$R"/class/net/*; do f "$n/mtu"; d "$n/device/infiniband"; done
for h in "$R"/class/infiniband/*; do p="$h/ports/1"; f "$p/state"; d "$p/gids"; d "$p/gid_attrs/types"
  for g in "$p"/gids/*; do i=$(basename "$g"); f "$g"; f "$p/gid_attrs/types/$i"; done; done
true"#;

/// A parsed dump.
#[derive(Debug, Clone, Default)]
pub struct SysfsDump {
    files: BTreeMap<String, String>,
    dirs: BTreeMap<String, Vec<String>>,
}

impl SysfsDump {
    /// Parses the script's output.
    #[must_use]
    pub fn parse(text: &str) -> Self {
        let mut d = Self::default();
        for line in text.lines() {
            let mut parts = line.splitn(3, '\t');
            match (parts.next(), parts.next(), parts.next()) {
                (Some("F"), Some(p), Some(c)) => {
                    d.files.insert(p.to_owned(), c.trim().to_owned());
                }
                (Some("D"), Some(p), Some(c)) => {
                    let mut v: Vec<String> = c.split_whitespace().map(str::to_owned).collect();
                    v.sort();
                    d.dirs.insert(p.to_owned(), v);
                }
                _ => {}
            }
        }
        d
    }
}

impl Sysfs for SysfsDump {
    fn read(&self, path: &str) -> Option<String> {
        self.files.get(path).cloned()
    }

    fn list(&self, dir: &str) -> Vec<String> {
        self.dirs.get(dir).cloned().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_output_reads_like_the_tree() {
        // Run the real script against a tree a test built, rewriting /sys to the temp root.
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("sys");
        std::fs::create_dir_all(root.join("class/infiniband/roce0/ports/1/gids")).unwrap();
        std::fs::create_dir_all(root.join("class/infiniband/roce0/ports/1/gid_attrs/types"))
            .unwrap();
        std::fs::create_dir_all(root.join("class/net/eth9/device/infiniband/roce0")).unwrap();
        std::fs::write(root.join("class/net/eth9/mtu"), "9000\n").unwrap();
        std::fs::write(
            root.join("class/infiniband/roce0/ports/1/state"),
            "4: ACTIVE\n",
        )
        .unwrap();
        std::fs::write(
            root.join("class/infiniband/roce0/ports/1/gids/3"),
            "0000:0000:0000:0000:0000:ffff:c612:0001\n",
        )
        .unwrap();
        std::fs::write(
            root.join("class/infiniband/roce0/ports/1/gid_attrs/types/3"),
            "RoCE v2\n",
        )
        .unwrap();
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(SCRIPT)
            .arg("sh")
            .arg(&root)
            .output()
            .unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(!text.contains(t.path().to_str().unwrap()), "{text}");
        let dump = SysfsDump::parse(&text);
        let route = super::super::roce::Route {
            dev: "eth9".into(),
            src: "198.18.0.1".parse().unwrap(),
        };
        let f = super::super::roce::detect(&dump, &route).unwrap();
        assert_eq!(f.gid_index, 3);
        assert_eq!(f.mtu, Some(9000));
    }
}
