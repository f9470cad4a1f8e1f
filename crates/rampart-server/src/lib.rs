//! Rampart's HTTP API: the native `/v1` REST API, `/health`, `/metrics` and the OpenAPI
//! document at `/v1/openapi.json`.
//!
//! The server is thin: it parses and validates requests, calls the [`Manager`] (through the
//! [`Backend`] trait, so the HTTP layer is testable without sandboxes) and translates the
//! answers. Every failure is a JSON `{"error": {"code", "message"}}` with the right status.

mod error;
mod exec;
mod extract;
mod files;
mod metrics;
mod openapi;
mod sandboxes;

pub use error::ApiError;
pub use exec::{collect_output, OutputCollector};
pub use openapi::openapi;

use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::future::BoxFuture;
use rampart_agent::client::AgentClient;
use rampart_core::{CoreError, Exec, Manager};
use rampart_types::{CreateSandbox, ExecRequest, Health, SandboxId, SandboxInfo, SandboxState};
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::trace::TraceLayer;

/// Limit on JSON request bodies (1 MiB).
pub const JSON_BODY_LIMIT: usize = 1 << 20;
/// Limit on the body of an exec request, which may carry stdin (16 MiB). File uploads have
/// no limit but the sandbox's disk.
pub const EXEC_BODY_LIMIT: usize = 16 << 20;

/// What the HTTP layer needs from the sandbox manager. [`Manager`] implements it; tests use a
/// stand-in.
pub trait Backend: Send + Sync + 'static {
    /// See [`Manager::create`].
    fn create(&self, req: CreateSandbox) -> BoxFuture<'_, Result<SandboxInfo, CoreError>>;
    /// See [`Manager::get`].
    fn get(&self, id: &SandboxId) -> Result<SandboxInfo, CoreError>;
    /// See [`Manager::list`].
    fn list(
        &self,
        state: Option<SandboxState>,
        metadata: &BTreeMap<String, String>,
    ) -> Result<Vec<SandboxInfo>, CoreError>;
    /// See [`Manager::destroy`].
    fn destroy<'a>(&'a self, id: &'a SandboxId) -> BoxFuture<'a, Result<SandboxInfo, CoreError>>;
    /// See [`Manager::set_timeout`].
    fn set_timeout<'a>(
        &'a self,
        id: &'a SandboxId,
        secs: u64,
    ) -> BoxFuture<'a, Result<SandboxInfo, CoreError>>;
    /// See [`Manager::agent`].
    fn agent(&self, id: &SandboxId) -> Result<AgentClient, CoreError>;
    /// See [`Manager::exec`].
    fn exec<'a>(
        &'a self,
        id: &'a SandboxId,
        req: ExecRequest,
        keep_stdin_open: bool,
    ) -> BoxFuture<'a, Result<Exec, CoreError>>;
    /// See [`Manager::metrics_text`].
    fn metrics_text(&self) -> String;
}

impl Backend for Manager {
    fn create(&self, req: CreateSandbox) -> BoxFuture<'_, Result<SandboxInfo, CoreError>> {
        Box::pin(Manager::create(self, req))
    }
    fn get(&self, id: &SandboxId) -> Result<SandboxInfo, CoreError> {
        Manager::get(self, id)
    }
    fn list(
        &self,
        state: Option<SandboxState>,
        metadata: &BTreeMap<String, String>,
    ) -> Result<Vec<SandboxInfo>, CoreError> {
        Manager::list(self, state, metadata)
    }
    fn destroy<'a>(&'a self, id: &'a SandboxId) -> BoxFuture<'a, Result<SandboxInfo, CoreError>> {
        Box::pin(Manager::destroy(self, id))
    }
    fn set_timeout<'a>(
        &'a self,
        id: &'a SandboxId,
        secs: u64,
    ) -> BoxFuture<'a, Result<SandboxInfo, CoreError>> {
        Box::pin(Manager::set_timeout(self, id, secs))
    }
    fn agent(&self, id: &SandboxId) -> Result<AgentClient, CoreError> {
        Manager::agent(self, id)
    }
    fn exec<'a>(
        &'a self,
        id: &'a SandboxId,
        req: ExecRequest,
        keep_stdin_open: bool,
    ) -> BoxFuture<'a, Result<Exec, CoreError>> {
        Box::pin(Manager::exec(self, id, req, keep_stdin_open))
    }
    fn metrics_text(&self) -> String {
        Manager::metrics_text(self)
    }
}

/// Shared state of the handlers.
#[derive(Clone)]
pub(crate) struct AppState {
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) http_metrics: Arc<metrics::HttpMetrics>,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState").finish_non_exhaustive()
    }
}

/// The daemon's router over a running [`Manager`].
pub fn router(manager: Arc<Manager>) -> Router {
    router_with_backend(manager)
}

/// The router over any [`Backend`] (tests use a stand-in without sandboxes).
pub fn router_with_backend(backend: Arc<dyn Backend>) -> Router {
    let state = AppState {
        backend,
        http_metrics: Arc::new(metrics::HttpMetrics::new()),
    };
    let v1 = Router::new()
        .route("/sandboxes", post(sandboxes::create).get(sandboxes::list))
        .route(
            "/sandboxes/{id}",
            get(sandboxes::get_one).delete(sandboxes::destroy),
        )
        .route("/sandboxes/{id}/timeout", post(sandboxes::set_timeout))
        .route("/sandboxes/{id}/exec", post(exec::exec))
        .route("/sandboxes/{id}/exec/ws", get(exec::exec_ws))
        .route(
            "/sandboxes/{id}/files",
            get(files::read).put(files::write).delete(files::remove),
        )
        .route("/sandboxes/{id}/files/stat", get(files::stat))
        .route("/sandboxes/{id}/files/list", get(files::list))
        .route("/sandboxes/{id}/files/mkdir", post(files::mkdir))
        .route("/sandboxes/{id}/files/move", post(files::rename))
        .route("/sandboxes/{id}/files/watch", get(files::watch))
        .route("/openapi.json", get(openapi::serve_openapi));

    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics::serve_metrics))
        .nest("/v1", v1)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
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
    axum::serve(listener, router(manager))
        .with_graceful_shutdown(shutdown)
        .await
}

/// Serves the API on `listener` until the process ends.
pub async fn serve(
    listener: tokio::net::TcpListener,
    manager: Arc<Manager>,
) -> std::io::Result<()> {
    axum::serve(listener, router(manager)).await
}

/// The daemon's version, as `/health` reports it.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// `GET /health`: the daemon answers.
#[utoipa::path(get, path = "/health", tag = "daemon",
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
