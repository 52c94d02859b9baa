//! The test-scale `ABLIT` overlay: a safetensors file whose tensors replace some of the generated
//! checkpoint's, with the same names, dtypes and shapes and other bytes — what an abliterated
//! export is to the genuine one (abliteration rewrites the projections that write into the
//! residual stream; the overlay also replaces a column-split tensor, so both split kinds are
//! covered).
//!
//! None of the [`OVERLAID`] tensors is one the stand-in's split proof covers by default: rank 0
//! proves the split against the genuine checkpoint in `MODEL_DIR` (the engine is never told about
//! the overlay; its rank files carry the overlaid weights), so the proof holds with `ABLIT=1` and
//! the stand-in's digests (`standin::digest`) show which weights the ranks loaded.

use std::path::{Path, PathBuf};

use super::{CheckpointError, CheckpointSpec, tensors, writer};

/// The EXL3 tensors (prefixes: `.trellis`, `.suh` and `.svh` each) the overlay replaces: a
/// row-split and a column-split attention tensor and a routed expert's row-split `w2`, all
/// outside layer 0 (whose tensors the split proof covers).
pub const OVERLAID: &[&str] = &[
    "layers.1.attn.wo_b",
    "layers.2.attn.wq_b",
    "layers.1.ffn.experts.0.w2",
];

/// The overlay file's name in its repo.
pub const OVERLAY_FILE: &str = "model-abliterated.safetensors";

/// Mixed into the checkpoint's seed so the overlay's bytes differ from the genuine ones.
const OVERLAY_SEED: u64 = 0xab11_7e4a;

/// Writes the overlay of the checkpoint of `spec` to `out_dir/`[`OVERLAY_FILE`] (and a small
/// `config.json` describing it), replacing every part of each [`OVERLAID`] tensor.
///
/// # Errors
/// [`CheckpointError::Spec`] when the spec's model lacks an overlaid tensor; I/O errors.
pub fn generate_overlay(spec: &CheckpointSpec, out_dir: &Path) -> Result<PathBuf, CheckpointError> {
    std::fs::create_dir_all(out_dir).map_err(|source| CheckpointError::Io {
        path: out_dir.to_path_buf(),
        source,
    })?;
    let mut list: Vec<_> = tensors::model_tensors(spec)
        .into_iter()
        .filter(|t| {
            OVERLAID
                .iter()
                .any(|p| t.name.strip_prefix(p).is_some_and(|r| r.starts_with('.')))
        })
        .collect();
    if list.len() != OVERLAID.len() * 3 {
        return Err(CheckpointError::Spec(format!(
            "the overlay wants the trellis, suh and svh of {OVERLAID:?}; the model has {} of them",
            list.len()
        )));
    }
    writer::safetensors_order(&mut list);
    let path = out_dir.join(OVERLAY_FILE);
    writer::write_shard(&path, spec.seed ^ OVERLAY_SEED, &list, false)?;
    let config = out_dir.join("config.json");
    let text = serde_json::json!({"overlay": "abliterated", "replaces": OVERLAID}).to_string();
    std::fs::write(&config, text).map_err(|source| CheckpointError::Io {
        path: config,
        source,
    })?;
    Ok(path)
}
