//! The `iop-edge-cluster` thread: owns the engine connection (reconnects
//! with backoff), runs what the reactors queue as one pipeline per batch,
//! and every second marks this edge present, counts the live edges and
//! reads the limits set at run time when their version moved.

use std::{
    collections::HashMap,
    sync::Arc,
    thread::JoinHandle,
    time::{Duration, Instant},
};

use crossbeam_channel::{Receiver, RecvTimeoutError};
use iop_core::config::{ClusterSettings, KeyLimits};
use redis::{Connection, RedisResult, Script, Value};

use super::{
    periods::{self, Period},
    scripts::{self, Names},
    Engine, Job, Verdict,
};
use crate::{events::EdgeEvent, pool::keys::Over};

/// How often presence and limits are refreshed.
const TICK: Duration = Duration::from_secs(1);
/// An edge missing from presence this long is no longer counted live.
const PRESENCE_WINDOW_MS: u64 = 3_000;
/// Connecting, reading and writing give up after this: the engine is then down.
const IO_TIMEOUT: Duration = Duration::from_millis(500);
/// Reconnect backoff bounds.
const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// Jobs sent in one pipeline at most.
const MAX_BATCH: usize = 512;

/// Publishes an edge event (the bus lives in the process's state, made
/// after the engine).
pub type Publish = Box<dyn Fn(EdgeEvent) + Send>;

/// The thread's state before it starts.
pub struct Runner {
    url: String,
    names: Names,
    instance: String,
    engine: Arc<Engine>,
    rx: Receiver<Job>,
}

struct Scripts {
    check: Script,
    charge: Script,
    presence: Script,
}

impl Runner {
    pub(super) fn new(settings: &ClusterSettings, instance: &str, engine: Arc<Engine>, rx: Receiver<Job>) -> Self {
        Self {
            url: settings.redis.expose().to_owned(),
            names: Names::new(&settings.prefix),
            instance: instance.to_owned(),
            engine,
            rx,
        }
    }

    /// Starts the thread; it runs for the life of the process (it holds
    /// the engine, and so its queue, itself).
    pub fn spawn(self, publish: Publish) -> std::io::Result<JoinHandle<()>> {
        std::thread::Builder::new().name("iop-edge-cluster".into()).spawn(move || self.run(&publish))
    }

    fn run(self, publish: &Publish) {
        let scripts = Scripts {
            check: Script::new(scripts::CHECK),
            charge: Script::new(scripts::CHARGE),
            presence: Script::new(scripts::PRESENCE),
        };
        let client = match redis::Client::open(self.url.as_str()) {
            Ok(c) => Some(c),
            Err(e) => {
                // The error names no part of the URL (it may hold a password).
                tracing::error!(kind = ?e.kind(), "cluster.redis cannot be used; limits stay local (on_engine_down)");
                None
            }
        };
        let mut backoff = MIN_BACKOFF;
        let mut version: Option<i64> = None;
        loop {
            let connected = client.as_ref().ok_or(None).and_then(|c| self.connect(c, &scripts).map_err(Some));
            let mut conn = match connected {
                Ok(c) => c,
                Err(e) => {
                    self.lost(publish, e.as_ref());
                    if !self.idle(backoff) {
                        return;
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    continue;
                }
            };
            backoff = MIN_BACKOFF;
            if let Err(e) = self.tick(&mut conn, &scripts, &mut version, publish, true) {
                self.lost(publish, Some(&e));
                continue;
            }
            if self.engine.set_up(true) {
                tracing::info!(live_edges = self.engine.live_edges(), "cluster engine reachable: limits shared");
                publish(EdgeEvent::ClusterEngine { up: true, live_edges: self.engine.live_edges() });
            }
            match self.serve(&mut conn, &scripts, &mut version, publish) {
                Ok(()) => return,
                Err(e) => self.lost(publish, Some(&e)),
            }
        }
    }

    fn connect(&self, client: &redis::Client, scripts: &Scripts) -> RedisResult<Connection> {
        let mut conn = client.get_connection_with_timeout(IO_TIMEOUT)?;
        conn.set_read_timeout(Some(IO_TIMEOUT))?;
        conn.set_write_timeout(Some(IO_TIMEOUT))?;
        for s in [&scripts.check, &scripts.charge, &scripts.presence] {
            s.prepare_invoke().load(&mut conn)?;
        }
        Ok(conn)
    }

    /// Serves the queue until the connection fails (`Err`) or the queue's
    /// senders are gone (`Ok`).
    fn serve(
        &self,
        conn: &mut Connection,
        scripts: &Scripts,
        version: &mut Option<i64>,
        publish: &Publish,
    ) -> RedisResult<()> {
        let mut next_tick = Instant::now() + TICK;
        loop {
            match self.rx.recv_timeout(next_tick.saturating_duration_since(Instant::now())) {
                Ok(job) => {
                    let (mut evals, mut stores) = (Vec::new(), Vec::new());
                    let mut next = Some(job);
                    while let Some(job) = next.take() {
                        if matches!(job, Job::Store { .. }) {
                            stores.push(job);
                        } else {
                            evals.push(job);
                        }
                        if evals.len() + stores.len() < MAX_BATCH {
                            next = self.rx.try_recv().ok();
                        }
                    }
                    self.run_batch(conn, scripts, evals)?;
                    if !stores.is_empty() {
                        self.run_stores(conn, stores, version, publish)?;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return Ok(()),
            }
            if Instant::now() >= next_tick {
                self.tick(conn, scripts, version, publish, false)?;
                next_tick = Instant::now() + TICK;
            }
        }
    }

    /// Runs the checks and charges of `batch` as one pipeline and answers
    /// the checks (a check whose answer is not understood is dropped
    /// unanswered: its request falls back to the fail mode).
    fn run_batch(&self, conn: &mut Connection, scripts: &Scripts, batch: Vec<Job>) -> RedisResult<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let now = periods::unix_now();
        let (day, month) = (periods::day(now), periods::month(now));
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for job in &batch {
            self.add(&mut pipe, scripts, job, day, month);
        }
        let mut results: Vec<Value> = pipe.query(conn)?;
        // The engine lost its scripts (restarted behind a proxy, or
        // flushed): load them again and run what failed once more.
        let noscript = |v: &Value| matches!(v, Value::ServerError(e) if e.code() == "NOSCRIPT");
        if results.iter().any(noscript) {
            for s in [&scripts.check, &scripts.charge] {
                s.prepare_invoke().load(conn)?;
            }
            let again: Vec<usize> = results.iter().enumerate().filter(|(_, v)| noscript(v)).map(|(i, _)| i).collect();
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            for &i in &again {
                if let Some(job) = batch.get(i) {
                    self.add(&mut pipe, scripts, job, day, month);
                }
            }
            let retried: Vec<Value> = pipe.query(conn)?;
            for (i, v) in again.into_iter().zip(retried) {
                if let Some(slot) = results.get_mut(i) {
                    *slot = v;
                }
            }
        }
        for (job, v) in batch.into_iter().zip(results) {
            if let Job::Check { reply, .. } = job {
                match verdict(&v, day, month) {
                    Some(verdict) => reply.send(verdict),
                    None => tracing::debug!(?v, "unexpected answer to a limits check"),
                }
            } else if let Value::ServerError(e) = &v {
                tracing::debug!(code = e.code(), "a token charge failed in the engine");
            }
        }
        Ok(())
    }

    fn add(&self, pipe: &mut redis::Pipeline, scripts: &Scripts, job: &Job, day: Period, month: Period) {
        let n = |v: Option<u64>| v.unwrap_or(0);
        match job {
            Job::Check { name, limits: l, .. } => {
                pipe.cmd("EVALSHA")
                    .arg(scripts.check.get_hash())
                    .arg(4)
                    .arg(self.names.requests(name))
                    .arg(self.names.tokens(name))
                    .arg(self.names.day(name, day.index))
                    .arg(self.names.month(name, month.index))
                    .arg(n(l.requests_per_minute))
                    .arg(n(l.tokens_per_minute))
                    .arg(n(l.tokens_per_day))
                    .arg(n(l.tokens_per_month));
            }
            Job::Charge { name, limits: l, tokens } => {
                pipe.cmd("EVALSHA")
                    .arg(scripts.charge.get_hash())
                    .arg(3)
                    .arg(self.names.tokens(name))
                    .arg(self.names.day(name, day.index))
                    .arg(self.names.month(name, month.index))
                    .arg(*tokens)
                    .arg(n(l.tokens_per_minute))
                    .arg(if l.tokens_per_day.is_some() { day.left } else { 0 })
                    .arg(if l.tokens_per_month.is_some() { month.left } else { 0 });
            }
            Job::Store { .. } => {}
        }
    }

    /// Stores the admin API's changes (one transaction each), then reads
    /// the set limits back.
    fn run_stores(
        &self,
        conn: &mut Connection,
        batch: Vec<Job>,
        version: &mut Option<i64>,
        publish: &Publish,
    ) -> RedisResult<()> {
        let mut answered = Vec::new();
        for job in batch {
            let Job::Store { name, limits, reply } = job else { continue };
            let key = self.names.limits(&name);
            let mut pipe = redis::pipe();
            pipe.atomic().cmd("DEL").arg(&key).ignore();
            match limits {
                Some(l) => {
                    pipe.cmd("HSET").arg(&key);
                    for (field, v) in KeyLimits::FIELDS.iter().zip(l.values()) {
                        pipe.arg(*field).arg(v.unwrap_or(0));
                    }
                    pipe.ignore().cmd("SADD").arg(self.names.limit_names()).arg(&name).ignore();
                }
                None => {
                    pipe.cmd("SREM").arg(self.names.limit_names()).arg(&name).ignore();
                }
            }
            pipe.cmd("INCR").arg(self.names.limits_version()).ignore();
            pipe.query::<()>(conn)?;
            answered.push(reply);
        }
        self.refresh_limits(conn, version, publish, true)?;
        for reply in answered {
            reply.send(true);
        }
        Ok(())
    }

    /// Presence, the live edges, and the set limits when they moved.
    fn tick(
        &self,
        conn: &mut Connection,
        scripts: &Scripts,
        version: &mut Option<i64>,
        publish: &Publish,
        force: bool,
    ) -> RedisResult<()> {
        let live: u64 = scripts
            .presence
            .key(self.names.edges())
            .arg(self.instance.as_str())
            .arg(PRESENCE_WINDOW_MS)
            .invoke(conn)?;
        self.engine.set_live_edges(live);
        self.refresh_limits(conn, version, publish, force)
    }

    /// Reads every set limit when the version moved (or `force`).
    fn refresh_limits(
        &self,
        conn: &mut Connection,
        version: &mut Option<i64>,
        publish: &Publish,
        force: bool,
    ) -> RedisResult<()> {
        let now: Option<i64> = redis::cmd("GET").arg(self.names.limits_version()).query(conn)?;
        let now = now.unwrap_or(0);
        if !force && *version == Some(now) {
            return Ok(());
        }
        let names: Vec<String> = redis::cmd("SMEMBERS").arg(self.names.limit_names()).query(conn)?;
        let mut all = HashMap::with_capacity(names.len());
        if !names.is_empty() {
            let mut pipe = redis::pipe();
            for name in &names {
                pipe.cmd("HMGET").arg(self.names.limits(name)).arg(&KeyLimits::FIELDS[..]);
            }
            let rows: Vec<Vec<Option<u64>>> = pipe.query(conn)?;
            for (name, row) in names.into_iter().zip(rows) {
                // A row the admin API did not write (another writer, a
                // partial one) is left out: the config's limits stay.
                let Ok(values) = <[Option<u64>; 4]>::try_from(row) else { continue };
                if values.iter().any(Option::is_none) {
                    continue;
                }
                let l = KeyLimits::from_values(values.map(|v| v.filter(|&n| n > 0)));
                if l.validate().is_ok() {
                    all.insert(name, l);
                }
            }
        }
        for key in self.engine.limits.replace(all) {
            tracing::info!(key = %key, "API key limits changed in the engine");
            publish(EdgeEvent::KeyLimitsChanged { key, source: "engine" });
        }
        *version = Some(now);
        Ok(())
    }

    /// The engine is (still) unreachable.
    fn lost(&self, publish: &Publish, e: Option<&redis::RedisError>) {
        if self.engine.set_up(false) {
            self.engine.counters.lost.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            // The error's kind and text name no password (the URL is not in them).
            tracing::warn!(error = ?e.map(|e| e.kind()), live_edges = self.engine.live_edges(),
                "cluster engine unreachable: each key's on_engine_down decides");
            publish(EdgeEvent::ClusterEngine { up: false, live_edges: self.engine.live_edges() });
        }
    }

    /// Waits `d`, dropping what is queued meanwhile (its checks fall back
    /// at once); `false` when the queue's senders are gone.
    fn idle(&self, d: Duration) -> bool {
        let until = Instant::now() + d;
        loop {
            match self.rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
                Ok(Job::Charge { .. }) => {
                    self.engine.counters.charges_dropped.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => return true,
                Err(RecvTimeoutError::Disconnected) => return false,
            }
        }
    }
}

/// The verdict in a check's answer `{code, wait_us}`.
fn verdict(v: &Value, day: Period, month: Period) -> Option<Verdict> {
    let Value::Array(items) = v else { return None };
    let int = |i: usize| match items.get(i) {
        Some(Value::Int(n)) => Some(*n),
        _ => None,
    };
    let wait = Duration::from_micros(u64::try_from(int(1)?).unwrap_or(0));
    Some(match int(0)? {
        0 => Verdict::Allowed,
        1 => Verdict::Over(Over::Requests(wait)),
        2 => Verdict::Over(Over::Tokens(wait)),
        3 => Verdict::Over(Over::Day(Duration::from_secs(day.left))),
        4 => Verdict::Over(Over::Month(Duration::from_secs(month.left))),
        _ => return None,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_are_read_defensively() {
        let (d, m) = (Period { index: 1, left: 10 }, Period { index: 1, left: 20 });
        let a = |c: i64, w: i64| Value::Array(vec![Value::Int(c), Value::Int(w)]);
        assert_eq!(verdict(&a(0, 0), d, m), Some(Verdict::Allowed));
        assert_eq!(verdict(&a(1, 1_500_000), d, m), Some(Verdict::Over(Over::Requests(Duration::from_millis(1500)))));
        assert_eq!(verdict(&a(3, 0), d, m), Some(Verdict::Over(Over::Day(Duration::from_secs(10)))));
        assert_eq!(verdict(&a(4, 0), d, m), Some(Verdict::Over(Over::Month(Duration::from_secs(20)))));
        assert_eq!(verdict(&a(9, 0), d, m), None);
        assert_eq!(verdict(&Value::Nil, d, m), None);
        assert_eq!(verdict(&Value::Array(vec![Value::Int(0)]), d, m), None);
        assert_eq!(verdict(&a(1, -5), d, m), Some(Verdict::Over(Over::Requests(Duration::ZERO))));
    }
}
