//! Percentiles: one definition for every figure the lab bench, the soak and
//! `mycni-bench` print, so that a p50 or p99 of the same samples is the same
//! number wherever it is shown.
//!
//! Linear interpolation between the closest ranks (Hyndman and Fan's type 7,
//! what numpy, R and spreadsheets compute by default): sorted, the p-th
//! percentile of n samples stands at position h = (n - 1)·p/100, and between
//! two samples it is the point that far along the line between them. So the
//! median of an even count is the mean of the two middle samples, the one
//! median every report table already showed; p0 and p100 are the smallest
//! and the largest; with one sample every percentile is that sample; and a
//! figure recomputed from the raw samples with any common tool agrees.

use std::cmp::Ordering;
use std::time::Duration;

/// Where the p-th percentile stands among `n >= 1` sorted samples: the
/// index at or below it and how far it is towards the next, in hundredths
/// (exact: no rounding of a fraction).
fn position(n: usize, p: u32) -> (usize, u32) {
    let h = (n - 1) * p.min(100) as usize;
    (h / 100, (h % 100) as u32)
}

/// The p-th percentile of `samples` ordered by `cmp`, `between(a, b, c)`
/// being the point `c` hundredths of the way from `a` to `b`.
fn percentile_with<T: Copy>(
    samples: &[T],
    p: u32,
    cmp: impl Fn(&T, &T) -> Ordering,
    between: impl Fn(T, T, u32) -> T,
) -> Option<T> {
    if samples.is_empty() {
        return None;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_by(cmp);
    let (i, c) = position(sorted.len(), p);
    let lo = sorted[i];
    Some(match sorted.get(i + 1) {
        Some(&hi) if c > 0 => between(lo, hi, c),
        _ => lo,
    })
}

/// The p-th percentile of figures; NaN for none, which the reports show as
/// "-".
pub fn percentile(samples: &[f64], p: u32) -> f64 {
    percentile_with(samples, p, f64::total_cmp, |a, b, c| {
        a + (b - a) * f64::from(c) / 100.0
    })
    .unwrap_or(f64::NAN)
}

/// The p-th percentile of durations; `None` for none.
pub fn percentile_duration(samples: &[Duration], p: u32) -> Option<Duration> {
    percentile_with(samples, p, Duration::cmp, |a, b, c| a + (b - a) * c / 100)
}

/// The median of figures (their p50); NaN for none.
pub fn median(samples: &[f64]) -> f64 {
    percentile(samples, 50)
}

/// The sample at the median's position by `key`, for picking one whole run
/// as the representative one: the median itself for an odd count, the
/// lower of the two middle samples for an even one; `None` for none.
pub fn median_by<T, K: Ord>(samples: &[T], key: impl Fn(&T) -> K) -> Option<&T> {
    let mut sorted: Vec<&T> = samples.iter().collect();
    sorted.sort_by_key(|s| key(s));
    sorted.get(position(sorted.len().max(1), 50).0).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_between_the_closest_ranks_on_small_inputs() {
        let ten: Vec<f64> = (1..=10).map(f64::from).collect();
        for (p, want) in [
            (0, 1.0),
            (10, 1.9),
            (50, 5.5),
            (90, 9.1),
            (99, 9.91),
            (100, 10.0),
            (150, 10.0),
        ] {
            let got = percentile(&ten, p);
            assert!((got - want).abs() < 1e-9, "p{p}: {got}");
        }
        // The order of the input does not matter; one sample is every
        // percentile.
        assert_eq!(percentile(&[30.0, 10.0, 20.0], 50), 20.0);
        assert_eq!(percentile(&[30.0, 10.0, 20.0], 75), 25.0);
        assert_eq!(percentile(&[7.0], 0), 7.0);
        assert_eq!(percentile(&[7.0], 99), 7.0);
        assert!(percentile(&[], 50).is_nan());
    }

    #[test]
    fn durations_interpolate_to_the_nanosecond() {
        let ms = Duration::from_millis;
        let four = [ms(40), ms(10), ms(30), ms(20)];
        assert_eq!(percentile_duration(&four, 0), Some(ms(10)));
        assert_eq!(percentile_duration(&four, 50), Some(ms(25)));
        assert_eq!(
            percentile_duration(&four, 99),
            Some(Duration::from_micros(39_700))
        );
        assert_eq!(percentile_duration(&four, 100), Some(ms(40)));
        assert_eq!(percentile_duration(&[ms(3)], 99), Some(ms(3)));
        assert_eq!(percentile_duration(&[], 50), None);
    }

    #[test]
    fn median_of_even_and_odd() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0]), 2.5);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn median_by_picks_a_whole_sample() {
        let runs = [("b", 20), ("a", 10), ("c", 30)];
        assert_eq!(median_by(&runs, |r| r.1), Some(&("b", 20)));
        assert_eq!(median_by(&runs[..2], |r| r.1), Some(&("a", 10)));
        assert_eq!(median_by(&runs[..0], |r| r.1), None);
    }
}
