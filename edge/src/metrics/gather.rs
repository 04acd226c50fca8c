//! Collects every core's counters into one copy: what `GET /metrics`
//! renders and what the admin snapshot reports, so both read the same.

use std::time::Duration;

use iop_core::rt::oneshot::oneshot;

use crate::{ctx::Ctx, mesh::CoreMsg, metrics::CoreMetrics};

/// How long a core may take to hand over its counters.
const CORE_WAIT: Duration = Duration::from_secs(2);

/// Asks every core (this one included) for its counters and merges them.
/// A core that does not answer within [`CORE_WAIT`] is left out.
pub async fn gather(worker: &Ctx) -> CoreMetrics {
    let mut merged = CoreMetrics::default();
    let mut pending = Vec::with_capacity(worker.shared.inboxes.len());
    for inbox in &worker.shared.inboxes {
        let (reply, rx) = oneshot();
        if inbox.send(CoreMsg::Metrics { reply }).await.is_ok() {
            pending.push(rx);
        }
    }
    for rx in pending {
        if let Ok(Some(m)) = iop_core::rt::time::timeout(CORE_WAIT, rx).await {
            merged.merge(&m);
        }
    }
    merged
}
