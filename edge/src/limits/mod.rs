//! Per-address limits on what a peer that has shown no credential can make
//! the edge do: the node listener's handshake slots ([`handshakes`]), TLS
//! handshakes on both listeners ([`tls`]), and failed credential checks,
//! one table per kind of credential ([`failures`]). Each is a bounded table
//! behind a `parking_lot` lock, taken at accept or on a failed check (cold
//! paths), never per request of an authenticated peer.

pub mod failures;
pub mod handshakes;
pub mod tls;

use std::net::IpAddr;

/// What a per-address limit counts by: one IPv4 address, or one IPv6 /64
/// (the usual allocation to one host or site: its owner has all of it).
/// Under pressure the failure table merges addresses into their network:
/// IPv4 /24, IPv6 /48.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AddrKey {
    /// An IPv4 address (an IPv4-mapped IPv6 one counts as IPv4).
    V4(u32),
    /// The top 64 bits of an IPv6 address.
    V6(u64),
    /// An IPv4 /24: the top 24 bits.
    V4Net(u32),
    /// An IPv6 /48: the top 48 bits.
    V6Net(u64),
}

impl AddrKey {
    /// The key of a peer's address.
    pub fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => AddrKey::V4(u32::from(v4)),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => AddrKey::V4(u32::from(v4)),
                None => AddrKey::V6((u128::from(v6) >> 64) as u64),
            },
        }
    }

    /// The network this key merges into under pressure (None for a network).
    pub fn network(self) -> Option<Self> {
        match self {
            AddrKey::V4(a) => Some(AddrKey::V4Net(a >> 8)),
            AddrKey::V6(p) => Some(AddrKey::V6Net(p >> 16)),
            AddrKey::V4Net(_) | AddrKey::V6Net(_) => None,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn key(s: &str) -> AddrKey {
        AddrKey::of(s.parse().unwrap())
    }

    #[test]
    fn keys_and_networks() {
        assert_eq!(key("10.1.2.3"), AddrKey::V4(0x0a01_0203));
        assert_eq!(key("::ffff:10.1.2.3"), key("10.1.2.3"));
        assert_eq!(key("2001:db8:1:2::1"), key("2001:db8:1:2:ffff::9"));
        assert_ne!(key("2001:db8:1:2::1"), key("2001:db8:1:3::1"));
        assert_eq!(key("10.1.2.3").network(), key("10.1.2.200").network());
        assert_ne!(key("10.1.2.3").network(), key("10.1.3.3").network());
        assert_eq!(key("2001:db8:1:2::1").network(), key("2001:db8:1:ffff::1").network());
        assert_ne!(key("2001:db8:1:2::1").network(), key("2001:db8:2:2::1").network());
        assert_eq!(key("10.1.2.3").network().and_then(AddrKey::network), None);
    }
}
