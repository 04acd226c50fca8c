//! The Prometheus text exposition of the merged per-core metrics and the
//! gauges read from the shared state.

use std::{fmt::Write, sync::atomic::Ordering};

use iop_core::config::EdgeConfig;

use super::{CoreMetrics, Histogram, BUCKETS};
use crate::{
    pool::{LeaseClass, PoolView},
    registry::NodeStatus,
};

/// One of a model's histograms.
type Pick = fn(&super::ModelMetrics) -> &Histogram;

/// What a scrape reads besides the per-core counters.
pub struct Gauges<'a> {
    pub config: &'a EdgeConfig,
    pub view: &'a PoolView,
    pub nodes: &'a [NodeStatus],
    /// Reconnects per configured node, in config order.
    pub reconnects: &'a [u64],
}

/// A label value, escaped as the text format requires.
fn esc(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn head(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

fn histogram(out: &mut String, name: &str, labels: &str, h: &Histogram) {
    let sep = if labels.is_empty() { "" } else { "," };
    let mut cumulative = 0;
    for (i, bound) in BUCKETS.iter().enumerate() {
        cumulative += h.counts[i];
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{bound}\"}} {cumulative}");
    }
    cumulative += h.counts[BUCKETS.len()];
    let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {cumulative}");
    let _ = writeln!(out, "{name}_sum{{{labels}}} {}", h.sum);
    let _ = writeln!(out, "{name}_count{{{labels}}} {cumulative}");
}

/// Renders everything.
pub fn render(m: &CoreMetrics, g: &Gauges<'_>) -> String {
    let mut out = String::with_capacity(16 * 1024);
    let mut models: Vec<_> = m.models.iter().collect();
    models.sort_by(|a, b| a.0.cmp(b.0));

    head(&mut out, "iop_edge_requests_total", "counter", "Requests answered, by model, surface and HTTP status.");
    for (model, mm) in &models {
        let mut statuses = mm.by_status.clone();
        statuses.sort_unstable();
        for (surface, status, n) in statuses {
            let model = esc(model);
            let _ = writeln!(
                out,
                "iop_edge_requests_total{{model=\"{model}\",surface=\"{surface}\",status=\"{status}\"}} {n}"
            );
        }
    }
    let hists: [(&str, &str, Pick); 3] = [
        ("iop_edge_request_duration_seconds", "From a request's head to its answer's last byte.", |m| &m.duration),
        ("iop_edge_time_to_first_byte_seconds", "From a request's head to its answer's first body byte.", |m| &m.ttft),
        ("iop_edge_queue_wait_seconds", "Time a request waited in its model's queue for capacity.", |m| &m.queue_wait),
    ];
    for (name, help, get) in hists {
        head(&mut out, name, "histogram", help);
        for (model, mm) in &models {
            histogram(&mut out, name, &format!("model=\"{}\"", esc(model)), get(mm));
        }
    }
    head(
        &mut out,
        "iop_edge_inter_token_gap_seconds",
        "histogram",
        "Gaps between a streamed answer's writes to its client.",
    );
    for (path, h) in ["tunnel", "normalized"].iter().zip(m.gaps.iter()) {
        histogram(&mut out, "iop_edge_inter_token_gap_seconds", &format!("path=\"{path}\""), h);
    }

    head(
        &mut out,
        "iop_edge_provider_health_evidence_total",
        "counter",
        "Validated provider health observations, by source and health.",
    );
    let mut ev: Vec<_> = m.health_evidence.iter().collect();
    ev.sort();
    for ((source, health), n) in ev {
        let _ = writeln!(out, "iop_edge_provider_health_evidence_total{{source=\"{source}\",health=\"{health}\"}} {n}");
    }
    head(
        &mut out,
        "iop_edge_provider_health_transitions_total",
        "counter",
        "Runtime health overlay transitions, by outcome.",
    );
    let mut tr: Vec<_> = m.health_transitions.iter().collect();
    tr.sort();
    for (outcome, n) in tr {
        let _ = writeln!(out, "iop_edge_provider_health_transitions_total{{outcome=\"{outcome}\"}} {n}");
    }
    head(
        &mut out,
        "iop_edge_liveness_recovery_eligibility_total",
        "counter",
        "Recovery-before-commit decisions, by decision and reason.",
    );
    let mut el: Vec<_> = m.recovery_eligibility.iter().collect();
    el.sort();
    for ((decision, reason), n) in el {
        let _ = writeln!(
            out,
            "iop_edge_liveness_recovery_eligibility_total{{decision=\"{decision}\",reason=\"{reason}\"}} {n}"
        );
    }
    head(&mut out, "iop_edge_liveness_recovery_results_total", "counter", "Results of replays before commit.");
    let mut rs: Vec<_> = m.recovery_results.iter().collect();
    rs.sort();
    for (result, n) in rs {
        let _ = writeln!(out, "iop_edge_liveness_recovery_results_total{{result=\"{result}\"}} {n}");
    }
    head(
        &mut out,
        "iop_edge_link_suspect_total",
        "counter",
        "Node links that fell silent with runs in flight and did not answer a probe in time.",
    );
    let _ = writeln!(out, "iop_edge_link_suspect_total {}", m.links_suspect);

    limits(&mut out, m);
    single_request(&mut out, m);
    gauges(&mut out, g);
    out
}

/// The per-address limits' counters.
fn limits(out: &mut String, m: &CoreMetrics) {
    head(
        out,
        "iop_edge_auth_failures_total",
        "counter",
        "Failed credential checks counted against their address, by kind of credential.",
    );
    let mut fs: Vec<_> = m.auth_failures.iter().collect();
    fs.sort();
    for (kind, n) in fs {
        let _ = writeln!(out, "iop_edge_auth_failures_total{{credential=\"{kind}\"}} {n}");
    }
    head(
        out,
        "iop_edge_auth_refused_total",
        "counter",
        "Attempts with a wrong credential refused because their address failed too often, by kind.",
    );
    let mut rs: Vec<_> = m.auth_refused.iter().collect();
    rs.sort();
    for (kind, n) in rs {
        let _ = writeln!(out, "iop_edge_auth_refused_total{{credential=\"{kind}\"}} {n}");
    }
    head(
        out,
        "iop_edge_connection_limits_total",
        "counter",
        "Connections closed by a handshake or per-address limit, by listener and what closed them.",
    );
    let mut cs: Vec<_> = m.conn_limits.iter().collect();
    cs.sort();
    for ((listener, action), n) in cs {
        let _ = writeln!(out, "iop_edge_connection_limits_total{{listener=\"{listener}\",action=\"{action}\"}} {n}");
    }
}

/// The single-request (agent) path's counters.
fn single_request(out: &mut String, m: &CoreMetrics) {
    head(
        out,
        "iop_anthropic_single_request_ingress_total",
        "counter",
        "Messages requests that took the single-request (agent) path.",
    );
    let _ = writeln!(out, "iop_anthropic_single_request_ingress_total {}", m.single_request_ingress);
    head(
        out,
        "iop_edge_single_request_terminals_total",
        "counter",
        "Single requests ended, by terminal kind and error class.",
    );
    let mut ts: Vec<_> = m.single_request_terminals.iter().collect();
    ts.sort();
    for ((kind, class), n) in ts {
        let _ = writeln!(out, "iop_edge_single_request_terminals_total{{terminal=\"{kind}\",class=\"{class}\"}} {n}");
    }
    head(
        out,
        "iop_edge_single_request_calls_total",
        "counter",
        "Calls single requests made, by kind (model, tool, cleanup).",
    );
    let mut cs: Vec<_> = m.single_request_calls.iter().collect();
    cs.sort();
    for (kind, n) in cs {
        let _ = writeln!(out, "iop_edge_single_request_calls_total{{kind=\"{kind}\"}} {n}");
    }
    head(out, "iop_edge_single_request_stage_seconds", "histogram", "Time single requests spent in each stage.");
    let mut ss: Vec<_> = m.single_request_stages.iter().collect();
    ss.sort_by_key(|(s, _)| **s);
    for (stage, h) in ss {
        histogram(out, "iop_edge_single_request_stage_seconds", &format!("stage=\"{stage}\""), h);
    }
}

fn gauges(out: &mut String, g: &Gauges<'_>) {
    head(out, "iop_edge_leases_in_use", "gauge", "Capacity leases held, by provider and pool.");
    let mut caps = String::new();
    let mut avail = String::new();
    for node in &g.config.nodes {
        for p in &node.providers {
            let key = crate::pool::ResourceKey::new(&node.id, &p.id);
            let Some(load) = g.view.resources.get(&key) else { continue };
            let labels = format!("node=\"{}\",provider=\"{}\"", esc(&node.id), esc(&p.id));
            for (class, name) in [(LeaseClass::Normal, "normal"), (LeaseClass::Long, "long")] {
                let _ = writeln!(out, "iop_edge_leases_in_use{{{labels},class=\"{name}\"}} {}", load.in_use(class));
                let _ = writeln!(caps, "iop_edge_lease_capacity{{{labels},class=\"{name}\"}} {}", load.capacity(class));
            }
            let _ = writeln!(
                avail,
                "iop_edge_provider_available{{{labels},runtime_health=\"{}\"}} {}",
                load.overlay().as_str(),
                u8::from(load.live() && !load.suspect.load(Ordering::Acquire))
            );
        }
    }
    head(out, "iop_edge_lease_capacity", "gauge", "Capacity a provider has now (0 when it takes no traffic), by pool.");
    out.push_str(&caps);
    head(
        out,
        "iop_edge_provider_available",
        "gauge",
        "1 when a provider takes traffic (online, healthy, not suspect).",
    );
    out.push_str(&avail);

    head(out, "iop_edge_queue_depth", "gauge", "Requests queued for capacity, by model.");
    for model in &g.config.models {
        let n = g.view.waiters.get(&model.name).map_or(0, |w| w.load(Ordering::Relaxed));
        let _ = writeln!(out, "iop_edge_queue_depth{{model=\"{}\"}} {n}", esc(&model.name));
    }
    head(
        out,
        "iop_edge_tokens_total",
        "counter",
        "Tokens of finished requests as their providers reported them, by model and kind.",
    );
    for model in &g.config.models {
        let Some(u) = g.view.usage.get(&model.name) else { continue };
        for (kind, c) in [
            ("input", &u.input_tokens),
            ("output", &u.output_tokens),
            ("reasoning", &u.reasoning_tokens),
            ("cached", &u.cached_input_tokens),
        ] {
            let _ = writeln!(
                out,
                "iop_edge_tokens_total{{model=\"{}\",kind=\"{kind}\"}} {}",
                esc(&model.name),
                c.load(Ordering::Relaxed)
            );
        }
    }
    head(out, "iop_edge_node_links", "gauge", "Connected links of each configured node (0: not connected).");
    for n in g.nodes {
        let _ = writeln!(out, "iop_edge_node_links{{node=\"{}\"}} {}", esc(&n.id), n.links.len());
    }
    head(
        out,
        "iop_edge_node_links_suspect",
        "gauge",
        "Ready links of each node that are suspect (take no new dispatch).",
    );
    for n in g.nodes {
        let _ = writeln!(
            out,
            "iop_edge_node_links_suspect{{node=\"{}\"}} {}",
            esc(&n.id),
            n.links.iter().filter(|l| l.suspect).count()
        );
    }
    head(out, "iop_edge_node_reconnects_total", "counter", "Connections of a node registered after its first.");
    for (n, r) in g.nodes.iter().zip(g.reconnects) {
        let _ = writeln!(out, "iop_edge_node_reconnects_total{{node=\"{}\"}} {r}", esc(&n.id));
    }
}
