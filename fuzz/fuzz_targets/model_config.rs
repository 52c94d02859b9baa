//! A checkpoint's `config.json`, the engine's guards, and the split plan it sizes (for configs
//! small enough to plan in a fuzz iteration).
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use spark_deploy_core::engine::tensorfold::inputs::model_config::ModelConfig;
use spark_deploy_core::engine::tensorfold::inputs::{rope, split_plan};

fuzz_target!(|data: &[u8]| {
    let path = Path::new("config.json");
    let Ok(c) = ModelConfig::parse(path, data) else {
        return;
    };
    let _ = c.check_engine_shapes(path);
    let _ = rope::default_rows(&c);
    let _ = rope::RopeParams::from_config(&c, true).freqs();
    let blocks = c.layers * (c.experts + 1) + c.draft_layers * (c.draft_experts + 1);
    if blocks <= 256 {
        for world in [1, 2, 3, 4] {
            for rank in 0..world {
                let _ = split_plan::plan(&c, rank, world, true);
            }
        }
    }
});
