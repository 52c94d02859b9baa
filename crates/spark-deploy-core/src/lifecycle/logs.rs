//! Saved rank logs: `<YYYYmmdd-HHMMSS>-<container>.log.gz`, newest `keep` kept per rank.

use std::time::{SystemTime, UNIX_EPOCH};

/// Civil UTC date and time of `t` as `YYYYmmdd-HHMMSS`.
#[must_use]
pub fn stamp(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's days-to-civil algorithm.
    let z = i64::try_from(days).unwrap_or(0) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}-{:02}{:02}{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The file name a container's log is saved under at time `t`.
#[must_use]
pub fn file_name(t: SystemTime, container: &str) -> String {
    format!("{}-{container}.log.gz", stamp(t))
}

/// Of the saved logs of `container` among `existing` names, the ones to delete so that the
/// newest `keep` remain (names sort by time).
#[must_use]
pub fn to_prune(existing: &[String], container: &str, keep: usize) -> Vec<String> {
    let suffix = format!("-{container}.log.gz");
    let mut mine: Vec<&String> = existing
        .iter()
        .filter(|n| {
            n.strip_suffix(&suffix)
                .is_some_and(|s| s.len() == 15 && s.as_bytes()[8] == b'-')
        })
        .collect();
    mine.sort();
    let n = mine.len().saturating_sub(keep);
    mine.into_iter().take(n).cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn names_sort_by_time_and_rotation_keeps_the_newest() {
        assert_eq!(
            stamp(UNIX_EPOCH + Duration::from_secs(951_782_400)),
            "20000229-000000"
        );
        assert_eq!(
            stamp(UNIX_EPOCH + Duration::from_secs(1_796_000_000 + 3_723)),
            "20261130-015523"
        );
        let names: Vec<String> = [
            "20261130-000001-d-rank0.log.gz",
            "20261129-235959-d-rank0.log.gz",
            "20261130-000002-d-rank0.log.gz",
            "20261130-000003-d-rank1.log.gz",
            "notes.txt",
        ]
        .map(str::to_owned)
        .to_vec();
        assert_eq!(
            to_prune(&names, "d-rank0", 2),
            ["20261129-235959-d-rank0.log.gz"]
        );
        assert_eq!(to_prune(&names, "d-rank0", 0).len(), 3);
        assert!(to_prune(&names, "d-rank1", 1).is_empty());
    }
}
