//! The subcommands, one module each. Each returns the process's exit code.

pub mod approve;
pub mod artifacts;
pub mod audit;
pub mod cp;
pub mod desktop;
pub mod exec;
pub mod fleet;
pub mod keys;
pub mod mcp;
pub mod net;
pub mod persist;
pub mod port;
pub mod replay;
pub mod run;
pub mod sandbox;
pub mod secret;
pub mod serve;
pub mod template;
pub mod tenant;

use anyhow::{anyhow, Result};
use std::collections::BTreeMap;

/// Parses `K=V` pairs (`--env`, `--metadata`).
pub fn parse_pairs(flag: &str, pairs: &[String]) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for p in pairs {
        let (k, v) = p
            .split_once('=')
            .ok_or_else(|| anyhow!("{flag}: expected KEY=VALUE, got {p:?}"))?;
        if k.is_empty() {
            return Err(anyhow!("{flag}: empty key in {p:?}"));
        }
        out.insert(k.to_owned(), v.to_owned());
    }
    Ok(out)
}

/// Percent-encodes a query value.
pub fn encode_query(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_parse() {
        let m = parse_pairs("--env", &["A=1".into(), "B=x=y".into(), "C=".into()]).unwrap();
        assert_eq!(m["B"], "x=y");
        assert_eq!(m["C"], "");
        assert!(parse_pairs("--env", &["A".into()]).is_err());
        assert!(parse_pairs("--env", &["=1".into()]).is_err());
    }

    #[test]
    fn query_values_are_encoded() {
        assert_eq!(encode_query("/a b/ü&x=1"), "/a%20b/%C3%BC%26x%3D1");
    }
}
