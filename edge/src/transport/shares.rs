//! The edge's side of capacity shares (DESIGN.md, "Capacity shares"): a
//! node that serves several edges announces this edge's share of each of
//! its providers; the edge admits only within it (the resource's capacity
//! is the smaller of the configured and the share) and reports its demand
//! back: at once when it applied an announcement (acknowledging it), and
//! a few times a second while the demand changes.

use std::{
    rc::Rc,
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use iop_core::{
    rt::{frames::FrameWriter, signal::LocalCancel},
    wire::pb::{self, envelope::Body},
};

use super::envelope;
use crate::{
    ctx::Ctx,
    mesh::{owner_of, post, CoreMsg},
    pool::{LeaseClass, ResourceKey},
};

/// How often a changed demand is reported.
const REPORT_EVERY: Duration = Duration::from_millis(200);
/// A demand that does not change is still reported this often.
const REPORT_ANYWAY: Duration = Duration::from_secs(5);

/// Applies announcement `s` of `node`'s connection `generation`; a share
/// that may have grown has its queue served by the resource's owner.
/// True when any share was applied.
pub(super) fn apply(worker: &Rc<Ctx>, node: &str, generation: u64, s: &pb::CapacityShares) -> bool {
    let view = worker.pool.borrow().clone();
    let mut applied = false;
    for p in &s.shares {
        let key = ResourceKey::new(node, &p.provider);
        let Some(load) = view.resources.get(&key) else { continue };
        if load.share.apply(generation, s.epoch, p.normal, p.long) {
            applied = true;
            let owner = owner_of(&key, worker.shared.workers);
            if owner == worker.index {
                worker.shard.borrow_mut().pump(&key);
            } else {
                post(&worker.shared.inboxes[owner], CoreMsg::Pump { key });
            }
        }
    }
    applied
}

/// This edge's demand on `node`'s providers now.
fn demand(worker: &Rc<Ctx>, node: &str, generation: u64) -> pb::ShareDemand {
    let view = worker.pool.borrow().clone();
    let mut d = pb::ShareDemand::default();
    for (key, load) in view.resources.iter().filter(|(k, _)| &*k.node == node) {
        d.applied_epoch = d.applied_epoch.max(load.share.epoch(generation));
        d.providers.push(pb::ProviderDemand {
            provider: key.provider.to_string(),
            in_use_normal: load.in_use(LeaseClass::Normal),
            in_use_long: load.in_use(LeaseClass::Long),
            waiting: load.waiters.load(Ordering::Relaxed),
        });
    }
    d.providers.sort_by(|a, b| a.provider.cmp(&b.provider));
    d
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
