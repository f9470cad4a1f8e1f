//! Host-side enforcement of a sandbox's network policy.
//!
//! The network wiring (rampart-net) sends every TCP connection a sandbox opens to this crate's
//! egress proxy (nftables `redirect` to `proxy_port`) and every DNS query (udp/tcp 53) to its
//! resolver (`dns_port`). Here each is matched to the sandbox by its source address and judged
//! by the sandbox's [`NetworkPolicy`]:
//!
//! - the **resolver** answers only names the policy allows (forwarding them upstream),
//!   NXDOMAIN otherwise, and pins the addresses it answered to the name (per sandbox);
//! - the **proxy** reads the original destination (`SO_ORIGINAL_DST`), refuses always-blocked
//!   addresses, reads the TLS SNI or HTTP Host of the first bytes, and lets the connection
//!   through only if the name is allowed *and* the destination is an address the resolver
//!   answered for it (or an IP/CIDR rule allows the address), then splices both ways;
//! - plain HTTP, and TLS to hosts a **secret** is bound to (terminated with a leaf certificate
//!   from the sandbox's own CA), is relayed request by request: every request must name the
//!   destination the connection was judged by, gets the secret only where its binding says
//!   (and over plain HTTP only when the binding says `http://host`), and every response is
//!   scrubbed of the sandbox's secret values on its way back; raw relaying starts only after
//!   a `101` to a WebSocket upgrade or a 2xx to a CONNECT;
//! - every decision goes into the sandbox's **network log** and to the event hook.
//!
//! # Public API (for rampart-core)
//!
//! ```text
//! Egress::start(EgressConfig) -> Result<Egress, EgressError>          (inside a tokio runtime)
//! egress.attach(id, sandbox_ip, gateway_ip, NetworkPolicy, Vec<SecretSpec>) -> Result<Attachment>
//! egress.set_policy(id, NetworkPolicy) -> Result<()>     (new connections at once; live ones cut)
//! egress.set_secrets(id, Vec<SecretSpec>) -> Result<Vec<SecretInfo>>
//! egress.detach(id) -> bool                              (cuts its connections, removes its CA)
//! egress.reattach(id, ip, gw, policy, secrets) -> Result<Attachment>   (after a daemon restart)
//! egress.ca_cert_pem(id) -> Option<String>        (its CA: with secrets or a registry allowed)
//! egress.log(id, after_seq, limit) -> Option<Vec<NetLogEntry>>
//! egress.subscribe(id) -> Option<broadcast::Receiver<NetLogEntry>>       (for `?follow=1`)
//! egress.take_events() -> Option<mpsc::Receiver<NetEvent>>              (audit hook, once)
//! egress.refresh_host_addrs() -> Result<()>; egress.proxy_port(); egress.dns_port()
//! egress.serve_connection(TcpStream, sandbox_ip, dst).await   (a connection obtained otherwise)
//! egress.secrets(id) -> Option<Vec<SecretInfo>>; egress.policy(id) -> Option<NetworkPolicy>
//! egress.dropped_events(id) -> u64                  (entries the event hook lost to a full queue)
//! validate_policy(&NetworkPolicy) -> Result<(), RuleError>             (for create/PUT checks)
//! validate_secrets(&[SecretSpec]) -> Result<(), EgressError>
//! policy_needs_ca(&NetworkPolicy) -> bool     (a registry allowed: attach makes a CA, see packages)
//! host_addrs(); host_networks(); resolv_conf_nameservers(path)             (helpers)
//! ```
//!
//! Secret values live only in this process's memory: they are in no log entry, error, `Debug`
//! output or [`SecretInfo`]. The sandbox sees `rampart-secret-<name>-<random>` placeholders.

#![deny(missing_docs)]

pub mod ask;
#[cfg(feature = "bench")]
pub mod bench;
mod dns;
mod limits;
mod netlog;
pub mod packages;
pub mod peek;
pub mod policy;
mod proxy;
mod secrets;
mod tls;
pub mod upstream;

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use ipnet::IpNet;
use rampart_types::network::{NetLogEntry, NetworkPolicy, SecretInfo, SecretSpec};
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

pub use netlog::NetEvent;
pub use policy::{Decision, RuleError};

use crate::limits::Limiters;
use crate::netlog::NetLog;
use crate::policy::{Blocklist, CompiledPolicy};
use crate::secrets::BoundSecret;
use crate::tls::SandboxCa;

/// Errors of the egress crate. Never contain a secret value.
#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    /// A policy rule did not parse.
    #[error(transparent)]
    Rule(#[from] RuleError),
    /// A secret spec is not acceptable.
    #[error("invalid secret {name:?}: {reason}")]
    InvalidSecret {
        /// The secret's name.
        name: String,
        /// Why.
        reason: String,
    },
    /// Two secrets share a name or an env var.
    #[error("duplicate secret name or env var {0:?}")]
    DuplicateSecret(String),
    /// No sandbox with this id is attached.
    #[error("sandbox {0} is not attached to the egress proxy")]
    NotAttached(String),
    /// The id is already attached, or its address is in use by another attached sandbox.
    #[error("sandbox {0} is already attached, or its address is in use")]
    AlreadyAttached(String),
    /// The sandbox id cannot be used as a file name.
    #[error("invalid sandbox id {0:?}")]
    InvalidId(String),
    /// An entry of [`EgressConfig::blocked`] that is neither a CIDR nor an address.
    #[error("egress config: blocked: {value:?} is not a CIDR")]
    Blocked {
        /// The entry as written.
        value: String,
    },
    /// [`EgressConfig::listen`] is empty.
    #[error("egress config: no listen address")]
    NoListen,
    /// A sandbox's secret placeholders could not be encoded.
    #[error("egress config: {0}")]
    Placeholders(#[source] serde_json::Error),
    /// Certificates or TLS configuration: what was being made, and why it failed.
    #[error("tls: {what}: {source}")]
    Tls {
        /// What was being made (`CA`, `leaf`, `server config`, ...).
        what: &'static str,
        /// Why.
        #[source]
        source: TlsCause,
    },
    /// A PEM of [`EgressConfig::extra_upstream_roots`] holds no certificate.
    #[error("tls: extra upstream root: no certificate in PEM")]
    NoRootInPem,
    /// An I/O error, with what was being done.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// The library error under [`EgressError::Tls`].
#[derive(Debug, thiserror::Error)]
pub enum TlsCause {
    /// Making a key or a certificate.
    #[error(transparent)]
    Certificate(#[from] rcgen::Error),
    /// Building a TLS configuration, or adding a root.
    #[error(transparent)]
    Rustls(#[from] rustls::Error),
    /// Reading a PEM.
    #[error(transparent)]
    Pem(#[from] rustls::pki_types::pem::Error),
}

impl EgressError {
    pub(crate) fn io(what: &str, source: std::io::Error) -> Self {
        EgressError::Io {
            what: what.to_string(),
            source,
        }
    }
}

/// How the egress service runs.
#[derive(Debug, Clone)]
pub struct EgressConfig {
    /// Addresses the proxy and the resolver listen on (default `0.0.0.0`; connections from
    /// peers that are not an attached sandbox are closed, queries get NXDOMAIN).
    pub listen: Vec<IpAddr>,
    /// TCP port of the egress proxy (default 15001; 0 picks a free port, see
    /// [`Egress::proxy_port`]).
    pub proxy_port: u16,
    /// UDP and TCP port of the resolver (default 15053; 0 picks a free port).
    pub dns_port: u16,
    /// Upstream resolvers; empty means the `nameserver`s of the host's `/etc/resolv.conf`.
    pub upstream_dns: Vec<SocketAddr>,
    /// Extra PEM roots trusted for upstream TLS of intercepted connections (tests).
    pub extra_upstream_roots: Vec<String>,
    /// Where per-sandbox CA keys and secret placeholders are kept (mode 0700 directory).
    pub state_dir: PathBuf,
    /// Extra CIDRs that are always blocked (the sandbox address pool, the daemon's network).
    pub blocked: Vec<String>,
    /// Entries kept per sandbox network log (default 2048; the audit log keeps them all).
    pub log_capacity: usize,
    /// How long the proxy waits for a connection's first bytes before treating it as raw TCP.
    pub peek_timeout: Duration,
    /// Whether a sandbox whose policy allows a package registry gets a CA at attach, so that
    /// the registries' HTTPS is intercepted and its downloads recorded (default `true`; the
    /// template builder, which does not put the CA into its steps' trust store, says `false`).
    pub record_packages: bool,
    /// Ranges a sandbox's upstream SOCKS5 proxy may be in besides public addresses (the
    /// operator's own proxies on private networks; tests' hosts).
    pub upstream_proxy_allow: Vec<IpNet>,
}

impl Default for EgressConfig {
    fn default() -> Self {
        EgressConfig {
            listen: vec![IpAddr::V4(Ipv4Addr::UNSPECIFIED)],
            proxy_port: 15001,
            dns_port: 15053,
            upstream_dns: Vec::new(),
            extra_upstream_roots: Vec::new(),
            state_dir: PathBuf::from("/var/lib/rampart/egress"),
            blocked: Vec::new(),
            log_capacity: 2048,
            peek_timeout: Duration::from_secs(5),
            record_packages: true,
            upstream_proxy_allow: Vec::new(),
        }
    }
}

/// What a sandbox needs from its attachment.
#[derive(Clone, PartialEq, Eq)]
pub struct Attachment {
    /// The sandbox's CA certificate (PEM), for its trust store, when it was attached with
    /// secrets or with a policy that allows a package registry ([`policy_needs_ca`]; `None`
    /// otherwise: TLS is intercepted only for hosts a secret is bound to and for the
    /// registries). Its key never leaves the daemon.
    pub ca_cert_pem: Option<String>,
    /// Environment variables to set in the sandbox: `(env, placeholder)` of each secret with
    /// an `env`.
    pub env: Vec<(String, String)>,
    /// The secrets as the API shows them (placeholders, no values).
    pub secrets: Vec<SecretInfo>,
}

impl std::fmt::Debug for Attachment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attachment")
            .field("env", &self.env)
            .field("secrets", &self.secrets)
            .finish_non_exhaustive()
    }
}

/// Checks a policy's rules without attaching anything (the first bad rule is the error).
pub fn validate_policy(policy: &NetworkPolicy) -> Result<(), RuleError> {
    CompiledPolicy::compile(policy).map(|_| ())
}

/// Whether a sandbox attached with `policy` gets a CA even without secrets: the policy
/// allows a package registry, whose TLS is intercepted to record what is fetched
/// ([`packages::REGISTRY_HOSTS`]). Its certificate must then be in the sandbox's trust
/// store from the start ([`Attachment::ca_cert_pem`]).
pub fn policy_needs_ca(policy: &NetworkPolicy) -> bool {
    CompiledPolicy::compile(policy).is_ok_and(|c| registries_allowed(&c))
}

fn registries_allowed(c: &CompiledPolicy) -> bool {
    packages::REGISTRY_HOSTS
        .iter()
        .any(|h| c.decide_dns(h).allowed())
}

/// Checks secret specs without attaching anything.
pub fn validate_secrets(specs: &[SecretSpec]) -> Result<(), EgressError> {
    build_secrets(specs, &HashMap::new()).map(|_| ())
}

fn build_secrets(
    specs: &[SecretSpec],
    placeholders: &HashMap<String, String>,
) -> Result<Vec<Arc<BoundSecret>>, EgressError> {
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for s in specs {
        if !seen.insert(format!("name:{}", s.name)) {
            return Err(EgressError::DuplicateSecret(s.name.clone()));
        }
        if let Some(env) = &s.env {
            if !seen.insert(format!("env:{env}")) {
                return Err(EgressError::DuplicateSecret(env.clone()));
            }
        }
        out.push(Arc::new(BoundSecret::new(
            s,
            placeholders.get(&s.name).cloned(),
        )?));
    }
    Ok(out)
}

/// A live proxied connection (to cut it when the policy changes).
#[derive(Debug)]
pub(crate) struct LiveConn {
    pub ip: IpAddr,
    pub port: u16,
    pub name: Option<String>,
    pub cancel: CancellationToken,
    /// The rule that cut it, if it was cut.
    pub cut: Mutex<Option<String>>,
}

/// One attached sandbox.
#[derive(Debug)]
pub(crate) struct Sandbox {
    pub ip: IpAddr,
    pub policy: RwLock<Arc<CompiledPolicy>>,
    pub limiters: RwLock<Arc<Limiters>>,
    pub secrets: RwLock<Arc<Vec<Arc<BoundSecret>>>>,
    /// Made when the sandbox first has secrets (at attach or by `set_secrets`), before the
    /// secrets are in force: every sandbox with secrets has one.
    pub ca: RwLock<Option<Arc<SandboxCa>>>,
    pins: Mutex<Pins>,
    pub log: NetLog,
    pub conns: Mutex<HashMap<u64, Arc<LiveConn>>>,
    pub gone: CancellationToken,
    /// Open TCP connections of this sandbox to the resolver.
    pub dns_tcp: std::sync::atomic::AtomicUsize,
    /// Connections of this sandbox held by the proxy.
    pub open_conns: std::sync::atomic::AtomicUsize,
    /// Hosts its approval policy asks about (see [`ask`]).
    pub ask: RwLock<Arc<Vec<policy::Rule>>>,
    /// Decisions on asked hosts (`host:port`), pending or kept.
    pub asked: Mutex<HashMap<String, Arc<tokio::sync::OnceCell<ask::Answer>>>>,
}

/// At most this many DNS queries of one sandbox in flight (more UDP ones are dropped).
pub(crate) const DNS_INFLIGHT_PER_SANDBOX: usize = 64;
/// At most this many TCP connections of one sandbox to the resolver.
pub(crate) const DNS_TCP_PER_SANDBOX: usize = 16;
/// At most this many live proxied connections per sandbox (each holds two daemon fds).
pub(crate) const CONNS_PER_SANDBOX: usize = 1024;

/// Pins live at least this long, whatever the TTL.
const MIN_PIN: Duration = Duration::from_secs(60);
/// And at most this long.
const MAX_PIN: Duration = Duration::from_secs(24 * 3600);
/// At most this many pins (address, name) per sandbox.
const MAX_PINS: usize = 16_384;

/// The addresses a sandbox's resolver answered, each with the names it answered it for and
/// until when. Bounded in (address, name) pairs, not addresses: a wildcard zone can answer
/// any number of names with one address, and every name would otherwise stay for up to the
/// maximum pin life (the daemon's memory, at the rate of the sandbox's queries).
#[derive(Debug, Default)]
struct Pins {
    map: HashMap<IpAddr, HashMap<String, Instant>>,
    pairs: usize,
}

impl Pins {
    /// Pins `name` to `addrs` until `until`; when full, expired pins make room, and a new
    /// pin that still does not fit is not made (known pins are still extended).
    fn add(&mut self, name: &str, addrs: &[IpAddr], until: Instant, now: Instant) {
        if self.pairs + addrs.len() > MAX_PINS {
            self.map.retain(|_, names| {
                names.retain(|_, t| *t > now);
                !names.is_empty()
            });
            self.pairs = self.map.values().map(HashMap::len).sum();
        }
        for a in addrs {
            let a = policy::canonical(*a);
            let known = self.map.get(&a).is_some_and(|n| n.contains_key(name));
            if !known && self.pairs >= MAX_PINS {
                continue;
            }
            let t = self
                .map
                .entry(a)
                .or_default()
                .entry(name.to_string())
                .or_insert(until);
            if *t < until {
                *t = until;
            }
            if !known {
                self.pairs += 1;
            }
        }
    }

    fn names(&self, ip: IpAddr) -> Option<&HashMap<String, Instant>> {
        self.map.get(&policy::canonical(ip))
    }
}

impl Sandbox {
    pub fn policy(&self) -> Arc<CompiledPolicy> {
        self.policy
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
    pub fn secrets(&self) -> Arc<Vec<Arc<BoundSecret>>> {
        self.secrets
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
    pub fn ca(&self) -> Option<Arc<SandboxCa>> {
        self.ca.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
    pub fn limiters(&self) -> Arc<Limiters> {
        self.limiters
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Records that the resolver answered `name` with `addrs` (TTL in seconds).
    pub fn pin(&self, name: &str, addrs: &[IpAddr], ttl: u32) {
        let life = Duration::from_secs(ttl as u64).clamp(MIN_PIN, MAX_PIN);
        let now = Instant::now();
        self.pins
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .add(name, addrs, now + life, now);
    }

    pub fn is_pinned(&self, ip: IpAddr, name: &str) -> bool {
        let pins = self.pins.lock().unwrap_or_else(|e| e.into_inner());
        pins.names(ip)
            .and_then(|n| n.get(name))
            .is_some_and(|t| *t > Instant::now())
    }

    pub fn pinned_names(&self, ip: IpAddr) -> Vec<String> {
        let pins = self.pins.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        pins.names(ip)
            .map(|n| {
                n.iter()
                    .filter(|(_, t)| **t > now)
                    .map(|(k, _)| k.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The verdict for a connection under the current policy.
    pub fn decide(
        &self,
        blocklist: &Blocklist,
        ip: IpAddr,
        port: u16,
        name: Option<&str>,
    ) -> Decision {
        self.policy().decide_conn(
            policy::ConnQuery { ip, port, name },
            blocklist,
            &|n| self.is_pinned(ip, n),
            &|| self.pinned_names(ip),
        )
    }
}

/// The [`ask::HostAsker`] of the node.
#[derive(Clone)]
pub(crate) struct AskerRef(pub Arc<dyn ask::HostAsker>);

impl std::fmt::Debug for AskerRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AskerRef")
    }
}

/// Daemon-wide state shared by the listeners.
#[derive(Debug)]
pub(crate) struct Inner {
    pub sandboxes: RwLock<HashMap<String, Arc<Sandbox>>>,
    pub by_ip: RwLock<HashMap<IpAddr, Arc<Sandbox>>>,
    pub blocklist: RwLock<Arc<Blocklist>>,
    pub client_tls: Arc<rustls::ClientConfig>,
    pub upstream_dns: Vec<SocketAddr>,
    pub events: Option<mpsc::Sender<NetEvent>>,
    pub next_conn: AtomicU64,
    pub extra_blocked: Vec<IpNet>,
    pub state_dir: PathBuf,
    pub log_capacity: usize,
    pub peek_timeout: Duration,
    pub record_packages: bool,
    /// Fair admission of DNS queries (per sandbox, across all listeners).
    pub dns_gate: Arc<dns::DnsGate>,
    /// Who decides held connections (none: they are refused).
    pub asker: RwLock<Option<AskerRef>>,
    /// See [`EgressConfig::upstream_proxy_allow`].
    pub upstream_proxy_allow: Vec<IpNet>,
}

impl Inner {
    pub fn by_ip(&self, ip: IpAddr) -> Option<Arc<Sandbox>> {
        self.by_ip
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&policy::canonical(ip))
            .cloned()
    }
    pub fn blocklist(&self) -> Arc<Blocklist> {
        self.blocklist
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
    fn rebuild_blocklist(&self, host: Option<HostView>) {
        let sandboxes: Vec<IpAddr> = self
            .by_ip
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .copied()
            .collect();
        let mut bl = self.blocklist.write().unwrap_or_else(|e| e.into_inner());
        let (host, host_nets) = match host {
            Some(h) => (h.addrs, h.nets),
            None => (bl.host.clone(), bl.host_nets.clone()),
        };
        *bl = Arc::new(Blocklist {
            host,
            host_nets,
            extra: self.extra_blocked.clone(),
            sandboxes,
        });
    }
}

/// The running egress service: the proxy and resolver listeners plus the attached sandboxes.
/// Dropping it stops the listeners and cuts every connection.
#[derive(Debug)]
pub struct Egress {
    inner: Arc<Inner>,
    stop: CancellationToken,
    events_rx: Mutex<Option<mpsc::Receiver<NetEvent>>>,
    proxy_port: u16,
    dns_port: u16,
}

impl Drop for Egress {
    fn drop(&mut self) {
        self.stop.cancel();
        for sb in self
            .inner
            .sandboxes
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
        {
            sb.gone.cancel();
        }
    }
}

/// Why the daemon may not connect to `ip` on a client's behalf (a webhook, a registry pull,
/// anything added later), or None: a special or private range
/// ([`policy::refused_special`]), or an address of the host itself on any of its links,
/// read at each call so that an address added since is refused too; unless the operator
/// allows a range that holds it (`allow`). When the host's addresses cannot be read, every
/// address not allowed is refused (fail closed).
pub fn refused_on_behalf(ip: IpAddr, allow: &[IpNet]) -> Option<&'static str> {
    let ip = policy::canonical(ip);
    if allow.iter().any(|n| n.contains(&ip)) {
        return None;
    }
    if let Some(why) = policy::refused_special(ip, &[]) {
        return Some(why);
    }
    match host_addrs() {
        Ok(own) if own.iter().any(|a| policy::canonical(*a) == ip) => Some("this host's own"),
        Ok(_) => None,
        Err(_) => Some("unverifiable (this host's addresses cannot be read)"),
    }
}

/// The addresses of the host's interfaces (this network namespace's).
pub fn host_addrs() -> Result<Vec<IpAddr>, EgressError> {
    let addrs = nix::ifaddrs::getifaddrs()
        .map_err(|e| EgressError::io("getifaddrs", std::io::Error::from(e)))?;
    let mut out = Vec::new();
    for a in addrs {
        let Some(sa) = a.address else { continue };
        if let Some(v4) = sa.as_sockaddr_in() {
            out.push(IpAddr::V4(v4.ip()));
        } else if let Some(v6) = sa.as_sockaddr_in6() {
            out.push(IpAddr::V6(v6.ip()));
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// The networks attached to the host's interfaces (this network namespace's): each address
/// with its prefix.
pub fn host_networks() -> Result<Vec<IpNet>, EgressError> {
    let addrs = nix::ifaddrs::getifaddrs()
        .map_err(|e| EgressError::io("getifaddrs", std::io::Error::from(e)))?;
    let mut out = Vec::new();
    for a in addrs {
        let (Some(sa), Some(mask)) = (a.address, a.netmask) else {
            continue;
        };
        let net = if let (Some(v4), Some(m)) = (sa.as_sockaddr_in(), mask.as_sockaddr_in()) {
            ipnet::Ipv4Net::with_netmask(v4.ip(), m.ip())
                .ok()
                .map(|n| IpNet::V4(n.trunc()))
        } else if let (Some(v6), Some(m)) = (sa.as_sockaddr_in6(), mask.as_sockaddr_in6()) {
            ipnet::Ipv6Net::with_netmask(v6.ip(), m.ip())
                .ok()
                .map(|n| IpNet::V6(n.trunc()))
        } else {
            None
        };
        out.extend(net);
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// The host's addresses and attached networks, as the blocklist holds them.
#[derive(Debug, Clone)]
pub(crate) struct HostView {
    addrs: Vec<IpAddr>,
    nets: Vec<IpNet>,
}

fn host_view() -> Result<HostView, EgressError> {
    Ok(HostView {
        addrs: host_addrs()?,
        nets: host_networks()?,
    })
}

/// The `nameserver`s of a resolv.conf, on port 53.
pub fn resolv_conf_nameservers(path: &Path) -> Vec<SocketAddr> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            (it.next() == Some("nameserver"))
                .then(|| it.next())
                .flatten()
        })
        .filter_map(|a| a.split('%').next()?.parse::<IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, 53))
        .collect()
}

fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Raises the process's soft limit on open files to its hard limit (best effort). The proxy
/// holds two descriptors per connection, up to [`CONNS_PER_SANDBOX`] connections per
/// sandbox: at the usual soft limit of 1,024 (systemd's default for services) one sandbox
/// opening connections would leave the daemon no descriptor for its API, store and agents.
fn raise_open_files_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < hard {
            if let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
                tracing::warn!("egress: cannot raise the open files limit from {soft}: {e}");
            }
        }
    }
}

/// Tries of [`bind_dns`] for a port the system picks.
const DNS_BIND_TRIES: usize = 32;

/// The resolver's UDP socket and TCP listener on `ip`, on one port number: `port`, or when
/// it is 0 one the system picks for UDP that is also free for TCP (the two port spaces are
/// separate: the UDP port may be a TCP connection's local port), tried again if it is not.
async fn bind_dns(
    ip: IpAddr,
    port: u16,
) -> Result<(tokio::net::UdpSocket, tokio::net::TcpListener), EgressError> {
    let mut tries = 0;
    loop {
        let u = tokio::net::UdpSocket::bind(SocketAddr::new(ip, port))
            .await
            .map_err(|e| EgressError::io(&format!("bind dns udp {ip}:{port}"), e))?;
        let p = u
            .local_addr()
            .map_err(|e| EgressError::io("dns", e))?
            .port();
        match tokio::net::TcpListener::bind(SocketAddr::new(ip, p)).await {
            Ok(t) => return Ok((u, t)),
            Err(e)
                if port == 0
                    && e.kind() == std::io::ErrorKind::AddrInUse
                    && tries + 1 < DNS_BIND_TRIES =>
            {
                tries += 1;
            }
            Err(e) => return Err(EgressError::io(&format!("bind dns tcp {ip}:{p}"), e)),
        }
    }
}

impl Egress {
    /// Checks that the upstream proxy `p` resolves, and only to addresses the daemon may dial
    /// for a caller (see [`upstream`]): what a create or a policy change naming it is refused
    /// for, before anything is made.
    pub async fn check_upstream_proxy(
        &self,
        p: &rampart_types::UpstreamProxy,
    ) -> std::io::Result<()> {
        let bl = self.inner.blocklist();
        upstream::resolve_proxy(p, &self.inner.upstream_proxy_allow, &bl)
            .await
            .map(|_| ())
    }

    /// Binds the proxy and the resolver and starts serving (must be called inside a tokio
    /// runtime). Reads the host's addresses and resolvers. Raises the process's soft limit
    /// on open files to its hard limit.
    pub async fn start(cfg: EgressConfig) -> Result<Egress, EgressError> {
        raise_open_files_limit();
        let extra_blocked = cfg
            .blocked
            .iter()
            .map(|s| {
                s.parse::<IpNet>()
                    .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
                    .map_err(|_| EgressError::Blocked { value: s.clone() })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let upstream_dns = if cfg.upstream_dns.is_empty() {
            resolv_conf_nameservers(Path::new("/etc/resolv.conf"))
        } else {
            cfg.upstream_dns.clone()
        };
        if upstream_dns.is_empty() {
            tracing::warn!("egress: no upstream DNS resolver (none configured, none in /etc/resolv.conf): allowed names will get SERVFAIL");
        }
        if cfg.listen.is_empty() {
            return Err(EgressError::NoListen);
        }
        std::fs::create_dir_all(&cfg.state_dir).map_err(|e| EgressError::io("state dir", e))?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&cfg.state_dir, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| EgressError::io("state dir", e))?;
        }
        let client_tls = tls::upstream_client_config(&cfg.extra_upstream_roots)?;
        let (etx, erx) = mpsc::channel(8192);
        let inner = Arc::new(Inner {
            sandboxes: RwLock::new(HashMap::new()),
            by_ip: RwLock::new(HashMap::new()),
            blocklist: RwLock::new(Arc::new(Blocklist::default())),
            client_tls,
            upstream_dns,
            events: Some(etx),
            next_conn: AtomicU64::new(1),
            extra_blocked,
            state_dir: cfg.state_dir.clone(),
            log_capacity: cfg.log_capacity,
            peek_timeout: cfg.peek_timeout,
            record_packages: cfg.record_packages,
            dns_gate: Arc::new(dns::DnsGate::default()),
            asker: RwLock::new(None),
            upstream_proxy_allow: cfg.upstream_proxy_allow.clone(),
        });
        inner.rebuild_blocklist(Some(host_view()?));
        let stop = CancellationToken::new();
        let mut proxy_port = cfg.proxy_port;
        let mut dns_port = cfg.dns_port;
        // Everything is bound before anything is served: a failed bind leaves no listener
        // of this call behind (dropped sockets close; a spawned task would have kept its own).
        let mut bound = Vec::with_capacity(cfg.listen.len());
        for ip in &cfg.listen {
            let l = tokio::net::TcpListener::bind(SocketAddr::new(*ip, proxy_port))
                .await
                .map_err(|e| EgressError::io(&format!("bind proxy {ip}:{proxy_port}"), e))?;
            proxy_port = l
                .local_addr()
                .map_err(|e| EgressError::io("proxy", e))?
                .port();
            let (u, t) = bind_dns(*ip, dns_port).await?;
            dns_port = u
                .local_addr()
                .map_err(|e| EgressError::io("dns", e))?
                .port();
            bound.push((l, u, t));
        }
        for (l, u, t) in bound {
            tokio::spawn(proxy::serve(l, inner.clone(), stop.clone()));
            tokio::spawn(dns::serve_udp(Arc::new(u), inner.clone(), stop.clone()));
            tokio::spawn(dns::serve_tcp(t, inner.clone(), stop.clone()));
        }
        // Host addresses change (links come and go): refresh them now and then.
        {
            let inner = inner.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(Duration::from_secs(30)) => {}
                    }
                    if let Ok(h) = host_view() {
                        inner.rebuild_blocklist(Some(h));
                    }
                }
            });
        }
        Ok(Egress {
            inner,
            stop,
            events_rx: Mutex::new(Some(erx)),
            proxy_port,
            dns_port,
        })
    }

    /// The port the proxy listens on.
    pub fn proxy_port(&self) -> u16 {
        self.proxy_port
    }

    /// The port the resolver listens on (UDP and TCP).
    pub fn dns_port(&self) -> u16 {
        self.dns_port
    }

    /// Re-reads the host's addresses (always blocked) and the networks attached to its
    /// interfaces (not reached by `open` mode without a rule). Also done on every attach
    /// and every 30 seconds.
    pub fn refresh_host_addrs(&self) -> Result<(), EgressError> {
        self.inner.rebuild_blocklist(Some(host_view()?));
        Ok(())
    }

    /// The event hook: every log entry of every sandbox, for the audit log. Can be taken once;
    /// entries are dropped (not blocked on) when the receiver lags by 8192.
    pub fn take_events(&self) -> Option<mpsc::Receiver<NetEvent>> {
        self.events_rx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    fn sandbox(&self, id: &str) -> Result<Arc<Sandbox>, EgressError> {
        self.inner
            .sandboxes
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned()
            .ok_or_else(|| EgressError::NotAttached(id.to_string()))
    }

    fn state_dir(&self, id: &str) -> PathBuf {
        self.inner.state_dir.join(id)
    }

    fn load_placeholders(&self, id: &str) -> HashMap<String, String> {
        std::fs::read(self.state_dir(id).join("placeholders.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    /// Writes the placeholders of `id` for a restarted daemon (not synced: see
    /// [`SandboxCa::load_or_create`]). Without secrets there is nothing to keep: a stale file
    /// is removed and no directory is made (no file work on the create path of a sandbox
    /// without secrets).
    fn save_placeholders(&self, id: &str, secrets: &[Arc<BoundSecret>]) -> Result<(), EgressError> {
        if secrets.is_empty() {
            match std::fs::remove_file(self.state_dir(id).join("placeholders.json")) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(EgressError::io("remove placeholders", e))
                }
                _ => return Ok(()),
            }
        }
        std::fs::create_dir_all(self.state_dir(id)).map_err(|e| EgressError::io("state dir", e))?;
        let map: HashMap<&str, &str> = secrets
            .iter()
            .map(|s| (s.name.as_str(), s.placeholder.as_str()))
            .collect();
        let data = serde_json::to_vec(&map).map_err(EgressError::Placeholders)?;
        let path = self.state_dir(id).join("placeholders.json");
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, data)
            .and_then(|_| std::fs::rename(&tmp, &path))
            .map_err(|e| EgressError::io("write placeholders", e))
    }

    /// Starts enforcing `policy` for the sandbox at `sandbox_ip`. `gateway_ip` (the host side
    /// of its link) is blocked like every host address. A sandbox with secrets gets its CA
    /// (for the TLS interception of the hosts they are bound to) and its placeholders, kept
    /// in `state_dir/<id>/`; one without gets neither and nothing is written. A sandbox
    /// attached again with the same id after a daemon restart keeps its CA and its
    /// placeholders (from `state_dir`).
    pub fn attach(
        &self,
        id: &str,
        sandbox_ip: IpAddr,
        gateway_ip: IpAddr,
        policy: NetworkPolicy,
        secrets: Vec<SecretSpec>,
    ) -> Result<Attachment, EgressError> {
        self.attach_as(id, sandbox_ip, gateway_ip, policy, secrets, false)
    }

    /// [`Egress::attach`] for a sandbox that was attached before (a daemon restarted while it
    /// ran): the same, except that a sandbox without secrets gets a CA for the registries
    /// only if it had one (its trust store was made at create and cannot take a new one; a
    /// policy changed since to allow a registry leaves that registry spliced, not recorded).
    pub fn reattach(
        &self,
        id: &str,
        sandbox_ip: IpAddr,
        gateway_ip: IpAddr,
        policy: NetworkPolicy,
        secrets: Vec<SecretSpec>,
    ) -> Result<Attachment, EgressError> {
        self.attach_as(id, sandbox_ip, gateway_ip, policy, secrets, true)
    }

    fn attach_as(
        &self,
        id: &str,
        sandbox_ip: IpAddr,
        gateway_ip: IpAddr,
        policy: NetworkPolicy,
        secrets: Vec<SecretSpec>,
        again: bool,
    ) -> Result<Attachment, EgressError> {
        if !valid_id(id) {
            return Err(EgressError::InvalidId(id.to_string()));
        }
        let compiled = CompiledPolicy::compile(&policy)?;
        let sandbox_ip = policy::canonical(sandbox_ip);
        {
            let sbs = self
                .inner
                .sandboxes
                .read()
                .unwrap_or_else(|e| e.into_inner());
            let ips = self.inner.by_ip.read().unwrap_or_else(|e| e.into_inner());
            if sbs.contains_key(id) || ips.contains_key(&sandbox_ip) {
                return Err(EgressError::AlreadyAttached(id.to_string()));
            }
        }
        let dir = self.state_dir(id);
        let fresh = !dir.exists();
        // A package registry the policy allows is intercepted to record what is fetched
        // (see `packages`): that needs the CA in the sandbox's trust store from the start.
        let registries = self.inner.record_packages
            && registries_allowed(&compiled)
            && (!again || tls::SandboxCa::stored(&dir));
        let result = (|| {
            if secrets.is_empty() && !registries {
                return Ok((Vec::new(), None));
            }
            let bound = build_secrets(&secrets, &self.load_placeholders(id))?;
            let ca = Arc::new(SandboxCa::load_or_create(id, &dir)?);
            self.save_placeholders(id, &bound)?;
            Ok::<_, EgressError>((bound, Some(ca)))
        })();
        let (bound, ca) = match result {
            Ok(v) => v,
            Err(e) => {
                if fresh {
                    let _ = std::fs::remove_dir_all(&dir);
                }
                return Err(e);
            }
        };
        let att = Attachment {
            ca_cert_pem: ca.as_ref().map(|c| c.cert_pem().to_string()),
            env: bound
                .iter()
                .filter_map(|s| s.env.clone().map(|e| (e, s.placeholder.clone())))
                .collect(),
            secrets: bound.iter().map(|s| s.info()).collect(),
        };
        let sb = Arc::new(Sandbox {
            ip: sandbox_ip,
            limiters: RwLock::new(Arc::new(Limiters::from_policy(&policy.limits))),
            policy: RwLock::new(Arc::new(compiled)),
            secrets: RwLock::new(Arc::new(bound)),
            ca: RwLock::new(ca),
            pins: Mutex::new(Pins::default()),
            log: NetLog::new(id, self.inner.log_capacity, self.inner.events.clone()),
            conns: Mutex::new(HashMap::new()),
            gone: self.stop.child_token(),
            dns_tcp: std::sync::atomic::AtomicUsize::new(0),
            open_conns: std::sync::atomic::AtomicUsize::new(0),
            ask: RwLock::new(Arc::new(Vec::new())),
            asked: Mutex::new(HashMap::new()),
        });
        {
            let mut sbs = self
                .inner
                .sandboxes
                .write()
                .unwrap_or_else(|e| e.into_inner());
            let mut ips = self.inner.by_ip.write().unwrap_or_else(|e| e.into_inner());
            if sbs.contains_key(id) || ips.contains_key(&sandbox_ip) {
                return Err(EgressError::AlreadyAttached(id.to_string()));
            }
            sbs.insert(id.to_string(), sb.clone());
            ips.insert(sandbox_ip, sb);
        }
        let mut host = host_view().unwrap_or_else(|_| {
            let bl = self.inner.blocklist();
            HostView {
                addrs: bl.host.clone(),
                nets: bl.host_nets.clone(),
            }
        });
        let gw = policy::canonical(gateway_ip);
        if !host.addrs.contains(&gw) {
            host.addrs.push(gw);
        }
        self.inner.rebuild_blocklist(Some(host));
        Ok(att)
    }

    /// Sets who decides held connections (the daemon's approvals); until then, and
    /// without one, a connection an ask pattern names is refused.
    pub fn set_asker(&self, asker: Arc<dyn ask::HostAsker>) {
        *self.inner.asker.write().unwrap_or_else(|e| e.into_inner()) = Some(AskerRef(asker));
    }

    /// Sets the hosts `id`'s approval policy asks about (checked with [`ask::compile`]):
    /// a connection to one that no rule allows is held for a decision instead of refused,
    /// and the resolver answers for them. Decisions kept so far stay.
    pub fn set_ask_hosts(&self, id: &str, hosts: &[String]) -> Result<(), EgressError> {
        let sb = self.sandbox(id)?;
        let rules = ask::compile(hosts)?;
        *sb.ask.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(rules);
        Ok(())
    }

    /// Replaces the policy: new connections and queries obey it at once, and every live
    /// connection the new policy denies is cut (its close entry names the rule).
    pub fn set_policy(&self, id: &str, policy: NetworkPolicy) -> Result<(), EgressError> {
        let sb = self.sandbox(id)?;
        let compiled = Arc::new(CompiledPolicy::compile(&policy)?);
        *sb.limiters.write().unwrap_or_else(|e| e.into_inner()) =
            Arc::new(Limiters::from_policy(&policy.limits));
        *sb.policy.write().unwrap_or_else(|e| e.into_inner()) = compiled;
        let bl = self.inner.blocklist();
        let conns: Vec<Arc<LiveConn>> = sb
            .conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        for c in conns {
            let d = sb.decide(&bl, c.ip, c.port, c.name.as_deref());
            if !d.allowed() {
                *c.cut.lock().unwrap_or_else(|e| e.into_inner()) = Some(d.rule);
                c.cancel.cancel();
            }
        }
        Ok(())
    }

    /// Replaces the secrets. A secret that keeps its name keeps its placeholder. Live
    /// intercepted connections use the new set from their next request.
    ///
    /// A sandbox attached without secrets has no CA: the first call that gives it some makes
    /// one (before the secrets take effect), and the caller must put it into the sandbox's
    /// trust store ([`Egress::ca_cert_pem`]) for HTTPS to the secrets' hosts to work.
    /// (rampart-core never calls this: a sandbox's secrets are given at create.)
    pub fn set_secrets(
        &self,
        id: &str,
        secrets: Vec<SecretSpec>,
    ) -> Result<Vec<SecretInfo>, EgressError> {
        let sb = self.sandbox(id)?;
        let old: HashMap<String, String> = sb
            .secrets()
            .iter()
            .map(|s| (s.name.clone(), s.placeholder.clone()))
            .collect();
        let bound = build_secrets(&secrets, &old)?;
        if !bound.is_empty() {
            let mut ca = sb.ca.write().unwrap_or_else(|e| e.into_inner());
            if ca.is_none() {
                *ca = Some(Arc::new(SandboxCa::load_or_create(
                    id,
                    &self.state_dir(id),
                )?));
            }
        }
        self.save_placeholders(id, &bound)?;
        let info = bound.iter().map(|s| s.info()).collect();
        *sb.secrets.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(bound);
        Ok(info)
    }

    /// The CA certificate (PEM) of an attached sandbox, if it has one (it has secrets, or had
    /// some): what its trust store needs for the interception of its secrets' hosts.
    pub fn ca_cert_pem(&self, id: &str) -> Option<String> {
        self.sandbox(id)
            .ok()
            .and_then(|sb| sb.ca())
            .map(|c| c.cert_pem().to_string())
    }

    /// The secrets of a sandbox as the API shows them.
    pub fn secrets(&self, id: &str) -> Option<Vec<SecretInfo>> {
        self.sandbox(id)
            .ok()
            .map(|sb| sb.secrets().iter().map(|s| s.info()).collect())
    }

    /// The policy in force for a sandbox.
    pub fn policy(&self, id: &str) -> Option<NetworkPolicy> {
        self.sandbox(id).ok().map(|sb| sb.policy().source.clone())
    }

    /// Stops enforcing for `id`: cuts its connections, forgets it and removes its CA and
    /// placeholders from `state_dir`. Returns whether it was attached. Also removes the state
    /// of an id that is not attached (cleanup after a restart).
    pub fn detach(&self, id: &str) -> bool {
        let sb = {
            let mut sbs = self
                .inner
                .sandboxes
                .write()
                .unwrap_or_else(|e| e.into_inner());
            let mut ips = self.inner.by_ip.write().unwrap_or_else(|e| e.into_inner());
            let sb = sbs.remove(id);
            if let Some(sb) = &sb {
                ips.remove(&sb.ip);
            }
            sb
        };
        if let Some(sb) = &sb {
            sb.gone.cancel();
        }
        if valid_id(id) {
            let _ = std::fs::remove_dir_all(self.state_dir(id));
        }
        self.inner.rebuild_blocklist(None);
        sb.is_some()
    }

    /// Log entries of a sandbox with `seq > after_seq`, at most `limit` (oldest first).
    /// `None` if the sandbox is not attached.
    pub fn log(&self, id: &str, after_seq: u64, limit: usize) -> Option<Vec<NetLogEntry>> {
        self.sandbox(id)
            .ok()
            .map(|sb| sb.log.read(after_seq, limit))
    }

    /// New log entries of a sandbox as they happen (for `?follow=1`). A receiver that lags
    /// gets `RecvError::Lagged` and can catch up with [`Egress::log`].
    pub fn subscribe(&self, id: &str) -> Option<broadcast::Receiver<NetLogEntry>> {
        self.sandbox(id).ok().map(|sb| sb.log.subscribe())
    }

    /// Judges and serves one TCP connection as if the sandbox at `sandbox_ip` had opened it
    /// to `dst` (what the proxy listener does after `SO_ORIGINAL_DST`). For embedders that
    /// receive connections another way, and for benchmarks. Unknown sandbox: the connection
    /// is closed.
    pub async fn serve_connection(
        &self,
        client: tokio::net::TcpStream,
        sandbox_ip: IpAddr,
        dst: SocketAddr,
    ) {
        if let Some(sb) = self.inner.by_ip(sandbox_ip) {
            proxy::handle_for(&self.inner, sb, client, dst).await;
        }
    }

    /// How many entries of `id` the event hook dropped because its receiver lagged.
    pub fn dropped_events(&self, id: &str) -> u64 {
        self.sandbox(id)
            .map(|sb| sb.log.dropped_events())
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod pin_tests {
    use super::*;

    #[test]
    fn pins_are_bounded_in_names_not_only_addresses() {
        let mut p = Pins::default();
        let ip: IpAddr = "198.51.100.7".parse().unwrap();
        let now = Instant::now();
        let until = now + MIN_PIN;
        // A wildcard zone answering every name with one address.
        for i in 0..MAX_PINS + 100 {
            p.add(&format!("n{i}.wild.example"), &[ip], until, now);
        }
        assert_eq!(p.pairs, MAX_PINS);
        assert_eq!(p.names(ip).map(HashMap::len), Some(MAX_PINS));
        assert!(!p.names(ip).unwrap().contains_key("n16400.wild.example"));
        // A known pin is still extended when full.
        let later = until + MIN_PIN;
        p.add("n0.wild.example", &[ip], later, now);
        assert_eq!(p.names(ip).unwrap()["n0.wild.example"], later);
        // Once pins expire, they make room.
        p.add(
            "fresh.example",
            &[ip],
            later + MIN_PIN,
            until + Duration::from_secs(1),
        );
        assert_eq!(p.pairs, 2);
        assert!(p.names(ip).unwrap().contains_key("fresh.example"));
    }
}

#[cfg(test)]
mod bind_tests {
    use super::*;

    /// The resolver's UDP and TCP sockets share one port number, picked or given; a given
    /// port taken for TCP is an error naming TCP (only a picked one is tried again).
    #[tokio::test]
    async fn the_resolver_binds_udp_and_tcp_on_one_port() {
        let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
        for _ in 0..50 {
            let (u, t) = bind_dns(lo, 0).await.unwrap();
            assert_eq!(
                u.local_addr().unwrap().port(),
                t.local_addr().unwrap().port()
            );
        }
        let busy = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let port = busy.local_addr().unwrap().port();
        let e = bind_dns(lo, port).await.unwrap_err().to_string();
        assert!(e.contains(&format!("bind dns tcp 127.0.0.1:{port}")), "{e}");
    }
}

#[cfg(test)]
mod on_behalf_tests {
    use super::*;

    #[test]
    fn special_ranges_are_refused_unless_allowed() {
        let allow: Vec<IpNet> = vec!["127.0.0.1/32".parse().unwrap()];
        assert_eq!(
            refused_on_behalf("127.0.0.1".parse().unwrap(), &allow),
            None
        );
        for ip in [
            "127.0.0.2",
            "169.254.169.254",
            "10.1.2.3",
            "::1",
            "::ffff:10.0.0.1",
        ] {
            assert!(
                refused_on_behalf(ip.parse().unwrap(), &allow).is_some(),
                "{ip}"
            );
        }
    }

    /// An address of the host itself is refused even when it is public: tried in a network
    /// namespace this test makes (a thread of its own), whose `lo` gets a public address;
    /// outside it, the same address is not the host's and is allowed. Nothing is sent.
    #[test]
    fn sandbox_blocks_posting_to_the_hosts_own_public_address() {
        let public: IpAddr = "44.0.0.1".parse().unwrap();
        assert_eq!(
            refused_on_behalf(public, &[]),
            None,
            "not this host's out here"
        );
        let inside = std::thread::spawn(move || {
            // SAFETY: unshare on this thread only (a new network namespace for it); the
            // thread ends when the check is done, taking the namespace with it.
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                return Err(format!(
                    "unshare(CLONE_NEWNET): {}",
                    std::io::Error::last_os_error()
                ));
            }
            // `ip`, forked from this thread, runs in its namespace.
            for args in [
                &["link", "set", "lo", "up"][..],
                &["addr", "add", "44.0.0.1/32", "dev", "lo"][..],
            ] {
                let st = std::process::Command::new("ip").args(args).status();
                if !st.is_ok_and(|s| s.success()) {
                    return Err(format!("ip {args:?} failed"));
                }
            }
            Ok((
                refused_on_behalf(public, &[]),
                refused_on_behalf(public, &["44.0.0.0/24".parse().unwrap()]),
            ))
        })
        .join()
        .unwrap();
        match inside {
            Ok((refused, allowed)) => {
                assert_eq!(refused, Some("this host's own"));
                assert_eq!(allowed, None, "an operator's allowed range wins");
            }
            Err(why) => eprintln!("skipped: needs root and iproute2 ({why})"),
        }
    }
}
