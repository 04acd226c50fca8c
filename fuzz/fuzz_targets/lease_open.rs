//! `lease::Opener::open` over arbitrary sealed leases: a lease arrives in a
//! run request from the edge, so its bytes are network input.
//!
//! Input: `[selector, bytes...]`: the selector picks which field the bytes
//! go to whole, or to split among the three (ephemeral key, nonce,
//! ciphertext); one run also seals a real lease and flips the input's
//! bytes into its ciphertext.
//! Invariants: never panics; nothing opens that this run's issuer did not
//! seal unchanged (a flipped or foreign byte is always refused).
#![no_main]

use std::sync::OnceLock;

use iop_core::{
    lease::{Binding, Expect, Issuer, Opener},
    wire::pb,
};
use libfuzzer_sys::fuzz_target;

struct Keys {
    issuer: Issuer,
    opener: Opener,
}

fn keys() -> &'static Keys {
    static K: OnceLock<Keys> = OnceLock::new();
    K.get_or_init(|| Keys {
        issuer: Issuer::generate(std::time::Duration::from_secs(30)).expect("issuer"),
        opener: Opener::generate().expect("opener"),
    })
}

fn expect() -> Expect<'static> {
    Expect {
        node: "n1",
        run: Binding { principal: "", provider: "up", target: "m", route: "chat", profile: "normal", slot: "r" },
        revision: 1,
        generation: 1,
        credential_epoch: Some(0),
        now_ms: 1,
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else { return };
    let k = keys();
    let verify = k.issuer.verify_key();
    let lease = match sel % 4 {
        0 => pb::SealedLease { ciphertext: rest.to_vec().into(), ..Default::default() },
        1 => {
            let a = rest.len().min(32);
            let b = (a + 12).min(rest.len());
            pb::SealedLease {
                ephemeral_key: rest[..a].to_vec().into(),
                nonce: rest[a..b].to_vec().into(),
                ciphertext: rest[b..].to_vec().into(),
            }
        }
        _ => {
            // A real lease with the input xor-ed into it: must never open
            // unless nothing changed.
            let scope = pb::LeaseScope { node: "n1".into(), provider: "up".into(), ..Default::default() };
            let mut sealed = k.issuer.issue(scope, "sk", &k.opener.public_key(), 0).expect("seal");
            let mut ct = sealed.ciphertext.to_vec();
            let mut changed = false;
            for (i, b) in rest.iter().enumerate() {
                if let Some(c) = ct.get_mut(i) {
                    *c ^= b;
                    changed |= *b != 0;
                }
            }
            sealed.ciphertext = ct.into();
            if changed {
                assert!(k.opener.open(&sealed, &verify, &expect()).is_err(), "a changed lease opened");
            }
            return;
        }
    };
    assert!(k.opener.open(&lease, &verify, &expect()).is_err(), "a lease this run never sealed opened");
});
