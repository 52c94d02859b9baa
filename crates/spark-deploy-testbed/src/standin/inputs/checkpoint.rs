//! The checkpoint's safetensors headers, read for the split proof's full computation.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{InputsError, read_json};

/// One tensor of a safetensors header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StTensor {
    /// safetensors dtype (`I16`, `F16`, ...).
    pub dtype: String,
    /// Shape.
    pub shape: Vec<u64>,
    /// Absolute file offset of the first byte.
    pub start: u64,
    /// Absolute file offset past the last byte.
    pub end: u64,
}

/// A parsed safetensors header (own parser: u64 LE header length, JSON, data offsets relative to
/// the end of the header).
#[derive(Debug, Clone)]
pub struct SafetensorsHeader {
    /// The file.
    pub path: PathBuf,
    /// Tensors by name.
    pub tensors: BTreeMap<String, StTensor>,
}

impl SafetensorsHeader {
    /// Parses the header of `path` (following symlinks).
    ///
    /// # Errors
    /// A message for a short file, a header over 100 MB, bad JSON or offsets past the end.
    pub fn read(path: &Path) -> Result<Self, String> {
        super::super::opened::record(path);
        let mut f = File::open(path).map_err(|e| format!("cannot open: {e}"))?;
        let len = f.metadata().map_err(|e| e.to_string())?.len();
        let mut n = [0u8; 8];
        f.read_exact(&mut n)
            .map_err(|e| format!("no header: {e}"))?;
        let n = u64::from_le_bytes(n);
        if n > 100_000_000 || n + 8 > len {
            return Err(format!(
                "header length {n} is not plausible for {len} bytes"
            ));
        }
        let mut h = vec![0u8; n as usize];
        f.read_exact(&mut h).map_err(|e| e.to_string())?;
        let v: Value = serde_json::from_slice(&h).map_err(|e| format!("header JSON: {e}"))?;
        let obj = v.as_object().ok_or("header is not an object")?;
        let base = 8 + n;
        let mut tensors = BTreeMap::new();
        for (name, t) in obj {
            if name == "__metadata__" {
                continue;
            }
            let dtype = t["dtype"].as_str().ok_or(format!("{name}: no dtype"))?;
            let shape: Vec<u64> = t["shape"]
                .as_array()
                .and_then(|a| a.iter().map(Value::as_u64).collect())
                .ok_or(format!("{name}: bad shape"))?;
            let off: Vec<u64> = t["data_offsets"]
                .as_array()
                .and_then(|a| a.iter().map(Value::as_u64).collect())
                .filter(|o: &Vec<u64>| o.len() == 2 && o[0] <= o[1])
                .ok_or(format!("{name}: bad data_offsets"))?;
            if base + off[1] > len {
                return Err(format!("{name}: data past the end of the file"));
            }
            tensors.insert(
                name.clone(),
                StTensor {
                    dtype: dtype.to_owned(),
                    shape,
                    start: base + off[0],
                    end: base + off[1],
                },
            );
        }
        Ok(Self {
            path: path.to_path_buf(),
            tensors,
        })
    }
}

/// The checkpoint in `MODEL_DIR`: `model.safetensors.index.json` and the shard headers, read on
/// demand.
#[derive(Debug)]
pub struct Checkpoint {
    dir: PathBuf,
    weight_map: BTreeMap<String, String>,
    headers: std::sync::Mutex<HashMap<String, SafetensorsHeader>>,
}

impl Checkpoint {
    /// Reads `MODEL_DIR/model.safetensors.index.json`.
    ///
    /// # Errors
    /// `BadCheckpoint` when missing or without a `weight_map`.
    pub fn open(model_dir: &Path) -> Result<Self, InputsError> {
        let p = model_dir.join("model.safetensors.index.json");
        let v = read_json(&p, "BadCheckpoint", 256 << 20)?;
        let weight_map = v["weight_map"]
            .as_object()
            .ok_or_else(|| InputsError::new("BadCheckpoint", &p, "no weight_map"))?
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
            .collect();
        Ok(Self {
            dir: model_dir.to_path_buf(),
            weight_map,
            headers: std::sync::Mutex::new(HashMap::new()),
        })
    }

    /// Reads one whole tensor: its dtype, shape and bytes.
    ///
    /// # Errors
    /// A message when the tensor is not in the index or its shard cannot be read.
    pub fn tensor(&self, name: &str) -> Result<(StTensor, Vec<u8>), String> {
        let shard = self
            .weight_map
            .get(name)
            .ok_or_else(|| format!("{name} is not in model.safetensors.index.json"))?;
        let t = {
            let mut hs = self.headers.lock().map_err(|_| "header cache poisoned")?;
            if !hs.contains_key(shard) {
                let h = SafetensorsHeader::read(&self.dir.join(shard))
                    .map_err(|e| format!("{shard}: {e}"))?;
                hs.insert(shard.clone(), h);
            }
            hs[shard]
                .tensors
                .get(name)
                .cloned()
                .ok_or_else(|| format!("{name} is not in {shard}'s header"))?
        };
        let f = File::open(self.dir.join(shard)).map_err(|e| format!("{shard}: {e}"))?;
        let mut buf = vec![0u8; (t.end - t.start) as usize];
        f.read_exact_at(&mut buf, t.start)
            .map_err(|e| format!("{shard}: {e}"))?;
        Ok((t, buf))
    }
}
