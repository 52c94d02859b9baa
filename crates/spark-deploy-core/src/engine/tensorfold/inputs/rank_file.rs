//! The TFDSRK01 rank weight file each rank loads: index text, file name, discovery and the reader
//! rules the engine applies.

use std::fmt::Write as _;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::dtype::DType;

/// The magic word at the end of every rank file.
pub const MAGIC: &[u8; 8] = b"TFDSRK01";
/// The largest index the engine reads.
pub const MAX_INDEX_BYTES: u64 = 1 << 30;

/// Why a rank file (or its directory) was refused.
#[derive(Debug, thiserror::Error)]
pub enum RankFileError {
    /// I/O on a rank file or its directory.
    #[error("{path}: {source}; check the cache directory's permissions and free space")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A key that the format cannot hold.
    #[error(
        "index key `{}` is not ASCII; the engine refuses such keys (this is a bug in the split plan: report it with the checkpoint's config.json)",
        key.escape_debug()
    )]
    NonAsciiKey {
        /// The key.
        key: String,
    },
    /// A dtype with no torch name.
    #[error(
        "entry `{key}` has dtype {dtype}, which a TFDSRK01 file cannot hold; the checkpoint is not the EXL3 export"
    )]
    UnsupportedDType {
        /// The key.
        key: String,
        /// The dtype.
        dtype: DType,
    },
    /// The file breaks a reader rule.
    #[error("{path}: not a valid TFDSRK01 file: {problem}; delete it and rebuild the rank cache")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// Which rule.
        problem: String,
    },
    /// No rank file for this rank in the directory.
    #[error("{dir} holds no rank{rank}of{world}-*.bin; build the rank cache first")]
    NoRankFile {
        /// The directory.
        dir: PathBuf,
        /// The rank.
        rank: usize,
        /// The world.
        world: usize,
    },
    /// Two rank files for one rank: the engine refuses to start.
    #[error("{dir} holds {} files for rank {rank} of {world} ({}); the engine refuses this, remove all but one", files.len(), files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>().join(", "))]
    SeveralRankFiles {
        /// The directory.
        dir: PathBuf,
        /// The rank.
        rank: usize,
        /// The world.
        world: usize,
        /// The files found.
        files: Vec<PathBuf>,
    },
}

/// One index row: `[key, dtype, shape, offset, bytes]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexRow {
    /// The key.
    pub key: String,
    /// The dtype.
    pub dtype: DType,
    /// The shape (at most 4 dims).
    pub shape: Vec<usize>,
    /// Byte offset in the data section.
    pub offset: u64,
    /// Byte length.
    pub bytes: u64,
}

/// `` `key` DTYPE [d0, d1] at byte O, N bytes ``.
impl std::fmt::Display for IndexRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shape: Vec<String> = self.shape.iter().map(ToString::to_string).collect();
        write!(
            f,
            "`{}` {} [{}] at byte {}, {} bytes",
            self.key,
            self.dtype,
            shape.join(", "),
            self.offset,
            self.bytes
        )
    }
}

/// `s` as a JSON string the way the engine's writer escapes it (`rank_cache.zig` `jsonString`).
///
/// # Errors
/// [`RankFileError::NonAsciiKey`] for a byte above 0x7f.
pub fn json_key(s: &str) -> Result<String, RankFileError> {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for ch in s.bytes() {
        match ch {
            b'"' | b'\\' => {
                out.push('\\');
                out.push(ch as char);
            }
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            b'\t' => out.push_str("\\t"),
            0x08 => out.push_str("\\b"),
            0x0c => out.push_str("\\f"),
            0x00..=0x1f | 0x7f => {
                let _ = write!(out, "\\u{ch:04x}");
            }
            0x80..=0xff => {
                return Err(RankFileError::NonAsciiKey { key: s.to_owned() });
            }
            _ => out.push(ch as char),
        }
    }
    out.push('"');
    Ok(out)
}

/// The index JSON text, byte for byte as the engine's writer produces it.
///
/// # Errors
/// A non-ASCII key or a dtype without a torch name.
pub fn index_json<'a>(
    rows: impl IntoIterator<Item = &'a IndexRow>,
) -> Result<String, RankFileError> {
    let mut out = String::from("[");
    for (i, r) in rows.into_iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let dtype = r
            .dtype
            .torch_name()
            .ok_or_else(|| RankFileError::UnsupportedDType {
                key: r.key.clone(),
                dtype: r.dtype,
            })?;
        out.push('[');
        out.push_str(&json_key(&r.key)?);
        let _ = write!(out, ", \"{dtype}\", [");
        for (k, d) in r.shape.iter().enumerate() {
            if k > 0 {
                out.push_str(", ");
            }
            let _ = write!(out, "{d}");
        }
        let _ = write!(out, "], {}, {}]", r.offset, r.bytes);
    }
    out.push(']');
    Ok(out)
}

/// `rank{R}of{W}-{first 20 hex of sha256(index)}.bin`.
#[must_use]
pub fn file_name(rank: usize, world: usize, index: &[u8]) -> String {
    let h = crate::digest::sha256_hex(index);
    format!("rank{rank}of{world}-{}.bin", &h[..20])
}

/// `.rank{R}of{W}.partial`: the temporary name a build writes to.
#[must_use]
pub fn partial_name(rank: usize, world: usize) -> String {
    format!(".rank{rank}of{world}.partial")
}

/// The bytes after the data section: index, u64 LE data length, magic.
#[must_use]
pub fn trailer(index: &[u8], data_bytes: u64) -> Vec<u8> {
    let mut t = Vec::with_capacity(index.len() + 16);
    t.extend_from_slice(index);
    t.extend_from_slice(&data_bytes.to_le_bytes());
    t.extend_from_slice(MAGIC);
    t
}

/// Every entry in `dir` named `rank{R}of{W}-*.bin` (any file kind), sorted.
///
/// # Errors
/// The directory cannot be listed (a missing directory gives an empty list).
pub fn rank_files(dir: &Path, rank: usize, world: usize) -> Result<Vec<PathBuf>, RankFileError> {
    let prefix = format!("rank{rank}of{world}-");
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(RankFileError::Io {
                path: dir.to_path_buf(),
                source,
            });
        }
    };
    let mut out = Vec::new();
    for e in rd {
        let e = e.map_err(|source| RankFileError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(&prefix) && name.ends_with(".bin") {
            out.push(e.path());
        }
    }
    out.sort();
    Ok(out)
}

/// The one rank file the engine would load from `dir` (a regular file; symlinks are invisible to it).
///
/// # Errors
/// [`RankFileError::NoRankFile`] or [`RankFileError::SeveralRankFiles`], as the engine.
pub fn find_rank_file(dir: &Path, rank: usize, world: usize) -> Result<PathBuf, RankFileError> {
    let files: Vec<PathBuf> = rank_files(dir, rank, world)?
        .into_iter()
        .filter(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_file()))
        .collect();
    match files.len() {
        0 => Err(RankFileError::NoRankFile {
            dir: dir.to_path_buf(),
            rank,
            world,
        }),
        1 => Ok(files.into_iter().next().unwrap_or_default()),
        _ => Err(RankFileError::SeveralRankFiles {
            dir: dir.to_path_buf(),
            rank,
            world,
            files,
        }),
    }
}

/// A rank file's index as read back.
#[derive(Debug, Clone)]
pub struct RankFileIndex {
    /// The rows in file order.
    pub rows: Vec<IndexRow>,
    /// The index JSON bytes exactly as stored.
    pub json: Vec<u8>,
    /// The data section's length (the footer's offset).
    pub data_bytes: u64,
    /// The file's length.
    pub file_len: u64,
}

/// Reads a rank file's footer and index and applies the engine's reader rules.
///
/// # Errors
/// I/O errors and [`RankFileError::Malformed`] naming the broken rule.
pub fn read_index(path: &Path) -> Result<RankFileIndex, RankFileError> {
    let io = |source| RankFileError::Io {
        path: path.to_path_buf(),
        source,
    };
    let bad = |problem: String| RankFileError::Malformed {
        path: path.to_path_buf(),
        problem,
    };
    let f = crate::safe_fs::open_regular(path).map_err(io)?;
    let len = f.metadata().map_err(io)?.len();
    if len < 16 {
        return Err(bad(format!("{len} bytes long, shorter than the footer")));
    }
    let mut tail = [0u8; 16];
    f.read_exact_at(&mut tail, len - 16).map_err(io)?;
    let (at, index_len) = locate_index(len, &tail).map_err(bad)?;
    let mut json = vec![0u8; index_len];
    f.read_exact_at(&mut json, at).map_err(io)?;
    let rows = parse_index(&json, at).map_err(bad)?;
    Ok(RankFileIndex {
        rows,
        json,
        data_bytes: at,
        file_len: len,
    })
}

/// Where the index of a `file_len`-byte rank file lies, from its last 16 bytes `tail` (u64 LE
/// data length, magic): `(offset, length)`, the length at most [`MAX_INDEX_BYTES`].
///
/// # Errors
/// A message naming the broken rule: a file shorter than the footer, a wrong magic word, or a
/// data length that does not fit the file.
pub fn locate_index(file_len: u64, tail: &[u8; 16]) -> Result<(u64, usize), String> {
    let Some(room) = file_len.checked_sub(16) else {
        return Err(format!("{file_len} bytes long, shorter than the footer"));
    };
    if &tail[8..] != MAGIC {
        return Err("the last 8 bytes are not TFDSRK01".into());
    }
    let mut at = [0u8; 8];
    at.copy_from_slice(&tail[..8]);
    let at = u64::from_le_bytes(at);
    match room.checked_sub(at) {
        Some(n) if n <= MAX_INDEX_BYTES => Ok((at, usize::try_from(n).unwrap_or(usize::MAX))),
        Some(n) => Err(format!(
            "the index would be {n} bytes, more than the reader's {MAX_INDEX_BYTES}"
        )),
        None => Err(format!(
            "footer offset {at} does not fit a {file_len}-byte file"
        )),
    }
}

/// Parses index JSON under the reader rules: rows in order, back to back from 0, bytes equal to
/// the shape's size, unique keys, at most 4 dims, all inside `data_bytes`.
///
/// # Errors
/// A message naming the rule and the row.
pub fn parse_index(json: &[u8], data_bytes: u64) -> Result<Vec<IndexRow>, String> {
    let v: Value = serde_json::from_slice(json).map_err(|e| format!("index JSON: {e}"))?;
    let arr = v.as_array().ok_or("the index is not a list")?;
    let mut rows = Vec::with_capacity(arr.len());
    let mut seen = std::collections::HashSet::with_capacity(arr.len());
    let mut at = 0u64;
    for (i, row) in arr.iter().enumerate() {
        let f = row
            .as_array()
            .filter(|f| f.len() == 5)
            .ok_or_else(|| format!("row {i} is not [key, dtype, shape, offset, bytes]"))?;
        let key = f[0]
            .as_str()
            .ok_or_else(|| format!("row {i}: key is not a string"))?;
        let dtype_name = f[1]
            .as_str()
            .ok_or_else(|| format!("row {i} ({key}): dtype is not a string"))?;
        let dtype = DType::from_torch_name(dtype_name)
            .ok_or_else(|| format!("row {i} ({key}): unsupported dtype {dtype_name}"))?;
        let shape: Vec<usize> = f[2]
            .as_array()
            .ok_or_else(|| format!("row {i} ({key}): shape is not a list"))?
            .iter()
            .map(|d| d.as_u64().map(|d| d as usize))
            .collect::<Option<_>>()
            .ok_or_else(|| format!("row {i} ({key}): bad shape"))?;
        if shape.len() > 4 {
            return Err(format!("row {i} ({key}): {} dims, at most 4", shape.len()));
        }
        let offset = f[3]
            .as_u64()
            .ok_or_else(|| format!("row {i} ({key}): bad offset"))?;
        let bytes = f[4]
            .as_u64()
            .ok_or_else(|| format!("row {i} ({key}): bad byte count"))?;
        let want = crate::safetensors_header::tensor_bytes(&shape, dtype.size() * 8)
            .map_err(|e| format!("row {i} ({key}): {e}"))?;
        if want != bytes {
            return Err(format!(
                "row {i} ({key}): {bytes} bytes, its shape needs {want}"
            ));
        }
        if offset != at {
            return Err(format!(
                "row {i} ({key}): offset {offset}, the previous row ends at {at}"
            ));
        }
        let end = offset
            .checked_add(bytes)
            .filter(|end| *end <= data_bytes)
            .ok_or_else(|| {
                format!("row {i} ({key}): ends past the data section ({data_bytes} bytes)")
            })?;
        if !seen.insert(key.to_owned()) {
            return Err(format!("row {i}: key {key} appears twice"));
        }
        at = end;
        rows.push(IndexRow {
            key: key.to_owned(),
            dtype,
            shape,
            offset,
            bytes,
        });
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_text_is_byte_exact() {
        let rows = vec![
            IndexRow {
                key: "embed.weight|None".into(),
                dtype: DType::Bf16,
                shape: vec![4, 8],
                offset: 0,
                bytes: 64,
            },
            IndexRow {
                key: "layers.0.attn.wq_b|(0, 16384)|None|tr".into(),
                dtype: DType::I16,
                shape: vec![2, 3, 48],
                offset: 64,
                bytes: 576,
            },
            IndexRow {
                key: "layers.0.attn.attn_sink|torch.float32".into(),
                dtype: DType::F32,
                shape: vec![64],
                offset: 640,
                bytes: 256,
            },
        ];
        let j = index_json(&rows).unwrap();
        assert_eq!(
            j,
            "[[\"embed.weight|None\", \"bfloat16\", [4, 8], 0, 64], \
             [\"layers.0.attn.wq_b|(0, 16384)|None|tr\", \"int16\", [2, 3, 48], 64, 576], \
             [\"layers.0.attn.attn_sink|torch.float32\", \"float32\", [64], 640, 256]]"
        );
        assert_eq!(parse_index(j.as_bytes(), 896).unwrap(), rows);
        assert_eq!(
            json_key("a\"b\\c\u{1}\u{8}\u{7f}").unwrap(),
            "\"a\\\"b\\\\c\\u0001\\b\\u007f\""
        );
        assert!(json_key("é").is_err());
        assert_eq!(index_json(&[]).unwrap(), "[]");
        let name = file_name(1, 2, j.as_bytes());
        assert!(
            name.starts_with("rank1of2-")
                && name.ends_with(".bin")
                && name.len() == "rank1of2-".len() + 24
        );
    }

    #[test]
    fn reader_rules_refuse_bad_indexes() {
        for bad in [
            r#"[["a", "float32", [2], 0, 8], ["b", "float32", [2], 4, 8]]"#,
            r#"[["a", "float32", [2], 0, 8], ["b", "float32", [2], 12, 8]]"#,
            r#"[["a", "float32", [3], 0, 8]]"#,
            r#"[["a", "float32", [2], 0, 8], ["a", "float32", [2], 8, 8]]"#,
            r#"[["a", "float32", [8], 0, 32]]"#,
            r#"[["a", "float32", [1, 1, 1, 1, 2], 0, 8]]"#,
            r#"[["a", "complex64", [1], 0, 8]]"#,
            r#"{"a": 1}"#,
        ] {
            assert!(parse_index(bad.as_bytes(), 16).is_err(), "{bad}");
        }
    }

    #[test]
    fn footer_and_row_arithmetic_is_checked() {
        let tail = |at: u64| {
            let mut t = [0u8; 16];
            t[..8].copy_from_slice(&at.to_le_bytes());
            t[8..].copy_from_slice(MAGIC);
            t
        };
        assert_eq!(locate_index(40, &tail(10)), Ok((10, 14)));
        assert_eq!(locate_index(16, &tail(0)), Ok((0, 0)));
        assert!(locate_index(15, &tail(0)).is_err());
        for at in [25, u64::MAX, 1 << 63] {
            assert!(
                locate_index(40, &tail(at))
                    .unwrap_err()
                    .contains("does not fit"),
                "{at}"
            );
        }
        let big = MAX_INDEX_BYTES + 17;
        assert!(
            locate_index(big + 16, &tail(0))
                .unwrap_err()
                .contains("more than")
        );
        let mut bad = tail(0);
        bad[15] = b'2';
        assert!(locate_index(40, &bad).unwrap_err().contains("TFDSRK01"));
        // An empty tensor whose dimensions multiply past 2^64 is legitimate.
        let rows = parse_index(
            br#"[["z", "float32", [4611686018427387904, 4, 0], 0, 0], ["a", "uint8", [2], 0, 2]]"#,
            2,
        )
        .unwrap();
        assert_eq!(rows[0].bytes, 0);
        // A row whose end passes 2^64 is refused naming it (it overflowed in debug builds).
        let e = parse_index(
            br#"[["a", "uint8", [8], 0, 8], ["b", "uint8", [18446744073709551615], 8, 18446744073709551615]]"#,
            16,
        )
        .unwrap_err();
        assert!(
            e.contains("row 1 (b)") && e.contains("past the data section"),
            "{e}"
        );
        let e =
            parse_index(br#"[["a", "float32", [4611686018427387904, 4], 0, 0]]"#, 16).unwrap_err();
        assert!(e.contains("row 0 (a)") && e.contains("2^64"), "{e}");
    }
}
