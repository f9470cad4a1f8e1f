//! `rampart audit show|export|verify|key`: the signed record of what ran in a sandbox.

use crate::client::{Client, Lines};
use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use rampart_audit::{verify_bundle, Activity, Event, PublicKey};
use reqwest::Method;
use serde::Deserialize;
use std::io::Write;
use std::path::{Path, PathBuf};

/// `rampart audit`.
#[derive(Debug, Args)]
pub struct AuditArgs {
    #[command(subcommand)]
    cmd: AuditCmd,
}

#[derive(Debug, Subcommand)]
enum AuditCmd {
    /// Show a sandbox's audit log as a readable timeline.
    Show(ShowArgs),
    /// Save a sandbox's bundle (events, blobs, signed tree head, proof, key) to a file.
    Export(ExportArgs),
    /// Verify a bundle offline (no daemon needed); exits 1 naming the first bad record.
    Verify(VerifyArgs),
    /// Print the daemon's audit public key (pin it when verifying).
    Key,
}

/// `rampart audit show`.
#[derive(Debug, Args)]
pub struct ShowArgs {
    /// The sandbox.
    id: String,
    /// Keep printing events as they are recorded, until the sandbox ends.
    #[arg(long, short = 'f')]
    follow: bool,
    /// Print the raw events (one JSON object per line) instead of the timeline.
    #[arg(long)]
    json: bool,
}

/// `rampart audit export`.
#[derive(Debug, Args)]
pub struct ExportArgs {
    /// The sandbox.
    id: String,
    /// Where to write the bundle (`-` for stdout).
    #[arg(long, short = 'o', value_name = "FILE")]
    output: PathBuf,
    /// `bundle` (Rampart's own, with every record and blob) or `dsse` (a DSSE envelope
    /// around an in-toto Statement v1 signed by the node, for tools that read those).
    #[arg(long, value_name = "FORMAT", default_value = "bundle", value_parser = ["bundle", "dsse"])]
    format: String,
}

/// `rampart audit verify`.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// The bundle file.
    file: PathBuf,
    /// The trusted node key (`ed25519:<hex>`, from `rampart audit key`).
    #[arg(long, value_name = "PUBKEY", conflicts_with = "key_file")]
    key: Option<String>,
    /// A file holding the trusted node key.
    #[arg(long, value_name = "FILE")]
    key_file: Option<PathBuf>,
    /// A fleet's key set (the JSON of a gateway's `GET /v1/audit/keys`): the bundle must be
    /// signed by one of its nodes' keys, which is named.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["key", "key_file"])]
    key_set: Option<PathBuf>,
    /// The bundle of the sandbox this one was made from (a snapshot's or a fork's
    /// source): checks that both verify and that this one's record begins at the
    /// parent's `snapshot` event it names, with the same digest of the saved processes.
    #[arg(long, value_name = "FILE", conflicts_with = "key_set")]
    parent: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
struct Page {
    events: Vec<Event>,
}

/// The daemon's answer of `GET /v1/audit/key`.
#[derive(Debug, Deserialize)]
pub struct KeyInfo {
    /// `ed25519:<hex>`.
    pub public_key: String,
    /// SHA-256 of the key bytes.
    pub key_id: String,
    /// Template digests.
    #[serde(default)]
    pub templates: std::collections::BTreeMap<String, String>,
}

/// Fetches the daemon's key and template digests.
pub async fn fetch_key(c: &Client) -> Result<KeyInfo> {
    c.json(c.request(Method::GET, "/v1/audit/key")).await
}

/// `rampart audit ...`.
pub async fn audit(host: &crate::client::Endpoint, a: AuditArgs) -> Result<u8> {
    match a.cmd {
        AuditCmd::Show(s) => show(host, s).await,
        AuditCmd::Export(e) => export(host, e).await,
        AuditCmd::Verify(v) => verify(v),
        AuditCmd::Key => {
            let k = fetch_key(&Client::new(host)?).await?;
            println!("{}", k.public_key);
            eprintln!("key id: {}", k.key_id);
            Ok(0)
        }
    }
}

async fn show(host: &crate::client::Endpoint, a: ShowArgs) -> Result<u8> {
    let c = Client::new(host)?;
    let mut out = std::io::stdout().lock();
    if a.follow {
        let resp = c
            .send(c.request(
                Method::GET,
                &format!("/v1/sandboxes/{}/audit?follow=1", a.id),
            ))
            .await?;
        let mut lines = Lines::new(resp.bytes_stream());
        let mut activity = Activity::default();
        while let Some(line) = lines.next().await {
            let line = line.context("reading the audit stream")?;
            if a.json {
                out.write_all(&line)?;
            } else {
                let e: Event = serde_json::from_slice(&line)
                    .context("the daemon sent an event that cannot be read")?;
                let before = activity.timeline.len();
                activity.push(e.seq, &e.time, &e.body);
                for t in &activity.timeline[before..] {
                    writeln!(out, "#{:<5} {}  {}", t.seq, t.time, t.text)?;
                }
            }
            out.flush()?;
        }
        return Ok(0);
    }
    let mut events = Vec::new();
    let mut after: Option<u64> = None;
    loop {
        let q = match after {
            Some(a) => format!("?after={a}&limit=10000"),
            None => "?limit=10000".to_owned(),
        };
        let page: Page = c
            .json(c.request(Method::GET, &format!("/v1/sandboxes/{}/audit{q}", a.id)))
            .await?;
        let n = page.events.len();
        after = page.events.last().map(|e| e.seq).or(after);
        events.extend(page.events);
        if n < 10000 {
            break;
        }
    }
    if a.json {
        for e in &events {
            serde_json::to_writer(&mut out, e)?;
            out.write_all(b"\n")?;
        }
        return Ok(0);
    }
    write!(out, "{}", Activity::from_events(&events))?;
    Ok(0)
}

/// Downloads a sandbox's bundle.
pub async fn fetch_bundle(c: &Client, id: &str) -> Result<Vec<u8>> {
    let resp = c
        .send(c.request(Method::GET, &format!("/v1/sandboxes/{id}/audit/bundle")))
        .await?;
    Ok(resp.bytes().await.context("reading the bundle")?.to_vec())
}

async fn export(host: &crate::client::Endpoint, a: ExportArgs) -> Result<u8> {
    let c = Client::new(host)?;
    let bytes = if a.format == "dsse" {
        let resp = c
            .send(c.request(Method::GET, &format!("/v1/sandboxes/{}/audit/dsse", a.id)))
            .await?;
        resp.bytes().await.context("reading the envelope")?.to_vec()
    } else {
        fetch_bundle(&c, &a.id).await?
    };
    if a.output.as_os_str() == "-" {
        std::io::stdout().lock().write_all(&bytes)?;
    } else {
        std::fs::write(&a.output, &bytes)
            .with_context(|| format!("cannot write {}", a.output.display()))?;
        eprintln!(
            "wrote {} ({} bytes); check it with `rampart audit verify {} --key $(rampart audit key)`",
            a.output.display(),
            bytes.len(),
            a.output.display()
        );
    }
    Ok(0)
}

/// Reads the trusted key from `--key` or `--key-file`.
pub fn trusted_key(key: Option<&str>, key_file: Option<&Path>) -> Result<Option<PublicKey>> {
    let text = match (key, key_file) {
        (Some(k), _) => k.trim().to_owned(),
        (None, Some(f)) => std::fs::read_to_string(f)
            .with_context(|| format!("cannot read the key file {}", f.display()))?
            .trim()
            .to_owned(),
        (None, None) => return Ok(None),
    };
    PublicKey::parse(&text)
        .map(Some)
        .map_err(|e| anyhow!("the trusted key {text:?} cannot be read: {e}"))
}

/// The keys of a fleet's key set file: (node, key).
fn key_set(file: &Path) -> Result<Vec<(String, PublicKey)>> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("cannot read the key set {}", file.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text).with_context(|| {
        format!(
            "{} is not a key set (the JSON of GET /v1/audit/keys)",
            file.display()
        )
    })?;
    let keys = v["keys"].as_array().ok_or_else(|| {
        anyhow!(
            "{}: no \"keys\" list (the JSON of GET /v1/audit/keys)",
            file.display()
        )
    })?;
    let mut out = Vec::new();
    for k in keys {
        let node = k["node"].as_str().unwrap_or("?").to_owned();
        let text = k["public_key"].as_str().unwrap_or_default();
        let key = PublicKey::parse(text)
            .map_err(|e| anyhow!("{}: node {node}'s key {text:?}: {e}", file.display()))?;
        out.push((node, key));
    }
    if out.is_empty() {
        bail!("{}: the key set is empty", file.display());
    }
    Ok(out)
}

fn verify(a: VerifyArgs) -> Result<u8> {
    if let Some(set) = &a.key_set {
        let keys = key_set(set)?;
        let bytes = std::fs::read(&a.file)
            .with_context(|| format!("cannot read the bundle {}", a.file.display()))?;
        let dsse = serde_json::from_slice::<serde_json::Value>(&bytes)
            .is_ok_and(|v| v.get("payloadType").is_some());
        let mut first_err = None;
        for (node, key) in &keys {
            let ok = if dsse {
                rampart_audit::dsse::verify_envelope(&bytes, key).is_ok()
            } else {
                match verify_bundle(&bytes, Some(key)) {
                    Ok(report) => {
                        print!("{report}");
                        true
                    }
                    Err(e) => {
                        first_err.get_or_insert(e.to_string());
                        false
                    }
                }
            };
            if ok {
                let code = if dsse {
                    verify_dsse(&a, &bytes, Some(key))?
                } else {
                    0
                };
                println!("signed by node {node} of the fleet's key set");
                return Ok(code);
            }
        }
        bail!(
            "FAILED: {}: signed by none of the {} keys in {}{}",
            a.file.display(),
            keys.len(),
            set.display(),
            first_err.map(|e| format!(" ({e})")).unwrap_or_default()
        );
    }
    let key = trusted_key(a.key.as_deref(), a.key_file.as_deref())?;
    let bytes = std::fs::read(&a.file)
        .with_context(|| format!("cannot read the bundle {}", a.file.display()))?;
    if let Some(parent) = &a.parent {
        let p = std::fs::read(parent)
            .with_context(|| format!("cannot read the parent's bundle {}", parent.display()))?;
        let l = rampart_audit::lineage::verify_lineage(&bytes, &p, key.as_ref()).map_err(|e| {
            anyhow!(
                "FAILED: {} from {}: {e}",
                a.file.display(),
                parent.display()
            )
        })?;
        println!("{l}");
        return Ok(0);
    }
    if serde_json::from_slice::<serde_json::Value>(&bytes)
        .is_ok_and(|v| v.get("payloadType").is_some())
    {
        return verify_dsse(&a, &bytes, key.as_ref());
    }
    match verify_bundle(&bytes, key.as_ref()) {
        Ok(report) => {
            print!("{report}");
            if key.is_none() {
                eprintln!(
                    "warning: no trusted key given (--key): this proves only that whoever holds \
                     the bundle's own key vouches for it"
                );
            }
            Ok(0)
        }
        Err(e) => {
            let at = e
                .seq()
                .map(|s| format!(" (record seq {s})"))
                .unwrap_or_default();
            bail!("FAILED: {}{at}: {e}", a.file.display())
        }
    }
}

/// A DSSE envelope: its signature by the trusted key (required: a DSSE envelope names no key
/// of its own), then its statement, summarised.
fn verify_dsse(a: &VerifyArgs, bytes: &[u8], key: Option<&PublicKey>) -> Result<u8> {
    let Some(key) = key else {
        bail!(
            "{}: a DSSE envelope carries no public key; give the node's with --key (rampart audit key)",
            a.file.display()
        );
    };
    let st = rampart_audit::dsse::verify_envelope(bytes, key)
        .map_err(|e| anyhow!("FAILED: {}: {e}", a.file.display()))?;
    let p = &st["predicate"];
    println!(
        "VERIFIED DSSE envelope: in-toto Statement v1, predicate {}",
        st["predicateType"].as_str().unwrap_or("?")
    );
    println!(
        "subject: {} sha256:{}",
        st["subject"][0]["name"].as_str().unwrap_or("?"),
        st["subject"][0]["digest"]["sha256"].as_str().unwrap_or("?")
    );
    println!(
        "signed by the node key {}; {} records, head in the signed tree of size {}",
        key.key_id().to_hex(),
        p["record"]["events"],
        p["record"]["tree_size"]
    );
    let list = |k: &str| p[k].as_array().map(Vec::len).unwrap_or(0);
    println!(
        "{} commands, {} file changes, {} hosts, {} approvals",
        list("commands"),
        list("files"),
        list("hosts"),
        list("approvals")
    );
    for c in p["commands"].as_array().into_iter().flatten() {
        let argv: Vec<&str> = c["argv"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str())
            .collect();
        println!(
            "  {} -> exit {} by {}{}",
            rampart_audit::report::printable(&argv.join(" ")),
            c["exit_code"],
            rampart_audit::report::printable(c["caller"].as_str().unwrap_or("?")),
            c["approval"]
                .as_str()
                .map(|a| format!(", approved [{a}]"))
                .unwrap_or_default()
        );
    }
    for f in p["artifacts"]["files"].as_array().into_iter().flatten() {
        println!(
            "  artifact {} sha256:{} ({} bytes)",
            rampart_audit::report::printable(f["path"].as_str().unwrap_or("?")),
            f["sha256"].as_str().unwrap_or("?"),
            f["size"]
        );
    }
    for ap in p["approvals"].as_array().into_iter().flatten() {
        println!(
            "  approval {}: {} {} by {}",
            ap["id"].as_str().unwrap_or("?"),
            rampart_audit::report::printable(ap["request"].as_str().unwrap_or("?")),
            ap["decision"].as_str().unwrap_or("undecided"),
            rampart_audit::report::printable(ap["decided_by"].as_str().unwrap_or("-"))
        );
    }
    Ok(0)
}
