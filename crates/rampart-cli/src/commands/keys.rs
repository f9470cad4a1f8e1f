//! `rampart keys create|ls|rm`: API keys of the E2B-compatible API.
//!
//! The keys live in the daemon's `state.db` (stored as SHA-256 digests), so these commands
//! open the data directory directly, on the daemon's host, rather than asking the (then
//! unauthenticated) daemon to mint keys.

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use rampart_store::keys::KeyStore;
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
    /// Make a key and print it (shown only once).
    Create {
        /// A name to tell the key apart in `rampart keys ls`.
        #[arg(long, default_value = "")]
        name: String,
        /// Print `{"key": ..., "id": ...}`.
        #[arg(long)]
        json: bool,
    },
    /// List keys (their ids and first characters, never the keys).
    #[command(alias = "list")]
    Ls {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove keys by id.
    #[command(alias = "delete")]
    Rm {
        /// Ids, as `rampart keys ls` shows them.
        #[arg(required = true)]
        ids: Vec<String>,
    },
}

fn open(a: &KeysArgs) -> Result<KeyStore> {
    let dir = match &a.data_dir {
        Some(d) => d.clone(),
        None => super::serve::default_data_dir()?,
    };
    super::serve::create_data_dir(&dir)?;
    KeyStore::open(&dir.join("state.db"))
        .with_context(|| format!("cannot open the key store in {}", dir.display()))
}

fn time_of(ms: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(ms / 1000)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| ms.to_string())
}

/// `rampart keys ...`.
pub fn run(a: KeysArgs) -> Result<u8> {
    let store = open(&a)?;
    match a.command {
        KeysCommand::Create { name, json } => {
            let (info, key) = store.create_key(&name)?;
            if json {
                println!(
                    "{}",
                    serde_json::json!({"key": key, "id": info.id, "name": info.name})
                );
            } else {
                println!("{key}");
                eprintln!(
                    "key id {} (remove with `rampart keys rm {}`)",
                    info.id, info.id
                );
            }
        }
        KeysCommand::Ls { json } => {
            let keys = store.list_keys()?;
            if json {
                println!("{}", serde_json::to_string(&keys)?);
            } else {
                println!(
                    "{:<14} {:<14} {:<22} {:<22} NAME",
                    "ID", "KEY", "CREATED", "LAST USED"
                );
                for k in keys {
                    println!(
                        "{:<14} {:<14} {:<22} {:<22} {}",
                        k.id,
                        k.hint,
                        time_of(k.created_at_ms),
                        k.last_used_at_ms.map(time_of).unwrap_or_else(|| "-".into()),
                        k.name
                    );
                }
            }
        }
        KeysCommand::Rm { ids } => {
            let mut missing = Vec::new();
            for id in &ids {
                if !store.remove_key(id)? {
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
