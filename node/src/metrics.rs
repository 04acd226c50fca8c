//! The node's Prometheus metrics (`GET /metrics` on `metrics_listen`, when
//! configured): response stalls by the health their probe found, and how
//! long the provider had been silent; credential lease refusals; what
//! became of run store rows. Each counts at most once per run, so
//! process-wide atomics suffice; the listener is a thread of its own with blocking,
//! deadline-bound I/O, never a reactor.

use std::{
    fmt::Write as _,
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use iop_core::liveness::ProviderHealth;

/// Bucket bounds of the stall duration histogram, in seconds.
const BUCKETS: [f64; 12] = [0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0];
/// Reading a scrape's request, and writing its answer, must finish in this.
const IO_DEADLINE: Duration = Duration::from_secs(5);

static STALLS: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];
static DURATION: [AtomicU64; BUCKETS.len() + 1] = [const { AtomicU64::new(0) }; BUCKETS.len() + 1];
static DURATION_SUM_US: AtomicU64 = AtomicU64::new(0);

const HEALTHS: [ProviderHealth; 4] =
    [ProviderHealth::Available, ProviderHealth::Unavailable, ProviderHealth::Unknown, ProviderHealth::Starting];

static LEASE_REFUSALS: [AtomicU64; 7] = [const { AtomicU64::new(0) }; 7];

/// What became of run store rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreRows {
    /// Committed.
    Written,
    /// Dropped: the store's channel was full.
    Dropped,
    /// Their batch failed to commit.
    Failed,
    /// Deleted by retention.
    Pruned,
}

const STORE_RESULTS: [(StoreRows, &str); 4] = [
    (StoreRows::Written, "written"),
    (StoreRows::Dropped, "dropped"),
    (StoreRows::Failed, "failed"),
    (StoreRows::Pruned, "pruned"),
];

static STORE_ROWS: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];

/// Counts `n` run store rows that met `result`.
pub fn store_rows(result: StoreRows, n: u64) {
    let i = STORE_RESULTS.iter().position(|(r, _)| *r == result).unwrap_or(0);
    STORE_ROWS[i].fetch_add(n, Ordering::Relaxed);
}

/// Records a refused credential lease by its reason (a closed label).
pub fn lease_refused(reason: &str) {
    let i = iop_core::lease::LeaseError::ALL.iter().position(|e| e.label() == reason).unwrap_or(6);
    LEASE_REFUSALS[i].fetch_add(1, Ordering::Relaxed);
}

/// Records one stall: the probe's finding and how long nothing had come.
pub fn stall(health: ProviderHealth, idle: Duration) {
    let i = HEALTHS.iter().position(|h| *h == health).unwrap_or(2);
    STALLS[i].fetch_add(1, Ordering::Relaxed);
    let s = idle.as_secs_f64();
    let b = BUCKETS.iter().position(|b| s <= *b).unwrap_or(BUCKETS.len());
    DURATION[b].fetch_add(1, Ordering::Relaxed);
    DURATION_SUM_US.fetch_add(u64::try_from(idle.as_micros()).unwrap_or(u64::MAX), Ordering::Relaxed);
}

/// The text exposition.
pub fn render() -> String {
    let mut out = String::new();
    out.push_str("# HELP iop_node_response_stalls_total Requests the node ended as response_stalled, by the health its probe found.\n");
    out.push_str("# TYPE iop_node_response_stalls_total counter\n");
    for (h, c) in HEALTHS.iter().zip(STALLS.iter()) {
        let _ =
            writeln!(out, "iop_node_response_stalls_total{{health=\"{}\"}} {}", h.as_str(), c.load(Ordering::Relaxed));
    }
    out.push_str("# HELP iop_node_response_stall_duration_seconds How long the provider had sent nothing when a stall was claimed.\n");
    out.push_str("# TYPE iop_node_response_stall_duration_seconds histogram\n");
    let mut cumulative = 0;
    for (i, bound) in BUCKETS.iter().enumerate() {
        cumulative += DURATION[i].load(Ordering::Relaxed);
        let _ = writeln!(out, "iop_node_response_stall_duration_seconds_bucket{{le=\"{bound}\"}} {cumulative}");
    }
    cumulative += DURATION[BUCKETS.len()].load(Ordering::Relaxed);
    let _ = writeln!(out, "iop_node_response_stall_duration_seconds_bucket{{le=\"+Inf\"}} {cumulative}");
    let sum = DURATION_SUM_US.load(Ordering::Relaxed) as f64 / 1e6;
    let _ = writeln!(out, "iop_node_response_stall_duration_seconds_sum {sum}");
    let _ = writeln!(out, "iop_node_response_stall_duration_seconds_count {cumulative}");
    out.push_str("# HELP iop_node_credential_lease_refusals_total Runs failed closed because their credential lease was refused, by reason.\n");
    out.push_str("# TYPE iop_node_credential_lease_refusals_total counter\n");
    for (e, c) in iop_core::lease::LeaseError::ALL.iter().zip(LEASE_REFUSALS.iter()) {
        let _ = writeln!(
            out,
            "iop_node_credential_lease_refusals_total{{reason=\"{}\"}} {}",
            e.label(),
            c.load(Ordering::Relaxed)
        );
    }
    out.push_str(
        "# HELP iop_node_run_store_rows_total Run store rows by what became of them (dropped: its queue was full).\n",
    );
    out.push_str("# TYPE iop_node_run_store_rows_total counter\n");
    for ((_, label), c) in STORE_RESULTS.iter().zip(STORE_ROWS.iter()) {
        let _ = writeln!(out, "iop_node_run_store_rows_total{{result=\"{label}\"}} {}", c.load(Ordering::Relaxed));
    }
    out
}

/// Binds `addr` and serves scrapes from a thread of its own.
pub fn serve(addr: SocketAddr) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)?;
    let bound = listener.local_addr()?;
    std::thread::Builder::new().name("iop-node-metrics".into()).spawn(move || {
        for conn in listener.incoming().flatten() {
            // One at a time, each bounded by its deadlines: a slow scraper
            // delays only the next scrape.
            let _ = answer(conn);
        }
    })?;
    Ok(bound)
}

fn answer(mut conn: TcpStream) -> std::io::Result<()> {
    conn.set_read_timeout(Some(IO_DEADLINE))?;
    conn.set_write_timeout(Some(IO_DEADLINE))?;
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = conn.read(&mut buf)?;
        if n == 0 || head.len() + n > 8192 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let (status, body) = if line.starts_with(b"GET /metrics ") || line == b"GET /metrics" {
        ("200 OK", render())
    } else {
        ("404 Not Found", "only GET /metrics is served here\n".to_owned())
    };
    let resp = format!(
        "HTTP/1.1 {status}\r\ncontent-type: text/plain; version=0.0.4; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(resp.as_bytes())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn a_scrape_shows_the_stalls_recorded() {
        let addr = serve("127.0.0.1:0".parse().unwrap()).unwrap();
        stall(ProviderHealth::Unavailable, Duration::from_millis(400));
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n").unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
        let n: u64 = text
            .lines()
            .find(|l| l.starts_with("iop_node_response_stalls_total{health=\"unavailable\"}"))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap();
        assert!(n >= 1, "{text}");
        assert!(text.contains("iop_node_response_stall_duration_seconds_bucket{le=\"0.5\"}"), "{text}");
        assert!(text.contains("iop_node_run_store_rows_total{result=\"dropped\"}"), "{text}");
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"GET /other HTTP/1.1\r\n\r\n").unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        assert!(text.starts_with("HTTP/1.1 404"), "{text}");
    }
}
