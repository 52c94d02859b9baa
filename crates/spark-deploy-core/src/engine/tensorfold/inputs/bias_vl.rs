//! The image routing bias file `vision/gate_bias_vl.safetensors` every rank reads: every
//! `*.ffn.gate.bias_vl` tensor of the original checkpoint, copied byte for byte, found through its
//! `model.safetensors.index.json`; only those byte ranges are read. The layout follows the kit's
//! `make_bias_vl.py` (names sorted, `__metadata__` last, `json.dumps` spacing, space padding) so
//! the file's sha256 can match the kit's MANIFEST.

use std::collections::HashMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::safetensors_index::{SafetensorsError, ShardHeader, read_index_json, read_shard_header};

/// The `__metadata__` source string the kit's file carries.
pub const SOURCE_NOTE: &str =
    "deepseek-ai/DeepSeek-V4.1-Flash (MIT): the ffn.gate.bias_vl tensors, byte for byte";

/// Why the bias file could not be made.
#[derive(Debug, thiserror::Error)]
pub enum BiasVlError {
    /// The original checkpoint's index or a shard header was refused.
    #[error(transparent)]
    Checkpoint(#[from] SafetensorsError),
    /// No `bias_vl` tensor in the index.
    #[error(
        "{dir}: no *.ffn.gate.bias_vl tensor in model.safetensors.index.json; point at the original (not EXL3) checkpoint"
    )]
    NoTensors {
        /// The checkpoint directory.
        dir: PathBuf,
    },
    /// A tensor is not where the index says, or not F32.
    #[error(
        "tensor `{tensor}` in {shard}: {problem}; re-download the original checkpoint's index and shard"
    )]
    Tensor {
        /// The tensor.
        tensor: String,
        /// The shard.
        shard: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// Reading or writing failed.
    #[error("{path}: {source}; check the paths and free space")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// What [`write_bias_vl`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BiasVlReport {
    /// Number of tensors.
    pub tensors: usize,
    /// File length.
    pub bytes: u64,
    /// The file's sha256.
    pub sha256: String,
}

fn json_str(s: &str) -> String {
    // json.dumps with ensure_ascii: tensor names and the note are ASCII
    serde_json::to_string(s).unwrap_or_default()
}

/// One `bias_vl` tensor: its name, shape and raw little-endian F32 bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BiasTensor {
    /// Tensor name (`model.layers.N.ffn.gate.bias_vl`).
    pub name: String,
    /// Shape.
    pub shape: Vec<usize>,
    /// Raw bytes.
    pub data: Vec<u8>,
}

/// The names of every `*.ffn.gate.bias_vl` tensor in an index's weight map with their shard,
/// sorted by name (as the kit's script does).
#[must_use]
pub fn bias_names(
    weight_map: &std::collections::BTreeMap<String, String>,
) -> Vec<(String, String)> {
    weight_map
        .iter()
        .filter(|(k, _)| k.ends_with(".ffn.gate.bias_vl"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The largest routing-bias vector read from a shard: 2^16 experts of f32.
const MAX_BIAS_BYTES: u64 = 4 << 16;

/// Writes `out` from the original checkpoint in `original_dir` (its shards read locally, only the
/// tensors' byte ranges).
///
/// # Errors
/// A missing or malformed index / shard header, no `bias_vl` tensor, a tensor that is not F32, or
/// I/O errors.
pub fn write_bias_vl(original_dir: &Path, out: &Path) -> Result<BiasVlReport, BiasVlError> {
    let ix = read_index_json(&original_dir.join("model.safetensors.index.json"))?;
    let names = bias_names(&ix.weight_map);
    if names.is_empty() {
        return Err(BiasVlError::NoTensors {
            dir: original_dir.to_path_buf(),
        });
    }
    let mut headers: HashMap<&String, ShardHeader> = HashMap::new();
    let mut tensors = Vec::new();
    for (name, shard) in &names {
        if !headers.contains_key(shard) {
            headers.insert(shard, read_shard_header(&original_dir.join(shard))?);
        }
        let h = &headers[shard];
        let t = h
            .tensors
            .iter()
            .find(|t| &t.name == name)
            .ok_or_else(|| BiasVlError::Tensor {
                tensor: name.clone(),
                shard: h.shard.path.clone(),
                problem: "the shard does not hold it".into(),
            })?;
        if t.dtype_name != "F32" {
            return Err(BiasVlError::Tensor {
                tensor: name.clone(),
                shard: h.shard.path.clone(),
                problem: format!("dtype is {}, not F32", t.dtype_name),
            });
        }
        // A routing bias is one f32 per expert: a header claiming more is refused before the
        // buffer is sized from it.
        if t.shape.len() != 1 || t.len > MAX_BIAS_BYTES {
            return Err(BiasVlError::Tensor {
                tensor: name.clone(),
                shard: h.shard.path.clone(),
                problem: format!(
                    "shape {:?} ({} bytes) is not a vector of at most {} experts",
                    t.shape,
                    t.len,
                    MAX_BIAS_BYTES / 4
                ),
            });
        }
        let mut data = vec![0; t.len as usize];
        let f = crate::safe_fs::open_regular(&h.shard.path).map_err(|source| BiasVlError::Io {
            path: h.shard.path.clone(),
            source,
        })?;
        f.read_exact_at(&mut data, t.offset)
            .map_err(|source| BiasVlError::Io {
                path: h.shard.path.clone(),
                source,
            })?;
        tensors.push(BiasTensor {
            name: name.clone(),
            shape: t.shape.clone(),
            data,
        });
    }
    write_tensors(&tensors, out)
}

/// Writes `out` (atomically) from tensors read elsewhere (e.g. by byte range from the Hub), in the
/// kit's layout; `tensors` sorted by name.
///
/// # Errors
/// I/O errors.
pub fn write_tensors(tensors: &[BiasTensor], out: &Path) -> Result<BiasVlReport, BiasVlError> {
    let mut parts: Vec<String> = Vec::new();
    let mut data: Vec<u8> = Vec::new();
    for t in tensors {
        let start = data.len();
        data.extend_from_slice(&t.data);
        let shape = t
            .shape
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        parts.push(format!(
            "{}: {{\"dtype\": \"F32\", \"shape\": [{shape}], \"data_offsets\": [{start}, {}]}}",
            json_str(&t.name),
            data.len()
        ));
    }
    parts.push(format!(
        "\"__metadata__\": {{\"source\": {}}}",
        json_str(SOURCE_NOTE)
    ));
    let mut js = format!("{{{}}}", parts.join(", ")).into_bytes();
    while js.len() % 8 != 0 {
        js.push(b' ');
    }
    let mut blob = (js.len() as u64).to_le_bytes().to_vec();
    blob.extend_from_slice(&js);
    blob.extend_from_slice(&data);
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| BiasVlError::Io { path, source }
    };
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
    }
    let tmp = out.with_extension("safetensors.partial");
    crate::safe_fs::write_exclusive(&tmp, &blob).map_err(io(&tmp))?;
    std::fs::rename(&tmp, out).map_err(io(out))?;
    Ok(BiasVlReport {
        tensors: tensors.len(),
        bytes: blob.len() as u64,
        sha256: crate::digest::sha256_hex(&blob),
    })
}
