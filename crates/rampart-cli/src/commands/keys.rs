//! `rampart keys create|import|ls|rm`: API keys, of the native API (`--native`: `rampart_...`,
//! sent as `Authorization: Bearer` over TCP) and of the E2B-compatible API (`e2b_...`).
//!
//! A daemon's keys live in its `state.db` (stored as SHA-256 digests), so these commands
//! open the data directory directly, on the daemon's host, as its administrator. The daemon
//! looks every key up at each request: a key removed here is refused at once.
//!
//! With `--host` / `RAMPART_HOST` (and no `--data-dir`), they act on that endpoint over its
//! API instead (`/v1/keys`, with `RAMPART_API_KEY`): a fleet's gateway keeps the fleet's keys
//! in etcd. A single daemon has no key API, and the command says so rather than act on this
//! host's data directory.

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use rampart_store::keys::KeyStore;
use rampart_store::node_keys::{NewKey, NodeKeyStore, SCOPE_ADMIN};
use std::path::PathBuf;

/// `rampart keys`.
#[derive(Debug, Args)]
pub struct KeysArgs {
    /// The daemon's data directory (default: as `rampart serve`).
    #[arg(long, value_name = "DIR", global = true)]
    data_dir: Option<PathBuf>,
    #[command(subcommand)]
    command: KeysCommand,
}

#[derive(Debug, Subcommand)]
enum KeysCommand {
    /// Make a key and print it (shown only once): an E2B key, or with --native a key of the
    /// native API.
    Create {
        /// A name to tell the key apart in `rampart keys ls`.
        #[arg(long, default_value = "")]
        name: String,
        /// A key of the native API (`rampart_...`) rather than of the E2B API.
        #[arg(long, conflicts_with = "e2b")]
        native: bool,
        /// A key of the E2B API (the default without --tenant).
        #[arg(long)]
        e2b: bool,
        /// The tenant the key acts for (it sees only that tenant's sandboxes); a native key
        /// unless --e2b.
        #[arg(long, value_name = "NAME")]
        tenant: Option<String>,
        /// Scope of a native key (repeatable): sandboxes, exec, files, network, secrets,
        /// templates, audit, approve, admin. Default: admin for the node's keys, everything
        /// but admin for a tenant's.
        #[arg(long = "scope", value_name = "SCOPE", conflicts_with = "e2b")]
        scopes: Vec<String>,
        /// A native key stops working after this long (`90m`, `12h`, `30d`, `3600s`).
        #[arg(long, value_name = "DURATION", conflicts_with = "e2b")]
        expires: Option<String>,
        /// Print `{"key": ..., "id": ...}`.
        #[arg(long)]
        json: bool,
    },
    /// Register a native key made elsewhere (read from stdin), e.g. one secret given to many
    /// nodes.
    Import {
        /// A name to tell the key apart in `rampart keys ls`.
        #[arg(long, default_value = "")]
        name: String,
        /// Scope (repeatable; today only `admin`, the default).
        #[arg(long = "scope", value_name = "SCOPE")]
        scopes: Vec<String>,
        /// Print `{"id": ...}`.
        #[arg(long)]
        json: bool,
    },
    /// List keys of both kinds (their ids and first characters, never the keys).
    #[command(alias = "list")]
    Ls {
        /// Only the keys of this tenant.
        #[arg(long, value_name = "NAME")]
        tenant: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove keys by id (a native key is revoked: refused from the next request on).
    #[command(alias = "delete")]
    Rm {
        /// Ids, as `rampart keys ls` shows them.
        #[arg(required = true)]
        ids: Vec<String>,
    },
}

fn data_dir(a: &KeysArgs) -> Result<PathBuf> {
    match &a.data_dir {
        Some(d) => Ok(d.clone()),
        None => crate::data_dir::default_data_dir(),
    }
}

fn open(a: &KeysArgs) -> Result<(KeyStore, NodeKeyStore)> {
    let dir = data_dir(a)?;
    super::serve::create_data_dir(&dir)?;
    let db = dir.join("state.db");
    let e2b = KeyStore::open(&db)
        .with_context(|| format!("cannot open the key store in {}", dir.display()))?;
    let native = NodeKeyStore::open(&db)
        .with_context(|| format!("cannot open the key store in {}", dir.display()))?;
    Ok((e2b, native))
}

/// Parses `90m`, `12h`, `30d`, `3600s` (or bare seconds) into milliseconds.
fn parse_duration_ms(text: &str) -> Result<i64> {
    let t = text.trim();
    let (num, unit) = match t.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => t.split_at(i),
        None => (t, "s"),
    };
    let n: i64 = num
        .parse()
        .ok()
        .filter(|n| *n > 0)
        .with_context(|| format!("--expires: {text:?} is not a duration like 90m, 12h, 30d"))?;
    let unit_ms: i64 = match unit {
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => bail!("--expires: unit {unit:?} in {text:?}: use s, m, h or d"),
    };
    n.checked_mul(unit_ms)
        .filter(|ms| *ms <= 100 * 365 * 86_400_000)
        .with_context(|| format!("--expires: {text:?} is too long"))
}

fn scopes_or_admin(scopes: Vec<String>) -> Vec<String> {
    if scopes.is_empty() {
        vec![SCOPE_ADMIN.into()]
    } else {
        scopes
    }
}

/// Checks that `tenant` exists in the store of `dir`.
fn check_tenant(dir: &std::path::Path, tenant: &str) -> Result<()> {
    rampart_types::tenant::check_tenant_name(tenant)
        .map_err(|e| anyhow::anyhow!("--tenant: {e}"))?;
    let store = rampart_store::tenants::TenantStore::open(&dir.join("state.db"))
        .with_context(|| format!("cannot open the tenant store in {}", dir.display()))?;
    if store.get(tenant)?.is_none() {
        bail!("--tenant: no tenant {tenant:?} (make it with `rampart tenant create {tenant}`)");
    }
    Ok(())
}

/// The time of a unix-ms instant, RFC 3339.
pub fn time_of(ms: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(ms / 1000)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| ms.to_string())
}

/// `rampart keys ...`: on the data directory, or on the endpoint `host` names.
pub fn run(a: KeysArgs, host: Option<String>, api_key: Option<String>) -> Result<u8> {
    if let (Some(host), None) = (&host, &a.data_dir) {
        return remote(a, host, api_key);
    }
    let (store, native) = open(&a)?;
    let dir = data_dir(&a)?;
    match a.command {
        KeysCommand::Create {
            name,
            native: is_native,
            e2b,
            tenant,
            scopes,
            expires,
            json,
        } if is_native || (tenant.is_some() && !e2b) => {
            if let Some(t) = &tenant {
                check_tenant(&dir, t)?;
            }
            let expires_at_ms = match expires {
                Some(e) => Some(rampart_store::now_ms() + parse_duration_ms(&e)?),
                None => None,
            };
            let scopes = match (&tenant, scopes.is_empty()) {
                (Some(_), true) => rampart_store::node_keys::default_tenant_scopes(),
                _ => scopes_or_admin(scopes),
            };
            let (info, key) = native.create(&NewKey {
                name,
                scopes,
                expires_at_ms,
                tenant,
            })?;
            if json {
                println!(
                    "{}",
                    serde_json::json!({
                        "key": key,
                        "id": info.id,
                        "name": info.name,
                        "kind": "native",
                        "tenant": info.tenant,
                        "scopes": info.scopes,
                        "expires_at_ms": info.expires_at_ms,
                    })
                );
            } else {
                println!("{key}");
                eprintln!(
                    "native key id {} (send it as `Authorization: Bearer`; revoke with \
                     `rampart keys rm {}`)",
                    info.id, info.id
                );
            }
        }
        KeysCommand::Import { name, scopes, json } => {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
                .context("reading the key from stdin")?;
            let info = native.import(
                &NewKey {
                    name,
                    scopes: scopes_or_admin(scopes),
                    expires_at_ms: None,
                    tenant: None,
                },
                text.trim(),
            )?;
            if json {
                println!("{}", serde_json::json!({"id": info.id, "kind": "native"}));
            } else {
                eprintln!("imported native key id {}", info.id);
            }
        }
        KeysCommand::Create {
            name, json, tenant, ..
        } => {
            if let Some(t) = &tenant {
                check_tenant(&dir, t)?;
            }
            let (info, key) = store.create_tenant_key(&name, tenant.as_deref())?;
            if json {
                println!(
                    "{}",
                    serde_json::json!({
                        "key": key,
                        "id": info.id,
                        "name": info.name,
                        "kind": "e2b",
                        "tenant": info.tenant,
                    })
                );
            } else {
                println!("{key}");
                eprintln!(
                    "key id {} (remove with `rampart keys rm {}`)",
                    info.id, info.id
                );
            }
        }
        KeysCommand::Ls { json, tenant } => {
            let mut keys = store.list_keys()?;
            let mut nkeys = native.list()?;
            if let Some(t) = &tenant {
                keys.retain(|k| k.tenant.as_ref() == Some(t));
                nkeys.retain(|k| k.tenant.as_ref() == Some(t));
            }
            if json {
                let mut out = Vec::new();
                for k in &nkeys {
                    let mut v = serde_json::to_value(k)?;
                    v["kind"] = "native".into();
                    out.push(v);
                }
                for k in &keys {
                    let mut v = serde_json::to_value(k)?;
                    v["kind"] = "e2b".into();
                    out.push(v);
                }
                println!("{}", serde_json::to_string(&out)?);
            } else {
                println!(
                    "{:<7} {:<14} {:<18} {:<22} {:<22} {:<10} NAME",
                    "KIND", "ID", "KEY", "CREATED", "LAST USED", "STATE"
                );
                let now = rampart_store::now_ms();
                for k in nkeys {
                    let state = if k.revoked_at_ms.is_some() {
                        "revoked"
                    } else if !k.is_active(now) {
                        "expired"
                    } else {
                        "active"
                    };
                    println!(
                        "{:<7} {:<14} {:<18} {:<22} {:<22} {:<10} {} [{}]{}",
                        "native",
                        k.id,
                        k.hint,
                        time_of(k.created_at_ms),
                        k.last_used_at_ms.map(time_of).unwrap_or_else(|| "-".into()),
                        state,
                        k.name,
                        k.scopes.join(","),
                        k.tenant.map(|t| format!(" tenant {t}")).unwrap_or_default()
                    );
                }
                for k in keys {
                    println!(
                        "{:<7} {:<14} {:<18} {:<22} {:<22} {:<10} {}{}",
                        "e2b",
                        k.id,
                        k.hint,
                        time_of(k.created_at_ms),
                        k.last_used_at_ms.map(time_of).unwrap_or_else(|| "-".into()),
                        "active",
                        k.name,
                        k.tenant.map(|t| format!(" tenant {t}")).unwrap_or_default()
                    );
                }
            }
        }
        KeysCommand::Rm { ids } => {
            let mut missing = Vec::new();
            for id in &ids {
                let revoked = native.revoke(id)?;
                if !store.remove_key(id)? && !revoked {
                    missing.push(id.as_str());
                }
            }
            if !missing.is_empty() {
                bail!("no key with id {}", missing.join(", "));
            }
        }
    }
    Ok(0)
}

/// `rampart keys` against the API of `host` (a fleet's gateway).
fn remote(a: KeysArgs, host: &str, api_key: Option<String>) -> Result<u8> {
    let api = super::fleet::GatewayApi::new(
        host,
        api_key,
        "it has no key API: a single daemon's keys are managed on its host (`rampart keys ... \
         --data-dir DIR` there); a fleet's gateway serves /v1/keys",
    )?;
    let base = api.base().to_owned();
    let call = |m: reqwest::Method, path: &str, body| api.call(m, path, body);
    match a.command {
        KeysCommand::Create {
            name,
            native: is_native,
            e2b,
            tenant,
            scopes,
            expires,
            json,
        } => {
            let kind = if is_native || (tenant.is_some() && !e2b) {
                "native"
            } else {
                "e2b"
            };
            let mut body = serde_json::json!({"name": name, "tenant": tenant, "kind": kind});
            if !scopes.is_empty() {
                body["scopes"] = serde_json::json!(scopes);
            }
            if let Some(e) = expires {
                body["expires_at_ms"] =
                    serde_json::json!(rampart_store::now_ms() + parse_duration_ms(&e)?);
            }
            let made = call(reqwest::Method::POST, "/v1/keys", Some(body))?;
            if json {
                println!("{made}");
            } else {
                println!("{}", made["key"].as_str().unwrap_or_default());
                eprintln!(
                    "{kind} key id {} at {base} (revoke with `rampart keys rm {}`)",
                    made["id"].as_str().unwrap_or_default(),
                    made["id"].as_str().unwrap_or_default()
                );
            }
        }
        KeysCommand::Import { .. } => bail!(
            "`rampart keys import` registers a key in a daemon's store on its host (--data-dir); \
             over {base}'s API, `rampart keys create` makes one"
        ),
        KeysCommand::Ls { tenant, json } => {
            let mut list: Vec<serde_json::Value> =
                serde_json::from_value(call(reqwest::Method::GET, "/v1/keys", None)?)?;
            if let Some(t) = &tenant {
                list.retain(|k| k["tenant"].as_str() == Some(t));
            }
            if json {
                println!("{}", serde_json::to_string(&list)?);
            } else {
                println!(
                    "{:<7} {:<14} {:<18} {:<22} {:<10} NAME",
                    "KIND", "ID", "KEY", "CREATED", "STATE"
                );
                for k in list {
                    let state = if k["revoked_at_ms"].is_i64() {
                        "revoked"
                    } else {
                        "active"
                    };
                    println!(
                        "{:<7} {:<14} {:<18} {:<22} {:<10} {}{}",
                        k["kind"].as_str().unwrap_or_default(),
                        k["id"].as_str().unwrap_or_default(),
                        k["hint"].as_str().unwrap_or_default(),
                        time_of(k["created_at_ms"].as_i64().unwrap_or_default()),
                        state,
                        k["name"].as_str().unwrap_or_default(),
                        k["tenant"]
                            .as_str()
                            .map(|t| format!(" tenant {t}"))
                            .unwrap_or_default()
                    );
                }
            }
        }
        KeysCommand::Rm { ids } => {
            for id in ids {
                call(reqwest::Method::DELETE, &format!("/v1/keys/{id}"), None)?;
                println!("{id}");
            }
        }
    }
    Ok(0)
}
