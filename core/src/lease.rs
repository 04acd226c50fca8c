//! Sealed credential leases (managed mode): provider secrets live on the
//! edge; each run carries its credential sealed to the node that runs it,
//! in a scope binding the edge signs.
//!
//! - [`Issuer`] (edge): an Ed25519 key made at start; [`Issuer::issue`]
//!   signs a [`pb::LeaseScope`] and seals it with the secret to the node's
//!   X25519 key (an ephemeral X25519 key, HKDF-SHA256, ChaCha20-Poly1305).
//! - [`Opener`] (node): the process's X25519 key and a bounded replay
//!   cache; [`Opener::open`] checks a lease against what the run is and
//!   what the node knows, and fails closed with one of [`LeaseError`]'s
//!   seven reasons.

use std::{
    collections::{HashSet, VecDeque},
    time::Duration,
};

use prost::Message;
use ring::{
    aead, hkdf,
    rand::{SecureRandom, SystemRandom},
    signature::{self, Ed25519KeyPair, KeyPair},
};

use crate::{config::Secret, wire::pb};

/// Domain separation of the signature.
const SIGNED_CONTEXT: &[u8] = b"iop-lease-v1";
/// HKDF info of the sealing key.
const SEAL_INFO: &[u8] = b"iop credential lease v1";
/// How long a lease is valid after issue by default.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);
/// Lease ids remembered at most (each until its lease expires).
pub const REPLAY_CACHE_CAPACITY: usize = 1 << 16;

/// Why a lease was refused. Every one fails the run closed: no provider
/// call, no other credential.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LeaseError {
    /// Issued under a credential the edge has since replaced.
    #[error("the credential lease was revoked (the provider's credential changed)")]
    Revoked,
    /// Its provider takes no leased credential here (removed or not leased).
    #[error("the credential lease names a provider that is disabled on this node")]
    Disabled,
    /// Past its expiry.
    #[error("the credential lease has expired")]
    Expired,
    /// From another connection generation or config revision.
    #[error("the credential lease is stale (another generation or config revision)")]
    Stale,
    /// Its id was opened before.
    #[error("the credential lease was already used")]
    Replayed,
    /// Not sealed to this node, or for another node.
    #[error("the credential lease is not for this node")]
    WrongRecipient,
    /// Its binding does not verify or does not match the run.
    #[error("the credential lease does not match the run")]
    Mismatched,
}

impl LeaseError {
    /// The closed label (metrics, logs, error codes).
    pub fn label(self) -> &'static str {
        match self {
            LeaseError::Revoked => "revoked",
            LeaseError::Disabled => "disabled",
            LeaseError::Expired => "expired",
            LeaseError::Stale => "stale",
            LeaseError::Replayed => "replayed",
            LeaseError::WrongRecipient => "wrong_recipient",
            LeaseError::Mismatched => "mismatched",
        }
    }

    /// Its run failure code (`exec::codes`).
    pub fn code(self) -> &'static str {
        use crate::exec::codes;
        match self {
            LeaseError::Revoked => codes::LEASE_REVOKED,
            LeaseError::Disabled => codes::LEASE_DISABLED,
            LeaseError::Expired => codes::LEASE_EXPIRED,
            LeaseError::Stale => codes::LEASE_STALE,
            LeaseError::Replayed => codes::LEASE_REPLAYED,
            LeaseError::WrongRecipient => codes::LEASE_WRONG_RECIPIENT,
            LeaseError::Mismatched => codes::LEASE_MISMATCHED,
        }
    }

    /// Every reason, for closed label sets.
    pub const ALL: [LeaseError; 7] = [
        LeaseError::Revoked,
        LeaseError::Disabled,
        LeaseError::Expired,
        LeaseError::Stale,
        LeaseError::Replayed,
        LeaseError::WrongRecipient,
        LeaseError::Mismatched,
    ];
}

/// Key material could not be made (the system's random source failed).
#[derive(Debug, thiserror::Error)]
#[error("cannot make lease keys: {0}")]
pub struct KeyError(&'static str);

fn random<const N: usize>(rng: &SystemRandom) -> Result<[u8; N], KeyError> {
    let mut b = [0u8; N];
    rng.fill(&mut b).map_err(|_| KeyError("no random bytes"))?;
    Ok(b)
}

/// The AEAD key of one lease: HKDF-SHA256 over the X25519 shared secret,
/// salted with both public keys.
fn seal_key(shared: &[u8; 32], ephemeral: &[u8; 32], recipient: &[u8; 32]) -> Option<aead::LessSafeKey> {
    let mut salt = [0u8; 64];
    salt[..32].copy_from_slice(ephemeral);
    salt[32..].copy_from_slice(recipient);
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, &salt).extract(shared);
    let okm = prk.expand(&[SEAL_INFO], &aead::CHACHA20_POLY1305).ok()?;
    let mut key = [0u8; 32];
    okm.fill(&mut key).ok()?;
    aead::UnboundKey::new(&aead::CHACHA20_POLY1305, &key).ok().map(aead::LessSafeKey::new)
}

/// The edge's signing side.
pub struct Issuer {
    key: Ed25519KeyPair,
    /// Keys [`Issuer::epoch_of`] (never leaves the edge).
    epoch_key: ring::hmac::Key,
    rng: SystemRandom,
    ttl: Duration,
}

impl std::fmt::Debug for Issuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issuer").field("ttl", &self.ttl).finish_non_exhaustive()
    }
}

impl Issuer {
    /// A fresh signing key (never stored); leases valid for `ttl`.
    pub fn generate(ttl: Duration) -> Result<Self, KeyError> {
        let rng = SystemRandom::new();
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).map_err(|_| KeyError("ed25519 key"))?;
        let key = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).map_err(|_| KeyError("ed25519 key"))?;
        let epoch_key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &random::<32>(&rng)?);
        Ok(Self { key, epoch_key, rng, ttl })
    }

    /// The credential epoch of `secret`: changes when the secret does, and
    /// tells nothing about it (a keyed hash, the key never sent).
    pub fn epoch_of(&self, secret: &str) -> u64 {
        let tag = ring::hmac::sign(&self.epoch_key, secret.as_bytes());
        let mut b = [0u8; 8];
        b.copy_from_slice(&tag.as_ref()[..8]);
        u64::from_le_bytes(b)
    }

    /// The public key nodes verify leases with.
    pub fn verify_key(&self) -> Vec<u8> {
        self.key.public_key().as_ref().to_vec()
    }

    /// How long leases are valid.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Signs `scope` (its id, issue and expiry times are set here, from
    /// `now_ms`) and seals it with `secret` to `recipient` (the node's
    /// X25519 public key). `None`: no key of 32 bytes, or no randomness.
    pub fn issue(
        &self,
        mut scope: pb::LeaseScope,
        secret: &str,
        recipient: &[u8],
        now_ms: u64,
    ) -> Option<pb::SealedLease> {
        let recipient: [u8; 32] = recipient.try_into().ok()?;
        scope.lease_id = random::<16>(&self.rng).ok()?.to_vec().into();
        scope.issued_at_ms = now_ms;
        scope.expires_at_ms = now_ms.saturating_add(u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX));
        let scope = scope.encode_to_vec();
        let mut signed = Vec::with_capacity(SIGNED_CONTEXT.len() + scope.len());
        signed.extend_from_slice(SIGNED_CONTEXT);
        signed.extend_from_slice(&scope);
        let signature = self.key.sign(&signed).as_ref().to_vec();
        let plain = pb::LeasePlaintext { scope: scope.into(), signature: signature.into(), secret: secret.to_owned() };
        let ephemeral = x25519_dalek::StaticSecret::from(random::<32>(&self.rng).ok()?);
        let ephemeral_pub = x25519_dalek::PublicKey::from(&ephemeral).to_bytes();
        let shared = ephemeral.diffie_hellman(&x25519_dalek::PublicKey::from(recipient)).to_bytes();
        let key = seal_key(&shared, &ephemeral_pub, &recipient)?;
        let nonce = random::<12>(&self.rng).ok()?;
        let mut sealed = plain.encode_to_vec();
        key.seal_in_place_append_tag(
            aead::Nonce::assume_unique_for_key(nonce),
            aead::Aad::from(&ephemeral_pub),
            &mut sealed,
        )
        .ok()?;
        Some(pb::SealedLease {
            ephemeral_key: ephemeral_pub.to_vec().into(),
            nonce: nonce.to_vec().into(),
            ciphertext: sealed.into(),
        })
    }
}

/// The lease route of a run's operation (a tunnel's is its provider path).
pub fn run_route(operation: i32) -> &'static str {
    match pb::RunOperation::try_from(operation) {
        Ok(pb::RunOperation::Embeddings) => "embeddings",
        Ok(pb::RunOperation::Tokenize) => "tokenize",
        _ => "chat",
    }
}

/// Milliseconds since the Unix epoch, as leases count time.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// What a lease binds of the run it is for (the edge seals it from the
/// run, the node checks it against the run that brought it).
#[derive(Debug, Clone, Copy)]
pub struct Binding<'a> {
    /// The client key's name ("" without API keys).
    pub principal: &'a str,
    pub provider: &'a str,
    pub target: &'a str,
    /// [`run_route`] of a run, a tunnel's provider path.
    pub route: &'a str,
    /// "normal" or "long".
    pub profile: &'a str,
    /// The run or tunnel id.
    pub slot: &'a str,
}

impl Binding<'_> {
    /// A scope with these fields (the rest for the issuer to fill).
    pub fn scope(&self) -> pb::LeaseScope {
        pb::LeaseScope {
            principal: self.principal.to_owned(),
            route: self.route.to_owned(),
            slot: self.slot.to_owned(),
            profile: self.profile.to_owned(),
            target: self.target.to_owned(),
            provider: self.provider.to_owned(),
            ..Default::default()
        }
    }
}

/// What the run that presents a lease is, and what the node knows: the
/// lease must say the same.
#[derive(Debug, Clone)]
pub struct Expect<'a> {
    pub node: &'a str,
    pub run: Binding<'a>,
    /// The node's applied config revision and its link's generation.
    pub revision: u64,
    pub generation: u64,
    /// The provider's current credential epoch; `None`: the provider is
    /// not leased here (or not configured).
    pub credential_epoch: Option<u64>,
    pub now_ms: u64,
}

/// An opened lease: the secret for this one provider call.
pub struct Opened {
    pub secret: Secret,
    pub scope: pb::LeaseScope,
}

/// Lease ids seen, each kept until its lease's expiry; bounded (the oldest
/// go first when full).
#[derive(Default)]
struct ReplayCache {
    ids: HashSet<[u8; 16]>,
    order: VecDeque<(u64, [u8; 16])>,
}

impl ReplayCache {
    /// Records `id`; false when it was seen (and not expired) before.
    fn insert(&mut self, id: [u8; 16], expires_ms: u64, now_ms: u64) -> bool {
        while let Some(&(exp, old)) = self.order.front() {
            if exp > now_ms && self.order.len() < REPLAY_CACHE_CAPACITY {
                break;
            }
            self.order.pop_front();
            self.ids.remove(&old);
        }
        if !self.ids.insert(id) {
            return false;
        }
        self.order.push_back((expires_ms, id));
        true
    }
}

/// The node's opening side: one per process, shared by its links.
pub struct Opener {
    secret: x25519_dalek::StaticSecret,
    public: [u8; 32],
    replay: parking_lot::Mutex<ReplayCache>,
}

impl std::fmt::Debug for Opener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opener").finish_non_exhaustive()
    }
}

impl Opener {
    /// A fresh X25519 key for this process (never stored).
    pub fn generate() -> Result<Self, KeyError> {
        let secret = x25519_dalek::StaticSecret::from(random::<32>(&SystemRandom::new())?);
        let public = x25519_dalek::PublicKey::from(&secret).to_bytes();
        Ok(Self { secret, public, replay: parking_lot::Mutex::new(ReplayCache::default()) })
    }

    /// The public key leases are sealed to.
    pub fn public_key(&self) -> [u8; 32] {
        self.public
    }

    /// Opens `lease` for the run described by `expect`, verified with the
    /// edge's `verify_key`. The checks, in order: sealed to this node's key
    /// (else wrong recipient); signed by the edge (else mismatched); for
    /// this node (wrong recipient); provider leased here (disabled); of the
    /// provider's current credential (revoked); this generation and
    /// revision (stale); not expired; the run's provider, target, route,
    /// profile and slot (mismatched); never opened before (replayed).
    pub fn open(&self, lease: &pb::SealedLease, verify_key: &[u8], expect: &Expect<'_>) -> Result<Opened, LeaseError> {
        let ephemeral: [u8; 32] = lease.ephemeral_key.as_ref().try_into().map_err(|_| LeaseError::WrongRecipient)?;
        let nonce: [u8; 12] = lease.nonce.as_ref().try_into().map_err(|_| LeaseError::WrongRecipient)?;
        let shared = self.secret.diffie_hellman(&x25519_dalek::PublicKey::from(ephemeral)).to_bytes();
        let key = seal_key(&shared, &ephemeral, &self.public).ok_or(LeaseError::WrongRecipient)?;
        let mut buf = lease.ciphertext.to_vec();
        let plain = key
            .open_in_place(aead::Nonce::assume_unique_for_key(nonce), aead::Aad::from(&ephemeral), &mut buf)
            .map_err(|_| LeaseError::WrongRecipient)?;
        let plain = pb::LeasePlaintext::decode(&plain[..]).map_err(|_| LeaseError::Mismatched)?;
        let mut signed = Vec::with_capacity(SIGNED_CONTEXT.len() + plain.scope.len());
        signed.extend_from_slice(SIGNED_CONTEXT);
        signed.extend_from_slice(&plain.scope);
        signature::UnparsedPublicKey::new(&signature::ED25519, verify_key)
            .verify(&signed, &plain.signature)
            .map_err(|_| LeaseError::Mismatched)?;
        let scope = pb::LeaseScope::decode(&plain.scope[..]).map_err(|_| LeaseError::Mismatched)?;
        if scope.node != expect.node {
            return Err(LeaseError::WrongRecipient);
        }
        let run = &expect.run;
        let Some(epoch) = expect.credential_epoch.filter(|_| scope.provider == run.provider) else {
            return Err(if scope.provider == run.provider { LeaseError::Disabled } else { LeaseError::Mismatched });
        };
        if scope.credential_epoch != epoch {
            return Err(LeaseError::Revoked);
        }
        if scope.generation != expect.generation || scope.revision != expect.revision {
            return Err(LeaseError::Stale);
        }
        if expect.now_ms >= scope.expires_at_ms {
            return Err(LeaseError::Expired);
        }
        if scope.target != run.target
            || scope.principal != run.principal
            || scope.route != run.route
            || scope.profile != run.profile
            || scope.slot != run.slot
        {
            return Err(LeaseError::Mismatched);
        }
        let id: [u8; 16] = scope.lease_id.as_ref().try_into().map_err(|_| LeaseError::Mismatched)?;
        if !self.replay.lock().insert(id, scope.expires_at_ms, expect.now_ms) {
            return Err(LeaseError::Replayed);
        }
        Ok(Opened { secret: Secret::new(plain.secret), scope })
    }
}

#[cfg(test)]
#[path = "lease_tests.rs"]
mod tests;
