//! `rampart port ID PORT [--public | --private]`: prints the URLs that reach a port of a
//! sandbox through the daemon (path form, then host form).

use crate::client::Client;
use anyhow::{anyhow, Result};
use clap::Args;
use rampart_types::{PortInfo, PortList, SandboxInfo};
use reqwest::Method;

/// `rampart port`.
#[derive(Debug, Args)]
pub struct PortArgs {
    /// Sandbox id.
    id: String,
    /// Port inside the sandbox (1-65535).
    port: u16,
    /// Make the port public first: reachable without the sandbox's access token.
    #[arg(long, conflicts_with = "private")]
    public: bool,
    /// Make the port private again first: the token is needed.
    #[arg(long)]
    private: bool,
    /// Print the port as JSON (with the token when the port is private).
    #[arg(long)]
    json: bool,
}

/// Appends `?rampart_token=...` to a URL.
fn with_token(url: &str, token: &str) -> String {
    format!(
        "{url}?{}={}",
        rampart_server::TOKEN_PARAM,
        super::encode_query(token)
    )
}

/// `rampart port`: prints the path-form URL, then the host-form URL, one a line. For a
/// private port both carry the token as `?rampart_token=` (a browser then keeps it in a
/// cookie); scripts can send it as `X-Rampart-Token` instead (`--json` gives it).
pub async fn port(host: &crate::client::Endpoint, a: PortArgs) -> Result<u8> {
    if a.port == 0 {
        return Err(anyhow!("port 0 is not a port; use 1-65535"));
    }
    let client = Client::new(host)?;
    let path = format!("/v1/sandboxes/{}/ports/{}/public", a.id, a.port);
    let info: PortInfo = if a.public || a.private {
        let m = if a.public {
            Method::POST
        } else {
            Method::DELETE
        };
        client.json(client.request(m, &path)).await?
    } else {
        let list: PortList = client
            .json(client.request(
                Method::GET,
                &format!("/v1/sandboxes/{}/ports?port={}", a.id, a.port),
            ))
            .await?;
        list.ports
            .into_iter()
            .find(|p| p.port == a.port)
            .ok_or_else(|| anyhow!("the daemon did not list port {}", a.port))?
    };
    let token = if info.public {
        None
    } else {
        let s: SandboxInfo = client
            .json(client.request(Method::GET, &format!("/v1/sandboxes/{}", a.id)))
            .await?;
        Some(
            s.access_token
                .ok_or_else(|| anyhow!("the daemon gave no access token for {}", a.id))?,
        )
    };
    if a.json {
        let mut v = serde_json::to_value(&info)?;
        if let Some(t) = &token {
            v["token"] = serde_json::Value::String(t.clone());
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(0);
    }
    match &token {
        Some(t) => {
            println!("{}", with_token(&info.url, t));
            println!("{}", with_token(&info.host_url, t));
        }
        None => {
            println!("{}", info.url);
            println!("{}", info.host_url);
        }
    }
    if !info.listening && !a.public && !a.private {
        eprintln!(
            "note: nothing listens on port {} in {} yet (on 127.0.0.1, 0.0.0.0 or ::)",
            a.port, a.id
        );
    }
    Ok(0)
}
