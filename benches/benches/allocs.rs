//! Allocations and copies per request and per relayed event, counted by this
//! binary's allocator (a `#[global_allocator]` that counts every allocation
//! and reallocation of the current thread, and the bytes each asked for, and
//! forwards to jemalloc, the allocator the edge and node install).
//!
//! Every counted step calls the project's own code; what the harness does
//! around it (filling read buffers as the kernel would, draining write
//! queues, building inputs, checking addresses) is not counted. Copies are
//! found by address: a payload that lies in the memory of the step's input
//! was not copied, one that lies elsewhere was.
//!
//! - **Request** (client → edge → node, tunnel path): `http::parse_request_head`,
//!   the body through `http::BodyDecoder`, `request::Top::parse` and
//!   `Top::rewrite` (the `model` edit), the `ProviderTunnelRequest` built as
//!   `dispatch::submit_tunnel` and `tunnel::forwarded_headers` build it (edge
//!   glue, mirrored here: it is private) and queued with `wire::encode` into
//!   a `Gather` (what `FrameWriter::send` does), then the node's `wire::decode`.
//! - **Tunnel event** (provider → node → edge → client): the upstream body
//!   de-chunked by `BodyDecoder`, what one upstream read brought queued as one
//!   frame by `wire::encode_tunnel_body` (`FrameWriter::send_tunnel_body`),
//!   the edge's `wire::decode` and `TunnelItem::from_wire`, the client's HTTP
//!   chunk by `http::gather_chunk_parts` (what `relay_body` does). The node's
//!   `Vec` of parts per multi-part item is built as `openai_tunnel`'s
//!   `send_parts` builds it (node-private, mirrored). The edge's stream table
//!   and channel are not in it; `edge/tests/relay_copies.rs` counts those.
//! - **Normalized event**: de-chunk, `sse::SseParser`, then — after the
//!   adapter's JSON mapping, which is node-private and *not* counted (the
//!   harness supplies the `ExecEvent` it would produce) — `ExecEvent::into_wire`
//!   and `wire::encode`, the edge's `wire::decode` and `ExecEvent::from_wire`,
//!   the edge's `ChunkEncoder::delta` and `http::write_chunk` (one HTTP chunk
//!   per upstream read, as `stream_body` batches what is queued).
//! - **Dialect encoder** (edge): each dialect's encoder rendering the
//!   middle events of a streamed answer (text pieces, then one tool call's
//!   argument pieces) into an output buffer made large enough up front:
//!   chat and Messages allocate nothing per event, Responses only as the
//!   output it keeps for `response.completed` grows.
//!
//! Read buffers are 64 KiB blocks filled read after read until they are
//! full, as `FrameReader` does (the blocks themselves are not counted; the
//! promotion of a block to shared memory on its first zero-copy split is).
//! Write queues are drained every 64 KiB, as a writer task would.
//!
//! `cargo bench` runs it in full; `cargo test` runs a short pass.

// Setup failures should abort the bench loudly; the tables are its output.
#![allow(clippy::expect_used, clippy::panic, clippy::print_stdout)]

use std::{
    alloc::{GlobalAlloc, Layout},
    cell::Cell,
    ops::Range,
};

use bytes::{Bytes, BytesMut};
use iop_core::{
    exec::{Delta, ExecEvent, Part},
    http::{self, BodyDecoder, BodyKind, Limits},
    request::Top,
    rt::gather::{iovec_spans, Gather},
    sse::{write_event, SseParser},
    tunnel::{self, TunnelItem},
    wire::{self, pb, pb::envelope::Body},
};
use iop_edge::surface::{
    anthropic::stream::MessagesEncoder,
    encode::EventEncoder,
    openai::{
        chunk::ChunkEncoder,
        responses::{stream::ResponsesEncoder, ResponseMeta},
    },
};
use monoio::{
    buf::{IoBuf, IoVecBuf},
    io::AsyncWriteRent,
    BufResult,
};
use tikv_jemallocator::Jemalloc;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
    static BYTES: Cell<u64> = const { Cell::new(0) };
}

fn note(bytes: usize) {
    let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
    let _ = BYTES.try_with(|c| c.set(c.get() + bytes as u64));
}

/// Counts allocations (and reallocations) of the current thread and the
/// bytes they asked for; jemalloc does the work.
struct Counting;

// SAFETY: forwards every call to jemalloc unchanged; the counters are
// const-initialised thread-locals without destructors, so touching them
// never allocates or re-enters the allocator.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        Jemalloc.alloc(layout)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        Jemalloc.alloc_zeroed(layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        Jemalloc.dealloc(ptr, layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        Jemalloc.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn counters() -> (u64, u64) {
    (ALLOCATIONS.with(Cell::get), BYTES.with(Cell::get))
}

const MAX: usize = wire::DEFAULT_MAX_FRAME_BYTES;
/// Read buffer block (`FrameReader`'s `READ_CHUNK`).
const BLOCK: usize = 64 * 1024;
/// Write queues are drained once they hold this much.
const DRAIN: usize = 64 * 1024;

const TUNNEL_ID: &str = "tun-0123456789abcdef";
const RUN_ID: &str = "run-0123456789abcdef";
const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

// --- counting ---------------------------------------------------------------

/// What one step cost over a run.
struct Step {
    name: &'static str,
    allocations: u64,
    bytes: u64,
    /// Payloads the step put in new memory (at most one per payload and
    /// step; a step may copy more than once inside, e.g. `SseParser`
    /// buffers its input, then joins the data lines).
    copies: u64,
}

impl Step {
    fn new(name: &'static str) -> Self {
        Self { name, allocations: 0, bytes: 0, copies: 0 }
    }

    /// Runs `f`, counting what it allocates.
    fn count<R>(&mut self, f: impl FnOnce() -> R) -> R {
        let (a, b) = counters();
        let r = f();
        let (a2, b2) = counters();
        self.allocations += a2 - a;
        self.bytes += b2 - b;
        r
    }

    /// Counts a copy unless `payload` lies in one of `sources`.
    fn copied_unless_in(&mut self, payload: &[u8], sources: &Memory) {
        if !payload.is_empty() && !sources.holds(payload) {
            self.copies += 1;
        }
    }
}

/// Prints `steps` as a Markdown table, per `unit` (`per` of them in all).
fn table(title: &str, unit: &str, per: u64, steps: &[Step]) {
    println!("\n{title}\n");
    println!("| step | allocations / {unit} | bytes / {unit} | copies / {unit} |");
    println!("|---|---:|---:|---:|");
    let f = |n: u64| n as f64 / per as f64;
    for s in steps {
        println!("| {} | {:.3} | {:.1} | {:.2} |", s.name, f(s.allocations), f(s.bytes), f(s.copies));
    }
    let (a, b, c) = steps.iter().fold((0, 0, 0), |t, s| (t.0 + s.allocations, t.1 + s.bytes, t.2 + s.copies));
    println!("| **total** | **{:.3}** | **{:.1}** | **{:.2}** |", f(a), f(b), f(c));
}

// --- memory ranges ------------------------------------------------------------

fn range_of(b: &[u8]) -> Range<usize> {
    let p = b.as_ptr() as usize;
    p..p + b.len()
}

/// Address ranges of buffers kept alive for the whole run (so none is
/// reused for a copy and mistaken for its source).
#[derive(Default)]
struct Memory {
    ranges: Vec<Range<usize>>,
}

impl Memory {
    fn holds(&self, payload: &[u8]) -> bool {
        let r = range_of(payload);
        self.ranges.iter().any(|m| m.start <= r.start && r.end <= m.end)
    }
}

/// A socket's read side: bytes arrive read by read into 64 KiB blocks,
/// appended after what the consumer has not taken yet. Appending is the
/// kernel's copy, not counted; blocks stay alive until the end.
struct ReadSide {
    buf: BytesMut,
    memory: Memory,
    kept: Vec<BytesMut>,
}

impl ReadSide {
    fn new() -> Self {
        Self { buf: BytesMut::new(), memory: Memory::default(), kept: Vec::new() }
    }

    /// Appends one read; takes a new block when the spare room is short
    /// (moving what is left unconsumed, as `reserve` would).
    fn read(&mut self, bytes: &[u8]) {
        if self.buf.capacity() - self.buf.len() < bytes.len() {
            let mut block = BytesMut::with_capacity(BLOCK.max(self.buf.len() + bytes.len()));
            let start = block.as_ptr() as usize;
            self.memory.ranges.push(start..start + block.capacity());
            block.extend_from_slice(&self.buf);
            self.kept.push(std::mem::replace(&mut self.buf, block));
        }
        let cap = self.buf.capacity();
        self.buf.extend_from_slice(bytes);
        assert_eq!(self.buf.capacity(), cap, "a read never grows the block");
    }
}

/// A socket's write side: records where every written segment was, and the
/// bytes that crossed.
#[derive(Default)]
struct Recorder {
    spans: Vec<Range<usize>>,
}

impl AsyncWriteRent for Recorder {
    async fn write<T: IoBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        let n = buf.bytes_init();
        self.spans.push(buf.read_ptr() as usize..buf.read_ptr() as usize + n);
        (Ok(n), buf)
    }

    async fn writev<T: IoVecBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        let spans = iovec_spans(&buf);
        let n = spans.iter().map(|s| s.1).sum();
        self.spans.extend(spans.into_iter().map(|(p, len)| p..p + len));
        (Ok(n), buf)
    }

    async fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }

    async fn shutdown(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Recorder {
    /// Whether `payload` went to the socket from its own memory.
    fn wrote_from(&self, payload: &Range<usize>) -> bool {
        self.spans.iter().any(|s| s.start <= payload.start && payload.end <= s.end)
    }
}

/// Writes `queue` to `rec` (not counted); returns the bytes (what the peer reads).
async fn drain(queue: &mut Gather, rec: &mut Recorder) -> Vec<u8> {
    let bytes = queue.to_vec();
    queue.write_to(rec).await.expect("recorder takes everything");
    bytes
}

// --- inputs -------------------------------------------------------------------

/// A chat-completions request as the OpenAI Python SDK sends it, with a
/// body of about `body_len` bytes.
fn chat_request(body_len: usize) -> Vec<u8> {
    let head = "{\"model\":\"llama\",\"messages\":[{\"role\":\"user\",\"content\":\"";
    let tail = "\"}],\"stream\":true,\"max_tokens\":256,\"temperature\":0.7}";
    let pad = body_len.saturating_sub(head.len() + tail.len()).max(8);
    let body = format!("{head}{}{tail}", "lorem ipsum ".repeat(pad / 12 + 1)[..pad].to_owned());
    let mut req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: gateway.internal:8080\r\nAccept-Encoding: gzip, deflate\r\n\
         Connection: keep-alive\r\nAccept: application/json\r\nContent-Type: application/json\r\n\
         User-Agent: OpenAI/Python 1.54.0\r\nAuthorization: Bearer sk-0123456789abcdef0123456789abcdef\r\n\
         Content-Length: {}\r\n",
        body.len()
    );
    for h in ["lang: python", "package-version: 1.54.0", "os: Linux", "arch: x64", "runtime: CPython"] {
        req.push_str(&format!("x-stainless-{h}\r\n"));
    }
    req.push_str("x-stainless-runtime-version: 3.12.7\r\nx-stainless-async: false\r\n\r\n");
    req.push_str(&body);
    req.into_bytes()
}

/// Token `i` of a stream.
fn token(i: usize) -> String {
    format!("tok{i} ")
}

/// The SSE event of token `i`, as vLLM streams a `chat.completion.chunk`.
fn sse_event(i: usize) -> Vec<u8> {
    let chunk = format!(
        "{{\"id\":\"chatcmpl-7f3a9c\",\"object\":\"chat.completion.chunk\",\"created\":1731000000,\
         \"model\":\"{MODEL}\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{}\"}},\
         \"logprobs\":null,\"finish_reason\":null}}]}}",
        token(i)
    );
    let mut out = BytesMut::new();
    write_event(&mut out, chunk.as_bytes());
    out.to_vec()
}

/// The upstream body of `events` SSE events, each in an HTTP chunk of its
/// own, `per_read` chunks to an upstream read.
fn upstream_reads(events: usize, per_read: usize) -> Vec<Vec<u8>> {
    let chunks: Vec<Vec<u8>> = (0..events)
        .map(|i| {
            let mut c = BytesMut::new();
            http::write_chunk(&mut c, &sse_event(i));
            c.to_vec()
        })
        .collect();
    chunks.chunks(per_read).map(|g| g.concat()).collect()
}

// --- request --------------------------------------------------------------------

fn requests(n: usize, body_len: usize) {
    let request = chat_request(body_len);
    let limits = Limits::default();
    let mut client = ReadSide::new();
    let mut link_out = Gather::new();
    let mut link_rec = Recorder::default();
    let mut node_in = ReadSide::new();
    let mut steps = [
        Step::new("edge: `parse_request_head`"),
        Step::new("edge: body (`BodyDecoder`)"),
        Step::new("edge: `Top::parse`"),
        Step::new("edge: `Top::rewrite` (`model`, `include_usage`)"),
        Step::new("edge: `ProviderTunnelRequest` + `wire::encode`"),
        Step::new("node: `wire::decode`"),
    ];
    let mut node_bodies = Vec::new();
    let (mut body_bytes, mut frame_bytes) = (0, 0);
    // Bodies after the rewrite, alive until their frames are written.
    let mut rewritten: Vec<Bytes> = Vec::new();
    iop_core::rt::block_on_current(async {
        for i in 0..n {
            client.read(&request);
            let [head_s, body_s, top_s, rewrite_s, encode_s, decode_s] = &mut steps;
            let head =
                head_s.count(|| http::parse_request_head(&mut client.buf, &limits).expect("valid").expect("complete"));
            let BodyKind::Length(len) = head.body else { panic!("a sized body") };
            let body = body_s.count(|| {
                let mut dec = BodyDecoder::new(head.body, limits.max_body_bytes);
                dec.decode(&mut client.buf).expect("valid").expect("the whole body was read")
            });
            assert_eq!(body.len() as u64, len);
            body_s.copied_unless_in(&body, &client.memory);
            body_bytes += body.len();
            let top = top_s.count(|| Top::parse(&body).expect("chat body"));
            let (new_body, hide) = rewrite_s.count(|| top.rewrite(&body, MODEL));
            drop((body, top));
            rewrite_s.copied_unless_in(&new_body, &client.memory);
            rewritten.push(new_body.clone());
            encode_s.count(|| {
                // As `tunnel::run`, `dispatch::submit_tunnel` and
                // `forwarded_headers` build it.
                let mut headers: Vec<pb::Header> = head
                    .headers
                    .iter()
                    .filter(|(n, _)| tunnel::forwards_request_header(n.as_bytes()))
                    .map(|(n, v)| pb::Header { name: n.clone().into_bytes(), value: v.clone() })
                    .collect();
                let id = format!("{TUNNEL_ID}-{i}");
                headers.push(pb::Header { name: "x-request-id".into(), value: Bytes::copy_from_slice(id.as_bytes()) });
                let req = pb::ProviderTunnelRequest {
                    tunnel_id: id,
                    adapter: "vllm-a".to_owned(),
                    target: MODEL.to_owned(),
                    method: "POST".into(),
                    path: "/chat/completions".into(),
                    headers,
                    body: new_body,
                    deadline_ms: 1_731_000_600_000,
                    window_bytes: 1 << 20,
                    hide_usage_chunk: hide,
                    response_stall_timeout_ms: 300_000,
                    ..Default::default()
                };
                let env = pb::Envelope { correlation_id: 0, body: Some(Body::ProviderTunnelRequest(req)) };
                link_out.put_with(|b| wire::encode(&env, b, MAX)).expect("fits");
            });
            drop(head);
            // The link writer drains what is queued; the node reads it.
            let wire_bytes = drain(&mut link_out, &mut link_rec).await;
            frame_bytes += wire_bytes.len();
            node_in.read(&wire_bytes);
            let env = decode_s.count(|| wire::decode(&mut node_in.buf, MAX).expect("valid").expect("complete"));
            let Some(Body::ProviderTunnelRequest(req)) = env.body else { panic!("a tunnel request") };
            decode_s.copied_unless_in(&req.body, &node_in.memory);
            node_bodies.push(req.body);
        }
        // Was each rewritten body written from its own memory, or copied into the frame?
        for b in &rewritten {
            if !link_rec.wrote_from(&range_of(b)) {
                steps[4].copies += 1;
            }
        }
    })
    .expect("monoio runtime");
    table(
        &format!(
            "Per request: {n} chat requests of {} B (head {} B, body {} B, tunnel request frame {} B)",
            request.len(),
            request.len() - body_bytes / n,
            body_bytes / n,
            frame_bytes / n
        ),
        "request",
        n as u64,
        &steps,
    );
}

// --- tunnel events ----------------------------------------------------------------

fn tunnel_events(n: usize, per_read: usize) {
    let reads = upstream_reads(n, per_read);
    let mut upstream = ReadSide::new();
    let mut dec = BodyDecoder::new(BodyKind::Chunked, usize::MAX);
    let mut pending: Vec<Bytes> = Vec::new();
    let mut link_out = Gather::new();
    let mut link_rec = Recorder::default();
    let mut edge_in = ReadSide::new();
    let mut client_out = Gather::new();
    let mut client_rec = Recorder::default();
    let mut steps = [
        Step::new("node: de-chunk (`BodyDecoder`) into the item's parts"),
        Step::new("node: frame (`wire::encode_tunnel_body`)"),
        Step::new("edge: `wire::decode` + `TunnelItem::from_wire`"),
        Step::new("edge: client chunk (`http::gather_chunk_parts`)"),
    ];
    // The node's parts, alive until the edge has decoded their frames.
    let mut sent_parts: Vec<Range<usize>> = Vec::new();
    let mut edge_parts: Vec<Range<usize>> = Vec::new();
    let mut event_bytes = 0;
    iop_core::rt::block_on_current(async {
        for (seq, read) in reads.iter().enumerate() {
            let [dechunk_s, frame_s, decode_s, chunk_s] = &mut steps;
            upstream.read(read);
            dechunk_s.count(|| {
                while let Some(piece) = dec.decode(&mut upstream.buf).expect("valid chunked body") {
                    pending.push(piece);
                }
            });
            for p in &pending {
                dechunk_s.copied_unless_in(p, &upstream.memory);
                sent_parts.push(range_of(p));
                event_bytes += p.len();
            }
            frame_s.count(|| {
                // `send_parts`: one piece is a `Body`, several are `Parts`
                // (the node's list moves into the item).
                let item = match pending.len() {
                    1 => TunnelItem::Body(pending.pop().expect("one")),
                    _ => TunnelItem::Parts(std::mem::take(&mut pending)),
                };
                // The emitter's `queue`, then `FrameWriter::send_tunnel_body`.
                match &item {
                    TunnelItem::Body(b) => {
                        wire::encode_tunnel_body(TUNNEL_ID, seq as u64 + 1, std::slice::from_ref(b), &mut link_out, MAX)
                    }
                    TunnelItem::Parts(parts) => {
                        wire::encode_tunnel_body(TUNNEL_ID, seq as u64 + 1, parts, &mut link_out, MAX)
                    }
                    _ => unreachable!("body items only"),
                }
                .expect("fits");
            });
            if link_out.len() >= DRAIN || seq + 1 == reads.len() {
                let wire_bytes = drain(&mut link_out, &mut link_rec).await;
                edge_in.read(&wire_bytes);
                loop {
                    let item = decode_s.count(|| {
                        let env = wire::decode(&mut edge_in.buf, MAX).expect("valid")?;
                        let Some(Body::ProviderTunnelFrame(f)) = env.body else { panic!("a tunnel frame") };
                        TunnelItem::from_wire(f)
                    });
                    let Some(item) = item else { break };
                    let parts = match &item {
                        TunnelItem::Body(b) => std::slice::from_ref(b),
                        TunnelItem::Parts(parts) => &parts[..],
                        _ => panic!("body items only"),
                    };
                    for p in parts {
                        decode_s.copied_unless_in(p, &edge_in.memory);
                        edge_parts.push(range_of(p));
                    }
                    chunk_s.count(|| http::gather_chunk_parts(&mut client_out, parts));
                    if client_out.len() >= DRAIN {
                        drain(&mut client_out, &mut client_rec).await;
                    }
                }
            }
        }
        drain(&mut client_out, &mut client_rec).await;
    })
    .expect("monoio runtime");
    assert_eq!(edge_parts.len(), n, "every event arrived");
    // The node wrote each part from the upstream read buffer, the edge each
    // part from the link's read buffer.
    steps[1].copies = sent_parts.iter().filter(|p| !link_rec.wrote_from(p)).count() as u64;
    steps[3].copies = edge_parts.iter().filter(|p| !client_rec.wrote_from(p)).count() as u64;
    table(
        &format!(
            "Per relayed event, tunnel path: {n} SSE events of {} B, {per_read} per upstream read (one frame, one client chunk each)",
            event_bytes / n
        ),
        "event",
        n as u64,
        &steps,
    );
    assert!(steps.iter().all(|s| s.copies == 0), "tunnel payloads are never copied");
}

// --- normalized events --------------------------------------------------------------

fn normalized_events(n: usize, per_read: usize) {
    let reads = upstream_reads(n, per_read);
    let mut upstream = ReadSide::new();
    let mut dec = BodyDecoder::new(BodyKind::Chunked, usize::MAX);
    let mut parser = SseParser::new(64 * 1024);
    // What the adapter's JSON mapping would produce (node-private: not counted).
    let mut adapted: Vec<Option<ExecEvent>> = (0..n).map(|i| Some(ExecEvent::content(token(i)))).collect();
    let mut link_out = Gather::new();
    let mut link_rec = Recorder::default();
    let mut edge_in = ReadSide::new();
    let enc = ChunkEncoder::new("chatcmpl-7f3a9c0123456789", MODEL, 1_731_000_000);
    let (mut sse, mut out) = (BytesMut::with_capacity(1024), BytesMut::new());
    let mut pieces: Vec<Bytes> = Vec::with_capacity(64);
    let mut steps = [
        Step::new("node: de-chunk (`BodyDecoder`)"),
        Step::new("node: `SseParser` push + `next_event`"),
        Step::new("node: `ExecEvent::into_wire_unnamed` + `wire::encode_run_event`"),
        Step::new("edge: `wire::decode` + `ExecEvent::from_wire`"),
        Step::new("edge: `ChunkEncoder::delta`"),
        Step::new("edge: `http::write_chunk`"),
    ];
    let (mut next, mut rendered, mut data_bytes, mut client_bytes) = (0usize, 0usize, 0, 0);
    let mut texts: Vec<Range<usize>> = Vec::new();
    iop_core::rt::block_on_current(async {
        for read in &reads {
            let [dechunk_s, parse_s, encode_s, decode_s, render_s, chunk_s] = &mut steps;
            upstream.read(read);
            dechunk_s.count(|| {
                while let Some(piece) = dec.decode(&mut upstream.buf).expect("valid chunked body") {
                    pieces.push(piece);
                }
            });
            // (The adapter pushes each piece as it comes; the list is the harness's.)
            for piece in pieces.drain(..) {
                dechunk_s.copied_unless_in(&piece, &upstream.memory);
                let from_piece = Memory { ranges: vec![range_of(&piece)] };
                parse_s.count(|| parser.push(&piece));
                while let Some(ev) = parse_s.count(|| parser.next_event().expect("valid stream")) {
                    parse_s.copied_unless_in(ev.data.as_bytes(), &from_piece);
                    data_bytes += ev.data.len();
                    let exec = adapted[next].take().expect("one event per SSE event");
                    if let ExecEvent::Delta(Delta { part: Part::Content(t), .. }) = &exec {
                        texts.push(range_of(t.as_bytes()));
                    }
                    encode_s.count(|| {
                        // The emitter's `queue`, then `FrameWriter::send_run_event`.
                        let ev = exec.into_wire_unnamed(next as u64 + 1);
                        link_out.put_with(|b| wire::encode_run_event(RUN_ID, &ev, b, MAX)).expect("fits");
                    });
                    next += 1;
                }
            }
            // The link writer drains what is queued; the edge reads it and
            // renders what arrived as one HTTP chunk.
            let wire_bytes = drain(&mut link_out, &mut link_rec).await;
            edge_in.read(&wire_bytes);
            let rendered_before = rendered;
            loop {
                let ev = decode_s.count(|| {
                    let env = wire::decode(&mut edge_in.buf, MAX).expect("valid")?;
                    let Some(Body::RunEvent(ev)) = env.body else { panic!("a run event") };
                    ExecEvent::from_wire(ev)
                });
                let Some(ExecEvent::Delta(d)) = ev else { break };
                let Part::Content(text) = &d.part else { panic!("content") };
                decode_s.copied_unless_in(text.as_bytes(), &edge_in.memory);
                let start = sse.len();
                render_s.count(|| enc.delta(&mut sse, &d));
                render_s.copied_unless_in(&sse[start..], &Memory { ranges: vec![range_of(text.as_bytes())] });
                rendered += 1;
            }
            chunk_s.count(|| http::write_chunk(&mut out, &sse));
            let sse_mem = Memory { ranges: vec![range_of(&sse)] };
            if !sse_mem.holds(&out) {
                chunk_s.copies += (rendered - rendered_before) as u64;
            }
            client_bytes += out.len();
            sse.clear();
            out.clear();
        }
    })
    .expect("monoio runtime");
    assert_eq!((next, rendered), (n, n), "every event was parsed and rendered");
    // The frame holds a copy of each text, not the text's own memory.
    steps[2].copies = texts.iter().filter(|t| !link_rec.wrote_from(t)).count() as u64;
    table(
        &format!(
            "Per relayed event, normalized path: {n} SSE events of {} B data, {per_read} per upstream read; {} B per client event",
            data_bytes / n,
            client_bytes / n
        ),
        "event",
        n as u64,
        &steps,
    );
}

// --- the dialects' encoders -----------------------------------------------------

/// The events of one streamed answer: its start, `n` text pieces (or, with
/// `tool`, one call's `n` argument pieces), choice 0's finish, the terminal.
fn answer_events(n: usize, tool: bool) -> Vec<ExecEvent> {
    let mut evs = vec![ExecEvent::Start { model: MODEL.to_owned() }];
    evs.extend((0..n).map(|i| {
        if !tool {
            return ExecEvent::content(token(i));
        }
        let first = i == 0;
        let call = iop_core::exec::ToolCallDelta {
            index: 0,
            id: if first { "call_0123456789".to_owned() } else { String::new() },
            kind: if first { "function".to_owned() } else { String::new() },
            name: if first { "get_weather".to_owned() } else { String::new() },
            arguments: format!("{{\"k{i}\":1,"),
        };
        ExecEvent::Delta(Delta { choice: 0, part: Part::ToolCall(Box::new(call)), logprobs: None })
    }));
    let finish = if tool { "tool_calls" } else { "stop" };
    evs.push(ExecEvent::ChoiceFinish { choice: 0, finish_reason: finish.to_owned(), stop_sequence: None });
    let usage = iop_core::exec::Usage { input_tokens: 12, output_tokens: n as u64, ..Default::default() };
    evs.push(ExecEvent::Complete { finish_reason: finish.to_owned(), usage: Some(usage) });
    evs
}

/// Renders `evs` with `enc` into one output buffer, cleared after every
/// event as a busy stream's write loop does (its capacity kept, and made
/// large enough up front: the buffer's own growth is not the encoder's);
/// the allocations of the middle events (not the opening and closing ones,
/// which each stream pays once).
fn encoder_step<E: EventEncoder>(step: &mut Step, mut enc: E, evs: Vec<ExecEvent>) -> usize {
    let mut out = BytesMut::with_capacity(4096);
    let last = evs.len() - 2;
    let mut bytes = 0;
    for (i, ev) in evs.into_iter().enumerate() {
        if (2..last).contains(&i) {
            step.count(|| enc.event(&mut out, ev));
        } else {
            enc.event(&mut out, ev);
        }
        bytes += out.len();
        out.clear();
    }
    bytes
}

fn dialect_events(n: usize) {
    for tool in [false, true] {
        let mut steps = [
            Step::new("edge: chat `ChunkEncoder::delta`"),
            Step::new("edge: Messages `MessagesEncoder::event`"),
            Step::new("edge: Responses `ResponsesEncoder::event`"),
        ];
        let [chat, messages, responses] = &mut steps;
        let enc = ChunkEncoder::new("chatcmpl-7f3a9c0123456789", MODEL, 1_731_000_000);
        let mut out = BytesMut::with_capacity(4096);
        for ev in answer_events(n, tool).into_iter().skip(2).take(n - 2) {
            let ExecEvent::Delta(d) = ev else { continue };
            chat.count(|| enc.delta(&mut out, &d));
            out.clear();
        }
        encoder_step(
            messages,
            MessagesEncoder::new("msg_run-0123456789abcdef", MODEL, 12, Vec::new()),
            answer_events(n, tool),
        );
        let meta = ResponseMeta {
            id: "resp_run-0123456789abcdef".to_owned(),
            model: MODEL.to_owned(),
            created_at: 1_731_000_000,
            ..Default::default()
        };
        encoder_step(responses, ResponsesEncoder::new(meta), answer_events(n, tool));
        let what = if tool { "one tool call's argument pieces" } else { "text pieces" };
        table(
            &format!("Per streamed event, each dialect's encoder: {n} {what} (the middle ones)"),
            "event",
            n as u64 - 3,
            &steps,
        );
        // A Responses answer keeps its output for `response.completed`: that
        // text grows by doubling, nothing else allocates per event.
        let bound = |s: &Step| s.allocations as f64 / (n as f64 - 3.0);
        assert_eq!(steps[0].allocations + steps[1].allocations, 0, "chat and Messages allocate nothing per event");
        assert!(bound(&steps[2]) < 0.05, "Responses allocates only as its kept output grows");
    }
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test` runs a short pass.
    let full = std::env::args().any(|a| a == "--bench");
    let (requests_n, events_n) = if full { (2_000, 16_384) } else { (20, 256) };
    println!("allocs: counted by this binary's allocator, current thread only; see benches/benches/allocs.rs");
    for body in [256, 16 * 1024] {
        requests(requests_n, body);
    }
    for per_read in [1, 8] {
        tunnel_events(events_n, per_read);
    }
    for per_read in [1, 8] {
        normalized_events(events_n, per_read);
    }
    dialect_events(events_n);
}
