//! Network policy of a sandbox, its secrets, and the records of its network log.
//!
//! The policy is data: the daemon enforces it on the host side (nftables, a per-sandbox DNS
//! resolver, an egress proxy), where the sandbox cannot reach. See `docs/network.md`.

use serde::{Deserialize, Serialize};

/// How much network a sandbox gets.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum NetworkMode {
    /// Loopback only (the default of the native API).
    #[default]
    None,
    /// Only what `allow` names (and `deny` does not).
    Allowlist,
    /// Everything except `deny` and the always-blocked addresses.
    Open,
}

impl NetworkMode {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            NetworkMode::None => "none",
            NetworkMode::Allowlist => "allowlist",
            NetworkMode::Open => "open",
        }
    }
}

/// Which of a policy's lists wins for a destination both match.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Precedence {
    /// A deny rule wins over any allow rule (the native API's default).
    #[default]
    Deny,
    /// An allow rule wins over any deny rule (E2B's semantics).
    Allow,
}

impl Precedence {
    /// Whether this is the default (`deny`).
    pub fn is_default(&self) -> bool {
        *self == Precedence::Deny
    }
}

/// Per-sandbox egress limits; absent fields mean no limit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkLimits {
    /// Egress bandwidth cap in megabits per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_mbps: Option<u32>,
    /// New outbound connections allowed per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connections_per_second: Option<u32>,
}

/// A sandbox's network policy (`network` in the create body, `PUT /v1/sandboxes/{id}/network`).
///
/// Rules are strings: a domain (`pypi.org`), a wildcard domain (`*.github.com`: any name
/// below github.com, not github.com itself), an IP address or CIDR (`10.1.2.0/24`), each
/// optionally with `:port`. Deny wins over allow; an empty allowlist allows nothing. Cloud
/// metadata, link-local, loopback, the host's addresses, the daemon and other sandboxes stay
/// unreachable whatever the policy; private ranges only when a rule names them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkPolicy {
    /// `none`, `allowlist` or `open`.
    #[serde(default)]
    pub mode: NetworkMode,
    /// Allowed destinations (used by `allowlist`).
    #[serde(default)]
    pub allow: Vec<String>,
    /// Denied destinations (win over `allow` unless `precedence` is `allow`, and apply in
    /// `open` mode).
    #[serde(default)]
    pub deny: Vec<String>,
    /// Which list wins when a destination matches both: `deny` (the default) or `allow`
    /// (E2B's `allowOut`/`denyOut` semantics: an allowed host stays reachable inside a
    /// denied range).
    #[serde(default, skip_serializing_if = "Precedence::is_default")]
    pub precedence: Precedence,
    /// Egress limits.
    #[serde(default)]
    pub limits: NetworkLimits,
    /// Rules for packages fetched from the registries the proxy recognises (see
    /// `docs/network.md`, "Packages"); absent means none.
    #[serde(default, skip_serializing_if = "PackagePolicy::is_empty")]
    pub packages: PackagePolicy,
    /// A SOCKS5 proxy of the caller's that every allowed TCP connection goes out through
    /// (after the policy judged it; fails closed when the proxy cannot be reached). Absent:
    /// connections go out directly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_proxy: Option<UpstreamProxy>,
}

impl NetworkPolicy {
    /// The policy as records and answers show it: the upstream proxy's password left out
    /// (it is kept only in the daemon's state, as secret values are).
    pub fn public(&self) -> NetworkPolicy {
        let mut p = self.clone();
        if let Some(u) = &mut p.upstream_proxy {
            u.password = None;
        }
        p
    }
}

/// A SOCKS5 proxy (RFC 1928, with RFC 1929 user name and password when given) that a
/// sandbox's allowed TCP connections are tunneled through, from the host: nothing of it is
/// inside the sandbox. The address is resolved at each dial and must be a public one (or in
/// a range the operator allows, `[network] upstream_proxy_allow`); the destination is given
/// to the proxy as the address the policy judged.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpstreamProxy {
    /// `host:port` (a name or an IP literal; `[v6]:port`).
    pub address: String,
    /// User name (RFC 1929), with `password`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// Password. Write-only: never in a record or an answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    /// TLS to the proxy (the system's roots, or `ca_cert`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tls: bool,
    /// The name the proxy's certificate is checked against (default: the address's host).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_name: Option<String>,
    /// PEM certificate(s) trusted for the proxy instead of the system's roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_cert: Option<String>,
}

impl std::fmt::Debug for UpstreamProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamProxy")
            .field("address", &self.address)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("tls", &self.tls)
            .field("server_name", &self.server_name)
            .field("ca_cert", &self.ca_cert.as_ref().map(|_| "<pem>"))
            .finish()
    }
}

/// Why an [`UpstreamProxy`] is not acceptable. The messages name the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpstreamProxyError {
    /// An address starting with `[` that is not `[addr]:port`.
    #[error("{address:?}: an IPv6 address is written [addr]:port")]
    Ipv6Form {
        /// The address as written (trimmed).
        address: String,
    },
    /// An address without a `:port`.
    #[error("{address:?}: not host:port")]
    NotHostPort {
        /// The address as written (trimmed).
        address: String,
    },
    /// A port that is not a number from 1 to 65535.
    #[error("{address:?}: {port:?} is not a port")]
    Port {
        /// The address as written (trimmed).
        address: String,
        /// The port part.
        port: String,
    },
    /// A host that is neither an IP address nor a plausible host name.
    #[error("{address:?}: {host:?} is not a host name or address")]
    Host {
        /// The address as written (trimmed).
        address: String,
        /// The host part.
        host: String,
    },
    /// A user name or password that is empty or longer than 255 bytes (RFC 1929).
    #[error("{field}: 1 to 255 bytes (RFC 1929)")]
    CredentialSize {
        /// `username` or `password`.
        field: &'static str,
    },
    /// A password without a user name.
    #[error("password: given without a username")]
    PasswordWithoutUsername,
    /// `server_name` or `ca_cert` without `tls`.
    #[error("server_name and ca_cert need tls")]
    TlsSettingsWithoutTls,
    /// A `ca_cert` that is not PEM certificates, or is larger than 64 KiB.
    #[error("ca_cert: PEM certificates (at most 64 KiB)")]
    CaCert,
}

impl UpstreamProxy {
    /// The host and port of `address`; an error names what is wrong.
    pub fn host_port(&self) -> Result<(String, u16), UpstreamProxyError> {
        let a = self.address.trim();
        let (host, port) = if let Some(rest) = a.strip_prefix('[') {
            let (h, p) = rest
                .split_once("]:")
                .ok_or_else(|| UpstreamProxyError::Ipv6Form { address: a.into() })?;
            (h, p)
        } else {
            a.rsplit_once(':')
                .ok_or_else(|| UpstreamProxyError::NotHostPort { address: a.into() })?
        };
        let port: u16 =
            port.parse()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| UpstreamProxyError::Port {
                    address: a.into(),
                    port: port.into(),
                })?;
        let ok_host = !host.is_empty()
            && host.len() <= 253
            && (host.parse::<std::net::IpAddr>().is_ok()
                || host
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.'));
        if !ok_host {
            return Err(UpstreamProxyError::Host {
                address: a.into(),
                host: host.into(),
            });
        }
        Ok((host.to_owned(), port))
    }

    /// Checks the fields: the address, the credentials' sizes (RFC 1929: 1 to 255 bytes each,
    /// a password only with a user name), and that TLS settings come with `tls`.
    pub fn validate(&self) -> Result<(), UpstreamProxyError> {
        self.host_port()?;
        let sized = |field: &'static str, v: &Option<String>| match v {
            Some(s) if s.is_empty() || s.len() > 255 => {
                Err(UpstreamProxyError::CredentialSize { field })
            }
            _ => Ok(()),
        };
        sized("username", &self.username)?;
        sized("password", &self.password)?;
        if self.password.is_some() && self.username.is_none() {
            return Err(UpstreamProxyError::PasswordWithoutUsername);
        }
        if !self.tls && (self.server_name.is_some() || self.ca_cert.is_some()) {
            return Err(UpstreamProxyError::TlsSettingsWithoutTls);
        }
        if let Some(pem) = &self.ca_cert {
            if !pem.contains("-----BEGIN CERTIFICATE-----") || pem.len() > 64 * 1024 {
                return Err(UpstreamProxyError::CaCert);
            }
        }
        Ok(())
    }
}

/// What packages a sandbox may fetch through its network (`network.packages`).
///
/// The egress proxy recognises downloads from PyPI, npm, Debian-style pools and crates.io
/// by their URLs; a refused download gets a 403 from the proxy before any byte of it reaches
/// the sandbox.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PackagePolicy {
    /// Regular expressions (Rust `regex` syntax, unanchored unless written with `^`/`$`)
    /// matched against the package's normalized name (lowercase; for PyPI, runs of `-`, `_`
    /// and `.` become `-`); a package that matches one is refused, in every ecosystem.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<String>,
    /// Only what `pinned` names may be fetched: a download of any other package, or of
    /// another version of a pinned one, is refused.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub require_pinned: bool,
    /// Pins, `name==version` (any ecosystem) or `ecosystem:name==version` with ecosystem
    /// `pypi`, `npm`, `debian` or `crates`. Only with `require_pinned`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pinned: Vec<String>,
}

impl PackagePolicy {
    /// No rule at all (the default).
    pub fn is_empty(&self) -> bool {
        self.deny.is_empty() && !self.require_pinned && self.pinned.is_empty()
    }
}

/// A package download the egress proxy recognised (network log entries of kind `package`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PackageFetch {
    /// `pypi`, `npm`, `debian` or `crates`.
    pub ecosystem: String,
    /// The package's name, normalized (see [`PackagePolicy::deny`]).
    pub name: String,
    /// Its version as the file name gives it.
    pub version: String,
    /// The registry host it came from.
    pub registry: String,
    /// The request's path (without the query).
    pub path: String,
    /// SHA-256 (hex) of the response body as fetched; `None` when refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// Size in bytes of that body; `None` when refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
}

/// One entry of `GET /v1/sandboxes/{id}/packages`: a `package` event of the audit record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PackageEntry {
    /// The audit event's `seq`.
    pub seq: u64,
    /// The audit event's time.
    pub time: String,
    /// `pypi`, `npm`, `debian` or `crates`.
    pub ecosystem: String,
    /// The package's name (normalized).
    pub name: String,
    /// Its version.
    pub version: String,
    /// The registry host.
    pub registry: String,
    /// The request's path.
    pub path: String,
    /// SHA-256 (hex) of what was fetched; `null` when refused.
    pub sha256: Option<String>,
    /// Bytes fetched; `null` when refused.
    pub size: Option<u64>,
    /// `allowed` or `denied`.
    pub verdict: String,
    /// The rule that decided (`package`, `pinned:<pin>`, `package-deny:<pattern>`,
    /// `unpinned`).
    pub rule: String,
}

/// How the egress proxy places a secret on requests to its hosts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum SecretInjection {
    /// Sets a header: `template` is its value with `{value}` standing for the secret, e.g.
    /// `Bearer {value}`.
    Header {
        /// Header name, e.g. `Authorization`.
        name: String,
        /// Header value template; must contain `{value}`.
        template: String,
    },
    /// HTTP basic auth with this user name and the secret as password.
    Basic {
        /// The user name.
        username: String,
    },
    /// Replaces the placeholder wherever the sandbox put it in the request headers.
    #[default]
    Placeholder,
}

/// A secret given at create or through `/v1/secrets`. Its value never enters the sandbox: the
/// sandbox sees a placeholder (in the env var `env`, when set) and the egress proxy swaps in
/// the value on requests to `hosts` only.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SecretSpec {
    /// Name (letters, digits, `_`, `-`); what audit records and logs show.
    pub name: String,
    /// The secret value. Write-only: never returned by any API.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub value: String,
    /// Hosts (domain rules as in the policy) the secret may be sent to. In a create's
    /// reference to a stored secret (empty `value`), empty means the stored ones.
    #[serde(default)]
    pub hosts: Vec<String>,
    /// Where it goes on the request. In a create's reference to a stored secret (empty
    /// `value`), absent (or `placeholder`) means the stored one.
    #[serde(default)]
    pub inject: SecretInjection,
    /// Environment variable that holds the placeholder inside the sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<String>,
}

impl std::fmt::Debug for SecretSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretSpec")
            .field("name", &self.name)
            .field("value", &"<redacted>")
            .field("hosts", &self.hosts)
            .field("inject", &self.inject)
            .field("env", &self.env)
            .finish()
    }
}

/// A secret as the API shows it: everything but the value, plus the placeholder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SecretInfo {
    /// Name.
    pub name: String,
    /// Hosts it is bound to.
    pub hosts: Vec<String>,
    /// Where it goes.
    pub inject: SecretInjection,
    /// The placeholder the sandbox sees.
    pub placeholder: String,
    /// The env var holding the placeholder, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<String>,
}

/// What a network log entry records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum NetEventKind {
    /// A DNS query and the answer given.
    Dns,
    /// A connection attempt and its verdict.
    Connect,
    /// A connection ended (bytes counted).
    Close,
    /// A secret was injected into a request.
    SecretUsed,
    /// A package download was recognised (completed, or refused by the policy).
    Package,
}

/// A verdict of the policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Let through.
    Allow,
    /// Refused.
    Deny,
}

/// One entry of `GET /v1/sandboxes/{id}/network/log`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct NetLogEntry {
    /// Sequence number within the sandbox's log, from 1.
    pub seq: u64,
    /// RFC 3339 time.
    pub time: String,
    /// What happened.
    pub kind: NetEventKind,
    /// The name asked for or seen (DNS name, SNI or Host), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// DNS record type (`A`, `AAAA`, `TXT`, ...) for DNS entries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qtype: Option<String>,
    /// Addresses answered (DNS) or the destination address (connections).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addrs: Vec<String>,
    /// Destination port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// The verdict.
    pub verdict: Verdict,
    /// The rule that decided (`allow:pypi.org`, `deny:evil.example.com`, `default`,
    /// `blocked:metadata`, ...).
    pub rule: String,
    /// Bytes sent by the sandbox (close entries).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_out: Option<u64>,
    /// Bytes received by the sandbox (close entries).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_in: Option<u64>,
    /// Secret name (secret_used entries).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// The package (package entries).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub package: Option<PackageFetch>,
}

/// `GET /v1/sandboxes/{id}/network`: the policy in force and, for a sandbox with a network,
/// its addresses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct NetworkInfo {
    /// The policy in force (`mode: none` for a sandbox without network).
    pub policy: NetworkPolicy,
    /// The sandbox's address on its `eth0`, while it has a network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Its gateway: the host side of its link, where its DNS and connections go.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
}

/// A page of `GET /v1/sandboxes/{id}/network/log`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct NetLogPage {
    /// Entries with `seq` above the `after` asked for, oldest first.
    pub entries: Vec<NetLogEntry>,
}

/// A named secret held by the daemon (`/v1/secrets`), as the API shows it: never the value.
/// A create refers to it by a `secrets` entry with its name and an empty value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StoredSecretInfo {
    /// Name.
    pub name: String,
    /// Hosts it is bound to.
    pub hosts: Vec<String>,
    /// Where it goes.
    pub inject: SecretInjection,
    /// The env var that holds its placeholder in a sandbox, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<String>,
    /// RFC 3339 time it was first set.
    pub created_at: String,
    /// RFC 3339 time its value or binding last changed.
    pub updated_at: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_upstream_proxy_password_is_write_only() {
        let p: NetworkPolicy = serde_json::from_value(serde_json::json!({
            "mode": "open",
            "upstream_proxy": {"address": "proxy.example.com:1080", "username": "u",
                               "password": "hunter2-secret"}
        }))
        .unwrap();
        let u = p.upstream_proxy.as_ref().unwrap();
        assert_eq!(u.host_port().unwrap(), ("proxy.example.com".into(), 1080));
        assert!(u.validate().is_ok());
        assert!(!format!("{u:?}").contains("hunter2"));
        let shown = serde_json::to_string(&p.public()).unwrap();
        assert!(
            !shown.contains("hunter2") && shown.contains("proxy.example.com"),
            "{shown}"
        );
        // Kept whole where the daemon keeps it.
        assert!(serde_json::to_string(&p).unwrap().contains("hunter2"));
        let bad = |v: serde_json::Value| -> String {
            serde_json::from_value::<UpstreamProxy>(v)
                .unwrap()
                .validate()
                .unwrap_err()
                .to_string()
        };
        assert!(bad(serde_json::json!({"address": "nohost"})).contains("host:port"));
        assert!(bad(serde_json::json!({"address": "h:0"})).contains("port"));
        assert!(bad(serde_json::json!({"address": "h:1", "password": "x"})).contains("username"));
        assert!(bad(serde_json::json!({"address": "h:1", "ca_cert": "x"})).contains("tls"));
        assert!(bad(serde_json::json!({"address": "a b:1"})).contains("host"));
        let v6: UpstreamProxy =
            serde_json::from_value(serde_json::json!({"address": "[2001:db8::1]:1080"})).unwrap();
        assert_eq!(v6.host_port().unwrap(), ("2001:db8::1".into(), 1080));
    }
}
