//! The HTTP layer over the real core on the fake tier (`rampart_core::FakeTier`: the real
//! `rampart-agent` as a plain child process; no root needed): error bodies, statuses,
//! authentication, health, metrics, OpenAPI, input checks and the port proxy's token rules.
//! Needs the built agent (`cargo build --bins -p rampart-agent`; `RAMPART_TEST_AGENT` names
//! another binary). Every sandbox a test makes is destroyed at its end, and killed if the
//! test fails (see [`Server`]'s `Drop`).

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use rampart_core::{CoreConfig, FakeTier, Manager};
use rampart_server::{router_with_options, ServerOptions, ADMIN_KEY_FILE};
use serde_json::Value;
use std::net::SocketAddr;
use std::sync::Arc;
use tower::ServiceExt;

/// The name a reverse proxy in front of the daemon would give it (an allowed host).
const PROXY_HOST: &str = "h";

/// A daemon: the real manager on the fake tier in a data directory of its own, its full
/// router (authentication included) and the admin key it made at first start.
struct Server {
    cfg: CoreConfig,
    manager: Arc<Manager>,
    app: axum::Router,
    /// `Bearer <the admin key>`.
    admin: String,
    /// Held for the test's length (removed at the end).
    _dir: tempfile::TempDir,
}

impl Server {
    async fn start() -> Server {
        Server::start_with(|_| {}).await
    }

    /// A daemon whose configuration `tune` changed.
    async fn start_with(tune: impl FnOnce(&mut CoreConfig)) -> Server {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cfg = FakeTier::test_config(dir.path().to_path_buf());
        tune(&mut cfg);
        let tier = FakeTier::from_config(&cfg).expect("fake tier");
        let manager = Manager::start_with(cfg.clone(), Arc::new(tier))
            .await
            .expect("manager start on the fake tier");
        let opts = ServerOptions {
            allowed_hosts: vec![PROXY_HOST.into()],
            ..ServerOptions::default()
        };
        let app = router_with_options(manager.clone(), &opts);
        // Written by the router at first start, as the daemon does.
        let key = std::fs::read_to_string(dir.path().join(ADMIN_KEY_FILE)).expect("admin key");
        Server {
            cfg,
            manager,
            app,
            admin: format!("Bearer {}", key.trim()),
            _dir: dir,
        }
    }

    /// A request as `serve_all` hands it to the router: with the peer's address.
    async fn send(&self, req: Request<Body>) -> axum::response::Response {
        let mut req = req;
        let peer: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        req.extensions_mut().insert(ConnectInfo(peer));
        self.app.clone().oneshot(req).await.unwrap()
    }

    /// A call of the admin's: its key, `Host: localhost:3000`, and `ct` if any.
    async fn call(&self, method: Method, uri: &str, ct: Option<&str>, body: &[u8]) -> Resp {
        let mut b = Request::builder()
            .method(method)
            .uri(uri)
            .header("host", "localhost:3000")
            .header("authorization", &self.admin);
        if let Some(ct) = ct {
            b = b.header("content-type", ct);
        }
        let resp = self.send(b.body(Body::from(body.to_vec())).unwrap()).await;
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

    /// A body-less request with exactly `headers` (no key unless given); the answer's status
    /// and JSON body (or null) and its raw body.
    async fn call_with(
        &self,
        method: Method,
        uri: &str,
        headers: &[(&str, &str)],
    ) -> (StatusCode, Value, Vec<u8>) {
        let mut b = Request::builder().method(method).uri(uri);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let resp = self.send(b.body(Body::empty()).unwrap()).await;
        let status = resp.status();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            serde_json::from_slice(&body).unwrap_or(Value::Null),
            body.to_vec(),
        )
    }

    /// Creates a sandbox from `body`; its info.
    async fn create(&self, body: &str) -> Value {
        let r = self
            .call(Method::POST, "/v1/sandboxes", JSON, body.as_bytes())
            .await;
        assert_eq!(
            r.status,
            StatusCode::CREATED,
            "{}",
            String::from_utf8_lossy(&r.body)
        );
        r.json()
    }

    /// A sandbox, destroyed: its id stays known, in state `destroyed`.
    async fn destroyed(&self) -> String {
        let id = self.create("{}").await["id"].as_str().unwrap().to_owned();
        let r = self
            .call(Method::DELETE, &format!("/v1/sandboxes/{id}"), None, b"")
            .await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.json()["state"], "destroyed");
        id
    }

    /// Destroys every sandbox still alive, through the API, and stops the manager.
    async fn stop(self) {
        let r = self.call(Method::GET, "/v1/sandboxes", None, b"").await;
        assert_eq!(r.status, StatusCode::OK);
        for s in r.json().as_array().unwrap() {
            if s["state"] == "destroyed" {
                continue;
            }
            let id = s["id"].as_str().unwrap();
            let r = self
                .call(Method::DELETE, &format!("/v1/sandboxes/{id}"), None, b"")
                .await;
            assert_eq!(r.status, StatusCode::OK, "destroying {id}");
        }
        self.manager.shutdown().await;
        use rampart_core::Isolation as _;
        let tier = FakeTier::from_config(&self.cfg).unwrap();
        assert_eq!(tier.leftovers().unwrap(), Vec::new(), "sandboxes left");
    }
}

impl Drop for Server {
    /// A failed test's sandboxes are killed, not left running (the tier checks each agent's
    /// identity before it signals).
    fn drop(&mut self) {
        use rampart_core::Isolation as _;
        if let Ok(tier) = FakeTier::from_config(&self.cfg) {
            for id in tier.leftovers().unwrap_or_default() {
                let _ = tier.destroy(&id);
            }
        }
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

const JSON: Option<&str> = Some("application/json");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_answers_ok_with_version() {
    let s = Server::start().await;
    // Open: no key needed.
    let (status, v, _) = s.call_with(Method::GET, "/health", &[]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(v["status"], "ok");
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_needs_a_key_and_a_host_naming_the_daemon() {
    let s = Server::start().await;
    for h in [
        &[][..],
        &[("authorization", "Bearer rampart_nosuchkey")][..],
        &[("authorization", "Basic dXNlcjpwYXNz")][..],
    ] {
        let (status, v, _) = s.call_with(Method::GET, "/v1/sandboxes", h).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{h:?}: {v}");
        assert_eq!(v["error"]["code"], "unauthorized");
    }
    let (status, _, _) = s.call_with(Method::GET, "/metrics", &[]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, v, _) = s
        .call_with(
            Method::GET,
            "/v1/sandboxes",
            &[("authorization", &s.admin), ("host", "evil.example")],
        )
        .await;
    assert_eq!(status, StatusCode::MISDIRECTED_REQUEST, "{v}");
    assert_eq!(v["error"]["code"], "misdirected_request");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_include_the_managers_and_http_requests() {
    let s = Server::start().await;
    s.create("{}").await;
    s.call(Method::GET, "/health", None, b"").await;
    let r = s.call(Method::GET, "/metrics", None, b"").await;
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
        text.contains("rampart_sandbox_creates_total{result=\"ok\"} 1"),
        "{text}"
    );
    assert!(
        text.contains(
            "rampart_http_requests_total{method=\"GET\",route=\"/health\",status=\"200\"}"
        ),
        "{text}"
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openapi_lists_every_path() {
    let s = Server::start().await;
    let r = s.call(Method::GET, "/v1/openapi.json", None, b"").await;
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
    for schema in [
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
            v["components"]["schemas"].get(schema).is_some(),
            "openapi lacks schema {schema}"
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
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_answers_201_and_maps_core_errors() {
    // Room for one sandbox: the second create is refused for capacity.
    let s = Server::start_with(|c| c.max_sandboxes = 1).await;
    let made = s.create(r#"{"metadata":{"a":"1"}}"#).await;
    assert_eq!(made["metadata"]["a"], "1");
    assert_eq!(made["state"], "running");
    let max = s.cfg.max_limits.memory_bytes;
    let m = s
        .call(
            Method::POST,
            "/v1/sandboxes",
            JSON,
            format!(r#"{{"limits":{{"memory_bytes":{}}}}}"#, max + (1 << 20)).as_bytes(),
        )
        .await
        .error(422, "limit_exceeded");
    assert!(m.contains("memory_bytes"), "{m}");
    let m = s
        .call(Method::POST, "/v1/sandboxes", JSON, b"{}")
        .await
        .error(503, "capacity");
    assert!(m.contains("1 sandboxes are alive"), "{m}");
    // Room again once it is gone.
    let id = made["id"].as_str().unwrap();
    let r = s
        .call(Method::DELETE, &format!("/v1/sandboxes/{id}"), None, b"")
        .await;
    assert_eq!(r.status, StatusCode::OK);
    s.create("{}").await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn persistence_on_the_fake_tier() {
    let s = Server::start().await;
    for uri in ["/v1/snapshots", "/v1/volumes"] {
        let r = s.call(Method::GET, uri, None, b"").await;
        assert_eq!(r.status, StatusCode::OK, "{uri}");
        assert_eq!(r.json(), serde_json::json!([]), "{uri}");
    }
    // The fake tier has no store: no volumes.
    s.call(
        Method::POST,
        "/v1/volumes",
        JSON,
        br#"{"name":"v","size_mib":64}"#,
    )
    .await
    .error(503, "unsupported");
    s.call(Method::DELETE, "/v1/snapshots/s", None, b"")
        .await
        .error(404, "not_found");
    // Bodies are checked first: unknown fields are refused.
    s.call(
        Method::POST,
        "/v1/volumes",
        JSON,
        br#"{"name":"v","size_mib":64,"quota":1}"#,
    )
    .await
    .error(400, "bad_request");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_json_is_a_400_naming_the_field() {
    let s = Server::start().await;
    let m = s
        .call(
            Method::POST,
            "/v1/sandboxes",
            JSON,
            br#"{"templat":"base"}"#,
        )
        .await
        .error(400, "bad_request");
    assert!(m.contains("templat"), "{m}");
    let m = s
        .call(
            Method::POST,
            "/v1/sandboxes",
            JSON,
            br#"{"limits":{"cpus":"two"}}"#,
        )
        .await
        .error(400, "bad_request");
    assert!(m.contains("limits.cpus"), "{m}");
    s.call(Method::POST, "/v1/sandboxes", JSON, b"{not json")
        .await
        .error(400, "bad_request");
    s.call(Method::POST, "/v1/sandboxes", JSON, b"")
        .await
        .error(400, "bad_request");
    s.call(Method::POST, "/v1/sandboxes", JSON, b"[]")
        .await
        .error(400, "bad_request");
    let id = s.create("{}").await["id"].as_str().unwrap().to_owned();
    let timeout = format!("/v1/sandboxes/{id}/timeout");
    let m = s
        .call(Method::POST, &timeout, JSON, b"{}")
        .await
        .error(400, "bad_request");
    assert!(m.contains("timeout_secs"), "{m}");
    let m = s
        .call(Method::POST, &timeout, JSON, br#"{"timeout_secs":-1}"#)
        .await
        .error(400, "bad_request");
    assert!(m.contains("timeout_secs"), "{m}");
    let r = s
        .call(Method::POST, &timeout, JSON, br#"{"timeout_secs":5}"#)
        .await;
    assert_eq!(r.status, StatusCode::OK);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_needs_its_content_type_and_a_bounded_size() {
    let s = Server::start().await;
    s.call(Method::POST, "/v1/sandboxes", Some("text/plain"), b"{}")
        .await
        .error(415, "unsupported_media_type");
    s.call(Method::POST, "/v1/sandboxes", None, b"{}")
        .await
        .error(415, "unsupported_media_type");
    let mut big = br#"{"template":""#.to_vec();
    big.extend(std::iter::repeat_n(b'a', 2 << 20));
    big.extend(br#""}"#);
    s.call(Method::POST, "/v1/sandboxes", JSON, &big)
        .await
        .error(413, "too_large");
    // An exec may carry up to 16 MiB (stdin).
    let id = s.create("{}").await["id"].as_str().unwrap().to_owned();
    let exec_uri = format!("/v1/sandboxes/{id}/exec");
    let exec = |n: usize| {
        let mut b = br#"{"cmd":["wc","-c"],"stdin":""#.to_vec();
        b.extend(std::iter::repeat_n(b'a', n));
        b.extend(br#""}"#);
        b
    };
    let r = s.call(Method::POST, &exec_uri, JSON, &exec(2 << 20)).await;
    assert_eq!(
        r.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    let v = r.json();
    assert_eq!(v["exit_code"], 0, "{v}");
    assert_eq!(v["stdout"].as_str().unwrap().trim(), "2097152", "{v}");
    s.call(Method::POST, &exec_uri, JSON, &exec(17 << 20))
        .await
        .error(413, "too_large");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_ids_are_validated_and_unknown_ones_are_404() {
    let s = Server::start().await;
    let m = s
        .call(Method::GET, "/v1/sandboxes/NOT-VALID", None, b"")
        .await
        .error(400, "bad_request");
    assert!(m.starts_with("id:"), "{m}");
    s.call(Method::GET, "/v1/sandboxes/%2e%2e", None, b"")
        .await
        .error(400, "bad_request");
    s.call(Method::GET, "/v1/sandboxes/nosuch", None, b"")
        .await
        .error(404, "not_found");
    s.call(Method::DELETE, "/v1/sandboxes/nosuch", None, b"")
        .await
        .error(404, "not_found");
    s.call(
        Method::POST,
        "/v1/sandboxes/nosuch/timeout",
        JSON,
        br#"{"timeout_secs":5}"#,
    )
    .await
    .error(404, "not_found");
    let stopped = s.destroyed().await;
    s.call(
        Method::POST,
        &format!("/v1/sandboxes/{stopped}/timeout"),
        JSON,
        br#"{"timeout_secs":5}"#,
    )
    .await
    .error(409, "conflict");
    let known = s.create("{}").await["id"].as_str().unwrap().to_owned();
    let r = s
        .call(Method::GET, &format!("/v1/sandboxes/{known}"), None, b"")
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["id"], known.as_str());
    assert_eq!(r.json()["state"], "running");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_filters_are_parsed_and_checked() {
    let s = Server::start().await;
    let both = s.create(r#"{"metadata":{"a":"1","b":"2"}}"#).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    s.create(r#"{"metadata":{"a":"1","b":"3"}}"#).await;
    s.create("{}").await;
    let r = s
        .call(
            Method::GET,
            "/v1/sandboxes?state=running&metadata=a%3D1&metadata.b=2",
            None,
            b"",
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    let v = r.json();
    let found = v.as_array().unwrap();
    assert_eq!(found.len(), 1, "{v}");
    assert_eq!(found[0]["id"], both.as_str());
    // Each filter applies: the metadata one alone matches two, the state one none.
    let r = s
        .call(Method::GET, "/v1/sandboxes?metadata=a%3D1", None, b"")
        .await;
    assert_eq!(r.json().as_array().unwrap().len(), 2);
    let r = s
        .call(
            Method::GET,
            "/v1/sandboxes?state=paused&metadata.b=2",
            None,
            b"",
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json(), serde_json::json!([]));
    let m = s
        .call(Method::GET, "/v1/sandboxes?state=zombie", None, b"")
        .await
        .error(400, "bad_request");
    assert!(m.starts_with("state"), "{m}");
    s.call(Method::GET, "/v1/sandboxes?limit=3", None, b"")
        .await
        .error(400, "bad_request");
    s.call(Method::GET, "/v1/sandboxes?metadata=novalue", None, b"")
        .await
        .error(400, "bad_request");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_input_is_validated() {
    let s = Server::start().await;
    let known = s.create("{}").await["id"].as_str().unwrap().to_owned();
    let stopped = s.destroyed().await;
    // The request is checked before the sandbox is looked up: the same answers for a
    // running sandbox and for one that does not exist.
    for id in [known.as_str(), "nosuch"] {
        let uri = format!("/v1/sandboxes/{id}/exec");
        let m = s
            .call(Method::POST, &uri, JSON, br#"{"cmd":[]}"#)
            .await
            .error(400, "bad_request");
        assert!(m.starts_with("cmd"), "{id}: {m}");
        let m = s
            .call(Method::POST, &uri, JSON, br#"{"cmd":["ls"],"tty":"big"}"#)
            .await
            .error(400, "bad_request");
        assert!(m.starts_with("tty"), "{id}: {m}");
        s.call(Method::POST, &uri, JSON, br#"{"command":"ls"}"#)
            .await
            .error(400, "bad_request");
        s.call(
            Method::POST,
            &uri,
            JSON,
            br#"{"cmd":["ls"],"max_output_bytes":1099511627776}"#,
        )
        .await
        .error(422, "limit_exceeded");
    }
    s.call(
        Method::POST,
        "/v1/sandboxes/nosuch/exec",
        JSON,
        br#"{"cmd":["ls"]}"#,
    )
    .await
    .error(404, "not_found");
    s.call(
        Method::POST,
        &format!("/v1/sandboxes/{stopped}/exec"),
        JSON,
        br#"{"cmd":["ls"]}"#,
    )
    .await
    .error(409, "conflict");
    // Not a WebSocket handshake.
    s.call(
        Method::GET,
        &format!("/v1/sandboxes/{known}/exec/ws"),
        None,
        b"",
    )
    .await
    .error(400, "bad_request");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_endpoints_check_their_input() {
    let s = Server::start().await;
    let known = s.create("{}").await["id"].as_str().unwrap().to_owned();
    let stopped = s.destroyed().await;
    let k = format!("/v1/sandboxes/{known}");
    let m = s
        .call(Method::GET, &format!("{k}/files"), None, b"")
        .await
        .error(400, "bad_request");
    assert!(m.contains("path"), "{m}");
    for (m, uri, body) in [
        (Method::GET, format!("{k}/files?path="), &b""[..]),
        (Method::GET, format!("{k}/files?path=/a&mode=x"), b""),
        (Method::GET, format!("{k}/files/stat?path=/a%00b"), b""),
        (Method::GET, format!("{k}/files/list?path=/&depth=x"), b""),
        (Method::POST, format!("{k}/files/mkdir"), br#"{"dir":"/a"}"#),
        (Method::POST, format!("{k}/files/move"), br#"{"from":"/a"}"#),
        (
            Method::GET,
            format!("{k}/files/watch?path=/&recursive=maybe"),
            b"",
        ),
    ] {
        let ct = (m == Method::POST).then_some("application/json");
        let r = s.call(m.clone(), &uri, ct, body).await;
        r.error(400, "bad_request");
    }
    let m = s
        .call(
            Method::GET,
            &format!("{k}/files/list?path=/&depth=0"),
            None,
            b"",
        )
        .await
        .error(400, "bad_request");
    assert!(m.starts_with("depth"), "{m}");
    // A user the sandbox does not have is the caller's mistake (400 naming `user`), on
    // every file endpoint that takes one, not an agent failure.
    for uri in [
        format!("{k}/files/list?path=/&user=no-such-user-7"),
        format!("{k}/files/stat?path=/&user=no-such-user-7"),
        format!("{k}/files?path=/etc/hostname&user=no-such-user-7"),
    ] {
        let m = s
            .call(Method::GET, &uri, None, b"")
            .await
            .error(400, "bad_request");
        assert!(m.starts_with("user: invalid user"), "{uri}: {m}");
    }
    s.call(
        Method::PUT,
        "/v1/sandboxes/nosuch/files?path=/a",
        None,
        b"x",
    )
    .await
    .error(404, "not_found");
    s.call(
        Method::DELETE,
        "/v1/sandboxes/nosuch/files?path=/a",
        None,
        b"",
    )
    .await
    .error(404, "not_found");
    s.call(
        Method::GET,
        &format!("/v1/sandboxes/{stopped}/files?path=/a"),
        None,
        b"",
    )
    .await
    .error(409, "conflict");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_routes_and_methods_answer_json() {
    let s = Server::start().await;
    s.call(Method::GET, "/v2/nothing", None, b"")
        .await
        .error(404, "not_found");
    s.call(Method::PATCH, "/v1/sandboxes", None, b"")
        .await
        .error(405, "method_not_allowed");
    let r = s.call(Method::GET, "/health", None, b"").await;
    assert_eq!(r.status, StatusCode::OK);
    s.stop().await;
}

/// A server "inside" a sandboxes (the fake tier's agents share the host's network): answers
/// every request with `inside <path and query>`. Its port.
async fn server_inside() -> u16 {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let app = axum::Router::new().fallback(|uri: axum::http::Uri| async move {
        format!(
            "inside {}",
            uri.path_and_query().map(|p| p.as_str()).unwrap_or("")
        )
    });
    tokio::spawn(async move { axum::serve(l, app).await });
    port
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exposed_ports_need_the_sandboxs_token_unless_public() {
    let s = Server::start().await;
    let p = server_inside().await;
    let other = s.create("{}").await;
    let made = other["access_token"].as_str().unwrap().to_owned();
    assert_eq!(made.len(), 64);
    let r = s
        .call(
            Method::POST,
            "/v1/sandboxes",
            JSON,
            br#"{"public_ports":[0]}"#,
        )
        .await;
    assert!(r.error(400, "bad_request").starts_with("public_ports"));
    let known = s.create("{}").await["id"].as_str().unwrap().to_owned();
    let admin = ("authorization", s.admin.as_str());
    let (st, v, _) = s
        .call_with(Method::GET, &format!("/v1/sandboxes/{known}"), &[admin])
        .await;
    assert_eq!(st, StatusCode::OK);
    let token = v["access_token"].as_str().unwrap().to_owned();
    assert_ne!(token, made);

    let path = format!("/v1/sandboxes/{known}/ports/{p}/x?y=1");
    let host_form = format!("{p}-{known}.localhost:3000");
    let host = [("host", host_form.as_str())];
    for (uri, h) in [(path.as_str(), &[][..]), ("/x?y=1", &host[..])] {
        let (st, v, _) = s.call_with(Method::GET, uri, h).await;
        assert_eq!(st, StatusCode::UNAUTHORIZED, "{uri}: {v}");
        assert_eq!(v["error"]["code"], "unauthorized");
        // Another sandbox's token is not this sandbox's.
        let mut wrong = h.to_vec();
        wrong.push(("x-rampart-token", &made));
        let (st, v, _) = s.call_with(Method::GET, uri, &wrong).await;
        assert_eq!(st, StatusCode::FORBIDDEN, "{uri}: {v}");
        // Nor is the admin's API key a sandbox's token: it is not even taken for one.
        let mut key = h.to_vec();
        key.push(admin);
        let (st, v, _) = s.call_with(Method::GET, uri, &key).await;
        assert_eq!(st, StatusCode::UNAUTHORIZED, "{uri}: {v}");
        // The right token passes, to the server inside.
        let bearer = format!("Bearer {token}");
        let mut right = h.to_vec();
        right.push(("authorization", &bearer));
        let (st, _, body) = s.call_with(Method::GET, uri, &right).await;
        assert_eq!(
            st,
            StatusCode::OK,
            "{uri}: {}",
            String::from_utf8_lossy(&body)
        );
        assert_eq!(String::from_utf8_lossy(&body), "inside /x?y=1", "{uri}");
    }
    // A web page (a sandbox's own, through either form, or any site) cannot open a port:
    // its body-less POST is a simple cross-origin request the browser sends unasked (even
    // when the browser holds a key).
    let public = format!("/v1/sandboxes/{known}/ports/{p}/public");
    let sandbox_origin = format!("http://{p}-{known}.localhost:3000");
    for origin in [("origin", "null"), ("origin", sandbox_origin.as_str())] {
        for m in [Method::POST, Method::DELETE] {
            let (st, v, _) = s.call_with(m.clone(), &public, &[origin, admin]).await;
            assert_eq!(st, StatusCode::FORBIDDEN, "{m} {origin:?}: {v}");
        }
    }
    let (st, _, _) = s.call_with(Method::GET, &path, &[]).await;
    assert_eq!(st, StatusCode::UNAUTHORIZED, "still private");
    // Nor change anything else through the API (a body-less POST such as pause, or a form
    // post); what goes to a sandbox's port is its server's business (here: no token, 401).
    for uri in [
        format!("/v1/sandboxes/{known}/pause"),
        format!("/v1/sandboxes/{known}/resume"),
        "/v1/sandboxes".to_owned(),
    ] {
        let (st, v, _) = s
            .call_with(
                Method::POST,
                &uri,
                &[("sec-fetch-site", "same-site"), admin],
            )
            .await;
        assert_eq!(st, StatusCode::FORBIDDEN, "{uri}: {v}");
    }
    let (st, v, _) = s
        .call_with(Method::POST, &path, &[("origin", "null")])
        .await;
    assert_eq!(st, StatusCode::UNAUTHORIZED, "{v}");
    let (st, v, _) = s
        .call_with(
            Method::GET,
            &format!("/v1/sandboxes/{known}"),
            &[("origin", "null"), admin],
        )
        .await;
    assert_eq!(
        st,
        StatusCode::OK,
        "reads are left to the browser's same-origin policy: {v}"
    );
    assert_eq!(v["state"], "running", "not paused: {v}");
    // Public: no token needed (and the listing says so).
    let proxy_host = format!("{PROXY_HOST}:9");
    let (st, v, _) = s
        .call_with(
            Method::POST,
            &public,
            &[("host", proxy_host.as_str()), admin],
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["public"], true);
    assert_eq!(v["host_url"], format!("http://{p}-{known}.localhost:9/"));
    let (st, _, body) = s.call_with(Method::GET, &path, &[]).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(String::from_utf8_lossy(&body), "inside /x?y=1");
    let (st, v, _) = s
        .call_with(
            Method::GET,
            &format!("/v1/sandboxes/{known}/ports"),
            &[("host", proxy_host.as_str()), admin],
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let listed = v["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["port"] == p)
        .unwrap_or_else(|| panic!("port {p} not listed: {v}"));
    assert_eq!(listed["public"], true, "{v}");
    assert_eq!(
        listed["url"],
        format!("http://{PROXY_HOST}:9/v1/sandboxes/{known}/ports/{p}/")
    );
    let (st, _, _) = s.call_with(Method::DELETE, &public, &[admin]).await;
    assert_eq!(st, StatusCode::OK);
    let (st, _, _) = s.call_with(Method::GET, &path, &[]).await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);

    // Bad ports, unknown sandboxes, other hosts.
    for bad in ["0", "65536", "http"] {
        let (st, _, _) = s
            .call_with(
                Method::GET,
                &format!("/v1/sandboxes/{known}/ports/{bad}/"),
                &[],
            )
            .await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{bad}");
    }
    let (st, _, _) = s
        .call_with(Method::GET, "/v1/sandboxes/nope/ports/80/", &[])
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    // Host routing to a port is under the configured domain only, for the port proxy and
    // the E2B envd proxy alike: another domain's `{port}-{id}` name reaches no sandbox, even
    // with its token (here `/health` is the daemon's own answer, not the server inside).
    let other_domain = format!("{p}-{known}.example.com");
    let bearer = format!("Bearer {token}");
    let (st, v, body) = s
        .call_with(
            Method::GET,
            "/health",
            &[
                ("host", other_domain.as_str()),
                ("authorization", bearer.as_str()),
            ],
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["status"], "ok", "{v}");
    assert!(!String::from_utf8_lossy(&body).contains("inside"));
    // Any other name is no route at all.
    let (st, v, _) = s
        .call_with(Method::GET, "/health", &[("host", "www.example.com")])
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["status"], "ok");

    let v = s
        .call(Method::GET, "/v1/openapi.json", None, b"")
        .await
        .json();
    for doc in [
        "/v1/sandboxes/{id}/ports",
        "/v1/sandboxes/{id}/ports/{port}/public",
        "/v1/sandboxes/{id}/ports/{port}/{path}",
    ] {
        assert!(v["paths"].get(doc).is_some(), "openapi lacks {doc}");
    }
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_api_is_documented_and_never_shows_a_value() {
    let s = Server::start().await;
    let v = s
        .call(Method::GET, "/v1/openapi.json", None, b"")
        .await
        .json();
    for p in ["/v1/secrets", "/v1/secrets/{name}"] {
        assert!(v["paths"].get(p).is_some(), "openapi lacks {p}");
    }
    for schema in ["SecretSpec", "SecretInjection", "StoredSecretInfo"] {
        assert!(
            v["components"]["schemas"].get(schema).is_some(),
            "openapi lacks schema {schema}"
        );
    }
    // Bodies are checked first: unknown fields are refused.
    s.call(
        Method::POST,
        "/v1/secrets",
        JSON,
        br#"{"name":"tok","value":"s3cr3t-value","hosts":[],"secret":1}"#,
    )
    .await
    .error(400, "bad_request");
    let r = s
        .call(
            Method::POST,
            "/v1/secrets",
            JSON,
            br#"{"name":"tok","value":"s3cr3t-value","hosts":["api.example.com"]}"#,
        )
        .await;
    assert_eq!(
        r.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    assert_eq!(r.json()["name"], "tok");
    assert!(!String::from_utf8_lossy(&r.body).contains("s3cr3t-value"));
    let r = s.call(Method::GET, "/v1/secrets", None, b"").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()[0]["name"], "tok", "{}", r.json());
    assert!(!String::from_utf8_lossy(&r.body).contains("s3cr3t-value"));
    let r = s.call(Method::DELETE, "/v1/secrets/tok", None, b"").await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    s.call(Method::DELETE, "/v1/secrets/tok", None, b"")
        .await
        .error(404, "not_found");
    let r = s.call(Method::GET, "/v1/secrets", None, b"").await;
    assert_eq!(r.json(), serde_json::json!([]));
    s.stop().await;
}
