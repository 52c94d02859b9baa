//! The stand-in's own TFDSRK01 reader (docs/engine-contract.md, "The rank file"), written from the
//! format and independent of any writer in this workspace.
//!
//! Discovery: exactly one **regular** file named `rank{R}of{W}-*.bin` in the cache directory
//! (symlinks are invisible). Reading: magic, footer, JSON index, back-to-back rows, sizes, unique
//! keys, at most 4 dims, and the file name's hash = the first 20 hex digits of sha256 of the
//! index bytes.

use std::collections::HashSet;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde_json::Value;
use sha2::{Digest, Sha256};

/// Why the rank file could not be found or read.
#[derive(Debug, thiserror::Error)]
pub enum RankFileError {
    /// No regular `rank{R}of{W}-*.bin` in the directory (or the directory is missing).
    #[error("error.NoRankCache: no regular file rank{rank}of{world}-*.bin in {dir}")]
    NoRankCache {
        /// The cache directory.
        dir: PathBuf,
        /// Rank.
        rank: u32,
        /// World.
        world: u32,
    },
    /// More than one match.
    #[error("error.SeveralRankCaches: {dir} holds {files:?}; keep exactly one rank file")]
    SeveralRankCaches {
        /// The cache directory.
        dir: PathBuf,
        /// The matches.
        files: Vec<String>,
    },
    /// The file breaks a reader rule, or its name does not match its index hash.
    #[error("error.BadRankCache: {path}: {problem}")]
    BadRankCache {
        /// The file.
        path: PathBuf,
        /// Which rule.
        problem: String,
    },
    /// Reading failed.
    #[error("error.BadRankCache: cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// One index row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Index key, e.g. `layers.0.attn.wq_b|(0, 128)|None|tr`.
    pub key: String,
    /// Torch dtype name.
    pub dtype: String,
    /// Shape (≤ 4 dims).
    pub shape: Vec<u64>,
    /// Offset in the data section.
    pub offset: u64,
    /// Byte length.
    pub bytes: u64,
}

/// A range of an EXL3 part key: `None` or `(a, b)`.
pub type KeyRange = Option<(u64, u64)>;

/// The parsed parts of an EXL3 key `prefix|cols|rows|part`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exl3Key {
    /// Tensor prefix (`layers.0.attn.wq_b`).
    pub prefix: String,
    /// Column range.
    pub cols: KeyRange,
    /// Row range.
    pub rows: KeyRange,
    /// `tr`, `suh` or `svh`.
    pub part: String,
}

fn parse_range(t: &str) -> Option<KeyRange> {
    if t == "None" {
        return Some(None);
    }
    let inner = t.strip_prefix('(')?.strip_suffix(')')?;
    let (a, b) = inner.split_once(", ")?;
    Some(Some((a.parse().ok()?, b.parse().ok()?)))
}

impl Entry {
    /// The EXL3 parts of the key, when it is an EXL3 part key.
    #[must_use]
    pub fn exl3(&self) -> Option<Exl3Key> {
        let parts: Vec<&str> = self.key.split('|').collect();
        if parts.len() != 4 || !["tr", "suh", "svh"].contains(&parts[3]) {
            return None;
        }
        Some(Exl3Key {
            prefix: parts[0].to_owned(),
            cols: parse_range(parts[1])?,
            rows: parse_range(parts[2])?,
            part: parts[3].to_owned(),
        })
    }
}

/// Bytes of one element of a torch dtype name as the index spells it.
#[must_use]
pub fn dtype_size(name: &str) -> Option<u64> {
    Some(match name {
        "bfloat16" | "float16" | "int16" => 2,
        "float32" | "int32" => 4,
        "int64" => 8,
        "uint8" | "float8_e4m3fn" => 1,
        _ => return None,
    })
}

/// An opened rank file.
#[derive(Debug)]
pub struct RankFile {
    path: PathBuf,
    file: File,
    /// Rows in file order.
    pub entries: Vec<Entry>,
    /// Where the index starts (= end of the data section).
    pub data_len: u64,
    /// The index bytes.
    pub index_len: u64,
}

/// Finds the one regular file `rank{rank}of{world}-*.bin` in `dir`.
///
/// # Errors
/// [`RankFileError::NoRankCache`] (none, or `dir` unreadable) or
/// [`RankFileError::SeveralRankCaches`].
pub fn find(dir: &Path, rank: u32, world: u32) -> Result<PathBuf, RankFileError> {
    let none = || RankFileError::NoRankCache {
        dir: dir.to_path_buf(),
        rank,
        world,
    };
    let prefix = format!("rank{rank}of{world}-");
    let mut found: Vec<String> = Vec::new();
    for e in std::fs::read_dir(dir).map_err(|_| none())? {
        let Ok(e) = e else { continue };
        // DirEntry::file_type does not follow symlinks: a symlink is not a regular file
        let Ok(t) = e.file_type() else { continue };
        let name = e.file_name().to_string_lossy().into_owned();
        if t.is_file() && name.starts_with(&prefix) && name.ends_with(".bin") {
            found.push(name);
        }
    }
    found.sort();
    match found.len() {
        0 => Err(none()),
        1 => Ok(dir.join(&found[0])),
        _ => Err(RankFileError::SeveralRankCaches {
            dir: dir.to_path_buf(),
            files: found,
        }),
    }
}

const MAGIC: &[u8; 8] = b"TFDSRK01";
const MAX_INDEX: u64 = 1 << 30;

impl RankFile {
    /// Opens and checks a rank file (the reader rules, and the name's hash of the index).
    ///
    /// # Errors
    /// [`RankFileError::BadRankCache`] naming the broken rule, [`RankFileError::Io`].
    pub fn open(path: &Path) -> Result<Self, RankFileError> {
        super::opened::record(path);
        let io = |source| RankFileError::Io {
            path: path.to_path_buf(),
            source,
        };
        let bad = |problem: String| RankFileError::BadRankCache {
            path: path.to_path_buf(),
            problem,
        };
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len < 16 {
            return Err(bad(format!(
                "{len} bytes is shorter than the 16-byte footer"
            )));
        }
        let mut footer = [0u8; 16];
        file.read_exact_at(&mut footer, len - 16).map_err(io)?;
        if &footer[8..] != MAGIC {
            return Err(bad("the last 8 bytes are not TFDSRK01".into()));
        }
        let mut d = [0u8; 8];
        d.copy_from_slice(&footer[..8]);
        let data_len = u64::from_le_bytes(d);
        if data_len > len - 16 {
            return Err(bad(format!(
                "footer offset {data_len} is past the index end {}",
                len - 16
            )));
        }
        let index_len = len - 16 - data_len;
        if index_len > MAX_INDEX {
            return Err(bad(format!(
                "index JSON of {index_len} bytes exceeds 1 GiB"
            )));
        }
        let mut index =
            vec![0u8; usize::try_from(index_len).map_err(|_| bad("index too large".into()))?];
        file.read_exact_at(&mut index, data_len).map_err(io)?;
        let entries = parse_index(&index).map_err(bad)?;
        let end = entries.last().map_or(0, |e| e.offset + e.bytes);
        if end > data_len {
            return Err(bad(format!(
                "rows end at {end}, past the data section ({data_len} bytes)"
            )));
        }
        // the name: rank{R}of{W}-{first 20 hex of sha256(index)}.bin
        let hash = hex::encode(Sha256::digest(&index));
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let named = name
            .rsplit_once('-')
            .and_then(|(_, h)| h.strip_suffix(".bin"))
            .unwrap_or("");
        if named != &hash[..20] {
            return Err(bad(format!(
                "the name's hash {named:?} is not the index's sha256 prefix {}",
                &hash[..20]
            )));
        }
        Ok(Self {
            path: path.to_path_buf(),
            file,
            entries,
            data_len,
            index_len,
        })
    }

    /// The file's path.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The entry with this exact key.
    #[must_use]
    pub fn entry(&self, key: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.key == key)
    }

    /// Reads an entry's bytes.
    ///
    /// # Errors
    /// [`RankFileError::Io`].
    pub fn read(&self, e: &Entry) -> Result<Vec<u8>, RankFileError> {
        let mut buf = vec![0u8; usize::try_from(e.bytes).unwrap_or(usize::MAX)];
        self.file
            .read_exact_at(&mut buf, e.offset)
            .map_err(|source| RankFileError::Io {
                path: self.path.clone(),
                source,
            })?;
        Ok(buf)
    }
}

fn parse_index(index: &[u8]) -> Result<Vec<Entry>, String> {
    let v: Value =
        serde_json::from_slice(index).map_err(|e| format!("the index is not JSON: {e}"))?;
    let rows = v.as_array().ok_or("the index is not a JSON list")?;
    let mut out = Vec::with_capacity(rows.len());
    let mut keys = HashSet::new();
    let mut end = 0u64;
    for (i, r) in rows.iter().enumerate() {
        let r = r
            .as_array()
            .filter(|r| r.len() == 5)
            .ok_or_else(|| format!("row {i} is not [key, dtype, shape, offset, bytes]"))?;
        let key = r[0]
            .as_str()
            .ok_or_else(|| format!("row {i}: key is not a string"))?
            .to_owned();
        let dtype = r[1]
            .as_str()
            .ok_or_else(|| format!("row {i} ({key}): dtype is not a string"))?
            .to_owned();
        let size =
            dtype_size(&dtype).ok_or_else(|| format!("row {i} ({key}): unknown dtype {dtype}"))?;
        let shape: Vec<u64> = r[2]
            .as_array()
            .ok_or_else(|| format!("row {i} ({key}): shape is not a list"))?
            .iter()
            .map(Value::as_u64)
            .collect::<Option<_>>()
            .ok_or_else(|| format!("row {i} ({key}): a dimension is not an integer"))?;
        if shape.len() > 4 {
            return Err(format!(
                "row {i} ({key}): {} dimensions (at most 4)",
                shape.len()
            ));
        }
        let offset = r[3]
            .as_u64()
            .ok_or_else(|| format!("row {i} ({key}): offset is not an integer"))?;
        let bytes = r[4]
            .as_u64()
            .ok_or_else(|| format!("row {i} ({key}): bytes is not an integer"))?;
        if offset != end {
            return Err(format!(
                "row {i} ({key}): offset {offset} is not the previous row's end {end}"
            ));
        }
        let want = shape
            .iter()
            .try_fold(size, |acc, d| acc.checked_mul(*d))
            .ok_or_else(|| format!("row {i} ({key}): size overflows"))?;
        if bytes != want {
            return Err(format!(
                "row {i} ({key}): {bytes} bytes but {dtype} {shape:?} is {want}"
            ));
        }
        if !keys.insert(key.clone()) {
            return Err(format!("row {i}: duplicate key {key}"));
        }
        end = offset + bytes;
        out.push(Entry {
            key,
            dtype,
            shape,
            offset,
            bytes,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, rank: u32, index: &str, data: &[u8], name_hash: Option<&str>) -> PathBuf {
        let hash = hex::encode(Sha256::digest(index.as_bytes()));
        let name = format!("rank{rank}of2-{}.bin", name_hash.unwrap_or(&hash[..20]));
        let mut b = data.to_vec();
        b.extend_from_slice(index.as_bytes());
        b.extend_from_slice(&(data.len() as u64).to_le_bytes());
        b.extend_from_slice(MAGIC);
        let p = dir.join(name);
        std::fs::write(&p, b).unwrap();
        p
    }

    fn problem(index: &str, data_len: usize) -> String {
        let d = tempfile::tempdir().unwrap();
        let p = write(d.path(), 0, index, &vec![0u8; data_len], None);
        match RankFile::open(&p) {
            Err(RankFileError::BadRankCache { problem, .. }) => problem,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn reads_a_good_file_and_parses_exl3_keys() {
        let d = tempfile::tempdir().unwrap();
        let idx = r#"[["a|None", "bfloat16", [2, 2], 0, 8], ["w|(16, 32)|None|tr", "int16", [1, 1, 48], 8, 96]]"#;
        let p = write(d.path(), 1, idx, &[7u8; 104], None);
        assert_eq!(find(d.path(), 1, 2).unwrap(), p);
        let rf = RankFile::open(&p).unwrap();
        assert_eq!(rf.entries.len(), 2);
        let k = rf.entries[1].exl3().unwrap();
        assert_eq!(
            (k.prefix.as_str(), k.cols, k.rows),
            ("w", Some((16, 32)), None)
        );
        assert!(rf.entries[0].exl3().is_none());
        assert_eq!(rf.read(&rf.entries[0]).unwrap(), vec![7u8; 8]);
    }

    #[test]
    fn every_reader_rule_is_enforced() {
        assert!(problem(r#"[["a", "int16", [2], 2, 4]]"#, 6).contains("previous row's end"));
        assert!(problem(r#"[["a", "int16", [2], 0, 5]]"#, 5).contains("bytes but"));
        assert!(problem(r#"[["a", "int8", [2], 0, 2]]"#, 2).contains("unknown dtype"));
        assert!(problem(r#"[["a", "uint8", [1,1,1,1,1], 0, 1]]"#, 1).contains("dimensions"));
        assert!(
            problem(
                r#"[["a", "uint8", [1], 0, 1], ["a", "uint8", [1], 1, 1]]"#,
                2
            )
            .contains("duplicate")
        );
        assert!(problem(r#"[["a", "uint8", [4], 0, 4]]"#, 2).contains("past the data"));
        assert!(problem(r#"{"a": 1}"#, 0).contains("not a JSON list"));
        // footer offset past the index end
        let d = tempfile::tempdir().unwrap();
        let p = write(d.path(), 0, "[]", &[], None);
        let mut b = std::fs::read(&p).unwrap();
        let n = b.len();
        b[n - 16..n - 8].copy_from_slice(&1000u64.to_le_bytes());
        std::fs::write(&p, b).unwrap();
        assert!(matches!(
            RankFile::open(&p),
            Err(RankFileError::BadRankCache { .. })
        ));
        // a file shorter than the footer
        std::fs::write(&p, b"TFDSRK01").unwrap();
        assert!(matches!(
            RankFile::open(&p),
            Err(RankFileError::BadRankCache { .. })
        ));
    }

    #[test]
    fn discovery_sees_regular_files_only() {
        let d = tempfile::tempdir().unwrap();
        assert!(matches!(
            find(d.path(), 0, 2),
            Err(RankFileError::NoRankCache { .. })
        ));
        let p = write(d.path(), 0, "[]", &[], None);
        let other = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(&p, other.path().join("rank0of2-x.bin")).unwrap();
        assert!(matches!(
            find(other.path(), 0, 2),
            Err(RankFileError::NoRankCache { .. })
        ));
        write(d.path(), 0, "[ ]", &[], None);
        assert!(matches!(
            find(d.path(), 0, 2),
            Err(RankFileError::SeveralRankCaches { .. })
        ));
        // rank 1 of 2 and rank 0 of 4 are other files
        assert!(matches!(
            find(d.path(), 1, 2),
            Err(RankFileError::NoRankCache { .. })
        ));
    }
}
