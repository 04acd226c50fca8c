//! The numbers behind the plots: a histogram's CDF, and shared bins to
//! draw several histograms on one axis. Values are µs in the histograms
//! and ms on the axes.

use hdrhistogram::Histogram;

/// Most points of one CDF line (the SVG stays small; the eye cannot tell more).
pub const MAX_CDF_POINTS: usize = 400;
/// Bins of a histogram plot.
pub const BINS: usize = 60;
/// From this ratio of the largest to the smallest value on, bins (and the
/// axis) are logarithmic.
pub const LOG_RATIO: f64 = 20.0;

/// µs to ms, 0 counted as 1 µs so that it has a place on a log axis.
pub fn ms(us: u64) -> f64 {
    us.max(1) as f64 / 1000.0
}

/// The CDF of `h`: (latency ms, % of values at or below it), from the
/// smallest value (at 0 %) to the largest (at 100 %); at most
/// [`MAX_CDF_POINTS`] points, the last always kept. Empty for an empty histogram.
pub fn cdf(h: &Histogram<u64>) -> Vec<(f64, f64)> {
    if h.is_empty() {
        return Vec::new();
    }
    let steps: Vec<(f64, f64)> =
        h.iter_recorded().map(|v| (ms(v.value_iterated_to()), v.quantile_iterated_to() * 100.0)).collect();
    let every = steps.len().div_ceil(MAX_CDF_POINTS - 2).max(1);
    let mut out = Vec::with_capacity(MAX_CDF_POINTS);
    out.push((ms(h.lowest_equivalent(h.min())), 0.0));
    for (i, p) in steps.iter().enumerate() {
        if (i + 1) % every == 0 || i + 1 == steps.len() {
            out.push(*p);
        }
    }
    out
}

/// Bins shared by several histograms, in µs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bins {
    /// Lower edge of the first bin (at least 1 µs).
    pub lo: f64,
    /// Upper edge of the last bin.
    pub hi: f64,
    /// How many.
    pub n: usize,
    /// Logarithmically spaced.
    pub log: bool,
}

impl Bins {
    /// [`BINS`] bins from the smallest to the largest value of all of `hs`;
    /// `None` when all are empty.
    pub fn covering<'a>(hs: impl IntoIterator<Item = &'a Histogram<u64>>) -> Option<Self> {
        let (mut lo, mut hi) = (u64::MAX, 0);
        for h in hs.into_iter().filter(|h| !h.is_empty()) {
            lo = lo.min(h.lowest_equivalent(h.min()));
            hi = hi.max(h.highest_equivalent(h.max()));
        }
        if hi == 0 && lo == u64::MAX {
            return None;
        }
        let lo = lo.max(1) as f64;
        let hi = (hi as f64).max(lo + 1.0);
        Some(Self { lo, hi, n: BINS, log: hi / lo >= LOG_RATIO })
    }

    /// The `n + 1` edges, µs.
    pub fn edges(&self) -> Vec<f64> {
        (0..=self.n).map(|i| self.edge(i)).collect()
    }

    fn edge(&self, i: usize) -> f64 {
        let f = i as f64 / self.n as f64;
        if self.log {
            self.lo * (self.hi / self.lo).powf(f)
        } else {
            self.lo + (self.hi - self.lo) * f
        }
    }

    /// The bin of `us` (values outside the range count in the first or last bin).
    pub fn index(&self, us: f64) -> usize {
        let f = if self.log {
            (us.max(self.lo) / self.lo).ln() / (self.hi / self.lo).ln()
        } else {
            (us - self.lo) / (self.hi - self.lo)
        };
        let i = (f * self.n as f64).floor();
        if i.is_nan() || i < 0.0 {
            0
        } else {
            (i as usize).min(self.n - 1)
        }
    }

    /// The share of `h`'s values in each bin, in %; all zero when empty.
    pub fn shares(&self, h: &Histogram<u64>) -> Vec<f64> {
        let mut counts = vec![0u64; self.n];
        for v in h.iter_recorded() {
            let us = h.median_equivalent(v.value_iterated_to()) as f64;
            if let Some(c) = counts.get_mut(self.index(us)) {
                *c += v.count_at_value();
            }
        }
        let total = h.len().max(1) as f64;
        counts.into_iter().map(|c| c as f64 * 100.0 / total).collect()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
pub(crate) mod tests {
    use super::*;

    /// A histogram of `values` (µs), as the load generator keeps them.
    pub(crate) fn hist(values: impl IntoIterator<Item = u64>) -> Histogram<u64> {
        let mut h = Histogram::new_with_bounds(1, 3_600_000_000, 3).unwrap();
        for v in values {
            h.record(v).unwrap();
        }
        h
    }

    #[test]
    fn cdf_goes_from_0_to_100_through_the_median() {
        let h = hist((1..=100).map(|ms| ms * 1000));
        let c = cdf(&h);
        assert_eq!(c.first(), Some(&(1.0, 0.0)));
        assert_eq!(c.last().map(|p| p.1), Some(100.0));
        assert!((c.last().unwrap().0 - 100.0).abs() < 0.1, "{c:?}");
        // 50 of the 100 values are at or below 50 ms.
        let at_50 = c.iter().find(|p| p.0 >= 50.0).unwrap();
        assert!((at_50.1 - 50.0).abs() < 1e-9 && at_50.0 < 50.1, "{at_50:?}");
        assert!(c.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1), "monotonic: {c:?}");
        assert!(cdf(&hist([])).is_empty());
        // Many distinct values: thinned, the last one kept.
        let wide = hist(1..=100_000);
        let c = cdf(&wide);
        assert!(c.len() <= MAX_CDF_POINTS, "{}", c.len());
        assert_eq!(c.last().map(|p| p.1), Some(100.0));
        // A value of 0 (tokens in the same read) sits at 1 µs.
        assert_eq!(cdf(&hist([0, 0, 5])).first(), Some(&(0.001, 0.0)));
    }

    #[test]
    fn bins_are_shared_and_shares_sum_to_100() {
        let a = hist([10_000, 10_500, 11_000, 12_000]);
        let b = hist([11_000, 14_000]);
        let bins = Bins::covering([&a, &b, &hist([])]).unwrap();
        assert!(!bins.log, "10-14 ms is one linear axis");
        assert!((bins.lo - 10_000.0).abs() < 20.0 && (bins.hi - 14_000.0).abs() < 20.0, "{bins:?}");
        let edges = bins.edges();
        assert_eq!(edges.len(), BINS + 1);
        assert!((edges[BINS] - bins.hi).abs() < 1e-6);
        for h in [&a, &b] {
            let s = bins.shares(h);
            assert!((s.iter().sum::<f64>() - 100.0).abs() < 1e-9, "{s:?}");
        }
        assert_eq!(bins.shares(&a)[0], 25.0);
        assert_eq!(bins.shares(&b)[BINS - 1], 50.0);
        assert_eq!(bins.index(0.0), 0);
        assert_eq!(bins.index(1e12), BINS - 1);
        assert_eq!(bins.index(f64::NAN), 0);

        // 0 µs to 20 ms: logarithmic, from 1 µs; every bin a constant ratio wide.
        let gaps = hist([0, 0, 0, 20_000]);
        let bins = Bins::covering([&gaps]).unwrap();
        assert!(bins.log && bins.lo == 1.0, "{bins:?}");
        let e = bins.edges();
        assert!(((e[1] / e[0]) - (e[BINS] / e[BINS - 1])).abs() < 1e-9);
        let s = bins.shares(&gaps);
        assert_eq!((s[0], s[BINS - 1]), (75.0, 25.0));
        assert!(Bins::covering([&hist([])]).is_none());
    }
}
