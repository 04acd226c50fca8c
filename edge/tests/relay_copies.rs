//! Copies and allocations per relayed chunk on the edge's tunnel path, from
//! the bytes read off the node link to the client's vectored write: frames
//! decoded from the read buffer, routed through the session's stream table
//! and the stream's channel, framed as HTTP chunks and handed to `writev`.
//!
//! Copies are checked by address: every body segment handed to the kernel
//! must be the very bytes of the read buffer. Allocations are counted by
//! this test binary's allocator, per thread (the relay runs on one).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::print_stdout)]

use std::{
    alloc::{GlobalAlloc, Layout, System},
    cell::Cell,
    time::Duration,
};

use bytes::{Bytes, BytesMut};
use iop_core::{
    rt::gather::{iovec_spans, Gather},
    tunnel::TunnelItem,
    wire::{self, pb, pb::envelope::Body},
};
use iop_edge::{
    stream::{channel, cost_of, TunnelReceiver},
    surface::relay::{relay_body, BodyEnd, Frame, Source, WriteClock},
    transport::RunTable,
};
use monoio::{
    buf::{IoBuf, IoVecBuf},
    io::AsyncWriteRent,
    BufResult,
};

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

/// Counts allocations (and reallocations) of the current thread.
struct Counting;

// SAFETY: forwards to the system allocator unchanged; the counter is a
// const-initialised thread-local without destructor, so touching it never
// allocates.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        System.alloc(layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

const ID: &str = "tun-7f3a9c2e";
const MAX: usize = wire::DEFAULT_MAX_FRAME_BYTES;

/// A client socket that takes everything and records where each written
/// segment was.
#[derive(Default)]
struct Recorder {
    spans: Vec<(usize, usize)>,
    writes: u64,
    bytes: usize,
}

impl AsyncWriteRent for Recorder {
    async fn write<T: IoBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        let n = buf.bytes_init();
        self.spans.push((buf.read_ptr() as usize, n));
        self.writes += 1;
        self.bytes += n;
        (Ok(n), buf)
    }

    async fn writev<T: IoVecBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        let spans = iovec_spans(&buf);
        let n = spans.iter().map(|s| s.1).sum();
        self.spans.extend(spans);
        self.writes += 1;
        self.bytes += n;
        (Ok(n), buf)
    }

    async fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }

    async fn shutdown(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The edge's side of one node link carrying one tunnel: frames are
/// decoded from `read` on demand, as the session would, and routed; the
/// node sends while what it has out (queued, or handed out and not yet
/// written) is below the stream's window, as a node keeps to its credit.
struct Link {
    read: BytesMut,
    runs: RunTable,
    rx: TunnelReceiver,
    /// Cost handed out since the last write.
    handed: usize,
}

impl Link {
    fn pump(&mut self) {
        // A session routes a batch of frames per wakeup.
        for _ in 0..16 {
            if self.rx.queued_bytes() + self.handed >= iop_core::flow::WINDOW_BYTES as usize {
                return;
            }
            match wire::decode(&mut self.read, MAX).unwrap() {
                Some(pb::Envelope { body: Some(Body::ProviderTunnelFrame(f)), .. }) => {
                    let (_, routed) = self.runs.route_tunnel_frame(f);
                    assert_eq!(routed, iop_edge::transport::Routed::Done);
                }
                Some(other) => panic!("unexpected frame {other:?}"),
                None => return,
            }
        }
    }
}

impl Source for Link {
    async fn next(&mut self) -> Option<TunnelItem> {
        self.try_next()
    }

    fn try_next(&mut self) -> Option<TunnelItem> {
        if self.rx.pending() == 0 {
            self.pump();
        }
        let item = self.rx.try_recv()?;
        self.handed += cost_of(&item);
        Some(item)
    }

    fn id(&self) -> &str {
        ID
    }

    fn written(&mut self) {
        // As the tunnel's stream does before its credit goes back.
        self.rx.settle();
        self.handed = 0;
    }
}

/// An SSE chat chunk of about `size` bytes, as a provider streams it.
fn sse_event(i: usize, size: usize) -> Bytes {
    let head = format!(
        r#"data: {{"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{{"index":0,"delta":{{"content":"tok{i} "#
    );
    let pad = size.saturating_sub(head.len() + 8);
    Bytes::from(format!("{head}{}\"}}}}]}}\n\n", "x".repeat(pad)))
}

/// The node's side: the frames of `events` as the node writes them,
/// `per_frame` events to a frame (what one upstream read brought).
fn node_wire(events: &[Bytes], per_frame: usize) -> BytesMut {
    let mut wire = BytesMut::new();
    let frame = |seq: u64, kind| pb::Envelope {
        correlation_id: 0,
        body: Some(Body::ProviderTunnelFrame(pb::ProviderTunnelFrame {
            tunnel_id: ID.into(),
            seq,
            kind: Some(kind),
            usage: None,
        })),
    };
    let start = pb::TunnelResponseStart { status: 200, headers: vec![] };
    wire::encode(&frame(0, pb::provider_tunnel_frame::Kind::Status(start)), &mut wire, MAX).unwrap();
    let mut body = Gather::new();
    let mut seq = 0;
    for group in events.chunks(per_frame) {
        seq += 1;
        wire::encode_tunnel_body(ID, seq, group, &mut body, MAX).unwrap();
    }
    wire.extend_from_slice(&body.to_vec());
    let end = frame(seq + 1, pb::provider_tunnel_frame::Kind::End(pb::TunnelEnd {}));
    wire::encode(&end, &mut wire, MAX).unwrap();
    wire
}

struct Measured {
    chunks: usize,
    allocations: u64,
    copied_segments: usize,
    writes: u64,
}

/// Relays `n` events of `size` bytes, `per_frame` to a frame; returns what
/// it cost.
fn relay(n: usize, size: usize, per_frame: usize) -> Measured {
    let events: Vec<Bytes> = (0..n).map(|i| sse_event(i, size)).collect();
    let wire = node_wire(&events, per_frame);
    iop_core::rt::block_on_current(async move {
        let (tx, rx) = channel::<TunnelItem>();
        let mut runs = RunTable::default();
        runs.insert_tunnel(ID.into(), tx, None);
        // The read buffer: the link's one copy (socket → memory) is here.
        let read_range = wire.as_ptr() as usize..wire.as_ptr() as usize + wire.len();
        let mut link = Link { read: wire, runs, rx, handed: 0 };
        let Some(TunnelItem::Start { status: 200, .. }) = link.next().await else { panic!("no start") };
        let mut client = Recorder::default();
        let mut out = Gather::new();
        out.put_slice(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n");
        let mut first = None;
        let mut clock = WriteClock::new(&mut first, Some(iop_edge::metrics::Path::Tunnel));
        let before = allocations();
        let end = relay_body(
            &mut client,
            &mut out,
            &mut link,
            &mut Frame::Streamed(iop_core::http::StreamFraming::Chunked),
            Some(iop_edge::surface::dialect::Dialect::OpenAi),
            Duration::from_secs(5),
            &mut clock,
        )
        .await
        .unwrap();
        let allocations = allocations() - before;
        assert_eq!(end, BodyEnd::Complete);
        // Each event must be among the written segments, from the read buffer.
        let from_read: Vec<&(usize, usize)> = client.spans.iter().filter(|(p, _)| read_range.contains(p)).collect();
        assert_eq!(from_read.len(), n, "every event is written from the read buffer");
        assert!(from_read.iter().zip(&events).all(|((_, len), e)| *len == e.len()));
        let copied_segments = client.spans.iter().filter(|(_, len)| *len >= size / 2).count() - from_read.len();
        // One HTTP chunk per frame.
        let framing: usize = events
            .chunks(per_frame)
            .map(|g| format!("{:x}\r\n\r\n", g.iter().map(Bytes::len).sum::<usize>()).len())
            .sum();
        assert_eq!(client.bytes, 47 + framing + events.iter().map(Bytes::len).sum::<usize>() + 5);
        Measured { chunks: n, allocations, copied_segments, writes: client.writes }
    })
    .unwrap()
}

#[test]
fn relayed_chunks_are_never_copied_and_do_not_allocate() {
    for (n, size, per_frame) in [(20_000, 200, 1), (20_000, 200, 8), (4_000, 4_000, 1), (200, 60_000, 1)] {
        let m = relay(n, size, per_frame);
        let per_chunk = m.allocations as f64 / m.chunks as f64;
        println!(
            "{n} chunks of {size} B, {per_frame} per frame: {} allocations ({per_chunk:.3} per chunk), {} copied body segments, {} writes",
            m.allocations, m.copied_segments, m.writes
        );
        assert_eq!(m.copied_segments, 0);
        // Nothing per chunk (the tunnel id is a slice of the frame too); the
        // channel allocates a block per 31 items, a write its timer, and a
        // frame of several parts its list of them (prost grows it: 2).
        let frames = m.chunks.div_ceil(per_frame) as u64;
        let bound = m.chunks as u64 / 16 + 2 * m.writes + 8 + if per_frame > 1 { 2 * frames } else { 0 };
        assert!(m.allocations <= bound, "{} allocations for {n} chunks in {} writes", m.allocations, m.writes);
    }
}
