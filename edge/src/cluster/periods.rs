//! The UTC calendar periods of the token budgets: a day and a month, each
//! as an index (what a counter is named by) and the seconds left in it
//! (a refusal's `Retry-After`, a counter's expiry).

use std::time::{SystemTime, UNIX_EPOCH};

const DAY: u64 = 86_400;

/// A period: its index and the seconds until it ends (at least 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Period {
    /// Days since 1970-01-01, or months since 1970-01 (`year * 12 + month - 1 - 1970 * 12`).
    pub index: u64,
    /// Seconds until the next period starts.
    pub left: u64,
}

/// Seconds since the Unix epoch now.
pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The UTC day of `unix` seconds.
pub fn day(unix: u64) -> Period {
    Period { index: unix / DAY, left: DAY - unix % DAY }
}

/// The UTC calendar month of `unix` seconds.
pub fn month(unix: u64) -> Period {
    let days = unix / DAY;
    let (y, m, _) = iop_core::calendar::civil_from_days(days);
    let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
    let next = days_from_civil(ny, nm, 1).saturating_mul(DAY);
    Period { index: (y.saturating_sub(1970)) * 12 + (m - 1), left: next.saturating_sub(unix).max(1) }
}

/// Days since 1970-01-01 of a date on or after it (`days_from_civil`).
fn days_from_civil(y: u64, m: u64, d: u64) -> u64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y / 400;
    let yoe = y - era * 400;
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    (era * 146_097 + doe).saturating_sub(719_468)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn days_and_months_in_utc() {
        // 2024-02-29T23:59:59Z: a leap day's last second.
        let t = 1_709_251_199;
        assert_eq!(day(t), Period { index: 19_782, left: 1 });
        assert_eq!(month(t), Period { index: (2024 - 1970) * 12 + 1, left: 1 });
        // One second later: March, a fresh day and month.
        assert_eq!(month(t + 1), Period { index: (2024 - 1970) * 12 + 2, left: 31 * DAY });
        assert_eq!(day(t + 1).left, DAY);
        // 2023-12-15T12:00:00Z: the year rolls over at the month's end.
        let t = 1_702_641_600;
        assert_eq!(month(t).left, 16 * DAY + DAY / 2);
        assert_eq!(month(0), Period { index: 0, left: 31 * DAY });
        for days in [0, 59, 365, 10_957, 19_782, 40_000] {
            let (y, m, d) = iop_core::calendar::civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
    }
}
