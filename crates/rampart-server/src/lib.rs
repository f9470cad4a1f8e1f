//! Rampart's HTTP API: the native `/v1` REST API, `/health`, `/metrics` and the OpenAPI
//! document at `/v1/openapi.json`.
//!
//! The server is thin: it parses and validates requests, calls the [`Manager`] (through the
//! [`Backend`] trait, so the HTTP layer is testable without sandboxes) and translates the
//! answers. Every failure is a JSON `{"error": {"code", "message"}}` with the right status.

mod approvals;
mod artifacts;
mod audit;
mod auth;
mod caller;
mod console;
mod desktop;
mod e2b;
mod error;
mod exec;
mod extract;
mod files;
mod mcp;
mod metrics;
mod ndjson;
mod network;
mod openapi;
mod persist;
mod ports;
mod processes;
mod proxy;
mod sandboxes;
mod secrets;
mod templates;
mod tenancy;
mod tls;

pub use audit::{AuditKey, AuditPage};
pub use auth::{
    required_scope, socket_group, UnixPeer, ADMIN_KEY_FILE, KEY_PROTOCOL_PREFIX, SOCKET_FILE,
    SOCKET_GROUP,
};
pub use error::ApiError;
pub use exec::{collect_output, OutputCollector};
pub use openapi::openapi;
pub use ports::{valid_domain, ServerOptions, DEFAULT_DOMAIN, TOKEN_HEADER, TOKEN_PARAM};
pub use tls::{TlsConfig, TlsError};

use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, delete, get, post, put};
use axum::{Json, Router};
use rampart_core::Manager;
use rampart_types::Health;
use std::future::{Future, IntoFuture as _};
use std::sync::Arc;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::trace::TraceLayer;

/// Limit on JSON request bodies (1 MiB).
pub const JSON_BODY_LIMIT: usize = 1 << 20;
/// Limit on the body of an exec request, which may carry stdin (16 MiB). File uploads have
/// no limit but the sandbox's disk.
pub const EXEC_BODY_LIMIT: usize = 16 << 20;

/// Shared state of the handlers.
#[derive(Clone)]
pub(crate) struct AppState {
    pub(crate) manager: Arc<Manager>,
    pub(crate) http_metrics: Arc<metrics::HttpMetrics>,
    pub(crate) ports: Arc<ports::Ports>,
    /// Tenants, the create rate and the change log (none: a backend without a store).
    pub(crate) tenancy: Option<Arc<tenancy::Tenancy>>,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState").finish_non_exhaustive()
    }
}

/// The daemon's router over a running [`Manager`].
pub fn router(manager: Arc<Manager>) -> Router {
    router_with_options(manager, &ServerOptions::default())
}

/// The daemon's router over a running [`Manager`], with `opts`. Port access (tokens, public
/// ports, E2B access tokens) is core's, kept with each sandbox ([`Manager::access`]).
pub fn router_with_options(manager: Arc<Manager>, opts: &ServerOptions) -> Router {
    let ports = ports::Ports::with_access(opts, manager.access());
    let mut state = app_state(manager.clone(), ports);
    let keys = match open_node_keys(manager.data_dir()) {
        Ok(k) => Some(Arc::new(k)),
        Err(e) => {
            tracing::error!("the native API refuses every API key: {e}");
            None
        }
    };
    let tenancy =
        match rampart_store::tenants::TenantStore::open(&manager.data_dir().join("state.db")) {
            Ok(t) => {
                let t = Arc::new(t);
                let store = t.clone();
                manager.set_tenant_approvals(Arc::new(move |name: &str| {
                    store
                        .approvals(name)
                        .map_err(|e| format!("reading tenant {name}'s approval policy: {e}"))
                }));
                Some(tenancy::Tenancy::new(t, Some(manager.clone())))
            }
            Err(e) => {
                tracing::error!("tenants are unavailable: cannot open their store: {e}");
                None
            }
        };
    state.tenancy = tenancy.clone();
    let mut auth = auth::Auth::new(keys, opts.listen, &opts.domain, &opts.allowed_hosts);
    auth.tenancy = tenancy.clone();
    auth.fleet_token = opts.fleet_token.clone();
    let auth = Arc::new(auth);
    let api = v1_router(state.clone(), Some(auth.clone()));
    // The MCP server's tools call this same API in process, with each MCP request's own
    // credentials; `/mcp` itself is behind the same guard.
    let tools = rampart_mcp::http_service(Arc::new(mcp::InProcess {
        router: api.clone(),
    }));
    let mcp_route = Router::new()
        .nest_service("/mcp", tools)
        .layer(axum::middleware::from_fn_with_state(auth, auth::guard));
    let app = e2b::attach(api.merge(mcp_route), manager, tenancy, opts);
    app.layer(axum::middleware::from_fn_with_state(
        state,
        ports::host_route,
    ))
}

fn app_state(manager: Arc<Manager>, ports: ports::Ports) -> AppState {
    AppState {
        manager,
        http_metrics: Arc::new(metrics::HttpMetrics::new()),
        ports: Arc::new(ports),
        tenancy: None,
    }
}

/// Opens the native API's key store in `state.db`; when no current admin key exists (first
/// start, or every admin key was revoked) makes one, writes it to `<data>/admin-key` (mode
/// 0600) and logs where it is.
fn open_node_keys(
    data_dir: &std::path::Path,
) -> Result<rampart_store::node_keys::NodeKeyStore, String> {
    use rampart_store::node_keys::{NewKey, NodeKeyStore, SCOPE_ADMIN};
    let keys = NodeKeyStore::open(&data_dir.join("state.db")).map_err(|e| e.to_string())?;
    if !keys.has_active_admin().map_err(|e| e.to_string())? {
        let (info, key) = keys
            .create(&NewKey {
                name: "admin".into(),
                scopes: vec![SCOPE_ADMIN.into()],
                expires_at_ms: None,
                tenant: None,
            })
            .map_err(|e| e.to_string())?;
        let path = data_dir.join(ADMIN_KEY_FILE);
        e2b::write_secret(&path, &format!("{key}\n"))
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
        tracing::info!(
            path = %path.display(),
            id = %info.id,
            "made the admin API key of the native API; it is in {} (send it as \
             `Authorization: Bearer`, or set RAMPART_API_KEY for the CLI over TCP)",
            path.display()
        );
    }
    Ok(keys)
}

fn v1_router(state: AppState, auth: Option<Arc<auth::Auth>>) -> Router {
    let v1 = Router::new()
        .route("/sandboxes", post(sandboxes::create).get(sandboxes::list))
        .route(
            "/sandboxes/{id}",
            get(sandboxes::get_one).delete(sandboxes::destroy),
        )
        .route("/sandboxes/{id}/stats", get(sandboxes::stats))
        .route("/sandboxes/{id}/timeout", post(sandboxes::set_timeout))
        .route("/sandboxes/{id}/pause", post(sandboxes::pause))
        .route("/sandboxes/{id}/resume", post(sandboxes::resume))
        .route("/sandboxes/{id}/snapshots", post(persist::snapshot))
        .route("/sandboxes/{id}/fork", post(persist::fork))
        .route("/snapshots", get(persist::list_snapshots))
        .route(
            "/snapshots/{name}",
            get(persist::get_snapshot).delete(persist::delete_snapshot),
        )
        .route(
            "/volumes",
            post(persist::create_volume).get(persist::list_volumes),
        )
        .route("/volumes/{name}", delete(persist::delete_volume))
        .route("/sandboxes/{id}/exec", post(exec::exec))
        .route("/sandboxes/{id}/exec/ws", get(exec::exec_ws))
        .route(
            "/sandboxes/{id}/processes",
            post(processes::start).get(processes::list),
        )
        .route(
            "/sandboxes/{id}/processes/{pid}",
            get(processes::get_one).delete(processes::kill),
        )
        .route(
            "/sandboxes/{id}/processes/{pid}/events",
            get(processes::events),
        )
        .route(
            "/sandboxes/{id}/processes/{pid}/input",
            post(processes::input),
        )
        .route(
            "/sandboxes/{id}/files",
            get(files::read).put(files::write).delete(files::remove),
        )
        .route("/sandboxes/{id}/files/stat", get(files::stat))
        .route("/sandboxes/{id}/files/list", get(files::list))
        .route("/sandboxes/{id}/files/mkdir", post(files::mkdir))
        .route("/sandboxes/{id}/files/move", post(files::rename))
        .route("/sandboxes/{id}/files/watch", get(files::watch))
        .route(
            "/sandboxes/{id}/network",
            get(network::get).put(network::put),
        )
        .route("/sandboxes/{id}/network/log", get(network::log))
        .route("/sandboxes/{id}/artifacts", get(artifacts::get))
        .route("/sandboxes/{id}/audit", get(audit::events))
        .route("/sandboxes/{id}/audit/bundle", get(audit::bundle))
        .route("/sandboxes/{id}/audit/dsse", get(audit::dsse))
        .route("/sandboxes/{id}/packages", get(audit::packages))
        .route(
            "/sandboxes/{id}/desktop/screenshot",
            post(desktop::screenshot),
        )
        .route("/sandboxes/{id}/desktop/actions", post(desktop::action))
        .route("/sandboxes/{id}/browser", post(desktop::browser))
        .route("/sandboxes/{id}/ports", get(ports::list))
        .route("/sandboxes/{id}/ports/{port}", any(ports::proxy))
        .route("/sandboxes/{id}/ports/{port}/", any(ports::proxy))
        .route("/sandboxes/{id}/ports/{port}/{*rest}", any(ports::proxy))
        .route(
            "/sandboxes/{id}/ports/{port}/public",
            post(ports::make_public)
                .delete(ports::make_private)
                .fallback(ports::proxy),
        )
        .route("/approvals", get(approvals::list))
        .route("/approvals/{id}", get(approvals::get_one))
        .route("/approvals/{id}/approve", post(approvals::approve))
        .route("/approvals/{id}/deny", post(approvals::deny))
        .route("/secrets", post(secrets::set).get(secrets::list))
        .route("/secrets/{name}", delete(secrets::delete))
        .route("/audit/key", get(audit::key))
        .route("/audit/checkpoint", get(audit::checkpoint))
        .route("/templates", get(templates::list))
        .route("/templates/{name}", get(templates::get_one))
        .route("/tenants", post(tenancy::create).get(tenancy::list))
        .route(
            "/tenants/{name}",
            get(tenancy::get_one).delete(tenancy::delete),
        )
        .route("/tenants/{name}/quotas", put(tenancy::set_quotas))
        .route(
            "/tenants/{name}/approvals",
            put(tenancy::set_approvals).delete(tenancy::clear_approvals),
        )
        .route("/usage", get(tenancy::usage))
        .route("/pools", get(sandboxes::pools))
        .route("/changes", get(tenancy::changes))
        .route("/openapi.json", get(openapi::serve_openapi))
        .route("/whoami", get(auth::whoami))
        .layer(axum::middleware::from_fn(ports::refuse_browser_writes));
    let mut metrics_route = Router::new().route("/metrics", get(metrics::serve_metrics));
    let v1 = match auth {
        Some(a) => {
            metrics_route = metrics_route
                .route_layer(axum::middleware::from_fn_with_state(a.clone(), auth::guard));
            v1.layer(axum::middleware::from_fn_with_state(a, auth::guard))
        }
        None => v1,
    };

    Router::new()
        .route("/health", get(health))
        .merge(console::routes())
        .merge(metrics_route)
        .nest("/v1", v1)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn(caller::scope))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            metrics::track,
        ))
        .layer(TraceLayer::new_for_http())
        .layer(CatchPanicLayer::custom(panic_response))
        .with_state(state)
}

/// Serves `router` on `listener` until `shutdown` resolves, then stops accepting and waits
/// for the open connections to finish (callers bound that wait).
pub async fn serve_with_shutdown(
    listener: tokio::net::TcpListener,
    manager: Arc<Manager>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with_options(listener, manager, ServerOptions::default(), shutdown).await
}

/// [`serve_with_shutdown`] with `opts`.
pub async fn serve_with_options(
    listener: tokio::net::TcpListener,
    manager: Arc<Manager>,
    opts: ServerOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_all(listener, None, manager, opts, shutdown).await
}

/// Serves the same router on `listener` (TCP: API keys) and on `unix` (the Unix socket:
/// `SO_PEERCRED`) until `shutdown` resolves, then stops accepting on both and waits for
/// their open connections to finish (callers bound that wait).
pub async fn serve_all(
    listener: tokio::net::TcpListener,
    unix: Option<tokio::net::UnixListener>,
    manager: Arc<Manager>,
    opts: ServerOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let mut opts = opts;
    if opts.listen.is_none() {
        opts.listen = listener.local_addr().ok();
    }
    let app = router_with_options(manager, &opts);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    use axum::serve::ListenerExt as _;
    // With the peer address of each connection (the audit record's caller): HTTPS with the
    // operator's certificate when one is given, else plain HTTP.
    let tcp: std::pin::Pin<Box<dyn Future<Output = std::io::Result<()>> + Send>> = match &opts.tls {
        Some(tls) => Box::pin(
            axum::serve(
                tls::TlsListener::new(listener, tls, set_nodelay).tap_io(|_| {}),
                app.clone()
                    .into_make_service_with_connect_info::<std::net::SocketAddr>(),
            )
            .with_graceful_shutdown(stopped(stop_rx.clone()))
            .into_future(),
        ),
        None => Box::pin(
            axum::serve(
                nodelay(listener),
                app.clone()
                    .into_make_service_with_connect_info::<std::net::SocketAddr>(),
            )
            .with_graceful_shutdown(stopped(stop_rx.clone()))
            .into_future(),
        ),
    };
    let Some(unix) = unix else {
        return tcp.await;
    };
    // With the credentials of each peer (who may use the socket).
    let sock = axum::serve(unix, app.into_make_service_with_connect_info::<UnixPeer>())
        .with_graceful_shutdown(stopped(stop_rx));
    let (a, b) = tokio::join!(tcp, sock.into_future());
    a.and(b)
}

/// Binds the daemon's Unix socket at `path` (a stale socket left there by a daemon that
/// died is replaced; any other file is refused), owned by group `group`, mode 0660.
pub fn bind_socket(
    path: &std::path::Path,
    group: u32,
) -> std::io::Result<tokio::net::UnixListener> {
    use std::os::unix::fs::{FileTypeExt as _, PermissionsExt as _};
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path)?,
        Ok(_) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket", path.display()),
            ))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let l = tokio::net::UnixListener::bind(rampart_types::sockpath::SocketPath::new(path)?.path())?;
    if let Err(e) = std::os::unix::fs::chown(path, None, Some(group)) {
        // A daemon that is not root may not give its socket to a group it is not in: the
        // socket keeps the daemon's group, whose members the peer check still refuses
        // (only the daemon's user, root and members of `group` are let in).
        if e.kind() != std::io::ErrorKind::PermissionDenied {
            return Err(e);
        }
        tracing::debug!("cannot give {} to group {group}: {e}", path.display());
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
    Ok(l)
}

/// Serves the API on `listener` until the process ends.
pub async fn serve(
    listener: tokio::net::TcpListener,
    manager: Arc<Manager>,
) -> std::io::Result<()> {
    axum::serve(
        nodelay(listener),
        router(manager).into_make_service_with_connect_info::<std::net::SocketAddr>(),
    )
    .await
}

/// Every accepted connection with `TCP_NODELAY`: streamed answers (exec NDJSON, Connect
/// envelopes, proxied ports) go out in small writes, and with Nagle each waited for the
/// client's delayed ACK, about 40 ms on a kept-alive connection.
fn nodelay(
    listener: tokio::net::TcpListener,
) -> axum::serve::TapIo<tokio::net::TcpListener, fn(&mut tokio::net::TcpStream)> {
    use axum::serve::ListenerExt as _;
    listener.tap_io(set_nodelay as fn(&mut tokio::net::TcpStream))
}

fn set_nodelay(tcp: &mut tokio::net::TcpStream) {
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!(error = %e, "TCP_NODELAY on an accepted connection");
    }
}

/// The daemon's version, as `/health` reports it.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// `GET /health`: the daemon answers.
#[utoipa::path(get, path = "/health", tag = "daemon", security(()),
    responses((status = 200, description = "The daemon serves requests", body = Health)))]
pub(crate) async fn health() -> Json<Health> {
    Json(Health {
        status: "ok".into(),
        version: VERSION.into(),
    })
}

async fn not_found(uri: Uri) -> ApiError {
    ApiError::not_found(format!("no such endpoint: {}", uri.path()))
}

async fn method_not_allowed(uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("method not allowed on {}", uri.path()),
    )
}

fn panic_response(_err: Box<dyn std::any::Any + Send + 'static>) -> Response {
    ApiError::internal("the request handler failed unexpectedly; see the daemon's log")
        .into_response()
}
