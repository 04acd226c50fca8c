//! Bounded idle-connection pool, keyed by `(host, port)`. Single reactor
//! thread: plain `RefCell`, no locks.

use std::{
    cell::RefCell,
    collections::VecDeque,
    rc::Rc,
    time::{Duration, Instant},
};

use iop_core::net::Stream;

/// Which upstream a connection belongs to. The host is shared: a pooled
/// connection's key is a reference count, not a copy per request.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct PoolKey {
    pub(crate) host: Rc<str>,
    pub(crate) port: u16,
    /// https: never shared with plain connections to the same port.
    pub(crate) tls: bool,
}

impl PoolKey {
    pub(crate) fn new(host: &str, port: u16, tls: bool) -> Self {
        Self { host: host.into(), port, tls }
    }

    fn is(&self, host: &str, port: u16, tls: bool) -> bool {
        self.port == port && self.tls == tls && *self.host == *host
    }
}

struct Idle {
    stream: Stream,
    since: Instant,
}

/// Idle keep-alive connections, by upstream: a short list scanned by
/// borrowed host (a node talks to a few providers), so finding one
/// allocates nothing.
pub(crate) struct Pool {
    idle: RefCell<Vec<(PoolKey, VecDeque<Idle>)>>,
    max_per_host: usize,
    idle_timeout: Duration,
}

impl Pool {
    pub(crate) fn new(max_per_host: usize, idle_timeout: Duration) -> Self {
        Self { idle: RefCell::new(Vec::new()), max_per_host, idle_timeout }
    }

    /// The most recently parked live connection to `host:port` (the one
    /// least likely to have been closed by the peer) and its key, if any.
    pub(crate) fn take(&self, host: &str, port: u16, tls: bool) -> Option<(Stream, PoolKey)> {
        let mut idle = self.idle.borrow_mut();
        let at = idle.iter().position(|(k, _)| k.is(host, port, tls))?;
        let now = Instant::now();
        let (key, queue) = &mut idle[at];
        let mut found = None;
        while let Some(conn) = queue.pop_back() {
            if now.saturating_duration_since(conn.since) < self.idle_timeout {
                found = Some((conn.stream, key.clone()));
                break;
            }
            // Expired: dropping closes it. Older ones behind it are expired too.
            queue.clear();
        }
        if queue.is_empty() {
            idle.swap_remove(at);
        }
        found
    }

    /// Parks a connection whose last response ended cleanly.
    pub(crate) fn put(&self, key: PoolKey, stream: Stream) {
        if self.max_per_host == 0 {
            return;
        }
        let mut idle = self.idle.borrow_mut();
        let now = Instant::now();
        // Expired and closed connections of every host go in the client's
        // sweep (`sweep`), not on each request's way back.
        let at = match idle.iter().position(|(k, _)| *k == key) {
            Some(at) => at,
            None => {
                idle.push((key, VecDeque::new()));
                idle.len() - 1
            }
        };
        let queue = &mut idle[at].1;
        while queue.len() >= self.max_per_host {
            queue.pop_front();
        }
        queue.push_back(Idle { stream, since: now });
    }

    /// Drops every parked connection that expired or that the peer closed
    /// (or sent bytes on), so a closed connection does not sit in
    /// CLOSE_WAIT until the next request to its host. Returns how many are
    /// still parked.
    pub(crate) fn sweep(&self) -> usize {
        let mut idle = self.idle.borrow_mut();
        let now = Instant::now();
        idle.retain_mut(|(_, q)| {
            q.retain(|c| now.saturating_duration_since(c.since) < self.idle_timeout && c.stream.idle_and_open());
            !q.is_empty()
        });
        idle.iter().map(|(_, q)| q.len()).sum()
    }

    /// Idle connections parked for `host:port`.
    pub(crate) fn idle_count(&self, host: &str, port: u16, tls: bool) -> usize {
        self.idle.borrow().iter().find(|(k, _)| k.is(host, port, tls)).map_or(0, |(_, q)| q.len())
    }
}
