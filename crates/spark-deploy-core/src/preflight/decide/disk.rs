//! Disk: free space on every filesystem that still has to receive data, against what is missing
//! there (directories on the same filesystem share its free space).

use super::{NodeFacts, gib};
use crate::preflight::report::{Check, CheckResult};

/// Something still missing on a node that needs disk space there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Missing {
    /// What it is (`rank file 1`, `checkpoint: model-00003.safetensors`).
    pub what: String,
    /// Its size in bytes (an estimate where the exact size is not known yet).
    pub bytes: u64,
}

/// A directory that receives data on a node: `df -Pk <dir or its nearest existing parent> | tail -1`
/// and what still has to land there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskFacts {
    /// The directory (`data_dir`, the HF cache).
    pub dir: String,
    /// The `df` line, or why it could not be taken.
    pub df: Result<String, String>,
    /// What is still missing there.
    pub missing: Vec<Missing>,
    /// Another directory of the node whose files are hard-linked here: on its filesystem what is
    /// missing here costs no space (the head's Engram tables, linked from its HF cache).
    pub linked_from: Option<String>,
}

/// Parses `df -Pk ... | tail -1` output into (mount point, free bytes).
#[must_use]
pub fn df_free_bytes(text: &str) -> Option<(String, u64)> {
    let line = text.lines().rev().find(|l| !l.trim().is_empty())?;
    let fields: Vec<&str> = line.split_whitespace().collect();
    let free = fields.get(3)?.parse::<u64>().ok()?.checked_mul(1024)?;
    let mount = fields.get(5..).map(|m| m.join(" ")).unwrap_or_default();
    Some((mount, free))
}

/// One filesystem: its mount point, free bytes, the directories on it and what they miss.
struct Filesystem<'a> {
    mount: String,
    free: u64,
    dirs: Vec<&'a str>,
    missing: Vec<&'a Missing>,
}

pub(super) fn decide(f: &NodeFacts, out: &mut Vec<CheckResult>) {
    let n = f.name.as_str();
    let mut fs: Vec<Filesystem<'_>> = Vec::new();
    let parse = |d: &DiskFacts| match &d.df {
        Ok(t) => df_free_bytes(t).ok_or_else(|| format!("unreadable df output {t:?}")),
        Err(e) => Err(e.clone()),
    };
    for d in &f.disks {
        let dir = d.dir.as_str();
        let parsed = parse(d);
        // Hard links of files on the same filesystem take no space.
        let linked = d.linked_from.as_ref().is_some_and(|from| {
            let from_mount = f
                .disks
                .iter()
                .find(|o| &o.dir == from)
                .and_then(|o| parse(o).ok())
                .map(|(m, _)| m);
            matches!((&parsed, from_mount), (Ok((m, _)), Some(fm)) if *m == fm)
        });
        let missing: &[Missing] = if linked { &[] } else { &d.missing };
        match parsed {
            Ok((mount, free)) => match fs.iter_mut().find(|g| g.mount == mount) {
                Some(g) => {
                    g.dirs.push(dir);
                    g.missing.extend(missing);
                }
                None => fs.push(Filesystem {
                    mount,
                    free,
                    dirs: vec![dir],
                    missing: missing.iter().collect(),
                }),
            },
            Err(e) => out.push(CheckResult::fail(
                Check::Disk,
                n,
                e,
                format!("{dir} must be creatable by the SSH user and `df -Pk {dir}` must work"),
            )),
        }
    }
    for g in fs {
        // Sizes come from listings and headers: a sum past 2^64 bytes is "more than any disk".
        let need: u64 = g
            .missing
            .iter()
            .fold(0u64, |n, m| n.saturating_add(m.bytes));
        let parts = if g.missing.is_empty() {
            "nothing missing".to_owned()
        } else {
            g.missing
                .iter()
                .map(|m| format!("{} {} GiB", m.what, gib(m.bytes)))
                .collect::<Vec<_>>()
                .join(" + ")
        };
        let observed = format!(
            "need {} GiB ({parts}), {} GiB free on {} ({})",
            gib(need),
            gib(g.free),
            g.mount,
            g.dirs.join(", ")
        );
        out.push(if need <= g.free {
            CheckResult::ok(Check::Disk, n, observed)
        } else {
            CheckResult::fail(
                Check::Disk,
                n,
                observed,
                format!(
                    "free {} GiB on {} (or point the node's data_dir / hub.cache at a larger filesystem)",
                    gib(need - g.free),
                    g.mount
                ),
            )
        });
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{GIB, healthy, pair, remedy, row, seed};
    use super::*;
    const RANK_WEIGHT_BYTES: u64 = crate::engine::limits::TENSORFOLD_DSV41
        .memory
        .rank_weights_estimate;
    use crate::preflight::decide::decide as decide_all;
    use crate::preflight::report::Verdict;

    #[test]
    fn disk_need_from_what_is_missing_above_free_space_fails() {
        let (a, b) = pair();
        let mut h = healthy(0, &a);
        let df = |mount: &str, gib_free: u64| {
            Ok(format!(
                "Filesystem 1024-blocks Used Available Capacity Mounted on\n/dev/x 3000000 1000000 {} 34% {mount}\n",
                gib_free * 1024 * 1024
            ))
        };
        h.disks = vec![
            DiskFacts {
                dir: "/data/spark-deploy".into(),
                df: df("/", 60),
                missing: vec![Missing {
                    what: "rank file 0".into(),
                    bytes: RANK_WEIGHT_BYTES,
                }],
                linked_from: None,
            },
            DiskFacts {
                dir: "/root/.cache/huggingface".into(),
                df: df("/", 60),
                missing: vec![Missing {
                    what: "checkpoint: 1 of 40 shards".into(),
                    bytes: 5 * GIB,
                }],
                linked_from: None,
            },
            DiskFacts {
                dir: "/scratch/huggingface".into(),
                df: df("/scratch", 900),
                missing: vec![Missing {
                    what: "overlay".into(),
                    bytes: 100 * GIB,
                }],
                linked_from: None,
            },
        ];
        let d = decide_all(&seed(), &[h, healthy(1, &b)]);
        let rows: Vec<&CheckResult> = d
            .results
            .iter()
            .filter(|r| r.check == Check::Disk && r.node == "head")
            .collect();
        assert_eq!(rows.len(), 2, "one row per filesystem: {rows:#?}");
        let r = rows[0];
        assert_eq!(r.verdict, Verdict::Fail, "{r:?}");
        assert_eq!(
            r.observed,
            "need 103.7 GiB (rank file 0 98.7 GiB + checkpoint: 1 of 40 shards 5.0 GiB), 60.0 GiB free on / (/data/spark-deploy, /root/.cache/huggingface)"
        );
        assert!(remedy(r).contains("free 43.7 GiB on /"), "{r:?}");
        assert_eq!(rows[1].verdict, Verdict::Ok, "{:?}", rows[1]);
        // Nothing missing: any free space is enough.
        assert_eq!(row(&d, Check::Disk, "worker-1").verdict, Verdict::Ok);
    }

    #[test]
    fn every_node_counts_its_share_and_links_on_one_filesystem_are_free() {
        let (a, b) = pair();
        let df = |mount: &str, gib_free: u64| {
            Ok(format!(
                "/dev/x 3000000 1000000 {} 34% {mount}\n",
                gib_free * 1024 * 1024
            ))
        };
        let need = |what: &str, gib: u64| Missing {
            what: what.into(),
            bytes: gib * GIB,
        };
        let head = |engram_mount: &str, engram_free: u64| {
            let mut h = healthy(0, &a);
            h.disks = vec![
                DiskFacts {
                    dir: "/data/spark-deploy".into(),
                    df: df("/", 300),
                    missing: vec![need("rank file 0", 99), need("rank file 1", 99)],
                    linked_from: None,
                },
                DiskFacts {
                    dir: "/root/.cache/huggingface".into(),
                    df: df("/", 300),
                    missing: vec![need("Engram tables", 40)],
                    linked_from: None,
                },
                DiskFacts {
                    dir: "/data/spark-deploy/engram/main".into(),
                    df: df(engram_mount, engram_free),
                    missing: vec![need("Engram tables", 40)],
                    linked_from: Some("/root/.cache/huggingface".into()),
                },
            ];
            h
        };
        let mut w = healthy(1, &b);
        w.disks = vec![
            DiskFacts {
                dir: "/data/spark-deploy".into(),
                df: df("/", 120),
                missing: vec![
                    need("rank file 1", 99),
                    need("Engram tables", 40),
                    need("kit", 1),
                ],
                linked_from: None,
            },
            DiskFacts {
                dir: "/var/lib/docker".into(),
                df: df("/", 120),
                missing: vec![need("engine image", 20)],
                linked_from: None,
            },
        ];
        let d = decide_all(&seed(), &[head("/", 300), w]);
        let r = row(&d, Check::Disk, "head");
        assert_eq!(r.verdict, Verdict::Ok, "{r:?}");
        assert!(
            r.observed.starts_with("need 238.0 GiB (rank file 0 99.0 GiB + rank file 1 99.0 GiB + Engram tables 40.0 GiB), 300.0 GiB free on /"),
            "the links cost nothing: {r:?}"
        );
        let r = row(&d, Check::Disk, "worker-1");
        assert_eq!(r.verdict, Verdict::Fail, "{r:?}");
        assert!(r.observed.starts_with("need 160.0 GiB (rank file 1 99.0 GiB + Engram tables 40.0 GiB + kit 1.0 GiB + engine image 20.0 GiB), 120.0 GiB free on / (/data/spark-deploy, /var/lib/docker)"), "{r:?}");
        assert!(remedy(r).starts_with("free 40.0 GiB on /"), "{r:?}");
        // On another filesystem the linked files are copies, and count there.
        let d = decide_all(&seed(), &[head("/data", 30), healthy(1, &b)]);
        let rows: Vec<_> = d
            .results
            .iter()
            .filter(|r| r.check == Check::Disk && r.node == "head")
            .collect();
        assert_eq!(rows[1].verdict, Verdict::Fail, "{rows:?}");
        assert!(
            rows[1].observed.contains("Engram tables 40.0 GiB"),
            "{rows:?}"
        );
    }

    #[test]
    fn unreadable_df_fails_naming_the_directory() {
        let (a, b) = pair();
        let mut h = healthy(0, &a);
        h.disks[0].df = Ok("garbage".into());
        let d = decide_all(&seed(), &[h, healthy(1, &b)]);
        let r = row(&d, Check::Disk, "head");
        assert_eq!(r.verdict, Verdict::Fail);
        assert!(remedy(r).contains("df -Pk /data/spark-deploy"), "{r:?}");
    }

    #[test]
    fn free_space_and_missing_sums_past_2_to_the_64_never_wrap() {
        let max_kib = u64::MAX / 1024;
        let line = |k: u64| format!("/dev/x 1 2 {k} 3% /\n");
        assert_eq!(
            df_free_bytes(&line(max_kib)),
            Some(("/".into(), max_kib * 1024))
        );
        assert_eq!(df_free_bytes(&line(max_kib + 1)), None);
        assert_eq!(df_free_bytes(&line(u64::MAX)), None);
        // Two missing files of 2^63 bytes each: more than any disk, not a wrapped small number.
        let (a, _b) = pair();
        let mut h = healthy(0, &a);
        h.disks = vec![DiskFacts {
            dir: "/data/spark-deploy".into(),
            df: Ok(line(1 << 40)),
            missing: vec![
                Missing {
                    what: "a".into(),
                    bytes: 1 << 63,
                },
                Missing {
                    what: "b".into(),
                    bytes: 1 << 63,
                },
            ],
            linked_from: None,
        }];
        let d = decide_all(&seed(), &[h]);
        let r = row(&d, Check::Disk, "head");
        assert_eq!(r.verdict, Verdict::Fail, "{r:?}");
    }
}
