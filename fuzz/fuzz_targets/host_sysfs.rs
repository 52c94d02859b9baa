//! The sysfs dump a node prints (`D`/`F` lines) and `ip route get` output (the first line), then
//! RoCE detection over them.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spark_deploy_core::preflight::roce::{detect, parse_route};
use spark_deploy_core::preflight::sysfs_dump::SysfsDump;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (route, dump) = text.split_once('\n').unwrap_or((&text, ""));
    let dump = SysfsDump::parse(dump);
    if let Some(route) = parse_route(route) {
        match detect(&dump, &route) {
            Ok(facts) => {
                let _ = facts.warnings.len();
            }
            Err(e) => {
                let _ = (e.to_string(), e.remedy());
            }
        }
    }
});
