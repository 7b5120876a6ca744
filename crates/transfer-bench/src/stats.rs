//! Summaries of latency samples.

use std::time::Duration;

/// p50 / p99 / mean of a set of samples, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Latency {
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// Mean.
    pub mean_us: f64,
}

/// Summarises samples; `None` when there are none.
pub fn latency(samples: &[Duration]) -> Option<Latency> {
    if samples.is_empty() {
        return None;
    }
    let mut us: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e6).collect();
    us.sort_by(f64::total_cmp);
    Some(Latency {
        p50_us: percentile(&us, 0.50),
        p99_us: percentile(&us, 0.99),
        mean_us: us.iter().sum::<f64>() / us.len() as f64,
    })
}

/// Nearest-rank percentile of sorted values.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn percentiles_by_nearest_rank() {
        let samples: Vec<Duration> = (1..=100).map(Duration::from_micros).collect();
        let l = super::latency(&samples);
        assert_eq!(
            l.map(|l| (l.p50_us.round(), l.p99_us.round())),
            Some((50.0, 99.0))
        );
        assert_eq!(super::latency(&[]), None);
    }
}
