//! Capacity lease acquire and release on the owner core, as the edge does it
//! for a request whose provider this core owns: `Shard::try_acquire`, the run,
//! then dropping the `Lease` (which posts a `CoreMsg::Release` to the owner's
//! inbox) and the owner applying it (`Shard::release`, as `worker::apply`
//! does). Baselines in the same group: the same bounded counter as an
//! `AtomicU32` compare-and-swap loop and as a `parking_lot::Mutex<u32>`
//! (neither queues waiters, tracks guards or publishes load).
//! `iop_shard` runs on a shard owning one resource, `iop_shard_64_providers`
//! on one owning 64 (the lease is always on the first).

// Setup failures should abort the bench loudly; they are not reachable at runtime.
#![allow(clippy::expect_used, clippy::panic)]

use std::{
    hint::black_box,
    sync::atomic::{AtomicU32, Ordering},
    time::Duration,
};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use iop_core::{config::EdgeConfig, rt::mailbox};
use iop_edge::{
    link::{LinkRoute, NodeRoute},
    mesh::CoreMsg,
    pool::{LeaseClass, PoolView, ResourceKey, Shard},
};

#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const CAPACITY: u32 = 256;

/// A one-core edge config whose node `n` has `providers` providers of
/// capacity [`CAPACITY`], all targets of model `m`.
fn config(providers: usize) -> EdgeConfig {
    let mut text = String::from(
        "workers = 1\n[http]\nlisten = \"127.0.0.1:0\"\n[node_listener]\nlisten = \"127.0.0.1:0\"\n\
         [[nodes]]\nid = \"n\"\ntoken = \"token-n\"\n",
    );
    for p in 0..providers {
        text += &format!("[[nodes.providers]]\nid = \"p{p}\"\nkind = \"mock\"\ncapacity = {CAPACITY}\n");
    }
    text += "[[models]]\nname = \"m\"\n";
    for p in 0..providers {
        text += &format!("[[models.targets]]\nnode = \"n\"\nprovider = \"p{p}\"\n");
    }
    EdgeConfig::from_toml(&text, &|_| None).unwrap_or_else(|e| panic!("{e}\n---\n{text}"))
}

fn bench_lease(c: &mut Criterion) {
    let mut group = c.benchmark_group("lease/acquire_release");
    group.warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_millis(1500)).sample_size(50);
    group.throughput(Throughput::Elements(1));

    for providers in [1usize, 64] {
        let cfg = config(providers);
        let view = PoolView::build(&cfg, None);
        // Large, and drained every iteration: `Lease::drop` never finds it full.
        let (inbox, rx) = mailbox::mailbox::<CoreMsg>(1024);
        let mut shard = Shard::new(0, 1, inbox);
        shard.apply_config(&cfg, &view);
        let (session, _session_rx) = mailbox::mailbox(1);
        let links = vec![LinkRoute { index: 0, worker: 0, session, suspicion: Default::default() }].into();
        let route = NodeRoute { generation: 1, version: 0, links };
        shard.set_route("n", &route);
        shard.node_ready("n", 1);
        let key = ResourceKey::new("n", "p0");

        let name = if providers == 1 { "iop_shard".to_owned() } else { format!("iop_shard_{providers}_providers") };
        group.bench_function(name, |b| {
            b.iter(|| {
                let lease = shard.try_acquire(black_box(&key), LeaseClass::Normal).expect("room");
                black_box(&lease);
                drop(lease);
                match rx.try_recv() {
                    Some(CoreMsg::Release { key, class, load }) => shard.release(&key, class, &load),
                    _ => panic!("the lease posted its release"),
                }
            })
        });
        assert_eq!(shard.in_use(&key), Some((0, 0)), "every lease came back");
    }

    let atomic = AtomicU32::new(0);
    group.bench_function("atomic_u32_cas_baseline", |b| {
        b.iter(|| {
            let acquired =
                atomic.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < CAPACITY).then_some(n + 1)).is_ok();
            black_box(acquired);
            atomic.fetch_sub(1, Ordering::AcqRel);
        })
    });
    let mutex = parking_lot::Mutex::new(0u32);
    group.bench_function("parking_lot_mutex_baseline", |b| {
        b.iter(|| {
            let acquired = {
                let mut n = mutex.lock();
                let room = *n < CAPACITY;
                if room {
                    *n += 1;
                }
                room
            };
            black_box(acquired);
            *mutex.lock() -= 1;
        })
    });
    group.finish();
}

criterion_group!(benches, bench_lease);
criterion_main!(benches);
