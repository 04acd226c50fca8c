//! The fair yield, `iop_core::rt::yield_now()` (the wake comes from a tiny
//! spawned task, so the yielding task goes to the back of monoio's run
//! queue), beside, in the same group:
//! - `monoio_sleep_zero_baseline`: `monoio::time::sleep(Duration::ZERO)`, the
//!   old fair yield, which waits for the next timer tick (about 1 ms);
//! - `self_wake_unfair_baseline`: wake our own waker and return `Pending`
//!   once, monoio's unfair yield (the task goes back to the *front* of the
//!   queue, see `core/src/rt/worker.rs`), the cheapest trip through the
//!   scheduler;
//! - `no_yield_baseline`: awaiting an empty `async {}` (never suspends).
//!
//! One iteration is one yield; each sample runs its yields in a row on one
//! runtime built outside the timed part (`iter_custom`).

// Setup failures should abort the bench loudly; they are not reachable at runtime.
#![allow(clippy::expect_used)]

use std::{
    future::Future,
    hint::black_box,
    task::Poll,
    time::{Duration, Instant},
};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode, Throughput};
use iop_core::rt::{block_on_current, yield_now};

#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Times `iters` awaits of `make()` on a fresh runtime.
fn timed<F: Future<Output = ()>>(iters: u64, make: impl Fn() -> F) -> Duration {
    block_on_current(async {
        let start = Instant::now();
        for _ in 0..iters {
            make().await;
        }
        start.elapsed()
    })
    .expect("monoio runtime")
}

/// monoio's own (unfair) yield: wake ourselves, be polled again at once.
async fn self_wake() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if yielded {
            return Poll::Ready(());
        }
        yielded = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    })
    .await
}

fn bench_yield(c: &mut Criterion) {
    let mut group = c.benchmark_group("yield");
    group.throughput(Throughput::Elements(1));
    group.warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_millis(1500)).sample_size(50);
    group.bench_function(BenchmarkId::new("iop_yield_now", "1_task"), |b| b.iter_custom(|n| timed(n, yield_now)));
    group.bench_function(BenchmarkId::new("self_wake_unfair_baseline", "1_task"), |b| {
        b.iter_custom(|n| timed(n, self_wake))
    });
    group.bench_function(BenchmarkId::new("no_yield_baseline", "1_task"), |b| {
        b.iter_custom(|n| timed(n, || black_box(async {})))
    });
    // About 1 ms per iteration: few samples, each of the same length (a
    // linear ramp would spend most of the time in its last samples).
    group.sample_size(10).sampling_mode(SamplingMode::Flat).measurement_time(Duration::from_secs(1));
    group.bench_function(BenchmarkId::new("monoio_sleep_zero_baseline", "1_task"), |b| {
        b.iter_custom(|n| timed(n, || monoio::time::sleep(Duration::ZERO)))
    });
    group.finish();
}

criterion_group!(benches, bench_yield);
criterion_main!(benches);
