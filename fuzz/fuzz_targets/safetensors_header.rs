//! A safetensors file's first bytes (the 8-byte length, the header JSON) as the local reader and
//! the Hub's range reader see them, and the shard view of the checkpoint reader.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use spark_deploy_core::engine::tensorfold::inputs::safetensors_index::shard_header;
use spark_deploy_core::safetensors_header::{header_len, parse};

fuzz_target!(|data: &[u8]| {
    let file_len = data.len() as u64;
    // A whole file: length prefix, header, data section.
    if let Ok(n) = header_len(data, Some(file_len)) {
        let json = &data[8..8 + n as usize];
        if let Ok(h) = parse(json) {
            assert!(h.data_start() == 8 + n);
            let _ = shard_header(Path::new("fuzz.safetensors"), h, file_len);
        }
    }
    // The Hub's probe: the length alone, the file's size unknown.
    let _ = header_len(data, None);
    // The header JSON on its own, against the length it claims.
    if let Ok(h) = parse(data) {
        let claimed = h.file_len();
        if let Ok(s) = shard_header(Path::new("fuzz.safetensors"), h, claimed) {
            for t in &s.tensors {
                assert!(
                    t.offset
                        .checked_add(t.len)
                        .is_some_and(|end| end <= claimed)
                );
            }
        }
    }
});
