//! Times in rank logs: Docker's RFC 3339 line stamps (ordering both ranks' lines) and the
//! `--since` forms people type (`10m`, `2h`, a Unix time, an RFC 3339 time).

use std::time::{SystemTime, UNIX_EPOCH};

/// A point in time as Unix seconds and nanoseconds, ordered.
pub type Instant = (i64, u32);

/// A `--since` value that is none of the accepted forms.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "--since {value:?} is not a time; remedy: give a duration back from now (`30s`, `10m`, `2h`, \
     `1d`), a Unix time (`1796000000`) or an RFC 3339 time (`2026-12-01T10:00:00Z`)"
)]
pub struct SinceError {
    /// The value given.
    pub value: String,
}

/// Days since 1970-01-01 of a civil date (Howard Hinnant's days-from-civil).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (i64::from(m) + 9) % 12;
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn num<T: std::str::FromStr>(s: &str, len: usize) -> Option<T> {
    (s.len() == len && s.bytes().all(|b| b.is_ascii_digit()))
        .then(|| s.parse().ok())
        .flatten()
}

/// Parses `YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)` (Docker writes `Z` and up to nine digits).
#[must_use]
pub fn parse_rfc3339(s: &str) -> Option<Instant> {
    let (date, rest) = s.split_once(['T', 't', ' '])?;
    let mut d = date.split('-');
    let (y, mo, da) = (
        num::<i64>(d.next()?, 4)?,
        num::<u32>(d.next()?, 2)?,
        num::<u32>(d.next()?, 2)?,
    );
    let tz_at = rest.find(['Z', 'z', '+', '-'])?;
    let (clock, tz) = rest.split_at(tz_at);
    let (hms, frac) = clock.split_once('.').unwrap_or((clock, ""));
    let mut t = hms.split(':');
    let (h, mi, se) = (
        num::<i64>(t.next()?, 2)?,
        num::<i64>(t.next()?, 2)?,
        num::<i64>(t.next()?, 2)?,
    );
    if !(1..=12).contains(&mo) || !(1..=31).contains(&da) || h > 23 || mi > 59 || se > 60 {
        return None;
    }
    if frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) || t.next().is_some() {
        return None;
    }
    let nanos = if frac.is_empty() {
        0
    } else {
        frac.parse::<u32>().ok()? * 10u32.pow(9 - u32::try_from(frac.len()).ok()?)
    };
    let offset = match tz {
        "Z" | "z" => 0,
        _ => {
            let sign = if tz.starts_with('-') { -1 } else { 1 };
            let (oh, om) = tz[1..].split_once(':')?;
            sign * (num::<i64>(oh, 2)? * 3600 + num::<i64>(om, 2)? * 60)
        }
    };
    let secs = days_from_civil(y, mo, da) * 86_400 + h * 3600 + mi * 60 + se - offset;
    Some((secs, nanos))
}

fn unix_secs(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// The Unix time a `--since` value names, relative to `now` for durations.
///
/// # Errors
///
/// [`SinceError`] when `value` is none of the accepted forms.
pub fn parse_since(value: &str, now: SystemTime) -> Result<i64, SinceError> {
    let err = || SinceError {
        value: value.to_owned(),
    };
    let v = value.trim();
    if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
        return v.parse().map_err(|_| err());
    }
    if let Some(t) = parse_rfc3339(v) {
        return Ok(t.0);
    }
    let unit = match v.chars().last() {
        Some('s') => 1,
        Some('m') => 60,
        Some('h') => 3600,
        Some('d') => 86_400,
        _ => return Err(err()),
    };
    let n: i64 = v[..v.len() - 1].parse().map_err(|_| err())?;
    if n < 0 {
        return Err(err());
    }
    Ok(unix_secs(now) - n.saturating_mul(unit))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn docker_stamps_order_by_time_not_by_text() {
        let a = parse_rfc3339("2026-11-30T01:55:23.1234Z").unwrap();
        let b = parse_rfc3339("2026-11-30T01:55:23.12345Z").unwrap();
        assert!(
            a < b,
            "Docker trims trailing zeros: text order would be wrong"
        );
        assert_eq!(a, (1_796_000_000 + 3_723, 123_400_000));
        assert_eq!(
            parse_rfc3339("2026-11-30T03:55:23+02:00").unwrap().0,
            1_796_003_723
        );
        assert_eq!(
            parse_rfc3339("2000-02-29T00:00:00Z").unwrap().0,
            951_782_400
        );
        for bad in [
            "2026-13-01T00:00:00Z",
            "2026-11-30",
            "2026-11-30T01:55Z",
            "x",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }

    #[test]
    fn since_accepts_durations_unix_and_rfc3339_times() {
        let now = UNIX_EPOCH + Duration::from_secs(1_796_000_000);
        assert_eq!(parse_since("10m", now), Ok(1_796_000_000 - 600));
        assert_eq!(parse_since("2h", now), Ok(1_796_000_000 - 7200));
        assert_eq!(parse_since("1d", now), Ok(1_796_000_000 - 86_400));
        assert_eq!(parse_since("30s", now), Ok(1_796_000_000 - 30));
        assert_eq!(parse_since("1795000000", now), Ok(1_795_000_000));
        assert_eq!(parse_since("2026-11-30T01:55:23Z", now), Ok(1_796_003_723));
        for bad in ["", "ten minutes", "-5m", "5y", "m"] {
            let e = parse_since(bad, now).unwrap_err();
            assert!(e.to_string().contains("remedy"), "{e}");
        }
    }
}
