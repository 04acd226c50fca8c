//! `[cluster]`: the API keys' limits enforced across every edge through a
//! Redis-protocol server (Redis or Valkey), the *engine*.
//!
//! One thread per process, `iop-edge-cluster` ([`thread`]), owns the
//! connection. A reactor sends a check through a bounded queue with a
//! one-shot reply and waits for it at most `deadline_ms`; the thread
//! drains what is queued and sends it as one pipeline of one atomic
//! script per check (GCRA, [`scripts`]). Tokens are charged after the
//! response the same way, without waiting. A full queue, a missed
//! deadline or an unreachable engine leave the decision to the key's
//! `on_engine_down`: `open` enforces this edge's share of each limit
//! locally (divided by the edges last seen live), `closed` refuses.
//! Limits set through the admin API are stored in the engine and read
//! back by every edge within a second.

pub mod periods;
pub mod scripts;
mod thread;

use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use iop_core::{
    config::{ClusterSettings, KeyLimits},
    rt::oneshot::{oneshot, OneshotSender},
};

use crate::pool::keys::{LimitTable, Over};

pub use thread::Runner;

/// How long an admin change waits for the engine to store it.
pub const STORE_TIMEOUT: Duration = Duration::from_secs(2);

/// The engine's answer to a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Within every limit: one request taken.
    Allowed,
    /// Over a limit (the wait for day and month is the period's end).
    Over(Over),
}

/// Work for the cluster thread.
pub(crate) enum Job {
    /// Check a key's limits, taking a request when they allow it.
    Check { name: Arc<str>, limits: KeyLimits, reply: OneshotSender<Verdict> },
    /// Charge tokens (no reply).
    Charge { name: Arc<str>, limits: KeyLimits, tokens: u64 },
    /// Store (`Some`) or clear a key's limits.
    Store { name: String, limits: Option<KeyLimits>, reply: OneshotSender<bool> },
}

/// Why a check went without the engine's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unavailable {
    /// The engine is known to be unreachable.
    Down,
    /// The queue to the thread was full.
    QueueFull,
    /// No verdict within the deadline (or the thread dropped it).
    Deadline,
}

/// Counters of the engine's use (process-wide; a check already crosses
/// threads, one more atomic is nothing beside it).
#[derive(Debug, Default)]
pub struct Counters {
    /// Checks the engine allowed.
    pub allowed: AtomicU64,
    /// Checks the engine refused.
    pub refused: AtomicU64,
    /// Checks decided without it, by [`Unavailable`].
    pub down: AtomicU64,
    pub queue_full: AtomicU64,
    pub deadline: AtomicU64,
    /// Charges that could not be queued (kept locally only).
    pub charges_dropped: AtomicU64,
    /// Times the engine was lost.
    pub lost: AtomicU64,
}

/// The reactors' side of the engine.
pub struct Engine {
    tx: crossbeam_channel::Sender<Job>,
    deadline: Duration,
    up: AtomicBool,
    live_edges: AtomicU64,
    /// What was counted.
    pub counters: Counters,
    /// The limits set at run time (the engine's copy, refreshed by the thread).
    pub limits: Arc<LimitTable>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("up", &self.is_up()).field("live_edges", &self.live_edges()).finish()
    }
}

impl Engine {
    /// The engine for `settings` and the thread that will serve it (started
    /// with [`Runner::spawn`] once the process's state exists).
    pub fn new(settings: &ClusterSettings, instance: &str, limits: Arc<LimitTable>) -> (Arc<Engine>, Runner) {
        let (tx, rx) = crossbeam_channel::bounded(settings.queue);
        let engine = Arc::new(Engine {
            tx,
            deadline: settings.deadline,
            up: AtomicBool::new(false),
            live_edges: AtomicU64::new(1),
            counters: Counters::default(),
            limits,
        });
        let runner = Runner::new(settings, instance, engine.clone(), rx);
        (engine, runner)
    }

    /// Whether the engine answered last time the thread asked.
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    /// The edges seen live at the last presence round (at least 1; the
    /// last count stays while the engine is down).
    pub fn live_edges(&self) -> u64 {
        self.live_edges.load(Ordering::Relaxed).max(1)
    }

    /// The engine's verdict on a request of key `name` under `limits`, or
    /// why there is none within the deadline.
    pub async fn check(&self, name: &Arc<str>, limits: KeyLimits) -> Result<Verdict, Unavailable> {
        let c = &self.counters;
        if !self.is_up() {
            c.down.fetch_add(1, Ordering::Relaxed);
            return Err(Unavailable::Down);
        }
        let (reply, rx) = oneshot();
        if self.tx.try_send(Job::Check { name: name.clone(), limits, reply }).is_err() {
            c.queue_full.fetch_add(1, Ordering::Relaxed);
            return Err(Unavailable::QueueFull);
        }
        match iop_core::rt::time::timeout(self.deadline, rx).await {
            Ok(Some(v)) => {
                let n = if v == Verdict::Allowed { &c.allowed } else { &c.refused };
                n.fetch_add(1, Ordering::Relaxed);
                Ok(v)
            }
            // Dropped unanswered: the engine failed under it.
            Ok(None) | Err(_) => {
                c.deadline.fetch_add(1, Ordering::Relaxed);
                Err(Unavailable::Deadline)
            }
        }
    }

    /// Queues a charge of `tokens` to key `name` (dropped, and counted,
    /// when the queue is full or the engine down: the local charge stays).
    pub fn charge(&self, name: &str, limits: KeyLimits, tokens: u64) {
        let job = Job::Charge { name: Arc::from(name), limits, tokens };
        if !self.is_up() || self.tx.try_send(job).is_err() {
            self.counters.charges_dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Stores (`Some`) or clears key `name`'s limits in the engine; whether
    /// it was stored within [`STORE_TIMEOUT`].
    pub async fn store(&self, name: &str, limits: Option<KeyLimits>) -> bool {
        if !self.is_up() {
            return false;
        }
        let (reply, rx) = oneshot();
        if self.tx.try_send(Job::Store { name: name.to_owned(), limits, reply }).is_err() {
            return false;
        }
        matches!(iop_core::rt::time::timeout(STORE_TIMEOUT, rx).await, Ok(Some(true)))
    }

    fn set_up(&self, up: bool) -> bool {
        self.up.swap(up, Ordering::AcqRel) != up
    }

    fn set_live_edges(&self, n: u64) {
        self.live_edges.store(n.max(1), Ordering::Relaxed);
    }
}
