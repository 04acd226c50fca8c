//! Bounded idle-connection pool, keyed by `(host, port)`. Single reactor
//! thread: plain `RefCell`, no locks.

use std::{
    cell::RefCell,
    collections::{HashMap, VecDeque},
    time::{Duration, Instant},
};

use iop_core::net::Stream;

/// Which upstream a connection belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct PoolKey {
    pub(crate) host: String,
    pub(crate) port: u16,
    /// https: never shared with plain connections to the same port.
    pub(crate) tls: bool,
}

struct Idle {
    stream: Stream,
    since: Instant,
}

/// Idle keep-alive connections.
pub(crate) struct Pool {
    idle: RefCell<HashMap<PoolKey, VecDeque<Idle>>>,
    max_per_host: usize,
    idle_timeout: Duration,
}

impl Pool {
    pub(crate) fn new(max_per_host: usize, idle_timeout: Duration) -> Self {
        Self { idle: RefCell::new(HashMap::new()), max_per_host, idle_timeout }
    }

    /// The most recently parked live connection (the one least likely to
    /// have been closed by the peer), if any.
    pub(crate) fn take(&self, key: &PoolKey) -> Option<Stream> {
        let mut idle = self.idle.borrow_mut();
        let queue = idle.get_mut(key)?;
        let now = Instant::now();
        let mut found = None;
        while let Some(conn) = queue.pop_back() {
            if now.saturating_duration_since(conn.since) < self.idle_timeout {
                found = Some(conn.stream);
                break;
            }
            // Expired: dropping closes it. Older ones behind it are expired too.
            queue.clear();
        }
        if queue.is_empty() {
            idle.remove(key);
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
        // Sweep every host now and then so unused upstreams do not keep
        // expired sockets open forever; there are only a few hosts.
        idle.retain(|_, q| {
            q.retain(|c| now.saturating_duration_since(c.since) < self.idle_timeout);
            !q.is_empty()
        });
        let queue = idle.entry(key).or_default();
        while queue.len() >= self.max_per_host {
            queue.pop_front();
        }
        queue.push_back(Idle { stream, since: now });
    }

    /// Idle connections parked for `key`.
    pub(crate) fn idle_count(&self, key: &PoolKey) -> usize {
        self.idle.borrow().get(key).map_or(0, VecDeque::len)
    }
}
