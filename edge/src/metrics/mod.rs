//! Prometheus metrics of the edge. Counters and histograms are per core:
//! each worker thread records into its own (a thread-local, no lock, no
//! atomic on the hot path), and a scrape asks every core for a copy through
//! its inbox and merges them ([`render`]). Gauges (leases, capacity, queue
//! depth, tokens, node connections) are read from the shared state at
//! scrape time. Every label value comes from a closed set: configured model,
//! node and provider ids, HTTP statuses, and the fixed vocabularies below.

pub mod cluster;
pub mod gather;
pub mod render;

use std::{cell::RefCell, collections::HashMap, time::Duration};

/// Bucket upper bounds, in seconds, of every histogram.
pub const BUCKETS: [f64; 17] =
    [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0];

/// A fixed-bucket histogram (the last count is `+Inf`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Histogram {
    /// Observations at or below each bound of [`BUCKETS`], then above all.
    pub counts: [u64; BUCKETS.len() + 1],
    /// Sum of the observations, in seconds.
    pub sum: f64,
}

impl Histogram {
    /// Records one observation.
    pub fn observe(&mut self, d: Duration) {
        let s = d.as_secs_f64();
        let i = BUCKETS.iter().position(|b| s <= *b).unwrap_or(BUCKETS.len());
        self.counts[i] += 1;
        self.sum += s;
    }

    /// Observations in all.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a += b;
        }
        self.sum += other.sum;
    }
}

/// Request metrics of one model ("" for requests that named none the
/// config knows).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelMetrics {
    /// Requests by surface (the route's closed label) and response status.
    pub by_status: Vec<(&'static str, u16, u64)>,
    /// From the request's head to its last byte.
    pub duration: Histogram,
    /// From the request's head to the first byte of the answer's body.
    pub ttft: Histogram,
    /// Time spent queued for capacity (requests that queued).
    pub queue_wait: Histogram,
}

/// What one core counted.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CoreMetrics {
    /// By public model name.
    pub models: HashMap<Box<str>, ModelMetrics>,
    /// Gaps between writes of a streamed answer, by path (`tunnel`, `normalized`).
    pub gaps: [Histogram; 2],
    /// Validated health observations, by (source, health).
    pub health_evidence: HashMap<(&'static str, &'static str), u64>,
    /// Overlay transitions, by outcome (`lowered`, `starting`, `recovered`).
    pub health_transitions: HashMap<&'static str, u64>,
    /// Recovery-before-commit decisions, by (decision, reason).
    pub recovery_eligibility: HashMap<(&'static str, &'static str), u64>,
    /// Replays' results.
    pub recovery_results: HashMap<&'static str, u64>,
    /// Node links that became suspect (silent, a probe unanswered).
    pub links_suspect: u64,
    /// Failed credential checks counted, by kind of credential.
    pub auth_failures: HashMap<&'static str, u64>,
    /// Attempts refused for their address's failures, by kind of credential.
    pub auth_refused: HashMap<&'static str, u64>,
    /// Connections closed by a per-address or handshake limit, by
    /// (listener, what closed it).
    pub conn_limits: HashMap<(&'static str, &'static str), u64>,
    /// Requests that took the single-request (agent) path.
    pub single_request_ingress: u64,
    /// Their terminals, by (kind, error class or "").
    pub single_request_terminals: HashMap<(&'static str, &'static str), u64>,
    /// Their model calls, workspace tool calls and cleanups.
    pub single_request_calls: HashMap<&'static str, u64>,
    /// Time spent in each stage (closed stage names).
    pub single_request_stages: HashMap<&'static str, Histogram>,
}

impl CoreMetrics {
    /// Adds `other` in.
    pub fn merge(&mut self, other: &CoreMetrics) {
        for (model, m) in &other.models {
            let mine = self.models.entry(model.clone()).or_default();
            for &(surface, status, n) in &m.by_status {
                bump_status(&mut mine.by_status, surface, status, n);
            }
            mine.duration.merge(&m.duration);
            mine.ttft.merge(&m.ttft);
            mine.queue_wait.merge(&m.queue_wait);
        }
        for (a, b) in self.gaps.iter_mut().zip(other.gaps.iter()) {
            a.merge(b);
        }
        merge_map(&mut self.health_evidence, &other.health_evidence);
        merge_map(&mut self.health_transitions, &other.health_transitions);
        merge_map(&mut self.recovery_eligibility, &other.recovery_eligibility);
        merge_map(&mut self.recovery_results, &other.recovery_results);
        self.links_suspect += other.links_suspect;
        merge_map(&mut self.auth_failures, &other.auth_failures);
        merge_map(&mut self.auth_refused, &other.auth_refused);
        merge_map(&mut self.conn_limits, &other.conn_limits);
        self.single_request_ingress += other.single_request_ingress;
        merge_map(&mut self.single_request_terminals, &other.single_request_terminals);
        merge_map(&mut self.single_request_calls, &other.single_request_calls);
        for (stage, h) in &other.single_request_stages {
            self.single_request_stages.entry(stage).or_default().merge(h);
        }
    }
}

fn merge_map<K: Copy + Eq + std::hash::Hash>(into: &mut HashMap<K, u64>, from: &HashMap<K, u64>) {
    for (k, v) in from {
        *into.entry(*k).or_default() += v;
    }
}

fn bump_status(list: &mut Vec<(&'static str, u16, u64)>, surface: &'static str, status: u16, n: u64) {
    match list.iter_mut().find(|(f, s, _)| *f == surface && *s == status) {
        Some((_, _, c)) => *c += n,
        None => list.push((surface, status, n)),
    }
}

thread_local! {
    static CORE: RefCell<CoreMetrics> = RefCell::new(CoreMetrics::default());
}

fn with<R>(f: impl FnOnce(&mut CoreMetrics) -> R) -> R {
    CORE.with(|c| f(&mut c.borrow_mut()))
}

/// A copy of this core's metrics (for a scrape).
pub fn snapshot() -> CoreMetrics {
    CORE.with(|c| c.borrow().clone())
}

/// One finished request.
pub struct RequestDone<'a> {
    /// Its configured model, or "".
    pub model: &'a str,
    /// The route's closed label (`chat_completions`, `messages`, …, `other`).
    pub surface: &'static str,
    /// The response status (0 when none was written).
    pub status: u16,
    pub duration: Duration,
    pub ttft: Option<Duration>,
    pub queue_wait: Option<Duration>,
}

/// Records a finished request.
pub fn request(r: &RequestDone<'_>) {
    with(|m| {
        let mm = match m.models.get_mut(r.model) {
            Some(mm) => mm,
            None => m.models.entry(r.model.into()).or_default(),
        };
        bump_status(&mut mm.by_status, r.surface, r.status, 1);
        mm.duration.observe(r.duration);
        if let Some(t) = r.ttft {
            mm.ttft.observe(t);
        }
        if let Some(q) = r.queue_wait {
            mm.queue_wait.observe(q);
        }
    });
}

/// Which path a streamed write belongs to.
#[derive(Debug, Clone, Copy)]
pub enum Path {
    Tunnel = 0,
    Normalized = 1,
}

/// Records the gap before a write of a streamed answer.
pub fn gap(path: Path, d: Duration) {
    with(|m| m.gaps[path as usize].observe(d));
}

/// Records a validated health observation and what it did to the overlay.
pub fn health(source: &'static str, health: &'static str, outcome: &'static str) {
    with(|m| {
        *m.health_evidence.entry((source, health)).or_default() += 1;
        if matches!(outcome, "lowered" | "starting" | "recovered") {
            *m.health_transitions.entry(outcome).or_default() += 1;
        }
    });
}

/// Records a recovery-before-commit decision.
pub fn recovery_decision(decision: &'static str, reason: &'static str) {
    with(|m| *m.recovery_eligibility.entry((decision, reason)).or_default() += 1);
}

/// Records a node link becoming suspect.
pub fn link_suspect() {
    with(|m| m.links_suspect += 1);
}

/// Records a replay's result.
pub fn recovery_result(result: &'static str) {
    with(|m| *m.recovery_results.entry(result).or_default() += 1);
}

/// Records a failed credential check of `kind` (`node_registration`,
/// `admin`, `api_key`).
pub fn auth_failure(kind: &'static str) {
    with(|m| *m.auth_failures.entry(kind).or_default() += 1);
}

/// Records an attempt refused for its address's failed `kind` checks.
pub fn auth_refused(kind: &'static str) {
    with(|m| *m.auth_refused.entry(kind).or_default() += 1);
}

/// Records a connection of `listener` (`node`, `http`) closed by a limit:
/// `action` is one of `evicted_same_address`, `evicted_under_pressure`,
/// `refused_full`, `first_bytes_timeout`, `tls_rate`, `tls_concurrency`,
/// `tls_table_full`.
pub fn conn_limit(listener: &'static str, action: &'static str) {
    with(|m| *m.conn_limits.entry((listener, action)).or_default() += 1);
}

/// Records a request taking the single-request path (unlabelled: no
/// agent, request or workspace in it).
pub fn single_request_ingress() {
    with(|m| m.single_request_ingress += 1);
}

/// Records how a single request ended (closed labels), and its calls.
pub fn single_request_done(kind: &'static str, class: &'static str, model_calls: u32, tool_calls: u32, cleaned: bool) {
    with(|m| {
        *m.single_request_terminals.entry((kind, class)).or_default() += 1;
        *m.single_request_calls.entry("model").or_default() += u64::from(model_calls);
        *m.single_request_calls.entry("tool").or_default() += u64::from(tool_calls);
        *m.single_request_calls.entry("cleanup").or_default() += u64::from(cleaned);
    });
}

/// Records the time a single request spent in `stage` (a closed name).
pub fn single_request_stage(stage: &'static str, d: Duration) {
    with(|m| m.single_request_stages.entry(stage).or_default().observe(d));
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn histograms_bucket_and_merge() {
        let mut h = Histogram::default();
        h.observe(Duration::from_micros(100));
        h.observe(Duration::from_millis(3));
        h.observe(Duration::from_secs(1000));
        assert_eq!((h.counts[0], h.counts[3], h.counts[BUCKETS.len()]), (1, 1, 1));
        let mut a = CoreMetrics::default();
        let mut b = CoreMetrics::default();
        b.gaps[0] = h.clone();
        b.models
            .insert("m".into(), ModelMetrics { by_status: vec![("chat_completions", 200, 2)], ..Default::default() });
        a.models.insert(
            "m".into(),
            ModelMetrics {
                by_status: vec![("chat_completions", 200, 1), ("chat_completions", 503, 1)],
                ..Default::default()
            },
        );
        a.merge(&b);
        assert_eq!(a.gaps[0].count(), 3);
        assert_eq!(a.models["m"].by_status, vec![("chat_completions", 200, 3), ("chat_completions", 503, 1)]);
    }

    #[test]
    fn limit_counters_merge_and_render() {
        let mut a = CoreMetrics::default();
        let mut b = CoreMetrics::default();
        a.auth_failures.insert("admin", 2);
        b.auth_failures.insert("admin", 1);
        b.auth_refused.insert("node_registration", 4);
        b.conn_limits.insert(("node", "evicted_under_pressure"), 5);
        a.merge(&b);
        let config = iop_core::config::EdgeConfig::from_toml(
            "[http]\nlisten = \"127.0.0.1:0\"\n[node_listener]\nlisten = \"127.0.0.1:0\"\n[[nodes]]\nid = \"n\"\n\
             token = \"t\"\n[[nodes.providers]]\nid = \"p\"\nkind = \"mock\"\n[[models]]\nname = \"m\"\nprovider = \"p\"\n",
            &|_| None,
        )
        .unwrap();
        let view = crate::pool::PoolView::build(&config, None);
        let text = render::render(&a, &render::Gauges { config: &config, view: &view, nodes: &[], reconnects: &[] });
        assert!(text.contains("iop_edge_auth_failures_total{credential=\"admin\"} 3"), "{text}");
        assert!(text.contains("iop_edge_auth_refused_total{credential=\"node_registration\"} 4"), "{text}");
        assert!(
            text.contains("iop_edge_connection_limits_total{listener=\"node\",action=\"evicted_under_pressure\"} 5"),
            "{text}"
        );
    }
}
