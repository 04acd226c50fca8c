//! Wall-clock timestamps as the shapes need them: Unix seconds for OpenAI,
//! RFC 3339 with nanoseconds for Ollama's `created_at`. Formatting is a pure
//! function of the timestamp, so tests can pin it.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A point in time since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Timestamp {
    /// Whole seconds.
    pub secs: u64,
    /// Nanoseconds within the second.
    pub nanos: u32,
}

impl Timestamp {
    /// The current time (the epoch if the clock is before it).
    pub fn now() -> Self {
        let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        Self { secs: d.as_secs(), nanos: d.subsec_nanos() }
    }

    /// Whole seconds, as a timestamp.
    pub fn from_secs(secs: u64) -> Self {
        Self { secs, nanos: 0 }
    }

    /// Nanoseconds since the epoch (saturating).
    pub fn unix_nanos(self) -> u64 {
        self.secs.saturating_mul(1_000_000_000).saturating_add(u64::from(self.nanos))
    }

    /// This time plus `d`.
    pub fn plus(self, d: Duration) -> Self {
        let total = Duration::new(self.secs, self.nanos).saturating_add(d);
        Self { secs: total.as_secs(), nanos: total.subsec_nanos() }
    }

    /// RFC 3339 in UTC, as Go's `time.RFC3339Nano` writes it (what Ollama
    /// sends): fractional seconds with trailing zeros removed, none when zero.
    pub fn rfc3339(self) -> String {
        let days = self.secs / 86_400;
        let rem = self.secs % 86_400;
        let (y, m, d) = iop_core::calendar::civil_from_days(days);
        let mut out = format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}", rem / 3600, rem / 60 % 60, rem % 60);
        if self.nanos > 0 {
            let frac = format!("{:09}", self.nanos);
            out.push('.');
            out.push_str(frac.trim_end_matches('0'));
        }
        out.push('Z');
        out
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn formats_like_go_rfc3339nano() {
        assert_eq!(Timestamp::from_secs(0).rfc3339(), "1970-01-01T00:00:00Z");
        assert_eq!(Timestamp { secs: 1_691_176_339, nanos: 385_406_455 }.rfc3339(), "2023-08-04T19:12:19.385406455Z");
        assert_eq!(Timestamp { secs: 1_691_176_339, nanos: 499_127_000 }.rfc3339(), "2023-08-04T19:12:19.499127Z");
        // Leap day and end of year.
        assert_eq!(Timestamp::from_secs(951_782_400).rfc3339(), "2000-02-29T00:00:00Z");
        assert_eq!(Timestamp::from_secs(1_735_689_599).rfc3339(), "2024-12-31T23:59:59Z");
        assert_eq!(Timestamp { secs: 3, nanos: 7 }.unix_nanos(), 3_000_000_007);
        assert_eq!(Timestamp { secs: u64::MAX, nanos: 7 }.unix_nanos(), u64::MAX);
        assert_eq!(
            Timestamp { secs: 1, nanos: 999_999_999 }.plus(Duration::from_nanos(2)).rfc3339(),
            "1970-01-01T00:00:02.000000001Z"
        );
    }
}
