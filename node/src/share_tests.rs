#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use iop_core::rt::mailbox::{self, Receiver};

use super::*;
use crate::run::Class;

fn table(edges: usize, cap: u32, long: u32) -> (Arc<Shares>, Arc<Gates>) {
    let gates = Gates::new();
    gates.set_long("p", long);
    gates.configure("p", cap + long);
    (Shares::new(edges, gates.clone()), gates)
}

fn join(t: &Arc<Shares>, edge: usize) -> (Membership, pb::CapacityShares, Receiver<pb::CapacityShares>) {
    let (tx, rx) = mailbox::mailbox(64);
    let (m, mine) = t.join(edge, tx);
    (m, mine, rx)
}

/// The newest announcement waiting in `rx`.
fn last(rx: &Receiver<pb::CapacityShares>) -> Option<pb::CapacityShares> {
    let mut out = None;
    while let Some(m) = rx.try_recv() {
        out = Some(m);
    }
    out
}

fn normal(s: &pb::CapacityShares) -> u32 {
    s.shares.iter().find(|p| p.provider == "p").map_or(0, |p| p.normal)
}

fn demand(epoch: u64, in_use: u32, waiting: u32) -> pb::ShareDemand {
    pb::ShareDemand {
        applied_epoch: epoch,
        providers: vec![pb::ProviderDemand { provider: "p".into(), in_use_normal: in_use, in_use_long: 0, waiting }],
    }
}

#[test]
fn targets_are_max_min_fair_and_add_up() {
    assert_eq!(targets(8, &[0, 0], &[true, true]), [4, 4]);
    assert_eq!(targets(8, &[10, 0], &[true, true]), [8, 0]);
    assert_eq!(targets(8, &[6, 0], &[true, true]), [7, 1]);
    assert_eq!(targets(9, &[10, 10, 1], &[true, true, true]), [4, 4, 1]);
    assert_eq!(targets(8, &[3, 3], &[true, false]), [8, 0]);
    assert_eq!(targets(7, &[0, 0, 0], &[true, true, true]), [3, 2, 2]);
    assert_eq!(targets(0, &[5, 5], &[true, true]), [0, 0]);
    assert_eq!(targets(8, &[5, 5], &[false, false]), [0, 0]);
}

#[test]
fn a_second_edge_grows_only_into_what_the_first_gave_up() {
    let (t, _) = table(2, 8, 0);
    let (_a, a_ready, a_rx) = join(&t, 0);
    assert_eq!(normal(&a_ready), 8, "alone, the whole capacity");
    let (_b, b_ready, b_rx) = join(&t, 1);
    // A shrinks at once; B gets nothing A may still be using.
    let a_now = last(&a_rx).expect("A's share shrank");
    assert_eq!(normal(&a_now), 4);
    assert_eq!(normal(&b_ready), 0);
    // A applied the shrink (using 2): B grows into the rest, all of it shared.
    t.report(0, &demand(a_now.epoch, 2, 0));
    let b_now = normal(&last(&b_rx).expect("B grew"));
    let a_share = t.of(0)[0].1[0];
    assert!(b_now > 0 && a_share >= 2, "{a_share} {b_now}");
    assert_eq!(a_share + b_now, 8);
}

/// Every first share has an epoch of its own, even one of nothing: an edge
/// that joins while another holds the whole capacity must be able to
/// acknowledge it and report its demand (an edge reports demand only once
/// it has applied an announcement). Before, edges not yet linked were
/// given a share of 0 by every rebalance, so their first share on joining
/// was "unchanged" and went out with epoch 0.
#[test]
fn a_first_share_has_an_epoch_even_when_it_is_nothing() {
    let (t, _) = table(3, 4, 0);
    let (_a, a_ready, a_rx) = join(&t, 0);
    assert_eq!(normal(&a_ready), 4);
    // A is busy: everything it has is in use and more waits.
    t.report(0, &demand(a_ready.epoch, 4, 9));
    let (b, b_ready, _b_rx) = join(&t, 1);
    assert_eq!(normal(&b_ready), 0, "A still uses all of it");
    assert!(b_ready.epoch > a_ready.epoch, "B's first share has no epoch of its own: {b_ready:?}");
    // B leaves and comes back: again a first share, again its own epoch.
    drop(b);
    let (_b2, b_again, _) = join(&t, 1);
    assert!(b_again.epoch > b_ready.epoch, "{b_again:?}");
    let _ = last(&a_rx);
}

#[test]
fn a_shrinking_share_drains_and_slots_in_use_are_never_handed_out() {
    let (t, _) = table(2, 8, 0);
    let (_a, _, a_rx) = join(&t, 0);
    let (_b, _, b_rx) = join(&t, 1);
    let epoch = last(&a_rx).unwrap().epoch;
    // A acknowledges but still holds 6 (from when it had 8).
    t.report(0, &demand(epoch, 6, 0));
    assert!(normal(&last(&b_rx).unwrap()) <= 2, "only what A does not use");
    // A drains to nothing and acknowledges what it was sent: an even split.
    let epoch = last(&a_rx).map_or(epoch, |a| a.epoch);
    t.report(0, &demand(epoch, 0, 0));
    let epoch = last(&a_rx).map_or(epoch, |a| a.epoch);
    t.report(0, &demand(epoch, 0, 0));
    assert_eq!(normal(&last(&b_rx).unwrap()), 4);
    assert_eq!(t.of(0)[0].1[0], 4);
}

#[test]
fn demand_moves_the_shares() {
    let (t, _) = table(2, 10, 0);
    let (_a, _, a_rx) = join(&t, 0);
    let (_b, _, b_rx) = join(&t, 1);
    let ea = last(&a_rx).unwrap().epoch;
    t.report(0, &demand(ea, 0, 0));
    let eb = last(&b_rx).unwrap().epoch;
    // B is busy and queues; A is idle.
    t.report(1, &demand(eb, 5, 7));
    let a_now = last(&a_rx).unwrap();
    assert_eq!(normal(&a_now), 0);
    t.report(0, &demand(a_now.epoch, 0, 0));
    assert_eq!(normal(&last(&b_rx).unwrap()), 10);
}

#[test]
fn a_gone_edge_gives_its_share_back_once_its_runs_end() {
    let (t, gates) = table(2, 8, 0);
    let gate = gates.configure("p", 8);
    let (a, _, a_rx) = join(&t, 0);
    let (_b, _, b_rx) = join(&t, 1);
    t.report(0, &demand(last(&a_rx).unwrap().epoch, 0, 0));
    t.report(1, &demand(last(&b_rx).unwrap().epoch, 4, 4));
    // A holds 3 runs at this node when its link goes.
    for _ in 0..3 {
        assert!(gate.try_take(Class::Normal, 0));
    }
    drop(a);
    assert_eq!(normal(&last(&b_rx).unwrap()), 5, "all but A's 3 running");
    for _ in 0..3 {
        gate.give(Class::Normal, 0);
    }
    t.drained(0);
    assert_eq!(normal(&last(&b_rx).unwrap()), 8);
}

#[test]
fn classes_are_shared_apart() {
    let (t, _) = table(2, 4, 2);
    let (_a, _, a_rx) = join(&t, 0);
    let (_b, b_ready, b_rx) = join(&t, 1);
    assert_eq!(b_ready.shares[0].long, 0);
    t.report(0, &demand(last(&a_rx).unwrap().epoch, 0, 0));
    let b = last(&b_rx).unwrap();
    assert_eq!((b.shares[0].normal, b.shares[0].long), (2, 1));
}

/// Random joins, leaves, reports and runs: what the edges may act on (the
/// largest share each holds unacknowledged, or its in-use count) never adds
/// up past the capacity, and with every edge idle and acknowledged, the
/// whole capacity is shared out.
#[test]
fn shares_in_force_never_exceed_the_capacity() {
    const EDGES: usize = 4;
    const CAP: u32 = 13;
    let (t, gates) = table(EDGES, CAP, 0);
    let gate = gates.configure("p", CAP);
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut rnd = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    // Per edge: membership, announcements, applied share and epoch, runs held.
    let mut edges: Vec<Option<(Membership, Receiver<pb::CapacityShares>)>> = (0..EDGES).map(|_| None).collect();
    let mut applied = [(0u32, 0u64); EDGES];
    let mut running = [0u32; EDGES];
    for _ in 0..20_000 {
        let e = rnd(EDGES as u64) as usize;
        match rnd(10) {
            0 => {
                if edges[e].is_none() {
                    let (m, mine, rx) = join(&t, e);
                    applied[e] = (normal(&mine), mine.epoch);
                    edges[e] = Some((m, rx));
                } else {
                    // Gone: its runs end at this node (cancelled).
                    edges[e] = None;
                    applied[e] = (0, 0);
                    for _ in 0..running[e] {
                        gate.give(Class::Normal, e);
                    }
                    running[e] = 0;
                    t.drained(e);
                }
            }
            1..=4 => {
                // Admit within the applied share (the gate is the backstop).
                if edges[e].is_some() && running[e] < applied[e].0 {
                    assert!(gate.try_take(Class::Normal, e), "an edge within its share was refused at the gate");
                    running[e] += 1;
                }
            }
            5..=6 => {
                if running[e] > 0 {
                    gate.give(Class::Normal, e);
                    running[e] -= 1;
                }
            }
            _ => {
                if let Some((_, rx)) = &edges[e] {
                    if let Some(a) = last(rx) {
                        if a.epoch > applied[e].1 {
                            applied[e] = (normal(&a), a.epoch);
                        }
                    }
                    t.report(e, &demand(applied[e].1, running[e], rnd(3) as u32));
                }
            }
        }
        let in_force: u32 = (0..EDGES).map(|i| applied[i].0.max(running[i])).sum();
        assert!(in_force <= CAP, "shares in force {in_force} > {CAP}: {applied:?} {running:?}");
    }
    // Settle: everything ends, every edge acknowledges twice.
    for (e, n) in running.iter_mut().enumerate() {
        for _ in 0..*n {
            gate.give(Class::Normal, e);
        }
        *n = 0;
    }
    for _ in 0..3 {
        for (e, link) in edges.iter().enumerate() {
            if let Some((_, rx)) = link {
                if let Some(a) = last(rx) {
                    applied[e] = (normal(&a), a.epoch);
                }
                t.report(e, &demand(applied[e].1, 0, 0));
            }
        }
    }
    let connected = edges.iter().filter(|e| e.is_some()).count();
    if connected > 0 {
        let total: u32 = (0..EDGES).filter(|&i| edges[i].is_some()).map(|i| applied[i].0).sum();
        assert_eq!(total, CAP, "idle and acknowledged, the whole capacity is shared: {applied:?}");
    }
}
