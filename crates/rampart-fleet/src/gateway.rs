//! `rampart gateway`: the fleet's front door. It authenticates callers against the fleet's
//! keys (in etcd), places creates on nodes, and carries every call that names a sandbox to
//! the node the catalog says it runs on, with the fleet's token and the caller it checked.
//!
//! What it answers itself: `/health`, `GET /v1/nodes`, `/v1/whoami`, `/v1/tenants...` and
//! `/v1/keys...` (kept in etcd), `POST /v1/sandboxes` (placement), `GET /v1/sandboxes` (every
//! live node's list, merged, with the lost ones). The rest of `/v1/sandboxes/{id}/...` goes to
//! the sandbox's node unchanged, streamed both ways.

use crate::model::{CatalogEntry, NodeRecord, TenantDef};
use crate::store::{Store, StoreError};
use crate::view::View;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use http_body_util::BodyExt as _;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use rampart_server::ApiError;
use rampart_store::keys::sha256_hex;
use rampart_store::node_keys::{
    check_shape, describe, GatewayPrincipal, NewKey, GATEWAY_PRINCIPAL_HEADER, SCOPE_ADMIN,
};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// How a gateway starts.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// etcd's client URLs.
    pub endpoints: Vec<String>,
    /// The prefix of the fleet's keys.
    pub prefix: String,
    /// The gateway's name (in the record of every call it carries).
    pub name: String,
    /// An admin key to make sure the fleet has (the operator's, e.g. from a Secret).
    pub admin_key: Option<String>,
    /// How many nodes a create compares (best of K by free capacity).
    pub choices: usize,
    /// The domain of host-name routing to sandboxes (`{port}-{id}.<domain>`); the nodes must
    /// have the same.
    pub domain: String,
}

/// Why a gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// etcd could not be reached or refused.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The admin key given is not a key.
    #[error("the admin key: {0}")]
    AdminKey(#[from] rampart_store::node_keys::NewKeyError),
    /// The metrics' registry refused one (a name given twice).
    #[error("the gateway's metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}

/// A running gateway.
#[derive(Debug)]
pub struct Gateway {
    cfg: GatewayConfig,
    store: Store,
    view: Arc<View>,
    token: String,
    /// The lease creates' reservations are held under (they go with the gateway).
    lease: i64,
    http: Client<HttpConnector, Body>,
    metrics: crate::metrics::Metrics,
}

/// The largest create body the gateway reads (it needs the template and tier to place).
const MAX_CREATE_BODY: usize = 1 << 20;

fn err(status: StatusCode, code: &'static str, message: impl Into<String>) -> Response {
    ApiError::new(status, code, message).into_response()
}

fn unavailable(e: impl std::fmt::Display) -> Response {
    err(
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        format!("the fleet's store (etcd) did not answer: {e}"),
    )
}

impl Gateway {
    /// Connects to etcd, makes sure of the fleet's token and the given admin key, starts
    /// following the nodes and the catalog.
    pub async fn start(cfg: GatewayConfig) -> Result<Arc<Gateway>, GatewayError> {
        let store = Store::connect(&cfg.endpoints, &cfg.prefix).await?;
        let token = store.token().await?;
        if let Some(key) = &cfg.admin_key {
            let new = NewKey {
                name: "fleet-admin".into(),
                tenant: None,
                scopes: vec![SCOPE_ADMIN.into()],
                expires_at_ms: None,
            };
            let info = describe(&new, key)?;
            match store.put_key(&sha256_hex(key.as_bytes()), &info).await {
                Ok(()) | Err(StoreError::Exists(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let lease = store.grant(10).await?;
        let mut keeper = store.keeper(lease).await?;
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(3)).await;
                if let Err(e) = keeper.renew().await {
                    tracing::warn!("gateway: its lease: {e}; reservations may go early");
                }
            }
        });
        let view = View::follow(store.clone());
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(3)));
        let http = Client::builder(hyper_util::rt::TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Ok(Arc::new(Gateway {
            cfg,
            store,
            view,
            token,
            lease,
            http,
            metrics: crate::metrics::Metrics::new()?,
        }))
    }

    /// The router: everything goes through [`Gateway::handle`].
    pub fn router(self: &Arc<Self>) -> axum::Router {
        let g = self.clone();
        axum::Router::new().fallback(move |req: Request| {
            let g = g.clone();
            let fut: futures::future::BoxFuture<'static, Response> =
                Box::pin(async move { g.handle(req).await });
            fut
        })
    }

    /// Serves the router on `listener` until `shutdown` completes.
    pub async fn serve(
        self: &Arc<Self>,
        listener: tokio::net::TcpListener,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        axum::serve(
            listener,
            self.router()
                .into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(shutdown)
        .await
    }

    /// Serves one request, counted and timed by route.
    async fn handle(&self, req: Request) -> Response {
        let started = std::time::Instant::now();
        let route = self.route_of(&req);
        let resp = self.answer(req).await;
        self.metrics.request(route, resp.status().as_u16(), started);
        resp
    }

    /// The route a request is counted under.
    fn route_of(&self, req: &Request) -> &'static str {
        if self.sandbox_target(req.headers()).is_some() {
            return "envd";
        }
        let path = req.uri().path();
        let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
        let post = req.method() == Method::POST;
        match segs.as_slice() {
            ["health"] => "health",
            ["metrics"] => "metrics",
            ["v1", "sandboxes"] if post => "create",
            ["v1", "sandboxes"] => "list",
            ["v1", "sandboxes", _, "exec", ..] => "exec",
            ["v1", "sandboxes", _, "ports", ..] => "ports",
            ["v1", "sandboxes", ..] => "sandbox",
            ["v1", "nodes", ..] => "nodes",
            ["v1", "keys", ..] => "keys",
            ["v1", "tenants", ..] => "tenants",
            ["v1", ..] => "other",
            ["sandboxes"] | ["v2", "sandboxes"] if post => "e2b_create",
            ["sandboxes"] | ["v2", "sandboxes"] => "e2b_list",
            ["sandboxes", ..] | ["v2", "sandboxes", ..] => "e2b_sandbox",
            _ if is_e2b_path(path) => "e2b_other",
            _ => "unknown",
        }
    }

    /// `GET /metrics` (admin): the gateway's metrics.
    async fn metrics(&self, headers: &HeaderMap) -> Response {
        let who = match self.authenticate(headers, None).await {
            Ok(w) => w,
            Err(r) => return r,
        };
        if !who.key.has_scope(SCOPE_ADMIN) {
            return err(
                StatusCode::FORBIDDEN,
                "forbidden",
                "/metrics needs the `admin` scope",
            );
        }
        let nodes = self.view.nodes();
        let ready = nodes.iter().filter(|n| n.schedulable).count() as i64;
        let draining = nodes.len() as i64 - ready;
        let mut lost: Vec<String> = self.view.lost().into_iter().map(|(_, e)| e.node).collect();
        lost.sort();
        lost.dedup();
        let placed: u64 = self.view.per_node().values().sum();
        let body = self
            .metrics
            .render(ready, draining, lost.len() as i64, placed as i64);
        ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
    }

    async fn answer(&self, req: Request) -> Response {
        let path = req.uri().path().to_owned();
        let method = req.method().clone();
        if method == Method::GET && path == "/metrics" {
            return self.metrics(req.headers()).await;
        }
        if path == "/health" {
            return Json(
                json!({"status": "ok", "gateway": self.cfg.name, "watching": self.view.live()}),
            )
            .into_response();
        }
        // The E2B SDKs' traffic to a sandbox (envd, its ports): the sandbox's own token is
        // the authorization, checked by its node.
        if let Some((id, host_form)) = self.sandbox_target(req.headers()) {
            return self.to_sandbox(&id, None, req, host_form).await;
        }
        if is_e2b_path(&path) {
            return self.e2b(req).await;
        }
        if !path.starts_with("/v1/") {
            return err(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("{path} is not served by the fleet's gateway (it serves /v1 and /health)"),
            );
        }
        let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
        // The port proxy's path form answers to the sandbox's own token, checked by its node.
        if let ["v1", "sandboxes", id, "ports", port, ..] = segs.as_slice() {
            // `.../ports/{P}/public` with POST or DELETE is the owner's switch (needs a key).
            let switch = segs.len() == 6 && segs[5] == "public" && method != Method::GET;
            if !port.is_empty() && !switch {
                let id = (*id).to_owned();
                return self.to_sandbox(&id, None, req, false).await;
            }
        }
        let peer = req
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .map(|c| c.0.to_string());
        let who = match self.authenticate(req.headers(), peer).await {
            Ok(k) => k,
            Err(r) => return r,
        };
        if method == Method::GET && path == "/v1/audit/keys" {
            return self.audit_keys().await;
        }
        if let Some(scope) = rampart_server::required_scope(&method, &path) {
            if !who.key.has_scope(scope) {
                return err(
                    StatusCode::FORBIDDEN,
                    "forbidden",
                    format!(
                        "API key {} lacks the scope `{scope}` this endpoint needs",
                        who.key.id
                    ),
                );
            }
        }
        match (&method, segs.as_slice()) {
            (&Method::GET, ["v1", "whoami"]) => Json(json!({
                "kind": "key", "key_id": who.key.id, "name": who.key.name,
                "tenant": who.key.tenant, "scopes": who.key.scopes, "gateway": self.cfg.name,
            }))
            .into_response(),
            (&Method::GET, ["v1", "nodes"]) => self.nodes(&who).into_response(),
            (&Method::POST | &Method::DELETE, ["v1", "nodes", name, "drain"]) => {
                let name = (*name).to_owned();
                self.drain(&who, &name, method == Method::POST).await
            }
            (_, ["v1", "keys", ..]) => self.keys(&who, req).await,
            (_, ["v1", "tenants", ..]) => self.tenants(req).await,
            (&Method::POST, ["v1", "sandboxes"]) => self.create(who, req).await,
            (&Method::GET, ["v1", "sandboxes"]) => self.list(&who, req).await,
            (_, ["v1", "sandboxes", id, ..]) => {
                let id = (*id).to_owned();
                self.to_sandbox(&id, Some(&who), req, false).await
            }
            (_, ["v1", "snapshots", ..]) => self.snapshots(&who, req).await,
            (&Method::GET, ["v1", "usage"]) => self.usage(&who, req).await,
            (&Method::GET, ["v1", "templates" | "openapi.json" | "audit", ..]) => {
                // What every node answers alike: any live node's answer.
                match self.view.nodes().into_iter().next() {
                    Some(n) => self.forward(&n, Some(&who), req, false).await,
                    None => no_nodes(),
                }
            }
            _ => err(
                StatusCode::NOT_IMPLEMENTED,
                "not_implemented",
                format!(
                    "{method} {path} is not served through the fleet's gateway yet; call it on a \
                     node's Unix socket"
                ),
            ),
        }
    }

    /// The caller's key, checked against the fleet's keys.
    async fn authenticate(
        &self,
        headers: &HeaderMap,
        peer: Option<String>,
    ) -> Result<GatewayPrincipal, Response> {
        let presented = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                let (scheme, rest) = v.trim().split_once(' ')?;
                scheme
                    .eq_ignore_ascii_case("bearer")
                    .then(|| rest.trim().to_owned())
            })
            .or_else(|| {
                headers
                    .get("x-api-key")
                    .and_then(|v| v.to_str().ok())
                    .map(|v| v.trim().to_owned())
            })
            .or_else(|| {
                // A browser's WebSocket cannot set headers: the key comes as a subprotocol.
                headers
                    .get_all(header::SEC_WEBSOCKET_PROTOCOL)
                    .iter()
                    .filter_map(|v| v.to_str().ok())
                    .flat_map(|v| v.split(','))
                    .find_map(|p| {
                        p.trim()
                            .strip_prefix(rampart_server::KEY_PROTOCOL_PREFIX)
                            .map(str::to_owned)
                    })
            });
        let unauthorized = |m: String| err(StatusCode::UNAUTHORIZED, "unauthorized", m);
        let Some(key) = presented else {
            return Err(unauthorized(
                "missing API key: send `Authorization: Bearer rampart_...` (a key of the fleet)"
                    .into(),
            ));
        };
        let e2b = rampart_store::keys::is_key_shaped(&key);
        if !e2b {
            if let Err(e) = check_shape(&key) {
                return Err(unauthorized(format!("malformed API key: {e}")));
            }
        }
        let digest = sha256_hex(key.as_bytes());
        // From the watched copy; a key it has not seen yet (made a moment ago through
        // another gateway) is read from etcd.
        let found = match self.view.key(&digest) {
            Some(Some(k)) => Ok(Some(k)),
            _ => self.store.key_by_digest(&digest).await,
        };
        let k = match found {
            Ok(Some(k)) => k,
            Ok(None) => {
                return Err(unauthorized(
                    "unknown API key: no such key in the fleet".into(),
                ))
            }
            Err(e) => return Err(unavailable(e)),
        };
        if !k.is_active(rampart_store::now_ms()) {
            return Err(unauthorized(format!(
                "revoked or expired API key (id {})",
                k.id
            )));
        }
        // The tenant's quotas travel with the caller: the node makes or updates its copy of
        // the tenant before it serves the request.
        let quotas = match &k.tenant {
            Some(t) => match self.tenant_def(t).await {
                Ok(Some(def)) => Some(def.quotas),
                Ok(None) => {
                    return Err(unauthorized(format!(
                        "API key {} belongs to tenant {t}, which the fleet no longer has",
                        k.id
                    )))
                }
                Err(e) => return Err(unavailable(e)),
            },
            None => None,
        };
        Ok(GatewayPrincipal {
            gateway: self.cfg.name.clone(),
            peer,
            key: k,
            quotas,
            e2b,
        })
    }

    /// Tenant `name`: from the watched copy, else from etcd.
    async fn tenant_def(&self, name: &str) -> Result<Option<TenantDef>, StoreError> {
        match self.view.tenant(name) {
            Some(Some(t)) => Ok(Some(t)),
            _ => self.store.tenant(name).await,
        }
    }

    /// `GET /v1/audit/keys`: the fleet's key set, every node's audit key (those of nodes
    /// gone too): `rampart audit verify --key-set` checks a bundle from any node with it.
    async fn audit_keys(&self) -> Response {
        match self.store.audit_keys().await {
            Ok(ks) => Json(json!({
                "keys": ks
                    .into_iter()
                    .map(|(node, public_key)| json!({"node": node, "public_key": public_key}))
                    .collect::<Vec<_>>()
            }))
            .into_response(),
            Err(e) => unavailable(e),
        }
    }

    /// `POST /v1/nodes/{name}/drain` (and `DELETE`: undo): no new sandbox is placed on the
    /// node; what runs there goes on.
    async fn drain(&self, who: &GatewayPrincipal, name: &str, drained: bool) -> Response {
        if !who.key.has_scope(SCOPE_ADMIN) {
            return err(
                StatusCode::FORBIDDEN,
                "forbidden",
                "draining a node needs the `admin` scope",
            );
        }
        let known =
            self.view.node(name).is_some() || self.view.lost().iter().any(|(_, e)| e.node == name);
        if !known {
            return err(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("no node {name} in the fleet"),
            );
        }
        if let Err(e) = self.store.set_drain(name, drained).await {
            return unavailable(e);
        }
        self.view.note_drain(name, drained);
        Json(json!({"node": name, "state": if drained { "draining" } else { "ready" }}))
            .into_response()
    }

    fn nodes(&self, who: &GatewayPrincipal) -> Response {
        if !who.key.has_scope(SCOPE_ADMIN) {
            return err(
                StatusCode::FORBIDDEN,
                "forbidden",
                "GET /v1/nodes needs the `admin` scope",
            );
        }
        let per = self.view.per_node();
        let mut nodes: Vec<Value> = self
            .view
            .nodes()
            .into_iter()
            .map(|n| {
                let placed = per.get(&n.name).copied().unwrap_or(0);
                let mut v = serde_json::to_value(&n).unwrap_or(Value::Null);
                v["state"] = json!(if n.schedulable { "ready" } else { "draining" });
                v["catalog_sandboxes"] = json!(placed);
                v
            })
            .collect();
        // Nodes the catalog names that have no live record: their lease lapsed.
        let mut gone: Vec<String> = self.view.lost().into_iter().map(|(_, e)| e.node).collect();
        gone.sort();
        gone.dedup();
        for name in gone {
            nodes.push(json!({"name": name, "state": "lost",
                              "catalog_sandboxes": per.get(&name).copied().unwrap_or(0)}));
        }
        Json(json!({"nodes": nodes})).into_response()
    }

    async fn keys(&self, who: &GatewayPrincipal, req: Request) -> Response {
        if !who.key.has_scope(SCOPE_ADMIN) {
            return err(
                StatusCode::FORBIDDEN,
                "forbidden",
                "the fleet's keys need the `admin` scope",
            );
        }
        let method = req.method().clone();
        let path = req.uri().path().to_owned();
        let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
        match (&method, segs.as_slice()) {
            (&Method::GET, ["v1", "keys"]) => match self.store.keys().await {
                Ok(ks) => {
                    let list: Vec<Value> = ks
                        .into_iter()
                        .map(|(_, k)| {
                            let kind = if k.scopes.iter().any(|s| s == E2B_SCOPE) {
                                "e2b"
                            } else {
                                "native"
                            };
                            let mut v = serde_json::to_value(&k).unwrap_or(Value::Null);
                            v["kind"] = json!(kind);
                            v
                        })
                        .collect();
                    Json(list).into_response()
                }
                Err(e) => unavailable(e),
            },
            (&Method::POST, ["v1", "keys"]) => {
                #[derive(serde::Deserialize)]
                #[serde(deny_unknown_fields)]
                struct Body {
                    name: String,
                    #[serde(default)]
                    tenant: Option<String>,
                    #[serde(default)]
                    scopes: Option<Vec<String>>,
                    #[serde(default)]
                    expires_at_ms: Option<i64>,
                    /// `native` (the default) or `e2b`.
                    #[serde(default)]
                    kind: Option<String>,
                }
                let b: Body = match read_json(req).await {
                    Ok(b) => b,
                    Err(r) => return r,
                };
                if let Some(t) = &b.tenant {
                    match self.tenant_def(t).await {
                        Ok(Some(_)) => {}
                        Ok(None) => {
                            return err(
                                StatusCode::BAD_REQUEST,
                                "bad_request",
                                format!(
                                    "tenant: no tenant {t:?} in the fleet (POST /v1/tenants first)"
                                ),
                            )
                        }
                        Err(e) => return unavailable(e),
                    }
                }
                let made = match b.kind.as_deref().unwrap_or("native") {
                    "native" => {
                        let scopes = b.scopes.unwrap_or_else(|| match &b.tenant {
                            Some(_) => rampart_store::node_keys::default_tenant_scopes(),
                            None => vec![SCOPE_ADMIN.into()],
                        });
                        let new = NewKey {
                            name: b.name,
                            tenant: b.tenant,
                            scopes,
                            expires_at_ms: b.expires_at_ms,
                        };
                        let key = rampart_store::node_keys::generate();
                        describe(&new, &key).map(|info| (key, info))
                    }
                    "e2b" if b.scopes.is_some() || b.expires_at_ms.is_some() => {
                        return err(
                            StatusCode::BAD_REQUEST,
                            "bad_request",
                            "an E2B key has no scopes or expiry (it may use the whole E2B API)",
                        )
                    }
                    "e2b" => Ok(e2b_key(b.name, b.tenant)),
                    other => {
                        return err(
                            StatusCode::BAD_REQUEST,
                            "bad_request",
                            format!("kind: {other:?} is neither \"native\" nor \"e2b\""),
                        )
                    }
                };
                let (key, info) = match made {
                    Ok(m) => m,
                    Err(e) => return err(StatusCode::BAD_REQUEST, "bad_request", e.to_string()),
                };
                match self.store.put_key(&sha256_hex(key.as_bytes()), &info).await {
                    Ok(()) => {
                        let kind = if info.scopes.iter().any(|s| s == E2B_SCOPE) {
                            "e2b"
                        } else {
                            "native"
                        };
                        (
                            StatusCode::CREATED,
                            Json(
                                json!({"key": key, "id": info.id, "name": info.name, "kind": kind,
                                        "tenant": info.tenant, "scopes": info.scopes,
                                        "expires_at_ms": info.expires_at_ms}),
                            ),
                        )
                            .into_response()
                    }
                    Err(e) => unavailable(e),
                }
            }
            (&Method::DELETE, ["v1", "keys", id]) => {
                match self.store.revoke_key(id, rampart_store::now_ms()).await {
                    Ok(true) => StatusCode::NO_CONTENT.into_response(),
                    Ok(false) => err(
                        StatusCode::NOT_FOUND,
                        "not_found",
                        format!("no key {id} in the fleet"),
                    ),
                    Err(e) => unavailable(e),
                }
            }
            _ => err(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                format!("{method} {path}"),
            ),
        }
    }

    /// `/v1/tenants...`: the fleet's tenants (in etcd), as a node's API shows tenants
    /// (`TenantInfo`); what they hold is counted over the fleet (its sandboxes).
    async fn tenants(&self, req: Request) -> Response {
        let method = req.method().clone();
        let path = req.uri().path().to_owned();
        let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
        let not_found = |name: &str| {
            err(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("no tenant {name} in the fleet"),
            )
        };
        match (&method, segs.as_slice()) {
            (&Method::GET, ["v1", "tenants"]) => match self.store.tenants().await {
                Ok(ts) => {
                    let mut out = Vec::new();
                    for t in &ts {
                        out.push(self.tenant_info(t).await);
                    }
                    Json(out).into_response()
                }
                Err(e) => unavailable(e),
            },
            (&Method::POST, ["v1", "tenants"]) => {
                let b: rampart_types::tenant::CreateTenant = match read_json(req).await {
                    Ok(b) => b,
                    Err(r) => return r,
                };
                if let Err(e) = rampart_types::tenant::check_tenant_name(&b.name) {
                    return err(StatusCode::BAD_REQUEST, "bad_request", format!("name: {e}"));
                }
                if let Err(e) = b.quotas.check() {
                    return err(StatusCode::BAD_REQUEST, "bad_request", e.to_string());
                }
                if b.approvals.is_some() {
                    return err(
                        StatusCode::BAD_REQUEST,
                        "bad_request",
                        "approvals: a fleet's tenants have no approval policy of their own yet; \
                         give each sandbox its policy",
                    );
                }
                let t = TenantDef {
                    name: b.name,
                    quotas: b.quotas,
                    created_at_ms: rampart_store::now_ms(),
                };
                match self.store.create_tenant(&t).await {
                    Ok(()) => {
                        (StatusCode::CREATED, Json(self.tenant_info(&t).await)).into_response()
                    }
                    Err(StoreError::Exists(what)) => err(StatusCode::CONFLICT, "conflict", what),
                    Err(e) => unavailable(e),
                }
            }
            (&Method::GET, ["v1", "tenants", name]) => match self.store.tenant(name).await {
                Ok(Some(t)) => Json(self.tenant_info(&t).await).into_response(),
                Ok(None) => not_found(name),
                Err(e) => unavailable(e),
            },
            (&Method::PUT, ["v1", "tenants", name, "quotas"]) => {
                let q: rampart_types::tenant::Quotas = match read_json(req).await {
                    Ok(q) => q,
                    Err(r) => return r,
                };
                if let Err(e) = q.check() {
                    return err(StatusCode::BAD_REQUEST, "bad_request", e.to_string());
                }
                match self.store.tenant(name).await {
                    Ok(Some(mut t)) => {
                        t.quotas = q;
                        match self.store.put_tenant(&t).await {
                            Ok(()) => Json(self.tenant_info(&t).await).into_response(),
                            Err(e) => unavailable(e),
                        }
                    }
                    Ok(None) => not_found(name),
                    Err(e) => unavailable(e),
                }
            }
            (&Method::DELETE, ["v1", "tenants", name]) => {
                match self.store.tenant_count(name).await {
                    Ok(0) => {}
                    Ok(n) => {
                        return err(
                            StatusCode::CONFLICT,
                            "conflict",
                            format!("tenant {name} still has {n} sandboxes in the fleet; destroy them first"),
                        )
                    }
                    Err(e) => return unavailable(e),
                }
                match self.store.delete_tenant(name).await {
                    Ok(true) => StatusCode::NO_CONTENT.into_response(),
                    Ok(false) => not_found(name),
                    Err(e) => unavailable(e),
                }
            }
            _ => err(
                StatusCode::NOT_IMPLEMENTED,
                "not_implemented",
                format!(
                    "{method} {path} is not served through the fleet's gateway yet (a fleet's \
                     tenants have quotas; approval policies are per sandbox)"
                ),
            ),
        }
    }

    /// A tenant as the API shows it: what it holds is its sandboxes across the fleet (the
    /// other holdings are each node's, not summed here).
    async fn tenant_info(&self, t: &TenantDef) -> Value {
        let count = self.store.tenant_count(&t.name).await.ok();
        let created = time::OffsetDateTime::from_unix_timestamp(t.created_at_ms / 1000)
            .ok()
            .and_then(|d| {
                d.format(&time::format_description::well_known::Rfc3339)
                    .ok()
            })
            .unwrap_or_default();
        json!({
            "name": t.name,
            "quotas": t.quotas,
            "created_at": created,
            "fleet": {"sandboxes": count},
        })
    }

    /// Which sandbox a request is for when it is addressed to one rather than to the API:
    /// the E2B SDKs' `E2b-Sandbox-Id` header, or a host `{port}-{id}.<domain>`. The bool:
    /// named by its host.
    fn sandbox_target(&self, headers: &HeaderMap) -> Option<(String, bool)> {
        let h = |n: &str| headers.get(n).and_then(|v| v.to_str().ok()).map(str::trim);
        if let Some(id) = h("e2b-sandbox-id").filter(|s| !s.is_empty()) {
            return Some((id.to_owned(), false));
        }
        let host = h("host")?;
        let name = match host.rsplit_once(':') {
            Some((n, p)) if p.bytes().all(|b| b.is_ascii_digit()) => n,
            _ => host,
        }
        .to_ascii_lowercase();
        let label = name.strip_suffix(&format!(".{}", self.cfg.domain))?;
        let (port, id) = label.split_once('-')?;
        let ok = port.parse::<u16>().is_ok()
            && !id.is_empty()
            && id
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        ok.then(|| (id.to_owned(), true))
    }

    /// The E2B control plane: its keys (`X-API-Key: e2b_...`), creates placed, lists merged,
    /// calls naming a sandbox carried to its node.
    async fn e2b(&self, req: Request) -> Response {
        let method = req.method().clone();
        let path = req.uri().path().to_owned();
        let peer = req
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .map(|c| c.0.to_string());
        let who = match self.authenticate(req.headers(), peer).await {
            Ok(w) if w.e2b => w,
            Ok(w) => {
                return e2b_err(
                    StatusCode::UNAUTHORIZED,
                    format!("key {} is a native key; the E2B API takes an E2B key (POST /v1/keys with \"kind\": \"e2b\")", w.key.id),
                )
            }
            Err(r) => return r,
        };
        let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
        match (&method, segs.as_slice()) {
            (&Method::POST, ["sandboxes"] | ["v2", "sandboxes"]) => self.create(who, req).await,
            (&Method::GET, ["sandboxes"] | ["v2", "sandboxes"]) => self.list(&who, req).await,
            (_, ["sandboxes", id, ..] | ["v2", "sandboxes", id, ..]) => {
                let id = (*id).to_owned();
                self.to_sandbox(&id, Some(&who), req, false).await
            }
            (&Method::GET, ["events", "sandboxes"]) => self.e2b_events(&who, req).await,
            (&Method::GET, ["events", "sandboxes", id]) => {
                let id = (*id).to_owned();
                if self.view.lookup(&id).is_some() {
                    return self.to_sandbox(&id, Some(&who), req, false).await;
                }
                // Ended: no longer in the catalog; its history is on one node.
                self.e2b_events(&who, req).await
            }
            (&Method::GET, ["templates", ..] | ["v2", "templates", ..]) => {
                match self.view.nodes().into_iter().next() {
                    Some(n) => self.forward(&n, Some(&who), req, false).await,
                    None => no_nodes(),
                }
            }
            _ => e2b_err(
                StatusCode::NOT_IMPLEMENTED,
                format!("{method} {path} is not served through the fleet's gateway yet"),
            ),
        }
    }

    /// `GET /events/sandboxes[/{id}]` (the E2B API; one id when the sandbox ended and left
    /// the catalog): every live node's events, merged by time, then
    /// the caller's `offset` and `limit` (each node is asked for the first `offset + limit`,
    /// at most its maximum of 100).
    async fn e2b_events(&self, who: &GatewayPrincipal, req: Request) -> Response {
        let mut offset = 0usize;
        let mut limit = 10usize;
        let mut asc = false;
        let mut passed = Vec::new();
        for (k, v) in url_pairs(req.uri().query().unwrap_or("")) {
            match k.as_str() {
                "offset" => offset = v.parse().unwrap_or(0),
                "limit" => limit = v.parse().unwrap_or(10),
                "orderAsc" => {
                    asc = v == "true";
                    passed.push(format!("orderAsc={v}"));
                }
                _ => passed.push(format!("{k}={v}")),
            }
        }
        passed.push("offset=0".into());
        passed.push(format!("limit={}", (offset + limit).clamp(1, 100)));
        let uri = format!("{}?{}", req.uri().path(), passed.join("&"));
        let mut all = match self.merged(who, &uri, true, false).await {
            Ok(a) => a,
            Err(r) => return r,
        };
        let at = |v: &Value| v["timestamp"].as_str().unwrap_or_default().to_owned();
        all.sort_by_key(at);
        if !asc {
            all.reverse();
        }
        Json(Value::Array(
            all.into_iter().skip(offset).take(limit).collect(),
        ))
        .into_response()
    }

    /// `GET /v1/usage`: each live node's signed report for the caller (each verifies with
    /// that node's key, `rampart usage verify`), as `{"nodes": [{"node", "report"}]}`.
    async fn usage(&self, who: &GatewayPrincipal, req: Request) -> Response {
        let pq = req
            .uri()
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/");
        match self.ask_all(who, pq, false).await {
            Ok(reports) => {
                let nodes: Vec<Value> = reports
                    .into_iter()
                    .map(|(node, report)| json!({"node": node, "report": report}))
                    .collect();
                Json(json!({"nodes": nodes})).into_response()
            }
            Err(r) => r,
        }
    }

    /// After a snapshot: where it is kept (a create from it goes there).
    async fn record_snapshot(&self, resp: Response, node: &str, owner: Option<&str>) -> Response {
        let (parts, bytes, v) = match read_answer(resp, node).await {
            Ok(a) => a,
            Err(r) => return r,
        };
        let name = v
            .get("name")
            .or_else(|| v.get("snapshotID"))
            .and_then(Value::as_str);
        if let Some(name) = name {
            if let Err(e) = self.store.put_snapshot(owner, name, node).await {
                tracing::warn!(snapshot = %name, "gateway: recording where a snapshot is: {e}");
            }
        }
        Response::from_parts(parts, Body::from(bytes))
    }

    /// `/v1/snapshots...`: the list merged over the live nodes; one snapshot at its node.
    async fn snapshots(&self, who: &GatewayPrincipal, req: Request) -> Response {
        let path = req.uri().path().to_owned();
        let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
        match segs.as_slice() {
            ["v1", "snapshots"] if req.method() == Method::GET => {
                match self.merged(who, "/v1/snapshots", false, true).await {
                    Ok(all) => Json(Value::Array(all)).into_response(),
                    Err(r) => r,
                }
            }
            ["v1", "snapshots", name] => {
                let name = (*name).to_owned();
                let owner = who.key.tenant.clone();
                let node = match self.store.snapshot_node(owner.as_deref(), &name).await {
                    Ok(Some(n)) => n,
                    Ok(None) => {
                        return err(
                            StatusCode::NOT_FOUND,
                            "not_found",
                            format!("no snapshot {name}"),
                        )
                    }
                    Err(e) => return unavailable(e),
                };
                let Some(node) = self.view.node(&node) else {
                    return err(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "node_lost",
                        format!("snapshot {name} is kept on node {node}, whose lease lapsed"),
                    );
                };
                let delete = req.method() == Method::DELETE;
                let resp = self.forward(&node, Some(who), req, false).await;
                if delete && (resp.status().is_success() || resp.status() == StatusCode::NOT_FOUND)
                {
                    if let Err(e) = self.store.forget_snapshot(owner.as_deref(), &name).await {
                        tracing::warn!(snapshot = %name, "gateway: forgetting a snapshot: {e}");
                    }
                }
                resp
            }
            _ => err(StatusCode::NOT_FOUND, "not_found", path),
        }
    }

    /// After a fork: each new sandbox (on the parent's node) in the catalog.
    /// A fork: the forks' share of the tenant's fleet-wide `max_sandboxes` held first (as
    /// many as it asks for: `count`, 1 when absent), then the fork at the source's node, then
    /// each new sandbox in the catalog in place of a hold; what is not used is let go.
    async fn fork(
        &self,
        node: &NodeRecord,
        who: &GatewayPrincipal,
        tenant: Option<String>,
        req: Request,
    ) -> Response {
        let (parts, body) = req.into_parts();
        let bytes = match axum::body::to_bytes(body, MAX_CREATE_BODY).await {
            Ok(b) => b,
            Err(e) => return err(StatusCode::BAD_REQUEST, "bad_request", format!("body: {e}")),
        };
        let count = serde_json::from_slice::<Value>(&bytes)
            .ok()
            .and_then(|v| v.get("count").and_then(Value::as_u64))
            .unwrap_or(1)
            .clamp(1, 20);
        let max = who.quotas.as_ref().and_then(|q| q.max_sandboxes);
        let held = match self
            .store
            .reserve(tenant.as_deref(), max, count, self.lease)
            .await
        {
            Ok(h) => h,
            Err(StoreError::Quota {
                tenant,
                count: have,
                max,
            }) => {
                let m = format!(
                    "tenant {tenant} has {have} sandboxes across the fleet, its max_sandboxes is \
                     {max}, and the fork asks for {count} more"
                );
                return if who.e2b {
                    e2b_err(StatusCode::TOO_MANY_REQUESTS, m)
                } else {
                    err(StatusCode::TOO_MANY_REQUESTS, "quota_exceeded", m)
                };
            }
            Err(e) => return unavailable(e),
        };
        let resp = self
            .forward(
                node,
                Some(who),
                Request::from_parts(parts, Body::from(bytes)),
                false,
            )
            .await;
        if !resp.status().is_success() {
            self.release(held).await;
            return resp;
        }
        self.record_forks(resp, &node.name, tenant, held).await
    }

    /// Lets a reservation's unused holds go; a failure is logged (the holds then stay until
    /// this gateway's lease ends).
    async fn release(&self, held: crate::store::Reservation) {
        if let Err(e) = self.store.release(held).await {
            tracing::warn!("gateway: letting a tenant's unused holds go: {e}; they stay until this gateway stops");
        }
    }

    async fn record_forks(
        &self,
        resp: Response,
        node: &str,
        tenant: Option<String>,
        mut held: crate::store::Reservation,
    ) -> Response {
        let (parts, bytes, v) = match read_answer(resp, node).await {
            Ok(a) => a,
            Err(r) => return r,
        };
        let mut ids = Vec::new();
        collect_ids(&v, 0, &mut ids);
        for id in ids {
            let entry = CatalogEntry {
                node: node.to_owned(),
                tenant: tenant.clone(),
                recorded_ms: rampart_store::now_ms(),
            };
            if let Err(e) = self.store.record(&id, &entry, &mut held).await {
                // Its node lists it at its next renewal.
                tracing::warn!(sandbox = %id, "gateway: recording a fork in the catalog: {e}");
            }
            self.view.note(&id, entry);
        }
        self.release(held).await;
        Response::from_parts(parts, Body::from(bytes))
    }

    /// `POST /v1/sandboxes` (and the E2B API's create): the tenant's fleet-wide quota, a
    /// node, the node's create, the catalog.
    async fn create(&self, who: GatewayPrincipal, req: Request) -> Response {
        let (parts, body) = req.into_parts();
        let bytes = match axum::body::to_bytes(body, MAX_CREATE_BODY).await {
            Ok(b) => b,
            Err(e) => return err(StatusCode::BAD_REQUEST, "bad_request", format!("body: {e}")),
        };
        let spec: Value = if bytes.is_empty() {
            json!({})
        } else {
            match serde_json::from_slice(&bytes) {
                Ok(v) => v,
                Err(e) => return err(StatusCode::BAD_REQUEST, "bad_request", format!("body: {e}")),
            }
        };
        let template = spec
            .get("template")
            .and_then(Value::as_str)
            .unwrap_or("base")
            .to_owned();
        let tier = spec
            .get("isolation")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let tenant = who.key.tenant.clone();
        let max = who.quotas.as_ref().and_then(|q| q.max_sandboxes);
        let t = std::time::Instant::now();
        let reserved = self
            .store
            .reserve(tenant.as_deref(), max, 1, self.lease)
            .await;
        if max.is_some() {
            self.metrics.etcd("reserve", t);
        }
        let held = match reserved {
            Ok(h) => h,
            Err(StoreError::Quota { tenant, count, max }) => {
                let m = format!(
                    "tenant {tenant} has {count} sandboxes across the fleet and its \
                     max_sandboxes is {max}"
                );
                return if who.e2b {
                    e2b_err(StatusCode::TOO_MANY_REQUESTS, m)
                } else {
                    err(StatusCode::TOO_MANY_REQUESTS, "quota_exceeded", m)
                };
            }
            Err(e) => return unavailable(e),
        };
        // A create from a snapshot goes where the snapshot is kept.
        let snapshot = spec
            .get("snapshot")
            .and_then(Value::as_str)
            .or(who.e2b.then_some(template.as_str()));
        let pinned = match snapshot {
            Some(name) => match self
                .store
                .snapshot_node(who.key.tenant.as_deref(), name)
                .await
            {
                Ok(n) => n,
                Err(e) => {
                    self.release(held).await;
                    return unavailable(e);
                }
            },
            None => None,
        };
        if let Some(pin) = pinned {
            let Some(node) = self.view.node(&pin) else {
                self.release(held).await;
                return err(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "node_lost",
                    format!("the snapshot is kept on node {pin}, whose lease lapsed"),
                );
            };
            return self.create_on(node, who, parts, bytes, held).await;
        }
        let nodes = self.view.nodes();
        let Some(node) = place(
            &nodes,
            &self.view.per_node(),
            tier.as_deref(),
            &template,
            self.cfg.choices,
        ) else {
            self.release(held).await;
            return if nodes.is_empty() {
                no_nodes()
            } else {
                err(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "no_capacity",
                    format!(
                        "no node of the fleet can take this sandbox ({} live; tier {}; each full, \
                         draining or without the tier)",
                        nodes.len(),
                        tier.as_deref().unwrap_or("any")
                    ),
                )
            };
        };
        self.create_on(node, who, parts, bytes, held).await
    }

    /// The create on `node`, then its catalog entry in place of the reservation `held`.
    async fn create_on(
        &self,
        node: NodeRecord,
        who: GatewayPrincipal,
        parts: axum::http::request::Parts,
        bytes: bytes::Bytes,
        mut held: crate::store::Reservation,
    ) -> Response {
        let tenant = who.key.tenant.clone();
        let req = Request::from_parts(parts, Body::from(bytes));
        let resp = self.forward(&node, Some(&who), req, false).await;
        if !resp.status().is_success() {
            self.release(held).await;
            return resp;
        }
        let (mut parts, body) = resp.into_parts();
        let bytes = match body.collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => {
                self.release(held).await;
                return err(
                    StatusCode::BAD_GATEWAY,
                    "bad_gateway",
                    format!("node {}: {e}", node.name),
                );
            }
        };
        let mut v: Value = match serde_json::from_slice(&bytes) {
            Ok(v) => v,
            Err(e) => {
                self.release(held).await;
                return err(
                    StatusCode::BAD_GATEWAY,
                    "bad_gateway",
                    format!("node {}'s answer: {e}", node.name),
                );
            }
        };
        let Some(id) = v
            .get("id")
            .or_else(|| v.get("sandboxID"))
            .and_then(Value::as_str)
            .map(str::to_owned)
        else {
            self.release(held).await;
            return err(
                StatusCode::BAD_GATEWAY,
                "bad_gateway",
                format!("node {}'s answer has no id", node.name),
            );
        };
        let entry = CatalogEntry {
            node: node.name.clone(),
            tenant,
            recorded_ms: rampart_store::now_ms(),
        };
        let t = std::time::Instant::now();
        let recorded = self.store.record(&id, &entry, &mut held).await;
        self.metrics.etcd("record", t);
        if let Err(e) = recorded {
            self.release(held).await;
            // Not in the catalog, the sandbox would be unreachable through the other
            // gateways: it is not kept, and the create fails with the reason.
            tracing::warn!(sandbox = %id, node = %node.name, "gateway: recording in the catalog: {e}; destroying it");
            let path = if who.e2b {
                format!("/sandboxes/{id}")
            } else {
                format!("/v1/sandboxes/{id}")
            };
            let undo = Request::builder()
                .method(Method::DELETE)
                .uri(path)
                .body(Body::empty())
                .expect("a request");
            let gone = self.forward(&node, Some(&who), undo, false).await;
            let m = format!(
                "the fleet's store (etcd) did not take the sandbox's catalog entry: {e}; the \
                 sandbox was destroyed on node {} ({})",
                node.name,
                gone.status()
            );
            return if who.e2b {
                e2b_err(StatusCode::SERVICE_UNAVAILABLE, m)
            } else {
                err(StatusCode::SERVICE_UNAVAILABLE, "unavailable", m)
            };
        }
        self.view.note(&id, entry);
        if !who.e2b {
            v["node"] = json!(node.name);
        }
        let out = serde_json::to_vec(&v).unwrap_or_default();
        parts.headers.remove(header::CONTENT_LENGTH);
        Response::from_parts(parts, Body::from(out))
    }

    /// `GET path_and_query` on every live node at once, for `who`: each node's JSON answer.
    /// A node's 404 is left out when `skip_missing`; any other failure is the answer.
    async fn ask_all(
        &self,
        who: &GatewayPrincipal,
        path_and_query: &str,
        skip_missing: bool,
    ) -> Result<Vec<(String, Value)>, Response> {
        let nodes = self.view.nodes();
        let asks = nodes.iter().map(|n| {
            let r = Request::builder()
                .method(Method::GET)
                .uri(path_and_query)
                .body(Body::empty())
                .expect("a request");
            async move { (n, self.forward(n, Some(who), r, false).await) }
        });
        let mut out = Vec::new();
        for (n, resp) in futures::future::join_all(asks).await {
            if skip_missing && resp.status() == StatusCode::NOT_FOUND {
                continue;
            }
            if !resp.status().is_success() {
                return Err(resp);
            }
            let bytes = resp
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .map_err(|e| {
                    err(
                        StatusCode::BAD_GATEWAY,
                        "bad_gateway",
                        format!("node {}: {e}", n.name),
                    )
                })?;
            let v = serde_json::from_slice(&bytes).map_err(|e| {
                err(
                    StatusCode::BAD_GATEWAY,
                    "bad_gateway",
                    format!("node {}'s answer: {e}", n.name),
                )
            })?;
            out.push((n.name.clone(), v));
        }
        Ok(out)
    }

    /// Every item of every node's list answer, each with `node` when `tag`.
    async fn merged(
        &self,
        who: &GatewayPrincipal,
        path_and_query: &str,
        skip_missing: bool,
        tag: bool,
    ) -> Result<Vec<Value>, Response> {
        let mut all = Vec::new();
        for (node, v) in self.ask_all(who, path_and_query, skip_missing).await? {
            let Value::Array(items) = v else {
                return Err(err(
                    StatusCode::BAD_GATEWAY,
                    "bad_gateway",
                    format!("node {node}'s list is not a list"),
                ));
            };
            for mut item in items {
                if tag {
                    item["node"] = json!(node);
                }
                all.push(item);
            }
        }
        Ok(all)
    }

    /// `GET /v1/sandboxes`: every live node's answer for the caller, merged; the caller's
    /// sandboxes on lost nodes, as `lost`.
    async fn list(&self, who: &GatewayPrincipal, req: Request) -> Response {
        let pq = req
            .uri()
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/");
        let mut all = match self.merged(who, pq, false, !who.e2b).await {
            Ok(a) => a,
            Err(r) => return r,
        };
        for (id, e) in self.view.lost() {
            if !who.e2b && (who.key.tenant.is_none() || who.key.tenant == e.tenant) {
                all.push(lost_json(&id, &e));
            }
        }
        Json(Value::Array(all)).into_response()
    }

    /// A call naming sandbox `id`: to its node, or `lost` if the node's lease lapsed.
    /// `keep_host`: the node needs the request's own `Host` (the host form
    /// `{port}-{id}.<domain>` names the sandbox).
    async fn to_sandbox(
        &self,
        id: &str,
        who: Option<&GatewayPrincipal>,
        req: Request,
        keep_host: bool,
    ) -> Response {
        let entry = match self.view.lookup(id) {
            Some(e) => Some(e),
            // Another gateway's create not yet in this one's copy.
            None => {
                let t = std::time::Instant::now();
                let found = self.store.lookup(id).await;
                self.metrics.etcd("lookup", t);
                match found {
                    Ok(e) => e,
                    Err(e) => return unavailable(e),
                }
            }
        };
        let e2b = who.is_some_and(|w| w.e2b);
        let not_found = || {
            if keep_host || (who.is_none() && !req.uri().path().starts_with("/v1/")) {
                // As a node's envd proxy answers for a sandbox that is not there.
                (
                    StatusCode::BAD_GATEWAY,
                    Json(json!({"sandboxId": id, "message": "The sandbox was not found", "code": 502})),
                )
                    .into_response()
            } else if e2b {
                e2b_err(StatusCode::NOT_FOUND, format!("sandbox {id} not found"))
            } else {
                err(
                    StatusCode::NOT_FOUND,
                    "not_found",
                    format!("no sandbox {id}"),
                )
            }
        };
        let Some(entry) = entry else {
            return not_found();
        };
        if let Some(w) = who {
            if w.key.tenant.is_some() && w.key.tenant != entry.tenant {
                return not_found();
            }
        }
        let p = req.uri().path().trim_end_matches('/').to_owned();
        let names_it =
            !keep_host && (p == format!("/v1/sandboxes/{id}") || p == format!("/sandboxes/{id}"));
        let Some(node) = self.view.node(&entry.node) else {
            if names_it && req.method() == Method::GET && !e2b {
                return Json(lost_json(id, &entry)).into_response();
            }
            let m = format!(
                "sandbox {id} runs on node {} whose lease lapsed: it is lost until the node returns",
                entry.node
            );
            return if e2b {
                e2b_err(StatusCode::SERVICE_UNAVAILABLE, m)
            } else {
                err(StatusCode::SERVICE_UNAVAILABLE, "node_lost", m)
            };
        };
        let is_destroy = names_it && req.method() == Method::DELETE;
        let is_info = names_it && req.method() == Method::GET && !e2b;
        let is_fork = !keep_host && req.method() == Method::POST && p.ends_with("/fork");
        let is_snapshot = !keep_host && req.method() == Method::POST && p.ends_with("/snapshots");
        if is_fork {
            if let Some(w) = who {
                return self.fork(&node, w, entry.tenant.clone(), req).await;
            }
        }
        let resp = self.forward(&node, who, req, keep_host).await;
        if is_snapshot && resp.status().is_success() {
            return self
                .record_snapshot(resp, &node.name, entry.tenant.as_deref())
                .await;
        }
        if is_destroy && (resp.status().is_success() || resp.status() == StatusCode::NOT_FOUND) {
            let t = std::time::Instant::now();
            let forgotten = self.store.forget(id, entry.tenant.as_deref()).await;
            self.metrics.etcd("forget", t);
            if let Err(e) = forgotten {
                tracing::warn!(sandbox = %id, "gateway: removing from the catalog: {e}");
            }
            self.view.drop_entry(id);
        }
        if is_info && resp.status().is_success() {
            return with_node(resp, &node.name).await;
        }
        resp
    }

    /// Carries `req` to `node`: the fleet's token and the checked caller replace the
    /// caller's credentials; the body and the answer stream.
    /// `keep_host`: the caller's `Host` goes to the node unchanged.
    async fn forward(
        &self,
        node: &NodeRecord,
        who: Option<&GatewayPrincipal>,
        req: Request,
        keep_host: bool,
    ) -> Response {
        let mut req = req;
        // A WebSocket (or any upgrade): the node's 101 is passed on, then bytes both ways.
        let upgrade = req.headers().get(header::UPGRADE).cloned();
        let client_side = upgrade.as_ref().map(|_| hyper::upgrade::on(&mut req));
        let (mut parts, body) = req.into_parts();
        let pq = parts
            .uri
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/");
        let uri: Uri = match format!("{}{pq}", node.url.trim_end_matches('/')).parse() {
            Ok(u) => u,
            Err(e) => {
                return err(
                    StatusCode::BAD_GATEWAY,
                    "bad_gateway",
                    format!("node {}'s url: {e}", node.name),
                )
            }
        };
        strip_hop_by_hop(&mut parts.headers);
        if let Some(u) = &upgrade {
            parts
                .headers
                .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
            parts.headers.insert(header::UPGRADE, u.clone());
        }
        if !keep_host {
            parts.headers.remove(header::HOST);
        }
        if who.is_some() {
            parts.headers.remove(header::AUTHORIZATION);
            parts.headers.remove("x-api-key");
            // The key a browser offers as a subprotocol stays here: the node gets the token.
            without_key_protocol(&mut parts.headers);
        }
        // Only the gateway says who the caller is.
        parts.headers.remove(GATEWAY_PRINCIPAL_HEADER);
        if let Some(w) = who {
            let bearer = format!("Bearer {}", self.token);
            let (Ok(a), Ok(p)) = (
                HeaderValue::from_str(&bearer),
                HeaderValue::from_str(&w.encode()),
            ) else {
                return err(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "the fleet's token is not a header value",
                );
            };
            parts.headers.insert(header::AUTHORIZATION, a);
            parts.headers.insert(GATEWAY_PRINCIPAL_HEADER, p);
        }
        parts.uri = uri;
        parts.version = axum::http::Version::HTTP_11;
        let out = hyper::Request::from_parts(parts, body);
        match self.http.request(out).await {
            Ok(mut resp) if resp.status() == StatusCode::SWITCHING_PROTOCOLS => {
                let Some(client_side) = client_side else {
                    return err(
                        StatusCode::BAD_GATEWAY,
                        "bad_gateway",
                        format!("node {} switched protocols unasked", node.name),
                    );
                };
                let node_side = hyper::upgrade::on(&mut resp);
                let name = node.name.clone();
                tokio::spawn(async move {
                    match futures::future::try_join(client_side, node_side).await {
                        Ok((c, n)) => {
                            let mut c = hyper_util::rt::TokioIo::new(c);
                            let mut n = hyper_util::rt::TokioIo::new(n);
                            let _ = tokio::io::copy_bidirectional(&mut c, &mut n).await;
                        }
                        Err(e) => tracing::debug!(node = %name, "gateway: an upgrade failed: {e}"),
                    }
                });
                let (parts, _) = resp.into_parts();
                Response::from_parts(parts, Body::empty())
            }
            Ok(resp) => {
                let (mut parts, body) = resp.into_parts();
                strip_hop_by_hop(&mut parts.headers);
                Response::from_parts(parts, Body::new(body))
            }
            Err(e) => err(
                StatusCode::BAD_GATEWAY,
                "bad_gateway",
                format!("node {} at {} did not answer: {e}", node.name, node.url),
            ),
        }
    }
}

/// The scope that marks an E2B API key in the fleet's key list (no native endpoint takes it).
pub const E2B_SCOPE: &str = "e2b";

/// A new E2B API key (`e2b_` and 40 hex digits) of `tenant`, and its listing.
fn e2b_key(name: String, tenant: Option<String>) -> (String, rampart_store::node_keys::NodeKey) {
    use rampart_store::keys::{random_hex, KEY_HEX_LEN, KEY_PREFIX};
    let key = format!("{KEY_PREFIX}{}", random_hex(KEY_HEX_LEN / 2));
    let digest = sha256_hex(key.as_bytes());
    let info = rampart_store::node_keys::NodeKey {
        id: digest[..12].to_owned(),
        name,
        hint: format!("{}…", &key[..KEY_PREFIX.len() + 6]),
        tenant,
        scopes: vec![E2B_SCOPE.into()],
        created_at_ms: rampart_store::now_ms(),
        expires_at_ms: None,
        revoked_at_ms: None,
        last_used_at_ms: None,
    };
    (key, info)
}

/// The pairs of a query string, decoded.
fn url_pairs(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (k.to_owned(), v.to_owned())
        })
        .collect()
}

/// The E2B API's paths (at the root, as E2B serves them).
fn is_e2b_path(path: &str) -> bool {
    let first = path.trim_start_matches('/').split('/').next().unwrap_or("");
    let first = match first {
        "v2" | "v3" => path.trim_start_matches('/').split('/').nth(1).unwrap_or(""),
        f => f,
    };
    matches!(
        first,
        "sandboxes"
            | "templates"
            | "events"
            | "volumes"
            | "secrets"
            | "volumecontent"
            | "files"
            | "e2b"
    )
}

/// An error as the E2B API writes it: `{"code": N, "message": ...}`.
fn e2b_err(status: StatusCode, message: impl Into<String>) -> Response {
    (
        status,
        Json(json!({"code": status.as_u16(), "message": message.into()})),
    )
        .into_response()
}

/// Sandbox ids in a fork's answer: `id` or `sandboxID` fields, at the top or one level down.
fn collect_ids(v: &Value, depth: usize, out: &mut Vec<String>) {
    match v {
        Value::Array(items) if depth < 3 => {
            items.iter().for_each(|i| collect_ids(i, depth + 1, out))
        }
        Value::Object(m) if depth < 3 => {
            for k in ["id", "sandboxID"] {
                if let Some(id) = m.get(k).and_then(Value::as_str) {
                    out.push(id.to_owned());
                }
            }
            for (k, inner) in m {
                if k != "id" && k != "sandboxID" && (inner.is_object() || inner.is_array()) {
                    collect_ids(inner, depth + 1, out);
                }
            }
        }
        _ => {}
    }
}

fn no_nodes() -> Response {
    err(
        StatusCode::SERVICE_UNAVAILABLE,
        "no_nodes",
        "the fleet has no live node",
    )
}

fn lost_json(id: &str, e: &CatalogEntry) -> Value {
    json!({"id": id, "node": e.node, "state": "lost", "tenant": e.tenant})
}

/// A node's whole answer: its head, its bytes, and their JSON (null when they are not JSON).
async fn read_answer(
    resp: Response,
    node: &str,
) -> Result<(axum::http::response::Parts, bytes::Bytes, Value), Response> {
    let (parts, body) = resp.into_parts();
    let bytes = body.collect().await.map(|b| b.to_bytes()).map_err(|e| {
        err(
            StatusCode::BAD_GATEWAY,
            "bad_gateway",
            format!("node {node}: the answer broke off: {e}"),
        )
    })?;
    let v = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Ok((parts, bytes, v))
}

async fn with_node(resp: Response, node: &str) -> Response {
    let (mut parts, bytes, mut v) = match read_answer(resp, node).await {
        Ok(a) => a,
        Err(r) => return r,
    };
    if !v.is_object() {
        return Response::from_parts(parts, Body::from(bytes));
    }
    v["node"] = json!(node);
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(
        parts,
        Body::from(serde_json::to_vec(&v).unwrap_or_default()),
    )
}

async fn read_json<T: serde::de::DeserializeOwned>(req: Request) -> Result<T, Response> {
    let bytes = axum::body::to_bytes(req.into_body(), MAX_CREATE_BODY)
        .await
        .map_err(|e| err(StatusCode::BAD_REQUEST, "bad_request", format!("body: {e}")))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| err(StatusCode::BAD_REQUEST, "bad_request", format!("body: {e}")))
}

/// Drops the `rampart.key.<key>` entries of `Sec-WebSocket-Protocol` (the console's way of
/// sending its key), keeping the others.
fn without_key_protocol(h: &mut HeaderMap) {
    let offered: Vec<String> = h
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|p| p.trim().to_owned())
        .filter(|p| !p.is_empty() && !p.starts_with(rampart_server::KEY_PROTOCOL_PREFIX))
        .collect();
    h.remove(header::SEC_WEBSOCKET_PROTOCOL);
    if let Ok(v) = HeaderValue::from_str(&offered.join(", ")) {
        if !offered.is_empty() {
            h.insert(header::SEC_WEBSOCKET_PROTOCOL, v);
        }
    }
}

/// Headers that belong to one connection, not to the request (RFC 9110 7.6.1).
fn strip_hop_by_hop(h: &mut HeaderMap) {
    let named: Vec<String> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|s| s.trim().to_ascii_lowercase())
        .filter(|s| !s.is_empty())
        .collect();
    for n in named {
        h.remove(n.as_str());
    }
    for n in [
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "proxy-authorization",
        "proxy-authenticate",
    ] {
        h.remove(n);
    }
}

/// The node for a new sandbox: of the live, schedulable nodes with room and the tier asked
/// for, `k` drawn at random, the best: one that holds the template, then the least loaded
/// (sandboxes over its maximum), then the most free memory. `placed`: the catalog's count per
/// node (fresher than a node's own record, which it renews every few seconds).
pub fn place(
    nodes: &[NodeRecord],
    placed: &HashMap<String, u64>,
    tier: Option<&str>,
    template: &str,
    k: usize,
) -> Option<NodeRecord> {
    use rand::seq::SliceRandom as _;
    let load = |n: &NodeRecord| {
        n.capacity
            .sandboxes
            .max(placed.get(&n.name).copied().unwrap_or(0))
    };
    let fit: Vec<&NodeRecord> = nodes
        .iter()
        .filter(|n| n.schedulable)
        .filter(|n| tier.is_none_or(|t| n.tiers.iter().any(|x| x == t)))
        .filter(|n| n.capacity.max_sandboxes == 0 || load(n) < n.capacity.max_sandboxes)
        .collect();
    let key = |n: &NodeRecord| {
        let holds = n.templates.iter().any(|t| t == template);
        let used = load(n) as f64 / n.capacity.max_sandboxes.max(1) as f64;
        let memory =
            n.capacity.memory_available_bytes as f64 / n.capacity.memory_total_bytes.max(1) as f64;
        (holds, -used, memory)
    };
    fit.choose_multiple(&mut rand::thread_rng(), k.max(1))
        .max_by(|a, b| {
            let (ha, ua, ma) = key(a);
            let (hb, ub, mb) = key(b);
            ha.cmp(&hb).then(ua.total_cmp(&ub)).then(ma.total_cmp(&mb))
        })
        .map(|n| (*n).clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Capacity;

    fn node(name: &str, sandboxes: u64, tiers: &[&str]) -> NodeRecord {
        NodeRecord {
            name: name.into(),
            url: format!("http://{name}"),
            tiers: tiers.iter().map(|s| (*s).to_owned()).collect(),
            capacity: Capacity {
                memory_available_bytes: 8 << 30,
                memory_total_bytes: 16 << 30,
                cpus: 2,
                disk_free_bytes: 1 << 40,
                sandboxes,
                max_sandboxes: 10,
            },
            templates: vec!["base".into()],
            audit_key: None,
            schedulable: true,
            version: "t".into(),
            started_ms: 0,
            updated_ms: 0,
        }
    }

    #[test]
    fn placement_spreads_and_honours_tier_and_room() {
        let nodes = vec![
            node("a", 0, &["namespace"]),
            node("b", 0, &["namespace", "gvisor"]),
            node("c", 0, &["namespace"]),
        ];
        let mut placed = HashMap::new();
        for _ in 0..9 {
            let n = place(&nodes, &placed, None, "base", 3).unwrap();
            *placed.entry(n.name).or_insert(0) += 1;
        }
        assert_eq!(
            placed.values().copied().collect::<Vec<_>>(),
            vec![3, 3, 3],
            "{placed:?}"
        );
        for _ in 0..5 {
            assert_eq!(
                place(&nodes, &placed, Some("gvisor"), "base", 3)
                    .unwrap()
                    .name,
                "b"
            );
        }
        let full = vec![node("a", 10, &["namespace"])];
        assert!(place(&full, &HashMap::new(), None, "base", 3).is_none());
        let mut draining = node("d", 0, &["namespace"]);
        draining.schedulable = false;
        assert!(place(&[draining], &HashMap::new(), None, "base", 3).is_none());
    }
}
