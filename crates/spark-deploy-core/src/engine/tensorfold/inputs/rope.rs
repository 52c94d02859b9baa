//! RoPE tables: `rope-{plain,compressed}-{cos,sin}.f32`, raw little-endian
//! fp32 `[rows, rope_dim / 2]`, and `rope.json` with their sha256.
//!
//! Computed natively in fp32: YaRN-scaled inverse frequencies ([`RopeParams::freqs`]), then
//! `cos`/`sin` of `position × frequency` per row. Torch's own `pow`/`cos`/`sin` decide the last
//! bits of the published tables, so when the kit ships a `rope.json` the generated files are
//! compared with its hashes and refused on a mismatch (use the kit's published tables then).

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::model_config::ModelConfig;

/// The four table files, in `rope.json` order.
pub const FILES: [&str; 4] = [
    "rope-plain-cos.f32",
    "rope-plain-sin.f32",
    "rope-compressed-cos.f32",
    "rope-compressed-sin.f32",
];

/// Why the RoPE tables could not be made or checked.
#[derive(Debug, thiserror::Error)]
pub enum RopeError {
    /// I/O on a table or `rope.json`.
    #[error("{path}: {source}; check the kit directory's permissions and free space")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// `rope.json` is malformed or disagrees with the config.
    #[error("{path}: {problem}; re-download the kit")]
    RopeJson {
        /// rope.json.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// A generated table differs from the kit's published hash.
    #[error(
        "{file}: generated sha256 {found} differs from rope.json's {expected} (torch's last-bit rounding); download the kit's published RoPE tables instead of generating them"
    )]
    HashMismatch {
        /// The table.
        file: String,
        /// rope.json's hash.
        expected: String,
        /// The generated file's hash.
        found: String,
    },
}

/// The parameters of one table pair.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeParams {
    /// `qk_rope_head_dim`.
    pub dim: usize,
    /// `rope_theta` or `compress_rope_theta`.
    pub base: f64,
    /// YaRN factor.
    pub factor: f64,
    /// YaRN beta_fast.
    pub beta_fast: f64,
    /// YaRN beta_slow.
    pub beta_slow: f64,
    /// `original_max_position_embeddings` (0: no YaRN).
    pub orig_len: usize,
}

impl RopeParams {
    /// The plain (`compressed = false`) or compressed-KV parameters of a config. The compressed
    /// tables use `compress_rope_theta` with the same YaRN parameters (inferred from the kit's
    /// published tables).
    #[must_use]
    pub fn from_config(c: &ModelConfig, compressed: bool) -> Self {
        Self {
            dim: c.rope_dim,
            base: if compressed {
                c.compress_rope_theta
            } else {
                c.rope_theta
            },
            factor: c.rope_factor,
            beta_fast: c.beta_fast,
            beta_slow: c.beta_slow,
            orig_len: c.original_max_position,
        }
    }

    /// The `dim / 2` inverse frequencies `base^(-2i/dim)`, fp32, blended towards `1/factor` of
    /// themselves over the YaRN ramp between the `beta_fast` and `beta_slow` correction dims.
    #[must_use]
    pub fn freqs(&self) -> Vec<f32> {
        let dim = self.dim;
        let half = dim / 2;
        let base = self.base as f32;
        let mut f: Vec<f32> = (0..half)
            .map(|i| 1.0f32 / base.powf((2 * i) as f32 / dim as f32))
            .collect();
        if self.orig_len > 0 {
            let corr = |r: f64| {
                dim as f64 * (self.orig_len as f64 / (r * 2.0 * std::f64::consts::PI)).ln()
                    / (2.0 * self.base.ln())
            };
            let low = corr(self.beta_fast).floor().max(0.0);
            let high = corr(self.beta_slow).ceil().min(dim as f64 - 1.0);
            let span = (high - low).max(0.001) as f32;
            let factor = self.factor as f32;
            for (i, x) in f.iter_mut().enumerate() {
                let ramp = ((i as f32 - low as f32) / span).clamp(0.0, 1.0);
                *x = *x / factor * ramp + *x * (1.0 - ramp);
            }
        }
        f
    }
}

/// Rows the engine's kit tables have by default: `max_position_embeddings +
/// original_max_position_embeddings` (1,114,112 for the real config; inferred).
#[must_use]
pub fn default_rows(c: &ModelConfig) -> usize {
    c.max_position + c.original_max_position
}

/// Streams `rows` rows of cos and sin for `freqs` into two writers.
///
/// # Errors
/// Writer errors.
pub fn write_tables(
    freqs: &[f32],
    rows: usize,
    cos: &mut dyn Write,
    sin: &mut dyn Write,
) -> std::io::Result<()> {
    let mut c = Vec::with_capacity(freqs.len() * 4);
    let mut s = Vec::with_capacity(freqs.len() * 4);
    for t in 0..rows {
        c.clear();
        s.clear();
        let tf = t as f32;
        for &f in freqs {
            let a = tf * f;
            c.extend_from_slice(&a.cos().to_le_bytes());
            s.extend_from_slice(&a.sin().to_le_bytes());
        }
        cos.write_all(&c)?;
        sin.write_all(&s)?;
    }
    Ok(())
}

/// What [`write_rope_tables`] produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RopeReport {
    /// Rows per table.
    pub rows: usize,
    /// Values per row.
    pub half: usize,
    /// `(file name, sha256)` in [`FILES`] order.
    pub files: Vec<(String, String)>,
}

impl RopeReport {
    /// `rope.json`'s text: `{"half": …, "rows": …, "<file>": "<sha256>", …}`.
    #[must_use]
    pub fn rope_json(&self) -> String {
        let mut m = serde_json::Map::new();
        m.insert("half".into(), self.half.into());
        m.insert("rows".into(), self.rows.into());
        for (f, h) in &self.files {
            m.insert(f.clone(), h.clone().into());
        }
        Value::Object(m).to_string()
    }
}

struct HashWriter<W: Write> {
    inner: W,
    hash: Sha256,
}

impl<W: Write> Write for HashWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Writes the four tables into `kit_dir`. When `kit_dir/rope.json` exists, its `rows` and `half`
/// are used and every file must match its sha256 (else nothing is left under the final names);
/// otherwise `rows` (or [`default_rows`]) is used and `rope.json` is written.
///
/// # Errors
/// I/O errors, a `rope.json` whose `half` is not `rope_dim / 2`, or [`RopeError::HashMismatch`].
pub fn write_rope_tables(
    c: &ModelConfig,
    kit_dir: &Path,
    rows: Option<usize>,
) -> Result<RopeReport, RopeError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| RopeError::Io { path, source }
    };
    std::fs::create_dir_all(kit_dir).map_err(io(kit_dir))?;
    let json_path = kit_dir.join("rope.json");
    let published: Option<Value> = if json_path.exists() {
        let text = crate::safe_fs::read_capped(&json_path, crate::safe_fs::JSON_CAP)
            .map_err(io(&json_path))?;
        Some(
            serde_json::from_slice(&text).map_err(|e| RopeError::RopeJson {
                path: json_path.clone(),
                problem: e.to_string(),
            })?,
        )
    } else {
        None
    };
    let half = c.rope_dim / 2;
    let rows = match &published {
        Some(p) => {
            if p.get("half").and_then(Value::as_u64) != Some(half as u64) {
                return Err(RopeError::RopeJson {
                    path: json_path,
                    problem: format!("half is not {half} (config.json's qk_rope_head_dim / 2)"),
                });
            }
            p.get("rows")
                .and_then(Value::as_u64)
                .ok_or_else(|| RopeError::RopeJson {
                    path: json_path.clone(),
                    problem: "no integer rows".into(),
                })? as usize
        }
        None => rows.unwrap_or_else(|| default_rows(c)),
    };
    let mut files = Vec::new();
    let mut partials = Vec::new();
    let result = (|| {
        for (k, compressed) in [(0usize, false), (2, true)] {
            let freqs = RopeParams::from_config(c, compressed).freqs();
            let pc = kit_dir.join(format!(".{}.partial", FILES[k]));
            let ps = kit_dir.join(format!(".{}.partial", FILES[k + 1]));
            partials.push((pc.clone(), FILES[k]));
            partials.push((ps.clone(), FILES[k + 1]));
            let mut wc = HashWriter {
                inner: BufWriter::with_capacity(
                    1 << 20,
                    crate::safe_fs::create_exclusive(&pc, 0o644).map_err(io(&pc))?,
                ),
                hash: Sha256::new(),
            };
            let mut ws = HashWriter {
                inner: BufWriter::with_capacity(
                    1 << 20,
                    crate::safe_fs::create_exclusive(&ps, 0o644).map_err(io(&ps))?,
                ),
                hash: Sha256::new(),
            };
            write_tables(&freqs, rows, &mut wc, &mut ws).map_err(io(&pc))?;
            wc.flush().map_err(io(&pc))?;
            ws.flush().map_err(io(&ps))?;
            files.push((FILES[k].to_owned(), hex::encode(wc.hash.finalize())));
            files.push((FILES[k + 1].to_owned(), hex::encode(ws.hash.finalize())));
        }
        if let Some(p) = &published {
            for (f, h) in &files {
                let want = p.get(f).and_then(Value::as_str).unwrap_or_default();
                if want != h {
                    return Err(RopeError::HashMismatch {
                        file: f.clone(),
                        expected: want.to_owned(),
                        found: h.clone(),
                    });
                }
            }
        }
        for (p, name) in &partials {
            let dest = kit_dir.join(name);
            std::fs::rename(p, &dest).map_err(io(&dest))?;
        }
        Ok(())
    })();
    if let Err(e) = result {
        for (p, _) in &partials {
            let _ = std::fs::remove_file(p);
        }
        return Err(e);
    }
    let report = RopeReport { rows, half, files };
    if published.is_none() {
        crate::safe_fs::write_exclusive(&json_path, report.rope_json()).map_err(io(&json_path))?;
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::super::model_config::tests::flash;
    use super::*;

    #[test]
    fn real_config_freqs_and_rows() {
        let c = flash();
        assert_eq!(default_rows(&c), 1_114_112);
        let f = RopeParams::from_config(&c, false).freqs();
        assert_eq!(f.len(), 32);
        // high-frequency end is untouched by YaRN, the low end scaled towards 1/factor
        // (corr(beta_slow) = 33 here, so the ramp has not reached 1 at i = 31)
        assert_eq!(f[0], 1.0);
        let raw31 = 1.0f32 / 10000f32.powf(62.0 / 64.0);
        assert!(
            f[31] < raw31 / 2.0 && f[31] > raw31 / 16.0,
            "{} {raw31}",
            f[31]
        );
    }

    #[test]
    fn tables_and_rope_json_round_trip() {
        let mut c = flash();
        c.rope_dim = 8;
        let d = tempfile::tempdir().unwrap();
        let r = write_rope_tables(&c, d.path(), Some(10)).unwrap();
        assert_eq!(r.files.len(), 4);
        let bytes = std::fs::read(d.path().join(FILES[0])).unwrap();
        assert_eq!(bytes.len(), 10 * 4 * 4);
        assert_eq!(f32::from_le_bytes(bytes[0..4].try_into().unwrap()), 1.0);
        // second run checks against the rope.json just written
        write_rope_tables(&c, d.path(), None).unwrap();
        // a tampered rope.json is refused and leaves the tables alone
        let json = std::fs::read_to_string(d.path().join("rope.json")).unwrap();
        let bad = json.replace(&r.files[1].1, &"0".repeat(64));
        std::fs::write(d.path().join("rope.json"), bad).unwrap();
        let e = write_rope_tables(&c, d.path(), None).unwrap_err();
        assert!(matches!(e, RopeError::HashMismatch { .. }), "{e}");
        assert!(!d.path().join(format!(".{}.partial", FILES[0])).exists());
    }
}
