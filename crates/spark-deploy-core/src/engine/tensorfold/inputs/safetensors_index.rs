//! Safetensors shard headers and `model.safetensors.index.json`: where every tensor's bytes lie.
//! Only headers are read (8 + N bytes a shard); tensor data is never touched here.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::dtype::DType;
use crate::safetensors_header::{self, HeaderError, ReadError};

/// Why a shard header or the index json was refused.
#[derive(Debug, thiserror::Error)]
pub enum SafetensorsError {
    /// A file could not be opened or read.
    #[error("cannot read {path}: {source}; check the path and that the download finished")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A shard's header is malformed.
    #[error("{path}: bad safetensors header: {problem}; re-download this shard")]
    Header {
        /// The shard.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// A shard is shorter or longer than its header says.
    #[error(
        "{path}: the header describes {expected} bytes but the file has {found}; the shard is truncated or still downloading, re-download it"
    )]
    Length {
        /// The shard.
        path: PathBuf,
        /// The length the header implies.
        expected: u64,
        /// The file's length.
        found: u64,
    },
    /// `model.safetensors.index.json` is malformed.
    #[error("{path}: bad index json: {problem}; re-download model.safetensors.index.json")]
    IndexJson {
        /// The index file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// The index json and the shards disagree.
    #[error(
        "tensor `{tensor}`: the index json names shard {shard} but {problem}; the checkpoint is incomplete or mixed from two revisions, re-download it"
    )]
    IndexMismatch {
        /// The tensor.
        tensor: String,
        /// The shard the index names.
        shard: String,
        /// What is wrong.
        problem: String,
    },
    /// One tensor name in two shards.
    #[error(
        "tensor `{tensor}` is in both {first} and {second}; remove stray shards from the model directory"
    )]
    Duplicate {
        /// The tensor.
        tensor: String,
        /// The first shard.
        first: PathBuf,
        /// The second shard.
        second: PathBuf,
    },
    /// No shard in the directory.
    #[error("{dir} holds no *.safetensors file; download the checkpoint first")]
    Empty {
        /// The directory.
        dir: PathBuf,
    },
}

/// One tensor of a shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Its name.
    pub name: String,
    /// The header's dtype name (`"BF16"`, ...).
    pub dtype_name: String,
    /// The dtype, when supported.
    pub dtype: Option<DType>,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Index of its shard in [`Checkpoint::shards`].
    pub shard: usize,
    /// Absolute byte offset in the shard file.
    pub offset: u64,
    /// Byte length.
    pub len: u64,
}

/// A shard file and its header size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shard {
    /// The file.
    pub path: PathBuf,
    /// Its length in bytes.
    pub len: u64,
    /// `8 + N`: where the data section starts.
    pub data_start: u64,
}

/// A parsed shard header: its tensors in offset order.
#[derive(Debug, Clone)]
pub struct ShardHeader {
    /// The shard.
    pub shard: Shard,
    /// `__metadata__`, if any.
    pub metadata: BTreeMap<String, String>,
    /// Tensors in data order; `shard` fields are 0.
    pub tensors: Vec<TensorInfo>,
}

/// Reads and validates one shard's header (see [`crate::safetensors_header`]).
///
/// # Errors
/// I/O errors, a malformed header, overlapping or gapped data, a size that disagrees with a
/// tensor's shape, or a file length other than `8 + N + data`.
pub fn read_shard_header(path: &Path) -> Result<ShardHeader, SafetensorsError> {
    let (header, file_len) = safetensors_header::read(path).map_err(|e| match e {
        ReadError::Io { path, source } => SafetensorsError::Io { path, source },
        ReadError::Header {
            path,
            problem: HeaderError::FileLength { expected, found },
        } => SafetensorsError::Length {
            path,
            expected,
            found,
        },
        ReadError::Header { path, problem } => SafetensorsError::Header {
            path,
            problem: problem.to_string(),
        },
    })?;
    shard_header(path, header, file_len)
}

/// A validated header of the `file_len`-byte shard at `path` (only named in errors) as the
/// checkpoint's tensors: absolute offsets, in checked arithmetic.
///
/// # Errors
/// [`SafetensorsError::Header`] when a tensor's range does not fit in 64 bits or ends before it
/// begins, [`SafetensorsError::Length`] when the data section does not end at `file_len`.
pub fn shard_header(
    path: &Path,
    header: safetensors_header::Header,
    file_len: u64,
) -> Result<ShardHeader, SafetensorsError> {
    let data_start = header.data_start();
    let expected = data_start.checked_add(header.data_len());
    if expected != Some(file_len) {
        return Err(SafetensorsError::Length {
            path: path.to_path_buf(),
            expected: expected.unwrap_or(u64::MAX),
            found: file_len,
        });
    }
    let tensors = header
        .tensors
        .into_iter()
        .map(|t| {
            let (begin, end) = t.data_offsets;
            let offset = data_start.checked_add(begin);
            match (offset, end.checked_sub(begin)) {
                (Some(offset), Some(len)) => Ok(TensorInfo {
                    dtype: DType::from_safetensors(&t.dtype),
                    dtype_name: t.dtype,
                    name: t.name,
                    shape: t.shape,
                    shard: 0,
                    offset,
                    len,
                }),
                _ => Err(SafetensorsError::Header {
                    path: path.to_path_buf(),
                    problem: format!(
                        "tensor `{}`: data_offsets [{begin}, {end}] do not fit the file",
                        t.name
                    ),
                }),
            }
        })
        .collect::<Result<_, _>>()?;
    Ok(ShardHeader {
        shard: Shard {
            path: path.to_path_buf(),
            len: file_len,
            data_start,
        },
        metadata: header.metadata,
        tensors,
    })
}

/// `model.safetensors.index.json`: tensor name to shard file name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexJson {
    /// `metadata.total_size`, if present.
    pub total_size: Option<u64>,
    /// `weight_map`.
    pub weight_map: BTreeMap<String, String>,
}

/// Reads `model.safetensors.index.json`.
///
/// # Errors
/// I/O errors or a file without a `weight_map` object of strings.
pub fn read_index_json(path: &Path) -> Result<IndexJson, SafetensorsError> {
    let text = crate::safe_fs::read_capped(path, crate::safe_fs::JSON_CAP).map_err(|source| {
        SafetensorsError::Io {
            path: path.to_path_buf(),
            source,
        }
    })?;
    let bad = |problem: &str| SafetensorsError::IndexJson {
        path: path.to_path_buf(),
        problem: problem.to_owned(),
    };
    let v: Value = serde_json::from_slice(&text).map_err(|e| bad(&e.to_string()))?;
    let map = v
        .get("weight_map")
        .and_then(Value::as_object)
        .ok_or_else(|| bad("no weight_map object"))?;
    let weight_map = map
        .iter()
        .map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_owned())))
        .collect::<Option<BTreeMap<_, _>>>()
        .ok_or_else(|| bad("a weight_map value is not a string"))?;
    let total_size = v
        .get("metadata")
        .and_then(|m| m.get("total_size"))
        .and_then(Value::as_u64);
    Ok(IndexJson {
        total_size,
        weight_map,
    })
}

/// Every tensor of a checkpoint directory, by name, with its byte range.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    /// The shard files (sorted by path); overlay files come last.
    pub shards: Vec<Shard>,
    tensors: HashMap<String, TensorInfo>,
    /// Index of the first overlay shard, if any.
    overlay_from: Option<usize>,
}

impl Checkpoint {
    /// Opens every `*.safetensors` in `dir` (as the engine does) and, when
    /// `model.safetensors.index.json` is present, checks that every tensor it names is in the shard
    /// it names.
    ///
    /// # Errors
    /// Any [`SafetensorsError`]: unreadable or malformed shards, a duplicate tensor, an index json
    /// that disagrees with the shards, or no shard at all.
    pub fn open_dir(dir: &Path) -> Result<Self, SafetensorsError> {
        let mut paths = safetensors_files(dir)?;
        paths.sort();
        if paths.is_empty() {
            return Err(SafetensorsError::Empty {
                dir: dir.to_path_buf(),
            });
        }
        let headers = paths
            .iter()
            .map(|p| read_shard_header(p))
            .collect::<Result<Vec<_>, _>>()?;
        let index = dir.join("model.safetensors.index.json");
        let index = if index.exists() {
            Some(read_index_json(&index)?)
        } else {
            None
        };
        Self::from_headers(dir, headers, index.as_ref())
    }

    /// The checkpoint of shard headers read elsewhere (by byte range from the Hub, before the
    /// shards arrive): as [`Checkpoint::open_dir`] over files with these headers, each shard's
    /// `path` being where the file will be.
    ///
    /// # Errors
    /// As [`Checkpoint::open_dir`]: no shard, a duplicate tensor, an index that disagrees.
    pub fn from_headers(
        dir: &Path,
        mut headers: Vec<ShardHeader>,
        index: Option<&IndexJson>,
    ) -> Result<Self, SafetensorsError> {
        headers.sort_by(|a, b| a.shard.path.cmp(&b.shard.path));
        if headers.is_empty() {
            return Err(SafetensorsError::Empty {
                dir: dir.to_path_buf(),
            });
        }
        let mut ck = Checkpoint {
            shards: Vec::new(),
            tensors: HashMap::new(),
            overlay_from: None,
        };
        for h in headers {
            ck.add_header(h, false)?;
        }
        if let Some(ix) = index {
            for (tensor, shard) in &ix.weight_map {
                let Some(t) = ck.tensors.get(tensor) else {
                    return Err(SafetensorsError::IndexMismatch {
                        tensor: tensor.clone(),
                        shard: shard.clone(),
                        problem: "no shard holds it".into(),
                    });
                };
                let actual = &ck.shards[t.shard].path;
                if actual.file_name().and_then(|n| n.to_str()) != Some(shard.as_str()) {
                    return Err(SafetensorsError::IndexMismatch {
                        tensor: tensor.clone(),
                        shard: shard.clone(),
                        problem: format!("it is in {}", actual.display()),
                    });
                }
            }
        }
        Ok(ck)
    }

    /// Replaces base tensors by the overlay's (a safetensors file, or a directory of them): the
    /// `ABLIT` mode. Overlay tensors that the base lacks are added.
    ///
    /// # Errors
    /// An unreadable or malformed overlay file, or a tensor in two overlay files.
    pub fn with_overlay(mut self, overlay: &Path) -> Result<Self, SafetensorsError> {
        let mut paths = if overlay.is_dir() {
            safetensors_files(overlay)?
        } else {
            vec![overlay.to_path_buf()]
        };
        paths.sort();
        self.overlay_from.get_or_insert(self.shards.len());
        for p in &paths {
            self.add_shard(p, true)?;
        }
        Ok(self)
    }

    fn add_shard(&mut self, path: &Path, replace: bool) -> Result<(), SafetensorsError> {
        self.add_header(read_shard_header(path)?, replace)
    }

    fn add_header(&mut self, h: ShardHeader, replace: bool) -> Result<(), SafetensorsError> {
        let path = h.shard.path.clone();
        let idx = self.shards.len();
        self.shards.push(h.shard);
        let overlay_from = self.overlay_from.unwrap_or(usize::MAX);
        for mut t in h.tensors {
            t.shard = idx;
            if let Some(prev) = self.tensors.get(&t.name) {
                // a base tensor may be replaced by an overlay; nothing else may appear twice
                if !replace || prev.shard >= overlay_from {
                    return Err(SafetensorsError::Duplicate {
                        tensor: t.name.clone(),
                        first: self.shards[prev.shard].path.clone(),
                        second: path.clone(),
                    });
                }
            }
            self.tensors.insert(t.name.clone(), t);
        }
        Ok(())
    }

    /// Whether `header` (read from the file at shard `index`) describes that shard as this
    /// checkpoint has it: the same length, data start and tensors at the same ranges.
    ///
    /// # Errors
    /// The first difference, in words.
    pub fn matches_header(&self, index: usize, header: &ShardHeader) -> Result<(), String> {
        let Some(shard) = self.shards.get(index) else {
            return Err(format!("no shard {index}"));
        };
        if (shard.len, shard.data_start) != (header.shard.len, header.shard.data_start) {
            return Err(format!(
                "{} bytes with data from {}, planned {} with data from {}",
                header.shard.len, header.shard.data_start, shard.len, shard.data_start
            ));
        }
        let planned = self.tensors.values().filter(|t| t.shard == index).count();
        if planned != header.tensors.len() {
            return Err(format!(
                "{} tensors, planned {planned}",
                header.tensors.len()
            ));
        }
        for t in &header.tensors {
            let same = self.tensors.get(&t.name).is_some_and(|p| {
                p.shard == index
                    && (p.offset, p.len) == (t.offset, t.len)
                    && p.dtype_name == t.dtype_name
                    && p.shape == t.shape
            });
            if !same {
                return Err(format!("tensor `{}` differs", t.name));
            }
        }
        Ok(())
    }

    /// The tensor named `name`.
    #[must_use]
    pub fn get(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.get(name)
    }

    /// Number of tensors.
    #[must_use]
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// Whether there is no tensor.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// Every tensor, in no particular order.
    pub fn tensors(&self) -> impl Iterator<Item = &TensorInfo> {
        self.tensors.values()
    }
}

fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>, SafetensorsError> {
    let rd = std::fs::read_dir(dir).map_err(|source| SafetensorsError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut out = Vec::new();
    for e in rd {
        let e = e.map_err(|source| SafetensorsError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let p = e.path();
        if p.extension().and_then(|x| x.to_str()) == Some("safetensors") {
            out.push(p);
        }
    }
    Ok(out)
}

/// Builds a safetensors header for `tensors` (name, dtype, shape) in the given order, padded with
/// spaces to a multiple of 8, with the 8-byte length prefix. Returns the header bytes and each
/// tensor's `(begin, end)` relative to the data section.
#[must_use]
pub fn build_header(
    tensors: &[(String, DType, Vec<usize>)],
    metadata: Option<&BTreeMap<String, String>>,
) -> (Vec<u8>, Vec<(u64, u64)>) {
    let mut obj = serde_json::Map::new();
    if let Some(m) = metadata {
        obj.insert(
            "__metadata__".into(),
            Value::Object(
                m.iter()
                    .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                    .collect(),
            ),
        );
    }
    let mut at = 0u64;
    let mut ranges = Vec::with_capacity(tensors.len());
    for (name, dtype, shape) in tensors {
        // A shape too large for 64 bits is written as 2^64 - 1 bytes, which the reader refuses.
        let len = safetensors_header::tensor_bytes(shape, dtype.size() * 8).unwrap_or(u64::MAX);
        obj.insert(
            name.clone(),
            serde_json::json!({"dtype": dtype.safetensors_name(), "shape": shape, "data_offsets": [at, at.saturating_add(len)]}),
        );
        ranges.push((at, at.saturating_add(len)));
        at = at.saturating_add(len);
    }
    let mut text = serde_json::to_vec(&Value::Object(obj)).unwrap_or_default();
    while !text.len().is_multiple_of(8) {
        text.push(b' ');
    }
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    (out, ranges)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, tensors: &[(String, DType, Vec<usize>)], fill: u8) {
        let (h, r) = build_header(tensors, None);
        let mut bytes = h;
        let total = r.last().map_or(0, |x| x.1);
        bytes.extend(std::iter::repeat_n(fill, total as usize));
        std::fs::write(path, bytes).unwrap();
    }

    #[test]
    fn headers_index_and_overlay() {
        let d = tempfile::tempdir().unwrap();
        write(
            &d.path().join("model-00001-of-00002.safetensors"),
            &[
                ("a".into(), DType::F32, vec![2, 3]),
                ("b".into(), DType::Bf16, vec![5]),
            ],
            1,
        );
        write(
            &d.path().join("model-00002-of-00002.safetensors"),
            &[("c".into(), DType::I16, vec![4])],
            2,
        );
        std::fs::write(
            d.path().join("model.safetensors.index.json"),
            r#"{"metadata":{"total_size":42},"weight_map":{"a":"model-00001-of-00002.safetensors","c":"model-00002-of-00002.safetensors"}}"#,
        )
        .unwrap();
        let ck = Checkpoint::open_dir(d.path()).unwrap();
        assert_eq!(ck.len(), 3);
        let b = ck.get("b").unwrap();
        assert_eq!(b.len, 10);
        assert_eq!(b.offset, ck.shards[0].data_start + 24);

        let ov = d.path().join("ov");
        std::fs::create_dir(&ov).unwrap();
        write(
            &ov.join("x.safetensors"),
            &[("b".into(), DType::Bf16, vec![5])],
            9,
        );
        let ck = ck.with_overlay(&ov.join("x.safetensors")).unwrap();
        assert_eq!(ck.get("b").unwrap().shard, 2);

        // the index names the wrong shard
        std::fs::write(
            d.path().join("model.safetensors.index.json"),
            r#"{"weight_map":{"a":"model-00002-of-00002.safetensors"}}"#,
        )
        .unwrap();
        let e = Checkpoint::open_dir(d.path()).unwrap_err();
        assert!(matches!(e, SafetensorsError::IndexMismatch { .. }), "{e}");
    }

    #[test]
    fn truncated_shard_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("s.safetensors");
        write(&p, &[("a".into(), DType::F32, vec![8])], 0);
        let bytes = std::fs::read(&p).unwrap();
        std::fs::write(&p, &bytes[..bytes.len() - 1]).unwrap();
        let e = read_shard_header(&p).unwrap_err();
        assert!(matches!(e, SafetensorsError::Length { .. }), "{e}");
    }
}
