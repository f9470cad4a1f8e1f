//! `rampart mcp`: the MCP server on stdin/stdout (for Claude Code, Codex, Cursor and the
//! like), calling the daemon on its Unix socket, or with `RAMPART_HOST` and
//! `RAMPART_API_KEY` over TCP (`docs/mcp.md`).

use crate::client::{Client, Endpoint};
use anyhow::Result;
use clap::Args;
use futures::future::BoxFuture;
use futures::StreamExt as _;
use rampart_mcp::{Api, ApiRequest, ApiResponse};
use std::sync::Arc;

/// `rampart mcp`.
#[derive(Debug, Args)]
pub struct McpArgs {}

/// The native API through the CLI's client.
#[derive(Debug)]
struct CliApi {
    client: Client,
}

impl Api for CliApi {
    fn call(&self, req: ApiRequest) -> BoxFuture<'_, Result<ApiResponse, String>> {
        Box::pin(async move {
            let mut rb = self.client.request(req.method, &req.path);
            if let Some(j) = &req.json {
                rb = rb.json(j);
            } else if let Some(b) = req.body {
                rb = rb.body(b);
            }
            if let Some(a) = req.accept {
                rb = rb.header("accept", a);
            }
            if let Some(t) = &req.token {
                rb = rb.header("x-rampart-token", t);
            }
            if let Some((name, value)) = rampart_mcp::client_header(&req.client) {
                rb = rb.header(name, value);
            }
            let resp = rb
                .send()
                .await
                .map_err(|e| format!("{:#}", self.client.transport_error(e)))?;
            let status = resp.status().as_u16();
            let body = resp
                .bytes_stream()
                .map(|c| c.map_err(|e| e.to_string()))
                .boxed();
            Ok(ApiResponse { status, body })
        })
    }
}

/// `rampart mcp`: serves until the client closes stdin.
pub async fn run(host: &Endpoint, _a: McpArgs) -> Result<u8> {
    let client = Client::new(host)?;
    rampart_mcp::serve_stdio(Arc::new(CliApi { client })).await?;
    Ok(0)
}
