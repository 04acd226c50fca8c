//! The edge's side of capacity shares (DESIGN.md, "Capacity shares"): a
//! node that serves several edges announces this edge's share of each of
//! its providers; the edge admits only within it (the resource's capacity
//! is the smaller of the configured and the share) and reports its demand
//! back: at once when it applied an announcement (acknowledging it), and
//! a few times a second while the demand changes.

use std::{rc::Rc, time::Instant};

use iop_core::{
    rt::{frames::FrameWriter, signal::LocalCancel},
    wire::pb::{self, envelope::Body},
};

use super::envelope;
use crate::{
    ctx::Ctx,
    mesh::{owner_of, post, CoreMsg},
    pool::shares::{self as pool_shares, REPORT_ANYWAY, REPORT_EVERY},
};

/// Applies announcement `s` of `node`'s connection `generation`; a share
/// that may have grown has its queue served by the resource's owner.
/// True when any share was applied.
pub(super) fn apply(worker: &Rc<Ctx>, node: &str, generation: u64, s: &pb::CapacityShares) -> bool {
    let view = worker.pool.borrow().clone();
    pool_shares::apply(&view, node, generation, s, |key| {
        let owner = owner_of(&key, worker.shared.workers);
        if owner == worker.index {
            worker.shard.borrow_mut().pump(&key);
        } else {
            post(&worker.shared.inboxes[owner], CoreMsg::Pump { key });
        }
    })
}

/// This edge's demand on `node`'s providers now.
fn demand(worker: &Rc<Ctx>, node: &str, generation: u64) -> pb::ShareDemand {
    pool_shares::demand(&worker.pool.borrow(), node, generation)
}

/// Sends this edge's demand on `node` (the acknowledgement of what it applied).
pub(super) fn report(worker: &Rc<Ctx>, writer: &FrameWriter, node: &str, generation: u64) {
    let _ = writer.send(&envelope(0, Body::ShareDemand(demand(worker, node, generation))));
}

/// Reports the demand while it changes, until the link closes. Only for a
/// node that announced shares: others never hear of them.
pub(super) async fn keep_reporting(
    worker: Rc<Ctx>,
    writer: FrameWriter,
    node: String,
    generation: u64,
    closed: LocalCancel,
) {
    let mut last: Option<(pb::ShareDemand, Instant)> = None;
    loop {
        monoio::select! {
            _ = monoio::time::sleep(REPORT_EVERY) => {}
            _ = closed.cancelled() => return,
        }
        let d = demand(&worker, &node, generation);
        if d.applied_epoch == 0 {
            continue;
        }
        let due = last.as_ref().is_none_or(|(prev, at)| *prev != d || at.elapsed() >= REPORT_ANYWAY);
        if due {
            if writer.send(&envelope(0, Body::ShareDemand(d.clone()))).is_err() {
                return;
            }
            last = Some((d, Instant::now()));
        }
    }
}
