//! `rampart secret set NAME --to HOST ...|ls|rm`: named secrets held by the daemon (`/v1/secrets`). The value is
//! read from stdin or `--value-file`, never from the command line (where `ps` and shell
//! history would show it). `rampart create --secret NAME` binds one to a new sandbox.

use crate::client::{check, Client};
use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use rampart_types::network::StoredSecretInfo;
use rampart_types::{SecretInjection, SecretSpec};
use reqwest::Method;
use std::io::Read as _;
use std::path::PathBuf;

/// `rampart secret`.
#[derive(Debug, Args)]
pub struct SecretArgs {
    #[command(subcommand)]
    cmd: SecretCmd,
}

#[derive(Debug, Subcommand)]
enum SecretCmd {
    /// Create or replace a secret. The value comes from stdin (one trailing newline is
    /// dropped) or --value-file.
    Set {
        /// Its name (letters, digits, '_', '-').
        name: String,
        /// A host it may be sent to (repeatable): api.example.com, *.example.com. (`--host`
        /// is taken: it is the daemon's URL.)
        #[arg(long = "to", value_name = "HOST", required = true)]
        hosts: Vec<String>,
        /// Set this header, `{value}` standing for the secret: 'Authorization: Bearer {value}'.
        #[arg(long, value_name = "'NAME: TEMPLATE'", conflicts_with_all = ["basic", "placeholder"])]
        header: Option<String>,
        /// HTTP basic auth with this user name and the secret as password.
        #[arg(long, value_name = "USER", conflicts_with = "placeholder")]
        basic: Option<String>,
        /// Replace the placeholder wherever the sandbox put it in the request headers (the
        /// default).
        #[arg(long)]
        placeholder: bool,
        /// The env var that holds the placeholder inside sandboxes.
        #[arg(long, value_name = "VAR")]
        env: Option<String>,
        /// Read the value from this file instead of stdin.
        #[arg(long, value_name = "FILE")]
        value_file: Option<PathBuf>,
        /// Print the answer as JSON.
        #[arg(long)]
        json: bool,
    },
    /// List the secrets (never their values).
    Ls {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove secrets (sandboxes created with them keep their copy until they end).
    Rm {
        /// Their names.
        #[arg(required = true)]
        names: Vec<String>,
    },
}

/// The injection the flags ask for.
fn injection(header: Option<&str>, basic: Option<&str>) -> Result<SecretInjection> {
    if let Some(h) = header {
        let (name, template) = h
            .split_once(':')
            .ok_or_else(|| anyhow!("--header: expected 'NAME: TEMPLATE', got {h:?}"))?;
        let (name, template) = (name.trim(), template.trim());
        if name.is_empty() || !template.contains("{value}") {
            bail!("--header: expected 'NAME: TEMPLATE' with {{value}} in TEMPLATE, got {h:?}");
        }
        return Ok(SecretInjection::Header {
            name: name.to_owned(),
            template: template.to_owned(),
        });
    }
    if let Some(u) = basic {
        return Ok(SecretInjection::Basic {
            username: u.to_owned(),
        });
    }
    Ok(SecretInjection::Placeholder)
}

/// The value as read: one trailing newline (`\n` or `\r\n`) dropped.
fn value_of(mut raw: Vec<u8>) -> Result<String> {
    if raw.ends_with(b"\n") {
        raw.pop();
        if raw.ends_with(b"\r") {
            raw.pop();
        }
    }
    let v = String::from_utf8(raw).map_err(|_| anyhow!("the value is not UTF-8"))?;
    if v.is_empty() {
        bail!("empty value (give it on stdin or with --value-file)");
    }
    Ok(v)
}

fn print(list: &[StoredSecretInfo]) {
    for s in list {
        let how = match &s.inject {
            SecretInjection::Header { name, template } => format!("header {name}: {template}"),
            SecretInjection::Basic { username } => format!("basic {username}"),
            SecretInjection::Placeholder => "placeholder".to_owned(),
        };
        let env = s
            .env
            .as_deref()
            .map(|e| format!(" env={e}"))
            .unwrap_or_default();
        println!(
            "{}\thosts={}\t{how}{env}\tupdated {}",
            s.name,
            s.hosts.join(","),
            s.updated_at
        );
    }
}

/// `rampart secret ...`.
pub async fn secret(host: &crate::client::Endpoint, a: SecretArgs) -> Result<u8> {
    let client = Client::new(host)?;
    match a.cmd {
        SecretCmd::Set {
            name,
            hosts,
            header,
            basic,
            placeholder: _,
            env,
            value_file,
            json,
        } => {
            let inject = injection(header.as_deref(), basic.as_deref())?;
            let raw = match &value_file {
                Some(p) => std::fs::read(p).with_context(|| format!("reading {}", p.display()))?,
                None => {
                    let mut b = Vec::new();
                    std::io::stdin()
                        .read_to_end(&mut b)
                        .context("reading the value from stdin")?;
                    b
                }
            };
            let spec = SecretSpec {
                name,
                value: value_of(raw)?,
                hosts,
                inject,
                env,
            };
            let info: StoredSecretInfo = client
                .json(client.request(Method::POST, "/v1/secrets").json(&spec))
                .await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&info)?);
            } else {
                print(std::slice::from_ref(&info));
            }
        }
        SecretCmd::Ls { json } => {
            let list: Vec<StoredSecretInfo> = client
                .json(client.request(Method::GET, "/v1/secrets"))
                .await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                print(&list);
            }
        }
        SecretCmd::Rm { names } => {
            for n in names {
                let path = format!("/v1/secrets/{}", super::encode_query(&n));
                check(client.send(client.request(Method::DELETE, &path)).await?).await?;
            }
        }
    }
    Ok(0)
}

/// `--secret NAME` of `create`/`run`: references to stored secrets (their hosts, injection
/// and env var are the stored ones).
pub fn references(names: &[String]) -> Vec<SecretSpec> {
    names
        .iter()
        .map(|n| SecretSpec {
            name: n.clone(),
            value: String::new(),
            hosts: Vec::new(),
            inject: SecretInjection::Placeholder,
            env: None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_make_injections_and_values() {
        assert_eq!(
            injection(Some("Authorization: Bearer {value}"), None).unwrap(),
            SecretInjection::Header {
                name: "Authorization".into(),
                template: "Bearer {value}".into()
            }
        );
        assert!(injection(Some("Authorization Bearer"), None).is_err());
        assert!(injection(Some("X-Key: fixed"), None).is_err());
        assert_eq!(
            injection(None, Some("bob")).unwrap(),
            SecretInjection::Basic {
                username: "bob".into()
            }
        );
        assert_eq!(injection(None, None).unwrap(), SecretInjection::Placeholder);
        assert_eq!(value_of(b"abc\n".to_vec()).unwrap(), "abc");
        assert_eq!(value_of(b"abc\r\n".to_vec()).unwrap(), "abc");
        assert_eq!(value_of(b"a b".to_vec()).unwrap(), "a b");
        assert!(value_of(b"\n".to_vec()).is_err());
        let r = references(&["tok".into()]);
        assert!(r[0].value.is_empty() && r[0].hosts.is_empty());
    }
}
