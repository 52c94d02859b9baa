//! `df -Pk` lines, the size listings (`find -printf '%P %s'`), and the head's rank-file and
//! snapshot listings, with the sums of what is missing.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spark_deploy_core::preflight::decide::df_free_bytes;
use spark_deploy_core::preflight::inputs::{HeadInputs, Tree, parse_sizes};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _ = df_free_bytes(&text);
    let sizes = parse_sizes(&text);
    let tree = Tree {
        what: "fuzz".into(),
        files: Some(sizes.clone()),
        cached: Default::default(),
    };
    let _ = tree.missing_in_cache();
    let _ = tree.missing_at(&sizes);
    let (rank_files, snapshot) = text.split_once('\0').unwrap_or((&text, ""));
    for world in 1..=4 {
        let inputs = HeadInputs::parse(rank_files, snapshot, world);
        let _ = inputs.checkpoint_total();
        let weights = inputs.rank_weights(world, Some(u64::MAX), Some(u64::MAX));
        let _ = inputs.missing_rank_files(&weights);
        let _ = inputs.missing_checkpoint(Some(u64::MAX));
        let _ = inputs.missing_checkpoint(None);
    }
});
