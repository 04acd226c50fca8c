#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use super::*;

const NOW: u64 = 1_000_000;

fn scope() -> pb::LeaseScope {
    pb::LeaseScope {
        principal: "team-a".into(),
        route: "/v1/chat/completions".into(),
        slot: "run-1".into(),
        profile: "normal".into(),
        target: "gpt-x".into(),
        node: "n1".into(),
        provider: "up".into(),
        revision: 3,
        generation: 7,
        credential_epoch: 2,
        ..Default::default()
    }
}

fn run() -> Binding<'static> {
    Binding {
        principal: "team-a",
        provider: "up",
        target: "gpt-x",
        route: "/v1/chat/completions",
        profile: "normal",
        slot: "run-1",
    }
}

fn expect() -> Expect<'static> {
    Expect { node: "n1", run: run(), revision: 3, generation: 7, credential_epoch: Some(2), now_ms: NOW + 10 }
}

fn setup() -> (Issuer, Opener) {
    (Issuer::generate(Duration::from_secs(30)).unwrap(), Opener::generate().unwrap())
}

fn issue(i: &Issuer, o: &Opener, s: pb::LeaseScope) -> pb::SealedLease {
    i.issue(s, "sk-secret", &o.public_key(), NOW).unwrap()
}

#[test]
fn a_lease_opens_once_for_its_run() {
    let (i, o) = setup();
    let lease = issue(&i, &o, scope());
    let opened = o.open(&lease, &i.verify_key(), &expect()).map_err(|e| e.label()).unwrap();
    assert_eq!(opened.secret.expose(), "sk-secret");
    assert_eq!(opened.scope.expires_at_ms, NOW + 30_000);
    // The secret is not in the sealed bytes.
    assert!(!lease.ciphertext.windows(9).any(|w| w == b"sk-secret"));
    assert_eq!(o.open(&lease, &i.verify_key(), &expect()).err(), Some(LeaseError::Replayed));
}

#[test]
fn each_failure_fails_closed_with_its_reason() {
    let (i, o) = setup();
    let key = i.verify_key();
    let fails = |lease: &pb::SealedLease, e: Expect<'_>| o.open(lease, &key, &e).err();

    // Revoked: the provider's credential changed since issue.
    assert_eq!(
        fails(&issue(&i, &o, scope()), Expect { credential_epoch: Some(3), ..expect() }),
        Some(LeaseError::Revoked)
    );
    // Disabled: the provider takes no leased credential on this node.
    assert_eq!(
        fails(&issue(&i, &o, scope()), Expect { credential_epoch: None, ..expect() }),
        Some(LeaseError::Disabled)
    );
    // Expired.
    assert_eq!(fails(&issue(&i, &o, scope()), Expect { now_ms: NOW + 30_000, ..expect() }), Some(LeaseError::Expired));
    // Stale: another generation, another revision.
    assert_eq!(fails(&issue(&i, &o, scope()), Expect { generation: 8, ..expect() }), Some(LeaseError::Stale));
    assert_eq!(fails(&issue(&i, &o, scope()), Expect { revision: 4, ..expect() }), Some(LeaseError::Stale));
    // Replayed: see a_lease_opens_once_for_its_run; also across runs' checks.
    let lease = issue(&i, &o, scope());
    assert!(o.open(&lease, &key, &expect()).is_ok());
    assert_eq!(fails(&lease, expect()), Some(LeaseError::Replayed));
    // Wrong recipient: sealed to another node's key, or for another node id.
    let other = Opener::generate().unwrap();
    let theirs = i.issue(scope(), "sk-secret", &other.public_key(), NOW).unwrap();
    assert_eq!(fails(&theirs, expect()), Some(LeaseError::WrongRecipient));
    assert_eq!(fails(&issue(&i, &o, scope()), Expect { node: "n2", ..expect() }), Some(LeaseError::WrongRecipient));
    // Mismatched: another run, route, target, profile or provider; a
    // signature of another edge; tampered bytes.
    for e in [
        Expect { run: Binding { slot: "run-2", ..run() }, ..expect() },
        Expect { run: Binding { principal: "team-b", ..run() }, ..expect() },
        Expect { run: Binding { route: "/v1/embeddings", ..run() }, ..expect() },
        Expect { run: Binding { target: "gpt-y", ..run() }, ..expect() },
        Expect { run: Binding { profile: "long", ..run() }, ..expect() },
        Expect { run: Binding { provider: "other", ..run() }, ..expect() },
    ] {
        assert_eq!(fails(&issue(&i, &o, scope()), e), Some(LeaseError::Mismatched));
    }
    let impostor = Issuer::generate(Duration::from_secs(30)).unwrap();
    assert_eq!(
        fails(&impostor.issue(scope(), "sk", &o.public_key(), NOW).unwrap(), expect()),
        Some(LeaseError::Mismatched)
    );
    let mut tampered = issue(&i, &o, scope());
    let mut bytes = tampered.ciphertext.to_vec();
    bytes[3] ^= 1;
    tampered.ciphertext = bytes.into();
    assert_eq!(fails(&tampered, expect()), Some(LeaseError::WrongRecipient), "AEAD refuses a changed byte");
    // Labels are a closed set.
    let labels: Vec<_> = LeaseError::ALL.iter().map(|e| e.label()).collect();
    assert_eq!(labels, ["revoked", "disabled", "expired", "stale", "replayed", "wrong_recipient", "mismatched"]);
}

#[test]
fn the_replay_cache_is_bounded_and_forgets_expired_ids() {
    let mut c = ReplayCache::default();
    assert!(c.insert([1; 16], 100, 0));
    assert!(!c.insert([1; 16], 100, 50));
    // Expired: forgotten (an expired lease fails as expired anyway).
    assert!(c.insert([1; 16], 300, 150));
    for n in 0..(REPLAY_CACHE_CAPACITY + 10) {
        let mut id = [0u8; 16];
        id[..8].copy_from_slice(&(n as u64).to_le_bytes());
        id[15] = 9;
        c.insert(id, u64::MAX, 200);
    }
    assert!(c.order.len() <= REPLAY_CACHE_CAPACITY && c.ids.len() == c.order.len());
}
