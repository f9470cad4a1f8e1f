//! `/mcp`: the MCP server over Streamable HTTP (`rampart_mcp`), on the daemon's listeners.
//!
//! The route sits behind the same guard as `/v1` (no key, no session). Its tools call the
//! native API in process: each call goes through the daemon's router with the MCP request's
//! own credentials (`Authorization`/`X-API-Key`, `Host`, and the connection it came on, so a
//! socket caller stays the socket's administrator), so every tool call is authenticated,
//! scoped, confined to its tenant and recorded exactly as the same call made directly.

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::Router;
use futures::future::BoxFuture;
use futures::StreamExt as _;
use rampart_mcp::{Api, ApiRequest, ApiResponse};
use std::net::SocketAddr;
use tower::ServiceExt as _;

/// The native API, called through the daemon's router.
#[derive(Clone)]
pub(crate) struct InProcess {
    pub(crate) router: Router,
}

impl std::fmt::Debug for InProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InProcess").finish_non_exhaustive()
    }
}

/// The headers of the MCP request that the API call takes over.
const CARRIED: &[&str] = &["authorization", "x-api-key", "host"];

impl Api for InProcess {
    fn call(&self, req: ApiRequest) -> BoxFuture<'_, Result<ApiResponse, String>> {
        Box::pin(async move {
            let mut b = http::Request::builder()
                .method(req.method.clone())
                .uri(req.path.as_str());
            if let Some(origin) = &req.origin {
                for name in CARRIED {
                    if let Some(v) = origin.headers.get(*name) {
                        b = b.header(*name, v);
                    }
                }
            } else {
                b = b.header("host", "localhost");
            }
            if let Some((name, value)) = rampart_mcp::client_header(&req.client) {
                b = b.header(name, value);
            }
            if let Some(a) = req.accept {
                b = b.header("accept", a);
            }
            if let Some(t) = &req.token {
                b = b.header("x-rampart-token", t);
            }
            let body = match (&req.json, req.body) {
                (Some(v), _) => {
                    b = b.header("content-type", "application/json");
                    Body::from(serde_json::to_vec(v).map_err(|e| e.to_string())?)
                }
                (None, Some(bytes)) => Body::from(bytes),
                (None, None) => Body::empty(),
            };
            let mut r = b
                .body(body)
                .map_err(|e| format!("building the API call: {e}"))?;
            if let Some(origin) = &req.origin {
                // The connection the MCP request came on: the guard tells the socket's
                // administrator from a TCP caller by it.
                if let Some(c) = origin
                    .extensions
                    .get::<ConnectInfo<crate::auth::UnixPeer>>()
                {
                    r.extensions_mut().insert(*c);
                }
                if let Some(c) = origin.extensions.get::<ConnectInfo<SocketAddr>>() {
                    r.extensions_mut().insert(*c);
                }
            }
            let resp = self
                .router
                .clone()
                .oneshot(r)
                .await
                .map_err(|e| format!("the API failed: {e}"))?;
            let status = resp.status().as_u16();
            let body = resp
                .into_body()
                .into_data_stream()
                .map(|c| c.map_err(|e| e.to_string()))
                .boxed();
            Ok(ApiResponse { status, body })
        })
    }
}
