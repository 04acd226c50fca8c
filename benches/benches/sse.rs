//! HTTP/1.1 head parsing, SSE parsing of a realistic OpenAI chunk stream, and
//! SSE rendering of one `chat.completion.chunk` event the way the edge writes
//! it to a client. Baselines, each in the same group:
//! - `http/request_head`, `http/response_head`: raw `httparse` (no framing
//!   checks, no owned head).
//! - `sse/parse`: a naive `\n\n` split of the whole stream (no line-end
//!   handling, no limits, no buffering across reads).
//! - `sse/render_chat_chunk`: `serde_json::to_vec` of a derived `Serialize`
//!   struct of the same chunk, framed with `format!`-style writes. The `iop`
//!   variants render with the edge's own `ChunkEncoder::delta`
//!   (`iop_edge::surface::openai::chunk`), except `iop_write_event_*`, which
//!   needs the chunk's JSON without its SSE framing and so uses a mirror of
//!   the encoder (checked to write the same bytes).

// Setup failures should abort the bench loudly; they are not reachable at runtime.
#![allow(clippy::expect_used)]

use std::{hint::black_box, io::Write, time::Duration};

use bytes::{BufMut, BytesMut};
use criterion::{
    criterion_group, criterion_main, measurement::WallTime, BatchSize, BenchmarkGroup, BenchmarkId, Criterion,
    Throughput,
};
use iop_core::{
    exec::{Delta, Part},
    http::{gather_chunk, parse_request_head, parse_response_head, write_chunk, Limits},
    rt::gather::Gather,
    sse::{write_event, SseParser},
};
use iop_edge::surface::openai::chunk::ChunkEncoder;

#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn tune(group: &mut BenchmarkGroup<'_, WallTime>) {
    group.warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_millis(1500)).sample_size(50);
}

/// A chat-completions request head with `extra` additional headers.
fn request_head(extra: usize) -> Vec<u8> {
    let mut head = String::from(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: gateway.internal:8080\r\nUser-Agent: OpenAI/Python 1.54.0\r\n\
         Authorization: Bearer sk-0123456789abcdef0123456789abcdef\r\nContent-Type: application/json\r\n\
         Accept: text/event-stream\r\nContent-Length: 1234\r\n",
    );
    for i in 0..extra {
        head.push_str(&format!("x-stainless-header-{i}: value-{i}-0123456789\r\n"));
    }
    head.push_str("\r\n");
    head.into_bytes()
}

/// A streaming response head as vLLM sends it, with `extra` additional headers.
fn response_head(extra: usize) -> Vec<u8> {
    let mut head = String::from(
        "HTTP/1.1 200 OK\r\ndate: Thu, 07 Nov 2024 12:00:00 GMT\r\nserver: uvicorn\r\n\
         content-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n",
    );
    for i in 0..extra {
        head.push_str(&format!("x-upstream-header-{i}: value-{i}-0123456789\r\n"));
    }
    head.push_str("\r\n");
    head.into_bytes()
}

fn bench_request_head(c: &mut Criterion) {
    let mut group = c.benchmark_group("http/request_head");
    tune(&mut group);
    let limits = Limits::default();
    for extra in [0usize, 8, 32] {
        let head = request_head(extra);
        group.throughput(Throughput::Bytes(head.len() as u64));
        group.bench_with_input(BenchmarkId::new("iop", extra), &head, |b, head| {
            b.iter_batched(
                || BytesMut::from(&head[..]),
                |mut buf| {
                    // The owned head is dropped inside the timed part.
                    black_box(parse_request_head(&mut buf, &limits).expect("valid").expect("complete"));
                },
                BatchSize::SmallInput,
            );
        });
        group.bench_with_input(BenchmarkId::new("httparse_baseline", extra), &head, |b, head| {
            b.iter(|| {
                let mut headers = [httparse::EMPTY_HEADER; 64];
                let mut req = httparse::Request::new(&mut headers);
                black_box(req.parse(black_box(head)).expect("valid"));
            });
        });
    }
    group.finish();
}

fn bench_response_head(c: &mut Criterion) {
    let mut group = c.benchmark_group("http/response_head");
    tune(&mut group);
    let limits = Limits::default();
    for extra in [0usize, 8, 32] {
        let head = response_head(extra);
        group.throughput(Throughput::Bytes(head.len() as u64));
        group.bench_with_input(BenchmarkId::new("iop", extra), &head, |b, head| {
            b.iter_batched(
                || BytesMut::from(&head[..]),
                |mut buf| {
                    black_box(parse_response_head(&mut buf, &limits, false).expect("valid").expect("complete"));
                },
                BatchSize::SmallInput,
            );
        });
        group.bench_with_input(BenchmarkId::new("httparse_baseline", extra), &head, |b, head| {
            b.iter(|| {
                let mut headers = [httparse::EMPTY_HEADER; 64];
                let mut res = httparse::Response::new(&mut headers);
                black_box(res.parse(black_box(head)).expect("valid"));
            });
        });
    }
    group.finish();
}

/// `events` content chunks as vLLM / OpenAI stream them, plus `[DONE]`.
fn openai_stream(events: usize) -> Vec<u8> {
    let mut out = BytesMut::new();
    for i in 0..events {
        let chunk = format!(
            "{{\"id\":\"chatcmpl-7f3a9c\",\"object\":\"chat.completion.chunk\",\"created\":1731000000,\
             \"model\":\"meta-llama/Llama-3.1-8B-Instruct\",\"choices\":[{{\"index\":0,\
             \"delta\":{{\"content\":\"tok{i} \"}},\"logprobs\":null,\"finish_reason\":null}}]}}"
        );
        write_event(&mut out, chunk.as_bytes());
    }
    write_event(&mut out, b"[DONE]");
    out.to_vec()
}

/// Splits `stream` into socket-read-sized pieces, the way it reaches the parser.
fn reads(stream: &[u8], read_size: usize) -> Vec<Vec<u8>> {
    stream.chunks(read_size).map(<[u8]>::to_vec).collect()
}

fn bench_sse_parse(c: &mut Criterion) {
    let mut group = c.benchmark_group("sse/parse");
    tune(&mut group);
    for events in [16usize, 256, 4096] {
        let stream = openai_stream(events);
        let pieces = reads(&stream, 1460);
        group.throughput(Throughput::Bytes(stream.len() as u64));
        group.bench_with_input(BenchmarkId::new("iop_1460B_reads", events), &pieces, |b, pieces| {
            b.iter_batched(
                || SseParser::new(64 * 1024),
                |mut parser| {
                    let mut n = 0usize;
                    for piece in pieces {
                        parser.push(piece);
                        while let Some(event) = parser.next_event().expect("valid stream") {
                            n += event.data.len();
                        }
                    }
                    black_box(n)
                },
                BatchSize::SmallInput,
            );
        });
        group.bench_with_input(BenchmarkId::new("naive_split_baseline", events), &stream, |b, stream| {
            b.iter(|| {
                let text = std::str::from_utf8(black_box(stream)).expect("utf-8");
                let n: usize =
                    text.split("\n\n").filter_map(|e| e.strip_prefix("data: ")).map(|d| d.to_owned().len()).sum();
                black_box(n)
            });
        });
    }
    group.finish();
}

// --- SSE render: one chat.completion.chunk content delta ---------------------

const CHUNK_ID: &str = "chatcmpl-7f3a9c0123456789";
const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";
const CREATED: u64 = 1_731_000_000;

/// Appends `s` as a JSON string literal (as `chunk::json_str` does).
fn json_str(out: &mut BytesMut, s: &str) {
    let _ = serde_json::to_writer(out.writer(), s);
}

/// A mirror of the edge's `ChunkEncoder` (`edge/src/surface/openai/chunk.rs`)
/// that can also write a chunk's JSON without SSE framing (the real one
/// writes whole events only): the per-stream prefix `{"id":..,"object":..,
/// "created":..,"model":..,` is built once, then each content delta is
/// written straight into the buffer with no JSON tree.
struct ChunkEncoderMirror {
    /// `{"id":..,"object":"chat.completion.chunk","created":..,"model":..,`.
    prefix: BytesMut,
}

impl ChunkEncoderMirror {
    fn new(id: &str, model: &str, created: u64) -> Self {
        let mut prefix = BytesMut::with_capacity(128);
        prefix.put_slice(b"{\"id\":");
        json_str(&mut prefix, id);
        prefix.put_slice(b",\"object\":\"chat.completion.chunk\",\"created\":");
        prefix.put_slice(created.to_string().as_bytes());
        prefix.put_slice(b",\"model\":");
        json_str(&mut prefix, model);
        prefix.put_slice(b",");
        Self { prefix }
    }

    /// The JSON of choice 0's content delta, without SSE framing.
    fn content_json(&self, out: &mut BytesMut, text: &str) {
        out.put_slice(&self.prefix);
        out.put_slice(b"\"choices\":[{\"index\":");
        out.put_slice(0u64.to_string().as_bytes());
        out.put_slice(b",\"delta\":{\"content\":");
        json_str(out, text);
        out.put_slice(b"},\"logprobs\":null,\"finish_reason\":null}]}");
    }

    /// `ChunkEncoder::delta`: the event with its framing written inline
    /// (`data: ` before, `\n\n` after; JSON never holds a raw newline).
    fn content_event(&self, out: &mut BytesMut, text: &str) {
        out.put_slice(b"data: ");
        self.content_json(out, text);
        out.put_slice(b"\n\n");
    }
}

#[derive(serde::Serialize)]
struct Chunk<'a> {
    id: &'a str,
    object: &'a str,
    created: u64,
    model: &'a str,
    choices: [Choice<'a>; 1],
}

#[derive(serde::Serialize)]
struct Choice<'a> {
    index: u32,
    delta: ContentDelta<'a>,
    logprobs: Option<()>,
    finish_reason: Option<&'a str>,
}

#[derive(serde::Serialize)]
struct ContentDelta<'a> {
    content: &'a str,
}

/// Baseline: build the chunk value, `serde_json::to_vec` it, then frame it
/// as an SSE event inside an HTTP chunk.
fn serde_event(out: &mut Vec<u8>, text: &str) {
    let chunk = Chunk {
        id: CHUNK_ID,
        object: "chat.completion.chunk",
        created: CREATED,
        model: MODEL,
        choices: [Choice { index: 0, delta: ContentDelta { content: text }, logprobs: None, finish_reason: None }],
    };
    let json = serde_json::to_vec(&chunk).expect("serializable");
    let event_len = json.len() + b"data: \n\n".len();
    let _ = write!(out, "{event_len:x}\r\ndata: ");
    out.extend_from_slice(&json);
    out.extend_from_slice(b"\n\n\r\n");
}

/// Token text of `size` bytes, with a quote to escape at the start.
fn token(size: usize) -> String {
    let mut t = String::from("\"");
    while t.len() < size {
        t.push_str("lorem ipsum ");
    }
    t.truncate(size);
    t
}

fn bench_sse_render(c: &mut Criterion) {
    let mut group = c.benchmark_group("sse/render_chat_chunk");
    tune(&mut group);
    let mirror = ChunkEncoderMirror::new(CHUNK_ID, MODEL, CREATED);
    let enc = ChunkEncoder::new(CHUNK_ID, MODEL, CREATED);
    for size in [5usize, 64, 1024] {
        let text = token(size);
        // What the edge gets from the run's event stream (already decoded).
        let delta = Delta { choice: 0, part: Part::Content(text.clone()), logprobs: None };

        // Every variant must write the same bytes.
        let mut expected = Vec::new();
        serde_event(&mut expected, &text);
        let mut sse = BytesMut::new();
        enc.delta(&mut sse, &delta);
        let mut out = BytesMut::new();
        write_chunk(&mut out, &sse);
        assert_eq!(out[..], expected[..], "ChunkEncoder == serde baseline");
        let mut mirrored = BytesMut::new();
        mirror.content_event(&mut mirrored, &text);
        assert_eq!(mirrored, sse, "mirror == ChunkEncoder");
        let mut json = BytesMut::new();
        mirror.content_json(&mut json, &text);
        let mut via_write_event = BytesMut::new();
        write_event(&mut via_write_event, &json);
        assert_eq!(via_write_event, sse, "write_event == inline framing");
        group.throughput(Throughput::Bytes(expected.len() as u64));

        // The edge's normalized path (`chat.rs` `stream_body`): the event into
        // a reused SSE buffer, then copied into the HTTP chunk.
        group.bench_function(BenchmarkId::new("iop_edge_inline_write_chunk", size), |b| {
            let (mut sse, mut out) = (BytesMut::with_capacity(4096), BytesMut::with_capacity(4096));
            b.iter(|| {
                enc.delta(&mut sse, black_box(&delta));
                write_chunk(&mut out, &sse);
                sse.clear();
                black_box(&out);
                out.clear();
            })
        });
        // The generic public pieces: JSON (the mirror), then
        // `sse::write_event` (which scans for line ends), then
        // `http::write_chunk`.
        group.bench_function(BenchmarkId::new("iop_write_event_write_chunk", size), |b| {
            let (mut json, mut sse, mut out) =
                (BytesMut::with_capacity(4096), BytesMut::with_capacity(4096), BytesMut::with_capacity(4096));
            b.iter(|| {
                mirror.content_json(&mut json, black_box(&text));
                write_event(&mut sse, &json);
                write_chunk(&mut out, &sse);
                json.clear();
                sse.clear();
                black_box(&out);
                out.clear();
            })
        });
        // The event frozen and queued as its own segment beside its chunk
        // framing (`http::gather_chunk`, what the relay does with tunnel
        // body bytes): no copy into the HTTP chunk.
        group.bench_function(BenchmarkId::new("iop_inline_gather_chunk", size), |b| {
            let (mut sse, mut queue) = (BytesMut::with_capacity(64 * 1024), Gather::new());
            b.iter(|| {
                enc.delta(&mut sse, black_box(&delta));
                gather_chunk(&mut queue, sse.split().freeze());
                if queue.len() >= 1 << 20 {
                    queue.clear();
                }
            });
            black_box(queue.pushed());
        });
        group.bench_function(BenchmarkId::new("serde_json_to_vec_baseline", size), |b| {
            let mut out = Vec::with_capacity(4096);
            b.iter(|| {
                serde_event(&mut out, black_box(&text));
                black_box(&out);
                out.clear();
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_request_head, bench_response_head, bench_sse_parse, bench_sse_render);
criterion_main!(benches);
