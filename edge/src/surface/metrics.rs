//! `GET /metrics`: the Prometheus text format. With an `admin_token`
//! configured it needs that token (`Authorization: Bearer`), like the admin
//! API; without one it is open, as `/healthz` is. It names configured ids
//! and numbers only: never a request id, a prompt or a credential.

use std::rc::Rc;

use iop_core::http::RequestHead;

use crate::{
    ctx::Ctx,
    metrics::{self, render::Gauges},
    server::Conn,
};

/// Answers a scrape; returns whether the connection may be kept.
pub async fn scrape(worker: &Rc<Ctx>, conn: &mut Conn, head: &RequestHead, keep: bool) -> bool {
    // Open without an admin token; with one, checked (and failures limited) as the admin API's.
    if let Err(kept) = super::admin::check_token(worker, conn, head, keep).await {
        return kept;
    }
    let merged = metrics::gather::gather(worker).await;
    let body = {
        let config = worker.config.borrow();
        let view = worker.pool.borrow();
        let (nodes, reconnects) = {
            let registry = worker.shared.registry.lock();
            let nodes = registry.statuses(&config);
            let reconnects: Vec<u64> = nodes.iter().map(|n| registry.reconnects(&n.id)).collect();
            (nodes, reconnects)
        };
        let mut text = metrics::render::render(
            &merged,
            &Gauges { config: &config, view: &view, nodes: &nodes, reconnects: &reconnects },
        );
        metrics::cluster::render(&mut text, worker.shared.cluster.as_deref(), &view.keys);
        text
    };
    let ct = "text/plain; version=0.0.4; charset=utf-8";
    conn.respond(200, ct, &[], body.as_bytes(), keep).await.is_ok() && keep
}
