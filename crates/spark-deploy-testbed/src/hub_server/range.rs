//! `Range: bytes=…` parsing (RFC 9110 §14), single ranges only.

/// Outcome of a `Range` header against a file size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RangeOutcome {
    /// No usable range: serve the whole file with 200.
    Full,
    /// Serve `start..=end` with 206.
    Partial { start: u64, end: u64 },
    /// 416 Range Not Satisfiable.
    Unsatisfiable,
}

pub(crate) fn parse_range(header: Option<&str>, size: u64) -> RangeOutcome {
    let Some(h) = header else {
        return RangeOutcome::Full;
    };
    let Some(spec) = h.trim().strip_prefix("bytes=") else {
        return RangeOutcome::Full;
    };
    if spec.contains(',') {
        // Multi-range: allowed to ignore and send the full representation.
        return RangeOutcome::Full;
    }
    let Some((a, b)) = spec.trim().split_once('-') else {
        return RangeOutcome::Full;
    };
    let (a, b) = (a.trim(), b.trim());
    if a.is_empty() {
        // Suffix range: last n bytes.
        let Ok(n) = b.parse::<u64>() else {
            return RangeOutcome::Full;
        };
        if n == 0 || size == 0 {
            return RangeOutcome::Unsatisfiable;
        }
        let n = n.min(size);
        return RangeOutcome::Partial {
            start: size - n,
            end: size - 1,
        };
    }
    let Ok(start) = a.parse::<u64>() else {
        return RangeOutcome::Full;
    };
    let end = if b.is_empty() {
        size.saturating_sub(1)
    } else {
        match b.parse::<u64>() {
            Ok(e) if e >= start => e.min(size.saturating_sub(1)),
            _ => return RangeOutcome::Full,
        }
    };
    if start >= size {
        return RangeOutcome::Unsatisfiable;
    }
    RangeOutcome::Partial { start, end }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert_eq!(parse_range(None, 10), RangeOutcome::Full);
        assert_eq!(
            parse_range(Some("bytes=2-4"), 10),
            RangeOutcome::Partial { start: 2, end: 4 }
        );
        assert_eq!(
            parse_range(Some("bytes=2-"), 10),
            RangeOutcome::Partial { start: 2, end: 9 }
        );
        assert_eq!(
            parse_range(Some("bytes=5-100"), 10),
            RangeOutcome::Partial { start: 5, end: 9 }
        );
        assert_eq!(
            parse_range(Some("bytes=-3"), 10),
            RangeOutcome::Partial { start: 7, end: 9 }
        );
        assert_eq!(
            parse_range(Some("bytes=10-"), 10),
            RangeOutcome::Unsatisfiable
        );
        assert_eq!(parse_range(Some("bytes=0-1,4-5"), 10), RangeOutcome::Full);
        assert_eq!(parse_range(Some("items=0-1"), 10), RangeOutcome::Full);
    }
}
