//! `rampart artifacts ID [PATH] [-o FILE]`: what a sandbox kept when it ended (its create's
//! `artifacts`), listed, or one file downloaded (streaming) and checked against its digest.

use super::encode_query;
use crate::client::Client;
use anyhow::{bail, Context, Result};
use clap::Args;
use futures::StreamExt;
use rampart_types::ArtifactList;
use reqwest::Method;
use std::path::PathBuf;
use tokio::io::AsyncWriteExt;

/// `rampart artifacts`.
#[derive(Debug, Args)]
pub struct ArtifactsArgs {
    /// The sandbox (it has ended).
    id: String,
    /// One file to download: its path inside the sandbox, as listed.
    path: Option<String>,
    /// Write the file there (default: stdout).
    #[arg(short = 'o', long, value_name = "FILE", requires = "path")]
    output: Option<PathBuf>,
    /// Print the list as JSON.
    #[arg(long, conflicts_with = "path")]
    json: bool,
}

/// `rampart artifacts`.
pub async fn artifacts(host: &crate::client::Endpoint, a: ArtifactsArgs) -> Result<u8> {
    let client = Client::new(host)?;
    let list: ArtifactList = client
        .json(client.request(Method::GET, &format!("/v1/sandboxes/{}/artifacts", a.id)))
        .await?;
    let Some(path) = a.path else {
        if a.json {
            println!("{}", serde_json::to_string_pretty(&list)?);
            return Ok(0);
        }
        let k = &list.artifacts;
        println!(
            "{} file(s) kept at {}, until {}{}{}",
            k.files.len(),
            list.kept_at,
            list.expires_at,
            if k.skipped > 0 {
                format!("; {} entries not regular files, not kept", k.skipped)
            } else {
                String::new()
            },
            if k.truncated {
                "; cut short by the node's bounds"
            } else {
                ""
            }
        );
        for f in &k.files {
            println!("{} {:>10} {:o} {}", f.digest, f.size, f.mode, f.path);
        }
        return Ok(0);
    };
    let Some(want) = list.artifacts.files.iter().find(|f| f.path == path) else {
        bail!("{path}: not a file sandbox {} kept", a.id);
    };
    let resp = client
        .send(client.request(
            Method::GET,
            &format!(
                "/v1/sandboxes/{}/artifacts?path={}",
                a.id,
                encode_query(&path)
            ),
        ))
        .await?;
    let mut body = resp.bytes_stream();
    let mut h = rampart_audit::ContentHasher::new(0);
    let mut out: Box<dyn tokio::io::AsyncWrite + Unpin> = match &a.output {
        Some(p) => Box::new(
            tokio::fs::File::create(p)
                .await
                .with_context(|| format!("{}", p.display()))?,
        ),
        None => Box::new(tokio::io::stdout()),
    };
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| client.transport_error(e))?;
        h.update(&chunk);
        out.write_all(&chunk)
            .await
            .context("writing the artifact")?;
    }
    out.flush().await.context("writing the artifact")?;
    let (got, _) = h.finish();
    let got = got.digest;
    if got != want.digest {
        bail!(
            "{path}: the bytes received have SHA-256 {got}, not the {} the record lists",
            want.digest
        );
    }
    Ok(0)
}
