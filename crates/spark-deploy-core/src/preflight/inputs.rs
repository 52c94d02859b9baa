//! What the head's disk already holds of a deployment's inputs, read through its Exec port: the
//! rank files built so far and the cached checkpoint snapshot. From them (and, when nothing is
//! cached, the checkpoint's listing at the Hub) come each rank's weight bytes for the memory
//! budget and what the disks still have to receive.

use std::collections::{BTreeMap, BTreeSet};

use super::decide::{Missing, RankWeights, WeightsSource};

/// Expands a leading `~` of `$1` on the node (the other arguments kept), then runs the rest.
pub const HOME_PATH: &str =
    r#"case "$1" in "~/"*|"~") p1="$HOME${1#\~}"; shift; set -- "$p1" "$@";; esac; "#;

/// Lists the rank files in `$1/rank-cache` as `<bytes> <name>` lines.
pub const RANK_FILES_SCRIPT: &str = r#"for f in "$1"/rank-cache/rank*.bin; do [ -f "$f" ] && printf '%s %s\n' "$(stat -L -c %s -- "$f")" "${f##*/}"; done; true"#;

/// Lists the newest (or the pinned) snapshot of a model in an HF cache: `$1` cache root, `$2` repo
/// folder, `$3` revision; prints the safetensors index, a marker line, then the snapshot's entries
/// (complete files only: the HF cache links a file into the snapshot once it is whole).
pub const SNAPSHOT_SCRIPT: &str = r#"d="$1/hub/$2/snapshots"; r="$3"
[ -d "$d" ] || exit 0
[ -d "$d/$r" ] || r=$(ls -1t "$d" 2>/dev/null | head -1)
[ -n "$r" ] || exit 0
cat "$d/$r/model.safetensors.index.json" 2>/dev/null
printf '\n@@FILES@@\n'
ls -1 "$d/$r""#;

/// Lists `<relative path> <bytes>` of every file below `$1` (links followed); nothing when the
/// directory is absent.
pub const SIZES_SCRIPT: &str =
    r#"[ -d "$1" ] && find -L "$1" -type f -printf '%P %s\n' 2>/dev/null; true"#;

/// [`SIZES_SCRIPT`] of the newest (or the pinned) snapshot of a repo in an HF cache: `$1` cache
/// root, `$2` repo folder, `$3` revision.
pub const SNAPSHOT_SIZES_SCRIPT: &str = r#"d="$1/hub/$2/snapshots"; r="$3"
[ -d "$d" ] || exit 0
[ -d "$d/$r" ] || r=$(ls -1t "$d" 2>/dev/null | head -1)
[ -n "$r" ] || exit 0
find -L "$d/$r" -type f -printf '%P %s\n' 2>/dev/null; true"#;

/// Parses [`SIZES_SCRIPT`] output: relative path → bytes.
#[must_use]
pub fn parse_sizes(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|l| l.trim_end().rsplit_once(' '))
        .filter_map(|(p, s)| s.parse().ok().map(|s| (p.to_owned(), s)))
        .collect()
}

/// A tree of files the head fetches into its cache and every worker receives a copy of (the
/// Engram tables, the kit), by relative path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tree {
    /// What it is (`Engram tables`).
    pub what: String,
    /// Every file of the tree and its size, when known (the complete cache, else the Hub's
    /// listing).
    pub files: Option<BTreeMap<String, u64>>,
    /// The files the head's cache already holds.
    pub cached: BTreeMap<String, u64>,
}

impl Tree {
    /// What a directory holding `present` still has to receive: the files absent there or of
    /// another size; `None` when nothing. Unknown sizes count 0, and say so.
    #[must_use]
    pub fn missing_at(&self, present: &BTreeMap<String, u64>) -> Option<Missing> {
        let Some(files) = &self.files else {
            return Some(Missing {
                what: format!("{} (size unknown)", self.what),
                bytes: 0,
            });
        };
        let (n, bytes) = files
            .iter()
            .filter(|(p, s)| present.get(*p) != Some(*s))
            .fold((0usize, 0u64), |(n, b), (_, s)| {
                (n + 1, b.saturating_add(*s))
            });
        (n > 0).then(|| Missing {
            what: format!("{} ({n} of {} files)", self.what, files.len()),
            bytes,
        })
    }

    /// What the head's cache still has to download.
    #[must_use]
    pub fn missing_in_cache(&self) -> Option<Missing> {
        self.missing_at(&self.cached)
    }
}

/// The inputs found on the head.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeadInputs {
    /// Rank → bytes of its rank file for this world size.
    pub rank_files: BTreeMap<usize, u64>,
    /// The checkpoint index's `total_size` and its shards, when the index is cached.
    pub index: Option<(u64, BTreeSet<String>)>,
    /// The snapshot's complete files.
    pub cached: BTreeSet<String>,
}

impl HeadInputs {
    /// Parses [`RANK_FILES_SCRIPT`]'s and [`SNAPSHOT_SCRIPT`]'s outputs for `world` ranks.
    #[must_use]
    pub fn parse(rank_files: &str, snapshot: &str, world: usize) -> Self {
        let mut files = BTreeMap::new();
        for line in rank_files.lines() {
            let Some((bytes, name)) = line.trim().split_once(' ') else {
                continue;
            };
            let Ok(bytes) = bytes.parse::<u64>() else {
                continue;
            };
            let rank = (0..world).find(|r| {
                name.starts_with(&format!("rank{r}of{world}-")) && name.ends_with(".bin")
            });
            if let Some(r) = rank {
                files.insert(r, bytes);
            }
        }
        let (index, cached) = match snapshot.split_once("@@FILES@@") {
            Some((index, listing)) => (
                parse_index(index),
                listing.split_whitespace().map(str::to_owned).collect(),
            ),
            None => (None, BTreeSet::new()),
        };
        Self {
            rank_files: files,
            index,
            cached,
        }
    }

    /// The checkpoint's weight bytes, when the cached index states them.
    #[must_use]
    pub fn checkpoint_total(&self) -> Option<u64> {
        self.index.as_ref().map(|(total, _)| *total)
    }

    /// Each rank's weight bytes: its rank file when built, else the checkpoint's weights split
    /// over the ranks — from the cached index, else `listed` (the Hub's listing), else the
    /// engine profile's `estimate` for the model — else unknown.
    #[must_use]
    pub fn rank_weights(
        &self,
        world: usize,
        listed: Option<u64>,
        estimate: Option<u64>,
    ) -> Vec<Option<RankWeights>> {
        let share = |total: u64| total / world.max(1) as u64;
        let split = self
            .checkpoint_total()
            .map(|t| (share(t), WeightsSource::Checkpoint))
            .or_else(|| listed.map(|t| (share(t), WeightsSource::Hub)))
            .or_else(|| estimate.map(|b| (b, WeightsSource::ProfileEstimate)));
        (0..world)
            .map(|r| match self.rank_files.get(&r) {
                Some(&bytes) => Some(RankWeights {
                    bytes,
                    source: WeightsSource::RankFile,
                }),
                None => split.map(|(bytes, source)| RankWeights { bytes, source }),
            })
            .collect()
    }

    /// Rank files still to build on the head, each the size of its rank's weights (0 when
    /// unknown).
    #[must_use]
    pub fn missing_rank_files(&self, weights: &[Option<RankWeights>]) -> Vec<Missing> {
        weights
            .iter()
            .enumerate()
            .filter(|(r, _)| !self.rank_files.contains_key(r))
            .map(|(r, w)| Missing {
                what: format!("rank file {r}"),
                bytes: w.map_or(0, |w| w.bytes),
            })
            .collect()
    }

    /// Checkpoint bytes still to download: the shards the index lists that the snapshot lacks, pro
    /// rata of its `total_size`; without a cached index the whole checkpoint, `whole` bytes (0
    /// when unknown).
    #[must_use]
    pub fn missing_checkpoint(&self, whole: Option<u64>) -> Vec<Missing> {
        let Some((total, shards)) = &self.index else {
            return vec![Missing {
                what: match whole {
                    Some(_) => "checkpoint (not cached)".into(),
                    None => "checkpoint (not cached, size unknown)".into(),
                },
                bytes: whole.unwrap_or(0),
            }];
        };
        let missing = shards.iter().filter(|s| !self.cached.contains(*s)).count();
        if missing == 0 {
            return Vec::new();
        }
        vec![Missing {
            what: format!("checkpoint: {missing} of {} shards", shards.len()),
            bytes: total / shards.len() as u64 * missing as u64,
        }]
    }
}

/// `metadata.total_size` and the shards of a safetensors index, when it has both.
fn parse_index(text: &str) -> Option<(u64, BTreeSet<String>)> {
    let index: serde_json::Value = serde_json::from_str(text.trim()).ok()?;
    let shards: BTreeSet<String> = index["weight_map"]
        .as_object()?
        .values()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect();
    let total = index["metadata"]["total_size"].as_u64()?;
    (!shards.is_empty()).then_some((total, shards))
}

#[cfg(test)]
mod tests {
    use super::*;

    const INDEX: &str = r#"{"metadata": {"total_size": 400}, "weight_map": {
        "a.w": "model-00001-of-00004.safetensors", "b.w": "model-00002-of-00004.safetensors",
        "c.w": "model-00003-of-00004.safetensors", "d.w": "model-00004-of-00004.safetensors",
        "e.w": "model-00004-of-00004.safetensors"}}"#;

    fn run(script: &str, args: &[&str]) -> String {
        let o = std::process::Command::new("sh")
            .args(["-c", &format!("{HOME_PATH}{script}")])
            .arg("sh")
            .args(args)
            .output()
            .unwrap();
        assert!(o.status.success(), "{o:?}");
        String::from_utf8(o.stdout).unwrap()
    }

    #[test]
    fn rank_files_are_measured_and_the_rest_split_the_checkpoint() {
        let t = tempfile::tempdir().unwrap();
        let rc = t.path().join("rank-cache");
        std::fs::create_dir_all(&rc).unwrap();
        std::fs::write(
            rc.join("rank0of2-0123456789abcdef0123.bin"),
            vec![0u8; 1000],
        )
        .unwrap();
        std::fs::write(rc.join("rank1of4-ffff.bin"), b"x").unwrap();
        std::fs::write(rc.join("notes.txt"), b"x").unwrap();
        let listing = run(RANK_FILES_SCRIPT, &[t.path().to_str().unwrap()]);
        let snapshot = format!(
            "{INDEX}\n@@FILES@@\nconfig.json\nmodel-00001-of-00004.safetensors\nmodel-00003-of-00004.safetensors\n"
        );
        let inputs = HeadInputs::parse(&listing, &snapshot, 2);
        assert_eq!(inputs.rank_files, BTreeMap::from([(0, 1000)]));
        let w = inputs.rank_weights(2, Some(9_999), Some(7));
        let rank_file = RankWeights {
            bytes: 1000,
            source: WeightsSource::RankFile,
        };
        let from_index = RankWeights {
            bytes: 200,
            source: WeightsSource::Checkpoint,
        };
        assert_eq!(w, [Some(rank_file), Some(from_index)]);
        let m = inputs.missing_rank_files(&w);
        assert_eq!(
            m,
            [Missing {
                what: "rank file 1".into(),
                bytes: 200
            }]
        );
        assert_eq!(
            inputs.missing_checkpoint(None),
            [Missing {
                what: "checkpoint: 2 of 4 shards".into(),
                bytes: 200
            }]
        );
    }

    #[test]
    fn without_a_cache_the_hub_listing_then_the_profile_estimate_decide() {
        let empty = HeadInputs::parse("", "", 2);
        let hub = RankWeights {
            bytes: 50,
            source: WeightsSource::Hub,
        };
        assert_eq!(empty.rank_weights(2, Some(100), Some(7)), [Some(hub); 2]);
        let est = RankWeights {
            bytes: 7,
            source: WeightsSource::ProfileEstimate,
        };
        assert_eq!(empty.rank_weights(2, None, Some(7)), [Some(est); 2]);
        assert_eq!(empty.rank_weights(2, None, None), [None, None]);
        assert_eq!(empty.missing_checkpoint(Some(100))[0].bytes, 100);
        let unknown = &empty.missing_checkpoint(None)[0];
        assert_eq!(
            (unknown.what.as_str(), unknown.bytes),
            ("checkpoint (not cached, size unknown)", 0)
        );
        assert_eq!(empty.missing_rank_files(&[None, None])[1].bytes, 0);
        // An index without sizes does not count as cached.
        let no_total = HeadInputs::parse("", "{\"weight_map\": {\"a\": \"s\"}}\n@@FILES@@\n", 2);
        assert_eq!(no_total.checkpoint_total(), None);
    }

    #[test]
    fn a_tree_counts_what_a_directory_lacks_by_path_and_size() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("sub")).unwrap();
        std::fs::write(t.path().join("a.safetensors"), vec![0u8; 30]).unwrap();
        std::fs::write(t.path().join("sub/b.safetensors"), vec![0u8; 5]).unwrap();
        let present = parse_sizes(&run(SIZES_SCRIPT, &[t.path().to_str().unwrap()]));
        assert_eq!(
            present,
            BTreeMap::from([
                ("a.safetensors".to_owned(), 30),
                ("sub/b.safetensors".to_owned(), 5)
            ])
        );
        let tree = Tree {
            what: "Engram tables".into(),
            files: Some(BTreeMap::from([
                ("a.safetensors".to_owned(), 30),
                ("sub/b.safetensors".to_owned(), 50),
                ("c.safetensors".to_owned(), 100),
            ])),
            cached: BTreeMap::new(),
        };
        assert_eq!(
            tree.missing_at(&present),
            Some(Missing {
                what: "Engram tables (2 of 3 files)".into(),
                bytes: 150
            })
        );
        assert_eq!(tree.missing_in_cache().unwrap().bytes, 180);
        assert_eq!(tree.missing_at(tree.files.as_ref().unwrap()), None);
        let unknown = Tree {
            files: None,
            ..tree
        };
        assert_eq!(
            unknown.missing_at(&present).unwrap().what,
            "Engram tables (size unknown)"
        );
        // Absent directories list nothing.
        let gone = t.path().join("gone");
        assert!(run(SIZES_SCRIPT, &[gone.to_str().unwrap()]).is_empty());
    }

    #[test]
    fn the_snapshot_script_reads_a_real_cache_layout() {
        let t = tempfile::tempdir().unwrap();
        let snap = t.path().join("hub/models--o--m/snapshots/0123abcd");
        std::fs::create_dir_all(&snap).unwrap();
        std::fs::write(
            snap.join("model.safetensors.index.json"),
            r#"{"metadata": {"total_size": 90}, "weight_map": {"a": "s1.safetensors", "b": "s2.safetensors", "c": "s3.safetensors"}}"#,
        )
        .unwrap();
        std::fs::write(snap.join("s2.safetensors"), b"x").unwrap();
        let cache = t.path().to_str().unwrap();
        for rev in ["main", "0123abcd"] {
            let out = run(SNAPSHOT_SCRIPT, &[cache, "models--o--m", rev]);
            let m = HeadInputs::parse("", &out, 2).missing_checkpoint(None);
            assert_eq!(m[0].what, "checkpoint: 2 of 3 shards", "{rev}");
            assert_eq!(m[0].bytes, 60);
        }
        let elsewhere = t.path().join("elsewhere");
        let out = run(
            SNAPSHOT_SCRIPT,
            &[elsewhere.to_str().unwrap(), "models--o--m", "main"],
        );
        assert_eq!(HeadInputs::parse("", &out, 2).index, None);
    }
}
