//! How the tools reach the native API.

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::stream::{BoxStream, StreamExt as _};

/// The header naming the MCP client on the API calls its tools make (`via mcp:<name>` in
/// the record's callers). It is the client's own claim, beside the principal that
/// authenticated.
pub const CLIENT_HEADER: &str = "x-rampart-mcp-client";

/// One call of the native API.
#[derive(Debug)]
pub struct ApiRequest {
    /// Method.
    pub method: http::Method,
    /// Path and query (`/v1/sandboxes/{id}/files?path=...`).
    pub path: String,
    /// A JSON body.
    pub json: Option<serde_json::Value>,
    /// A raw body (file uploads).
    pub body: Option<Bytes>,
    /// `Accept` (the streamed exec asks for `application/x-ndjson`).
    pub accept: Option<&'static str>,
    /// A sandbox's access token (`X-Rampart-Token`), for a call to one of its ports.
    pub token: Option<String>,
    /// The HTTP request of the MCP call itself, when it came over Streamable HTTP: the
    /// in-process API takes its credentials (and connection) from it.
    pub origin: Option<http::request::Parts>,
    /// The MCP client's name, from its `initialize`.
    pub client: Option<String>,
}

/// An answer of the native API, its body as it comes.
pub struct ApiResponse {
    /// HTTP status.
    pub status: u16,
    /// The body.
    pub body: BoxStream<'static, Result<Bytes, String>>,
}

impl std::fmt::Debug for ApiResponse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiResponse")
            .field("status", &self.status)
            .finish_non_exhaustive()
    }
}

/// Why [`ApiResponse::bytes`] has no whole body.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// The body stream failed. The text is the [`Api`] implementation's own: its stream
    /// yields its errors as text (`rampart-cli` and `rampart-server` implement it).
    #[error("{message}")]
    Stream {
        /// What the stream said.
        message: String,
    },
    /// The body is larger than the cap.
    #[error("the answer is larger than {cap} bytes")]
    TooLarge {
        /// The cap, bytes.
        cap: usize,
    },
}

impl ApiResponse {
    /// The whole body, refused past `cap` bytes.
    pub async fn bytes(mut self, cap: usize) -> Result<Bytes, BodyError> {
        let mut out = Vec::new();
        while let Some(chunk) = self.body.next().await {
            let chunk = chunk.map_err(|message| BodyError::Stream { message })?;
            if out.len() + chunk.len() > cap {
                return Err(BodyError::TooLarge { cap });
            }
            out.extend_from_slice(&chunk);
        }
        Ok(out.into())
    }
}

/// Reaches the native API: the CLI's client (stdio server), or the daemon's router.
pub trait Api: Send + Sync + 'static {
    /// Makes one call. Err: the API could not be reached at all (an answer with an error
    /// status is an `Ok`).
    fn call(&self, req: ApiRequest) -> BoxFuture<'_, Result<ApiResponse, String>>;
}
