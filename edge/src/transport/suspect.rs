//! Suspect links. A node that stops (SIGSTOP, a hung host, a network that
//! drops packets without a reset) keeps its links open: until the heartbeat
//! wait closes them (45 s), every run dispatched there waits that long. So a
//! link that owes the edge something (runs in flight) and has sent no frame
//! for `node_listener.suspect_after_ms` is pinged; one that does not answer
//! within `node_listener.probe_timeout_ms` is *suspect*: routes try it last
//! and, once every ready link of its node is suspect, the node's providers
//! offer no capacity (waiters keep queueing; they are not told the
//! candidate is gone). Any frame from the link clears it. Nothing is closed
//! here: closing stays the heartbeat's. A live node answers pings while its
//! model prefills, so a long first token never makes a link suspect.

use std::{cell::Cell, rc::Rc, time::Instant};

use iop_core::{
    config::LinkProbe,
    rt::{frames::FrameWriter, signal::LocalCancel, signal::LocalNotify, time},
    wire::pb::{self, envelope::Body, Envelope},
};

use crate::{events::EdgeEvent, link::Suspicion, mesh::CoreMsg};

/// What the watch of one link works with.
pub(super) struct Watch {
    pub worker: Rc<crate::ctx::Ctx>,
    pub node_id: String,
    pub generation: crate::registry::Generation,
    pub link: u32,
    pub probe: LinkProbe,
    pub writer: FrameWriter,
    /// When the link last sent a frame (set by the session's reader).
    pub last_seen: Rc<Cell<Instant>>,
    /// Raised by the reader on a frame from a suspect link.
    pub heard: LocalNotify,
    /// Raised by `SessionCmd::Probe`.
    pub probe_now: LocalNotify,
    pub suspicion: Suspicion,
    pub closed: LocalCancel,
    /// Whether the link owes the edge something now (runs in flight).
    pub owes: Box<dyn Fn() -> bool>,
}

/// Watches one link until its session closes.
pub(super) async fn watch(w: Watch) {
    let mut next_check = Instant::now() + w.probe.silence;
    loop {
        // A sibling's suspicion asks for a probe whatever this link owes.
        let asked = monoio::select! {
            _ = time::sleep_until(next_check) => false,
            _ = w.probe_now.notified() => true,
            _ = w.closed.cancelled() => return,
        };
        let now = Instant::now();
        let quiet_since = w.last_seen.get();
        if asked {
            // Spoke within a probe's time: as good as an answer.
            if now < quiet_since + w.probe.answer_within {
                continue;
            }
        } else if now < quiet_since + w.probe.silence {
            next_check = quiet_since + w.probe.silence;
            continue;
        } else if !(w.owes)() {
            // Nothing is owed: a silent idle link is normal (pings are 30 s
            // apart). Look again after another window.
            next_check = now + w.probe.silence;
            continue;
        }
        let Some(probed) = probe(&w).await else {
            next_check = w.last_seen.get() + w.probe.silence;
            continue;
        };
        let silent_ms = millis(quiet_since.elapsed());
        mark(&w, true).await;
        tracing::warn!(node = %w.node_id, generation = w.generation, link = w.link, silent_ms, "node link silent and not answering a ping; suspect: no new dispatch to it until it answers");
        w.worker.shared.events.publish(EdgeEvent::LinkSuspect {
            node: w.node_id.clone(),
            generation: w.generation,
            link: w.link,
            silent_ms,
        });
        crate::metrics::link_suspect();
        probe_siblings(&w);
        let suspected = Instant::now();
        // Any frame since the probe ends it (the last-seen time is the
        // truth: a notification may be left over from an earlier episode,
        // and an answer may have landed just as the probe timed out).
        while w.last_seen.get() < probed {
            monoio::select! {
                _ = w.heard.notified() => {}
                _ = w.closed.cancelled() => return,
            }
        }
        mark(&w, false).await;
        let suspect_ms = millis(suspected.elapsed());
        tracing::info!(node = %w.node_id, generation = w.generation, link = w.link, suspect_ms, "suspect node link answered; it takes new dispatch again");
        w.worker.shared.events.publish(EdgeEvent::LinkResponsive {
            node: w.node_id.clone(),
            generation: w.generation,
            link: w.link,
            suspect_ms,
        });
        next_check = w.last_seen.get() + w.probe.silence;
    }
}

/// Pings the link; when nothing arrived within the probe's time, the
/// moment of the ping.
async fn probe(w: &Watch) -> Option<Instant> {
    let ping = Envelope { correlation_id: 0, body: Some(Body::Heartbeat(pb::Heartbeat { ping: true, sent_at_ms: 0 })) };
    // A failed send is the session ending: its close, not a suspicion.
    w.writer.send(&ping).ok()?;
    let probed = Instant::now();
    monoio::select! {
        _ = time::sleep_until(probed + w.probe.answer_within) => {}
        _ = w.closed.cancelled() => return None,
    }
    (w.last_seen.get() < probed).then_some(probed)
}

/// Asks the node's other links for a probe: a frozen process freezes its
/// idle links too, which owe nothing and so would never be probed, and a
/// node is suspect only when every ready link is.
fn probe_siblings(w: &Watch) {
    let routes = w.worker.routes.borrow();
    let Some(route) = routes.get(&w.node_id).filter(|r| r.generation == w.generation) else { return };
    for l in route.links.iter().filter(|l| l.index != w.link && !l.suspicion.is_suspect()) {
        // A full mailbox belongs to a link busy enough to be heard from.
        let _ = l.session.try_send(super::SessionCmd::Probe);
    }
}

/// Sets the link's state and tells every core, whose shards decide whether
/// the node as a whole (every ready link) is suspect.
async fn mark(w: &Watch, suspect: bool) {
    if w.suspicion.set(suspect) {
        let node_id = w.node_id.clone();
        w.worker.shared.broadcast(|| CoreMsg::LinkSuspicion { node_id: node_id.clone() }).await;
    }
}

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
