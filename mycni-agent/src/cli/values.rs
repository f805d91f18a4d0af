//! The value forms several settings share: booleans, counts, durations.
//! Each setting's parser (in its group's file) names the setting on error.

use std::time::Duration;

pub(super) fn parse_bool(s: &str) -> Result<bool, String> {
    match s.trim() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(format!("{s:?} is not true or false")),
    }
}

pub(super) fn parse_count(s: &str) -> Result<usize, String> {
    s.trim()
        .parse::<usize>()
        .map_err(|_| format!("{s:?} is not a count (a whole number, 0 or more)"))
}

/// A duration above 0: `500ms`, `30s` (or `30`), `5m`.
pub(super) fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    parse_duration(s).and_then(|d| {
        if d.is_zero() {
            Err("a duration of 0 is not allowed".into())
        } else {
            Ok(d)
        }
    })
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num.parse().map_err(|_| format!("bad duration {s:?}"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" | "" => Ok(Duration::from_secs(n)),
        "m" => n
            .checked_mul(60)
            .map(Duration::from_secs)
            .ok_or_else(|| format!("duration {s:?} is too long")),
        _ => Err(format!("bad duration unit in {s:?} (ms, s, m)")),
    }
}
