//! The envd side: requests for a sandbox (by the `E2b-Sandbox-Id` / `E2b-Sandbox-Port`
//! headers, or a `{port}-{id}.<domain>` host) are checked (`X-Access-Token`, or a signature on
//! `/files`) and passed, as they came, to core's envd road for the sandbox
//! ([`rampart_core::Sandbox::envd`]), which reads them for the audit record (refusing what
//! it cannot read), holds an exec for approval when the policy says so, and streams them to
//! the sandbox's agent and its answers back. This face does not speak the agent's protocol.
//!
//! A request looks the sandbox up once ([`E2b::live`]: the manager's in-memory set of live
//! sandboxes, then the E2B facts). Only when forwarding fails is the live set looked at
//! again, to tell a sandbox that ended on the way (not found) from one that is there but
//! whose agent did not answer (port not open).

use super::{E2b, E2bError};
use crate::proxy::same_secret;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use rampart_core::Principal;
use rampart_core::{AgentError, CoreError};
use rampart_store::access::E2bSandbox;
use rampart_types::SandboxId;
use sha2::{Digest, Sha256};

/// envd's port inside an E2B sandbox.
pub(crate) const ENVD_PORT: u16 = 49983;
/// The code interpreter's port inside an E2B sandbox.
pub(crate) const JUPYTER_PORT: u16 = 49999;

/// Where a request is going.
#[derive(Debug, PartialEq, Eq)]
struct Target {
    id: String,
    port: u16,
}

/// The target of a request: the routing headers, else the host name `{port}-{id}.<domain>`
/// (of this daemon's domain only: a name under another domain is not the daemon's to serve).
fn target_of(req: &Request, domain: &str) -> Option<Target> {
    let headers = req.headers();
    let h = |n: &str| {
        headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|s| !s.is_empty())
    };
    if let Some(id) = h("e2b-sandbox-id") {
        let port = h("e2b-sandbox-port")
            .and_then(|p| p.parse().ok())
            .unwrap_or(ENVD_PORT);
        return Some(Target {
            id: id.to_owned(),
            port,
        });
    }
    let host = h("host").or_else(|| req.uri().authority().map(|a| a.as_str()))?;
    let t = crate::ports::host_target(host, domain)?;
    if !t
        .id
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    {
        return None;
    }
    Some(Target {
        id: t.id,
        port: t.port,
    })
}

/// The proxy's answer for a sandbox that is not there (killed, expired, paused, unknown):
/// 502 like E2B's edge, with "was not found" (the SDK keys on it).
fn not_found_502(id: &str) -> Response {
    let body = serde_json::json!({
        "sandboxId": id,
        "message": "The sandbox was not found",
        "code": 502,
    });
    let mut r = Response::new(Body::from(body.to_string()));
    *r.status_mut() = StatusCode::BAD_GATEWAY;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json; charset=utf-8"),
    );
    r.headers_mut()
        .insert("should-retry", HeaderValue::from_static("false"));
    r
}

fn port_closed_502(id: &str, port: u16, why: &str) -> Response {
    let body = serde_json::json!({
        "sandboxId": id,
        "message": format!("The sandbox is running but port is not open ({port}: {why})"),
        "port": port,
        "code": 502,
    });
    let mut r = Response::new(Body::from(body.to_string()));
    *r.status_mut() = StatusCode::BAD_GATEWAY;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json; charset=utf-8"),
    );
    r.headers_mut()
        .insert("should-retry", HeaderValue::from_static("false"));
    r
}

/// envd's plain error: `{"code": <status>, "message"}`.
fn envd_error(status: StatusCode, message: &str) -> Response {
    let body = serde_json::json!({"code": status.as_u16(), "message": message});
    let mut r = Response::new(Body::from(body.to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

const UNAUTHORIZED: &str =
    "unauthorized access, please provide a valid access token or method signing if supported";

/// The signature E2B's SDK puts on download/upload URLs.
pub(crate) fn signature(
    path: &str,
    operation: &str,
    username: &str,
    token: &str,
    expiration: Option<i64>,
) -> String {
    let mut raw = format!("{path}:{operation}:{username}:{token}");
    if let Some(e) = expiration {
        raw.push_str(&format!(":{e}"));
    }
    let digest = Sha256::digest(raw.as_bytes());
    format!(
        "v1_{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
    )
}

/// The signing fields of a `/files` query.
#[derive(Debug, Default)]
struct Signed {
    path: String,
    username: String,
    signature: Option<String>,
    expiration: Option<String>,
}

fn signed_of(query: Option<&str>) -> Signed {
    let pairs: Vec<(String, String)> =
        serde_urlencoded::from_str(query.unwrap_or_default()).unwrap_or_default();
    let mut s = Signed::default();
    for (k, v) in pairs {
        match k.as_str() {
            "path" => s.path = v,
            "username" => s.username = v,
            "signature" => s.signature = Some(v),
            "signature_expiration" => s.expiration = Some(v),
            _ => {}
        }
    }
    s
}

/// Checks a `/files` signature against a sandbox's token: `Ok` if valid and not expired.
fn check_signature(s: &Signed, op: &str, token: &str) -> Result<(), &'static str> {
    let Some(sig) = &s.signature else {
        return Err(UNAUTHORIZED);
    };
    let exp = match &s.expiration {
        None => None,
        Some(e) => Some(e.trim().parse::<i64>().map_err(|_| UNAUTHORIZED)?),
    };
    let want = signature(&s.path, op, &s.username, token, exp);
    if !same_secret(want.as_bytes(), sig.as_bytes()) {
        return Err(UNAUTHORIZED);
    }
    if let Some(e) = exp {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        if e < now {
            return Err("signature is already expired");
        }
    }
    Ok(())
}

fn file_op(req: &Request) -> Option<&'static str> {
    if req.uri().path() != "/files" {
        return None;
    }
    match *req.method() {
        axum::http::Method::GET | axum::http::Method::HEAD => Some("read"),
        axum::http::Method::POST => Some("write"),
        _ => None,
    }
}

/// Authorizes an envd request for a sandbox whose token is `facts.access_token`.
fn authorize(req: &Request, facts: &E2bSandbox) -> Result<(), Box<Response>> {
    let path = req.uri().path();
    if path == "/health" {
        return Ok(());
    }
    match req.headers().get("x-access-token") {
        Some(v) => {
            if same_secret(v.as_bytes(), facts.access_token.as_bytes()) {
                Ok(())
            } else {
                Err(Box::new(envd_error(StatusCode::UNAUTHORIZED, UNAUTHORIZED)))
            }
        }
        None => match file_op(req) {
            Some(op) => check_signature(&signed_of(req.uri().query()), op, &facts.access_token)
                .map_err(|m| Box::new(envd_error(StatusCode::UNAUTHORIZED, m))),
            None => Err(Box::new(envd_error(StatusCode::UNAUTHORIZED, UNAUTHORIZED))),
        },
    }
}

/// Middleware in front of every route: requests for a sandbox go to it; others go on.
pub(crate) async fn dispatch(State(st): State<E2b>, req: Request, next: Next) -> Response {
    let Some(t) = target_of(&req, &st.domain) else {
        return next.run(req).await;
    };
    to_sandbox(&st, t, req).await
}

/// A sandbox the envd proxy can reach: running (neither paused nor ending), made through the
/// E2B API.
pub(crate) struct Live {
    facts: E2bSandbox,
}

impl E2b {
    /// The one lookup of an envd request: whether the sandbox is running and not paused
    /// (the manager's in-memory set of live sandboxes), and its E2B facts. `None` when it is
    /// not there for the proxy (unknown, ended, ending, paused, or not an E2B sandbox).
    pub(crate) async fn live(
        &self,
        who: &Principal,
        id: &SandboxId,
    ) -> Result<Option<Live>, E2bError> {
        match self.manager.sandbox(who, id).and_then(|s| s.running()) {
            Ok(()) => {}
            Err(CoreError::Internal(e)) => return Err(E2bError::internal(e)),
            // Paused: its processes resume with it, and so do their records.
            Err(CoreError::WrongState { state, .. })
                if state == rampart_types::SandboxState::Paused.as_str() =>
            {
                return Ok(None)
            }
            Err(_) => return Ok(None),
        };
        let facts = self.facts(id).await?;
        Ok(facts.map(|facts| Live { facts }))
    }

    /// After forwarding failed: whether the sandbox is still running (its agent did not
    /// answer) rather than ended or paused on the way.
    fn still_running(&self, who: &Principal, id: &SandboxId) -> bool {
        self.manager
            .sandbox(who, id)
            .is_ok_and(|s| s.running().is_ok())
    }
}

async fn to_sandbox(st: &E2b, t: Target, req: Request) -> Response {
    let Ok(id) = SandboxId::parse(&t.id) else {
        return not_found_502(&t.id);
    };
    // The proxy's requests are authorized by the sandbox's own token (below), not by a
    // key: the caller is the node's, as the request's peer names it.
    let who = crate::caller::of(&req);
    let live = match st.live(&who, &id).await {
        Ok(Some(l)) => l,
        Ok(None) => match auto_resume(st, &who, &id, &t, credentials_of(&req)).await {
            Ok(Some(l)) => l,
            Ok(None) => return not_found_502(&t.id),
            Err(r) => return *r,
        },
        Err(e) => return e.into_response(),
    };
    to_live(st, &who, &id, t, live, req).await
}

/// What authorizes `req` (its method, URI and headers, without its body), to be checked
/// before a paused sandbox is woken for it.
fn credentials_of(req: &Request) -> Request {
    let mut probe = Request::new(Body::empty());
    *probe.method_mut() = req.method().clone();
    *probe.uri_mut() = req.uri().clone();
    *probe.headers_mut() = req.headers().clone();
    probe
}

/// Whether `req` may wake the paused sandbox of `facts`: it carries what the request
/// itself would need once the sandbox runs (envd's port: the access token or a signed
/// `/files` URL; another port: the token, unless the sandbox allows public traffic). An
/// unauthenticated `/health` does not wake a sandbox. The refusal is the request's own
/// answer (401), and the sandbox stays paused.
fn may_wake(
    req: &Request,
    t: &Target,
    facts: &E2bSandbox,
    opts: &super::options::Options,
) -> Result<(), Box<Response>> {
    if t.port != ENVD_PORT {
        if opts.is_public(t.port) {
            return Ok(());
        }
        return authorize_port(req, facts);
    }
    if req.uri().path() == "/health" {
        let has_token = req
            .headers()
            .get("x-access-token")
            .is_some_and(|v| same_secret(v.as_bytes(), facts.access_token.as_bytes()));
        return if has_token {
            Ok(())
        } else {
            Err(Box::new(envd_error(StatusCode::UNAUTHORIZED, UNAUTHORIZED)))
        };
    }
    authorize(req, facts)
}

/// A paused sandbox made with `autoResume` is resumed by the first authorized request for
/// it (envd's or a port's), with its create's timeout again, and the request goes on to
/// it; one with an idle sleep is woken the same way, its deadline kept. The request is
/// authorized before the sandbox is woken (a request without the
/// sandbox's token is refused, 401, and wakes nothing). None: the sandbox is not there for
/// the proxy (not paused, not auto-resumed, or gone).
async fn auto_resume(
    st: &E2b,
    who: &Principal,
    id: &SandboxId,
    t: &Target,
    req: Request,
) -> Result<Option<Live>, Box<Response>> {
    let boxed = |e: E2bError| Box::new(e.into_response());
    let Some(facts) = st.facts(id).await.map_err(boxed)? else {
        return Ok(None);
    };
    let opts = super::options::Options::parse(&facts.options);
    let Ok(sandbox) = st.manager.sandbox(who, id) else {
        return Ok(None);
    };
    // One with an idle sleep (`[e2b] idle_pause_secs`) wakes for a request as autoResume
    // does, keeping its deadline.
    let sleeps = match sandbox.info() {
        Ok(info) if info.state == rampart_types::SandboxState::Paused => {
            info.idle_pause_secs.is_some()
        }
        _ => return Ok(None),
    };
    if !opts.auto_resume && !sleeps {
        return Ok(None);
    }
    // Authorize first, then wake.
    may_wake(&req, t, &facts, &opts)?;
    if !opts.auto_resume {
        sandbox.wake().await.map_err(|e| boxed(e.into()))?;
        return st.live(who, id).await.map_err(boxed);
    }
    match sandbox.resume().await {
        Ok(_) => {
            tracing::info!(id = %id, "auto-resumed by a request");
            let secs = opts
                .timeout
                .unwrap_or(super::options::DEFAULT_TIMEOUT_SECS)
                .max(1);
            sandbox
                .set_timeout(secs)
                .await
                .map_err(|e| boxed(e.into()))?;
        }
        // Another request resumed it first.
        Err(CoreError::WrongState { .. }) | Err(CoreError::Conflict(_)) => {}
        Err(e) => return Err(boxed(e.into())),
    }
    st.live(who, id).await.map_err(boxed)
}

/// A request for a sandbox found live.
async fn to_live(
    st: &E2b,
    who: &Principal,
    id: &SandboxId,
    t: Target,
    live: Live,
    mut req: Request,
) -> Response {
    if t.port != ENVD_PORT {
        return to_port(st, who, id, t, live, req).await;
    }
    if let Err(r) = authorize(&req, &live.facts) {
        return *r;
    }
    // No credential of the daemon's reaches the agent, which runs inside the sandbox.
    crate::ports::strip_credentials(&st.creds, &mut req).await;
    // Core records, holds for approval and refuses what it cannot read, on its road.
    match forward(st, who, id, req).await {
        Ok(r) => cut_when_broken(r, id),
        Err(e) => {
            // The sandbox may have ended while the request was on its way.
            if st.still_running(who, id) {
                port_closed_502(&t.id, t.port, &e)
            } else {
                not_found_502(&t.id)
            }
        }
    }
}

/// A streamed Connect answer (commands, watches) whose connection to the agent breaks off
/// (the sandbox was killed, or ended, while it ran) is cut, not ended: the client sees its
/// connection to the sandbox dropped mid-stream, as when an E2B sandbox's VM goes away, and
/// both SDKs then probe the sandbox's health (502 "not found": it is gone) and raise their
/// "killed or reached its end of life" error (Python's `SandboxNotRunningException`, the JS
/// SDK's `TimeoutError`). An end-of-stream `unavailable` error would reach the same error in
/// Python only: the JS SDK maps it to its "likely due to sandbox timeout" error without a
/// probe. Other answers pass as they are.
fn cut_when_broken(resp: Response, id: &SandboxId) -> Response {
    let streamed = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("application/connect+"));
    if !streamed {
        return resp;
    }
    use futures::StreamExt as _;
    let id = id.clone();
    let (parts, body) = resp.into_parts();
    let s = body.into_data_stream().inspect(move |item| {
        if let Err(e) = item {
            tracing::debug!(sandbox = %id, "envd stream broke off, cutting it: {e}");
        }
    });
    Response::from_parts(parts, Body::from_stream(s))
}

/// Authorizes a request for a port other than envd's: the sandbox's token in
/// `X-Access-Token` (as `run_code` sends it) or in `E2B-Traffic-Access-Token` (as every
/// code-interpreter call sends the `trafficAccessToken` of create/connect, which is the same
/// token). Without it: 403, as E2B's proxy answers for a private sandbox's port (envd's
/// own port answers 401, as envd does).
fn authorize_port(req: &Request, facts: &E2bSandbox) -> Result<(), Box<Response>> {
    let ok = ["x-access-token", "e2b-traffic-access-token"]
        .iter()
        .filter_map(|h| req.headers().get(*h))
        .any(|v| same_secret(v.as_bytes(), facts.access_token.as_bytes()));
    if ok {
        Ok(())
    } else {
        Err(Box::new(envd_error(
            StatusCode::FORBIDDEN,
            "the sandbox's port is private: send its traffic access token \
             (e2b-traffic-access-token)",
        )))
    }
}

/// A request for another port (the code interpreter's 49999, or any server in the sandbox):
/// sent over a tunnel through the agent to `127.0.0.1:{port}` inside the sandbox, the answer
/// streamed back. Nothing listening there answers 502 "port is not open".
async fn to_port(
    st: &E2b,
    who: &Principal,
    id: &SandboxId,
    t: Target,
    live: Live,
    mut req: Request,
) -> Response {
    let opts = super::options::Options::parse(&live.facts.options);
    // `allowPublicTraffic`: every port but envd's and the code interpreter's answers
    // without the token.
    if !opts.is_public(t.port) {
        if let Err(r) = authorize_port(&req, &live.facts) {
            return *r;
        }
    }
    // Nor any other credential of the daemon's (another sandbox's token, an E2B key).
    crate::ports::strip_credentials(&st.creds, &mut req).await;
    let tunnel = match st.manager.sandbox(who, id) {
        Ok(s) => s.tunnel(t.port).await,
        Err(e) => Err(e),
    };
    let up = match tunnel {
        Ok(up) => up,
        Err(e) => {
            return if st.still_running(who, id) {
                let why = match &e {
                    CoreError::Agent(AgentError::Rpc { message, .. }) => message.clone(),
                    other => other.to_string(),
                };
                let why = if t.port == JUPYTER_PORT && why == "port is not open" {
                    "nothing listens on it; the code interpreter runs in sandboxes of the \
                     code-interpreter-v1 template"
                        .to_owned()
                } else {
                    why
                };
                port_closed_502(&t.id, t.port, &why)
            } else {
                not_found_502(&t.id)
            };
        }
    };
    // `maskRequestHost`: the Host the server inside sees (`${PORT}` is the port).
    let host = opts.host_for(t.port);
    // `httpsPorts`: the server speaks TLS; the hop to it is TLS too.
    let tls = opts.https_ports.contains(&t.port);
    match crate::proxy::forward_over(up, t.port, req, &PRIVATE, host.as_deref(), tls).await {
        Ok(r) => r,
        Err(e) => port_closed_502(&t.id, t.port, &e),
    }
}

/// The proxy's own headers (routing, credentials), never forwarded either way.
const PRIVATE: [&str; 5] = [
    "x-access-token",
    "e2b-sandbox-id",
    "e2b-sandbox-port",
    "e2b-traffic-access-token",
    "x-api-key",
];

/// Removes the headers that belong to one hop, or to the proxy.
fn strip(headers: &mut HeaderMap) {
    crate::proxy::strip(headers, &PRIVATE);
}

/// Sends `req` through core's envd road to the sandbox's agent and streams the answer
/// back. Hop-by-hop headers (an upgrade too) and the proxy's own go neither way.
async fn forward(
    st: &E2b,
    who: &Principal,
    id: &SandboxId,
    req: Request,
) -> Result<Response, String> {
    let (mut parts, body) = req.into_parts();
    strip(&mut parts.headers);
    parts
        .headers
        .insert(header::HOST, HeaderValue::from_static("localhost"));
    crate::proxy::origin_form(&mut parts)?;
    let sandbox = st.manager.sandbox(who, id).map_err(|e| e.to_string())?;
    let resp = sandbox
        .envd(Request::from_parts(parts, body))
        .await
        .map_err(|e| e.to_string())?;
    let (mut parts, body) = resp.into_parts();
    strip(&mut parts.headers);
    Ok(Response::from_parts(parts, Body::new(body)))
}

/// `GET`/`POST /files` without routing headers: a signed download/upload URL as built from
/// `E2B_SANDBOX_URL`. The sandbox is the one whose token makes the signature valid.
pub(crate) async fn signed_files(
    State(st): State<E2b>,
    crate::caller::Caller(who): crate::caller::Caller,
    req: Request,
) -> Response {
    let Some(op) = file_op(&req) else {
        return envd_error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed");
    };
    let s = signed_of(req.uri().query());
    if s.signature.is_none() {
        return envd_error(
            StatusCode::UNAUTHORIZED,
            "a /files request needs the E2b-Sandbox-Id header or a signed URL",
        );
    }
    let alive = match st.manager.list(&who, None, &Default::default()) {
        Ok(l) => l,
        Err(e) => return E2bError::from(e).into_response(),
    };
    let mut expired = false;
    for info in alive {
        let Ok(Some(live)) = st.live(&who, &info.id).await else {
            continue;
        };
        match check_signature(&s, op, &live.facts.access_token) {
            Ok(()) => {
                let t = Target {
                    id: info.id.as_str().to_owned(),
                    port: ENVD_PORT,
                };
                return to_live(&st, &who, &info.id, t, live, req).await;
            }
            Err(m) if m != UNAUTHORIZED => expired = true,
            Err(_) => {}
        }
    }
    if expired {
        envd_error(StatusCode::UNAUTHORIZED, "signature is already expired")
    } else {
        envd_error(StatusCode::UNAUTHORIZED, UNAUTHORIZED)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_come_from_headers_or_host() {
        let req = |pairs: &[(&'static str, &'static str)]| {
            let mut r = Request::new(Body::empty());
            for (k, v) in pairs {
                r.headers_mut().insert(*k, HeaderValue::from_static(v));
            }
            r
        };
        let d = "sbx.example.com";
        assert_eq!(target_of(&req(&[("host", "127.0.0.1:3000")]), d), None);
        let want = Some(Target {
            id: "abc123".into(),
            port: 49983,
        });
        assert_eq!(
            target_of(&req(&[("host", "49983-abc123.sbx.example.com")]), d),
            want
        );
        assert_eq!(
            target_of(&req(&[("host", "49983-abc123.sbx.example.com:8443")]), d),
            want
        );
        // Another domain's name is not the daemon's to serve.
        assert_eq!(
            target_of(&req(&[("host", "49983-abc123.other.example")]), d),
            None
        );
        assert_eq!(
            target_of(&req(&[("host", "49983-abc123.x.sbx.example.com")]), d),
            None
        );
        assert_eq!(
            target_of(&req(&[("host", "49983-ABC.sbx.example.com")]), d),
            Some(Target {
                id: "abc".into(),
                port: 49983
            })
        );
        assert_eq!(
            target_of(
                &req(&[
                    ("host", "127.0.0.1:3000"),
                    ("e2b-sandbox-id", "xyz"),
                    ("e2b-sandbox-port", "49999"),
                ]),
                d
            ),
            Some(Target {
                id: "xyz".into(),
                port: 49999
            })
        );
    }

    #[test]
    fn signatures_match_the_sdk() {
        // As computed by e2b/sandbox/signature.py for these inputs.
        let s = signature("/home/user/a.txt", "read", "", "tok", None);
        assert!(s.starts_with("v1_") && !s.ends_with('='));
        let q = format!(
            "path=%2Fhome%2Fuser%2Fa.txt&signature={}",
            s.replace('+', "%2B").replace('/', "%2F")
        );
        assert!(check_signature(&signed_of(Some(&q)), "read", "tok").is_ok());
        assert_eq!(
            check_signature(&signed_of(Some(&q)), "write", "tok"),
            Err(UNAUTHORIZED)
        );
        let old = signature("/a", "read", "", "tok", Some(1));
        let q = format!(
            "path=%2Fa&signature={}&signature_expiration=1",
            old.replace('+', "%2B").replace('/', "%2F")
        );
        assert_eq!(
            check_signature(&signed_of(Some(&q)), "read", "tok"),
            Err("signature is already expired")
        );
    }
}
