//! Provider health on the edge, on each resource's owner core: applying
//! observations to the runtime overlay (stall evidence handed off by a
//! session, probe answers), a first probe of each provider when its node
//! connection comes up (a provider still loading is `starting`), and
//! CAPABILITIES recovery — while a provider is lowered, its node is asked on
//! a schedule to probe the exact target; only a strictly newer `available`
//! answer raises it again.

use std::{rc::Rc, time::Duration};

use iop_core::{
    liveness::ProviderHealth,
    rt::{oneshot::oneshot, time},
    wire::pb,
};
use serde::Deserialize;

use crate::{
    ctx::Ctx,
    events::EdgeEvent,
    link::SessionCmd,
    pool::{HealthReport, Observed, ResourceKey, Source},
    registry::Generation,
};

/// How long a probe answer is waited for: the node's probe is bounded by
/// 2 s; the rest is the round trip and a busy session.
const ANSWER_WAIT: Duration = Duration::from_secs(5);

/// Applies `report` to the overlay of a resource this core owns; logs and
/// publishes what it did; starts the recovery probes when it lowered it.
pub fn observe(worker: &Rc<Ctx>, report: &HealthReport) {
    let observed = worker.shard.borrow_mut().observe(report);
    let overlay = worker.pool.borrow().resources.get(&report.key).map_or("unknown", |l| l.overlay().as_str());
    let (node, provider) = (&*report.key.node, &*report.key.provider);
    let fields = (report.source.as_str(), report.health.as_str(), observed.as_str());
    tracing::info!(
        node,
        provider,
        source = fields.0,
        provider_health = fields.1,
        outcome = fields.2,
        overlay,
        generation = report.generation,
        link = report.link,
        health_observation_seq = report.seq,
        "edge_provider_health_observation"
    );
    // What an operator must see: a provider leaving or rejoining traffic.
    match observed {
        Observed::Lowered | Observed::Starting => tracing::warn!(node, provider, overlay, "provider out of traffic"),
        Observed::Recovered => tracing::warn!(node, provider, "provider back in traffic"),
        Observed::Unchanged | Observed::Stale => {}
    }
    crate::metrics::health(fields.0, fields.1, fields.2);
    worker.shared.events.publish(EdgeEvent::ProviderHealth {
        node: node.to_owned(),
        provider: provider.to_owned(),
        source: fields.0,
        health: fields.1,
        outcome: fields.2,
        overlay,
    });
    if matches!(observed, Observed::Lowered | Observed::Starting) {
        monoio::spawn(probe_until_recovered(worker.clone(), report.key.clone(), report.generation));
    }
}

/// The target a provider serves first in this core's config (what its
/// readiness probe asks about); `None` when no model uses it.
fn first_target(worker: &Ctx, key: &ResourceKey) -> Option<String> {
    let config = worker.config.borrow();
    let t = config
        .models
        .iter()
        .flat_map(|m| m.targets.iter())
        .find(|t| *t.node == *key.node && *t.provider == *key.provider)?;
    Some(t.upstream_model.to_string())
}

/// Cold start is not failure: when a node connection comes up, each of its
/// providers is probed once; one still loading (503 "loading") is shown as
/// `starting`, takes no traffic and is probed until ready.
pub async fn first_probe(worker: Rc<Ctx>, key: ResourceKey, generation: Generation) {
    let Some(target) = first_target(&worker, &key) else { return };
    let route = worker.shard.borrow().route_of(&key, generation);
    let Some(link) = route.as_ref().and_then(|r| r.links.first()) else { return };
    if let Some((health, seq)) = ask(link, &key, &target).await {
        let report = HealthReport { key, generation, link: link.index, seq, health, target, source: Source::Probe };
        observe(&worker, &report);
    }
}

/// Asks the node over `link` to probe `target` of `key`'s provider; the
/// health and observation number of a well-formed, exact answer.
async fn ask(link: &crate::link::LinkRoute, key: &ResourceKey, target: &str) -> Option<(ProviderHealth, u64)> {
    let req = pb::NodeCommandRequest {
        kind: pb::NodeCommandKind::Capabilities as i32,
        adapter: key.provider.to_string(),
        target: target.to_owned(),
        payload_json: bytes::Bytes::new(),
    };
    let (reply, rx) = oneshot();
    // Busy or gone: the next round (or generation) sees which.
    link.session.try_send(SessionCmd::Command { req, reply }).ok()?;
    let answer = time::timeout(ANSWER_WAIT, rx).await.ok()??;
    let read = read_answer(&answer, key, target);
    if read.is_none() {
        tracing::info!(
            node = %key.node,
            provider = %key.provider,
            "edge_provider_health_observation: malformed or mismatched probe answer ignored"
        );
    }
    read
}

/// The provider's `health_probe_interval_ms` in this core's config.
fn interval_of(worker: &Ctx, key: &ResourceKey) -> Option<Duration> {
    let config = worker.config.borrow();
    let node = config.nodes.iter().find(|n| *n.id == *key.node)?;
    Some(node.providers.iter().find(|p| *p.id == *key.provider)?.health_probe_interval)
}

/// Probes `key` every interval while its overlay stays lowered in
/// `generation` (a new generation starts healthy, a reload that removes
/// the resource ends it).
async fn probe_until_recovered(worker: Rc<Ctx>, key: ResourceKey, generation: Generation) {
    loop {
        let Some(interval) = interval_of(&worker, &key) else { return };
        time::sleep(interval).await;
        if worker.stop.is_cancelled() {
            return;
        }
        let Some((route, target)) = worker.shard.borrow().probe_plan(&key, generation) else { return };
        let Some(link) = route.links.first() else { continue };
        if let Some((health, seq)) = ask(link, &key, &target).await {
            let report = HealthReport {
                key: key.clone(),
                generation,
                link: link.index,
                seq,
                health,
                target,
                source: Source::Probe,
            };
            observe(&worker, &report);
        }
    }
}

#[derive(Deserialize)]
struct ProbeAnswer {
    adapter: String,
    target: String,
    status: String,
    health_observation_seq: u64,
}

/// The health and observation number of a probe answer about exactly
/// (`key`'s provider, `target`); anything else — an error, another
/// provider or target, an unknown status, no number — is `None`.
fn read_answer(resp: &pb::NodeCommandResponse, key: &ResourceKey, target: &str) -> Option<(ProviderHealth, u64)> {
    if !resp.ok {
        return None;
    }
    let a: ProbeAnswer = serde_json::from_slice(&resp.result_json).ok()?;
    if a.adapter != *key.provider || a.target != target || a.health_observation_seq == 0 {
        return None;
    }
    let health = match a.status.as_str() {
        "available" => ProviderHealth::Available,
        "unavailable" => ProviderHealth::Unavailable,
        "unknown" => ProviderHealth::Unknown,
        "starting" => ProviderHealth::Starting,
        _ => return None,
    };
    Some((health, a.health_observation_seq))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn resp(ok: bool, json: &str) -> pb::NodeCommandResponse {
        pb::NodeCommandResponse { ok, error: String::new(), result_json: json.as_bytes().to_vec().into(), status: 200 }
    }

    #[test]
    fn only_an_exact_well_formed_answer_is_read() {
        let key = ResourceKey::new("n1", "up");
        let good = r#"{"adapter":"up","target":"m","status":"available","health_observation_seq":3}"#;
        assert_eq!(read_answer(&resp(true, good), &key, "m"), Some((ProviderHealth::Available, 3)));
        let down = r#"{"adapter":"up","target":"m","status":"unavailable","health_observation_seq":4}"#;
        assert_eq!(read_answer(&resp(true, down), &key, "m"), Some((ProviderHealth::Unavailable, 4)));
        for bad in [
            r#"{"adapter":"other","target":"m","status":"available","health_observation_seq":3}"#,
            r#"{"adapter":"up","target":"m2","status":"available","health_observation_seq":3}"#,
            r#"{"adapter":"up","target":"m","status":"fine","health_observation_seq":3}"#,
            r#"{"adapter":"up","target":"m","status":"available","health_observation_seq":0}"#,
            r#"{"adapter":"up","target":"m","status":"available"}"#,
            "not json",
        ] {
            assert_eq!(read_answer(&resp(true, bad), &key, "m"), None, "{bad}");
        }
        assert_eq!(read_answer(&resp(false, good), &key, "m"), None);
    }
}
