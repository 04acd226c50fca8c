//! `GET /admin/v1/events`: lifecycle events as Server-Sent Events.
//!
//! The stream opens with `: connected` (the subscription exists from then
//! on), then carries one `data: <json>` per event, batching what is already
//! queued into one chunk. A subscriber that falls behind loses events; the
//! next batch then starts with `{"type":"lagged","dropped":N}`, N being the
//! events lost since the previous report. After 15 s without an event a
//! `: keep-alive` comment is sent. The stream ends when the client goes
//! away, a write fails, or the worker stops; the connection then closes.
//!
//! With `?snapshots=1` the stream also carries the admin snapshot
//! ([`super::snapshot::current`]) as `{"type":"snapshot", ...}`: once at
//! the start, every [`SNAPSHOT_EVERY`], and shortly after each batch of
//! events, so that one connection holds everything the status page shows.

use std::{
    rc::Rc,
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use crate::{
    ctx::Ctx,
    events::Stamped,
    server::{with_disconnect_watch, Conn, STREAM_WATCH},
};
use bytes::BytesMut;
use iop_core::{
    http,
    rt::{mailbox, signal::LocalCancel},
    sse,
};

/// Undelivered events a subscriber may hold before it starts losing them.
pub const CAPACITY: usize = 1024;
/// Silence after which a keep-alive comment is sent.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// Interval of the snapshots of a `?snapshots=1` stream.
pub const SNAPSHOT_EVERY: Duration = Duration::from_secs(1);
/// Delay of the snapshot that follows events: the cores apply a node's
/// change to their resources right after its event is published.
pub const SNAPSHOT_AFTER_EVENTS: Duration = Duration::from_millis(100);

const CONNECTED: &[u8] = b": connected\n\n";
const KEEP_ALIVE_COMMENT: &[u8] = b": keep-alive\n\n";

enum Wake {
    Event(std::sync::Arc<Stamped>),
    Idle,
    Snapshot,
    Closed,
}

async fn next_wake(
    rx: &mailbox::Receiver<std::sync::Arc<Stamped>>,
    stop: &LocalCancel,
    snapshot_at: Option<Instant>,
) -> Wake {
    let snapshot = async {
        match snapshot_at {
            Some(at) => monoio::time::sleep(at.saturating_duration_since(Instant::now())).await,
            None => std::future::pending().await,
        }
    };
    monoio::select! {
        ev = rx.recv() => ev.map_or(Wake::Closed, Wake::Event),
        _ = stop.cancelled() => Wake::Closed,
        _ = snapshot => Wake::Snapshot,
        _ = monoio::time::sleep(KEEP_ALIVE) => Wake::Idle,
    }
}

/// Whether a query string asks for snapshots (`snapshots=1` among its
/// `&`-separated parameters).
pub fn wants_snapshots(query: Option<&str>) -> bool {
    query.is_some_and(|q| q.split('&').any(|p| p == "snapshots=1"))
}

/// Appends `data: <json>` for a snapshot.
pub fn write_snapshot(out: &mut BytesMut, mut snapshot: serde_json::Value) {
    snapshot["type"] = serde_json::json!("snapshot");
    sse::write_event(out, &serde_json::to_vec(&snapshot).unwrap_or_default());
}

/// Appends `data: <json>` for one event.
pub fn write_stamped(out: &mut BytesMut, ev: &Stamped) {
    let json = serde_json::to_vec(&ev.event.to_json(ev.ts_ms)).unwrap_or_default();
    sse::write_event(out, &json);
}

/// Appends the lag notice for `dropped` lost events.
pub fn write_lagged(out: &mut BytesMut, dropped: u64) {
    sse::write_event(out, format!("{{\"type\":\"lagged\",\"dropped\":{dropped}}}").as_bytes());
}

/// Tracks the subscription's drop counter between writes.
#[derive(Debug, Default)]
pub struct LagTracker {
    reported: u64,
}

impl LagTracker {
    /// Events lost since the last call that reported some (None when none).
    pub fn take(&mut self, dropped_total: u64) -> Option<u64> {
        let new = dropped_total.checked_sub(self.reported).filter(|&n| n > 0)?;
        self.reported = dropped_total;
        Some(new)
    }
}

/// Serves the stream until it ends (with snapshots when `snapshots`); the
/// connection is never kept.
pub async fn stream(worker: &Rc<Ctx>, conn: &mut Conn, snapshots: bool) -> bool {
    let sub = worker.shared.events.subscribe(CAPACITY);
    // Chunked, or raw for an HTTP/1.0 client (it closes either way).
    let framing = conn.stream_framing;
    http::write_response_head(
        &mut conn.out,
        200,
        &[("content-type", "text/event-stream"), ("cache-control", "no-cache"), ("x-accel-buffering", "no")],
        framing.framing(),
        false,
    );
    if conn.head_only {
        let _ = conn.flush().await;
        return false;
    }
    framing.write(&mut conn.out, CONNECTED);
    if conn.flush().await.is_err() {
        return false;
    }
    let mut lag = LagTracker::default();
    let mut sse = BytesMut::with_capacity(4096);
    let mut snapshot_at = snapshots.then(Instant::now);
    loop {
        let wake = {
            let Conn { rd, buf, .. } = &mut *conn;
            // Nothing after this request is served (the connection closes
            // with the stream), so stray bytes must not disable the watch.
            buf.clear();
            let wake = std::pin::pin!(next_wake(&sub.rx, &worker.stop, snapshot_at));
            with_disconnect_watch::<STREAM_WATCH, _, _>(rd, buf, wake).await
        };
        let Some(wake) = wake else { return false }; // the client left
        if let Some(n) = lag.take(sub.dropped.load(Ordering::Relaxed)) {
            write_lagged(&mut sse, n);
        }
        match wake {
            Wake::Event(first) => {
                write_stamped(&mut sse, &first);
                // Batch what is already queued (bounded, so a busy bus can't starve the write).
                for _ in 1..CAPACITY {
                    let Some(ev) = sub.rx.try_recv() else { break };
                    write_stamped(&mut sse, &ev);
                }
                if let Some(at) = snapshot_at.as_mut() {
                    *at = (*at).min(Instant::now() + SNAPSHOT_AFTER_EVENTS);
                }
            }
            Wake::Snapshot => {
                write_snapshot(&mut sse, super::snapshot::current(worker).await);
                snapshot_at = Some(Instant::now() + SNAPSHOT_EVERY);
            }
            Wake::Idle => {
                if sse.is_empty() {
                    sse.extend_from_slice(KEEP_ALIVE_COMMENT);
                }
            }
            Wake::Closed => {
                framing.write(&mut conn.out, &sse);
                framing.write_last(&mut conn.out);
                let _ = conn.flush().await;
                return false;
            }
        }
        framing.write(&mut conn.out, &sse);
        sse.clear();
        if conn.flush().await.is_err() {
            return false;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::events::EdgeEvent;
    use serde_json::json;

    #[test]
    fn events_are_single_data_lines_of_json() {
        let mut out = BytesMut::new();
        let ev = Stamped { ts_ms: 42, event: EdgeEvent::NodeReady { node: "n\n1".into(), generation: 3 } };
        write_stamped(&mut out, &ev);
        write_lagged(&mut out, 7);
        let text = std::str::from_utf8(&out).unwrap();
        let frames: Vec<&str> = text.split_terminator("\n\n").collect();
        assert_eq!(frames.len(), 2);
        let first: serde_json::Value = serde_json::from_str(frames[0].strip_prefix("data: ").unwrap()).unwrap();
        assert_eq!(first, json!({"type": "node_ready", "ts_ms": 42, "node": "n\n1", "generation": 3}));
        assert_eq!(frames[1], r#"data: {"type":"lagged","dropped":7}"#);
    }

    #[test]
    fn lag_is_reported_once_per_increase() {
        let mut lag = LagTracker::default();
        assert_eq!(lag.take(0), None);
        assert_eq!(lag.take(3), Some(3));
        assert_eq!(lag.take(3), None);
        assert_eq!(lag.take(10), Some(7));
        assert_eq!(lag.take(10), None);
    }

    #[test]
    fn snapshots_are_asked_for_by_one_parameter_and_sent_as_one_event() {
        assert!(wants_snapshots(Some("snapshots=1")));
        assert!(wants_snapshots(Some("a=b&snapshots=1")));
        assert!(!wants_snapshots(Some("snapshots=0")));
        assert!(!wants_snapshots(Some("xsnapshots=1")));
        assert!(!wants_snapshots(None));
        let mut out = BytesMut::new();
        write_snapshot(&mut out, json!({"nodes": [{"id": "n\n1"}], "models": [], "ts_ms": 5}));
        let text = std::str::from_utf8(&out).unwrap();
        let frame = text.strip_suffix("\n\n").unwrap().strip_prefix("data: ").unwrap();
        assert!(!frame.contains('\n'), "one data line: {text:?}");
        let v: serde_json::Value = serde_json::from_str(frame).unwrap();
        assert_eq!((&v["type"], &v["nodes"][0]["id"], &v["ts_ms"]), (&json!("snapshot"), &json!("n\n1"), &json!(5)));
    }
}
