//! Exposed ports: a server listening inside a sandbox, reached from outside through the
//! daemon (`/v1/sandboxes/{id}/ports/{port}/...` or the host `{port}-{id}.<domain>`).

use serde::{Deserialize, Serialize};

/// One port of a sandbox as `GET /v1/sandboxes/{id}/ports` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PortInfo {
    /// The TCP port inside the sandbox.
    pub port: u16,
    /// Whether something listens on it inside the sandbox now (on `127.0.0.1`, `0.0.0.0`
    /// or `::`, which the daemon reaches).
    pub listening: bool,
    /// Whether it is public: reachable without the sandbox's access token.
    pub public: bool,
    /// The path-form URL: `http://<daemon>/v1/sandboxes/{id}/ports/{port}/`.
    pub url: String,
    /// The host-form URL: `http://{port}-{id}.<domain>:<daemon port>/`.
    pub host_url: String,
}

/// The answer of `GET /v1/sandboxes/{id}/ports` and of making a port public or private.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PortList {
    /// The sandbox's id.
    pub id: String,
    /// The ports that listen or are public, by port number.
    pub ports: Vec<PortInfo>,
}
