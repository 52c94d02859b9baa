//! Index-only planning for the real DeepSeek-V4.1-Flash shapes, on a sparse checkpoint (real
//! headers, data as holes): the engine's shape guard passes and known index rows of the real
//! model (keys, order, dtype, shape, bytes) come out exactly.

// An integration test: a failed unwrap or expect is the test failure, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(clippy::print_stderr)]

use spark_deploy_core::engine::tensorfold::inputs::{RankCacheOptions, plan_rank_cache};
use spark_deploy_testbed::checkpoint::{CheckpointSpec, generate_sparse_model};

#[test]
fn real_shapes_plan_passes_the_guard_and_matches_the_pins() {
    let d = tempfile::tempdir().unwrap();
    let model = generate_sparse_model(&CheckpointSpec::real_shapes(1), d.path()).unwrap();
    let opts = RankCacheOptions::default(); // engine shape guard on
    let p1 = plan_rank_cache(&model, 1, 2, &opts).unwrap();
    // the first row of the real rank-1 index, byte for byte
    assert!(
        p1.index_json
            .starts_with("[[\"embed.weight|None\", \"bfloat16\", [129280, 5120], 0, 1323827200], "),
        "{}",
        &p1.index_json[..200]
    );
    let row = |k: &str| {
        p1.entries
            .iter()
            .position(|e| e.row.key == k)
            .map(|i| (i, &p1.entries[i].row))
            .unwrap_or_else(|| panic!("no {k}"))
    };
    let (i, head) = row("head|(64640, 129280)|None|tr");
    assert_eq!((i, head.shape.as_slice()), (2, &[320usize, 4040, 48][..]));
    assert_eq!(p1.entries[5].row.key, "layers.0.hc_attn_fn|torch.float32");
    assert_eq!(p1.entries[5].row.dtype.torch_name(), Some("float32"));
    assert_eq!(
        row("layers.0.attn.wq_b|(16384, 32768)|None|tr").1.shape,
        vec![80, 1024, 48]
    );
    assert_eq!(
        row("layers.0.attn.wq_b|(16384, 32768)|None|svh").1.shape,
        vec![16384]
    );
    assert_eq!(
        row("layers.0.attn.wq_b|(16384, 32768)|None|suh").1.shape,
        vec![1280]
    );
    assert_eq!(
        row("layers.3.ffn.experts.383.w2|None|(1152, 2304)|tr")
            .1
            .shape,
        vec![72, 320, 48]
    );
    assert_eq!(
        row("layers.14.engram.wkv|None|(3072, 6144)|tr").1.shape[0],
        192
    );
    assert_eq!(
        row("layers.0.ffn.gate.weight|torch.float16")
            .1
            .dtype
            .torch_name(),
        Some("float16")
    );
    assert_eq!(
        p1.entries.last().unwrap().row.key,
        "mtp.2.confidence_head.proj.weight|None"
    );
    let wo_a = p1
        .entries
        .iter()
        .filter(|e| {
            e.row.key.starts_with("layers.0.attn.wo_a.slice.") && e.row.key.ends_with("|tr")
        })
        .count();
    assert_eq!(wo_a, 4);
    // the real rank files are about 106 GB each at TP=2; here every trellis has 3 bits
    let gb = p1.data_bytes as f64 / 1e9;
    assert!((90.0..125.0).contains(&gb), "{gb} GB");
    let p0 = plan_rank_cache(&model, 0, 2, &opts).unwrap();
    assert_eq!(p0.entries.len(), p1.entries.len());
    assert_ne!(p0.file_name, p1.file_name);
    assert!(p0.file_name.starts_with("rank0of2-") && p1.file_name.starts_with("rank1of2-"));
    eprintln!(
        "real shapes: {} entries, rank 0 {:.1} GB / rank 1 {:.1} GB of data, index {} / {} bytes",
        p1.entries.len(),
        p0.data_bytes as f64 / 1e9,
        gb,
        p0.index_json.len(),
        p1.index_json.len()
    );
}
