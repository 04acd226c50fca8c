//! Per-worker measurements: HDR histograms (µs), counters, error classes and
//! a timeline, merged into one [`Recorder`] at the end of a run.

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;

use super::timeline::Timeline;

/// Largest latency recorded: one hour, in µs (larger values saturate).
const MAX_US: u64 = 3_600_000_000;

/// Why one request failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The TCP connection could not be opened.
    Connect,
    /// The request did not finish within `--timeout-sec`.
    Timeout,
    /// A read or write failed (reset, broken pipe).
    Io,
    /// The server answered with a status other than 200.
    Status(u16),
    /// The response was malformed or incomplete; the label says how.
    Protocol(&'static str),
}

impl Failure {
    /// Low-cardinality class name.
    pub fn class(&self) -> &'static str {
        match self {
            Failure::Connect => "connect",
            Failure::Timeout => "timeout",
            Failure::Io => "io",
            Failure::Status(_) => "status",
            Failure::Protocol(_) => "protocol",
        }
    }
}

/// Error counts by class.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Errors {
    /// Connections that could not be opened.
    pub connect: u64,
    /// Requests over `--timeout-sec`.
    pub timeout: u64,
    /// Read/write failures.
    pub io: u64,
    /// Non-200 answers by status code.
    pub status: BTreeMap<u16, u64>,
    /// Invalid responses by reason.
    pub protocol: BTreeMap<&'static str, u64>,
}

impl Errors {
    /// Counts one failure.
    pub fn add(&mut self, failure: Failure) {
        match failure {
            Failure::Connect => self.connect += 1,
            Failure::Timeout => self.timeout += 1,
            Failure::Io => self.io += 1,
            Failure::Status(code) => *self.status.entry(code).or_default() += 1,
            Failure::Protocol(reason) => *self.protocol.entry(reason).or_default() += 1,
        }
    }

    /// All failures.
    pub fn total(&self) -> u64 {
        self.connect + self.timeout + self.io + self.status.values().sum::<u64>() + self.protocol.values().sum::<u64>()
    }

    fn merge(&mut self, other: &Errors) {
        self.connect += other.connect;
        self.timeout += other.timeout;
        self.io += other.io;
        for (k, v) in &other.status {
            *self.status.entry(*k).or_default() += v;
        }
        for (k, v) in &other.protocol {
            *self.protocol.entry(k).or_default() += v;
        }
    }
}

/// What one valid response measured.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Measure {
    /// Request written to the first byte of the response.
    pub ttfb: Option<Duration>,
    /// Request written to the first content (or reasoning) delta; streams only.
    pub ttft: Option<Duration>,
    /// Request written to the end of the response.
    pub total: Duration,
    /// Gaps between consecutive token deltas, in µs.
    pub gaps_us: Vec<u64>,
    /// Token deltas received (streams) or `usage.completion_tokens` (JSON).
    pub tokens: u64,
    /// `usage.completion_tokens` when the server reported it.
    pub usage_tokens: Option<u64>,
    /// SSE events received (`data: [DONE]` included); streams only.
    pub events: u64,
    /// Response body bytes (the entity, after any chunked decoding).
    pub body_bytes: u64,
    /// The client closed the connection on purpose (`--disconnect-after`).
    pub cut: bool,
}

/// Histograms and counters of one worker, or of the whole run once merged.
#[derive(Debug, Clone)]
pub struct Recorder {
    /// Time to the first response byte, µs.
    pub ttfb: Histogram<u64>,
    /// Time to the first token, µs (streams).
    pub ttft: Histogram<u64>,
    /// Whole-request latency, µs.
    pub total: Histogram<u64>,
    /// Inter-token gaps, µs (streams).
    pub itl: Histogram<u64>,
    /// Requests started (valid, failed or cut off by the timeout).
    pub requests: u64,
    /// Requests answered with a valid 200 response.
    pub completed: u64,
    /// Tokens of the completed requests.
    pub tokens: u64,
    /// Sum of `usage.completion_tokens` of the completed requests.
    pub usage_tokens: u64,
    /// SSE events of the completed requests.
    pub events: u64,
    /// Response body bytes of the completed requests.
    pub body_bytes: u64,
    /// TCP connections opened.
    pub connections: u64,
    /// Open loop: requests that started at least [`LATE_START`] after their slot.
    pub late_starts: u64,
    /// `--disconnect-after`: (request number, wall-clock Unix ns just before
    /// the close) of each stream the client cut.
    pub disconnects: Vec<(u64, u64)>,
    /// Failed requests by class.
    pub errors: Errors,
    /// Completions, errors and tokens over the run's time.
    pub timeline: Timeline,
}

/// How late an open-loop request may start and still count as on time.
pub const LATE_START: Duration = Duration::from_millis(10);

fn histogram() -> Result<Histogram<u64>, hdrhistogram::CreationError> {
    Histogram::new_with_bounds(1, MAX_US, 3)
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl Recorder {
    /// Empty histograms (1 µs to 1 h, 3 significant digits).
    pub fn new() -> Result<Self, hdrhistogram::CreationError> {
        Ok(Self {
            ttfb: histogram()?,
            ttft: histogram()?,
            total: histogram()?,
            itl: histogram()?,
            requests: 0,
            completed: 0,
            tokens: 0,
            usage_tokens: 0,
            events: 0,
            body_bytes: 0,
            connections: 0,
            late_starts: 0,
            disconnects: Vec::new(),
            errors: Errors::default(),
            timeline: Timeline::new(),
        })
    }

    /// Records one valid response.
    pub fn ok(&mut self, m: &Measure) {
        self.requests += 1;
        self.completed += 1;
        self.tokens += m.tokens;
        self.usage_tokens += m.usage_tokens.unwrap_or(0);
        self.events += m.events;
        self.body_bytes += m.body_bytes;
        if let Some(d) = m.ttfb {
            self.ttfb.saturating_record(micros(d));
        }
        if let Some(d) = m.ttft {
            self.ttft.saturating_record(micros(d));
        }
        self.total.saturating_record(micros(m.total));
        for &gap in &m.gaps_us {
            self.itl.saturating_record(gap);
        }
    }

    /// Records one failed request.
    pub fn fail(&mut self, failure: Failure) {
        self.requests += 1;
        self.errors.add(failure);
    }

    /// Adds another recorder's data to this one.
    pub fn merge(&mut self, other: &Recorder) -> Result<(), hdrhistogram::AdditionError> {
        self.ttfb.add(&other.ttfb)?;
        self.ttft.add(&other.ttft)?;
        self.total.add(&other.total)?;
        self.itl.add(&other.itl)?;
        self.requests += other.requests;
        self.completed += other.completed;
        self.tokens += other.tokens;
        self.usage_tokens += other.usage_tokens;
        self.events += other.events;
        self.body_bytes += other.body_bytes;
        self.connections += other.connections;
        self.late_starts += other.late_starts;
        self.disconnects.extend_from_slice(&other.disconnects);
        self.errors.merge(&other.errors);
        self.timeline.merge(&other.timeline);
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn records_and_merges() {
        let mut a = Recorder::new().unwrap();
        a.ok(&Measure {
            ttfb: Some(Duration::from_micros(100)),
            ttft: Some(Duration::from_micros(200)),
            total: Duration::from_millis(5),
            gaps_us: vec![0, 10, 20],
            tokens: 4,
            usage_tokens: Some(4),
            events: 6,
            body_bytes: 700,
            cut: false,
        });
        a.disconnects.push((1, 10));
        a.fail(Failure::Status(503));
        a.fail(Failure::Protocol("missing_done"));
        let mut b = Recorder::new().unwrap();
        b.fail(Failure::Status(503));
        b.fail(Failure::Connect);
        b.fail(Failure::Timeout);
        b.fail(Failure::Io);
        b.ok(&Measure { total: Duration::from_secs(7200), events: 1, body_bytes: 1, ..Measure::default() });
        b.late_starts = 2;
        b.disconnects.push((2, 20));
        b.timeline.ok(Duration::from_millis(1500), 4);
        a.merge(&b).unwrap();
        assert_eq!(a.timeline.completed, [0, 1]);
        assert_eq!((a.events, a.body_bytes, a.late_starts), (7, 701, 2));
        assert_eq!(a.disconnects, [(1, 10), (2, 20)]);
        assert_eq!((a.requests, a.completed, a.tokens, a.usage_tokens), (8, 2, 4, 4));
        assert_eq!(a.errors.total(), 6);
        assert_eq!(a.errors.status[&503], 2);
        assert_eq!(a.errors.protocol["missing_done"], 1);
        assert_eq!((a.errors.connect, a.errors.timeout, a.errors.io), (1, 1, 1));
        assert_eq!(a.itl.len(), 3);
        assert_eq!(a.total.len(), 2);
        assert!(a.total.max() >= MAX_US / 2, "saturates instead of dropping");
        assert_eq!(a.ttft.len(), 1);
        assert_eq!(Failure::Status(1).class(), "status");
    }
}
