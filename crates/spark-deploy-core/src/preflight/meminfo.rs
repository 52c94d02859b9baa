//! `/proc/meminfo` parsing.

/// `MemAvailable` in bytes, if present (and below 2^64 bytes: a larger value is unreadable, not
/// wrapped).
#[must_use]
pub fn mem_available(meminfo: &str) -> Option<u64> {
    field_kib(meminfo, "MemAvailable").and_then(|k| k.checked_mul(1024))
}

/// `MemTotal` in bytes, if present (and below 2^64 bytes).
#[must_use]
pub fn mem_total(meminfo: &str) -> Option<u64> {
    field_kib(meminfo, "MemTotal").and_then(|k| k.checked_mul(1024))
}

fn field_kib(meminfo: &str, name: &str) -> Option<u64> {
    meminfo.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == name).then(|| v.trim().trim_end_matches("kB").trim().parse().ok())?
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_the_real_fixture() {
        let text = include_str!("../../../../tests/fixtures/host-facts/h200x2/host-facts.txt");
        assert_eq!(super::mem_available(text), Some(263_415_560 * 1024));
        assert_eq!(super::mem_total(text), Some(263_998_500 * 1024));
        assert_eq!(super::mem_available("MemTotal: 5 kB\n"), None);
    }

    #[test]
    fn sizes_past_2_to_the_64_bytes_are_unreadable_not_wrapped() {
        let max_kib = u64::MAX / 1024;
        let at = |k: u64| format!("MemTotal: {k} kB\nMemAvailable: {k} kB\n");
        assert_eq!(super::mem_total(&at(max_kib)), Some(max_kib * 1024));
        assert_eq!(super::mem_available(&at(max_kib)), Some(max_kib * 1024));
        for k in [max_kib + 1, u64::MAX] {
            assert_eq!(super::mem_total(&at(k)), None, "{k}");
            assert_eq!(super::mem_available(&at(k)), None, "{k}");
        }
        assert_eq!(super::mem_total("MemTotal: 18446744073709551616 kB"), None);
    }
}
