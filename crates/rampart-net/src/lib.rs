//! Per-sandbox networks: a veth pair per sandbox wired over netlink, an address pool, and
//! one nftables table that confines every sandbox link.
//!
//! # Wiring
//!
//! A sandbox with network (policy mode other than `none`) gets, right after its PID 1 starts
//! and before its create is answered ([`Net::wire`]):
//!
//! - a veth pair made with one `RTM_NEWLINK`: the host side `<prefix><8 hex digits of the
//!   sandbox address>` (`rsv0ac90001`: at most 15 characters, unique on the host as long as
//!   two daemons use disjoint pools) and its peer created straight inside the network
//!   namespace of the sandbox's PID 1 (`IFLA_NET_NS_PID`) under the name `eth0`;
//! - host side: IPv6 disabled (`disable_ipv6`, so it has no link-local address), the gateway
//!   address `/31`, up;
//! - sandbox side (on a short-lived thread that `setns()`s into `/proc/<pid>/ns/net` and
//!   opens its own rtnetlink socket there): IPv6 disabled, the sandbox address `/31`, up, a
//!   default route via the gateway. Loopback was brought up by the jailer.
//!
//! Addresses come from an [`AddressPool`] (default `10.201.0.0/16`): slot `n` (the uid slot
//! the store gives each alive sandbox) gets gateway `base + 2n` and sandbox `base + 2n + 1`.
//! Nothing about a sandbox's network is stored besides its policy: a restarted daemon
//! re-derives every [`NetHandle`] from the slot ([`Net::handle`]).
//!
//! Failure at any step deletes the host link (which deletes its peer). [`Net::unwire`]
//! deletes it too and is idempotent; it runs before the sandbox is killed, so that the name
//! is free at once for the slot's next sandbox (a dying network namespace would otherwise
//! release it some time later). [`Net::leftovers`] lists this daemon's links (prefix and
//! pool) whose slot is not alive, for removal at start: a daemon killed with `kill -9`
//! mid-create leaves nothing behind once it restarts.
//!
//! # Firewall
//!
//! One table of our own, `inet rampart` ([`FirewallSpec::document`]), loaded once at daemon
//! start with `nft -j -f -` (Debian package `nftables`) as an atomic replace of a previous
//! version. Other tables are never touched. Every rule is keyed on the link-name prefix, so
//! the table never changes while the daemon runs: creating a sandbox makes no nft call.
//!
//! - `sandbox_raw` (prerouting, priority raw, before connection tracking), from a sandbox
//!   link: IPv6 dropped; a source outside the pool dropped; anti-spoofing: `fib saddr . iif
//!   oif missing` drops a source not routed back through the link it came in on, and `fib
//!   saddr type != unicast` drops the gateway's (local) address, so with a /31 per link the
//!   only source that passes is that sandbox's own address; destinations in 0/8, 127/8,
//!   169.254/16 (cloud metadata) and 224/3 dropped; to any of the host's own addresses only
//!   port 53 (TCP or UDP) passes, everything else dropped (host services, the daemon's API);
//!   other addresses of the pool (other sandboxes) dropped.
//! - `sandbox_nat` (prerouting, dstnat): TCP and UDP port 53 redirected to the host's DNS
//!   resolver port (`dns_port`, default 15053), every other TCP connection redirected to the
//!   egress proxy port (`proxy_port`, default 15001). The proxy reads the original
//!   destination with `SO_ORIGINAL_DST` and knows the sandbox by the (verified) source.
//! - `sandbox_input`: from a sandbox link only TCP to the proxy port and TCP/UDP to the
//!   resolver port are accepted; the rest is dropped.
//! - `sandbox_forward`: nothing is routed from or to a sandbox link (no sandbox-to-sandbox,
//!   no raw IP, ICMP or UDP out). All egress is the proxy's own connections.
//! - `sandbox_output`: towards a sandbox link the host sends only packets of connections the
//!   sandbox opened (`ct state established,related`); it opens none.
//!
//! `route_localnet` must be 0 ([`FirewallSpec::install`] refuses otherwise); it is 0 by
//! default and nothing here changes it.
//!
//! The table stays while the daemon is down: sandboxes keep running across a restart and
//! must stay confined. A new start replaces it (same name) atomically.

pub mod firewall;
pub mod pool;
mod rtnl;

pub use firewall::FirewallSpec;
pub use pool::{AddressPool, LINK_PREFIX_LEN};

use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;

/// Default sandbox address block.
pub const DEFAULT_POOL: &str = "10.201.0.0/16";
/// Default prefix of the host-side link names.
pub const DEFAULT_LINK_PREFIX: &str = "rsv";
/// Default nftables table name (family `inet`).
pub const DEFAULT_TABLE: &str = "rampart";
/// Default host port of the DNS resolver the sandboxes' DNS is redirected to.
pub const DEFAULT_DNS_PORT: u16 = 15053;
/// Default host port of the egress proxy the sandboxes' TCP is redirected to.
pub const DEFAULT_PROXY_PORT: u16 = 15001;
/// Name of the sandbox-side link.
pub const SANDBOX_IFNAME: &str = "eth0";

/// Errors of the network layer.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// An address pool that is not `a.b.c.d/len` with `len` 8..=30 and no host bits.
    #[error("network configuration: address pool {cidr:?}: {reason}")]
    Pool {
        /// The pool as written.
        cidr: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A link prefix that is not 1 to 7 of `a-z0-9`.
    #[error("network configuration: link prefix {prefix:?}: 1 to 7 characters of a-z and 0-9")]
    LinkPrefix {
        /// The prefix.
        prefix: String,
    },
    /// An nftables table name that is not 1 to 64 letters, digits and `_`.
    #[error("network configuration: table name {name:?}: letters, digits and _")]
    Table {
        /// The name.
        name: String,
    },
    /// `dns_port` or `proxy_port` zero, or the two the same.
    #[error("network configuration: dns_port and proxy_port must be two different non-zero ports")]
    Ports,
    /// A pid that is not positive.
    #[error("network configuration: bad pid {pid}")]
    Pid {
        /// The pid.
        pid: i32,
    },
    /// The thread wiring the sandbox's namespace panicked.
    #[error("network configuration: the netns thread panicked")]
    ThreadPanicked,
    /// `route_localnet` is on: sandboxes could reach the host's loopback.
    #[error("network configuration: {path} is not 0: sandboxes could reach the host's loopback")]
    RouteLocalnet {
        /// The sysctl file.
        path: &'static str,
    },
    /// The slot has no address in the pool.
    #[error("slot {slot} is outside the address pool {pool} ({capacity} sandboxes)")]
    PoolExhausted {
        /// The slot.
        slot: u32,
        /// The pool.
        pool: String,
        /// How many slots the pool holds.
        capacity: u32,
    },
    /// A netlink or system call failed.
    #[error("{step}: {source}")]
    Sys {
        /// What was being done.
        step: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The nftables document could not be encoded.
    #[error("nftables: encoding: {0}")]
    NftEncode(#[source] serde_json::Error),
    /// Running `nft`, or talking to it, failed.
    #[error("nftables: {step}: {source}")]
    NftIo {
        /// What was being done.
        step: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// `nft` refused the document. `stderr` is nft's own text.
    #[error("nftables: nft failed ({status}): {stderr}")]
    NftFailed {
        /// How it exited.
        status: std::process::ExitStatus,
        /// What it printed on stderr (trimmed).
        stderr: String,
    },
}

fn sys(step: impl Into<String>) -> impl FnOnce(std::io::Error) -> NetError {
    let step = step.into();
    move |source| NetError::Sys { step, source }
}

/// Configuration of the network layer.
#[derive(Debug, Clone)]
pub struct NetConfig {
    /// The sandbox address block, handed out as /31 pairs.
    pub pool: AddressPool,
    /// Prefix of host-side link names (1 to 7 characters of `[a-z0-9]`).
    pub link_prefix: String,
    /// nftables table name (family `inet`).
    pub table: String,
    /// Host port of the DNS resolver.
    pub dns_port: u16,
    /// Host port of the egress proxy.
    pub proxy_port: u16,
}

impl Default for NetConfig {
    fn default() -> Self {
        NetConfig {
            pool: AddressPool::parse(DEFAULT_POOL).unwrap_or_else(|_| unreachable!()),
            link_prefix: DEFAULT_LINK_PREFIX.into(),
            table: DEFAULT_TABLE.into(),
            dns_port: DEFAULT_DNS_PORT,
            proxy_port: DEFAULT_PROXY_PORT,
        }
    }
}

/// A wired sandbox's network, as derived from its slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetHandle {
    /// The sandbox's slot.
    pub slot: u32,
    /// Host-side link name.
    pub host_if: String,
    /// Host-side address: the sandbox's gateway, DNS server and proxy address.
    pub gateway: Ipv4Addr,
    /// The sandbox's address (on its `eth0`).
    pub address: Ipv4Addr,
    /// Prefix length of both addresses (31).
    pub prefix_len: u8,
}

/// The network layer of one daemon.
#[derive(Debug, Clone)]
pub struct Net {
    cfg: NetConfig,
}

impl Net {
    /// Checks the configuration. Touches nothing on the host.
    pub fn new(cfg: NetConfig) -> Result<Net, NetError> {
        let p = &cfg.link_prefix;
        if p.is_empty()
            || p.len() > 7
            || !p
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        {
            return Err(NetError::LinkPrefix { prefix: p.clone() });
        }
        let t = &cfg.table;
        if t.is_empty()
            || t.len() > 64
            || !t.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        {
            return Err(NetError::Table { name: t.clone() });
        }
        if cfg.dns_port == 0 || cfg.proxy_port == 0 || cfg.dns_port == cfg.proxy_port {
            return Err(NetError::Ports);
        }
        Ok(Net { cfg })
    }

    /// The configuration.
    pub fn config(&self) -> &NetConfig {
        &self.cfg
    }

    /// The firewall table of this configuration.
    pub fn firewall(&self) -> FirewallSpec {
        FirewallSpec {
            table: self.cfg.table.clone(),
            link_prefix: self.cfg.link_prefix.clone(),
            pool: self.cfg.pool,
            dns_port: self.cfg.dns_port,
            proxy_port: self.cfg.proxy_port,
        }
    }

    /// Loads (or replaces) the firewall table. Run once at daemon start.
    pub fn install_firewall(&self) -> Result<(), NetError> {
        self.firewall().install()
    }

    /// The handle of `slot` (pure: nothing is checked on the host).
    pub fn handle(&self, slot: u32) -> Result<NetHandle, NetError> {
        let pool = &self.cfg.pool;
        let (gateway, address) = pool.pair(slot).ok_or_else(|| NetError::PoolExhausted {
            slot,
            pool: pool.to_string(),
            capacity: pool.capacity(),
        })?;
        Ok(NetHandle {
            slot,
            host_if: format!("{}{:08x}", self.cfg.link_prefix, u32::from(address)),
            gateway,
            address,
            prefix_len: LINK_PREFIX_LEN,
        })
    }

    /// The slot of a host-side link name of this daemon (prefix and pool), if it is one.
    pub fn slot_of_link(&self, name: &str) -> Option<u32> {
        let hex = name.strip_prefix(self.cfg.link_prefix.as_str())?;
        if hex.len() != 8 {
            return None;
        }
        let a = u32::from_str_radix(hex, 16).ok()?;
        self.cfg.pool.slot_of(Ipv4Addr::from(a))
    }

    /// Wires the network namespace of process `pid1` (a sandbox's PID 1) to the host, as
    /// `slot`. On error nothing is left. Blocking (a few netlink round trips).
    pub fn wire(&self, pid1: i32, slot: u32) -> Result<NetHandle, NetError> {
        let h = self.handle(slot)?;
        let pid = u32::try_from(pid1)
            .ok()
            .filter(|&p| p > 0)
            .ok_or(NetError::Pid { pid: pid1 })?;
        // Opened first: a pid that is gone (or reused later) fails here, not halfway.
        let ns = std::fs::File::open(format!("/proc/{pid}/ns/net"))
            .map_err(sys(format!("opening the network namespace of pid {pid}")))?;
        let mut rt = rtnl::Rtnl::open().map_err(sys("opening rtnetlink"))?;
        rt.add_veth(&h.host_if, SANDBOX_IFNAME, pid)
            .map_err(sys(format!("creating veth {}", h.host_if)))?;
        let r = self.configure(&mut rt, &h, &ns);
        if r.is_err() {
            if let Err(e) = rt.del_link(&h.host_if) {
                tracing::warn!(link = %h.host_if, "removing a half-wired link: {e}");
            }
        }
        r.map(|()| h)
    }

    fn configure(
        &self,
        rt: &mut rtnl::Rtnl,
        h: &NetHandle,
        ns: &std::fs::File,
    ) -> Result<(), NetError> {
        let idx = rtnl::if_index(&h.host_if).map_err(sys(format!("index of {}", h.host_if)))?;
        disable_ipv6(&h.host_if)?;
        rt.add_addr(idx, h.gateway, h.prefix_len)
            .map_err(sys(format!("address of {}", h.host_if)))?;
        rt.set_up(idx)
            .map_err(sys(format!("bringing {} up", h.host_if)))?;
        let fd = ns.as_raw_fd();
        let (addr, gw, len) = (h.address, h.gateway, h.prefix_len);
        std::thread::scope(|s| {
            std::thread::Builder::new()
                .name("rampart-net-ns".into())
                .spawn_scoped(s, move || inside(fd, addr, gw, len))
                .map_err(sys("starting the netns thread"))?
                .join()
                .unwrap_or(Err(NetError::ThreadPanicked))
        })
    }

    /// Removes the host link of `slot` (and with it the sandbox side). Idempotent.
    pub fn unwire(&self, slot: u32) -> Result<(), NetError> {
        let h = self.handle(slot)?;
        self.remove_link(&h.host_if)
    }

    /// Deletes a link by name; a missing one is fine.
    pub fn remove_link(&self, name: &str) -> Result<(), NetError> {
        let mut rt = rtnl::Rtnl::open().map_err(sys("opening rtnetlink"))?;
        rt.del_link(name).map_err(sys(format!("deleting {name}")))
    }

    /// This daemon's host links (its prefix, its pool) whose slot is not in `live`.
    pub fn leftovers(&self, live: &[u32]) -> Result<Vec<String>, NetError> {
        Ok(self
            .links()?
            .into_iter()
            .filter(|(_, slot)| !live.contains(slot))
            .map(|(name, _)| name)
            .collect())
    }

    /// This daemon's host links and their slots.
    pub fn links(&self) -> Result<Vec<(String, u32)>, NetError> {
        let rd = std::fs::read_dir("/sys/class/net").map_err(sys("listing /sys/class/net"))?;
        let mut out: Vec<(String, u32)> = rd
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_str()?.to_owned();
                let slot = self.slot_of_link(&name)?;
                Some((name, slot))
            })
            .collect();
        out.sort();
        Ok(out)
    }
}

/// Turns IPv6 off on a link of the calling thread's network namespace.
fn disable_ipv6(ifname: &str) -> Result<(), NetError> {
    let p = format!("/proc/sys/net/ipv6/conf/{ifname}/disable_ipv6");
    match std::fs::write(&p, b"1") {
        Ok(()) => Ok(()),
        // A kernel without IPv6 has nothing to turn off.
        Err(e)
            if e.kind() == std::io::ErrorKind::NotFound
                && !std::path::Path::new("/proc/sys/net/ipv6").exists() =>
        {
            Ok(())
        }
        Err(e) => Err(sys(format!("writing {p}"))(e)),
    }
}

/// The sandbox side, on a thread of its own that enters the sandbox's network namespace
/// (the thread ends right after, so its namespace goes with it).
fn inside(ns_fd: i32, addr: Ipv4Addr, gw: Ipv4Addr, len: u8) -> Result<(), NetError> {
    // SAFETY: setns(2) on a valid namespace fd; CLONE_NEWNET only changes this thread's
    // network namespace, and this thread exits when done.
    let r = unsafe { libc::setns(ns_fd, libc::CLONE_NEWNET) };
    if r != 0 {
        return Err(sys("entering the sandbox's network namespace")(
            std::io::Error::last_os_error(),
        ));
    }
    disable_ipv6(SANDBOX_IFNAME)?;
    let mut rt = rtnl::Rtnl::open().map_err(sys("opening rtnetlink in the sandbox"))?;
    let idx = rtnl::if_index(SANDBOX_IFNAME).map_err(sys("index of eth0"))?;
    rt.add_addr(idx, addr, len)
        .map_err(sys("address of eth0"))?;
    rt.set_up(idx).map_err(sys("bringing eth0 up"))?;
    rt.add_default_route(idx, gw)
        .map_err(sys("default route of the sandbox"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_derive_from_slots() {
        let net = Net::new(NetConfig::default()).unwrap();
        let h = net.handle(3).unwrap();
        assert_eq!(h.host_if, "rsv0ac90007");
        assert!(h.host_if.len() <= 15);
        assert_eq!(h.gateway, Ipv4Addr::new(10, 201, 0, 6));
        assert_eq!(h.address, Ipv4Addr::new(10, 201, 0, 7));
        assert_eq!(net.slot_of_link("rsv0ac90007"), Some(3));
        assert_eq!(net.slot_of_link("rsv0ac90006"), None);
        assert_eq!(net.slot_of_link("rsv0aca0007"), None);
        assert_eq!(net.slot_of_link("eth0"), None);
        assert!(net.handle(40_000).is_err());
    }

    #[test]
    fn bad_configs_are_refused() {
        for (prefix, table, dns, proxy) in [
            ("", "rampart", 1, 2),
            ("toolongx", "rampart", 1, 2),
            ("RSV", "rampart", 1, 2),
            ("rsv", "a-b", 1, 2),
            ("rsv", "rampart", 5, 5),
            ("rsv", "rampart", 0, 2),
        ] {
            let cfg = NetConfig {
                link_prefix: prefix.into(),
                table: table.into(),
                dns_port: dns,
                proxy_port: proxy,
                ..NetConfig::default()
            };
            assert!(Net::new(cfg).is_err(), "{prefix} {table} {dns} {proxy}");
        }
    }
}
