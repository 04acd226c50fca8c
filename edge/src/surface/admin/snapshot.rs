//! `GET /admin/v1/nodes`: every configured node and provider (connected or
//! not) with its published load, and every model group with its queue.

use std::sync::atomic::Ordering;

use iop_core::config::{EdgeConfig, NodeEntry, ProviderEntry};
use serde_json::{json, Value};

use crate::{
    pool::{Overlay, PoolView, ResourceKey, ResourceLoad},
    registry::NodeStatus,
};

/// The snapshot body: `{"nodes": [...], "models": [...]}`, in config order.
///
/// Pure: built from one config revision, the registry's statuses and the
/// pool view published for that revision.
pub fn snapshot(config: &EdgeConfig, statuses: &[NodeStatus], pool: &PoolView) -> Value {
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
            json!({"name": m.name, "waiters": waiters, "max_waiters": m.max_waiters, "targets": targets,
                   "usage": usage})
        })
        .collect();
    json!({"nodes": nodes, "models": models})
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
    json!({"id": n.id, "connected": connected, "ready": ready, "suspect": suspect, "generation": generation,
           "worker": worker, "links": links, "providers": providers})
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
    let effective = |configured: u32| if live { configured } else { 0 };
    json!({
        "id": p.id,
        "status": if live { "available" } else { "unavailable" },
        "health": if online { "online" } else { "offline" },
        // The runtime overlay (stall evidence, recovery probes), apart from
        // the connected state above.
        "runtime_health": overlay.as_str(),
        "suspect": suspect,
        "normal": {"configured": configured_normal, "effective": effective(configured_normal), "in_use": in_use_normal},
        "long": {"configured": configured_long, "effective": effective(configured_long), "in_use": in_use_long},
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
                suspect: false,
                generation: 0,
                worker: None,
                links: vec![],
            },
        ];

        let v = snapshot(&cfg, &statuses, &pool);
        let expected = json!({
            "nodes": [
                {"id": "n1", "connected": true, "ready": true, "suspect": false, "generation": 3, "worker": 1,
                 "links": [{"index": 0, "worker": 1, "ready": true, "suspect": false},
                           {"index": 1, "worker": 0, "ready": false, "suspect": false}],
                 "providers": [
                    {"id": "up", "status": "available", "health": "online", "runtime_health": "healthy", "suspect": false,
                     "normal": {"configured": 4, "effective": 4, "in_use": 1},
                     "long": {"configured": 0, "effective": 0, "in_use": 0},
                     "leases_in_use": 1, "live_leases": 1, "waiters": 0},
                    {"id": "big", "status": "available", "health": "online", "runtime_health": "healthy", "suspect": false,
                     "normal": {"configured": 2, "effective": 2, "in_use": 2},
                     "long": {"configured": 1, "effective": 1, "in_use": 1},
                     "leases_in_use": 3, "live_leases": 3, "waiters": 5},
                ]},
                {"id": "n2", "connected": false, "ready": false, "suspect": false, "generation": 0, "worker": null,
                 "links": [],
                 "providers": [
                    {"id": "up", "status": "unavailable", "health": "offline", "runtime_health": "healthy", "suspect": false,
                     "normal": {"configured": 8, "effective": 0, "in_use": 0},
                     "long": {"configured": 0, "effective": 0, "in_use": 0},
                     "leases_in_use": 0, "live_leases": 0, "waiters": 0},
                ]},
            ],
            "models": [
                {"name": "gpt-test", "waiters": 7, "max_waiters": 256, "targets": [
                    {"node": "n1", "provider": "up", "model": "mock-upstream"},
                    {"node": "n2", "provider": "up", "model": "other"},
                ], "usage": {"reported": 1, "unreported": 1, "input_tokens": 10, "output_tokens": 4,
                             "reasoning_tokens": 1, "cached_input_tokens": 0}},
                {"name": "long", "waiters": 0, "max_waiters": cfg.models[1].max_waiters, "targets": [
                    {"node": "n1", "provider": "big", "model": &*cfg.models[1].targets[0].upstream_model},
                ], "usage": {"reported": 0, "unreported": 0, "input_tokens": 0, "output_tokens": 0,
                             "reasoning_tokens": 0, "cached_input_tokens": 0}},
            ],
        });
        assert_eq!(v, expected);
    }

    #[test]
    fn nodes_without_a_status_or_a_resource_stay_listed_offline() {
        let cfg = config();
        // No statuses at all and an empty view (e.g. out of step with the config).
        let v = snapshot(&cfg, &[], &PoolView::default());
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
            suspect: false,
            generation: 0,
            worker: None,
            links: vec![],
        }];
        let v = snapshot(&cfg, &statuses, &pool);
        let p = &v["nodes"][1]["providers"][0];
        assert_eq!(p["status"], "unavailable");
        assert_eq!(p["normal"], json!({"configured": 8, "effective": 0, "in_use": 1}));
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
            suspect: true,
            generation: 2,
            worker: Some(0),
            links: vec![link(0, true), link(1, true)],
        };
        let v = snapshot(&cfg, &[status], &pool);
        let n = &v["nodes"][0];
        assert_eq!((&n["suspect"], &n["links"][1]["suspect"]), (&json!(true), &json!(true)));
        let p = &n["providers"][0];
        assert_eq!(
            (&p["status"], &p["suspect"], &p["health"]),
            (&json!("unavailable"), &json!(true), &json!("online"))
        );
        assert_eq!(p["normal"], json!({"configured": 4, "effective": 0, "in_use": 1}));
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
            suspect: false,
            generation: if connected { 2 } else { 0 },
            worker: None,
            links: vec![],
        };
        let up = |v: &Value| v["nodes"][0]["providers"][0].clone();
        let v = snapshot(&cfg, &[status(true)], &pool);
        assert_eq!((&up(&v)["status"], &up(&v)["health"]), (&json!("available"), &json!("online")));
        let v = snapshot(&cfg, &[status(false)], &pool);
        assert_eq!((&up(&v)["status"], &up(&v)["health"]), (&json!("unavailable"), &json!("offline")));
        assert_eq!((&up(&v)["normal"]["effective"], &up(&v)["long"]["effective"]), (&json!(0), &json!(0)));
    }
}
