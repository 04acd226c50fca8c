//! `/healthz` and `/readyz`: whether the edge can take traffic, which means
//! a provider that can, not merely a connected node.
//!
//! - `/healthz` is liveness: 200 while the edge runs (503 once draining),
//!   its body says how many providers can take traffic now.
//! - `/readyz` is readiness: 200 only when at least one provider is online
//!   with capacity, else 503 with the reason, so a load balancer sends
//!   nothing to an edge whose every provider is gone.

use std::sync::atomic::Ordering;

use crate::ctx::Ctx;

/// What the two endpoints report.
pub struct Health {
    draining: bool,
    nodes_ready: usize,
    providers: usize,
    providers_available: usize,
    worker: usize,
}

impl Health {
    /// This core's view now.
    pub fn of(worker: &Ctx) -> Self {
        let pool = worker.pool.borrow();
        let available = pool
            .resources
            .values()
            .filter(|l| {
                let cap = l.configured_normal.load(Ordering::Relaxed).max(l.configured_long.load(Ordering::Relaxed));
                l.live() && cap > 0
            })
            .count();
        Self {
            draining: worker.shared.draining.load(Ordering::Acquire),
            nodes_ready: worker.routes.borrow().len(),
            providers: pool.resources.len(),
            providers_available: available,
            worker: worker.index,
        }
    }

    fn status(&self) -> &'static str {
        if self.draining {
            "draining"
        } else if self.providers_available == 0 {
            "no_provider_available"
        } else {
            "ok"
        }
    }

    fn body(&self) -> String {
        format!(
            "{{\"status\":\"{}\",\"nodes_ready\":{},\"providers\":{},\"providers_available\":{},\"worker\":{}}}",
            self.status(),
            self.nodes_ready,
            self.providers,
            self.providers_available,
            self.worker
        )
    }

    /// `/healthz`: (status code, body).
    pub fn liveness(&self) -> (u16, String) {
        (if self.draining { 503 } else { 200 }, self.body())
    }

    /// `/readyz`: (status code, body).
    pub fn readiness(&self) -> (u16, String) {
        (if self.status() == "ok" { 200 } else { 503 }, self.body())
    }
}
