//! One attempt's response to the socket, one JSON text frame per event:
//! the tunnel's server-sent events as the provider sent them, or a
//! normalized run rendered by [`ResponsesEncoder`]. Each wait for the
//! stream's next item hears the client too ([`Inbox::during`]): a ping is
//! answered between two events, a close ends the relay (and, dropped by
//! the caller, the stream: cancelled on the node).

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use iop_core::{exec::ExecEvent, exec::RunFailure, net::WriteHalf, sse::SseParser, tunnel::TunnelItem, ws};
use monoio::io::AsyncWriteRentExt;
use serde_json::Value;

use super::{
    inbox::{End, Inbox},
    refused::{Refused, Stop},
};
use crate::{
    dispatch::{RunStream, TunnelStream},
    server::Conn,
    surface::{
        encode::EventEncoder, failures::ended_without_result, openai::responses::stream::ResponsesEncoder, replay,
    },
};

/// Events that end a response.
const TERMINAL: [&str; 3] = ["response.completed", "response.incomplete", "response.failed"];

/// How a relay ended, when not with an `error` event or the socket's end.
pub enum Relayed {
    /// The response went out to its end.
    Done,
    /// The attempt failed retryably before its first frame: a second
    /// attempt elsewhere may answer instead.
    Failed(RunFailure),
}

/// Server-sent events turned into text frames, one per event, with the
/// terminal event's response kept.
pub struct Frames {
    parser: SseParser,
    /// The terminal event's `response`, once it went out.
    pub terminal: Option<Value>,
    /// Whether a frame of this response was written (or began to be): from
    /// then on a failure is the response's own, never replayed.
    sent: bool,
}

impl Frames {
    pub fn new(max_event: usize) -> Self {
        Self { parser: SseParser::new(max_event), terminal: None, sent: false }
    }

    /// Frames the events `bytes` complete into `out`.
    fn push(&mut self, bytes: &[u8], out: &mut BytesMut) -> Result<(), Refused> {
        self.parser.push(bytes);
        while let Some(ev) =
            self.parser.next_event().map_err(|e| Refused::new(502, "upstream_protocol", e.to_string()))?
        {
            ws::write::text(out, ev.data.as_bytes());
            let named = ev.event.as_deref().is_some_and(|e| TERMINAL.contains(&e));
            let maybe = ev.event.is_none() && TERMINAL.iter().any(|t| ev.data.contains(t));
            if named || maybe {
                if let Ok(mut v) = serde_json::from_str::<Value>(&ev.data) {
                    if v["type"].as_str().is_some_and(|t| TERMINAL.contains(&t)) {
                        self.terminal = Some(v["response"].take());
                    }
                }
            }
        }
        Ok(())
    }

    /// Writes the frames `conn.out` holds within `timeout`.
    async fn send(&mut self, conn: &mut Conn, timeout: Duration) -> Result<(), Stop> {
        if conn.out.is_empty() {
            return Ok(());
        }
        self.sent = true;
        if !write(&mut conn.wr, &mut conn.out, timeout).await {
            return Err(End::Gone.into());
        }
        conn.exchange.wrote();
        Ok(())
    }
}

/// Writes `out` within `timeout`; false when the client stopped reading.
/// (Not boxed as [`Conn::flush`] is: one write per event.)
async fn write(wr: &mut WriteHalf, out: &mut BytesMut, timeout: Duration) -> bool {
    let taken = std::mem::take(out);
    match iop_core::rt::time::timeout(timeout, wr.write_all(taken)).await {
        Ok((Ok(_), mut buf)) => {
            buf.clear();
            *out = buf;
            true
        }
        _ => false,
    }
}

/// A failure before the response's first frame: handed back for a second
/// attempt when this attempt may have one and the replay rules allow it
/// ([`replay::eligible`]); else the `error` event.
fn before_first_frame(f: RunFailure, replayable: bool) -> Result<Relayed, Stop> {
    if replayable && replay::eligible(&f, true) {
        Ok(Relayed::Failed(f))
    } else {
        Err(Refused::of_failure(&f).into())
    }
}

/// Relays a tunnel's Responses stream as frames.
pub async fn tunnel(
    conn: &mut Conn,
    inbox: &mut Inbox,
    stream: &mut TunnelStream,
    frames: &mut Frames,
    timeout: Duration,
    replayable: bool,
) -> Result<Relayed, Stop> {
    stream.credit_on_write();
    let mut status = 200;
    let mut error_body = Vec::new();
    while let Some(item) = inbox.during(conn, stream.next(), timeout).await? {
        let parts: Vec<Bytes> = match item {
            TunnelItem::Start { status: s, .. } => {
                status = s;
                conn.exchange.status(s);
                continue;
            }
            TunnelItem::Whole(w) => {
                status = w.status;
                conn.exchange.status(w.status);
                w.body
            }
            TunnelItem::Body(b) => vec![b],
            TunnelItem::Parts(p) => p,
            TunnelItem::End { .. } => break,
            TunnelItem::Error(f) if !frames.sent => return before_first_frame(f, replayable),
            TunnelItem::Error(f) => return Err(Refused::of_failure(&f).into()),
        };
        for p in parts {
            if status == 200 {
                frames.push(&p, &mut conn.out)?;
            } else if error_body.len() < 64 * 1024 {
                error_body.extend_from_slice(&p);
            }
        }
        frames.send(conn, timeout).await?;
        stream.written();
    }
    if status != 200 {
        // The provider's own message, in the socket's error event.
        let v: Value = serde_json::from_slice(&error_body).unwrap_or_default();
        let msg = v["error"]["message"].as_str().unwrap_or("the provider refused the request").to_owned();
        return Err(Refused::new(status, "upstream_status", msg).into());
    }
    Ok(Relayed::Done)
}

/// Relays a normalized run rendered by `enc` as frames.
pub async fn run(
    conn: &mut Conn,
    inbox: &mut Inbox,
    run: &mut RunStream,
    mut enc: ResponsesEncoder,
    frames: &mut Frames,
    timeout: Duration,
    replayable: bool,
) -> Result<Relayed, Stop> {
    run.credit_on_write();
    let mut sse = BytesMut::new();
    let mut started = false;
    while let Some(ev) = inbox.during(conn, run.next(), timeout).await? {
        let ev = match ev {
            // Before anything went out: an error event (or a second
            // attempt), not a failed response.
            ExecEvent::Error(f) if !started => return before_first_frame(f, replayable),
            ev => ev,
        };
        if !started {
            started = true;
            conn.exchange.status(200);
        }
        let mut terminal = enc.event(&mut sse, ev);
        while !terminal {
            let Some(ev) = run.try_next() else { break };
            terminal = enc.event(&mut sse, ev);
        }
        frames.push(&sse, &mut conn.out)?;
        sse.clear();
        frames.send(conn, timeout).await?;
        run.written();
        if terminal {
            return Ok(Relayed::Done);
        }
    }
    Err(Refused::of_failure(&ended_without_result()).into())
}
