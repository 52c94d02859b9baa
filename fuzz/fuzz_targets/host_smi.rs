//! `nvidia-smi -q` text (clocks), and the comparison of two nodes' clocks.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spark_deploy_core::preflight::{clocks, smi};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (a, b) = text.split_once('\0').unwrap_or((&text, ""));
    let _ = smi::mhz(a);
    let nodes = vec![
        ("head".to_owned(), smi::parse_clocks(a)),
        ("worker".to_owned(), smi::parse_clocks(b)),
    ];
    let _ = clocks::compare(&nodes);
});
