//! `rampart net set|show|log`, the `--net-mode/--allow/--deny` flags of `create`/`run`, and
//! the `[network]` section of the daemon's config file.

use crate::client::{check, Client, Lines};
use anyhow::{anyhow, bail, Result};
use clap::{Args, Subcommand};
use rampart_core::NetworkConfig;
use rampart_types::network::{NetLogPage, NetworkInfo};
use rampart_types::{NetLogEntry, NetworkMode, NetworkPolicy};
use reqwest::Method;
use serde::Deserialize;
use std::net::SocketAddr;

/// Network flags of a new sandbox.
#[derive(Debug, Clone, Default, Args)]
pub struct NetFlags {
    /// Network mode: none (loopback only, the default), allowlist, open.
    #[arg(long = "net-mode", value_name = "MODE")]
    pub net_mode: Option<String>,
    /// Allowed destination (repeatable): pypi.org, *.github.com, 10.1.2.0/24, host:443.
    #[arg(long = "allow", value_name = "RULE")]
    pub allow: Vec<String>,
    /// Denied destination (repeatable); wins over --allow.
    #[arg(long = "deny", value_name = "RULE")]
    pub deny: Vec<String>,
    /// Refuse packages whose name matches this regular expression (repeatable), e.g.
    /// `^evil-` (docs/network.md, "Packages").
    #[arg(long = "deny-package", value_name = "REGEX")]
    pub deny_package: Vec<String>,
    /// Let through only pinned packages: `name==version` or `pypi:name==version`
    /// (repeatable; sets `require_pinned`).
    #[arg(long = "pin", value_name = "PIN")]
    pub pin: Vec<String>,
}

fn mode(s: &str) -> Result<NetworkMode> {
    match s {
        "none" => Ok(NetworkMode::None),
        "allowlist" => Ok(NetworkMode::Allowlist),
        "open" => Ok(NetworkMode::Open),
        other => bail!("--net-mode: {other:?} is not none, allowlist or open"),
    }
}

impl NetFlags {
    /// The policy these flags ask for (None: the daemon's default, no network). Rules
    /// without a mode mean `allowlist`.
    pub fn policy(&self) -> Result<Option<NetworkPolicy>> {
        let packages = rampart_types::network::PackagePolicy {
            deny: self.deny_package.clone(),
            require_pinned: !self.pin.is_empty(),
            pinned: self.pin.clone(),
        };
        let m = match &self.net_mode {
            Some(m) => mode(m)?,
            None if self.allow.is_empty() && self.deny.is_empty() && packages.is_empty() => {
                return Ok(None)
            }
            None => NetworkMode::Allowlist,
        };
        Ok(Some(NetworkPolicy {
            mode: m,
            allow: self.allow.clone(),
            deny: self.deny.clone(),
            packages,
            ..NetworkPolicy::default()
        }))
    }
}

/// `rampart net`.
#[derive(Debug, Args)]
pub struct NetArgs {
    #[command(subcommand)]
    cmd: NetCmd,
}

#[derive(Debug, Subcommand)]
enum NetCmd {
    /// Replace a running sandbox's policy (new connections obey it at once).
    Set {
        /// The sandbox.
        id: String,
        #[command(flatten)]
        flags: NetFlags,
        /// Print the answer as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show a sandbox's policy and addresses.
    Show {
        /// The sandbox.
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show a sandbox's network log: DNS answers and connections with their verdicts.
    Log {
        /// The sandbox.
        id: String,
        /// Keep printing entries as they happen, until the sandbox ends.
        #[arg(long, short = 'f')]
        follow: bool,
        /// Only entries after this sequence number.
        #[arg(long, value_name = "SEQ")]
        after: Option<u64>,
        /// Print NDJSON.
        #[arg(long)]
        json: bool,
    },
}

fn print_info(info: &NetworkInfo, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(info)?);
        return Ok(());
    }
    let p = &info.policy;
    println!("mode: {}", p.mode.as_str());
    if !p.allow.is_empty() {
        println!("allow: {}", p.allow.join(" "));
    }
    if !p.deny.is_empty() {
        println!("deny: {}", p.deny.join(" "));
    }
    if let Some(a) = &info.address {
        println!("address: {a}");
    }
    if let Some(g) = &info.gateway {
        println!("gateway: {g}");
    }
    Ok(())
}

fn line(e: &NetLogEntry) -> String {
    let what = match e.kind {
        rampart_types::NetEventKind::Dns => "dns",
        rampart_types::NetEventKind::Connect => "connect",
        rampart_types::NetEventKind::Close => "close",
        rampart_types::NetEventKind::SecretUsed => "secret",
        rampart_types::NetEventKind::Package => "package",
    };
    let verdict = match e.verdict {
        rampart_types::Verdict::Allow => "allow",
        rampart_types::Verdict::Deny => "DENY",
    };
    let mut s = format!("{} {:>5} {what:<7} {verdict:<5}", e.time, e.seq);
    if let Some(n) = &e.name {
        s.push_str(&format!(" {n}"));
    }
    if let Some(q) = &e.qtype {
        s.push_str(&format!(" {q}"));
    }
    if !e.addrs.is_empty() {
        s.push_str(&format!(" {}", e.addrs.join(",")));
    }
    if let Some(p) = e.port {
        s.push_str(&format!(":{p}"));
    }
    s.push_str(&format!(" [{}]", e.rule));
    if let (Some(o), Some(i)) = (e.bytes_out, e.bytes_in) {
        s.push_str(&format!(" out={o} in={i}"));
    }
    if let Some(sec) = &e.secret {
        s.push_str(&format!(" secret={sec}"));
    }
    if let Some(p) = &e.package {
        s.push_str(&format!(" {}:{}=={}", p.ecosystem, p.name, p.version));
        if let Some(h) = &p.sha256 {
            s.push_str(&format!(" sha256={h}"));
        }
    }
    s
}

/// `rampart net ...`.
pub async fn net(host: &crate::client::Endpoint, a: NetArgs) -> Result<u8> {
    let client = Client::new(host)?;
    match a.cmd {
        NetCmd::Set { id, flags, json } => {
            let policy = flags
                .policy()?
                .ok_or_else(|| anyhow!("give --net-mode and/or --allow/--deny"))?;
            let info: NetworkInfo = client
                .json(
                    client
                        .request(Method::PUT, &format!("/v1/sandboxes/{id}/network"))
                        .json(&policy),
                )
                .await?;
            print_info(&info, json)?;
        }
        NetCmd::Show { id, json } => {
            let info: NetworkInfo = client
                .json(client.request(Method::GET, &format!("/v1/sandboxes/{id}/network")))
                .await?;
            print_info(&info, json)?;
        }
        NetCmd::Log {
            id,
            follow,
            after,
            json,
        } => {
            let path = format!("/v1/sandboxes/{id}/network/log");
            let mut q: Vec<(&str, String)> = Vec::new();
            if let Some(a) = after {
                q.push(("after", a.to_string()));
            }
            if !follow {
                let page: NetLogPage = client
                    .json(client.request(Method::GET, &path).query(&q))
                    .await?;
                for e in &page.entries {
                    if json {
                        println!("{}", serde_json::to_string(e)?);
                    } else {
                        println!("{}", line(e));
                    }
                }
                return Ok(0);
            }
            q.push(("follow", "1".into()));
            let resp = client
                .send(client.request(Method::GET, &path).query(&q))
                .await?;
            let resp = check(resp).await?;
            let mut lines = Lines::new(resp.bytes_stream());
            while let Some(l) = lines.next().await {
                let l = l.map_err(|e| client.transport_error(e))?;
                if json {
                    print!("{}", String::from_utf8_lossy(&l));
                } else if let Ok(e) = serde_json::from_slice::<NetLogEntry>(&l) {
                    println!("{}", line(&e));
                }
            }
        }
    }
    Ok(0)
}

/// `[network]` of the daemon's config file (every key optional). The environment variables
/// `RAMPART_NET` (`off` disables), `RAMPART_NET_POOL`, `RAMPART_NET_LINK_PREFIX`,
/// `RAMPART_NET_TABLE`, `RAMPART_NET_DNS_PORT`, `RAMPART_NET_PROXY_PORT` and
/// `RAMPART_NET_UPSTREAM_DNS` (comma-separated `ip:port`) override it;
/// `RAMPART_NET_UPSTREAM_ROOTS` names a PEM file of extra roots the egress proxy trusts
/// upstream when it intercepts for secrets (tests' private CAs); `RAMPART_NET_PROXY_ALLOW`
/// (comma-separated CIDRs) overrides `upstream_proxy_allow`, the ranges a sandbox's own
/// SOCKS5 proxy may be in besides public addresses.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkFileConfig {
    enabled: Option<bool>,
    pool: Option<String>,
    link_prefix: Option<String>,
    table: Option<String>,
    dns_port: Option<u16>,
    proxy_port: Option<u16>,
    upstream_dns: Option<Vec<String>>,
    upstream_proxy_allow: Option<Vec<String>>,
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn port(name: &str, v: String) -> Result<u16> {
    v.parse()
        .map_err(|_| anyhow!("{name}: {v:?} is not a port number"))
}

fn upstream(name: &str, list: &[String]) -> Result<Vec<SocketAddr>> {
    list.iter()
        .map(|s| {
            s.parse::<SocketAddr>()
                .or_else(|_| {
                    s.parse::<std::net::IpAddr>()
                        .map(|ip| SocketAddr::new(ip, 53))
                })
                .map_err(|_| anyhow!("{name}: {s:?} is not an address (ip or ip:port)"))
        })
        .collect()
}

/// The daemon's network configuration from its config file and environment.
pub fn resolve_network(file: &NetworkFileConfig) -> Result<NetworkConfig> {
    let mut c = NetworkConfig::default();
    if let Some(e) = file.enabled {
        c.enabled = e;
    }
    if let Some(p) = env("RAMPART_NET_POOL").or(file.pool.clone()) {
        c.pool = p;
    }
    if let Some(p) = env("RAMPART_NET_LINK_PREFIX").or(file.link_prefix.clone()) {
        c.link_prefix = p;
    }
    if let Some(t) = env("RAMPART_NET_TABLE").or(file.table.clone()) {
        c.table = t;
    }
    if let Some(p) = env("RAMPART_NET_DNS_PORT") {
        c.dns_port = port("RAMPART_NET_DNS_PORT", p)?;
    } else if let Some(p) = file.dns_port {
        c.dns_port = p;
    }
    if let Some(p) = env("RAMPART_NET_PROXY_PORT") {
        c.proxy_port = port("RAMPART_NET_PROXY_PORT", p)?;
    } else if let Some(p) = file.proxy_port {
        c.proxy_port = p;
    }
    if let Some(u) = env("RAMPART_NET_UPSTREAM_DNS") {
        let list: Vec<String> = u.split(',').map(|s| s.trim().to_owned()).collect();
        c.upstream_dns = upstream("RAMPART_NET_UPSTREAM_DNS", &list)?;
    } else if let Some(u) = &file.upstream_dns {
        c.upstream_dns = upstream("network.upstream_dns", u)?;
    }
    let allow = match env("RAMPART_NET_PROXY_ALLOW") {
        Some(v) => Some((
            "RAMPART_NET_PROXY_ALLOW",
            v.split(',')
                .map(|s| s.trim().to_owned())
                .collect::<Vec<_>>(),
        )),
        None => file
            .upstream_proxy_allow
            .clone()
            .map(|l| ("network.upstream_proxy_allow", l)),
    };
    if let Some((name, list)) = allow {
        c.upstream_proxy_allow = list
            .iter()
            .filter(|s| !s.is_empty())
            .map(|s| {
                s.parse::<ipnet::IpNet>()
                    .or_else(|_| s.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
                    .map_err(|_| anyhow!("{name}: {s:?} is not a CIDR"))
            })
            .collect::<Result<_>>()?;
    }
    if let Some(f) = env("RAMPART_NET_UPSTREAM_ROOTS") {
        let pem = std::fs::read_to_string(&f)
            .map_err(|e| anyhow!("RAMPART_NET_UPSTREAM_ROOTS: reading {f}: {e}"))?;
        c.extra_upstream_roots.push(pem);
    }
    match env("RAMPART_NET").as_deref() {
        Some("off" | "0" | "false") => c.enabled = false,
        Some("on" | "1" | "true") | None => {}
        Some(other) => bail!("RAMPART_NET: {other:?} is not on or off"),
    }
    rampart_net::AddressPool::parse(&c.pool).map_err(|e| anyhow!("network.pool: {e}"))?;
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_make_policies() {
        let f = NetFlags::default();
        assert_eq!(f.policy().unwrap(), None);
        let f = NetFlags {
            allow: vec!["pypi.org".into()],
            ..NetFlags::default()
        };
        let p = f.policy().unwrap().unwrap();
        assert_eq!(p.mode, NetworkMode::Allowlist);
        assert_eq!(p.allow, vec!["pypi.org".to_string()]);
        let f = NetFlags {
            net_mode: Some("open".into()),
            deny: vec!["evil.example.com".into()],
            ..NetFlags::default()
        };
        assert_eq!(f.policy().unwrap().unwrap().mode, NetworkMode::Open);
        let f = NetFlags {
            net_mode: Some("wide".into()),
            ..NetFlags::default()
        };
        assert!(f.policy().is_err()); // Package rules: patterns, and pins that turn require_pinned on.
        let f = NetFlags {
            allow: vec!["pypi.org".into()],
            deny_package: vec!["^evil-".into()],
            pin: vec!["pypi:six==1.16.0".into()],
            ..NetFlags::default()
        };
        let p = f.policy().unwrap().unwrap().packages;
        assert_eq!(p.deny, vec!["^evil-".to_string()]);
        assert!(p.require_pinned);
        assert_eq!(p.pinned, vec!["pypi:six==1.16.0".to_string()]);
    }
}
