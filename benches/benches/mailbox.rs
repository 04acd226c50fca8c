//! The cross-core mailbox (`iop_core::rt::mailbox`: a `SegQueue` with an
//! atomic bound and a cross-thread waker) between two threads, beside
//! `std::sync::mpsc::sync_channel` and `crossbeam_channel::bounded` with the
//! same capacity and message type (`u64`).
//!
//! - `mailbox/ping_pong`: one message there and one back per iteration
//!   (round-trip latency). The mailbox runs as the edge uses it: each side
//!   on its own monoio runtime, awaiting `recv()`, so an empty mailbox parks
//!   the runtime and the sender's wake unparks it through the driver.
//! - `mailbox/one_way`: a producer thread sends, the other receives
//!   (throughput; the bound gives backpressure).
//! - `mailbox/same_thread`: `try_send` then `try_recv` on one thread, the
//!   queue operations alone (no wake, no park; the mailbox also serves
//!   within one core). No spinning two-thread variant: on a shared 2-core
//!   machine a spinning pair measures the scheduler, not the queue.
//!
//! Threads are spawned and runtimes built once per sample, outside the timed
//! part (`iter_custom`), and are not pinned.

// Setup failures should abort the bench loudly; they are not reachable at runtime.
#![allow(clippy::expect_used)]

use std::{
    hint::black_box,
    sync::{mpsc, Arc, Barrier},
    thread,
    time::{Duration, Instant},
};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use iop_core::rt::{block_on_current, mailbox::mailbox};

#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Capacity of every queue.
const CAP: usize = 1024;

fn run<F: std::future::Future>(f: F) -> F::Output {
    block_on_current(f).expect("monoio runtime")
}

// --- ping-pong ------------------------------------------------------------

fn iop_ping_pong(iters: u64) -> Duration {
    let (to_echo, echo_rx) = mailbox::<u64>(CAP);
    let (to_main, main_rx) = mailbox::<u64>(CAP);
    let echo = thread::spawn(move || {
        run(async move {
            while let Some(v) = echo_rx.recv().await {
                if to_main.send(v).await.is_err() {
                    break;
                }
            }
        })
    });
    let elapsed = run(async move {
        // One round trip first: the echo thread's runtime is up.
        to_echo.try_send(0).expect("room");
        main_rx.recv().await.expect("echo");
        let start = Instant::now();
        for i in 0..iters {
            to_echo.try_send(i).expect("room");
            black_box(main_rx.recv().await.expect("echo"));
        }
        start.elapsed()
    });
    echo.join().expect("echo thread");
    elapsed
}

fn std_ping_pong(iters: u64) -> Duration {
    let (to_echo, echo_rx) = mpsc::sync_channel::<u64>(CAP);
    let (to_main, main_rx) = mpsc::sync_channel::<u64>(CAP);
    let echo = thread::spawn(move || {
        for v in echo_rx {
            if to_main.send(v).is_err() {
                break;
            }
        }
    });
    to_echo.send(0).expect("echo alive");
    main_rx.recv().expect("echo");
    let start = Instant::now();
    for i in 0..iters {
        to_echo.send(i).expect("echo alive");
        black_box(main_rx.recv().expect("echo"));
    }
    let elapsed = start.elapsed();
    drop(to_echo);
    echo.join().expect("echo thread");
    elapsed
}

fn crossbeam_ping_pong(iters: u64) -> Duration {
    let (to_echo, echo_rx) = crossbeam_channel::bounded::<u64>(CAP);
    let (to_main, main_rx) = crossbeam_channel::bounded::<u64>(CAP);
    let echo = thread::spawn(move || {
        for v in echo_rx {
            if to_main.send(v).is_err() {
                break;
            }
        }
    });
    to_echo.send(0).expect("echo alive");
    main_rx.recv().expect("echo");
    let start = Instant::now();
    for i in 0..iters {
        to_echo.send(i).expect("echo alive");
        black_box(main_rx.recv().expect("echo"));
    }
    let elapsed = start.elapsed();
    drop(to_echo);
    echo.join().expect("echo thread");
    elapsed
}

fn bench_ping_pong(c: &mut Criterion) {
    let mut group = c.benchmark_group("mailbox/ping_pong");
    group.warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2)).sample_size(30);
    group.throughput(Throughput::Elements(1));
    type Case = (&'static str, fn(u64) -> Duration);
    let cases: [Case; 3] = [
        ("iop_mailbox", iop_ping_pong),
        ("std_sync_channel_baseline", std_ping_pong),
        ("crossbeam_bounded_baseline", crossbeam_ping_pong),
    ];
    for (name, f) in cases {
        group.bench_function(BenchmarkId::new(name, CAP), |b| b.iter_custom(f));
    }
    group.finish();
}

// --- one way ----------------------------------------------------------------

/// Both threads start together once their setup is done.
fn start_pair() -> (Arc<Barrier>, Arc<Barrier>) {
    let b = Arc::new(Barrier::new(2));
    (b.clone(), b)
}

fn iop_one_way(iters: u64) -> Duration {
    let (tx, rx) = mailbox::<u64>(CAP);
    let (go_producer, go) = start_pair();
    let producer = thread::spawn(move || {
        run(async move {
            go_producer.wait();
            for i in 0..iters {
                tx.send(i).await.expect("receiver alive");
            }
        })
    });
    let elapsed = run(async move {
        go.wait();
        let start = Instant::now();
        for _ in 0..iters {
            black_box(rx.recv().await.expect("message"));
        }
        start.elapsed()
    });
    producer.join().expect("producer thread");
    elapsed
}

fn std_one_way(iters: u64) -> Duration {
    let (tx, rx) = mpsc::sync_channel::<u64>(CAP);
    let (go_producer, go) = start_pair();
    let producer = thread::spawn(move || {
        go_producer.wait();
        for i in 0..iters {
            tx.send(i).expect("receiver alive");
        }
    });
    go.wait();
    let start = Instant::now();
    for _ in 0..iters {
        black_box(rx.recv().expect("message"));
    }
    let elapsed = start.elapsed();
    producer.join().expect("producer thread");
    elapsed
}

fn crossbeam_one_way(iters: u64) -> Duration {
    let (tx, rx) = crossbeam_channel::bounded::<u64>(CAP);
    let (go_producer, go) = start_pair();
    let producer = thread::spawn(move || {
        go_producer.wait();
        for i in 0..iters {
            tx.send(i).expect("receiver alive");
        }
    });
    go.wait();
    let start = Instant::now();
    for _ in 0..iters {
        black_box(rx.recv().expect("message"));
    }
    let elapsed = start.elapsed();
    producer.join().expect("producer thread");
    elapsed
}

fn bench_one_way(c: &mut Criterion) {
    let mut group = c.benchmark_group("mailbox/one_way");
    group.warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2)).sample_size(30);
    group.throughput(Throughput::Elements(1));
    type Case = (&'static str, fn(u64) -> Duration);
    let cases: [Case; 3] = [
        ("iop_mailbox", iop_one_way),
        ("std_sync_channel_baseline", std_one_way),
        ("crossbeam_bounded_baseline", crossbeam_one_way),
    ];
    for (name, f) in cases {
        group.bench_function(BenchmarkId::new(name, CAP), |b| b.iter_custom(f));
    }
    group.finish();
}

// --- same thread ------------------------------------------------------------

fn bench_same_thread(c: &mut Criterion) {
    let mut group = c.benchmark_group("mailbox/same_thread");
    group.warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_millis(1500)).sample_size(50);
    group.throughput(Throughput::Elements(1));
    let (tx, rx) = mailbox::<u64>(CAP);
    group.bench_function(BenchmarkId::new("iop_mailbox", CAP), |b| {
        b.iter(|| {
            tx.try_send(black_box(7)).expect("room");
            black_box(rx.try_recv())
        })
    });
    let (tx, rx) = mpsc::sync_channel::<u64>(CAP);
    group.bench_function(BenchmarkId::new("std_sync_channel_baseline", CAP), |b| {
        b.iter(|| {
            tx.try_send(black_box(7)).expect("room");
            black_box(rx.try_recv().ok())
        })
    });
    let (tx, rx) = crossbeam_channel::bounded::<u64>(CAP);
    group.bench_function(BenchmarkId::new("crossbeam_bounded_baseline", CAP), |b| {
        b.iter(|| {
            tx.try_send(black_box(7)).expect("room");
            black_box(rx.try_recv().ok())
        })
    });
    group.finish();
}

criterion_group!(benches, bench_ping_pong, bench_one_way, bench_same_thread);
criterion_main!(benches);
