//! `/proc/meminfo` parsing.

/// `MemAvailable` in bytes, if present.
#[must_use]
pub fn mem_available(meminfo: &str) -> Option<u64> {
    field_kib(meminfo, "MemAvailable").map(|k| k * 1024)
}

/// `MemTotal` in bytes, if present.
#[must_use]
pub fn mem_total(meminfo: &str) -> Option<u64> {
    field_kib(meminfo, "MemTotal").map(|k| k * 1024)
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
}
