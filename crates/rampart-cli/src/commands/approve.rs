//! `rampart approvals [--json]`, `rampart approve ID [--reason R]`, `rampart deny ID
//! [--reason R]`: the requests sandboxes' approval policies hold, and their decisions (a key
//! with the `approve` scope).

use crate::client::{Client, Endpoint};
use anyhow::Result;
use clap::Args;
use rampart_types::{ApprovalInfo, Decide, Decision};
use reqwest::Method;

/// `rampart approvals`.
#[derive(Debug, Args)]
pub struct ApprovalsArgs {
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// `rampart approve` / `rampart deny`.
#[derive(Debug, Args)]
pub struct DecideArgs {
    /// The approval's id (`ap_...`, from `rampart approvals`).
    id: String,
    /// Why (recorded in the sandbox's audit record).
    #[arg(long)]
    reason: Option<String>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Lists what is held.
pub async fn list(host: &Endpoint, a: ApprovalsArgs) -> Result<u8> {
    let client = Client::new(host)?;
    let list: Vec<ApprovalInfo> = client
        .json(client.request(Method::GET, "/v1/approvals"))
        .await?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(0);
    }
    if list.is_empty() {
        println!("nothing is waiting for approval");
        return Ok(0);
    }
    for x in &list {
        println!(
            "{}  sandbox {}  {} `{}`\n    asked by {} at {} (rule {}); refused at {} unless decided",
            x.id, x.sandbox_id, x.kind, x.request, x.requested_by, x.requested_at, x.rule, x.expires_at
        );
    }
    Ok(0)
}

/// Approves or denies one.
pub async fn decide(host: &Endpoint, a: DecideArgs, approve: bool) -> Result<u8> {
    let client = Client::new(host)?;
    let path = format!(
        "/v1/approvals/{}/{}",
        super::encode_query(&a.id),
        if approve { "approve" } else { "deny" }
    );
    let d: Decision = client
        .json(
            client
                .request(Method::POST, &path)
                .json(&Decide { reason: a.reason }),
        )
        .await?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&d)?);
    } else {
        println!("{} {} by {}", d.id, d.decision, d.by);
    }
    Ok(0)
}
