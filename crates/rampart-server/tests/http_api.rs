//! The HTTP layer against a stand-in backend: error bodies, statuses, health, metrics, OpenAPI.
//! No sandbox is created; the full stack is tested in rampart-cli's tests.

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use futures::future::BoxFuture;
use http_body_util::BodyExt;
use rampart_agent::client::AgentClient;
use rampart_core::{CoreError, Exec};
use rampart_server::{router_with_backend, Backend};
use rampart_store::access::AccessStore;
use rampart_types::{
    CreateSandbox, ExecRequest, LimitError, Limits, SandboxId, SandboxInfo, SandboxState,
};
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tower::ServiceExt;

/// The filters of the last list call.
type ListCall = (Option<SandboxState>, BTreeMap<String, String>);

/// Knows one sandbox, `known`; `panics` makes the handler panic.
struct Fake {
    last_list: Mutex<Option<ListCall>>,
    /// Tokens and public ports, as core keeps them.
    access: Arc<AccessStore>,
}

impl Default for Fake {
    fn default() -> Self {
        Fake {
            last_list: Mutex::new(None),
            access: Arc::new(AccessStore::open_in_memory().unwrap()),
        }
    }
}

fn info(id: &str, metadata: BTreeMap<String, String>) -> SandboxInfo {
    SandboxInfo {
        id: SandboxId::parse(id).unwrap(),
        template: "base".into(),
        state: SandboxState::Running,
        limits: Limits::default(),
        metadata,
        env_names: vec![],
        created_at: "2026-01-01T00:00:00Z".into(),
        expires_at: "2026-01-01T00:05:00Z".into(),
        ended_at: None,
        reason: None,
        access_token: None,
        tenant: None,
    }
}

impl Fake {
    fn lookup(&self, id: &SandboxId) -> Result<SandboxInfo, CoreError> {
        match id.as_str() {
            "known" => Ok(info("known", BTreeMap::new())),
            "stopped" => Err(CoreError::WrongState {
                id: "stopped".into(),
                state: "destroyed".into(),
            }),
            "panics" => panic!("stand-in panic"),
            other => Err(CoreError::NotFound(other.into())),
        }
    }
}

impl Backend for Fake {
    fn create(&self, req: CreateSandbox) -> BoxFuture<'_, Result<SandboxInfo, CoreError>> {
        Box::pin(async move {
            if req.limits.memory_bytes.is_some_and(|m| m > 1 << 30) {
                return Err(CoreError::Limit(LimitError::AboveMaximum {
                    field: "memory_bytes",
                    value: "x".into(),
                    max: "1073741824".into(),
                }));
            }
            if req.template.as_deref() == Some("full") {
                return Err(CoreError::Capacity("100 sandboxes alive".into()));
            }
            // As core does: the public ports checked, a token recorded with the sandbox.
            let public = rampart_core::validate::check_public_ports(&req.public_ports)?;
            let mut made = info("created", req.metadata);
            made.access_token = Some(self.access.issue("created", &public)?);
            Ok(made)
        })
    }
    fn access(&self) -> Option<Arc<AccessStore>> {
        Some(self.access.clone())
    }
    fn get(&self, id: &SandboxId) -> Result<SandboxInfo, CoreError> {
        self.lookup(id)
    }
    fn list(
        &self,
        state: Option<SandboxState>,
        metadata: &BTreeMap<String, String>,
    ) -> Result<Vec<SandboxInfo>, CoreError> {
        *self.last_list.lock().unwrap() = Some((state, metadata.clone()));
        Ok(vec![info("known", BTreeMap::new())])
    }
    fn destroy<'a>(&'a self, id: &'a SandboxId) -> BoxFuture<'a, Result<SandboxInfo, CoreError>> {
        Box::pin(async move { self.lookup(id) })
    }
    fn set_timeout<'a>(
        &'a self,
        id: &'a SandboxId,
        _secs: u64,
    ) -> BoxFuture<'a, Result<SandboxInfo, CoreError>> {
        Box::pin(async move { self.lookup(id) })
    }
    fn agent(&self, id: &SandboxId) -> Result<AgentClient, CoreError> {
        self.lookup(id)?;
        Err(CoreError::Internal("no agents in this test".into()))
    }
    fn exec<'a>(
        &'a self,
        id: &'a SandboxId,
        req: ExecRequest,
        keep_stdin_open: bool,
    ) -> BoxFuture<'a, Result<Exec, CoreError>> {
        Box::pin(async move {
            // As core does: the request first, then the sandbox.
            rampart_core::validate::check_exec(&req, keep_stdin_open)?;
            self.lookup(id)?;
            Err(CoreError::Internal("no processes in this test".into()))
        })
    }
    fn metrics_text(&self) -> String {
        "# TYPE rampart_sandboxes gauge\nrampart_sandboxes{state=\"running\"} 1\n".into()
    }
}

struct Resp {
    status: StatusCode,
    content_type: String,
    body: Vec<u8>,
}

impl Resp {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
    /// Asserts an error answer: status, code, and returns the message.
    fn error(&self, status: u16, code: &str) -> String {
        assert_eq!(
            self.status.as_u16(),
            status,
            "{}",
            String::from_utf8_lossy(&self.body)
        );
        let v = self.json();
        assert_eq!(v["error"]["code"], code, "{v}");
        v["error"]["message"].as_str().expect("message").to_owned()
    }
}

async fn call(
    app: &axum::Router,
    method: Method,
    uri: &str,
    ct: Option<&str>,
    body: &[u8],
) -> Resp {
    let mut b = Request::builder().method(method).uri(uri);
    if let Some(ct) = ct {
        b = b.header("content-type", ct);
    }
    let resp = app
        .clone()
        .oneshot(b.body(Body::from(body.to_vec())).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let content_type = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let body = resp
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    Resp {
        status,
        content_type,
        body,
    }
}

const JSON: Option<&str> = Some("application/json");

fn app() -> (axum::Router, Arc<Fake>) {
    let fake = Arc::new(Fake::default());
    (router_with_backend(fake.clone()), fake)
}

#[tokio::test]
async fn health_answers_ok_with_version() {
    let (app, _) = app();
    let r = call(&app, Method::GET, "/health", None, b"").await;
    assert_eq!(r.status, StatusCode::OK);
    let v = r.json();
    assert_eq!(v["status"], "ok");
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
}

#[tokio::test]
async fn metrics_include_the_managers_and_http_requests() {
    let (app, _) = app();
    call(&app, Method::GET, "/health", None, b"").await;
    let r = call(&app, Method::GET, "/metrics", None, b"").await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(
        r.content_type.starts_with("text/plain"),
        "{}",
        r.content_type
    );
    let text = String::from_utf8(r.body).unwrap();
    assert!(
        text.contains("rampart_sandboxes{state=\"running\"} 1"),
        "{text}"
    );
    assert!(
        text.contains(
            "rampart_http_requests_total{method=\"GET\",route=\"/health\",status=\"200\"}"
        ),
        "{text}"
    );
}

#[tokio::test]
async fn openapi_lists_every_path() {
    let (app, _) = app();
    let r = call(&app, Method::GET, "/v1/openapi.json", None, b"").await;
    assert_eq!(r.status, StatusCode::OK);
    let v = r.json();
    assert!(v["openapi"].as_str().unwrap().starts_with("3."));
    let paths = v["paths"].as_object().unwrap();
    for p in [
        "/health",
        "/metrics",
        "/v1/sandboxes",
        "/v1/sandboxes/{id}",
        "/v1/sandboxes/{id}/timeout",
        "/v1/sandboxes/{id}/exec",
        "/v1/sandboxes/{id}/exec/ws",
        "/v1/sandboxes/{id}/files",
        "/v1/sandboxes/{id}/files/stat",
        "/v1/sandboxes/{id}/files/list",
        "/v1/sandboxes/{id}/files/mkdir",
        "/v1/sandboxes/{id}/files/move",
        "/v1/sandboxes/{id}/files/watch",
        "/v1/sandboxes/{id}/snapshots",
        "/v1/sandboxes/{id}/fork",
        "/v1/snapshots",
        "/v1/snapshots/{name}",
        "/v1/volumes",
        "/v1/volumes/{name}",
        "/v1/sandboxes/{id}/packages",
    ] {
        assert!(paths.contains_key(p), "openapi lacks {p}");
    }
    for s in [
        "CreateSandbox",
        "SandboxInfo",
        "ExecRequest",
        "ExecResult",
        "ExecEvent",
        "FileEntry",
        "ApiErrorBody",
        "PackageEntry",
        "PackagePolicy",
    ] {
        assert!(
            v["components"]["schemas"].get(s).is_some(),
            "openapi lacks schema {s}"
        );
    }
    // How to authenticate: a bearer key or X-API-Key everywhere but /health.
    let schemes = &v["components"]["securitySchemes"];
    assert_eq!(schemes["bearer"]["scheme"], "bearer", "{schemes}");
    assert_eq!(schemes["api_key"]["name"], "X-API-Key", "{schemes}");
    assert_eq!(
        v["security"].as_array().map(Vec::len),
        Some(2),
        "{}",
        v["security"]
    );
    assert_eq!(
        v["paths"]["/health"]["get"]["security"],
        serde_json::json!([{}])
    );
}

#[tokio::test]
async fn create_answers_201_and_maps_core_errors() {
    let (app, _) = app();
    let r = call(
        &app,
        Method::POST,
        "/v1/sandboxes",
        JSON,
        br#"{"metadata":{"a":"1"}}"#,
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert_eq!(r.json()["metadata"]["a"], "1");
    let m = call(
        &app,
        Method::POST,
        "/v1/sandboxes",
        JSON,
        br#"{"limits":{"memory_bytes":4294967296}}"#,
    )
    .await
    .error(422, "limit_exceeded");
    assert!(m.contains("memory_bytes"), "{m}");
    call(
        &app,
        Method::POST,
        "/v1/sandboxes",
        JSON,
        br#"{"template":"full"}"#,
    )
    .await
    .error(503, "capacity");
}

#[tokio::test]
async fn persistence_on_a_backend_without_it_is_a_503() {
    let (app, _) = app();
    for (m, uri, body) in [
        (Method::GET, "/v1/snapshots", &b""[..]),
        (Method::GET, "/v1/volumes", b""),
        (
            Method::POST,
            "/v1/volumes",
            br#"{"name":"v","size_mib":64}"#,
        ),
        (Method::DELETE, "/v1/snapshots/s", b""),
    ] {
        let r = call(&app, m, uri, Some("application/json"), body).await;
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{uri}");
        assert_eq!(r.json()["error"]["code"], "unsupported");
    }
    // Bodies are checked first: unknown fields are refused.
    let r = call(
        &app,
        Method::POST,
        "/v1/volumes",
        Some("application/json"),
        br#"{"name":"v","size_mib":64,"quota":1}"#,
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn bad_json_is_a_400_naming_the_field() {
    let (app, _) = app();
    let m = call(
        &app,
        Method::POST,
        "/v1/sandboxes",
        JSON,
        br#"{"templat":"base"}"#,
    )
    .await
    .error(400, "bad_request");
    assert!(m.contains("templat"), "{m}");
    let m = call(
        &app,
        Method::POST,
        "/v1/sandboxes",
        JSON,
        br#"{"limits":{"cpus":"two"}}"#,
    )
    .await
    .error(400, "bad_request");
    assert!(m.contains("limits.cpus"), "{m}");
    call(&app, Method::POST, "/v1/sandboxes", JSON, b"{not json")
        .await
        .error(400, "bad_request");
    call(&app, Method::POST, "/v1/sandboxes", JSON, b"")
        .await
        .error(400, "bad_request");
    call(&app, Method::POST, "/v1/sandboxes", JSON, b"[]")
        .await
        .error(400, "bad_request");
    let m = call(
        &app,
        Method::POST,
        "/v1/sandboxes/known/timeout",
        JSON,
        b"{}",
    )
    .await
    .error(400, "bad_request");
    assert!(m.contains("timeout_secs"), "{m}");
    let m = call(
        &app,
        Method::POST,
        "/v1/sandboxes/known/timeout",
        JSON,
        br#"{"timeout_secs":-1}"#,
    )
    .await
    .error(400, "bad_request");
    assert!(m.contains("timeout_secs"), "{m}");
}

#[tokio::test]
async fn json_needs_its_content_type_and_a_bounded_size() {
    let (app, _) = app();
    call(
        &app,
        Method::POST,
        "/v1/sandboxes",
        Some("text/plain"),
        b"{}",
    )
    .await
    .error(415, "unsupported_media_type");
    call(&app, Method::POST, "/v1/sandboxes", None, b"{}")
        .await
        .error(415, "unsupported_media_type");
    let mut big = br#"{"template":""#.to_vec();
    big.extend(std::iter::repeat_n(b'a', 2 << 20));
    big.extend(br#""}"#);
    call(&app, Method::POST, "/v1/sandboxes", JSON, &big)
        .await
        .error(413, "too_large");
    // An exec may carry up to 16 MiB (stdin).
    let exec = |n: usize| {
        let mut b = br#"{"cmd":["cat"],"stdin":""#.to_vec();
        b.extend(std::iter::repeat_n(b'a', n));
        b.extend(br#""}"#);
        b
    };
    call(
        &app,
        Method::POST,
        "/v1/sandboxes/known/exec",
        JSON,
        &exec(2 << 20),
    )
    .await
    .error(500, "internal");
    call(
        &app,
        Method::POST,
        "/v1/sandboxes/known/exec",
        JSON,
        &exec(17 << 20),
    )
    .await
    .error(413, "too_large");
}

#[tokio::test]
async fn sandbox_ids_are_validated_and_unknown_ones_are_404() {
    let (app, _) = app();
    let m = call(&app, Method::GET, "/v1/sandboxes/NOT-VALID", None, b"")
        .await
        .error(400, "bad_request");
    assert!(m.starts_with("id:"), "{m}");
    call(&app, Method::GET, "/v1/sandboxes/%2e%2e", None, b"")
        .await
        .error(400, "bad_request");
    call(&app, Method::GET, "/v1/sandboxes/nosuch", None, b"")
        .await
        .error(404, "not_found");
    call(&app, Method::DELETE, "/v1/sandboxes/nosuch", None, b"")
        .await
        .error(404, "not_found");
    call(
        &app,
        Method::POST,
        "/v1/sandboxes/nosuch/timeout",
        JSON,
        br#"{"timeout_secs":5}"#,
    )
    .await
    .error(404, "not_found");
    call(
        &app,
        Method::POST,
        "/v1/sandboxes/stopped/timeout",
        JSON,
        br#"{"timeout_secs":5}"#,
    )
    .await
    .error(409, "conflict");
    let r = call(&app, Method::GET, "/v1/sandboxes/known", None, b"").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["id"], "known");
}

#[tokio::test]
async fn list_filters_are_parsed_and_checked() {
    let (app, fake) = app();
    let r = call(
        &app,
        Method::GET,
        "/v1/sandboxes?state=running&metadata=a%3D1&metadata.b=2",
        None,
        b"",
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json().as_array().unwrap().len(), 1);
    let (state, md) = fake.last_list.lock().unwrap().clone().unwrap();
    assert_eq!(state, Some(SandboxState::Running));
    assert_eq!(md.get("a").unwrap(), "1");
    assert_eq!(md.get("b").unwrap(), "2");
    let m = call(&app, Method::GET, "/v1/sandboxes?state=zombie", None, b"")
        .await
        .error(400, "bad_request");
    assert!(m.starts_with("state"), "{m}");
    call(&app, Method::GET, "/v1/sandboxes?limit=3", None, b"")
        .await
        .error(400, "bad_request");
    call(
        &app,
        Method::GET,
        "/v1/sandboxes?metadata=novalue",
        None,
        b"",
    )
    .await
    .error(400, "bad_request");
}

#[tokio::test]
async fn exec_input_is_validated() {
    let (app, _) = app();
    let m = call(
        &app,
        Method::POST,
        "/v1/sandboxes/known/exec",
        JSON,
        br#"{"cmd":[]}"#,
    )
    .await
    .error(400, "bad_request");
    assert!(m.starts_with("cmd"), "{m}");
    let m = call(
        &app,
        Method::POST,
        "/v1/sandboxes/known/exec",
        JSON,
        br#"{"cmd":["ls"],"tty":"big"}"#,
    )
    .await
    .error(400, "bad_request");
    assert!(m.starts_with("tty"), "{m}");
    call(
        &app,
        Method::POST,
        "/v1/sandboxes/known/exec",
        JSON,
        br#"{"command":"ls"}"#,
    )
    .await
    .error(400, "bad_request");
    call(
        &app,
        Method::POST,
        "/v1/sandboxes/known/exec",
        JSON,
        br#"{"cmd":["ls"],"max_output_bytes":1099511627776}"#,
    )
    .await
    .error(422, "limit_exceeded");
    call(
        &app,
        Method::POST,
        "/v1/sandboxes/nosuch/exec",
        JSON,
        br#"{"cmd":["ls"]}"#,
    )
    .await
    .error(404, "not_found");
    call(
        &app,
        Method::POST,
        "/v1/sandboxes/stopped/exec",
        JSON,
        br#"{"cmd":["ls"]}"#,
    )
    .await
    .error(409, "conflict");
    // Not a WebSocket handshake.
    call(&app, Method::GET, "/v1/sandboxes/known/exec/ws", None, b"")
        .await
        .error(400, "bad_request");
}

#[tokio::test]
async fn file_endpoints_check_their_input() {
    let (app, _) = app();
    let m = call(&app, Method::GET, "/v1/sandboxes/known/files", None, b"")
        .await
        .error(400, "bad_request");
    assert!(m.contains("path"), "{m}");
    call(
        &app,
        Method::GET,
        "/v1/sandboxes/known/files?path=",
        None,
        b"",
    )
    .await
    .error(400, "bad_request");
    call(
        &app,
        Method::GET,
        "/v1/sandboxes/known/files?path=/a&mode=x",
        None,
        b"",
    )
    .await
    .error(400, "bad_request");
    call(
        &app,
        Method::GET,
        "/v1/sandboxes/known/files/stat?path=/a%00b",
        None,
        b"",
    )
    .await
    .error(400, "bad_request");
    let m = call(
        &app,
        Method::GET,
        "/v1/sandboxes/known/files/list?path=/&depth=0",
        None,
        b"",
    )
    .await
    .error(400, "bad_request");
    assert!(m.starts_with("depth"), "{m}");
    call(
        &app,
        Method::GET,
        "/v1/sandboxes/known/files/list?path=/&depth=x",
        None,
        b"",
    )
    .await
    .error(400, "bad_request");
    call(
        &app,
        Method::POST,
        "/v1/sandboxes/known/files/mkdir",
        JSON,
        br#"{"dir":"/a"}"#,
    )
    .await
    .error(400, "bad_request");
    call(
        &app,
        Method::POST,
        "/v1/sandboxes/known/files/move",
        JSON,
        br#"{"from":"/a"}"#,
    )
    .await
    .error(400, "bad_request");
    call(
        &app,
        Method::GET,
        "/v1/sandboxes/known/files/watch?path=/&recursive=maybe",
        None,
        b"",
    )
    .await
    .error(400, "bad_request");
    call(
        &app,
        Method::PUT,
        "/v1/sandboxes/nosuch/files?path=/a",
        None,
        b"x",
    )
    .await
    .error(404, "not_found");
    call(
        &app,
        Method::DELETE,
        "/v1/sandboxes/nosuch/files?path=/a",
        None,
        b"",
    )
    .await
    .error(404, "not_found");
    call(
        &app,
        Method::GET,
        "/v1/sandboxes/stopped/files?path=/a",
        None,
        b"",
    )
    .await
    .error(409, "conflict");
}

#[tokio::test]
async fn unknown_routes_methods_and_panics_answer_json() {
    let (app, _) = app();
    call(&app, Method::GET, "/v2/nothing", None, b"")
        .await
        .error(404, "not_found");
    call(&app, Method::PATCH, "/v1/sandboxes", None, b"")
        .await
        .error(405, "method_not_allowed");
    call(&app, Method::GET, "/v1/sandboxes/panics", None, b"")
        .await
        .error(500, "internal");
    // The server still answers after a panic.
    let r = call(&app, Method::GET, "/health", None, b"").await;
    assert_eq!(r.status, StatusCode::OK);
}

/// A request with headers; the answer's status, `set-cookie` and JSON body (or null).
async fn call_with(
    app: &axum::Router,
    method: Method,
    uri: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, Value) {
    let mut b = Request::builder().method(method).uri(uri);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let resp = app
        .clone()
        .oneshot(b.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

#[tokio::test]
async fn exposed_ports_need_the_sandboxs_token_unless_public() {
    let (app, _) = app();
    let r = call(&app, Method::POST, "/v1/sandboxes", JSON, b"{}").await;
    assert_eq!(r.status, StatusCode::CREATED);
    let made = r.json()["access_token"].as_str().unwrap().to_owned();
    assert_eq!(made.len(), 64);
    let r = call(
        &app,
        Method::POST,
        "/v1/sandboxes",
        JSON,
        br#"{"public_ports":[0]}"#,
    )
    .await;
    assert!(r.error(400, "bad_request").starts_with("public_ports"));
    let (s, v) = call_with(&app, Method::GET, "/v1/sandboxes/known", &[]).await;
    assert_eq!(s, StatusCode::OK);
    let token = v["access_token"].as_str().unwrap().to_owned();
    assert_ne!(token, made);

    let path = "/v1/sandboxes/known/ports/8000/x?y=1";
    let host = [("host", "8000-known.localhost:3000")];
    for (uri, h) in [(path, &[][..]), ("/x", &host[..])] {
        let (s, v) = call_with(&app, Method::GET, uri, h).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{uri}: {v}");
        assert_eq!(v["error"]["code"], "unauthorized");
        let mut wrong = h.to_vec();
        wrong.push(("x-rampart-token", &made));
        let (s, v) = call_with(&app, Method::GET, uri, &wrong).await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{uri}: {v}");
        // The right token passes; this stand-in has no agent to tunnel through.
        let bearer = format!("Bearer {token}");
        let mut right = h.to_vec();
        right.push(("authorization", &bearer));
        let (s, v) = call_with(&app, Method::GET, uri, &right).await;
        assert_eq!(s, StatusCode::INTERNAL_SERVER_ERROR, "{uri}: {v}");
        assert!(v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no agents"));
    }
    // A web page (a sandbox's own, through either form, or any site) cannot open a port:
    // its body-less POST is a simple cross-origin request the browser sends unasked.
    for origin in [
        ("origin", "null"),
        ("origin", "http://8000-known.localhost:3000"),
    ] {
        for m in [Method::POST, Method::DELETE] {
            let (s, v) = call_with(
                &app,
                m.clone(),
                "/v1/sandboxes/known/ports/8000/public",
                &[origin],
            )
            .await;
            assert_eq!(s, StatusCode::FORBIDDEN, "{m} {origin:?}: {v}");
        }
    }
    let (s, _) = call_with(&app, Method::GET, path, &[]).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "still private");
    // Nor change anything else through the API (a body-less POST such as pause, or a form
    // post); what goes to a sandbox's port is its server's business (here: no token, 401).
    for uri in [
        "/v1/sandboxes/known/pause",
        "/v1/sandboxes/known/resume",
        "/v1/sandboxes",
    ] {
        let (s, v) = call_with(&app, Method::POST, uri, &[("sec-fetch-site", "same-site")]).await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{uri}: {v}");
    }
    let (s, v) = call_with(&app, Method::POST, path, &[("origin", "null")]).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{v}");
    let (s, _) = call_with(
        &app,
        Method::GET,
        "/v1/sandboxes/known",
        &[("origin", "null")],
    )
    .await;
    assert_eq!(
        s,
        StatusCode::OK,
        "reads are left to the browser's same-origin policy"
    );
    // Public: no token needed (and the listing says so).
    let (s, v) = call_with(
        &app,
        Method::POST,
        "/v1/sandboxes/known/ports/8000/public",
        &[("host", "h:9")],
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["public"], true);
    assert_eq!(v["host_url"], "http://8000-known.localhost:9/");
    let (s, _) = call_with(&app, Method::GET, path, &[]).await;
    assert_eq!(s, StatusCode::INTERNAL_SERVER_ERROR);
    let (s, v) = call_with(
        &app,
        Method::GET,
        "/v1/sandboxes/known/ports",
        &[("host", "h:9")],
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["ports"][0]["port"], 8000);
    assert_eq!(
        v["ports"][0]["url"],
        "http://h:9/v1/sandboxes/known/ports/8000/"
    );
    let (s, _) = call_with(
        &app,
        Method::DELETE,
        "/v1/sandboxes/known/ports/8000/public",
        &[],
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    let (s, _) = call_with(&app, Method::GET, path, &[]).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);

    // Bad ports, unknown sandboxes, other hosts.
    for p in ["0", "65536", "http"] {
        let (s, _) = call_with(
            &app,
            Method::GET,
            &format!("/v1/sandboxes/known/ports/{p}/"),
            &[],
        )
        .await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{p}");
    }
    let (s, _) = call_with(&app, Method::GET, "/v1/sandboxes/nope/ports/80/", &[]).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _) = call_with(
        &app,
        Method::GET,
        "/health",
        &[("host", "8000-known.example.com")],
    )
    .await;
    assert_eq!(s, StatusCode::OK);

    let r = call(&app, Method::GET, "/v1/openapi.json", None, b"").await;
    let v = r.json();
    for p in [
        "/v1/sandboxes/{id}/ports",
        "/v1/sandboxes/{id}/ports/{port}/public",
        "/v1/sandboxes/{id}/ports/{port}/{path}",
    ] {
        assert!(v["paths"].get(p).is_some(), "openapi lacks {p}");
    }
}

#[tokio::test]
async fn secrets_api_is_documented_and_a_503_without_a_manager() {
    let (app, _) = app();
    let v = call(&app, Method::GET, "/v1/openapi.json", None, b"")
        .await
        .json();
    for p in ["/v1/secrets", "/v1/secrets/{name}"] {
        assert!(v["paths"].get(p).is_some(), "openapi lacks {p}");
    }
    for s in ["SecretSpec", "SecretInjection", "StoredSecretInfo"] {
        assert!(
            v["components"]["schemas"].get(s).is_some(),
            "openapi lacks schema {s}"
        );
    }
    for (m, uri, body) in [
        (Method::GET, "/v1/secrets", &b""[..]),
        (
            Method::POST,
            "/v1/secrets",
            br#"{"name":"tok","value":"v","hosts":["api.example.com"]}"#,
        ),
        (Method::DELETE, "/v1/secrets/tok", b""),
    ] {
        let r = call(&app, m, uri, Some("application/json"), body).await;
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{uri}");
        assert_eq!(r.json()["error"]["code"], "unsupported");
        assert!(!String::from_utf8_lossy(&r.body).contains("\"v\""));
    }
    // Bodies are checked first: unknown fields are refused.
    let r = call(
        &app,
        Method::POST,
        "/v1/secrets",
        Some("application/json"),
        br#"{"name":"tok","value":"v","hosts":[],"secret":1}"#,
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
}
