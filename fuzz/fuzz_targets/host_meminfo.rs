//! `/proc/meminfo` as a node prints it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spark_deploy_core::preflight::meminfo::{mem_available, mem_total};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _ = (mem_available(&text), mem_total(&text));
});
