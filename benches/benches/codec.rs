//! Frame codec: encode and decode of the hot-path frames (a run-event text
//! delta, a provider-tunnel body chunk, and a tunnel `BodyParts` frame of
//! eight parts, the size being all eight together) over payload sizes, and the
//! zero-copy queueing of tunnel body frames into the link's write queue.
//!
//! Every group has its baseline beside it:
//! - `codec/encode/*`: `iop` ([`encode`] into a fresh `BytesMut`) beside
//!   prost's `encode_to_vec` (no length prefix, no limit check) and a plain
//!   memcpy of the finished frame into a fresh `BytesMut`; each output is
//!   dropped inside the timed loop.
//! - `codec/tunnel_queue`: what `FrameWriter::send_tunnel_body` does
//!   ([`encode_tunnel_body`]: the frame head into the glue, the payload
//!   pushed as a segment of its own) beside what `FrameWriter::send` does
//!   with the same frame ([`encode`] into the glue, which copies the
//!   payload) and a memcpy of the whole frame into the glue. One payload
//!   travels as `body`; `8x…` is one upstream read of eight events, sent as
//!   one `BodyParts` frame of eight parts.
//! - `codec/decode/*`: `iop` ([`decode`] off the front of a `BytesMut`
//!   holding many frames, bytes fields as slices) beside prost over a
//!   borrowed `&[u8]` (which copies bytes fields) and a memcpy of the frame;
//!   each result is dropped inside the timed loop.

// Setup failures should abort the bench loudly; they are not reachable at runtime.
#![allow(clippy::expect_used)]

use std::{
    hint::black_box,
    time::{Duration, Instant},
};

use bytes::{Buf, Bytes, BytesMut};
use criterion::{
    criterion_group, criterion_main, measurement::WallTime, BenchmarkGroup, BenchmarkId, Criterion, Throughput,
};
use iop_core::{
    rt::gather::Gather,
    wire::{
        decode, encode, encode_tunnel_body,
        pb::{self, envelope::Body},
        DEFAULT_MAX_FRAME_BYTES,
    },
};
use prost::Message;

#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const SIZES: [(usize, &str); 3] = [(16, "16B"), (1024, "1KiB"), (64 * 1024, "64KiB")];

/// Frames in one decode buffer: one promotion of the buffer to shared
/// `Bytes` is spread over them, as over the frames of one socket read.
const FRAMES_PER_READ: u64 = 64;

/// The write queue is emptied (as a `writev` would) once it holds this much.
const QUEUE_FLUSH: usize = 1 << 20;

const TUNNEL_ID: &str = "tun-0123456789abcdef";
const SEQ: u64 = 42;

fn tune(group: &mut BenchmarkGroup<'_, WallTime>) {
    group.warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_millis(1500)).sample_size(50);
}

fn run_event_delta(size: usize) -> pb::Envelope {
    pb::Envelope {
        correlation_id: 0,
        body: Some(Body::RunEvent(pb::RunEvent {
            run_id: "run-0123456789abcdef".into(),
            seq: SEQ,
            kind: Some(pb::run_event::Kind::Delta(pb::TextDelta { text: "a".repeat(size) })),
            ..Default::default()
        })),
    }
}

fn tunnel_body(size: usize) -> pb::Envelope {
    pb::Envelope {
        correlation_id: 0,
        body: Some(Body::ProviderTunnelFrame(pb::ProviderTunnelFrame {
            tunnel_id: Bytes::from_static(TUNNEL_ID.as_bytes()),
            seq: SEQ,
            kind: Some(pb::provider_tunnel_frame::Kind::Body(Bytes::from(vec![b'x'; size]))),
            usage: None,
        })),
    }
}

/// A `BodyParts` tunnel frame of eight parts, `size` bytes in all.
fn tunnel_parts8(size: usize) -> pb::Envelope {
    let parts: Vec<Bytes> = (0..8).map(|_| Bytes::from(vec![b'x'; size / 8])).collect();
    tunnel_parts(&parts)
}

type Case = (&'static str, fn(usize) -> pb::Envelope);
const CASES: [Case; 3] =
    [("run_event_delta", run_event_delta), ("tunnel_body", tunnel_body), ("tunnel_parts8", tunnel_parts8)];

fn frame_of(msg: &pb::Envelope) -> Bytes {
    let mut out = BytesMut::new();
    encode(msg, &mut out, DEFAULT_MAX_FRAME_BYTES).expect("bench frame fits");
    out.freeze()
}

fn bench_encode(c: &mut Criterion) {
    for (name, make) in CASES {
        let mut group = c.benchmark_group(format!("codec/encode/{name}"));
        tune(&mut group);
        for (size, label) in SIZES {
            let msg = make(size);
            let frame = frame_of(&msg);
            group.throughput(Throughput::Bytes(frame.len() as u64));
            // Each variant allocates its output and drops it inside the timed
            // loop, so the allocator reuses the same memory every time.
            group.bench_function(BenchmarkId::new("iop", label), |b| {
                b.iter(|| {
                    let mut out = BytesMut::new();
                    encode(black_box(&msg), &mut out, DEFAULT_MAX_FRAME_BYTES).expect("fits");
                    out
                })
            });
            group.bench_function(BenchmarkId::new("prost_encode_to_vec_baseline", label), |b| {
                b.iter(|| black_box(&msg).encode_to_vec())
            });
            group.bench_function(BenchmarkId::new("memcpy_baseline", label), |b| {
                b.iter(|| {
                    let mut out = BytesMut::new();
                    out.extend_from_slice(black_box(&frame));
                    out
                })
            });
        }
        group.finish();
    }
}

/// Runs `put` against one long-lived write queue that is emptied whenever it
/// holds [`QUEUE_FLUSH`] bytes, the way the link's writer drains it.
fn queue_bench(b: &mut criterion::Bencher<'_>, mut put: impl FnMut(&mut Gather)) {
    let mut queue = Gather::new();
    b.iter(|| {
        put(&mut queue);
        if queue.len() >= QUEUE_FLUSH {
            queue.clear();
        }
    });
    black_box(queue.pushed());
}

/// A `BodyParts` tunnel frame of `parts`.
fn tunnel_parts(parts: &[Bytes]) -> pb::Envelope {
    pb::Envelope {
        correlation_id: 0,
        body: Some(Body::ProviderTunnelFrame(pb::ProviderTunnelFrame {
            tunnel_id: Bytes::from_static(TUNNEL_ID.as_bytes()),
            seq: SEQ,
            kind: Some(pb::provider_tunnel_frame::Kind::Parts(pb::BodyParts { parts: parts.to_vec() })),
            usage: None,
        })),
    }
}

fn bench_tunnel_queue(c: &mut Criterion) {
    let mut group = c.benchmark_group("codec/tunnel_queue");
    tune(&mut group);
    // One payload of each size (a `body` frame), then eight payloads of one
    // upstream read (a `BodyParts` frame).
    let mut cases: Vec<(Vec<Bytes>, pb::Envelope, String)> = SIZES
        .iter()
        .map(|&(size, label)| (vec![Bytes::from(vec![b'x'; size])], tunnel_body(size), label.to_owned()))
        .collect();
    for (size, label) in [(128, "8x128B"), (1024, "8x1KiB")] {
        let parts: Vec<Bytes> = (0..8).map(|_| Bytes::from(vec![b'x'; size])).collect();
        let msg = tunnel_parts(&parts);
        cases.push((parts, msg, label.to_owned()));
    }
    for (parts, msg, label) in cases {
        let frame = frame_of(&msg);
        // The queued segments must be exactly the frame `encode` writes.
        let mut check = Gather::new();
        encode_tunnel_body(TUNNEL_ID, SEQ, &parts, &mut check, DEFAULT_MAX_FRAME_BYTES).expect("frame fits");
        assert_eq!(check.to_vec(), &frame[..], "encode_tunnel_body == encode");
        assert_eq!(check.pushed(), parts.len() as u64, "every part is a segment of its own");

        group.throughput(Throughput::Bytes(frame.len() as u64));
        group.bench_function(BenchmarkId::new("iop_head_plus_segments", &label), |b| {
            queue_bench(b, |q| {
                encode_tunnel_body(TUNNEL_ID, SEQ, black_box(&parts), q, DEFAULT_MAX_FRAME_BYTES).expect("fits")
            })
        });
        group.bench_function(BenchmarkId::new("copying_encode_baseline", &label), |b| {
            queue_bench(b, |q| q.put_with(|out| encode(black_box(&msg), out, DEFAULT_MAX_FRAME_BYTES)).expect("fits"))
        });
        group.bench_function(BenchmarkId::new("memcpy_baseline", &label), |b| {
            queue_bench(b, |q| q.put_slice(black_box(&frame)))
        });
    }
    group.finish();
}

/// Times `iters` calls of `routine`, each taking the next frame off the
/// front of a buffer that holds [`FRAMES_PER_READ`] copies of `frame` (as a
/// socket read leaves them); filling the buffers is not timed.
fn decode_frames(frame: &[u8], iters: u64, mut routine: impl FnMut(&mut BytesMut)) -> Duration {
    let mut total = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let n = left.min(FRAMES_PER_READ);
        let mut buf = BytesMut::with_capacity(frame.len() * n as usize);
        for _ in 0..n {
            buf.extend_from_slice(frame);
        }
        let start = Instant::now();
        for _ in 0..n {
            routine(&mut buf);
        }
        total += start.elapsed();
        assert!(buf.is_empty(), "every frame was taken");
        left -= n;
    }
    total
}

fn bench_decode(c: &mut Criterion) {
    for (name, make) in CASES {
        let mut group = c.benchmark_group(format!("codec/decode/{name}"));
        tune(&mut group);
        for (size, label) in SIZES {
            let frame = frame_of(&make(size));
            let len = frame.len();
            group.throughput(Throughput::Bytes(len as u64));
            // Each decoded value is dropped inside the timed loop.
            group.bench_function(BenchmarkId::new("iop", label), |b| {
                b.iter_custom(|iters| {
                    decode_frames(&frame, iters, |buf| {
                        black_box(decode(buf, DEFAULT_MAX_FRAME_BYTES).expect("valid").expect("complete"));
                    })
                })
            });
            // prost over a borrowed slice copies bytes fields out of the frame.
            group.bench_function(BenchmarkId::new("prost_slice_baseline", label), |b| {
                b.iter_custom(|iters| {
                    decode_frames(&frame, iters, |buf| {
                        black_box(pb::Envelope::decode(&buf[4..len]).expect("valid"));
                        buf.advance(len);
                    })
                })
            });
            group.bench_function(BenchmarkId::new("memcpy_baseline", label), |b| {
                b.iter_custom(|iters| {
                    decode_frames(&frame, iters, |buf| {
                        black_box(buf[..len].to_vec());
                        buf.advance(len);
                    })
                })
            });
        }
        group.finish();
    }
}

criterion_group!(benches, bench_encode, bench_tunnel_queue, bench_decode);
criterion_main!(benches);
