//! Frame codec: encode and decode of the two hot-path frames (a run-event text
//! delta and a provider-tunnel body chunk) over payload sizes. The decode group
//! also runs prost over a plain `&[u8]` (which copies bytes fields) as a
//! baseline for the zero-copy `Bytes` path.

// Setup failures should abort the bench loudly; they are not reachable at runtime.
#![allow(clippy::expect_used)]

use std::hint::black_box;

use bytes::{Bytes, BytesMut};
use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use iop_core::wire::{
    decode, encode,
    pb::{self, envelope::Body},
    DEFAULT_MAX_FRAME_BYTES,
};
use prost::Message;

const SIZES: [(usize, &str); 3] = [(16, "16B"), (1024, "1KiB"), (64 * 1024, "64KiB")];

/// Bounds the memory held by one batch (outputs live until the batch ends)
/// while keeping timer overhead negligible even for the 16-byte case.
const BATCH: BatchSize = BatchSize::NumIterations(256);

fn run_event_delta(size: usize) -> pb::Envelope {
    pb::Envelope {
        correlation_id: 0,
        body: Some(Body::RunEvent(pb::RunEvent {
            run_id: "run-0123456789abcdef".into(),
            seq: 42,
            kind: Some(pb::run_event::Kind::Delta(pb::TextDelta { text: "a".repeat(size) })),
            ..Default::default()
        })),
    }
}

fn tunnel_body(size: usize) -> pb::Envelope {
    pb::Envelope {
        correlation_id: 0,
        body: Some(Body::ProviderTunnelFrame(pb::ProviderTunnelFrame {
            tunnel_id: Bytes::from_static(b"tun-0123456789abcdef"),
            seq: 42,
            kind: Some(pb::provider_tunnel_frame::Kind::Body(Bytes::from(vec![b'x'; size]))),
            usage: None,
        })),
    }
}

type Case = (&'static str, fn(usize) -> pb::Envelope);
const CASES: [Case; 2] = [("run_event_delta", run_event_delta), ("tunnel_body", tunnel_body)];

fn frame_of(msg: &pb::Envelope) -> Bytes {
    let mut out = BytesMut::new();
    encode(msg, &mut out, DEFAULT_MAX_FRAME_BYTES).expect("bench frame fits");
    out.freeze()
}

fn bench_encode(c: &mut Criterion) {
    let mut group = c.benchmark_group("codec/encode");
    for (name, make) in CASES {
        for (size, label) in SIZES {
            let msg = make(size);
            group.throughput(Throughput::Bytes((msg.encoded_len() + 4) as u64));
            group.bench_with_input(BenchmarkId::new(name, label), &msg, |b, msg| {
                b.iter_batched_ref(BytesMut::new, |out| encode(black_box(msg), out, DEFAULT_MAX_FRAME_BYTES), BATCH)
            });
        }
    }
    group.finish();
}

fn bench_decode(c: &mut Criterion) {
    let mut group = c.benchmark_group("codec/decode");
    for (name, make) in CASES {
        for (size, label) in SIZES {
            let frame = frame_of(&make(size));
            group.throughput(Throughput::Bytes(frame.len() as u64));
            group.bench_with_input(BenchmarkId::new(name, label), &frame, |b, frame| {
                // The copy into a fresh BytesMut (what a socket read produces) is setup.
                b.iter_batched_ref(|| BytesMut::from(&frame[..]), |buf| decode(buf, DEFAULT_MAX_FRAME_BYTES), BATCH)
            });
        }
    }
    // Baseline: prost over a borrowed slice copies the body out of the frame.
    for (size, label) in SIZES {
        let frame = frame_of(&tunnel_body(size));
        group.throughput(Throughput::Bytes(frame.len() as u64));
        group.bench_with_input(BenchmarkId::new("tunnel_body_slice_baseline", label), &frame, |b, frame| {
            b.iter_batched_ref(|| BytesMut::from(&frame[..]), |buf| pb::Envelope::decode(black_box(&buf[4..])), BATCH)
        });
    }
    group.finish();
}

criterion_group!(benches, bench_encode, bench_decode);
criterion_main!(benches);
