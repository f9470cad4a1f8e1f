//! E2B's network options on Rampart's egress policy: `network` at create
//! (`allowOut`, `denyOut`, `rules`, `allowPublicTraffic`, `maskRequestHost`, `dnsServers`),
//! `allow_internet_access`, and `PUT /sandboxes/{id}/network` (`update_network`).
//!
//! The mapping (E2B's semantics: everything is allowed unless denied, and an `allowOut`
//! entry wins over a `denyOut` one):
//! - `denyOut` holding `0.0.0.0/0` (E2B's `ALL_TRAFFIC`), or `allow_internet_access: false`:
//!   mode `allowlist` with `allowOut` as its rules (nothing else gets out);
//! - `allowOut` holding `0.0.0.0/0`: mode `open` without deny rules (allow wins);
//! - otherwise mode `open` with `denyOut` as deny rules and `allowOut` as allow rules, with
//!   `precedence: allow`, so an allowed host inside a denied range stays reachable.
//!
//! `rules` (per-host header transforms) become header secrets of the egress proxy, bound to
//! the host over HTTPS and plain HTTP: the proxy sets each header on every request to that
//! host, and the values never enter the sandbox (its HTTPS to the host is intercepted with
//! the sandbox's own CA, as for any secret; docs/network.md, Secrets).

use super::E2bError;
use rampart_types::{NetworkMode, NetworkPolicy, Precedence, SecretInjection, SecretSpec};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// E2B's "all traffic" (`ALL_TRAFFIC`).
pub(crate) const ALL_TRAFFIC: &str = "0.0.0.0/0";

/// The `network` of a create (`SandboxNetworkConfig`) or the body of `PUT .../network`
/// (`SandboxNetworkUpdateConfig`, which also has `allow_internet_access`).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct E2bNetwork {
    #[serde(default)]
    allow_out: Option<Vec<String>>,
    #[serde(default)]
    deny_out: Option<Vec<String>>,
    #[serde(default)]
    rules: Option<BTreeMap<String, Vec<E2bRule>>>,
    #[serde(default)]
    pub(crate) allow_public_traffic: Option<bool>,
    #[serde(default)]
    pub(crate) mask_request_host: Option<String>,
    #[serde(default)]
    dns_servers: Option<Vec<String>>,
    #[serde(default)]
    egress_proxy: Option<Value>,
    #[serde(default)]
    pub(crate) https_ports: Option<Vec<u16>>,
    #[serde(rename = "allow_internet_access", default)]
    pub(crate) allow_internet_access: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
struct E2bRule {
    #[serde(default)]
    transform: Option<E2bTransform>,
}

#[derive(Debug, Default, Deserialize)]
struct E2bTransform {
    #[serde(default)]
    headers: Option<BTreeMap<String, String>>,
}

/// Why workload identity tokens (`iam` at create, `${e2b.identity.*}` in a rule) are refused
/// (docs/e2b.md).
pub(super) const IAM_REFUSAL: &str = "iam (workload identity tokens) is not supported by this \
server: it issues no JWT-SVID tokens, and a cloud's token exchange (AWS STS, GCP) would have to \
reach this host as an OIDC issuer. Bind the credential as a stored secret instead \
(Secret.create, then \"${e2b.secrets.NAME}\" in network.rules), which the egress proxy injects \
without the sandbox seeing it";

/// The start of a stored-secret placeholder (`Secret.fill`).
const PLACEHOLDER: &str = "${e2b.secrets.";

/// The stored secret a header value refers to by `${e2b.secrets.NAME}`, and the header's
/// template with `{value}` in its place; None for a value without a placeholder.
fn stored_secret_in(
    host: &str,
    header: &str,
    value: &str,
) -> Result<Option<(String, String)>, E2bError> {
    let Some(start) = value.find(PLACEHOLDER) else {
        return Ok(None);
    };
    let rest = &value[start + PLACEHOLDER.len()..];
    let end = rest.find('}').ok_or_else(|| {
        E2bError::bad_request(format!(
            "network.rules[{host:?}]: header {header:?}: \"${{e2b.secrets.\" is not closed by \"}}\""
        ))
    })?;
    let name = &rest[..end];
    let after = &rest[end + 1..];
    let before = &value[..start];
    if after.contains(PLACEHOLDER) {
        return Err(E2bError::bad_request(format!(
            "network.rules[{host:?}]: header {header:?} refers to more than one secret; \
             a header carries at most one"
        )));
    }
    if before.contains("{value}") || after.contains("{value}") {
        return Err(E2bError::bad_request(format!(
            "network.rules[{host:?}]: header {header:?}: \"{{value}}\" cannot stand next to a \
             secret placeholder"
        )));
    }
    if name.is_empty() {
        return Err(E2bError::bad_request(format!(
            "network.rules[{host:?}]: header {header:?}: the placeholder names no secret"
        )));
    }
    Ok(Some((name.to_owned(), format!("{before}{{value}}{after}"))))
}

/// The egress policy and header secrets of an E2B network (None: no `network` given) and
/// `allow_internet_access`. Refuses what this server cannot do, saying why.
pub(crate) fn policy_of(
    net: Option<&E2bNetwork>,
    allow_internet_access: Option<bool>,
) -> Result<(NetworkPolicy, Vec<SecretSpec>), E2bError> {
    let empty = E2bNetwork::default();
    let net = net.unwrap_or(&empty);
    let upstream = egress_proxy_of(net.egress_proxy.as_ref())?;
    let https = net.https_ports.as_deref().unwrap_or_default();
    if https.len() > 64 {
        return Err(E2bError::bad_request(
            "network.httpsPorts: at most 64 ports",
        ));
    }
    for &p in https {
        if p == 0 || p == super::envd::ENVD_PORT {
            return Err(E2bError::bad_request(format!(
                "network.httpsPorts: {p} is not a port a server of the sandbox can take \
                 (envd's {} is always plain HTTP)",
                super::envd::ENVD_PORT
            )));
        }
    }
    if let Some(m) = &net.mask_request_host {
        if m.is_empty()
            || m.len() > 253
            || !m
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-.:${}_".contains(&b))
        {
            return Err(E2bError::bad_request(format!(
                "network.maskRequestHost {m:?}: not a host name (letters, digits, '-', '.', \
                 ':' and ${{PORT}})"
            )));
        }
    }
    for d in net.dns_servers.iter().flatten() {
        if d.parse::<std::net::Ipv4Addr>().is_err() {
            return Err(E2bError::bad_request(format!(
                "network.dnsServers: {d:?} is not an IPv4 address"
            )));
        }
    }
    let is_all = |s: &String| s.trim() == ALL_TRAFFIC;
    let allow: Vec<String> = net.allow_out.iter().flatten().cloned().collect();
    let deny: Vec<String> = net.deny_out.iter().flatten().cloned().collect();
    for r in allow.iter().chain(&deny) {
        if r.trim().is_empty() {
            return Err(E2bError::bad_request(
                "network: an empty allowOut/denyOut entry",
            ));
        }
    }
    let allow_all = allow.iter().any(is_all);
    let deny_all = deny.iter().any(is_all) || allow_internet_access == Some(false);
    let rest = |v: &[String]| -> Vec<String> {
        v.iter()
            .filter(|s| !is_all(s))
            .map(|s| s.trim().to_owned())
            .collect()
    };
    let mut policy = if allow_all {
        NetworkPolicy {
            mode: NetworkMode::Open,
            allow: rest(&allow),
            ..Default::default()
        }
    } else if deny_all {
        NetworkPolicy {
            mode: NetworkMode::Allowlist,
            allow: rest(&allow),
            ..Default::default()
        }
    } else {
        NetworkPolicy {
            mode: NetworkMode::Open,
            allow: rest(&allow),
            deny: rest(&deny),
            precedence: Precedence::Allow,
            ..Default::default()
        }
    };
    policy.upstream_proxy = upstream;
    let mut secrets: Vec<SecretSpec> = Vec::new();
    for (host, rules) in net.rules.iter().flatten() {
        let h = host.trim().to_ascii_lowercase();
        if h.parse::<std::net::IpAddr>().is_ok() || h.contains('/') {
            return Err(E2bError::bad_request(format!(
                "network.rules: {host:?}: header transforms are bound to host names on this \
                 server (the proxy matches them by TLS name or Host), not to addresses"
            )));
        }
        for rule in rules {
            let headers = rule
                .transform
                .as_ref()
                .and_then(|t| t.headers.as_ref())
                .into_iter()
                .flatten();
            for (name, value) in headers {
                if value.is_empty() {
                    return Err(E2bError::bad_request(format!(
                        "network.rules[{host:?}]: header {name:?} has an empty value"
                    )));
                }
                if value.contains("${e2b.identity.") {
                    // Never sent as it is: the placeholder would reach the host verbatim.
                    return Err(E2bError::bad_request(format!(
                        "network.rules[{host:?}]: header {name:?}: {}",
                        IAM_REFUSAL
                    )));
                }
                let host = format!("http://{h}");
                match stored_secret_in(&h, name, value)? {
                    // `${e2b.secrets.NAME}`: a reference to the stored secret (an empty
                    // value, which core fills from the store); one entry per secret, bound
                    // to every host whose rules use it the same way.
                    Some((secret, template)) => {
                        let inject = SecretInjection::Header {
                            name: name.clone(),
                            template,
                        };
                        if let Some(same) = secrets.iter_mut().find(|s| s.name == secret) {
                            if same.inject != inject || !same.value.is_empty() {
                                return Err(E2bError::bad_request(format!(
                                    "network.rules[{host:?}]: secret {secret:?} is used in \
                                     two different headers; a sandbox binds one secret to one \
                                     header (store a second secret for the other)"
                                )));
                            }
                            if !same.hosts.contains(&host) {
                                same.hosts.push(host);
                            }
                        } else {
                            secrets.push(SecretSpec {
                                name: secret,
                                value: String::new(),
                                hosts: vec![host],
                                inject,
                                env: None,
                            });
                        }
                    }
                    None => secrets.push(SecretSpec {
                        name: format!("e2b-rule-{}", secrets.len() + 1),
                        value: value.clone(),
                        hosts: vec![host],
                        inject: SecretInjection::Header {
                            name: name.clone(),
                            template: "{value}".into(),
                        },
                        env: None,
                    }),
                }
            }
        }
    }
    Ok((policy, secrets))
}

/// E2B's `egressProxy` (`{address, username?, password?, tls?: {enabled, serverName?,
/// caCert?}}`) as the policy's upstream proxy; null or absent: none.
fn egress_proxy_of(v: Option<&Value>) -> Result<Option<rampart_types::UpstreamProxy>, E2bError> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Tls {
        enabled: bool,
        #[serde(rename = "serverName", default)]
        server_name: Option<String>,
        #[serde(rename = "caCert", default)]
        ca_cert: Option<String>,
    }
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Proxy {
        address: String,
        #[serde(default)]
        username: Option<String>,
        #[serde(default)]
        password: Option<String>,
        #[serde(default)]
        tls: Option<Tls>,
    }
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let p: Proxy = serde_json::from_value(v.clone())
        .map_err(|e| E2bError::bad_request(format!("network.egressProxy: {e}")))?;
    let tls = p.tls.unwrap_or(Tls {
        enabled: false,
        server_name: None,
        ca_cert: None,
    });
    if !tls.enabled && (tls.server_name.is_some() || tls.ca_cert.is_some()) {
        return Err(E2bError::bad_request(
            "network.egressProxy.tls: serverName and caCert need enabled: true",
        ));
    }
    let u = rampart_types::UpstreamProxy {
        address: p.address,
        username: p.username,
        password: p.password,
        tls: tls.enabled,
        server_name: tls.server_name,
        ca_cert: tls.ca_cert,
    };
    u.validate()
        .map_err(|e| E2bError::bad_request(format!("network.egressProxy: {e}")))?;
    Ok(Some(u))
}

/// The `network` of the info endpoint: what was given, header values left out (they are
/// the proxy's alone, like every secret's), and the proxy's password.
pub(crate) fn info_of(net: &E2bNetwork) -> Value {
    let mut v = json!({});
    if let Some(a) = &net.allow_out {
        v["allowOut"] = json!(a);
    }
    if let Some(d) = &net.deny_out {
        v["denyOut"] = json!(d);
    }
    if let Some(rules) = &net.rules {
        let shown: BTreeMap<&String, Vec<Value>> = rules
            .iter()
            .map(|(host, rs)| {
                let list = rs
                    .iter()
                    .map(
                        |r| match r.transform.as_ref().and_then(|t| t.headers.as_ref()) {
                            Some(h) => {
                                let names: BTreeMap<&String, &str> =
                                    h.keys().map(|k| (k, "<set by the proxy>")).collect();
                                json!({"transform": {"headers": names}})
                            }
                            None => json!({}),
                        },
                    )
                    .collect();
                (host, list)
            })
            .collect();
        v["rules"] = json!(shown);
    }
    if let Some(d) = &net.dns_servers {
        v["dnsServers"] = json!(d);
    }
    if let Some(p) = net.allow_public_traffic {
        v["allowPublicTraffic"] = json!(p);
    }
    if let Some(m) = &net.mask_request_host {
        v["maskRequestHost"] = json!(m);
    }
    if let Some(p) = net.https_ports.as_ref().filter(|p| !p.is_empty()) {
        v["httpsPorts"] = json!(p);
    }
    if let Ok(Some(u)) = egress_proxy_of(net.egress_proxy.as_ref()) {
        let mut shown = json!({"address": u.address});
        if let Some(n) = u.username {
            shown["username"] = json!(n);
        }
        if u.tls {
            shown["tls"] = json!({"enabled": true});
            if let Some(s) = u.server_name {
                shown["tls"]["serverName"] = json!(s);
            }
        }
        v["egressProxy"] = shown;
    }
    v
}

/// Parses a `network` value (of a create or an update).
pub(crate) fn parse(v: &Value) -> Result<E2bNetwork, E2bError> {
    serde_json::from_value(v.clone()).map_err(|e| E2bError::bad_request(format!("network: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(v: Value) -> E2bNetwork {
        parse(&v).unwrap()
    }

    #[test]
    fn e2b_lists_map_onto_the_policy() {
        // Nothing given: open, nothing denied.
        let (p, s) = policy_of(None, None).unwrap();
        assert_eq!(p.mode, NetworkMode::Open);
        assert!(p.allow.is_empty() && p.deny.is_empty() && s.is_empty());
        // allow_internet_access=false: nothing gets out.
        let (p, _) = policy_of(None, Some(false)).unwrap();
        assert_eq!(p.mode, NetworkMode::Allowlist);
        assert!(p.allow.is_empty());
        // Deny everything but one host.
        let n = net(json!({"allowOut": ["api.example.com", "1.1.1.1"], "denyOut": [ALL_TRAFFIC]}));
        let (p, _) = policy_of(Some(&n), None).unwrap();
        assert_eq!(p.mode, NetworkMode::Allowlist);
        assert_eq!(p.allow, vec!["api.example.com", "1.1.1.1"]);
        assert!(p.deny.is_empty());
        // Deny a range but one address in it: open, allow wins.
        let n = net(json!({"allowOut": ["8.8.8.8"], "denyOut": ["8.8.8.0/24"]}));
        let (p, _) = policy_of(Some(&n), None).unwrap();
        assert_eq!(p.mode, NetworkMode::Open);
        assert_eq!(p.precedence, Precedence::Allow);
        assert_eq!(p.deny, vec!["8.8.8.0/24"]);
        // allowOut of all traffic wins over any deny.
        let n = net(json!({"allowOut": [ALL_TRAFFIC], "denyOut": [ALL_TRAFFIC]}));
        let (p, _) = policy_of(Some(&n), Some(false)).unwrap();
        assert_eq!(p.mode, NetworkMode::Open);
        assert!(p.deny.is_empty());
    }

    #[test]
    fn rules_become_header_secrets_and_hide_their_values() {
        let n = net(json!({
            "allowOut": ["api.example.com"],
            "denyOut": [ALL_TRAFFIC],
            "rules": {"API.example.com": [
                {"transform": {"headers": {"Authorization": "Bearer s3cr3t", "X-Team": "t1"}}},
                {}
            ]},
        }));
        let (_, s) = policy_of(Some(&n), None).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].hosts, vec!["http://api.example.com"]);
        assert_eq!(s[0].value, "Bearer s3cr3t");
        assert!(
            matches!(&s[0].inject, SecretInjection::Header { name, template }
            if name == "Authorization" && template == "{value}")
        );
        let shown = info_of(&n).to_string();
        assert!(!shown.contains("s3cr3t") && shown.contains("Authorization"));
        // Addresses cannot carry header rules; envd's port is never an HTTPS port.
        let ok = net(json!({"httpsPorts": [3000, 8443]}));
        assert!(policy_of(Some(&ok), None).is_ok());
        assert_eq!(info_of(&ok)["httpsPorts"], json!([3000, 8443]));
        for bad in [
            json!({"rules": {"10.0.0.1": [{"transform": {"headers": {"a": "b"}}}]}}),
            json!({"httpsPorts": [49983]}),
            json!({"httpsPorts": [0]}),
            json!({"maskRequestHost": "bad host"}),
            json!({"dnsServers": ["dns.google"]}),
        ] {
            assert!(policy_of(Some(&net(bad.clone())), None).is_err(), "{bad}");
        }
    }
}
