//! Tools for the hostile-input tests: connections that trickle bytes, a
//! peak-RSS sampler, connecting from another loopback address, and the
//! well-behaved client that must stay fast while an attack runs.

use std::{
    io::{ErrorKind, Read, Write},
    net::{IpAddr, SocketAddr, TcpStream},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use serde_json::json;

use crate::harness::*;

/// Attack tests measure latency and memory while loading both cores, so
/// they take turns: each holds this for its whole run (other tests are
/// light and may still run beside one).
pub fn exclusive() -> std::sync::MutexGuard<'static, ()> {
    static MACHINE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    MACHINE.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// 100 MiB: how far above its idle RSS the edge may go during an attack.
pub const RSS_HEADROOM_KIB: u64 = 100 * 1024;

/// A chat completion on `model` must succeed within a second.
pub fn assert_served_quickly(addr: SocketAddr, model: &str) {
    let started = Instant::now();
    let r = post_json(
        addr,
        "/v1/chat/completions",
        &json!({"model": model, "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}),
    );
    let took = started.elapsed();
    assert_eq!(r.status, 200, "well-behaved client: {}", String::from_utf8_lossy(&r.body));
    assert!(took < Duration::from_secs(1), "a well-behaved client waited {took:?} during the attack");
}

/// Samples a process's RSS every 20 ms until stopped; reports the peak.
pub struct RssPeak {
    stop: Arc<AtomicBool>,
    peak: Arc<AtomicU64>,
    handle: Option<JoinHandle<()>>,
}

impl RssPeak {
    pub fn start(proc: &Proc) -> RssPeak {
        let pid = proc.child.id();
        let (stop, peak) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(proc.rss_kib())));
        let handle = {
            let (stop, peak) = (stop.clone(), peak.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if let Some(kib) = rss_of(pid) {
                        peak.fetch_max(kib, Ordering::Relaxed);
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        };
        RssPeak { stop, peak, handle: Some(handle) }
    }

    /// Stops sampling; the peak RSS in KiB.
    pub fn stop(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
        self.peak.load(Ordering::Relaxed)
    }
}

fn rss_of(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Asserts a peak stayed within [`RSS_HEADROOM_KIB`] of `idle`.
pub fn assert_rss_bounded(what: &str, idle: u64, peak: u64) {
    assert!(
        peak <= idle + RSS_HEADROOM_KIB,
        "{what}: edge RSS peaked at {} MiB, idle was {} MiB (allowed +{} MiB)",
        peak / 1024,
        idle / 1024,
        RSS_HEADROOM_KIB / 1024
    );
}

/// A TCP connection to `to` from the local address `from` (e.g. another
/// loopback address, so per-address limits see a different peer).
pub fn connect_from(from: IpAddr, to: SocketAddr) -> TcpStream {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::for_address(to), Type::STREAM, None).expect("socket");
    socket.bind(&SocketAddr::new(from, 0).into()).expect("bind source address");
    socket.connect(&to.into()).expect("connect");
    socket.into()
}

/// What one trickling connection saw.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// Bytes the edge answered.
    pub response: Vec<u8>,
    /// When the first answer byte arrived (from the start).
    pub answered: Option<Duration>,
    /// When the edge closed the connection (EOF or reset).
    pub closed: Option<Duration>,
    /// Bytes of the payload written.
    pub sent: usize,
}

impl Outcome {
    pub fn status(&self) -> Option<u16> {
        let line = self.response.split(|&b| b == b'\r').next()?;
        std::str::from_utf8(line).ok()?.split(' ').nth(1)?.parse().ok()
    }
}

/// Opens `n` connections that each send `burst` bytes of `payload` at once,
/// then one more byte every `interval`, until the edge answers; runs until
/// every connection is closed or `run_for` passed. Each connection stops
/// writing once answered (so the answer is not lost to a reset).
pub fn trickle(
    addr: SocketAddr,
    n: usize,
    payload: &[u8],
    burst: usize,
    interval: Duration,
    run_for: Duration,
) -> Vec<Outcome> {
    let started = Instant::now();
    let mut conns: Vec<(TcpStream, Outcome)> = (0..n)
        .map(|_| {
            let s = TcpStream::connect(addr).expect("connect");
            s.set_nonblocking(true).expect("nonblocking");
            (s, Outcome::default())
        })
        .collect();
    for (s, o) in &mut conns {
        let first = &payload[..burst.min(payload.len())];
        if !first.is_empty() {
            s.set_nonblocking(false).expect("blocking");
            s.write_all(first).expect("burst");
            s.set_nonblocking(true).expect("nonblocking");
            o.sent = first.len();
        }
    }
    let mut next_byte = Instant::now() + interval;
    while started.elapsed() < run_for && conns.iter().any(|(_, o)| o.closed.is_none()) {
        let byte_due = Instant::now() >= next_byte;
        if byte_due {
            next_byte += interval;
        }
        for (s, o) in conns.iter_mut().filter(|(_, o)| o.closed.is_none()) {
            let mut buf = [0u8; 4096];
            loop {
                match s.read(&mut buf) {
                    Ok(0) => {
                        o.closed = Some(started.elapsed());
                        break;
                    }
                    Ok(got) => {
                        o.answered.get_or_insert(started.elapsed());
                        o.response.extend_from_slice(&buf[..got]);
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(_) => {
                        o.closed = Some(started.elapsed());
                        break;
                    }
                }
            }
            if byte_due && o.answered.is_none() && o.closed.is_none() && o.sent < payload.len() {
                match s.write(&payload[o.sent..o.sent + 1]) {
                    Ok(k) => o.sent += k,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                    Err(_) => o.closed = Some(started.elapsed()),
                }
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    conns.into_iter().map(|(_, o)| o).collect()
}

/// Runs `attack` on a thread while the well-behaved client and the RSS
/// sampler watch the edge; returns the attack's result.
pub fn while_attacked<T: Send + 'static>(
    edge: &Edge,
    model: &str,
    checks: usize,
    attack: impl FnOnce() -> T + Send + 'static,
) -> (T, u64) {
    let peak = RssPeak::start(&edge.proc);
    let handle = std::thread::spawn(attack);
    // Let the attack get going, then check the good client a few times.
    std::thread::sleep(Duration::from_millis(300));
    for _ in 0..checks {
        assert_served_quickly(edge.http, model);
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = match handle.join() {
        Ok(out) => out,
        Err(e) => std::panic::resume_unwind(e),
    };
    (out, peak.stop())
}
