//! Streaming safetensors writer: the header first, then each tensor's bytes generated in bounded
//! chunks (a shard is never held in memory).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use spark_deploy_core::engine::tensorfold::inputs::dtype::DType;
use spark_deploy_core::engine::tensorfold::inputs::safetensors_index::build_header;

use super::rng::Rng;
use super::{CheckpointError, TensorSpec};

const CHUNK: usize = 1 << 20;

/// Orders tensors as the `safetensors` library's writer does: larger alignment first, then name.
pub(crate) fn safetensors_order(tensors: &mut [TensorSpec]) {
    tensors.sort_by(|a, b| {
        b.dtype
            .size()
            .cmp(&a.dtype.size())
            .then_with(|| a.name.cmp(&b.name))
    });
}

/// Makes a random float valid (no Inf/NaN) so widening and numeric checks stay meaningful.
fn tame_floats(dtype: DType, buf: &mut [u8]) {
    match dtype {
        DType::F16 => {
            for h in buf.chunks_exact_mut(2) {
                if h[1] & 0x7c == 0x7c {
                    h[1] &= !0x40;
                }
            }
        }
        DType::Bf16 => {
            for h in buf.chunks_exact_mut(2) {
                if (h[1] & 0x7f) == 0x7f && h[0] & 0x80 != 0 {
                    h[1] &= !0x40;
                }
            }
        }
        DType::F32 => {
            for w in buf.chunks_exact_mut(4) {
                if (w[3] & 0x7f) == 0x7f && w[2] & 0x80 != 0 {
                    w[3] &= !0x40;
                }
            }
        }
        DType::F8E8M0 => {
            // scales near 2^0: 120..134
            for b in buf.iter_mut() {
                *b = 120 + *b % 15;
            }
        }
        _ => {}
    }
}

/// The deterministic bytes of one tensor, chunk by chunk.
pub(crate) fn tensor_bytes(
    seed: u64,
    t: &TensorSpec,
    mut sink: impl FnMut(&[u8]) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let mut rng = Rng::for_name(seed, &t.name);
    let mut left = t.bytes() as usize;
    let mut buf = vec![0u8; CHUNK.min(left)];
    while left > 0 {
        let n = CHUNK.min(left);
        rng.fill(&mut buf[..n]);
        tame_floats(t.dtype, &mut buf[..n]);
        sink(&buf[..n])?;
        left -= n;
    }
    Ok(())
}

/// Writes one shard with `tensors` in the given order.
pub(crate) fn write_shard(
    path: &Path,
    seed: u64,
    tensors: &[TensorSpec],
    sparse: bool,
) -> Result<u64, CheckpointError> {
    let io = |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    };
    let list: Vec<(String, DType, Vec<usize>)> = tensors
        .iter()
        .map(|t| (t.name.clone(), t.dtype, t.shape.clone()))
        .collect();
    let (header, _) = build_header(&list, None);
    let mut w = BufWriter::with_capacity(CHUNK, File::create(path).map_err(io)?);
    w.write_all(&header).map_err(io)?;
    let mut total = header.len() as u64;
    if sparse {
        let data: u64 = tensors.iter().map(TensorSpec::bytes).sum();
        let f = w.into_inner().map_err(|e| io(e.into_error()))?;
        f.set_len(total + data).map_err(io)?;
        return Ok(total + data);
    }
    for t in tensors {
        tensor_bytes(seed, t, |b| w.write_all(b)).map_err(io)?;
        total += t.bytes();
    }
    w.flush().map_err(io)?;
    Ok(total)
}
