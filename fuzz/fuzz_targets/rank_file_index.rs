//! A rank file's footer and index (TFDSRK01) under the engine's reader rules, and the index text
//! round trip of the writer.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spark_deploy_core::engine::tensorfold::inputs::rank_file::{
    index_json, locate_index, parse_index,
};

fuzz_target!(|data: &[u8]| {
    // The file as a whole: footer, then the index it points at.
    if let Some(tail) = data.len().checked_sub(16).map(|at| &data[at..]) {
        let tail: [u8; 16] = tail.try_into().expect("16 bytes");
        if let Ok((at, n)) = locate_index(data.len() as u64, &tail) {
            let json = &data[at as usize..at as usize + n];
            let _ = parse_index(json, at);
        }
    }
    // The index alone; what parses is written back byte for byte as the writer does and reads
    // back the same.
    if let Ok(rows) = parse_index(data, u64::MAX)
        && let Ok(text) = index_json(&rows)
    {
        let again = parse_index(text.as_bytes(), u64::MAX).expect("the writer's index parses");
        assert_eq!(again, rows);
    }
});
