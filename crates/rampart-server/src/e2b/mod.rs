//! The E2B-compatible API: the control plane (`/sandboxes`, `/v2/sandboxes`, ...) and the
//! envd proxy, served on the daemon's own port next to `/v1`.
//!
//! The unmodified E2B SDKs reach it with three variables: `E2B_API_URL` and
//! `E2B_SANDBOX_URL` both set to the daemon's address, and `E2B_API_KEY` set to a key of the
//! key store (`rampart keys create`). Control-plane requests carry `X-API-KEY`; envd
//! requests carry `E2b-Sandbox-Id` / `E2b-Sandbox-Port` (or a `{port}-{id}.<domain>` host)
//! and `X-Access-Token`, and are streamed to the sandbox's agent, which speaks envd's protocol.
//! `docs/e2b.md` lists what is supported.

mod api;
mod envd;
mod events;
mod idempotency;
mod metrics;
mod network;
pub(crate) mod options;
mod persist;
mod secrets;
mod templates;
mod volumes;
mod wire;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use rampart_core::Manager;
use rampart_store::keys::{KeyInfo, KeyStore};
use std::sync::Arc;

/// The envd version the control plane reports. The SDK gates features on it; 0.6.4 is the
/// last threshold of `e2b` 2.63 (network-mount watches), so every gated feature is on.
pub(crate) const ENVD_VERSION: &str = "0.6.4";

/// The file in the data directory holding the key made at first start.
pub const API_KEY_FILE: &str = "api-key";

/// State of the E2B handlers.
#[derive(Clone)]
pub(crate) struct E2b {
    pub(crate) manager: Arc<Manager>,
    /// The API keys (a sandbox's E2B facts are core's: [`Manager::access`]).
    pub(crate) keys: Arc<KeyStore>,
    /// Every sandbox's token, stripped from what the envd proxy forwards.
    pub(crate) creds: crate::ports::Credentials,
    /// Tenants: the create rate and the change log.
    pub(crate) tenancy: Option<Arc<crate::tenancy::Tenancy>>,
    /// The outcomes of creates with an `Idempotency-Key`.
    pub(crate) idempotency: Arc<idempotency::Idempotency>,
    /// The samples of every live sandbox's resource use.
    pub(crate) metrics: metrics::Shared,
    /// The domain of host-name routing (`{port}-{id}.<domain>`), told to the SDKs as the
    /// sandbox's `domain` (their `get_host(port)` and envd URL).
    pub(crate) domain: String,
    /// `allowPublicTraffic` of a create that does not say (the operator's default).
    pub(crate) public_traffic: bool,
    /// `idle_pause_secs` of every sandbox the E2B API makes (none: they never sleep).
    pub(crate) idle_pause_secs: Option<u64>,
    /// The TCP listener serves HTTPS: links the daemon hands out are `https://`.
    pub(crate) tls: bool,
    /// The fleet's token when this node serves a fleet: the E2B API then answers only the
    /// fleet's gateways, for the E2B key they checked.
    pub(crate) fleet_token: Option<String>,
}

impl std::fmt::Debug for E2b {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("E2b").finish_non_exhaustive()
    }
}

/// An error of the control plane: `{"code": <status>, "message"}` (what the SDK parses).
#[derive(Debug)]
pub(crate) struct E2bError {
    status: StatusCode,
    message: String,
    /// E2B's machine-readable `error_code`, where it has one.
    error_code: Option<&'static str>,
}

impl E2bError {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> Self {
        E2bError {
            status,
            message: message.into(),
            error_code: None,
        }
    }
    /// With E2B's `error_code`.
    pub(crate) fn with_code(mut self, code: &'static str) -> Self {
        self.error_code = Some(code);
        self
    }
    #[cfg(test)]
    pub(crate) fn status(&self) -> StatusCode {
        self.status
    }
    pub(crate) fn not_found(id: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            format!("sandbox \"{id}\" doesn't exist or you don't have access to it"),
        )
    }
    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }
    pub(crate) fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }
}

impl From<rampart_core::CoreError> for E2bError {
    fn from(e: rampart_core::CoreError) -> Self {
        use rampart_core::CoreError as C;
        let status = match &e {
            C::NotFound(_) | C::NoProcess { .. } => StatusCode::NOT_FOUND,
            C::TooManyProcesses { .. } | C::Conflict(_) => StatusCode::CONFLICT,
            C::Denied { .. } | C::Forbidden(_) => StatusCode::FORBIDDEN,
            C::NoApproval(_) | C::NoWebhook(_) | C::NoTemplate(_) => StatusCode::NOT_FOUND,
            C::BadRequest { .. } | C::Limit(_) => StatusCode::BAD_REQUEST,
            C::WrongState { .. } => StatusCode::CONFLICT,
            C::Capacity(_) => StatusCode::TOO_MANY_REQUESTS,
            C::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            C::Agent(_) | C::Desktop(_) => StatusCode::BAD_GATEWAY,
            C::Unsupported(_) => StatusCode::SERVICE_UNAVAILABLE,
            // E2B answers a passed concurrency limit with 429.
            C::Store(rampart_store::StoreError::Quota(_)) => StatusCode::TOO_MANY_REQUESTS,
            C::Store(rampart_store::StoreError::NoTenant(_)) => StatusCode::FORBIDDEN,
            C::Store(_)
            | C::Isolation { .. }
            | C::Io { .. }
            | C::Task { .. }
            | C::Failed { .. }
            | C::Journal(_)
            | C::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        E2bError::new(status, e.to_string())
    }
}

impl From<rampart_store::StoreError> for E2bError {
    fn from(e: rampart_store::StoreError) -> Self {
        E2bError::internal(format!("key store: {e}"))
    }
}

impl E2bError {
    /// The body E2B answers: `{"code", "message"[, "error_code"]}`.
    pub(crate) fn body(&self) -> serde_json::Value {
        let mut body = serde_json::json!({"code": self.status.as_u16(), "message": self.message});
        if let Some(c) = self.error_code {
            body["error_code"] = serde_json::json!(c);
        }
        body
    }
}

impl IntoResponse for E2bError {
    fn into_response(self) -> Response {
        let body = self.body();
        let mut r = (self.status, axum::Json(body)).into_response();
        // The SDK retries 429/502/503/504 unless told not to; these answers will not change.
        r.headers_mut()
            .insert("should-retry", HeaderValue::from_static("false"));
        r
    }
}

/// Opens the key store in the daemon's `state.db`; at first start (no key yet) makes one key,
/// writes it to `<data>/api-key` (mode 0600) and logs where it is.
fn open_keys(data_dir: &std::path::Path) -> Result<KeyStore, String> {
    let keys = KeyStore::open(&data_dir.join("state.db")).map_err(|e| e.to_string())?;
    if keys.count_keys().map_err(|e| e.to_string())? == 0 {
        let (_, key) = keys.create_key("default").map_err(|e| e.to_string())?;
        let path = data_dir.join(API_KEY_FILE);
        write_secret(&path, &format!("{key}\n"))
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
        tracing::info!(
            path = %path.display(),
            "made the first E2B API key; it is in {} (set E2B_API_KEY to it)",
            path.display()
        );
    }
    Ok(keys)
}

/// Writes `text` to a new file of mode 0600 (replacing any old one).
pub(crate) fn write_secret(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// Adds the E2B API to `inner` (the daemon's router). If the key store cannot be opened the
/// E2B paths answer 503 saying why, and `/v1` is unaffected.
pub(crate) fn attach(
    inner: Router,
    manager: Arc<Manager>,
    tenancy: Option<Arc<crate::tenancy::Tenancy>>,
    opts: &crate::ServerOptions,
) -> Router {
    let keys = match open_keys(manager.data_dir()) {
        Ok(k) => Arc::new(k),
        Err(e) => {
            tracing::error!("the E2B API is off: cannot open its key store: {e}");
            let msg = format!("the E2B API is unavailable: {e}");
            let off = move || {
                let msg = msg.clone();
                async move { E2bError::new(StatusCode::SERVICE_UNAVAILABLE, msg) }
            };
            return inner
                .route("/sandboxes", axum::routing::any(off.clone()))
                .route("/v2/sandboxes", axum::routing::any(off));
        }
    };
    // Every sandbox's tokens: a request through the envd proxy may carry one.
    let creds = crate::ports::Credentials {
        access: Some(manager.access()),
    };
    let st = E2b {
        manager,
        keys,
        creds,
        tenancy,
        idempotency: Default::default(),
        metrics: Default::default(),
        domain: opts.domain.clone(),
        public_traffic: opts.e2b_public_traffic,
        idle_pause_secs: opts.e2b_idle_pause_secs,
        tls: opts.tls.is_some(),
        fleet_token: opts.fleet_token.clone(),
    };
    metrics::start(st.clone());
    let api = Router::new()
        .route("/sandboxes", post(api::create).get(api::list_v1))
        .route("/v2/sandboxes", post(api::create).get(api::list))
        .route("/sandboxes/{id}", get(api::get_one).delete(api::kill))
        .route("/sandboxes/{id}/timeout", post(api::set_timeout))
        .route("/sandboxes/{id}/connect", post(api::connect))
        .route("/v2/sandboxes/{id}/connect", post(api::connect))
        .route("/sandboxes/{id}/resume", post(api::resume))
        .route("/sandboxes/{id}/pause", post(api::pause))
        .route("/sandboxes/{id}/metrics", get(api::metrics))
        .route(
            "/sandboxes/{id}/network",
            axum::routing::put(api::update_network),
        )
        // Snapshots and fork (persist.rs), on core's implementation.
        .route("/sandboxes/{id}/snapshots", post(persist::create_snapshot))
        .route("/sandboxes/{id}/fork", post(persist::fork))
        .route(
            "/sandboxes/{id}/{*rest}",
            axum::routing::any(api::unsupported),
        )
        .route(
            "/v2/sandboxes/{id}/{*rest}",
            axum::routing::any(api::unsupported),
        )
        .route(
            "/snapshots",
            get(persist::list_snapshots).fallback(api::unsupported),
        )
        // Templates built from the SDK (`Template().build()`, tags, `Template.exists`).
        .route("/v3/templates", post(templates::request_build))
        .route(
            "/v2/templates/{id}/builds/{bid}",
            post(templates::start_build).delete(templates::cancel_build),
        )
        .route(
            "/templates/{id}/builds/{bid}/status",
            get(templates::build_status),
        )
        .route(
            "/templates/{id}/builds/{bid}/logs",
            get(templates::build_logs),
        )
        .route(
            "/templates/{id}/files/{hash}",
            get(templates::file_upload_link),
        )
        .route("/templates/aliases/{alias}", get(templates::alias))
        .route(
            "/templates/tags",
            post(templates::assign_tags).delete(templates::delete_tags),
        )
        .route("/templates/{id}/tags", get(templates::tags))
        .route("/templates/{id}/tags/count", get(templates::tags_count))
        .route("/templates/{id}/tags/exists", get(templates::tag_exists))
        .route(
            "/templates",
            get(templates::list).fallback(api::unsupported),
        )
        .route("/v2/templates", get(templates::list))
        .route(
            "/templates/{id}",
            get(templates::get_one)
                .delete(persist::delete_template_or_snapshot)
                .fallback(api::unsupported),
        )
        // Lifecycle events and webhooks (REST only).
        .route("/events/sandboxes", get(events::list))
        .route("/events/sandboxes/{id}", get(events::list_one))
        .route(
            "/events/webhooks",
            post(events::create).get(events::list_webhooks),
        )
        .route(
            "/events/webhooks/{id}",
            get(events::get_webhook)
                .patch(events::update_webhook)
                .delete(events::delete_webhook),
        )
        // Volumes (`Volume.create`, `list`, `get_info`, `destroy`) on the native ones.
        .route("/volumes", post(volumes::create).get(volumes::list))
        .route(
            "/volumes/{id}",
            get(volumes::get_one).delete(volumes::delete),
        )
        // Secrets (`Secret.create`, `list`, `get_info`, `update`, `destroy`) in the native
        // secret store; sandboxes use them through `network.rules` placeholders.
        .route("/secrets", post(secrets::create).get(secrets::list))
        .route(
            "/secrets/{id}",
            get(secrets::get_one)
                .post(secrets::update)
                .delete(secrets::delete),
        )
        .route_layer(axum::middleware::from_fn_with_state(st.clone(), api_key))
        // The volume file API: the volume's token is the authorization.
        .route(
            "/volumecontent/{id}/path",
            get(volumes::stat)
                .patch(volumes::update_meta)
                .delete(volumes::remove),
        )
        .route(
            "/volumecontent/{id}/dir",
            get(volumes::list_dir).post(volumes::make_dir),
        )
        .route(
            "/volumecontent/{id}/file",
            get(volumes::read_file).put(volumes::write_file),
        )
        // Signed download/upload URLs opened without the routing headers.
        .route("/files", get(envd::signed_files).post(envd::signed_files))
        // Template file uploads: the link's token is the authorization (as a presigned URL).
        .route(
            "/e2b/uploads/{token}",
            axum::routing::put(templates::upload),
        )
        .with_state(st.clone());
    inner
        .merge(api)
        .layer(axum::middleware::from_fn_with_state(st, envd::dispatch))
}

/// On a node of a fleet: the E2B key a gateway checked (`Authorization: Bearer <the fleet's
/// token>` and the principal's header), as the E2B API's key; its tenant's copy made first.
fn via_gateway(st: &E2b, token: &str, req: &Request) -> Result<KeyInfo, E2bError> {
    let refuse = |m: String| E2bError::new(StatusCode::UNAUTHORIZED, m);
    let presented = req
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().strip_prefix("Bearer "))
        .map(str::trim)
        .unwrap_or_default();
    let who = crate::auth::from_gateway(token, presented, req).map_err(|e| refuse(e.message))?;
    if !who.e2b {
        return Err(refuse(format!(
            "key {} is a native API key, not an E2B one",
            who.key.id
        )));
    }
    if let (Some(t), Some(q), Some(tenancy)) = (&who.key.tenant, &who.quotas, &st.tenancy) {
        tenancy
            .mirror(t, q)
            .map_err(|e| E2bError::internal(format!("tenant {t}'s copy on this node: {e}")))?;
    }
    Ok(KeyInfo {
        id: who.key.id,
        name: format!("{} via gateway {}", who.key.name, who.gateway),
        hint: who.key.hint,
        created_at_ms: who.key.created_at_ms,
        last_used_at_ms: None,
        tenant: who.key.tenant,
    })
}

/// Checks `X-API-KEY` against the key store (on a node of a fleet: the gateway's word).
async fn api_key(State(st): State<E2b>, req: Request, next: Next) -> Response {
    if let Some(token) = st.fleet_token.clone() {
        let info = match via_gateway(&st, &token, &req) {
            Ok(i) => i,
            Err(e) => return e.into_response(),
        };
        return serve_as_key(&st, info, req, next).await;
    }
    let key = req
        .headers()
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .trim()
        .to_owned();
    if key.is_empty() {
        return E2bError::new(
            StatusCode::UNAUTHORIZED,
            "missing API key: set E2B_API_KEY (see `rampart keys create`)",
        )
        .into_response();
    }
    let keys = st.keys.clone();
    // The key's id and name (never the key) name the caller in the audit record.
    let found = tokio::task::spawn_blocking(move || keys.lookup(&key)).await;
    let info = match found {
        Ok(Ok(Some(info))) => info,
        Ok(Ok(None)) => {
            return E2bError::new(
                StatusCode::UNAUTHORIZED,
                "invalid API key: use a key from `rampart keys create`",
            )
            .into_response()
        }
        Ok(Err(e)) => return E2bError::from(e).into_response(),
        Err(e) => return E2bError::internal(format!("checking the API key: {e}")).into_response(),
    };
    serve_as_key(&st, info, req, next).await
}

/// Serves an E2B request on behalf of the key `info`: its tenant's create rate, the record's
/// caller, the change log.
async fn serve_as_key(st: &E2b, info: KeyInfo, mut req: Request, next: Next) -> Response {
    let peer = crate::caller::peer(&req);
    let p = rampart_core::Principal {
        caller: format!(
            "e2b-key:{}:{}{}{}",
            info.id,
            info.name,
            info.tenant
                .as_ref()
                .map(|t| format!(" tenant {t}"))
                .unwrap_or_default(),
            crate::caller::from(peer)
        ),
        tenant: info.tenant.clone(),
        key_id: Some(info.id.clone()),
    };
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let mut rate = None;
    if let (Some(t), Some(tenancy)) = (&p.tenant, &st.tenancy) {
        if crate::tenancy::is_create(&method, &path) {
            match tenancy.take_create(t) {
                Ok(r) => rate = r,
                Err(refused) => {
                    let mut r = E2bError::new(StatusCode::TOO_MANY_REQUESTS, refused.message())
                        .into_response();
                    refused.headers(r.headers_mut());
                    if let Some(t) = &st.tenancy {
                        t.log_call(&p, &method, &path, r.status());
                    }
                    return r;
                }
            }
        }
    }
    crate::caller::set(&mut req, p.clone());
    let mut resp = next.run(req).await;
    if let Some(r) = rate {
        r.write(resp.headers_mut());
    }
    if let Some(t) = &st.tenancy {
        t.log_call(&p, &method, &path, resp.status());
    }
    resp
}
