//! One upstream read's run events as one frame (the normalized path's hot
//! loop), both sides, with the way it was done before beside it:
//! - `run_events/encode`: `iop` is the node's [`encode_run_events`], each
//!   event written straight from its `ExecEvent`; the baseline builds the
//!   events' `pb::RunEvent`s (`into_wire_unnamed`) and encodes them as a
//!   repeated message field with prost.
//! - `run_events/decode`: `iop` is the edge's way, [`decode`] with the
//!   events as slices, then each decoded as it is routed ([`decode_event`]:
//!   a text delta straight into its `ExecEvent`); the baseline decodes the
//!   frame into a vector of `pb::RunEvent`s with prost, then converts each.
//!
//! The same bytes on the wire either way (checked before timing). Inputs
//! are made outside the timed loop; outputs are dropped inside it.

#![allow(clippy::expect_used)]

use std::{hint::black_box, time::Duration};

use bytes::{Bytes, BytesMut};
use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use iop_core::{
    exec::ExecEvent,
    wire::{decode, decode_event, encode_run_events, pb, DEFAULT_MAX_FRAME_BYTES as MAX},
};
use prost::Message;

#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const RUN_ID: &str = "run-0123456789abcdef";

/// The frame as prost's generated code saw it before: the events a
/// repeated message field.
#[derive(Clone, PartialEq, prost::Message)]
struct OldEnvelope {
    #[prost(oneof = "OldBody", tags = "24")]
    body: Option<OldBody>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum OldBody {
    #[prost(message, tag = "24")]
    RunEvents(OldRunEvents),
}

#[derive(Clone, PartialEq, prost::Message)]
struct OldRunEvents {
    #[prost(bytes = "bytes", tag = "1")]
    run_id: Bytes,
    #[prost(uint64, tag = "2")]
    seq: u64,
    #[prost(message, repeated, tag = "3")]
    events: Vec<pb::RunEvent>,
}

/// `n` tokens of a few bytes each, as a fast model's read holds them.
fn tokens(n: usize) -> Vec<ExecEvent> {
    (0..n).map(|i| ExecEvent::content(format!(" tok{i}"))).collect()
}

fn old_frame(events: Vec<ExecEvent>, out: &mut BytesMut) {
    let events = events.into_iter().map(|e| e.into_wire_unnamed(0)).collect();
    let env = OldEnvelope { body: Some(OldBody::RunEvents(OldRunEvents { run_id: RUN_ID.into(), seq: 7, events })) };
    let len = env.encoded_len();
    out.reserve(4 + len);
    out.extend_from_slice(&(len as u32).to_be_bytes());
    env.encode(out).expect("room reserved");
}

fn tune(group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>) {
    group.warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_millis(1500)).sample_size(50);
}

fn bench(c: &mut Criterion) {
    for n in [4usize, 16, 64] {
        let label = format!("{n}_events");
        let mut frame = BytesMut::new();
        encode_run_events(RUN_ID, 7, &tokens(n), &mut frame, MAX).expect("fits");
        let mut old = BytesMut::new();
        old_frame(tokens(n), &mut old);
        assert_eq!(frame, old, "the same bytes on the wire");
        let frame = frame.freeze();

        let mut group = c.benchmark_group("run_events/encode");
        tune(&mut group);
        group.throughput(Throughput::Elements(n as u64));
        group.bench_function(BenchmarkId::new("iop", &label), |b| {
            b.iter_batched(
                || tokens(n),
                |evs| {
                    let mut out = BytesMut::new();
                    encode_run_events(RUN_ID, 7, &evs, &mut out, MAX).expect("fits");
                    black_box((out, evs));
                },
                BatchSize::SmallInput,
            )
        });
        group.bench_function(BenchmarkId::new("message_vector_baseline", &label), |b| {
            b.iter_batched(
                || tokens(n),
                |evs| {
                    let mut out = BytesMut::new();
                    old_frame(evs, &mut out);
                    black_box(out);
                },
                BatchSize::SmallInput,
            )
        });
        group.finish();

        let mut group = c.benchmark_group("run_events/decode");
        tune(&mut group);
        group.throughput(Throughput::Elements(n as u64));
        group.bench_function(BenchmarkId::new("iop", &label), |b| {
            b.iter_batched(
                || BytesMut::from(&frame[..]),
                |mut buf| {
                    let env = decode(&mut buf, MAX).expect("valid").expect("complete");
                    let Some(pb::envelope::Body::RunEvents(batch)) = env.body else { unreachable!() };
                    for raw in batch.events {
                        black_box(decode_event(raw).expect("valid"));
                    }
                },
                BatchSize::SmallInput,
            )
        });
        group.bench_function(BenchmarkId::new("message_vector_baseline", &label), |b| {
            b.iter_batched(
                || BytesMut::from(&frame[..]),
                |buf| {
                    let buf = buf.freeze();
                    let env = OldEnvelope::decode(buf.slice(4..)).expect("valid");
                    let Some(OldBody::RunEvents(batch)) = env.body else { unreachable!() };
                    for ev in batch.events {
                        black_box(ExecEvent::from_wire(ev));
                    }
                },
                BatchSize::SmallInput,
            )
        });
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
