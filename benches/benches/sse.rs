//! HTTP/1.1 request-head parsing and SSE parsing of a realistic OpenAI chunk
//! stream. Baselines: raw `httparse` (no framing checks, no owned head) for
//! heads, and a naive `\n\n` split (no line-end handling, no limits) for SSE.

// Setup failures should abort the bench loudly; they are not reachable at runtime.
#![allow(clippy::expect_used)]

use std::hint::black_box;

use bytes::BytesMut;
use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use iop_core::http::{parse_request_head, Limits};
use iop_core::sse::{write_event, SseParser};

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

fn bench_request_head(c: &mut Criterion) {
    let mut group = c.benchmark_group("http_request_head");
    let limits = Limits::default();
    for extra in [0usize, 8, 32] {
        let head = request_head(extra);
        group.throughput(Throughput::Bytes(head.len() as u64));
        group.bench_with_input(BenchmarkId::new("iop", extra), &head, |b, head| {
            b.iter_batched(
                || BytesMut::from(&head[..]),
                |mut buf| black_box(parse_request_head(&mut buf, &limits).expect("valid").expect("complete")),
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
    let mut group = c.benchmark_group("sse_parse");
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

fn bench_sse_write(c: &mut Criterion) {
    let mut group = c.benchmark_group("sse_write");
    for size in [32usize, 256, 4096] {
        let data = vec![b'x'; size];
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_with_input(BenchmarkId::new("write_event", size), &data, |b, data| {
            b.iter_batched_ref(
                || BytesMut::with_capacity(size + 16),
                |out| write_event(out, black_box(data)),
                BatchSize::SmallInput,
            );
        });
    }
    group.finish();
}

criterion_group!(benches, bench_request_head, bench_sse_parse, bench_sse_write);
criterion_main!(benches);
