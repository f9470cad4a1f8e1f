//! Who may call the native API (`/v1`, `/metrics`): the node's administrator over the Unix
//! socket, or an API key over TCP acting for the node or for one tenant, within its scopes.
//! `/health` is open; the E2B control plane checks its own keys (`e2b/mod.rs`); the port
//! proxy and the envd proxy check each sandbox's access token (`ports.rs`, `e2b/envd.rs`),
//! so the path form of the port proxy (`/v1/sandboxes/{id}/ports/{P}/...`) needs no API key,
//! only the Host check.
//!
//! - **Unix socket** (`<data>/rampart.sock`, mode 0660): the caller is identified by
//!   `SO_PEERCRED`; root, the daemon's own user and members of the socket's group are the
//!   node's administrator, anyone else gets 401.
//! - **TCP**: `Authorization: Bearer KEY` or `X-API-Key: KEY`, a key of the
//!   [`NodeKeyStore`], looked up by digest on every request (revocation is immediate). A
//!   missing, malformed, unknown, expired or revoked key answers 401 `unauthorized` with a
//!   message saying which.
//! - **Scopes** ([`required_scope`]): each endpoint needs one; a key without it gets 403.
//! - **Tenants**: the request is served on behalf of the key's [`rampart_core::Principal`],
//!   which core confines to its tenant; a tenant's creates count against its
//!   `creates_per_minute` (`crate::tenancy`), and every call that may change something goes
//!   in the node's change log.
//! - **Host** (TCP only, against DNS rebinding): the `Host` must name the daemon: a loopback
//!   name (`localhost`, `127.0.0.1`, `[::1]`), the listen address, the port-routing domain or
//!   a configured name; any port. Otherwise 421 `misdirected_request`.

use crate::error::ApiError;
use axum::extract::connect_info::Connected;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::serve::IncomingStream;
use rampart_store::node_keys::{
    check_shape, GatewayPrincipal, KeyCheck, NodeKey, NodeKeyStore, GATEWAY_PRINCIPAL_HEADER,
    SCOPE_ADMIN,
};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

/// The file in the data directory holding the admin key made at first start.
pub const ADMIN_KEY_FILE: &str = "admin-key";
/// The daemon's Unix socket, in its data directory.
pub const SOCKET_FILE: &str = "rampart.sock";
/// The group whose members may use the socket, when it exists.
pub const SOCKET_GROUP: &str = "rampart";

/// The credentials of a caller on the Unix socket (`SO_PEERCRED`), recorded at accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnixPeer {
    /// The peer's uid, if the kernel told it.
    pub uid: Option<u32>,
    /// The peer's primary gid, if the kernel told it.
    pub gid: Option<u32>,
    /// The peer's pid, if the kernel told it.
    pub pid: Option<i32>,
}

impl Connected<IncomingStream<'_, tokio::net::UnixListener>> for UnixPeer {
    fn connect_info(stream: IncomingStream<'_, tokio::net::UnixListener>) -> Self {
        match stream.io().peer_cred() {
            Ok(c) => UnixPeer {
                uid: Some(c.uid()),
                gid: Some(c.gid()),
                pid: c.pid(),
            },
            Err(e) => {
                tracing::warn!("SO_PEERCRED on an accepted socket connection: {e}");
                UnixPeer {
                    uid: None,
                    gid: None,
                    pid: None,
                }
            }
        }
    }
}

/// The group the socket is given: `rampart` when it exists, else root's (gid 0).
pub fn socket_group() -> u32 {
    match nix::unistd::Group::from_name(SOCKET_GROUP) {
        Ok(Some(g)) => g.gid.as_raw(),
        _ => 0,
    }
}

/// Whether the user `uid` (primary group `gid`) is in group `group`: its primary group, or
/// one of its supplementary groups as the group database lists them.
fn in_group(uid: u32, gid: u32, group: u32) -> bool {
    if gid == group {
        return true;
    }
    let Ok(Some(user)) = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) else {
        return false;
    };
    let Ok(name) = std::ffi::CString::new(user.name) else {
        return false;
    };
    nix::unistd::getgrouplist(&name, nix::unistd::Gid::from_raw(gid))
        .map(|gs| gs.iter().any(|g| g.as_raw() == group))
        .unwrap_or(false)
}

/// The rules of the native API's authentication.
#[derive(Debug, Clone)]
pub(crate) struct Auth {
    /// The key store; none: it could not be opened, and every key is refused (fail closed).
    keys: Option<Arc<NodeKeyStore>>,
    /// Host names (lowercase, no port) the daemon answers to over TCP.
    hosts: Vec<String>,
    /// Any IP literal is a name of the daemon (it listens on every address).
    any_ip: bool,
    /// The socket's group.
    group: u32,
    /// The daemon's own uid.
    euid: u32,
    /// Tenants: the create rate limit and the change log (none: a server without a store).
    pub(crate) tenancy: Option<Arc<crate::tenancy::Tenancy>>,
    /// The fleet's token when this node serves a fleet: the only credential TCP accepts.
    pub(crate) fleet_token: Option<String>,
}

/// Lowercase host name of a `Host` value, without its port and brackets.
fn host_name(host: &str) -> String {
    let h = host.trim();
    let name = if let Some(rest) = h.strip_prefix('[') {
        rest.split_once(']').map(|(n, _)| n).unwrap_or(rest)
    } else {
        match h.rsplit_once(':') {
            Some((n, p)) if p.bytes().all(|b| b.is_ascii_digit()) => n,
            _ => h,
        }
    };
    name.trim_end_matches('.').to_ascii_lowercase()
}

impl Auth {
    /// The rules for a daemon listening on `listen` (if known), whose port-routing domain is
    /// `domain`, also answering to `extra` names, with `keys`.
    pub(crate) fn new(
        keys: Option<Arc<NodeKeyStore>>,
        listen: Option<SocketAddr>,
        domain: &str,
        extra: &[String],
    ) -> Auth {
        let mut hosts: Vec<String> = ["localhost", "127.0.0.1", "::1"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        hosts.push(domain.to_ascii_lowercase());
        hosts.extend(extra.iter().map(|h| host_name(h)));
        let mut any_ip = false;
        if let Some(l) = listen {
            if l.ip().is_unspecified() {
                any_ip = true;
            } else {
                hosts.push(l.ip().to_string());
            }
        }
        hosts.sort();
        hosts.dedup();
        Auth {
            keys,
            hosts,
            any_ip,
            group: socket_group(),
            euid: nix::unistd::geteuid().as_raw(),
            tenancy: None,
            fleet_token: None,
        }
    }

    /// Whether `host` (a `Host` value) names this daemon.
    fn host_ok(&self, host: &str) -> bool {
        let name = host_name(host);
        if self.hosts.contains(&name) {
            return true;
        }
        self.any_ip && name.parse::<IpAddr>().is_ok()
    }

    /// Whether a socket caller is the node's administrator.
    fn peer_is_admin(&self, p: &UnixPeer) -> bool {
        match (p.uid, p.gid) {
            (Some(0), _) => true,
            (Some(u), _) if u == self.euid => true,
            (Some(u), Some(g)) => in_group(u, g, self.group),
            _ => false,
        }
    }
}

/// The key a request carries: `Authorization: Bearer KEY`, else `X-API-Key: KEY`. Err: an
/// `Authorization` that is not a bearer credential.
fn presented_key(req: &Request) -> Result<Option<String>, ApiError> {
    if let Some(v) = req.headers().get(header::AUTHORIZATION) {
        let text = v.to_str().map_err(|_| {
            unauthorized("malformed Authorization header: expected `Bearer rampart_...`")
        })?;
        let (scheme, rest) = text.trim().split_once(' ').ok_or_else(|| {
            unauthorized("malformed Authorization header: expected `Bearer rampart_...`")
        })?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(unauthorized(format!(
                "malformed Authorization header: scheme {scheme:?} is not Bearer"
            )));
        }
        return Ok(Some(rest.trim().to_owned()));
    }
    if let Some(v) = req.headers().get("x-api-key") {
        let text = v
            .to_str()
            .map_err(|_| unauthorized("malformed X-API-Key header: not text"))?;
        return Ok(Some(text.trim().to_owned()));
    }
    Ok(websocket_key(req.headers()))
}

/// The prefix of the WebSocket subprotocol that carries an API key: a browser cannot set
/// headers on a WebSocket, so the console offers `rampart.v1, rampart.key.<key>` and the
/// server answers `rampart.v1` (the key is never echoed).
pub const KEY_PROTOCOL_PREFIX: &str = "rampart.key.";
/// The subprotocol the server selects when a client offers it.
pub const WS_PROTOCOL: &str = "rampart.v1";

/// The key offered as a WebSocket subprotocol, on an upgrade request only.
fn websocket_key(headers: &axum::http::HeaderMap) -> Option<String> {
    let upgrade = headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    if !upgrade {
        return None;
    }
    headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .find_map(|p| {
            p.trim()
                .strip_prefix(KEY_PROTOCOL_PREFIX)
                .map(str::to_owned)
        })
}

fn unauthorized(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
}

/// Whether `path` (inside `/v1`) is the path form of the port proxy, which answers to each
/// sandbox's access token rather than to API keys: `/sandboxes/{id}/ports/{P}[/...]`, but
/// not `/sandboxes/{id}/ports` (the list) nor `.../ports/{P}/public` (owner's switches).
fn is_port_proxy(path: &str, method: &axum::http::Method) -> bool {
    let path = path.strip_prefix("/v1").unwrap_or(path);
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    if segs.len() < 4 || segs[0] != "sandboxes" || segs[2] != "ports" || segs[3].is_empty() {
        return false;
    }
    let public_switch = segs.len() == 5
        && segs[4] == "public"
        && (method == axum::http::Method::POST || method == axum::http::Method::DELETE);
    !public_switch
}

/// Who a request authenticated as: recorded as the audit record's caller.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Principal {
    /// A user on the Unix socket (the node's administrator).
    Socket { uid: Option<u32> },
    /// A key over TCP.
    Key(NodeKey),
    /// A key a fleet's gateway checked, on a node of the fleet.
    Gateway(GatewayPrincipal),
}

impl Principal {
    fn caller(&self, peer: Option<SocketAddr>) -> String {
        match self {
            Principal::Socket { uid } => match uid {
                Some(u) => format!("socket uid {u}"),
                None => "socket".into(),
            },
            Principal::Key(k) => format!(
                "key:{}:{} ({}){}{}",
                k.id,
                k.name,
                k.scopes.join(","),
                k.tenant
                    .as_ref()
                    .map(|t| format!(" tenant {t}"))
                    .unwrap_or_default(),
                crate::caller::from(peer)
            ),
            Principal::Gateway(g) => format!(
                "{} via gateway {}{}",
                Principal::Key(g.key.clone()).caller(None),
                g.gateway,
                g.peer
                    .as_ref()
                    .map(|p| format!(" from {p}"))
                    .unwrap_or_default()
            ),
        }
    }

    /// The key behind it, if any.
    fn key(&self) -> Option<&NodeKey> {
        match self {
            Principal::Socket { .. } => None,
            Principal::Key(k) => Some(k),
            Principal::Gateway(g) => Some(&g.key),
        }
    }

    /// Whether it may use an endpoint that needs `scope`.
    fn may(&self, scope: &str) -> bool {
        self.key().is_none_or(|k| k.has_scope(scope))
    }

    /// The tenant it acts for.
    fn tenant(&self) -> Option<&str> {
        self.key().and_then(|k| k.tenant.as_deref())
    }

    /// As core knows it.
    fn core(&self, peer: Option<SocketAddr>) -> rampart_core::Principal {
        rampart_core::Principal {
            caller: self.caller(peer),
            tenant: self.tenant().map(str::to_owned),
            key_id: self.key().map(|k| k.id.clone()),
        }
    }
}

/// The scope an endpoint of the native API needs (`path` from `/v1` or `/metrics`); None:
/// any authenticated caller (its tenant's own view). Unknown paths need `admin`.
pub fn required_scope(method: &axum::http::Method, path: &str) -> Option<&'static str> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let scope = match segs.as_slice() {
        ["metrics"] => "admin",
        ["v1", "tenants", ..] => "admin",
        ["v1", "usage"]
        | ["v1", "audit", "key" | "checkpoint"]
        | ["v1", "openapi.json"]
        | ["v1", "whoami"] => return None,
        // Each tool call is an API call with the same credentials, checked there.
        ["mcp", ..] => return None,
        ["v1", "changes"] => "audit",
        ["v1", "templates", ..] => "templates",
        ["v1", "secrets", ..] => "secrets",
        ["v1", "approvals", ..] => "approve",
        ["v1", "snapshots", ..] | ["v1", "volumes", ..] => "sandboxes",
        ["v1", "sandboxes"] => "sandboxes",
        ["v1", "sandboxes", _] => "sandboxes",
        ["v1", "sandboxes", _, what, ..] => match *what {
            "exec" | "processes" | "desktop" | "browser" => "exec",
            // Reading what a sandbox left is reading its files.
            "files" | "artifacts" => "files",
            "network" => "network",
            "audit" | "packages" => "audit",
            "ports"
                if segs.len() == 6 && segs[5] == "public" && method != axum::http::Method::GET =>
            {
                "network"
            }
            _ => "sandboxes",
        },
        _ => "admin",
    };
    Some(scope)
}

/// `GET /v1/whoami`: who the request authenticated as (the console shows it, and hides what
/// the key may not use). Any authenticated caller may ask.
pub(crate) async fn whoami(
    who: Option<axum::Extension<Principal>>,
) -> axum::Json<serde_json::Value> {
    let body = match who.map(|w| w.0) {
        Some(Principal::Key(k) | Principal::Gateway(GatewayPrincipal { key: k, .. })) => {
            serde_json::json!({
                "kind": "key",
                "key_id": k.id,
                "name": k.name,
                "tenant": k.tenant,
                "scopes": k.scopes,
            })
        }
        Some(Principal::Socket { uid }) => serde_json::json!({
            "kind": "socket",
            "uid": uid,
            "tenant": null,
            "scopes": [SCOPE_ADMIN],
        }),
        None => serde_json::json!({"kind": "none", "tenant": null, "scopes": [SCOPE_ADMIN]}),
    };
    axum::Json(body)
}

/// Serves an authenticated request: its scope, its tenant's create rate, then the request
/// on behalf of its principal, and the change log.
async fn serve_as(
    auth: &Auth,
    who: Principal,
    peer: Option<SocketAddr>,
    mut req: Request,
    next: Next,
) -> Response {
    let method = req.method().clone();
    // Under `nest("/v1")` the request's path lacks the prefix; the original has it.
    let path = req
        .extensions()
        .get::<axum::extract::OriginalUri>()
        .map(|u| u.0.path().to_owned())
        .unwrap_or_else(|| req.uri().path().to_owned());
    if let Some(scope) = required_scope(&method, &path) {
        if !who.may(scope) {
            let id = who.key().map_or_else(|| "socket".into(), |k| k.id.clone());
            return ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                format!("API key {id} lacks the scope `{scope}` this endpoint needs"),
            )
            .into_response();
        }
    }
    let mut p = who.core(peer);
    if let Some(client) = req
        .headers()
        .get(rampart_mcp::CLIENT_HEADER)
        .and_then(|v| v.to_str().ok())
    {
        // The client's own claim, beside the principal that authenticated (any caller can
        // send the header).
        p.caller = format!("{} via mcp:{}", p.caller, rampart_mcp::client_name(client));
    }
    let mut rate = None;
    if let (Some(t), Some(tenancy)) = (who.tenant(), &auth.tenancy) {
        if crate::tenancy::is_create(&method, &path) {
            match tenancy.take_create(t) {
                Ok(r) => rate = r,
                Err(refused) => {
                    let r = refused.native();
                    tenancy.log_call(&p, &method, &path, r.status());
                    return r;
                }
            }
        }
    }
    req.extensions_mut().insert(who);
    let logged = p.clone();
    crate::caller::set(&mut req, p);
    let mut resp = next.run(req).await;
    if let Some(r) = rate {
        r.write(resp.headers_mut());
    }
    if let Some(t) = &auth.tenancy {
        t.log_call(&logged, &method, &path, resp.status());
    }
    resp
}

/// Middleware on `/v1` and `/metrics`: the Unix socket's peer check, or over TCP the Host
/// check and the key check. Serves the request on behalf of who it authenticated as.
pub(crate) async fn guard(State(auth): State<Arc<Auth>>, req: Request, next: Next) -> Response {
    if let Some(ConnectInfo(p)) = req.extensions().get::<ConnectInfo<UnixPeer>>().copied() {
        if !auth.peer_is_admin(&p) {
            let who = p
                .uid
                .map(|u| format!("uid {u}"))
                .unwrap_or_else(|| "a user the kernel did not name".into());
            return unauthorized(format!(
                "{who} may not use the daemon's socket: only root, the daemon's user and \
                 members of its group (gid {}) may; over TCP send an API key",
                auth.group
            ))
            .into_response();
        }
        return serve_as(&auth, Principal::Socket { uid: p.uid }, None, req, next).await;
    }
    let host = req
        .headers()
        .get(header::HOST)
        .map(|v| v.to_str().map(str::to_owned).unwrap_or_default())
        .or_else(|| req.uri().authority().map(|a| a.as_str().to_owned()));
    if let Some(h) = &host {
        if !auth.host_ok(h) {
            return ApiError::new(
                StatusCode::MISDIRECTED_REQUEST,
                "misdirected_request",
                format!(
                    "this daemon does not answer to Host {h:?} (a page of another site must \
                     not reach it by DNS rebinding); use one of {} or add the name to \
                     `allowed_hosts` in the daemon's config",
                    auth.hosts.join(", ")
                ),
            )
            .into_response();
        }
    }
    if is_port_proxy(req.uri().path(), req.method()) {
        // The sandbox's access token is checked by the port proxy itself.
        return next.run(req).await;
    }
    let key = match presented_key(&req) {
        Ok(Some(k)) => k,
        Ok(None) => {
            return unauthorized(
                "missing API key: send `Authorization: Bearer rampart_...` (the admin key is \
                 in <data>/admin-key; make more with `rampart keys create`), or use the \
                 daemon's Unix socket",
            )
            .into_response()
        }
        Err(e) => return e.into_response(),
    };
    if let Some(token) = &auth.fleet_token {
        return match from_gateway(token, &key, &req) {
            Ok(who) if who.e2b => unauthorized(format!(
                "E2B API key {} is for the E2B API, not the native one",
                who.key.id
            ))
            .into_response(),
            Ok(who) => {
                if let (Some(t), Some(q), Some(tenancy)) =
                    (&who.key.tenant, &who.quotas, &auth.tenancy)
                {
                    if let Err(e) = tenancy.mirror(t, q) {
                        return ApiError::internal(format!("tenant {t}'s copy on this node: {e}"))
                            .into_response();
                    }
                }
                let peer = crate::caller::peer(&req);
                serve_as(&auth, Principal::Gateway(who), peer, req, next).await
            }
            Err(e) => e.into_response(),
        };
    }
    if let Err(e) = check_shape(&key) {
        return unauthorized(format!("malformed API key: {e}")).into_response();
    }
    let Some(keys) = auth.keys.clone() else {
        return ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "the daemon's key store could not be opened; see its log",
        )
        .into_response();
    };
    // Looked up on the request's own task (a read by primary key: a thread hand-off cost
    // more than the query); the once-a-minute record of its use is written off it.
    let k = match keys.lookup(&key) {
        Ok(KeyCheck::Valid(k)) => k,
        Ok(KeyCheck::Unknown) => {
            return unauthorized("unknown API key: no such key on this daemon").into_response()
        }
        Ok(KeyCheck::Expired(k)) => {
            return unauthorized(format!("expired API key (id {})", k.id)).into_response()
        }
        Ok(KeyCheck::Revoked(k)) => {
            return unauthorized(format!("revoked API key (id {})", k.id)).into_response()
        }
        Err(e) => return ApiError::internal(format!("key store: {e}")).into_response(),
    };
    if NodeKeyStore::use_due(&k) {
        tokio::task::spawn_blocking(move || {
            if let Err(e) = keys.record_use(&key) {
                tracing::warn!("recording an API key's use: {e}");
            }
        });
    }
    let peer = crate::caller::peer(&req);
    serve_as(&auth, Principal::Key(k), peer, req, next).await
}

/// On a node of a fleet: the principal a gateway vouches for, if `key` is the fleet's token.
pub(crate) fn from_gateway(
    token: &str,
    key: &str,
    req: &Request,
) -> Result<GatewayPrincipal, ApiError> {
    use sha2::Digest as _;
    // Compared as digests: the time taken says nothing about the token's characters.
    let same = sha2::Sha256::digest(token.as_bytes()) == sha2::Sha256::digest(key.as_bytes());
    if !same {
        return Err(unauthorized(
            "this node serves a fleet: over TCP it answers only the fleet's gateways; send \
             the request to a gateway (its own keys work on its Unix socket)",
        ));
    }
    let text = req
        .headers()
        .get(GATEWAY_PRINCIPAL_HEADER)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "bad_request",
                format!("a gateway's request without {GATEWAY_PRINCIPAL_HEADER}"),
            )
        })?;
    let who = GatewayPrincipal::decode(text).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("{GATEWAY_PRINCIPAL_HEADER}: {e}"),
        )
    })?;
    if !who.key.is_active(rampart_store::now_ms()) {
        return Err(unauthorized(format!(
            "the gateway named key {} which is revoked or expired",
            who.key.id
        )));
    }
    Ok(who)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth(listen: &str) -> Auth {
        Auth::new(
            None,
            Some(listen.parse().unwrap()),
            "sandboxes.example.com",
            &["api.example.com:443".into()],
        )
    }

    #[test]
    fn hosts_name_the_daemon() {
        let a = auth("127.0.0.1:3000");
        for h in [
            "localhost",
            "localhost:3000",
            "LOCALHOST:8080",
            "127.0.0.1:3000",
            "127.0.0.1",
            "[::1]:3000",
            "[::1]",
            "sandboxes.example.com",
            "api.example.com",
        ] {
            assert!(a.host_ok(h), "{h}");
        }
        for h in [
            "evil.example",
            "evil.example:3000",
            "localhost.evil.example",
            "10.0.0.5:3000",
            "",
        ] {
            assert!(!a.host_ok(h), "{h}");
        }
        let any = auth("0.0.0.0:3000");
        assert!(any.host_ok("10.0.0.5:3000"));
        assert!(any.host_ok("[fe80::1]:3000"));
        assert!(!any.host_ok("evil.example"));
    }

    #[test]
    fn port_proxy_paths() {
        use axum::http::Method;
        assert!(is_port_proxy("/v1/sandboxes/abc/ports/8080", &Method::GET));
        assert!(is_port_proxy("/v1/sandboxes/abc/ports/8080/", &Method::GET));
        assert!(is_port_proxy(
            "/v1/sandboxes/abc/ports/8080/x/y",
            &Method::POST
        ));
        assert!(is_port_proxy(
            "/v1/sandboxes/abc/ports/8080/public",
            &Method::GET
        ));
        assert!(!is_port_proxy(
            "/v1/sandboxes/abc/ports/8080/public",
            &Method::POST
        ));
        assert!(!is_port_proxy(
            "/v1/sandboxes/abc/ports/8080/public",
            &Method::DELETE
        ));
        assert!(!is_port_proxy("/v1/sandboxes/abc/ports", &Method::GET));
        assert!(!is_port_proxy("/v1/sandboxes/abc/exec", &Method::POST));
        assert!(!is_port_proxy("/v1/sandboxes", &Method::GET));
    }

    #[test]
    fn every_endpoint_needs_its_scope() {
        use axum::http::Method;
        let s = |m: Method, p: &str| required_scope(&m, p);
        assert_eq!(s(Method::POST, "/v1/sandboxes"), Some("sandboxes"));
        assert_eq!(s(Method::DELETE, "/v1/sandboxes/abc"), Some("sandboxes"));
        assert_eq!(s(Method::POST, "/v1/sandboxes/abc/exec"), Some("exec"));
        assert_eq!(s(Method::GET, "/v1/sandboxes/abc/exec/ws"), Some("exec"));
        assert_eq!(s(Method::PUT, "/v1/sandboxes/abc/files"), Some("files"));
        assert_eq!(s(Method::GET, "/v1/sandboxes/abc/artifacts"), Some("files"));
        assert_eq!(s(Method::PUT, "/v1/sandboxes/abc/network"), Some("network"));
        assert_eq!(
            s(Method::POST, "/v1/sandboxes/abc/ports/80/public"),
            Some("network")
        );
        assert_eq!(s(Method::GET, "/v1/sandboxes/abc/ports"), Some("sandboxes"));
        assert_eq!(
            s(Method::GET, "/v1/sandboxes/abc/audit/bundle"),
            Some("audit")
        );
        assert_eq!(s(Method::GET, "/v1/sandboxes/abc/packages"), Some("audit"));
        assert_eq!(s(Method::POST, "/v1/secrets"), Some("secrets"));
        assert_eq!(s(Method::GET, "/v1/templates"), Some("templates"));
        assert_eq!(s(Method::DELETE, "/v1/volumes/v"), Some("sandboxes"));
        assert_eq!(s(Method::POST, "/v1/tenants"), Some("admin"));
        assert_eq!(s(Method::GET, "/metrics"), Some("admin"));
        assert_eq!(s(Method::GET, "/v1/usage"), None);
        assert_eq!(s(Method::GET, "/v1/something-new"), Some("admin"));
    }

    #[test]
    fn socket_peers() {
        let a = auth("127.0.0.1:3000");
        let root = UnixPeer {
            uid: Some(0),
            gid: Some(0),
            pid: None,
        };
        assert!(a.peer_is_admin(&root));
        let unknown = UnixPeer {
            uid: None,
            gid: None,
            pid: None,
        };
        assert!(!a.peer_is_admin(&unknown));
    }
}
