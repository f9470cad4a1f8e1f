//! The policy language: parsing rules and deciding verdicts.
//!
//! Pure logic, no I/O: [`CompiledPolicy::compile`] turns a [`NetworkPolicy`] into matchers,
//! [`Blocklist`] holds the always-blocked ranges, and the `decide_*` functions give a
//! [`Decision`] (verdict plus the rule that decided).

use std::net::IpAddr;

use ipnet::IpNet;
use rampart_types::network::{NetworkMode, NetworkPolicy, Verdict};

/// A rule that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid network rule {rule:?}: {reason}")]
pub struct RuleError {
    /// The rule as written.
    pub rule: String,
    /// Why it was refused.
    pub reason: &'static str,
}

/// What a rule matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Exactly this name (lowercase, no trailing dot).
    Domain(String),
    /// Any name strictly below this suffix (`*.github.com` -> `github.com`).
    Wildcard(String),
    /// An address or a network.
    Net(IpNet),
}

/// One parsed rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// The rule as written (what logs show after `allow:`/`deny:`).
    pub text: String,
    /// What it matches.
    pub target: Target,
    /// The port it is limited to, if any.
    pub port: Option<u16>,
}

fn err(rule: &str, reason: &'static str) -> RuleError {
    RuleError {
        rule: rule.to_string(),
        reason,
    }
}

/// Normalizes a DNS name: lowercase, no trailing dot. `None` if it is not a valid host name.
pub fn normalize_name(name: &str) -> Option<String> {
    let n = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    if n.is_empty() || n.len() > 253 {
        return None;
    }
    for label in n.split('.') {
        if label.is_empty() || label.len() > 63 {
            return None;
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return None;
        }
    }
    Some(n)
}

fn parse_port(rule: &str, p: &str) -> Result<u16, RuleError> {
    match p.parse::<u16>() {
        Ok(0) | Err(_) => Err(err(rule, "port must be a number from 1 to 65535")),
        Ok(n) => Ok(n),
    }
}

fn parse_net(s: &str) -> Option<IpNet> {
    if let Ok(n) = s.parse::<IpNet>() {
        // A CIDR with host bits set is almost always a typo; keep the network it names.
        return Some(n.trunc());
    }
    s.parse::<IpAddr>().ok().map(IpNet::from)
}

impl Rule {
    /// Parses one rule: `pypi.org`, `*.github.com`, `10.1.2.0/24`, `2001:db8::/32`,
    /// `api.example.com:443`, `[2001:db8::1]:443`, `10.0.0.0/8:5432`.
    pub fn parse(rule: &str) -> Result<Rule, RuleError> {
        let s = rule.trim();
        if s.is_empty() {
            return Err(err(rule, "empty rule"));
        }
        if s.len() > 300 {
            return Err(err(rule, "rule too long"));
        }
        // `[v6 or v6/len]` with an optional `:port`.
        if let Some(rest) = s.strip_prefix('[') {
            let (inner, after) = rest
                .split_once(']')
                .ok_or_else(|| err(rule, "missing ']'"))?;
            let port = match after {
                "" => None,
                a => Some(parse_port(
                    rule,
                    a.strip_prefix(':')
                        .ok_or_else(|| err(rule, "expected ':port' after ']'"))?,
                )?),
            };
            let net = parse_net(inner).ok_or_else(|| err(rule, "not an IP address or CIDR"))?;
            return Ok(Rule {
                text: rule.to_string(),
                target: Target::Net(net),
                port,
            });
        }
        // A bare address or network (an IPv6 one has colons and no port).
        if let Some(net) = parse_net(s) {
            return Ok(Rule {
                text: rule.to_string(),
                target: Target::Net(net),
                port: None,
            });
        }
        let (host, port) = match s.rsplit_once(':') {
            Some((h, p)) => (h, Some(parse_port(rule, p)?)),
            None => (s, None),
        };
        if let Some(net) = parse_net(host) {
            if host.contains(':') {
                return Err(err(
                    rule,
                    "an IPv6 address with a port must be written [addr]:port",
                ));
            }
            return Ok(Rule {
                text: rule.to_string(),
                target: Target::Net(net),
                port,
            });
        }
        let target = if let Some(suffix) = host.strip_prefix("*.") {
            let n = normalize_name(suffix).ok_or_else(|| err(rule, "not a valid domain"))?;
            if !n.contains('.') {
                return Err(err(
                    rule,
                    "a wildcard needs at least two labels (`*.example.com`)",
                ));
            }
            Target::Wildcard(n)
        } else {
            if host.contains('*') {
                return Err(err(
                    rule,
                    "'*' is only allowed as the first label (`*.example.com`)",
                ));
            }
            if host.contains('/') {
                return Err(err(rule, "not a valid CIDR"));
            }
            let n = normalize_name(host).ok_or_else(|| err(rule, "not a valid domain"))?;
            if n.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
                return Err(err(rule, "not a valid IP address"));
            }
            Target::Domain(n)
        };
        Ok(Rule {
            text: rule.to_string(),
            target,
            port,
        })
    }

    /// Whether this is a domain rule matching `name` (normalized).
    pub fn matches_name(&self, name: &str) -> bool {
        match &self.target {
            Target::Domain(d) => d == name,
            Target::Wildcard(sfx) => {
                name.len() > sfx.len() + 1
                    && name.ends_with(sfx.as_str())
                    && name.as_bytes()[name.len() - sfx.len() - 1] == b'.'
            }
            Target::Net(_) => false,
        }
    }

    /// Whether this is an IP/CIDR rule covering `ip`.
    pub fn matches_ip(&self, ip: IpAddr) -> bool {
        match &self.target {
            Target::Net(n) => n.contains(&canonical(ip)),
            _ => false,
        }
    }

    /// Whether the rule's port (if any) admits `port`. An unknown port (DNS) matches.
    pub fn matches_port(&self, port: Option<u16>) -> bool {
        match (self.port, port) {
            (None, _) | (_, None) => true,
            (Some(a), Some(b)) => a == b,
        }
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 address; anything else unchanged.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => ip,
        },
        v4 => v4,
    }
}

/// A verdict and the rule that decided it (`allow:pypi.org`, `deny:evil.com`, `default`,
/// `mode:none`, `open`, `blocked:metadata`, `not-resolved:pypi.org`, ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Allow or deny.
    pub verdict: Verdict,
    /// The deciding rule.
    pub rule: String,
}

impl Decision {
    fn allow(rule: impl Into<String>) -> Self {
        Decision {
            verdict: Verdict::Allow,
            rule: rule.into(),
        }
    }
    fn deny(rule: impl Into<String>) -> Self {
        Decision {
            verdict: Verdict::Deny,
            rule: rule.into(),
        }
    }
    /// Whether the verdict is allow.
    pub fn allowed(&self) -> bool {
        self.verdict == Verdict::Allow
    }
}

/// A parsed, ready-to-match policy.
#[derive(Debug, Clone)]
pub struct CompiledPolicy {
    /// The mode.
    pub mode: NetworkMode,
    /// Allow rules.
    pub allow: Vec<Rule>,
    /// Deny rules.
    pub deny: Vec<Rule>,
    /// The policy as given (limits are read from it).
    pub source: NetworkPolicy,
    /// The `packages` rules.
    pub packages: crate::packages::PackageRules,
}

/// What a connection looks like to the policy.
#[derive(Debug, Clone, Copy)]
pub struct ConnQuery<'a> {
    /// The destination address (the original destination of the connection).
    pub ip: IpAddr,
    /// The destination port.
    pub port: u16,
    /// The name seen on the connection (TLS SNI or HTTP Host), normalized.
    pub name: Option<&'a str>,
}

impl CompiledPolicy {
    /// Parses every rule; the first bad one is the error.
    pub fn compile(policy: &NetworkPolicy) -> Result<CompiledPolicy, RuleError> {
        let allow = policy
            .allow
            .iter()
            .map(|r| Rule::parse(r))
            .collect::<Result<Vec<_>, _>>()?;
        let deny = policy
            .deny
            .iter()
            .map(|r| Rule::parse(r))
            .collect::<Result<Vec<_>, _>>()?;
        let packages = crate::packages::PackageRules::compile(&policy.packages)?;
        Ok(CompiledPolicy {
            mode: policy.mode,
            allow,
            deny,
            source: policy.clone(),
            packages,
        })
    }

    fn allow_wins(&self) -> bool {
        self.source.precedence == rampart_types::Precedence::Allow
    }

    /// The allow verdict of an allow rule that covers the connection on its own (an IP/CIDR
    /// rule for the address, or a name rule for the name seen when the sandbox's resolver
    /// answered that name with this address), if one does.
    fn explicit_allow(
        &self,
        q: ConnQuery<'_>,
        ip: IpAddr,
        blocklist: &Blocklist,
        pinned: &dyn Fn(&str) -> bool,
    ) -> Option<Decision> {
        let port = Some(q.port);
        if let Some(r) = self
            .allow
            .iter()
            .find(|r| r.matches_ip(ip) && r.matches_port(port))
        {
            return Some(Decision::allow(format!("allow:{}", r.text)));
        }
        let name = q.name?;
        let r = self
            .allow
            .iter()
            .find(|r| r.matches_name(name) && r.matches_port(port))?;
        // Private ranges stay closed to name rules, as without precedence.
        if blocklist.private(ip).is_some() || !pinned(name) {
            return None;
        }
        Some(Decision::allow(format!("allow:{}", r.text)))
    }

    /// May the resolver answer (forward) a query for `name`? The port is not known yet, so a
    /// deny rule with a port does not stop resolution, and any allow rule for the name does.
    pub fn decide_dns(&self, name: &str) -> Decision {
        if self.mode == NetworkMode::None {
            return Decision::deny("mode:none");
        }
        if self.allow_wins() {
            if let Some(r) = self.allow.iter().find(|r| r.matches_name(name)) {
                return Decision::allow(format!("allow:{}", r.text));
            }
        }
        if let Some(r) = self
            .deny
            .iter()
            .find(|r| r.port.is_none() && r.matches_name(name))
        {
            return Decision::deny(format!("deny:{}", r.text));
        }
        if let Some(r) = self.allow.iter().find(|r| r.matches_name(name)) {
            return Decision::allow(format!("allow:{}", r.text));
        }
        match self.mode {
            NetworkMode::Open => Decision::allow("open"),
            _ => Decision::deny("default"),
        }
    }

    /// The verdict for a connection, after the always-blocked check. `pinned(name)` says
    /// whether this sandbox's resolver answered `name` with the destination address.
    pub fn decide_conn(
        &self,
        q: ConnQuery<'_>,
        blocklist: &Blocklist,
        pinned: &dyn Fn(&str) -> bool,
        pinned_names: &dyn Fn() -> Vec<String>,
    ) -> Decision {
        let ip = canonical(q.ip);
        let port = Some(q.port);
        if let Some(cat) = blocklist.always_blocked(ip) {
            return Decision::deny(format!("blocked:{cat}"));
        }
        if self.mode == NetworkMode::None {
            return Decision::deny("mode:none");
        }
        // With `precedence: allow`, an allow rule that covers the destination wins over the
        // deny rules (and a name rule still needs the name resolved to this address).
        if self.allow_wins() {
            if let Some(d) = self.explicit_allow(q, ip, blocklist, pinned) {
                return d;
            }
        }
        // Deny wins: by the name seen, or by the address.
        if let Some(name) = q.name {
            if let Some(r) = self
                .deny
                .iter()
                .find(|r| r.matches_name(name) && r.matches_port(port))
            {
                return Decision::deny(format!("deny:{}", r.text));
            }
        }
        if let Some(r) = self
            .deny
            .iter()
            .find(|r| r.matches_ip(ip) && r.matches_port(port))
        {
            return Decision::deny(format!("deny:{}", r.text));
        }
        let ip_rule = self
            .allow
            .iter()
            .find(|r| r.matches_ip(ip) && r.matches_port(port));
        // Private ranges: only through an IP/CIDR allow rule that covers the address.
        if let Some(cat) = blocklist.private(ip) {
            if ip_rule.is_none() {
                return Decision::deny(format!("blocked:{cat}"));
            }
        }
        if let Some(r) = ip_rule {
            return Decision::allow(format!("allow:{}", r.text));
        }
        match q.name {
            Some(name) => {
                let rule = self
                    .allow
                    .iter()
                    .find(|r| r.matches_name(name) && r.matches_port(port));
                match (rule, self.mode) {
                    (Some(r), _) => {
                        if pinned(name) {
                            Decision::allow(format!("allow:{}", r.text))
                        } else {
                            Decision::deny(format!("not-resolved:{name}"))
                        }
                    }
                    (None, NetworkMode::Open) => open_implicit(ip, blocklist),
                    (None, _) => Decision::deny("default"),
                }
            }
            None => {
                if self.mode == NetworkMode::Open {
                    return open_implicit(ip, blocklist);
                }
                // Raw TCP (no SNI, no Host): a domain rule that names this port explicitly
                // admits the addresses its names resolved to (`github.com:22`).
                for name in pinned_names() {
                    if let Some(r) = self
                        .allow
                        .iter()
                        .find(|r| r.port == port && r.matches_name(&name))
                    {
                        // A name denied on this port never admits it.
                        if self
                            .deny
                            .iter()
                            .any(|d| d.matches_name(&name) && d.matches_port(port))
                        {
                            continue;
                        }
                        return Decision::allow(format!("allow:{}", r.text));
                    }
                }
                Decision::deny("default")
            }
        }
    }
}

/// What `open` mode lets through without a rule: not an address of a special-purpose range
/// that is not globally reachable, not one on a network attached to the host.
fn open_implicit(ip: IpAddr, blocklist: &Blocklist) -> Decision {
    if let Some(cat) = special(ip) {
        return Decision::deny(format!("blocked:{cat}"));
    }
    if blocklist.on_host_network(ip) {
        return Decision::deny("blocked:host-network");
    }
    Decision::allow("open")
}

fn v6net(a: [u16; 8], len: u8) -> IpNet {
    ipnet::Ipv6Net::new(a.into(), len)
        .map(IpNet::V6)
        .unwrap_or_else(|_| IpNet::from(IpAddr::from(a)))
}

/// Why the daemon may not connect to `ip` on a client's behalf (a webhook, a registry): the
/// special range it is in ([`special`]), unless a range of `allow` (the operator's) holds it.
pub fn refused_special(ip: IpAddr, allow: &[IpNet]) -> Option<&'static str> {
    let ip = canonical(ip);
    if allow.iter().any(|n| n.contains(&ip)) {
        None
    } else {
        special(ip)
    }
}

/// IANA special-purpose ranges (IPv4 and IPv6 registries) that are not globally reachable,
/// plus ranges reserved or deprecated for which reaching anything is no use to a sandbox,
/// beyond what [`Blocklist::always_blocked`] and [`Blocklist::private`] already cover.
/// `open` mode refuses them unless a rule names them (by CIDR, or by a domain the sandbox
/// resolved to them). An IPv4-mapped IPv6 address is judged by its IPv4 address.
pub fn special(ip: IpAddr) -> Option<&'static str> {
    match canonical(ip) {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            let ip = IpAddr::V4(v4);
            // 192.0.0.9 (PCP anycast) and 192.0.0.10 (TURN anycast) are globally reachable.
            if o[..3] == [192, 0, 0] && (o[3] == 9 || o[3] == 10) {
                return None;
            }
            let nets = [
                v4net([0, 0, 0, 0], 8),       // "this network"
                v4net([10, 0, 0, 0], 8),      // private-use
                v4net([100, 64, 0, 0], 10),   // shared address space
                v4net([127, 0, 0, 0], 8),     // loopback
                v4net([169, 254, 0, 0], 16),  // link local
                v4net([172, 16, 0, 0], 12),   // private-use
                v4net([192, 0, 0, 0], 24),    // IETF protocol assignments
                v4net([192, 0, 2, 0], 24),    // TEST-NET-1
                v4net([192, 88, 99, 0], 24),  // deprecated 6to4 relay anycast
                v4net([192, 168, 0, 0], 16),  // private-use
                v4net([198, 18, 0, 0], 15),   // benchmarking
                v4net([198, 51, 100, 0], 24), // TEST-NET-2
                v4net([203, 0, 113, 0], 24),  // TEST-NET-3
                v4net([224, 0, 0, 0], 4),     // multicast
                v4net([240, 0, 0, 0], 4),     // reserved, and the limited broadcast
            ];
            nets.iter().any(|n| n.contains(&ip)).then_some("special")
        }
        IpAddr::V6(v6) => {
            let s = v6.segments();
            let ip = IpAddr::V6(v6);
            // Only 2000::/3 is global unicast: ::/128, ::1, the IPv4-compatible ::/96,
            // 64:ff9b::/96 and 64:ff9b:1::/48 (translation), 100::/64 (discard), 5f00::/16
            // (SRv6 SIDs), fc00::/7, fe80::/10, fec0::/10, ff00::/8 all lie outside it.
            if (s[0] & 0xe000) != 0x2000 {
                return Some("special");
            }
            // In 2001::/23 (IETF protocol assignments) these are globally reachable:
            // 2001:1::1, ::2, ::3 (anycast), 2001:3::/32 (AMT), 2001:4:112::/48 (AS112),
            // 2001:20::/28 (ORCHIDv2), 2001:30::/28 (drone remote ID).
            let global_2001 = [
                v6net([0x2001, 1, 0, 0, 0, 0, 0, 1], 128),
                v6net([0x2001, 1, 0, 0, 0, 0, 0, 2], 128),
                v6net([0x2001, 1, 0, 0, 0, 0, 0, 3], 128),
                v6net([0x2001, 3, 0, 0, 0, 0, 0, 0], 32),
                v6net([0x2001, 4, 0x112, 0, 0, 0, 0, 0], 48),
                v6net([0x2001, 0x20, 0, 0, 0, 0, 0, 0], 28),
                v6net([0x2001, 0x30, 0, 0, 0, 0, 0, 0], 28),
            ];
            if v6net([0x2001, 0, 0, 0, 0, 0, 0, 0], 23).contains(&ip) {
                return (!global_2001.iter().any(|n| n.contains(&ip))).then_some("special");
            }
            let nets = [
                v6net([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32), // documentation
                v6net([0x2002, 0, 0, 0, 0, 0, 0, 0], 16),     // 6to4
                v6net([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20),     // documentation
            ];
            nets.iter().any(|n| n.contains(&ip)).then_some("special")
        }
    }
}

/// The always-blocked and private ranges, plus the host's own addresses.
#[derive(Debug, Clone, Default)]
pub struct Blocklist {
    /// The host's addresses (read at start, refreshable).
    pub host: Vec<IpAddr>,
    /// The networks attached to the host's interfaces (address and prefix; read with the
    /// addresses): `open` mode does not reach them without a rule.
    pub host_nets: Vec<IpNet>,
    /// Extra blocked networks (the sandbox pool, the daemon's network).
    pub extra: Vec<IpNet>,
    /// The addresses of attached sandboxes.
    pub sandboxes: Vec<IpAddr>,
}

fn v4net(a: [u8; 4], len: u8) -> IpNet {
    // The literals below are valid prefixes; fall back to a /32 if that ever changes.
    ipnet::Ipv4Net::new(a.into(), len)
        .map(IpNet::V4)
        .unwrap_or_else(|_| IpNet::from(IpAddr::from(a)))
}

impl Blocklist {
    /// The category if `ip` is never reachable whatever the policy.
    pub fn always_blocked(&self, ip: IpAddr) -> Option<&'static str> {
        let ip = canonical(ip);
        match ip {
            IpAddr::V4(v4) => {
                let o = v4.octets();
                if o[0] == 169 && o[1] == 254 {
                    return Some("metadata");
                }
                if o[0] == 127 {
                    return Some("loopback");
                }
                if o[0] == 0 {
                    return Some("unspecified");
                }
                if v4.is_multicast() || v4.is_broadcast() || o[0] >= 240 {
                    return Some("multicast");
                }
            }
            IpAddr::V6(v6) => {
                let s = v6.segments();
                if v6.is_loopback() || v6.is_unspecified() {
                    return Some("loopback");
                }
                if (s[0] & 0xffc0) == 0xfe80 {
                    return Some("metadata");
                }
                if v6.is_multicast() {
                    return Some("multicast");
                }
                // fd00:ec2::254 (the AWS IMDS IPv6 address) is inside fc00::/7 and thus
                // private; NAT64 and 6to4 forms could smuggle IPv4 targets: block them.
                if s[0] == 0x64 && s[1] == 0xff9b {
                    return Some("nat64");
                }
                if s[0] == 0x2002 {
                    return Some("6to4");
                }
            }
        }
        if self.host.iter().any(|h| canonical(*h) == ip) {
            return Some("host");
        }
        if self.sandboxes.iter().any(|s| canonical(*s) == ip) {
            return Some("sandbox");
        }
        if self.extra.iter().any(|n| n.contains(&ip)) {
            return Some("sandbox-pool");
        }
        None
    }

    /// Whether `ip` is on a network attached to one of the host's interfaces.
    pub fn on_host_network(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.host_nets.iter().any(|n| n.contains(&ip))
    }

    /// The category if `ip` is in a private range (reachable only when named by a rule).
    pub fn private(&self, ip: IpAddr) -> Option<&'static str> {
        let nets: [(IpNet, &str); 4] = [
            (v4net([10, 0, 0, 0], 8), "private"),
            (v4net([172, 16, 0, 0], 12), "private"),
            (v4net([192, 168, 0, 0], 16), "private"),
            (v4net([100, 64, 0, 0], 10), "private"),
        ];
        let ip = canonical(ip);
        if nets.iter().any(|(n, _)| n.contains(&ip)) {
            return Some("private");
        }
        if let IpAddr::V6(v6) = ip {
            if (v6.segments()[0] & 0xfe00) == 0xfc00 {
                return Some("private");
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pol(mode: NetworkMode, allow: &[&str], deny: &[&str]) -> CompiledPolicy {
        CompiledPolicy::compile(&NetworkPolicy {
            mode,
            allow: allow.iter().map(|s| s.to_string()).collect(),
            deny: deny.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        })
        .unwrap()
    }

    fn conn(p: &CompiledPolicy, ip: &str, port: u16, name: Option<&str>, pinned: bool) -> Decision {
        p.decide_conn(
            ConnQuery {
                ip: ip.parse().unwrap(),
                port,
                name,
            },
            &Blocklist {
                host: vec!["192.0.2.1".parse().unwrap(), "11.22.33.1".parse().unwrap()],
                host_nets: vec!["11.22.33.0/24".parse().unwrap()],
                extra: vec!["10.200.0.0/16".parse().unwrap()],
                sandboxes: vec!["10.200.0.5".parse().unwrap()],
            },
            &|_| pinned,
            &|| {
                if pinned {
                    vec!["github.com".to_string()]
                } else {
                    vec![]
                }
            },
        )
    }

    #[test]
    fn parses_rules() {
        let r = Rule::parse("pypi.org").unwrap();
        assert_eq!(r.target, Target::Domain("pypi.org".into()));
        let r = Rule::parse("*.GitHub.com:443").unwrap();
        assert_eq!(r.target, Target::Wildcard("github.com".into()));
        assert_eq!(r.port, Some(443));
        let r = Rule::parse("10.1.2.0/24").unwrap();
        assert_eq!(r.target, Target::Net("10.1.2.0/24".parse().unwrap()));
        let r = Rule::parse("10.1.2.3:5432").unwrap();
        assert_eq!(r.port, Some(5432));
        let r = Rule::parse("2001:db8::/32").unwrap();
        assert!(matches!(r.target, Target::Net(_)));
        let r = Rule::parse("[2001:db8::1]:443").unwrap();
        assert_eq!(r.port, Some(443));
        for bad in [
            "",
            "a..b",
            "*.com",
            "foo*.com",
            "x.com:0",
            "x.com:99999",
            "x.com:abc",
            "1.2.3.4/40",
            "[::1",
            "bad host",
            "1.2.3",
            "*.a.b/8",
        ] {
            let e = Rule::parse(bad).unwrap_err();
            assert_eq!(e.rule, bad);
            assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
        }
    }

    #[test]
    fn wildcard_matches_below_only() {
        let r = Rule::parse("*.github.com").unwrap();
        assert!(r.matches_name("api.github.com"));
        assert!(r.matches_name("a.b.github.com"));
        assert!(!r.matches_name("github.com"));
        assert!(!r.matches_name("evilgithub.com"));
    }

    #[test]
    fn dns_decisions() {
        let p = pol(
            NetworkMode::Allowlist,
            &["pypi.org", "*.github.com"],
            &["evil.github.com"],
        );
        assert!(p.decide_dns("pypi.org").allowed());
        assert_eq!(p.decide_dns("api.github.com").rule, "allow:*.github.com");
        assert_eq!(p.decide_dns("evil.github.com").rule, "deny:evil.github.com");
        assert_eq!(p.decide_dns("example.com").rule, "default");
        assert_eq!(
            pol(NetworkMode::Allowlist, &[], &[])
                .decide_dns("pypi.org")
                .rule,
            "default"
        );
        assert_eq!(
            pol(NetworkMode::None, &["pypi.org"], &[])
                .decide_dns("pypi.org")
                .rule,
            "mode:none"
        );
        assert_eq!(
            pol(NetworkMode::Open, &[], &["x.com"])
                .decide_dns("y.com")
                .rule,
            "open"
        );
        assert!(!pol(NetworkMode::Open, &[], &["x.com"])
            .decide_dns("x.com")
            .allowed());
    }

    #[test]
    fn allow_precedence_wins_over_deny() {
        let mut src = NetworkPolicy {
            mode: NetworkMode::Open,
            allow: vec!["93.184.216.34".into(), "api.example.com".into()],
            deny: vec![
                "93.184.0.0/16".into(),
                "example.com".into(),
                "*.example.com".into(),
            ],
            ..Default::default()
        };
        // Deny wins by default.
        let p = CompiledPolicy::compile(&src).unwrap();
        assert_eq!(
            conn(&p, "93.184.216.34", 443, None, false).rule,
            "deny:93.184.0.0/16"
        );
        assert!(!p.decide_dns("api.example.com").allowed());
        src.precedence = rampart_types::Precedence::Allow;
        let p = CompiledPolicy::compile(&src).unwrap();
        // The allowed address inside the denied range is reachable, its neighbours are not.
        assert_eq!(
            conn(&p, "93.184.216.34", 443, None, false).rule,
            "allow:93.184.216.34"
        );
        assert_eq!(
            conn(&p, "93.184.216.35", 443, None, false).rule,
            "deny:93.184.0.0/16"
        );
        // An allowed name below a denied wildcard resolves and connects (once resolved).
        assert_eq!(
            p.decide_dns("api.example.com").rule,
            "allow:api.example.com"
        );
        assert!(!p.decide_dns("www.example.com").allowed());
        assert_eq!(
            conn(&p, "8.8.4.4", 443, Some("api.example.com"), false).rule,
            "deny:*.example.com"
        );
        assert_eq!(
            conn(&p, "8.8.4.4", 443, Some("api.example.com"), true).rule,
            "allow:api.example.com"
        );
        assert_eq!(
            conn(&p, "8.8.4.4", 443, Some("www.example.com"), true).rule,
            "deny:*.example.com"
        );
        // A name rule never opens a private address, precedence or not.
        assert!(!conn(&p, "10.9.9.9", 443, Some("api.example.com"), true).allowed());
        let no_wildcard = CompiledPolicy::compile(&NetworkPolicy {
            deny: vec![],
            ..src.clone()
        })
        .unwrap();
        assert_eq!(
            conn(&no_wildcard, "10.9.9.9", 443, Some("api.example.com"), true).rule,
            "blocked:private"
        );
        // Always-blocked stays blocked.
        assert_eq!(
            conn(&p, "169.254.169.254", 80, Some("api.example.com"), true).rule,
            "blocked:metadata"
        );
        // An allowlist with precedence: everything not allowed is still refused.
        src.mode = NetworkMode::Allowlist;
        let p = CompiledPolicy::compile(&src).unwrap();
        assert_eq!(
            conn(&p, "1.1.1.1", 443, Some("other.org"), true).rule,
            "default"
        );
    }

    #[test]
    fn conn_decisions() {
        let p = pol(
            NetworkMode::Allowlist,
            &[
                "pypi.org",
                "github.com:22",
                "198.51.100.0/24:80",
                "10.1.0.0/16",
            ],
            &["203.0.113.0/24"],
        );
        assert_eq!(
            conn(&p, "93.184.216.34", 443, Some("pypi.org"), true).rule,
            "allow:pypi.org"
        );
        assert_eq!(
            conn(&p, "93.184.216.34", 443, Some("pypi.org"), false).rule,
            "not-resolved:pypi.org"
        );
        assert_eq!(
            conn(&p, "93.184.216.34", 443, Some("other.org"), true).rule,
            "default"
        );
        assert_eq!(conn(&p, "93.184.216.34", 443, None, false).rule, "default");
        assert_eq!(
            conn(&p, "93.184.216.34", 22, None, true).rule,
            "allow:github.com:22"
        );
        assert_eq!(conn(&p, "93.184.216.34", 23, None, true).rule, "default");
        assert_eq!(
            conn(&p, "198.51.100.7", 80, None, false).rule,
            "allow:198.51.100.0/24:80"
        );
        assert_eq!(conn(&p, "198.51.100.7", 81, None, false).rule, "default");
        assert_eq!(
            conn(&p, "203.0.113.5", 443, Some("pypi.org"), true).rule,
            "deny:203.0.113.0/24"
        );
        assert_eq!(
            conn(&p, "169.254.169.254", 80, None, false).rule,
            "blocked:metadata"
        );
        assert_eq!(
            conn(&p, "127.0.0.1", 80, None, false).rule,
            "blocked:loopback"
        );
        assert_eq!(
            conn(&p, "::ffff:127.0.0.1", 80, None, false).rule,
            "blocked:loopback"
        );
        assert_eq!(conn(&p, "192.0.2.1", 80, None, false).rule, "blocked:host");
        assert_eq!(
            conn(&p, "10.200.0.9", 80, None, false).rule,
            "blocked:sandbox-pool"
        );
        assert_eq!(
            conn(&p, "10.200.0.5", 80, None, false).rule,
            "blocked:sandbox"
        );
        assert_eq!(
            conn(&p, "10.1.2.3", 5432, None, false).rule,
            "allow:10.1.0.0/16"
        );
        assert_eq!(
            conn(&p, "10.2.2.3", 443, Some("pypi.org"), true).rule,
            "blocked:private"
        );
        assert_eq!(
            conn(&p, "fe80::1", 80, None, false).rule,
            "blocked:metadata"
        );
        assert_eq!(
            conn(&p, "fd00:ec2::254", 80, None, false).rule,
            "blocked:private"
        );
        assert_eq!(
            conn(&p, "224.0.0.1", 80, None, false).rule,
            "blocked:multicast"
        );
        assert_eq!(
            conn(&p, "255.255.255.255", 80, None, false).rule,
            "blocked:multicast"
        );
        assert_eq!(
            conn(&p, "0.1.2.3", 80, None, false).rule,
            "blocked:unspecified"
        );
    }

    #[test]
    fn special_ranges() {
        for ip in [
            "0.1.2.3",
            "10.1.1.1",
            "100.64.0.1",
            "127.0.0.1",
            "169.254.169.254",
            "172.31.0.1",
            "192.0.0.8",
            "192.0.0.170",
            "192.0.2.1",
            "192.88.99.1",
            "192.168.1.1",
            "198.18.0.1",
            "198.19.255.255",
            "198.51.100.1",
            "203.0.113.1",
            "224.0.0.1",
            "240.0.0.1",
            "255.255.255.255",
            "::",
            "::1",
            "::ffff:198.18.0.1",
            "::ffff:10.0.0.1",
            "::10.0.0.1",
            "64:ff9b::a00:1",
            "64:ff9b:1::1",
            "100::1",
            "2001::1",
            "2001:2::1",
            "2001:10::1",
            "2001:db8::1",
            "2002:a00:1::1",
            "3fff::1",
            "5f00::1",
            "fc00::1",
            "fd00:ec2::254",
            "fe80::1",
            "fec0::1",
            "ff02::1",
        ] {
            assert_eq!(special(ip.parse().unwrap()), Some("special"), "{ip}");
        }
        for ip in [
            "93.184.216.34",
            "8.8.8.8",
            "192.0.0.9",
            "192.0.0.10",
            "192.31.196.1",
            "192.52.193.1",
            "192.175.48.1",
            "198.17.255.255",
            "198.20.0.0",
            "::ffff:93.184.216.34",
            "2001:1::1",
            "2001:3::1",
            "2001:4:112::1",
            "2001:20::1",
            "2606:4700::1111",
            "2620:4f:8000::1",
        ] {
            assert_eq!(special(ip.parse().unwrap()), None, "{ip}");
        }
    }

    #[test]
    fn open_and_none() {
        let open = pol(NetworkMode::Open, &[], &["evil.com", "93.184.216.9"]);
        assert_eq!(
            conn(&open, "93.184.216.34", 443, Some("x.org"), false).rule,
            "open"
        );
        assert_eq!(conn(&open, "93.184.216.34", 443, None, false).rule, "open");
        assert_eq!(
            conn(&open, "93.184.216.34", 443, Some("evil.com"), true).rule,
            "deny:evil.com"
        );
        assert_eq!(
            conn(&open, "93.184.216.9", 443, None, false).rule,
            "deny:93.184.216.9"
        );
        // Open mode's implicit allow stops at special ranges and the host's networks...
        for (ip, rule) in [
            ("198.18.0.5", "blocked:special"),
            ("192.0.0.2", "blocked:special"),
            ("203.0.113.7", "blocked:special"),
            ("2001:db8::5", "blocked:special"),
            ("11.22.33.9", "blocked:host-network"),
        ] {
            assert_eq!(conn(&open, ip, 80, None, false).rule, rule, "{ip}");
            assert_eq!(conn(&open, ip, 80, Some("x.org"), true).rule, rule, "{ip}");
        }
        // ... which explicit rules still open: by CIDR, or by a name resolved to them.
        let open = pol(
            NetworkMode::Open,
            &["198.18.0.0/15", "11.22.33.9", "lab.example"],
            &[],
        );
        assert_eq!(
            conn(&open, "198.18.0.5", 80, None, false).rule,
            "allow:198.18.0.0/15"
        );
        assert_eq!(
            conn(&open, "11.22.33.9", 80, None, false).rule,
            "allow:11.22.33.9"
        );
        assert_eq!(
            conn(&open, "203.0.113.7", 80, Some("lab.example"), true).rule,
            "allow:lab.example"
        );
        assert_eq!(
            conn(&open, "10.0.0.1", 443, None, false).rule,
            "blocked:private"
        );
        assert_eq!(
            conn(&open, "169.254.169.254", 80, None, false).rule,
            "blocked:metadata"
        );
        let none = pol(NetworkMode::None, &["pypi.org"], &[]);
        assert_eq!(
            conn(&none, "93.184.216.34", 443, Some("pypi.org"), true).rule,
            "mode:none"
        );
    }
}
