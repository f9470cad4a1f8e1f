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
use rampart_core::Principal;
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

/// Middleware: names the request's caller before any authentication (`local` or
/// `remote`, a principal of the node); the API's checks replace it with who they
/// authenticated ([`set`]).
pub(crate) async fn scope(mut req: Request, next: Next) -> Response {
    let who = Principal::node(native(peer(&req)));
    set(&mut req, who);
    next.run(req).await
}

/// Serves `req` on behalf of `who`: the handlers' [`Caller`].
pub(crate) fn set(req: &mut Request, who: Principal) {
    req.extensions_mut().insert(Caller(who));
}

/// Who `req` is served for (see [`Caller`]).
pub(crate) fn of(req: &Request) -> Principal {
    in_extensions(req.extensions())
}

/// The caller a middleware put in `ext`, else the node named by the peer address.
fn in_extensions(ext: &axum::http::Extensions) -> Principal {
    match ext.get::<Caller>() {
        Some(c) => c.0.clone(),
        None => Principal::node(native(ext.get::<ConnectInfo<SocketAddr>>().map(|c| c.0))),
    }
}

/// Who a request is served for, as the authentication set it ([`set`]): handlers pass it
/// to core explicitly (`Manager::sandbox(&caller, id)` and the methods that act for
/// someone). A request no middleware named is the node's, named by its peer address.
#[derive(Debug, Clone)]
pub(crate) struct Caller(pub(crate) Principal);

impl std::ops::Deref for Caller {
    type Target = Principal;
    fn deref(&self) -> &Principal {
        &self.0
    }
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Caller {
    type Rejection = std::convert::Infallible;
    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Self, Self::Rejection> {
        Ok(Caller(in_extensions(&parts.extensions)))
    }
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
