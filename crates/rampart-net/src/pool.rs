//! The address pool: each sandbox slot owns one /31 of the configured IPv4 block.
//!
//! Slot `n` of the pool `B/p` gets the pair `B + 2n` (the host side, the sandbox's gateway)
//! and `B + 2n + 1` (the sandbox). The mapping is a pure function of the slot, and the store
//! gives every alive sandbox a unique slot, so a restarted daemon finds every address again
//! without keeping any state of its own.

use crate::NetError;
use std::net::Ipv4Addr;

/// Prefix length of each sandbox's point-to-point link (RFC 3021 /31: no network or broadcast
/// address, so the link holds exactly the gateway and the sandbox).
pub const LINK_PREFIX_LEN: u8 = 31;

/// An IPv4 block handed out as /31 pairs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressPool {
    base: u32,
    prefix_len: u8,
}

impl AddressPool {
    /// Parses `a.b.c.d/len` (`len` 8..=30; host bits must be zero).
    pub fn parse(cidr: &str) -> Result<AddressPool, NetError> {
        let bad = |reason: &'static str| NetError::Pool {
            cidr: cidr.into(),
            reason,
        };
        let (addr, len) = cidr
            .split_once('/')
            .ok_or_else(|| bad("expected a.b.c.d/len"))?;
        let addr: Ipv4Addr = addr.parse().map_err(|_| bad("not an IPv4 address"))?;
        let prefix_len: u8 = len.parse().map_err(|_| bad("bad prefix length"))?;
        if !(8..=30).contains(&prefix_len) {
            return Err(bad("the prefix length must be between 8 and 30"));
        }
        let base = u32::from(addr);
        if base & !mask(prefix_len) != 0 {
            return Err(bad("host bits are set"));
        }
        Ok(AddressPool { base, prefix_len })
    }

    /// The block's first address.
    pub fn base(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.base)
    }

    /// The block's prefix length.
    pub fn prefix_len(&self) -> u8 {
        self.prefix_len
    }

    /// How many sandboxes the block holds.
    pub fn capacity(&self) -> u32 {
        // prefix_len >= 8, so this fits.
        ((1u64 << (32 - u32::from(self.prefix_len))) / 2) as u32
    }

    /// The (gateway, sandbox) addresses of `slot`, if the block holds it.
    pub fn pair(&self, slot: u32) -> Option<(Ipv4Addr, Ipv4Addr)> {
        if slot >= self.capacity() {
            return None;
        }
        let gw = self.base + 2 * slot;
        Some((Ipv4Addr::from(gw), Ipv4Addr::from(gw + 1)))
    }

    /// The slot whose sandbox address is `addr`.
    pub fn slot_of(&self, addr: Ipv4Addr) -> Option<u32> {
        let a = u32::from(addr);
        if !self.contains(addr) || a & 1 == 0 {
            return None;
        }
        Some((a - self.base) / 2)
    }

    /// Whether `addr` is in the block.
    pub fn contains(&self, addr: Ipv4Addr) -> bool {
        u32::from(addr) & mask(self.prefix_len) == self.base
    }
}

impl std::fmt::Display for AddressPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.base(), self.prefix_len)
    }
}

fn mask(len: u8) -> u32 {
    if len == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_are_deterministic_and_disjoint() {
        let p = AddressPool::parse("10.201.0.0/16").unwrap();
        assert_eq!(p.capacity(), 32768);
        assert_eq!(
            p.pair(0),
            Some((Ipv4Addr::new(10, 201, 0, 0), Ipv4Addr::new(10, 201, 0, 1)))
        );
        assert_eq!(
            p.pair(300),
            Some((Ipv4Addr::new(10, 201, 2, 88), Ipv4Addr::new(10, 201, 2, 89)))
        );
        assert_eq!(
            p.pair(32767),
            Some((
                Ipv4Addr::new(10, 201, 255, 254),
                Ipv4Addr::new(10, 201, 255, 255)
            ))
        );
        assert_eq!(p.pair(32768), None);
        for s in [0, 1, 300, 32767] {
            let (gw, sb) = p.pair(s).unwrap();
            assert_eq!(p.slot_of(sb), Some(s));
            assert_eq!(p.slot_of(gw), None);
        }
        assert_eq!(p.slot_of(Ipv4Addr::new(10, 202, 0, 1)), None);
    }

    #[test]
    fn bad_pools_are_refused() {
        for bad in [
            "10.201.0.0",
            "10.201.0.1/16",
            "10.201.0.0/31",
            "10.0.0.0/7",
            "x/16",
            "10.201.0.0/abc",
        ] {
            assert!(AddressPool::parse(bad).is_err(), "{bad}");
        }
        let p = AddressPool::parse("198.18.4.0/30").unwrap();
        assert_eq!(p.capacity(), 2);
        assert_eq!(p.to_string(), "198.18.4.0/30");
    }
}
