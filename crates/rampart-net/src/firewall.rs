//! The daemon's nftables table, built as data and loaded through `nft -j -f -`.
//!
//! Every rule matches `iifname "<prefix>*"` or `oifname "<prefix>*"` (the sandboxes' host-side
//! links), so the table touches no other traffic, and nothing in it names a sandbox: creating
//! or destroying a sandbox needs no nft call. See the crate documentation for the rules.

use crate::pool::AddressPool;
use crate::NetError;
use serde_json::{json, Value};
use std::io::Write;
use std::process::{Command, Stdio};

/// What the table is built from.
#[derive(Debug, Clone)]
pub struct FirewallSpec {
    /// Table name (family `inet`).
    pub table: String,
    /// Prefix of the sandboxes' host-side link names.
    pub link_prefix: String,
    /// The sandbox address block.
    pub pool: AddressPool,
    /// Host port of the DNS resolver.
    pub dns_port: u16,
    /// Host port of the egress proxy.
    pub proxy_port: u16,
}

/// Destinations no packet from a sandbox may have: "this network", loopback, link-local
/// (cloud metadata among them), multicast and the reserved block up to the broadcast address.
pub const NEVER_DESTINATIONS: &[(&str, u8)] = &[
    ("0.0.0.0", 8),
    ("127.0.0.0", 8),
    ("169.254.0.0", 16),
    ("224.0.0.0", 3),
];

fn m(op: &str, left: Value, right: Value) -> Value {
    json!({"match": {"op": op, "left": left, "right": right}})
}
fn meta(key: &str) -> Value {
    json!({"meta": {"key": key}})
}
fn payload(proto: &str, field: &str) -> Value {
    json!({"payload": {"protocol": proto, "field": field}})
}
fn prefix(addr: &str, len: u8) -> Value {
    json!({"prefix": {"addr": addr, "len": len}})
}
fn fib(result: &str, flags: &[&str]) -> Value {
    json!({"fib": {"result": result, "flags": flags}})
}

impl FirewallSpec {
    /// The whole table as one `nft -j` transaction: the table is added, deleted (so that a
    /// stale one is gone) and added again with its chains and rules, atomically.
    pub fn document(&self) -> Value {
        let fam = "inet";
        let t = self.table.as_str();
        let wild = format!("{}*", self.link_prefix);
        let iif = || m("==", meta("iifname"), json!(wild));
        let oif = || m("==", meta("oifname"), json!(wild));
        let pool = prefix(&self.pool.base().to_string(), self.pool.prefix_len());
        let tcp_udp = || m("==", meta("l4proto"), json!({"set": ["tcp", "udp"]}));
        let drop = json!({"drop": null});
        let accept = json!({"accept": null});
        let never: Vec<Value> = NEVER_DESTINATIONS
            .iter()
            .map(|(a, l)| prefix(a, *l))
            .collect();
        let chain = |name: &str, typ: &str, hook: &str, prio: i32| {
            json!({"add": {"chain": {"family": fam, "table": t, "name": name, "type": typ,
                "hook": hook, "prio": prio, "policy": "accept"}}})
        };
        let rule = |chain: &str, expr: Vec<Value>| json!({"add": {"rule": {"family": fam, "table": t, "chain": chain, "expr": expr}}});
        let table = json!({"table": {"family": fam, "name": t}});
        let mut doc = vec![
            json!({"metainfo": {"json_schema_version": 1}}),
            json!({"add": table}),
            json!({"delete": table}),
            json!({"add": table}),
            chain("sandbox_raw", "filter", "prerouting", -300),
            chain("sandbox_nat", "nat", "prerouting", -100),
            chain("sandbox_input", "filter", "input", 0),
            chain("sandbox_forward", "filter", "forward", 0),
            chain("sandbox_output", "filter", "output", 0),
        ];
        // Before connection tracking: what a sandbox may send at all.
        let raw = "sandbox_raw";
        doc.push(rule(
            raw,
            vec![iif(), m("==", meta("nfproto"), json!("ipv6")), drop.clone()],
        ));
        doc.push(rule(
            raw,
            vec![
                iif(),
                m("!=", payload("ip", "saddr"), pool.clone()),
                drop.clone(),
            ],
        ));
        doc.push(rule(
            raw,
            vec![
                iif(),
                m("==", fib("oif", &["saddr", "iif"]), json!(false)),
                drop.clone(),
            ],
        ));
        doc.push(rule(
            raw,
            vec![
                iif(),
                m("!=", fib("type", &["saddr"]), json!("unicast")),
                drop.clone(),
            ],
        ));
        doc.push(rule(
            raw,
            vec![
                iif(),
                m("==", payload("ip", "daddr"), json!({"set": never})),
                drop.clone(),
            ],
        ));
        doc.push(rule(
            raw,
            vec![
                iif(),
                m("==", fib("type", &["daddr"]), json!("local")),
                tcp_udp(),
                m("==", payload("th", "dport"), json!(53)),
                accept.clone(),
            ],
        ));
        doc.push(rule(
            raw,
            vec![
                iif(),
                m("==", fib("type", &["daddr"]), json!("local")),
                drop.clone(),
            ],
        ));
        doc.push(rule(
            raw,
            vec![iif(), m("==", payload("ip", "daddr"), pool), drop.clone()],
        ));
        // DNS to the resolver, every other TCP connection to the egress proxy.
        let nat = "sandbox_nat";
        doc.push(rule(
            nat,
            vec![
                iif(),
                tcp_udp(),
                m("==", payload("th", "dport"), json!(53)),
                json!({"redirect": {"port": self.dns_port}}),
            ],
        ));
        doc.push(rule(
            nat,
            vec![
                iif(),
                m("==", meta("l4proto"), json!("tcp")),
                json!({"redirect": {"port": self.proxy_port}}),
            ],
        ));
        // The host accepts from sandboxes only the proxy and the resolver.
        let input = "sandbox_input";
        doc.push(rule(
            input,
            vec![
                iif(),
                m("==", payload("tcp", "dport"), json!(self.proxy_port)),
                accept.clone(),
            ],
        ));
        doc.push(rule(
            input,
            vec![
                iif(),
                tcp_udp(),
                m("==", payload("th", "dport"), json!(self.dns_port)),
                accept,
            ],
        ));
        doc.push(rule(input, vec![iif(), drop.clone()]));
        // Nothing is routed to or from a sandbox.
        let fwd = "sandbox_forward";
        doc.push(rule(fwd, vec![iif(), drop.clone()]));
        doc.push(rule(fwd, vec![oif(), drop.clone()]));
        // The host opens nothing towards a sandbox; it only answers.
        let out = "sandbox_output";
        doc.push(rule(
            out,
            vec![
                oif(),
                m(
                    "in",
                    json!({"ct": {"key": "state"}}),
                    json!(["established", "related"]),
                ),
                json!({"accept": null}),
            ],
        ));
        doc.push(rule(out, vec![oif(), drop]));
        json!({ "nftables": doc })
    }

    /// Loads the table (replacing a previous version of it, atomically). Also checks that
    /// `route_localnet` is off (a sandbox must never reach the host's loopback).
    pub fn install(&self) -> Result<(), NetError> {
        for f in [
            "/proc/sys/net/ipv4/conf/all/route_localnet",
            "/proc/sys/net/ipv4/conf/default/route_localnet",
        ] {
            if std::fs::read_to_string(f).is_ok_and(|v| v.trim() != "0") {
                return Err(NetError::RouteLocalnet { path: f });
            }
        }
        run_nft(&self.document())
    }

    /// Removes the table, if present.
    pub fn remove(&self) -> Result<(), NetError> {
        remove_table(&self.table)
    }
}

/// Removes the `inet` table `name`, if present.
pub fn remove_table(name: &str) -> Result<(), NetError> {
    let table = json!({"table": {"family": "inet", "name": name}});
    run_nft(&json!({"nftables": [
        {"metainfo": {"json_schema_version": 1}},
        {"add": table},
        {"delete": table},
    ]}))
}

fn nft_io(step: &'static str) -> impl FnOnce(std::io::Error) -> NetError {
    move |source| NetError::NftIo { step, source }
}

/// Runs `nft -j -f -` with `doc` on its stdin.
fn run_nft(doc: &Value) -> Result<(), NetError> {
    let body = serde_json::to_vec(doc).map_err(NetError::NftEncode)?;
    let mut child = Command::new("nft")
        .args(["-j", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(nft_io("running nft (Debian package nftables)"))?;
    if let Some(mut sin) = child.stdin.take() {
        sin.write_all(&body).map_err(nft_io("writing to nft"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(nft_io("waiting for nft"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(NetError::NftFailed {
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> FirewallSpec {
        FirewallSpec {
            table: "rampart".into(),
            link_prefix: "rsv".into(),
            pool: AddressPool::parse("10.201.0.0/16").unwrap(),
            dns_port: 15053,
            proxy_port: 15001,
        }
    }

    #[test]
    fn every_rule_is_scoped_to_sandbox_links() {
        let doc = spec().document();
        let items = doc["nftables"].as_array().unwrap();
        let rules: Vec<&Value> = items
            .iter()
            .filter_map(|i| i.get("add").and_then(|a| a.get("rule")))
            .collect();
        assert!(rules.len() >= 15);
        for r in &rules {
            assert_eq!(r["table"], "rampart");
            let first = &r["expr"][0]["match"];
            let key = first["left"]["meta"]["key"].as_str().unwrap();
            assert!(key == "iifname" || key == "oifname", "{r}");
            assert_eq!(first["right"], "rsv*");
        }
        let text = doc.to_string();
        assert!(text.contains("\"redirect\":{\"port\":15053}"));
        assert!(text.contains("\"redirect\":{\"port\":15001}"));
        assert!(text.contains("169.254.0.0"));
    }

    #[test]
    fn the_table_is_replaced_atomically() {
        let doc = spec().document();
        let items = doc["nftables"].as_array().unwrap();
        assert!(items[1].get("add").is_some());
        assert!(items[2].get("delete").is_some());
        assert!(items[3].get("add").is_some());
    }
}
