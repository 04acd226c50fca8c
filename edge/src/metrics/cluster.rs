//! The shared limits engine's metrics (`[cluster]`): whether it is
//! reachable, which mode decides each key's limits, the live edges, and
//! how checks went. Process-wide counters, read at scrape time; nothing is
//! written without `[cluster]`.

use std::{fmt::Write, sync::atomic::Ordering};

use iop_core::config::EngineDown;

use crate::{cluster::Engine, pool::keys::KeyState};

fn head(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// Appends the engine's metrics (nothing without one). `keys` are the
/// configured keys (counted by the mode deciding their limits).
pub fn render(out: &mut String, engine: Option<&Engine>, keys: &[std::sync::Arc<KeyState>]) {
    let Some(e) = engine else { return };
    let up = e.is_up();
    head(out, "iop_edge_cluster_engine_up", "gauge", "1 while the shared limits engine is reachable, else 0.");
    let _ = writeln!(out, "iop_edge_cluster_engine_up {}", u8::from(up));
    head(
        out,
        "iop_edge_cluster_limit_mode",
        "gauge",
        "Keys with limits by what decides them now: engine, or while it is down their on_engine_down (open: \
         this edge's share, closed: refused).",
    );
    let limited = keys.iter().filter(|k| k.limits().any());
    let (mut open, mut closed, mut engine) = (0, 0, 0);
    for k in limited {
        match (up, k.entry.on_engine_down) {
            (true, _) => engine += 1,
            (false, EngineDown::Open) => open += 1,
            (false, EngineDown::Closed) => closed += 1,
        }
    }
    for (mode, n) in [("engine", engine), ("open", open), ("closed", closed)] {
        let _ = writeln!(out, "iop_edge_cluster_limit_mode{{mode=\"{mode}\"}} {n}");
    }
    head(out, "iop_edge_cluster_live_edges", "gauge", "Edges seen live in the engine (kept while it is down).");
    let _ = writeln!(out, "iop_edge_cluster_live_edges {}", e.live_edges());
    let c = &e.counters;
    head(
        out,
        "iop_edge_cluster_checks_total",
        "counter",
        "Limit checks by outcome: allowed or refused by the engine, or decided without it (down, queue_full, \
         deadline).",
    );
    for (outcome, n) in [
        ("allowed", &c.allowed),
        ("refused", &c.refused),
        ("down", &c.down),
        ("queue_full", &c.queue_full),
        ("deadline", &c.deadline),
    ] {
        let _ = writeln!(out, "iop_edge_cluster_checks_total{{outcome=\"{outcome}\"}} {}", n.load(Ordering::Relaxed));
    }
    head(out, "iop_edge_cluster_charges_dropped_total", "counter", "Token charges not sent to the engine.");
    let _ = writeln!(out, "iop_edge_cluster_charges_dropped_total {}", c.charges_dropped.load(Ordering::Relaxed));
    head(out, "iop_edge_cluster_engine_lost_total", "counter", "Times the engine became unreachable.");
    let _ = writeln!(out, "iop_edge_cluster_engine_lost_total {}", c.lost.load(Ordering::Relaxed));
}
