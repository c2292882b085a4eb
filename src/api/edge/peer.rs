//! Who a connection comes from, for the per-peer caps: an IPv4 address, or an IPv6 prefix (one
//! host is usually given a whole /64, so counting its addresses one by one would let it take
//! every slot).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// One peer: the unit a per-peer cap counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Peer {
    /// An IPv4 address (also when it arrives IPv4-mapped on an IPv6 socket).
    V4(Ipv4Addr),
    /// An IPv6 address with every bit past `prefix` cleared.
    V6 { network: Ipv6Addr, prefix: u8 },
}

impl Peer {
    /// The peer `ip` belongs to, IPv6 addresses grouped by their first `ipv6_prefix` bits
    /// (0..=128).
    pub(crate) fn of(ip: IpAddr, ipv6_prefix: u8) -> Peer {
        match ip {
            IpAddr::V4(v4) => Peer::V4(v4),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Peer::V4(v4),
                None => {
                    let prefix = ipv6_prefix.min(128);
                    let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
                    Peer::V6 {
                        network: Ipv6Addr::from(u128::from(v6) & mask),
                        prefix,
                    }
                }
            },
        }
    }
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Peer::V4(v4) => write!(f, "{v4}"),
            Peer::V6 { network, prefix } => write!(f, "{network}/{prefix}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(ip: &str, prefix: u8) -> Peer {
        Peer::of(ip.parse().unwrap(), prefix)
    }

    #[test]
    fn ipv4_addresses_are_peers_of_their_own() {
        assert_ne!(of("10.0.0.1", 64), of("10.0.0.2", 64));
        assert_eq!(of("::ffff:10.0.0.1", 64), of("10.0.0.1", 64), "IPv4-mapped");
        assert_eq!(of("10.0.0.1", 64).to_string(), "10.0.0.1");
    }

    #[test]
    fn ipv6_addresses_are_grouped_by_prefix() {
        let a = of("2001:db8:1:2:aaaa::1", 64);
        assert_eq!(a, of("2001:db8:1:2:ffff:ffff:ffff:ffff", 64), "one /64");
        assert_ne!(a, of("2001:db8:1:3::1", 64), "the next /64");
        assert_eq!(a.to_string(), "2001:db8:1:2::/64");
        assert_eq!(
            of("2001:db8:1:2::1", 48),
            of("2001:db8:1:3::1", 48),
            "one /48"
        );
        assert_ne!(of("::1", 128), of("::2", 128), "/128: each address");
        assert_eq!(of("::1", 0), of("2001:db8::1", 0), "/0: one peer");
    }
}
