//! `GET /admin/v1/nodes`: every configured node and provider (connected or
//! not) with its published load, and every model group with its queue and
//! its request counters.
//!
//! It reads what admission reads (the registry, the pool view's atomics)
//! and the very counters `GET /metrics` renders ([`metrics::gather`]):
//! the status page shows nothing that is kept apart for it.

use std::{
    sync::atomic::Ordering,
    time::{SystemTime, UNIX_EPOCH},
};

use iop_core::config::{EdgeConfig, NodeEntry, ProviderEntry};
use serde_json::{json, Value};

use crate::{
    ctx::Ctx,
    metrics::{self, CoreMetrics, Histogram, ModelMetrics},
    pool::{LeaseClass, Overlay, PoolView, ResourceKey, ResourceLoad},
    registry::NodeStatus,
};

/// The snapshot of this edge now, with `ts_ms` (Unix milliseconds) beside
/// `nodes` and `models`.
pub async fn current(worker: &Ctx) -> Value {
    // Counters first (it waits on the cores); the rest is read at once after.
    let counters = metrics::gather::gather(worker).await;
    let config = worker.config.borrow().clone();
    let statuses = worker.shared.registry.lock().statuses(&config);
    let pool = worker.pool.borrow().clone();
    let mut v = snapshot(&config, &statuses, &pool, &counters);
    let ts_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    v["ts_ms"] = json!(ts_ms);
    v
}

/// What a node is, as its events tell it: `offline` (no registration, or
/// after `node_disconnected`), `registered` (after `node_registered`, not
/// ready yet: it takes no runs), `ready` (after `node_ready`) or
/// `draining` (after `node_draining`).
pub fn node_state(status: Option<&NodeStatus>) -> &'static str {
    match status {
        Some(s) if s.connected && s.draining => "draining",
        Some(s) if s.connected && s.ready => "ready",
        Some(s) if s.connected => "registered",
        _ => "offline",
    }
}

/// The snapshot body: `{"nodes": [...], "models": [...],
/// "histogram_bounds_seconds": [...]}`, in config order.
///
/// Pure: built from one config revision, the registry's statuses, the
/// pool view published for that revision and the merged counters.
pub fn snapshot(config: &EdgeConfig, statuses: &[NodeStatus], pool: &PoolView, counters: &CoreMetrics) -> Value {
    let nodes: Vec<Value> =
        config.nodes.iter().map(|n| node(n, statuses.iter().find(|s| s.id == n.id), pool)).collect();
    let models: Vec<Value> = config
        .models
        .iter()
        .map(|m| {
            let waiters = pool.waiters.get(&m.name).map_or(0, |w| w.load(Ordering::Relaxed));
            let targets: Vec<Value> = m
                .targets
                .iter()
                .map(|t| json!({"node": &*t.node, "provider": &*t.provider, "model": &*t.upstream_model}))
                .collect();
            let usage = pool.usage.get(&m.name).map(|u| {
                let g = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
                json!({
                    "reported": g(&u.reported),
                    "unreported": g(&u.unreported),
                    "input_tokens": g(&u.input_tokens),
                    "output_tokens": g(&u.output_tokens),
                    "reasoning_tokens": g(&u.reasoning_tokens),
                    "cached_input_tokens": g(&u.cached_input_tokens),
                })
            });
            let (requests, ttft) = requests(counters.models.get(&*m.name));
            json!({"name": m.name, "waiters": waiters, "max_waiters": m.max_waiters, "targets": targets,
                   "usage": usage, "requests": requests, "ttft": ttft})
        })
        .collect();
    json!({"nodes": nodes, "models": models, "histogram_bounds_seconds": metrics::BUCKETS})
}

/// A model's answered requests (`iop_edge_requests_total`, summed over
/// surfaces by status) and its time to first byte
/// (`iop_edge_time_to_first_byte_seconds`: per-bucket counts, the last
/// above every bound).
fn requests(m: Option<&ModelMetrics>) -> (Value, Value) {
    let empty = Histogram::default();
    let ttft = m.map_or(&empty, |m| &m.ttft);
    // Summed over surfaces: one count per status.
    let mut by_status = std::collections::BTreeMap::<String, u64>::new();
    for &(_, status, n) in m.map_or(&[][..], |m| &m.by_status[..]) {
        *by_status.entry(status.to_string()).or_default() += n;
    }
    let requests = json!({"total": by_status.values().sum::<u64>(), "by_status": by_status});
    let ttft = json!({"count": ttft.count(), "sum_seconds": ttft.sum, "buckets": &ttft.counts[..]});
    (requests, ttft)
}

fn node(n: &NodeEntry, status: Option<&NodeStatus>, pool: &PoolView) -> Value {
    let connected = status.is_some_and(|s| s.connected);
    let ready = status.is_some_and(|s| s.ready);
    let suspect = status.is_some_and(|s| s.suspect);
    let generation = status.filter(|s| s.connected).map_or(0, |s| s.generation);
    let worker = status.and_then(|s| s.worker);
    let providers: Vec<Value> = n
        .providers
        .iter()
        .map(|p| provider(p, pool.resources.get(&ResourceKey::new(&n.id, &p.id)).map(|l| &**l), connected))
        .collect();
    let links: Vec<Value> = status
        .map(|s| {
            s.links
                .iter()
                .map(|l| json!({"index": l.index, "worker": l.worker, "ready": l.ready, "suspect": l.suspect}))
                .collect()
        })
        .unwrap_or_default();
    json!({"id": n.id, "state": node_state(status), "connected": connected, "ready": ready, "suspect": suspect,
           "generation": generation, "worker": worker, "links": links, "providers": providers})
}

/// One provider. A resource missing from the view (it cannot be, for a
/// view built from the same config) is shown offline and idle. A provider
/// of a node that is not connected is offline: the node's registration
/// ends first and each core marks its resources offline when the fence
/// reaches it, and a snapshot taken in between must not show a provider
/// available that nothing can reach.
fn provider(p: &ProviderEntry, load: Option<&ResourceLoad>, connected: bool) -> Value {
    let fallback;
    let load = match load {
        Some(l) => l,
        None => {
            fallback = ResourceLoad::new(p.capacity.get(), p.long_capacity);
            &fallback
        }
    };
    // One read of each so that status, health and capacities agree.
    let online = connected && load.online.load(Ordering::Acquire);
    let overlay = load.overlay();
    // A suspect node (silent, not answering a probe) takes no new work.
    let suspect = online && load.suspect.load(Ordering::Acquire);
    let live = online && overlay == Overlay::Healthy && !suspect;
    let configured_normal = load.configured_normal.load(Ordering::Relaxed);
    let configured_long = load.configured_long.load(Ordering::Relaxed);
    let in_use_normal = load.in_use_normal.load(Ordering::Relaxed);
    let in_use_long = load.in_use_long.load(Ordering::Relaxed);
    // Within the node's share for this edge, when it serves several.
    let generation = load.generation.load(Ordering::Acquire);
    let share = |class| load.share.of(class, generation);
    let effective =
        |configured: u32, class| if live { share(class).map_or(configured, |s| configured.min(s)) } else { 0 };
    json!({
        "id": p.id,
        "status": if live { "available" } else { "unavailable" },
        "health": if online { "online" } else { "offline" },
        // The runtime overlay (stall evidence, recovery probes), apart from
        // the connected state above.
        "runtime_health": overlay.as_str(),
        "suspect": suspect,
        "normal": {"configured": configured_normal, "effective": effective(configured_normal, LeaseClass::Normal), "in_use": in_use_normal, "share": share(LeaseClass::Normal)},
        "long": {"configured": configured_long, "effective": effective(configured_long, LeaseClass::Long), "in_use": in_use_long, "share": share(LeaseClass::Long)},
        "leases_in_use": u64::from(in_use_normal) + u64::from(in_use_long),
        "live_leases": load.live_guards.load(Ordering::Relaxed),
        "waiters": load.waiters.load(Ordering::Relaxed),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::pool::LeaseClass;

    const CONFIG: &str = r#"
        admin_token = "t"
        [http]
        listen = "127.0.0.1:0"
        [node_listener]
        listen = "127.0.0.1:0"
        [[nodes]]
        id = "n1"
        token = "tok-1"
        [[nodes.providers]]
        id = "up"
        kind = "mock"
        capacity = 4
        [[nodes.providers]]
        id = "big"
        kind = "mock"
        capacity = 2
        long_capacity = 1
        [[nodes]]
        id = "n2"
        token = "tok-2"
        [[nodes.providers]]
        id = "up"
        kind = "mock"
        capacity = 8
        [[models]]
        name = "gpt-test"
        max_waiters = 256
        [[models.targets]]
        node = "n1"
        provider = "up"
        model = "mock-upstream"
        [[models.targets]]
        node = "n2"
        provider = "up"
        model = "other"
        [[models]]
        name = "long"
        node = "n1"
        provider = "big"
        long_context_threshold = 1000
    "#;

    fn config() -> EdgeConfig {
        EdgeConfig::from_toml(CONFIG, &|_| None).unwrap()
    }

    fn load<'a>(pool: &'a PoolView, node: &str, provider: &str) -> &'a ResourceLoad {
        pool.resources.get(&ResourceKey::new(node, provider)).unwrap()
    }

    #[test]
    fn lists_every_configured_node_and_provider_with_its_load() {
        let cfg = config();
        let pool = PoolView::build(&cfg, None);
        let up = load(&pool, "n1", "up");
        up.online.store(true, Ordering::Release);
        up.in_use_normal.store(1, Ordering::Relaxed);
        up.live_guards.store(1, Ordering::Relaxed);
        let big = load(&pool, "n1", "big");
        big.online.store(true, Ordering::Release);
        big.in_use_normal.store(2, Ordering::Relaxed);
        big.in_use_long.store(1, Ordering::Relaxed);
        big.live_guards.store(3, Ordering::Relaxed);
        big.waiters.store(5, Ordering::Relaxed);
        assert_eq!(big.capacity(LeaseClass::Long), 1);
        pool.waiters.get("gpt-test").unwrap().store(7, Ordering::Relaxed);
        let usage = iop_core::exec::Usage {
            input_tokens: 10,
            output_tokens: 4,
            reasoning_tokens: Some(1),
            cached_input_tokens: None,
        };
        pool.usage.get("gpt-test").unwrap().add(Some(&usage));
        pool.usage.get("gpt-test").unwrap().add(None);
        let statuses = vec![
            NodeStatus {
                id: "n1".into(),
                connected: true,
                ready: true,
                draining: false,
                suspect: false,
                generation: 3,
                worker: Some(1),
                links: vec![
                    crate::registry::LinkStatus { index: 0, worker: 1, ready: true, suspect: false },
                    crate::registry::LinkStatus { index: 1, worker: 0, ready: false, suspect: false },
                ],
            },
            NodeStatus {
                id: "n2".into(),
                connected: false,
                ready: false,
                draining: false,
                suspect: false,
                generation: 0,
                worker: None,
                links: vec![],
            },
        ];

        // Counted on two cores, for two surfaces, as `/metrics` renders them.
        let mut counters = CoreMetrics::default();
        for (surface, status, ttft_ms) in
            [("chat_completions", 200, 250), ("messages", 200, 500), ("messages", 429, 2000)]
        {
            let mut core = CoreMetrics::default();
            core.models.insert(
                "gpt-test".into(),
                ModelMetrics { by_status: vec![(surface, status, 1)], ..Default::default() },
            );
            core.models.get_mut("gpt-test").unwrap().ttft.observe(std::time::Duration::from_millis(ttft_ms));
            counters.merge(&core);
        }
        let mut ttft = [0u64; metrics::BUCKETS.len() + 1];
        (ttft[8], ttft[9], ttft[11]) = (1, 1, 1); // ≤ 0.25 s, ≤ 0.5 s, ≤ 2.5 s (sums exact in binary)
        let v = snapshot(&cfg, &statuses, &pool, &counters);
        let zeros = [0u64; metrics::BUCKETS.len() + 1];
        let no_ttft = json!({"count": 0, "sum_seconds": 0.0, "buckets": zeros});
        let expected = json!({
            "histogram_bounds_seconds": metrics::BUCKETS,
            "nodes": [
                {"id": "n1", "state": "ready", "connected": true, "ready": true, "suspect": false, "generation": 3,
                 "worker": 1,
                 "links": [{"index": 0, "worker": 1, "ready": true, "suspect": false},
                           {"index": 1, "worker": 0, "ready": false, "suspect": false}],
                 "providers": [
                    {"id": "up", "status": "available", "health": "online", "runtime_health": "healthy", "suspect": false,
                     "normal": {"configured": 4, "effective": 4, "in_use": 1, "share": null},
                     "long": {"configured": 0, "effective": 0, "in_use": 0, "share": null},
                     "leases_in_use": 1, "live_leases": 1, "waiters": 0},
                    {"id": "big", "status": "available", "health": "online", "runtime_health": "healthy", "suspect": false,
                     "normal": {"configured": 2, "effective": 2, "in_use": 2, "share": null},
                     "long": {"configured": 1, "effective": 1, "in_use": 1, "share": null},
                     "leases_in_use": 3, "live_leases": 3, "waiters": 5},
                ]},
                {"id": "n2", "state": "offline", "connected": false, "ready": false, "suspect": false, "generation": 0,
                 "worker": null,
                 "links": [],
                 "providers": [
                    {"id": "up", "status": "unavailable", "health": "offline", "runtime_health": "healthy", "suspect": false,
                     "normal": {"configured": 8, "effective": 0, "in_use": 0, "share": null},
                     "long": {"configured": 0, "effective": 0, "in_use": 0, "share": null},
                     "leases_in_use": 0, "live_leases": 0, "waiters": 0},
                ]},
            ],
            "models": [
                {"name": "gpt-test", "waiters": 7, "max_waiters": 256, "targets": [
                    {"node": "n1", "provider": "up", "model": "mock-upstream"},
                    {"node": "n2", "provider": "up", "model": "other"},
                ], "usage": {"reported": 1, "unreported": 1, "input_tokens": 10, "output_tokens": 4,
                             "reasoning_tokens": 1, "cached_input_tokens": 0},
                 "requests": {"total": 3, "by_status": {"200": 2, "429": 1}},
                 "ttft": {"count": 3, "sum_seconds": 2.75, "buckets": ttft}},
                {"name": "long", "waiters": 0, "max_waiters": cfg.models[1].max_waiters, "targets": [
                    {"node": "n1", "provider": "big", "model": &*cfg.models[1].targets[0].upstream_model},
                ], "usage": {"reported": 0, "unreported": 0, "input_tokens": 0, "output_tokens": 0,
                             "reasoning_tokens": 0, "cached_input_tokens": 0},
                 "requests": {"total": 0, "by_status": {}}, "ttft": no_ttft},
            ],
        });
        assert_eq!(v, expected);
    }

    #[test]
    fn nodes_without_a_status_or_a_resource_stay_listed_offline() {
        let cfg = config();
        // No statuses at all and an empty view (e.g. out of step with the config).
        let v = snapshot(&cfg, &[], &PoolView::default(), &CoreMetrics::default());
        let nodes = v["nodes"].as_array().unwrap();
        assert_eq!(nodes.len(), 2);
        for n in nodes {
            assert_eq!(n["connected"], false);
            assert_eq!(n["ready"], false);
            assert_eq!(n["generation"], 0);
            for p in n["providers"].as_array().unwrap() {
                assert_eq!(p["status"], "unavailable");
                assert_eq!(p["health"], "offline");
                assert_eq!(p["normal"]["effective"], 0);
                assert_eq!(p["long"]["effective"], 0);
                assert_eq!(p["leases_in_use"], 0);
            }
        }
        assert_eq!(nodes[1]["providers"][0]["normal"]["configured"], 8);
        assert_eq!(v["models"][0]["waiters"], 0);
    }

    #[test]
    fn offline_resource_reports_in_flight_leases_but_no_capacity() {
        let cfg = config();
        let pool = PoolView::build(&cfg, None);
        let up = load(&pool, "n2", "up");
        // Fenced: offline, but a lease not yet dropped is still counted.
        up.in_use_normal.store(1, Ordering::Relaxed);
        up.live_guards.store(1, Ordering::Relaxed);
        let statuses = vec![NodeStatus {
            id: "n2".into(),
            connected: false,
            ready: false,
            draining: false,
            suspect: false,
            generation: 0,
            worker: None,
            links: vec![],
        }];
        let v = snapshot(&cfg, &statuses, &pool, &CoreMetrics::default());
        let p = &v["nodes"][1]["providers"][0];
        assert_eq!(p["status"], "unavailable");
        assert_eq!(p["normal"], json!({"configured": 8, "effective": 0, "in_use": 1, "share": null}));
        assert_eq!(p["leases_in_use"], 1);
        assert_eq!(p["live_leases"], 1);
    }

    /// Every ready link of the node is suspect: its providers offer nothing
    /// new (effective 0, unavailable) while their leases stay counted.
    #[test]
    fn a_suspect_nodes_providers_offer_no_capacity() {
        let cfg = config();
        let pool = PoolView::build(&cfg, None);
        let up = load(&pool, "n1", "up");
        up.online.store(true, Ordering::Release);
        up.suspect.store(true, Ordering::Release);
        up.in_use_normal.store(1, Ordering::Relaxed);
        let link = |index, suspect| crate::registry::LinkStatus { index, worker: 0, ready: true, suspect };
        let status = NodeStatus {
            id: "n1".into(),
            connected: true,
            ready: true,
            draining: false,
            suspect: true,
            generation: 2,
            worker: Some(0),
            links: vec![link(0, true), link(1, true)],
        };
        let v = snapshot(&cfg, &[status], &pool, &CoreMetrics::default());
        let n = &v["nodes"][0];
        assert_eq!((&n["suspect"], &n["links"][1]["suspect"]), (&json!(true), &json!(true)));
        let p = &n["providers"][0];
        assert_eq!(
            (&p["status"], &p["suspect"], &p["health"]),
            (&json!("unavailable"), &json!(true), &json!("online"))
        );
        assert_eq!(p["normal"], json!({"configured": 4, "effective": 0, "in_use": 1, "share": null}));
    }

    /// The node's registration ends before every core has fenced its
    /// resources: a snapshot between the two shows them offline already.
    #[test]
    fn a_disconnected_nodes_providers_are_offline_before_the_fence_lands() {
        let cfg = config();
        let pool = PoolView::build(&cfg, None);
        load(&pool, "n1", "up").online.store(true, Ordering::Release);
        let status = |connected| NodeStatus {
            id: "n1".into(),
            connected,
            ready: connected,
            draining: false,
            suspect: false,
            generation: if connected { 2 } else { 0 },
            worker: None,
            links: vec![],
        };
        let up = |v: &Value| v["nodes"][0]["providers"][0].clone();
        let v = snapshot(&cfg, &[status(true)], &pool, &CoreMetrics::default());
        assert_eq!((&up(&v)["status"], &up(&v)["health"]), (&json!("available"), &json!("online")));
        let v = snapshot(&cfg, &[status(false)], &pool, &CoreMetrics::default());
        assert_eq!((&up(&v)["status"], &up(&v)["health"]), (&json!("unavailable"), &json!("offline")));
        assert_eq!((&up(&v)["normal"]["effective"], &up(&v)["long"]["effective"]), (&json!(0), &json!(0)));
    }

    /// The node's state is what its last event said: registered (not yet
    /// ready: no provider online, none available), ready, draining, offline.
    #[test]
    fn a_registered_node_is_not_shown_ready_until_it_is() {
        let cfg = config();
        let pool = PoolView::build(&cfg, None);
        let status = |connected, ready, draining| NodeStatus {
            id: "n1".into(),
            connected,
            ready,
            draining,
            suspect: false,
            generation: if connected { 5 } else { 0 },
            worker: connected.then_some(0),
            links: vec![],
        };
        let none = CoreMetrics::default();
        for (st, state) in [
            (status(true, false, false), "registered"),
            (status(true, true, false), "ready"),
            (status(true, true, true), "draining"),
            (status(false, false, false), "offline"),
        ] {
            let v = snapshot(&cfg, &[st], &pool, &none);
            assert_eq!(v["nodes"][0]["state"], state, "{v:#}");
        }
        let v = snapshot(&cfg, &[status(true, false, false)], &pool, &none);
        let n = &v["nodes"][0];
        assert_eq!((&n["connected"], &n["ready"]), (&json!(true), &json!(false)));
        assert_eq!(n["providers"][0]["status"], "unavailable", "{v:#}");
        assert_eq!(node_state(None), "offline");
    }
}
