//! `/etc/exports` text: the first line is the path asked for, the rest the exports.
#![no_main]

use std::net::Ipv4Addr;

use libfuzzer_sys::fuzz_target;
use spark_deploy_core::preflight::exports::check_exports;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (path, exports) = text.split_once('\n').unwrap_or(("/data", &text));
    for client in [
        Ipv4Addr::new(192, 168, 100, 2),
        Ipv4Addr::new(0, 0, 0, 0),
        Ipv4Addr::new(255, 255, 255, 255),
    ] {
        let _ = check_exports(exports, path, client);
    }
});
