//! Rampart's MCP server (`docs/mcp.md`): sandboxes as tools for agents and their builders.
//!
//! The tools ([`RampartMcp`]) are a thin layer over the native REST API, reached through
//! an [`Api`]: the CLI's (`rampart mcp`, over stdio, calling the daemon on its socket or
//! with `RAMPART_HOST` and `RAMPART_API_KEY`) or the daemon's own router, called in process
//! for `/mcp` (Streamable HTTP) with the credentials of the MCP request itself. Either way
//! every tool call is an API call: the same authentication, scopes, tenant confinement,
//! quotas and record, which names the MCP client (`via mcp:<client name>`) beside the
//! principal.

mod api;
mod tools;

pub use api::{Api, ApiRequest, ApiResponse, BodyError, CLIENT_HEADER};
pub use tools::{client_header, client_name, RampartMcp};

use rmcp::transport::streamable_http_server::{
    session::local::LocalSessionManager, StreamableHttpServerConfig, StreamableHttpService,
};
use std::sync::Arc;

/// Why the stdio server stopped.
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    /// The session could not start (the client did not initialize).
    #[error("the MCP session did not start: {0}")]
    Start(#[source] Box<rmcp::service::ServerInitializeError>),
    /// The session's task ended with an error (it panicked or was cancelled).
    #[error("the MCP session failed: {0}")]
    Session(#[source] tokio::task::JoinError),
}

/// Serves the tools over stdin/stdout until the client closes them.
pub async fn serve_stdio(api: Arc<dyn Api>) -> Result<(), McpError> {
    use rmcp::ServiceExt as _;
    let running = RampartMcp::new(api)
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| McpError::Start(Box::new(e)))?;
    running
        .waiting()
        .await
        .map(|_| ())
        .map_err(McpError::Session)
}

/// The Streamable HTTP service of the tools (mounted at `/mcp` by the daemon, behind its
/// authentication). Its own `Host` check is off: the daemon's, which knows its names, runs
/// first.
pub fn http_service(api: Arc<dyn Api>) -> StreamableHttpService<RampartMcp, LocalSessionManager> {
    StreamableHttpService::new(
        move || Ok(RampartMcp::new(api.clone())),
        Arc::new(LocalSessionManager::default()),
        // Plain JSON answers for calls that send no notification (SSE only when one does).
        StreamableHttpServerConfig::default()
            .disable_allowed_hosts()
            .with_json_response(true),
    )
}
