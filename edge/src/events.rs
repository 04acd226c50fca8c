//! The in-process lifecycle event bus: registration refusals, connects,
//! readiness, disconnects (with reason), run terminals and config reloads,
//! fanned out to subscribers (e.g. `GET /admin/v1/events`).
//!
//! Publishing costs one atomic load while nobody subscribes. Each
//! subscriber has a bounded mailbox; a subscriber that falls behind loses
//! events and is told how many (never blocks the publisher).

use std::{
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc,
    },
    time::{SystemTime, UNIX_EPOCH},
};

use iop_core::rt::mailbox::{self, SendError};
use parking_lot::Mutex;
use serde_json::{json, Value};

/// One lifecycle event.
#[derive(Debug, Clone, PartialEq)]
pub enum EdgeEvent {
    /// A node connection registered (pending ready).
    NodeRegistered {
        /// Node id.
        node: String,
        /// Connection generation.
        generation: u64,
        /// Remote address.
        peer: String,
    },
    /// A registration was refused.
    RegistrationRefused {
        /// `unknown_token`, `duplicate_connection`, `config_build_failed`,
        /// `protocol`, `too_many_failed_registrations` (a wrong token from
        /// an address past its failed registrations; at most one event per
        /// 10 s), `identity_mismatch` or `tls_handshake`.
        refusal: &'static str,
        /// Node id when known (duplicate), else empty.
        node: String,
        /// Remote address.
        peer: String,
    },
    /// A node connection became dispatch-ready.
    NodeReady {
        /// Node id.
        node: String,
        /// Connection generation.
        generation: u64,
    },
    /// A node stopped taking new runs (it is shutting down); its runs in flight finish.
    NodeDraining {
        /// Node id.
        node: String,
        /// Connection generation.
        generation: u64,
    },
    /// A node connection ended.
    NodeDisconnected {
        /// Node id.
        node: String,
        /// Connection generation.
        generation: u64,
        /// Which of the node's links ended.
        link: u32,
        /// Why, e.g. `closed_by_node`, `heartbeat_timeout`.
        reason: String,
        /// Whether it ended the node's current generation (only then are
        /// providers fenced; a link that leaves others ready does not).
        current: bool,
    },
    /// A link that owes the edge runs was silent and did not answer a ping
    /// in time: no new dispatch to it until it speaks again (its runs go
    /// on; the heartbeat closes it if it stays silent).
    LinkSuspect {
        /// Node id.
        node: String,
        /// Connection generation.
        generation: u64,
        /// Which of the node's links.
        link: u32,
        /// How long it had been silent, in milliseconds.
        silent_ms: u64,
    },
    /// A suspect link spoke again: it takes new dispatch.
    LinkResponsive {
        /// Node id.
        node: String,
        /// Connection generation.
        generation: u64,
        /// Which of the node's links.
        link: u32,
        /// How long it was suspect, in milliseconds.
        suspect_ms: u64,
    },
    /// A run ended.
    RunTerminal {
        /// Run id.
        run_id: String,
        /// Node it ran on.
        node: String,
        /// Public model name.
        model: String,
        /// `complete`, `error` or `cancelled`.
        outcome: &'static str,
        /// Failure code when `error`.
        code: Option<&'static str>,
        /// `normalized` or `tunnel`.
        path: &'static str,
        /// Token usage the provider reported; absent when it reported none.
        usage: Option<iop_core::exec::Usage>,
        /// The client's session id (`http.session_header`); empty: none
        /// (`null` in the JSON). A correlation only.
        session_id: String,
    },
    /// A health observation about a provider was applied by its owner core
    /// (`edge_provider_health_observation`).
    ProviderHealth {
        /// Node id.
        node: String,
        /// Provider id.
        provider: String,
        /// `stall` or `probe`.
        source: &'static str,
        /// `available`, `unavailable`, `starting` or `unknown`.
        health: &'static str,
        /// `lowered`, `starting`, `recovered`, `unchanged` or `stale`.
        outcome: &'static str,
        /// The overlay after it: `healthy`, `unavailable` or `starting`.
        overlay: &'static str,
    },
    /// A single request (agent) ended with an error
    /// (`edge_single_request_terminal_rejection`): only closed labels and
    /// the status, never the request's content or ids of its stages.
    SingleRequestRejected {
        /// The terminal kind (`error`).
        terminal: &'static str,
        /// Its error class.
        class: &'static str,
        /// The HTTP status it answers with.
        status: u16,
    },
    /// A new config was applied.
    ConfigReloaded {
        /// Its revision.
        revision: u64,
    },
    /// A new config was rejected; the old one stays.
    ConfigRejected {
        /// Why.
        error: String,
    },
    /// The shared limits engine (`[cluster]`) was lost (`up` false: each
    /// key's `on_engine_down` decides) or is back (`up`: it decides).
    ClusterEngine {
        /// Whether it is reachable now.
        up: bool,
        /// The edges last seen live (what fail-open divides limits by).
        live_edges: u64,
    },
    /// An API key's limits in force changed at run time.
    KeyLimitsChanged {
        /// The key's configured name.
        key: String,
        /// `admin` (this edge's admin API) or `engine` (read from it).
        source: &'static str,
    },
}

impl EdgeEvent {
    /// `type` of the JSON form.
    pub fn kind(&self) -> &'static str {
        match self {
            EdgeEvent::NodeRegistered { .. } => "node_registered",
            EdgeEvent::RegistrationRefused { .. } => "registration_refused",
            EdgeEvent::NodeReady { .. } => "node_ready",
            EdgeEvent::NodeDraining { .. } => "node_draining",
            EdgeEvent::NodeDisconnected { .. } => "node_disconnected",
            EdgeEvent::LinkSuspect { .. } => "link_suspect",
            EdgeEvent::LinkResponsive { .. } => "link_responsive",
            EdgeEvent::RunTerminal { .. } => "run_terminal",
            EdgeEvent::ProviderHealth { .. } => "provider_health",
            EdgeEvent::ConfigReloaded { .. } => "config_reloaded",
            EdgeEvent::ConfigRejected { .. } => "config_rejected",
            EdgeEvent::SingleRequestRejected { .. } => "edge_single_request_terminal_rejection",
            EdgeEvent::ClusterEngine { .. } => "cluster_engine",
            EdgeEvent::KeyLimitsChanged { .. } => "key_limits_changed",
        }
    }

    /// JSON form: `{"type": .., "ts_ms": .., ...fields}`.
    pub fn to_json(&self, ts_ms: u64) -> Value {
        let mut v = match self {
            EdgeEvent::NodeRegistered { node, generation, peer } => {
                json!({"node": node, "generation": generation, "peer": peer})
            }
            EdgeEvent::RegistrationRefused { refusal, node, peer } => {
                json!({"refusal": refusal, "node": node, "peer": peer})
            }
            EdgeEvent::NodeReady { node, generation } | EdgeEvent::NodeDraining { node, generation } => {
                json!({"node": node, "generation": generation})
            }
            EdgeEvent::NodeDisconnected { node, generation, link, reason, current } => {
                json!({"node": node, "generation": generation, "link": link, "reason": reason, "current": current})
            }
            EdgeEvent::LinkSuspect { node, generation, link, silent_ms } => {
                json!({"node": node, "generation": generation, "link": link, "silent_ms": silent_ms})
            }
            EdgeEvent::LinkResponsive { node, generation, link, suspect_ms } => {
                json!({"node": node, "generation": generation, "link": link, "suspect_ms": suspect_ms})
            }
            EdgeEvent::RunTerminal { run_id, node, model, outcome, code, path, usage, session_id } => {
                let usage = usage.map(|u| {
                    json!({
                        "input_tokens": u.input_tokens,
                        "output_tokens": u.output_tokens,
                        "reasoning_tokens": u.reasoning_tokens,
                        "cached_input_tokens": u.cached_input_tokens,
                    })
                });
                let session_id = (!session_id.is_empty()).then_some(session_id);
                json!({"run_id": run_id, "node": node, "model": model, "outcome": outcome, "code": code,
                       "path": path, "usage": usage, "session_id": session_id})
            }
            EdgeEvent::ConfigReloaded { revision } => json!({"revision": revision}),
            EdgeEvent::SingleRequestRejected { terminal, class, status } => {
                json!({"terminal": terminal, "class": class, "status": status})
            }
            EdgeEvent::ConfigRejected { error } => json!({"error": error}),
            EdgeEvent::ClusterEngine { up, live_edges } => {
                let (state, mode) = if *up { ("up", "engine") } else { ("down", "on_engine_down") };
                json!({"state": state, "mode": mode, "live_edges": live_edges})
            }
            EdgeEvent::KeyLimitsChanged { key, source } => json!({"key": key, "source": source}),
            EdgeEvent::ProviderHealth { node, provider, source, health, outcome, overlay } => {
                json!({"node": node, "provider": provider, "source": source, "health": health,
                       "outcome": outcome, "overlay": overlay})
            }
        };
        v["type"] = json!(self.kind());
        v["ts_ms"] = json!(ts_ms);
        v
    }
}

/// An event as delivered: when it happened, and what.
#[derive(Debug, Clone)]
pub struct Stamped {
    /// Unix milliseconds.
    pub ts_ms: u64,
    /// The event.
    pub event: EdgeEvent,
}

struct Sub {
    tx: mailbox::Sender<Arc<Stamped>>,
    dropped: Arc<AtomicU64>,
}

/// A subscription: events plus a count of those lost to lag.
pub struct Subscription {
    /// Events in order.
    pub rx: mailbox::Receiver<Arc<Stamped>>,
    /// Events dropped because this subscriber was full.
    pub dropped: Arc<AtomicU64>,
}

/// The bus.
#[derive(Default)]
pub struct EventBus {
    subs: Mutex<Vec<Sub>>,
    count: AtomicUsize,
}

impl EventBus {
    /// A bus with no subscribers.
    pub fn new() -> Self {
        Self::default()
    }

    /// Publishes to every subscriber, never waiting.
    pub fn publish(&self, event: EdgeEvent) {
        self.publish_with(|| event);
    }

    /// Publishes the event `make` builds, only when someone subscribes (a
    /// run's terminal event copies its ids: not for nobody, per request).
    pub fn publish_with(&self, make: impl FnOnce() -> EdgeEvent) {
        if self.count.load(Ordering::Acquire) == 0 {
            return;
        }
        let event = make();
        let ts_ms = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
        let ev = Arc::new(Stamped { ts_ms, event });
        let mut subs = self.subs.lock();
        subs.retain(|s| match s.tx.try_send(ev.clone()) {
            Ok(()) => true,
            Err(SendError::Full(_)) => {
                s.dropped.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(SendError::Closed(_)) => false,
        });
        self.count.store(subs.len(), Ordering::Release);
    }

    /// Subscribes with room for `capacity` undelivered events.
    pub fn subscribe(&self, capacity: usize) -> Subscription {
        let (tx, rx) = mailbox::mailbox(capacity);
        let dropped = Arc::new(AtomicU64::new(0));
        let mut subs = self.subs.lock();
        subs.push(Sub { tx, dropped: dropped.clone() });
        self.count.store(subs.len(), Ordering::Release);
        Subscription { rx, dropped }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn fan_out_lag_and_unsubscribe() {
        let bus = EventBus::new();
        bus.publish(EdgeEvent::ConfigReloaded { revision: 0 }); // nobody listens: no-op
        let a = bus.subscribe(2);
        let b = bus.subscribe(8);
        for r in 1..=3 {
            bus.publish(EdgeEvent::ConfigReloaded { revision: r });
        }
        assert_eq!(a.rx.try_recv().unwrap().event, EdgeEvent::ConfigReloaded { revision: 1 });
        assert_eq!(a.dropped.load(Ordering::Relaxed), 1, "third event dropped for the slow subscriber");
        assert_eq!(b.rx.try_recv().unwrap().event.kind(), "config_reloaded");
        drop(a);
        bus.publish(EdgeEvent::ConfigReloaded { revision: 4 });
        assert_eq!(bus.count.load(Ordering::Relaxed), 1);
        let j = b.rx.try_recv().unwrap().event.to_json(5);
        assert_eq!(j["type"], "config_reloaded");
        assert_eq!(j["ts_ms"], 5);
    }

    #[test]
    fn run_terminal_carries_the_session_id_or_null() {
        let ev = |session_id: &str| EdgeEvent::RunTerminal {
            run_id: "r-1".into(),
            node: "n".into(),
            model: "m".into(),
            outcome: "complete",
            code: None,
            path: "tunnel",
            usage: None,
            session_id: session_id.into(),
        };
        assert_eq!(ev("s-1\"x").to_json(1)["session_id"], "s-1\"x");
        assert_eq!(ev("").to_json(1)["session_id"], serde_json::Value::Null);
        assert!(ev("s").to_json(1).to_string().contains(r#""session_id":"s""#));
    }
}
