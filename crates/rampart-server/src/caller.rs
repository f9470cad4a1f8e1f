//! Who made a request, for the audit record (`created.caller`).
//!
//! Before authentication a caller is `local` when its peer address is a loopback address,
//! `remote` otherwise, followed by ` from <peer address>` when the server knows it (it does
//! when served by [`crate::serve_all`] and friends). The native API's check replaces it with
//! the key's id, name and scopes (never the key), or the socket peer's uid (`crate::auth`);
//! the E2B API with its API key's id and name.

use axum::extract::{ConnectInfo, Request};
use axum::middleware::Next;
use axum::response::Response;
use std::net::SocketAddr;

/// The peer address of a request, when the server recorded it.
pub(crate) fn peer(req: &Request) -> Option<SocketAddr> {
    req.extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0)
}

/// ` from <addr>`, or nothing when the address is unknown.
pub(crate) fn from(peer: Option<SocketAddr>) -> String {
    peer.map(|a| format!(" from {a}")).unwrap_or_default()
}

/// The caller of a native API request: `local` or `remote`, and its address.
pub(crate) fn native(peer: Option<SocketAddr>) -> String {
    let who = match peer {
        Some(a) if !a.ip().is_loopback() => "remote",
        _ => "local",
    };
    format!("{who}{}", from(peer))
}

/// Middleware: serves the request on behalf of its (native) caller.
pub(crate) async fn scope(req: Request, next: Next) -> Response {
    let caller = native(peer(&req));
    rampart_core::with_caller(caller, next.run(req)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn callers_are_named_by_address() {
        assert_eq!(native(None), "local");
        assert_eq!(
            native(Some("127.0.0.1:4000".parse().unwrap())),
            "local from 127.0.0.1:4000"
        );
        assert_eq!(
            native(Some("[::1]:4000".parse().unwrap())),
            "local from [::1]:4000"
        );
        assert_eq!(
            native(Some("10.0.0.5:4000".parse().unwrap())),
            "remote from 10.0.0.5:4000"
        );
    }
}
