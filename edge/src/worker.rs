//! The root of one edge worker core: builds nothing itself (the core's
//! state is [`Ctx`]), spawns its listeners' accept loops and applies its
//! inbox. Only `start.rs` imports it.

use std::rc::Rc;

use crate::{ctx::Ctx, mesh::CoreMsg, server, transport};

/// Applies one message from another core (or the reload thread).
fn apply(ctx: &Rc<Ctx>, msg: CoreMsg) {
    match msg {
        CoreMsg::NodeReady { node_id, route } => {
            let generation = route.generation;
            if ctx.shard.borrow().is_fenced(&node_id, generation) {
                // A link set of a generation whose fence came first.
                return;
            }
            ctx.shard.borrow_mut().set_route(&node_id, &route);
            {
                let mut routes = ctx.routes.borrow_mut();
                // Generations and link sets only grow; never let an older one replace a newer.
                if routes.get(&node_id).is_none_or(|r| route.newer_than(r)) {
                    routes.insert(node_id.clone(), route);
                }
            }
            let fresh = ctx.shard.borrow_mut().node_ready(&node_id, generation);
            for key in fresh {
                monoio::spawn(crate::health_probe::first_probe(ctx.clone(), key, generation));
            }
        }
        CoreMsg::NodeGone { node_id, generation } => {
            {
                let mut routes = ctx.routes.borrow_mut();
                if routes.get(&node_id).is_some_and(|r| r.generation == generation) {
                    routes.remove(&node_id);
                }
            }
            ctx.shard.borrow_mut().node_gone(&node_id, generation);
        }
        CoreMsg::LinkSuspicion { node_id } => ctx.shard.borrow_mut().refresh_suspicion(&node_id),
        CoreMsg::Acquire { key, class, reply } => {
            let lease = ctx.shard.borrow_mut().try_acquire(&key, class);
            reply.send(lease);
        }
        CoreMsg::Wait { key, waiter } => ctx.shard.borrow_mut().wait(&key, waiter),
        CoreMsg::Release { key, class, load } => ctx.shard.borrow_mut().release(&key, class, &load),
        CoreMsg::DropLease(lease) => drop(lease),
        CoreMsg::Health(report) => crate::health_probe::observe(ctx, &report),
        CoreMsg::Metrics { reply } => reply.send(crate::metrics::snapshot()),
        CoreMsg::Compact { key } => ctx.shard.borrow_mut().compact(&key),
        CoreMsg::Pump { key } => ctx.shard.borrow_mut().pump(&key),
        CoreMsg::PrepareConfig { revision, config, pool, ack } => {
            *ctx.pending.borrow_mut() = Some((revision, config, pool));
            let _ = ack.send(ctx.index);
        }
        CoreMsg::CommitConfig { revision } => commit(ctx, revision),
        CoreMsg::AdoptLink(arrival) => {
            monoio::spawn(transport::session_serve_arrival(ctx.clone(), *arrival));
        }
        CoreMsg::Shutdown => ctx.stop.cancel(),
    }
}

/// Switches to the staged config: capacities on owned resources, the
/// pool view, and a refresh (or close) for this core's node sessions
/// whose config changed.
fn commit(ctx: &Ctx, revision: u64) {
    let staged = ctx.pending.borrow_mut().take();
    let Some((rev, config, pool)) = staged.filter(|(r, _, _)| *r == revision) else {
        tracing::warn!(worker = ctx.index, revision, "commit without a matching prepared config ignored");
        return;
    };
    let old = ctx.config.replace(config.clone());
    *ctx.pool.borrow_mut() = pool.clone();
    ctx.revision.set(rev);
    ctx.shard.borrow_mut().apply_config(&config, &pool);
    for ((node_id, _), (_, session)) in ctx.local_sessions.borrow().iter() {
        match config.node(node_id) {
            None => {
                let reason = "node removed from the edge config".to_owned();
                let _ = session.try_send(crate::link::SessionCmd::Close { reason });
            }
            Some(entry) if old.node(node_id) != Some(entry) => {
                let payload = crate::node_config::node_payload(entry, rev, ctx.shared.leases.as_deref());
                if session.try_send(crate::link::SessionCmd::Refresh { payload }).is_err() {
                    tracing::warn!(node = %node_id, "could not queue the config refresh for the node");
                }
            }
            Some(_) => {}
        }
    }
}

/// Runs worker `index`: accepts clients and nodes on this core's listeners
/// and applies inbox messages until shutdown.
pub async fn run(
    worker: Rc<Ctx>,
    http: std::net::TcpListener,
    nodes: std::net::TcpListener,
    inbox: iop_core::rt::mailbox::Receiver<CoreMsg>,
) {
    let http = match monoio::net::TcpListener::from_std(http) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(worker = worker.index, error = %e, "cannot adopt HTTP listener");
            return;
        }
    };
    let nodes = match monoio::net::TcpListener::from_std(nodes) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(worker = worker.index, error = %e, "cannot adopt node listener");
            return;
        }
    };
    monoio::spawn(server::accept_loop(worker.clone(), http, crate::surface::Router));
    monoio::spawn(transport::accept_loop(worker.clone(), nodes));
    // Keeps serving the inbox after Shutdown: draining runs still release
    // leases and fences still apply until the process exits.
    while let Some(msg) = inbox.recv().await {
        apply(&worker, msg);
    }
}
