//! `rampart tenant create|ls|show|set|rm` (the node administrator's): over the API
//! (`/v1/tenants`), or with `--data-dir D` against the daemon's store on its host.
//! `rampart usage [--from T] [--to T] [--tenant N] [--json]` and `rampart usage verify FILE
//! [--key K]`: a usage report, and its offline verification (`docs/tenants.md`).

use crate::client::{check, Client, Endpoint};
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use rampart_store::tenants::{TenantRow, TenantStore};
use rampart_types::tenant::{CreateTenant, Quotas, TenantInfo, UsageReport};
use reqwest::Method;
use std::path::PathBuf;

/// `rampart tenant`.
#[derive(Debug, Args)]
pub struct TenantArgs {
    /// Work on the daemon's store in this data directory (on its host) instead of the API.
    #[arg(long, value_name = "DIR", global = true)]
    data_dir: Option<PathBuf>,
    #[command(subcommand)]
    cmd: TenantCmd,
}

/// Quota flags (`unlimited` clears one in `set`).
#[derive(Debug, Args, Default)]
struct QuotaFlags {
    /// Most sandboxes not paused at once.
    #[arg(long, value_name = "N")]
    max_sandboxes: Option<String>,
    /// Most paused sandboxes at once.
    #[arg(long, value_name = "N")]
    max_paused: Option<String>,
    /// Most vCPUs of its sandboxes that are not paused, summed.
    #[arg(long, value_name = "N")]
    max_vcpus: Option<String>,
    /// Most memory of its alive sandboxes, summed (`8GiB`, `512MiB`).
    #[arg(long, value_name = "SIZE")]
    max_memory: Option<String>,
    /// Most disk: its sandboxes' disks, snapshots and volumes (`100GiB`).
    #[arg(long, value_name = "SIZE")]
    max_disk: Option<String>,
    /// Most sandbox creates (and forks) per minute.
    #[arg(long, value_name = "N")]
    creates_per_minute: Option<String>,
}

#[derive(Debug, Subcommand)]
enum TenantCmd {
    /// Make a tenant (`[a-z0-9._-]{1,64}`), with quotas (none: no limit).
    Create {
        /// Its name.
        name: String,
        #[command(flatten)]
        quotas: QuotaFlags,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// List the tenants.
    #[command(alias = "list")]
    Ls {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// One tenant, its quotas and what it holds.
    Show {
        /// Its name.
        name: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Change quotas (the flags given; `unlimited` removes one).
    Set {
        /// Its name.
        name: String,
        #[command(flatten)]
        quotas: QuotaFlags,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Set the approval policy every sandbox of the tenant is held to, at least (JSON as
    /// `approvals` at create: `{"commands": ["^rm "], "hosts": ["*.example.com"]}`).
    Approvals {
        /// Its name.
        name: String,
        /// The policy as JSON.
        #[arg(required_unless_present = "clear", conflicts_with = "clear")]
        policy: Option<String>,
        /// Remove its default policy.
        #[arg(long)]
        clear: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove tenants with no alive sandbox; their keys are revoked.
    #[command(alias = "delete")]
    Rm {
        /// Their names.
        #[arg(required = true)]
        names: Vec<String>,
    },
}

/// Parses `8GiB`, `512MiB`, `1.5GB`, `4096` (bytes).
pub fn parse_size(text: &str) -> Result<u64> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .ok()
        .filter(|n: &f64| n.is_finite() && *n >= 0.0)
        .with_context(|| format!("{text:?} is not a size like 8GiB, 512MiB, 4096"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "t" | "tb" => 1e12,
        "ki" | "kib" => 1024.0,
        "mi" | "mib" => 1024.0 * 1024.0,
        "gi" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "ti" | "tib" => 1024.0f64.powi(4),
        "p" | "pb" => 1e15,
        "pi" | "pib" => 1024.0f64.powi(5),
        u => bail!(
            "{text:?}: unknown unit {u:?} (use B, KiB, MiB, GiB, TiB, PiB, KB, MB, GB, TB, PB)"
        ),
    };
    Ok((n * mult).round() as u64)
}

/// One flag: None (not given), Some(None) (`unlimited`), Some(Some(v)).
fn flag<T>(
    name: &str,
    v: &Option<String>,
    parse: impl Fn(&str) -> Result<T>,
) -> Result<Option<Option<T>>> {
    match v.as_deref() {
        None => Ok(None),
        Some("unlimited") | Some("none") => Ok(Some(None)),
        Some(s) => Ok(Some(Some(
            parse(s).with_context(|| format!("--{name}: {s:?}"))?,
        ))),
    }
}

fn count(s: &str) -> Result<u64> {
    s.trim()
        .parse()
        .with_context(|| "not a whole number (0 or more)".to_string())
}

impl QuotaFlags {
    /// `base` with the flags given applied.
    fn apply(&self, base: &Quotas) -> Result<Quotas> {
        let mut q = base.clone();
        if let Some(v) = flag("max-sandboxes", &self.max_sandboxes, count)? {
            q.max_sandboxes = v;
        }
        if let Some(v) = flag("max-paused", &self.max_paused, count)? {
            q.max_paused = v;
        }
        if let Some(v) = flag("max-vcpus", &self.max_vcpus, |s| {
            s.trim().parse::<f64>().context("not a number of vCPUs")
        })? {
            q.max_vcpus = v;
        }
        if let Some(v) = flag("max-memory", &self.max_memory, parse_size)? {
            q.max_memory_bytes = v;
        }
        if let Some(v) = flag("max-disk", &self.max_disk, parse_size)? {
            q.max_disk_bytes = v;
        }
        if let Some(v) = flag("creates-per-minute", &self.creates_per_minute, count)? {
            q.creates_per_minute = v;
        }
        q.check().map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(q)
    }
}

/// The policy of `rampart tenant approvals` (None: `--clear`), checked as the server would.
fn parse_policy(text: Option<&str>) -> Result<Option<rampart_types::ApprovalPolicy>> {
    let Some(text) = text else { return Ok(None) };
    let p: rampart_types::ApprovalPolicy =
        serde_json::from_str(text).map_err(|e| anyhow::anyhow!("the approval policy: {e}"))?;
    rampart_core::approvals::check(&p).map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(Some(p))
}

fn row_info(store: &TenantStore, r: TenantRow) -> TenantInfo {
    TenantInfo {
        created_at: crate::commands::keys::time_of(r.created_at_ms),
        holds: store.holdings(&r.name).ok(),
        approvals: store.approvals(&r.name).ok().flatten(),
        name: r.name,
        quotas: r.quotas,
    }
}

fn limit<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

fn print(list: &[TenantInfo]) {
    println!(
        "{:<20} {:>9} {:>7} {:>6} {:>14} {:>14} {:>8} {:>18}",
        "NAME", "SANDBOXES", "PAUSED", "VCPUS", "MEMORY", "DISK", "CREATES", "HOLDS"
    );
    for t in list {
        let q = &t.quotas;
        let holds = t
            .holds
            .as_ref()
            .map(|h| format!("{}+{}p {}cpu", h.sandboxes, h.paused, h.vcpus))
            .unwrap_or_default();
        println!(
            "{:<20} {:>9} {:>7} {:>6} {:>14} {:>14} {:>8} {:>18}",
            t.name,
            limit(q.max_sandboxes),
            limit(q.max_paused),
            limit(q.max_vcpus),
            limit(q.max_memory_bytes),
            limit(q.max_disk_bytes),
            limit(q.creates_per_minute),
            holds
        );
    }
}

fn show(list: &[TenantInfo], json: bool) -> Result<()> {
    if json {
        if list.len() == 1 {
            println!("{}", serde_json::to_string_pretty(&list[0])?);
        } else {
            println!("{}", serde_json::to_string_pretty(list)?);
        }
    } else {
        print(list);
    }
    Ok(())
}

/// `rampart tenant ...` against the store (`--data-dir`).
fn run_local(dir: &std::path::Path, cmd: TenantCmd) -> Result<u8> {
    let store = TenantStore::open(&dir.join("state.db"))
        .with_context(|| format!("cannot open the tenant store in {}", dir.display()))?;
    match cmd {
        TenantCmd::Create { name, quotas, json } => {
            let q = quotas.apply(&Quotas::default())?;
            let r = store.create(&name, &q)?;
            show(&[row_info(&store, r)], json)?;
        }
        TenantCmd::Ls { json } => {
            let list: Vec<TenantInfo> = store
                .list()?
                .into_iter()
                .map(|r| row_info(&store, r))
                .collect();
            if json {
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                print(&list);
            }
        }
        TenantCmd::Show { name, json } => {
            let r = store
                .get(&name)?
                .with_context(|| format!("tenant {name} not found"))?;
            show(&[row_info(&store, r)], json)?;
        }
        TenantCmd::Set { name, quotas, json } => {
            let cur = store
                .get(&name)?
                .with_context(|| format!("tenant {name} not found"))?;
            let q = quotas.apply(&cur.quotas)?;
            let r = store.set_quotas(&name, &q)?;
            show(&[row_info(&store, r)], json)?;
        }
        TenantCmd::Approvals {
            name, policy, json, ..
        } => {
            let p = parse_policy(policy.as_deref())?;
            store.set_approvals(&name, p.as_ref())?;
            let r = store
                .get(&name)?
                .with_context(|| format!("tenant {name} not found"))?;
            show(&[row_info(&store, r)], json)?;
        }
        TenantCmd::Rm { names } => {
            for n in names {
                store.delete(&n)?;
                println!("{n}");
            }
        }
    }
    Ok(0)
}

/// `rampart tenant ...`.
pub async fn tenant(host: &Endpoint, a: TenantArgs) -> Result<u8> {
    if let Some(dir) = &a.data_dir {
        return run_local(dir, a.cmd);
    }
    let client = Client::new(host)?;
    let path = |n: &str| format!("/v1/tenants/{}", super::encode_query(n));
    match a.cmd {
        TenantCmd::Create { name, quotas, json } => {
            let body = CreateTenant {
                name,
                quotas: quotas.apply(&Quotas::default())?,
                approvals: None,
            };
            let t: TenantInfo = client
                .json(client.request(Method::POST, "/v1/tenants").json(&body))
                .await?;
            show(&[t], json)?;
        }
        TenantCmd::Ls { json } => {
            let list: Vec<TenantInfo> = client
                .json(client.request(Method::GET, "/v1/tenants"))
                .await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                print(&list);
            }
        }
        TenantCmd::Show { name, json } => {
            let t: TenantInfo = client
                .json(client.request(Method::GET, &path(&name)))
                .await?;
            show(&[t], json)?;
        }
        TenantCmd::Set { name, quotas, json } => {
            let cur: TenantInfo = client
                .json(client.request(Method::GET, &path(&name)))
                .await?;
            let q = quotas.apply(&cur.quotas)?;
            let t: TenantInfo = client
                .json(
                    client
                        .request(Method::PUT, &format!("{}/quotas", path(&name)))
                        .json(&q),
                )
                .await?;
            show(&[t], json)?;
        }
        TenantCmd::Approvals {
            name, policy, json, ..
        } => {
            let at = format!("{}/approvals", path(&name));
            let req = match parse_policy(policy.as_deref())? {
                Some(p) => client.request(Method::PUT, &at).json(&p),
                None => client.request(Method::DELETE, &at),
            };
            let t: TenantInfo = client.json(req).await?;
            show(&[t], json)?;
        }
        TenantCmd::Rm { names } => {
            for n in names {
                check(
                    client
                        .send(client.request(Method::DELETE, &path(&n)))
                        .await?,
                )
                .await?;
                println!("{n}");
            }
        }
    }
    Ok(0)
}

/// `rampart usage`.
#[derive(Debug, Args)]
pub struct UsageArgs {
    #[command(subcommand)]
    cmd: Option<UsageCmd>,
    /// Start of the range (RFC 3339; default: the start of time).
    #[arg(long, value_name = "TIME")]
    from: Option<String>,
    /// End of the range (RFC 3339; default: now).
    #[arg(long, value_name = "TIME")]
    to: Option<String>,
    /// The tenant (an administrator's choice; a tenant's key always gets its own).
    #[arg(long, value_name = "NAME")]
    tenant: Option<String>,
    /// Print the signed report as JSON (what `rampart usage verify` reads).
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Subcommand)]
enum UsageCmd {
    /// Verify a usage report offline: every record's hash and link, the totals and the
    /// node's signature. Exit 0 if it verifies, 1 (naming the first bad record) if not.
    Verify {
        /// The report (`rampart usage --json > FILE`).
        file: PathBuf,
        /// The node key it must be signed by (`ed25519:<hex>`, from `GET /v1/audit/key`).
        #[arg(long, value_name = "KEY")]
        key: Option<String>,
    },
}

/// `rampart usage ...`.
pub async fn usage(host: &Endpoint, a: UsageArgs) -> Result<u8> {
    if let Some(UsageCmd::Verify { file, key }) = a.cmd {
        let bytes = std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
        let key = match key {
            Some(k) => Some(
                rampart_audit::PublicKey::parse(&k).map_err(|e| anyhow::anyhow!("--key: {e}"))?,
            ),
            None => None,
        };
        return match rampart_audit::usage::verify_usage(&bytes, key.as_ref()) {
            Ok(ok) => {
                println!(
                    "OK: {} record(s){} signed by {}",
                    ok.records,
                    ok.tenant
                        .map(|t| format!(" of tenant {t}"))
                        .unwrap_or_default(),
                    ok.key
                );
                Ok(0)
            }
            Err(e) => {
                eprintln!("FAILED: {e}");
                Ok(1)
            }
        };
    }
    let client = Client::new(host)?;
    let mut q: Vec<(&str, String)> = Vec::new();
    if let Some(f) = a.from {
        q.push(("from", f));
    }
    if let Some(t) = a.to {
        q.push(("to", t));
    }
    if let Some(t) = a.tenant {
        q.push(("tenant", t));
    }
    let answer: serde_json::Value = client
        .json(client.request(Method::GET, "/v1/usage").query(&q))
        .await?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&answer)?);
        return Ok(0);
    }
    // A fleet's gateway answers each node's signed report: one table per node.
    if let Some(nodes) = answer.get("nodes").and_then(|n| n.as_array()) {
        for n in nodes {
            let report: UsageReport = serde_json::from_value(n["report"].clone())
                .context("a node's usage report in the gateway's answer")?;
            println!("node {}:", n["node"].as_str().unwrap_or("?"));
            print_usage(&report);
        }
        return Ok(0);
    }
    let report: UsageReport =
        serde_json::from_value(answer).context("the daemon's usage report")?;
    print_usage(&report);
    Ok(0)
}

/// A usage report as a table: one line per sandbox and the totals.
fn print_usage(report: &UsageReport) {
    println!(
        "usage of {} from {} to {}",
        report.tenant.as_deref().unwrap_or("every tenant"),
        report.from,
        report.to
    );
    println!(
        "{:<26} {:<12} {:>10} {:>12} {:>12} {:>12} {:>6} {:>10} {:>10}",
        "SANDBOX",
        "TENANT",
        "VCPU-S",
        "MEM-GIB-S",
        "DISK-GIB-S",
        "EGRESS-B",
        "EXECS",
        "RUN-S",
        "PAUSED-S"
    );
    for s in &report.sandboxes {
        println!(
            "{:<26} {:<12} {:>10.3} {:>12.3} {:>12.3} {:>12} {:>6} {:>10.3} {:>10.3}",
            s.id,
            s.tenant.as_deref().unwrap_or("-"),
            s.vcpu_seconds,
            s.memory_gib_seconds,
            s.disk_gib_seconds,
            s.egress_bytes,
            s.exec_count,
            s.running_seconds,
            s.paused_seconds
        );
    }
    let t = &report.totals;
    println!(
        "{:<26} {:<12} {:>10.3} {:>12.3} {:>12.3} {:>12} {:>6} {:>10.3} {:>10.3}",
        format!("TOTAL ({})", t.sandboxes),
        "",
        t.vcpu_seconds,
        t.memory_gib_seconds,
        t.disk_gib_seconds,
        t.egress_bytes,
        t.exec_count,
        t.running_seconds,
        t.paused_seconds
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("8GiB").unwrap(), 8 << 30);
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("1.5GB").unwrap(), 1_500_000_000);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("1PiB").unwrap(), 1 << 50);
        assert!(parse_size("-1GiB").is_err());
        assert!(parse_size("8 parsecs").is_err());
    }

    #[test]
    fn quota_flags_apply_and_clear() {
        let f = QuotaFlags {
            max_sandboxes: Some("3".into()),
            max_memory: Some("2GiB".into()),
            ..QuotaFlags::default()
        };
        let q = f.apply(&Quotas::default()).unwrap();
        assert_eq!(q.max_sandboxes, Some(3));
        assert_eq!(q.max_memory_bytes, Some(2 << 30));
        let clear = QuotaFlags {
            max_sandboxes: Some("unlimited".into()),
            ..QuotaFlags::default()
        };
        assert_eq!(clear.apply(&q).unwrap().max_sandboxes, None);
        let bad = QuotaFlags {
            max_sandboxes: Some("-2".into()),
            ..QuotaFlags::default()
        };
        assert!(bad.apply(&q).is_err());
        let absurd = QuotaFlags {
            max_vcpus: Some("1e9".into()),
            ..QuotaFlags::default()
        };
        assert!(absurd.apply(&q).is_err());
    }
}
