//! The distributions of a run in its JSON report (`series`), so that saved
//! reports can be plotted later and side by side (`iop-loadtest report`):
//! the timeline, and each HDR histogram in HdrHistogram's V2 compressed
//! format, base64 (the `HISTFAAA…` strings of HdrHistogram's log files,
//! which its other tools read too).

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use hdrhistogram::serialization::{Deserializer, Serializer as _, V2DeflateSerializer};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use super::stats::Recorder;
use super::timeline::Timeline;

/// Longest encoded histogram accepted when reading (a 1 µs - 1 h histogram
/// at 3 digits encodes in a few KiB).
const MAX_ENCODED: usize = 1 << 20;
/// Widest histogram accepted when reading: 2 significant digits more than
/// the recorder's would already be 100 times its memory.
const MAX_DIGITS: u8 = 4;

/// Why a saved histogram could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SeriesError {
    /// Too long to be one of ours.
    #[error("histogram {name}: {len} base64 bytes, at most {MAX_ENCODED}")]
    TooLong {
        /// Which histogram.
        name: &'static str,
        /// Its length.
        len: usize,
    },
    /// Not base64.
    #[error("histogram {name}: not base64: {source}")]
    Base64 {
        /// Which histogram.
        name: &'static str,
        /// What the decoder said.
        source: base64::DecodeError,
    },
    /// Not a V2 histogram.
    #[error("histogram {name}: {source}")]
    Hdr {
        /// Which histogram.
        name: &'static str,
        /// What the deserializer said.
        source: hdrhistogram::serialization::DeserializeError,
    },
    /// A histogram too precise to be one of ours.
    #[error("histogram {name}: {digits} significant digits, at most {MAX_DIGITS}")]
    Digits {
        /// Which histogram.
        name: &'static str,
        /// Its precision.
        digits: u8,
    },
    /// A timeline that does not hold together.
    #[error("{0}")]
    Timeline(String),
}

/// The `series` object of the JSON report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Series {
    /// Completions, errors and tokens over time.
    pub timeline: Timeline,
    /// Time to first byte, µs (V2 compressed, base64).
    pub ttfb: String,
    /// Time to first token, µs.
    pub ttft: String,
    /// Whole request, µs.
    pub total: String,
    /// Inter-token gaps, µs.
    pub itl: String,
}

/// The histograms of a run, decoded.
#[derive(Debug, Clone)]
pub struct Histograms {
    /// Time to first byte, µs.
    pub ttfb: Histogram<u64>,
    /// Time to first token, µs.
    pub ttft: Histogram<u64>,
    /// Whole request, µs.
    pub total: Histogram<u64>,
    /// Inter-token gaps, µs.
    pub itl: Histogram<u64>,
}

impl Histograms {
    /// The recorder's histograms.
    pub fn of(r: &Recorder) -> Self {
        Self { ttfb: r.ttfb.clone(), ttft: r.ttft.clone(), total: r.total.clone(), itl: r.itl.clone() }
    }

    /// Adds another run's histograms (rounds of one system, pooled).
    pub fn add(&mut self, other: &Histograms) -> Result<(), hdrhistogram::AdditionError> {
        self.ttfb.add(&other.ttfb)?;
        self.ttft.add(&other.ttft)?;
        self.total.add(&other.total)?;
        self.itl.add(&other.itl)
    }
}

fn encode(h: &Histogram<u64>) -> String {
    let mut bytes = Vec::new();
    match V2DeflateSerializer::new().serialize(h, &mut bytes) {
        Ok(_) => STANDARD.encode(bytes),
        // Writing to a Vec fails only if the histogram cannot be encoded at
        // all; the report then lacks that one plot.
        Err(e) => {
            tracing::warn!(error = ?e, "cannot encode a histogram");
            String::new()
        }
    }
}

fn decode(name: &'static str, text: &str) -> Result<Histogram<u64>, SeriesError> {
    if text.len() > MAX_ENCODED {
        return Err(SeriesError::TooLong { name, len: text.len() });
    }
    let bytes = STANDARD.decode(text).map_err(|source| SeriesError::Base64 { name, source })?;
    let h: Histogram<u64> =
        Deserializer::new().deserialize(&mut bytes.as_slice()).map_err(|source| SeriesError::Hdr { name, source })?;
    if h.sigfig() > MAX_DIGITS {
        return Err(SeriesError::Digits { name, digits: h.sigfig() });
    }
    Ok(h)
}

impl Series {
    /// The series of a finished run.
    pub fn of(r: &Recorder) -> Self {
        Self {
            timeline: r.timeline.clone(),
            ttfb: encode(&r.ttfb),
            ttft: encode(&r.ttft),
            total: encode(&r.total),
            itl: encode(&r.itl),
        }
    }

    /// The histograms back, checked.
    pub fn histograms(&self) -> Result<Histograms, SeriesError> {
        self.timeline.validate().map_err(SeriesError::Timeline)?;
        Ok(Histograms {
            ttfb: decode("ttfb", &self.ttfb)?,
            ttft: decode("ttft", &self.ttft)?,
            total: decode("total", &self.total)?,
            itl: decode("itl", &self.itl)?,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::load::stats::Measure;

    #[test]
    fn roundtrips_through_json() {
        let mut r = Recorder::new().unwrap();
        for ms in 1..=100 {
            r.ok(&Measure {
                ttfb: Some(Duration::from_micros(ms * 900)),
                ttft: Some(Duration::from_millis(ms)),
                total: Duration::from_millis(ms * 3),
                gaps_us: vec![0, ms * 10],
                tokens: 3,
                ..Measure::default()
            });
        }
        r.timeline.ok(Duration::from_millis(1500), 3);
        let s = Series::of(&r);
        assert!(s.total.starts_with("HISTFAAA"), "HdrHistogram's V2 compressed cookie: {}", s.total);
        let json = serde_json::to_string(&s).unwrap();
        assert!(json.len() < 4096, "compact: {} bytes", json.len());
        let back: Series = serde_json::from_str(&json).unwrap();
        let h = back.histograms().unwrap();
        assert_eq!(h.total, r.total);
        assert_eq!(h.itl, r.itl);
        assert_eq!(h.ttft.value_at_quantile(0.5), r.ttft.value_at_quantile(0.5));
        assert_eq!(back.timeline.completed, [0, 1]);

        let broken = |f: fn(&mut Series)| {
            let mut s = back.clone();
            f(&mut s);
            s.histograms().unwrap_err().to_string()
        };
        assert!(broken(|s| s.ttft = "!!".into()).contains("ttft: not base64"));
        assert!(broken(|s| s.itl = STANDARD.encode(b"garbage")).contains("histogram itl"));
        assert!(broken(|s| s.ttfb = "A".repeat(MAX_ENCODED + 4)).contains("at most"));
        assert!(broken(|s| s.timeline.bucket_sec = 0).contains("power of two"));
        let precise = Histogram::<u64>::new_with_bounds(1, 1000, 5).unwrap();
        let mut s = back.clone();
        s.total = encode(&precise);
        assert!(s.histograms().unwrap_err().to_string().contains("5 significant digits"));
    }
}
