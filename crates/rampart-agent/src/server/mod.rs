//! The agent's HTTP server: routing, Connect plumbing, PID 1 duties.

pub mod creds;
pub mod files;
pub mod fs;
pub mod process;
pub mod tunnel;
pub mod users;
pub mod watch;

use crate::connect::{self, Code, RpcError};
use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::ffi::OsString;
use std::io::Read as _;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::mpsc;

/// Crate version, served in `GET /info` and the `x-rampart-agent-version` header.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Largest unary request body.
const MAX_UNARY: usize = 16 << 20;

/// Agent configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// User for requests that name none.
    pub default_user: String,
    /// Working directory of processes that name none (None: the user's home).
    pub default_cwd: Option<String>,
    /// Environment every child starts from (the agent's, without `RAMPART_*`).
    pub base_env: Vec<(OsString, OsString)>,
}

/// Shared state of the agent.
#[derive(Debug)]
pub struct State {
    /// Configuration.
    pub config: Config,
    /// Supervised processes.
    pub procs: Arc<process::Table>,
    /// Polling watchers.
    pub watchers: watch::Watchers,
}

/// A response body: whole, from a channel, or a file read in chunks.
#[derive(Debug)]
pub enum Body {
    /// A complete body.
    Full(Option<Bytes>),
    /// Chunks produced by a task; flushed as they come.
    Channel(mpsc::Receiver<Bytes>),
    /// A file, read in chunks of up to 64 KiB.
    File {
        /// The open file.
        file: std::fs::File,
        /// Bytes still to send.
        remaining: u64,
    },
    /// A file whose size is not known in advance (procfs and sysfs files report 0), read in
    /// chunks of up to 64 KiB until end of file, as `cat` reads it.
    FileToEof(std::fs::File),
}

impl hyper::body::Body for Body {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        match self.get_mut() {
            Body::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            Body::Channel(rx) => rx.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b)))),
            Body::File { file, remaining } => {
                if *remaining == 0 {
                    return Poll::Ready(None);
                }
                let n = (*remaining).min(64 * 1024) as usize;
                let mut buf = BytesMut::zeroed(n);
                match file.read(&mut buf) {
                    Ok(0) => Poll::Ready(Some(Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "file shrank while being read",
                    )))),
                    Ok(k) => {
                        *remaining -= k as u64;
                        buf.truncate(k);
                        Poll::Ready(Some(Ok(Frame::data(buf.freeze()))))
                    }
                    Err(e) => Poll::Ready(Some(Err(e))),
                }
            }
            Body::FileToEof(file) => {
                let mut buf = BytesMut::zeroed(64 * 1024);
                match file.read(&mut buf) {
                    Ok(0) => Poll::Ready(None),
                    Ok(k) => {
                        buf.truncate(k);
                        Poll::Ready(Some(Ok(Frame::data(buf.freeze()))))
                    }
                    Err(e) => Poll::Ready(Some(Err(e))),
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Body::Full(b) => b.is_none(),
            Body::Channel(_) | Body::FileToEof(_) => false,
            Body::File { remaining, .. } => *remaining == 0,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Body::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            Body::Channel(_) | Body::FileToEof(_) => SizeHint::default(),
            Body::File { remaining, .. } => SizeHint::with_exact(*remaining),
        }
    }
}

/// A response with a whole body.
pub fn full(status: u16, content_type: &'static str, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(Body::Full(Some(body.into())));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

/// A 200 JSON response.
pub fn json<T: Serialize>(v: &T) -> Response<Body> {
    match serde_json::to_vec(v) {
        Ok(b) => full(200, "application/json", b),
        Err(e) => rpc_error(&RpcError::new(Code::Internal, e.to_string())),
    }
}

/// A unary Connect error.
pub fn rpc_error(e: &RpcError) -> Response<Body> {
    full(e.code.http_status(), "application/json", e.to_json())
}

/// An error of the plain HTTP endpoints: `{"code":<status>,"message":"…"}`.
pub fn http_error(status: u16, message: &str) -> Response<Body> {
    let body = serde_json::json!({ "code": status, "message": message });
    full(status, "application/json", body.to_string())
}

/// A server-streaming response fed by `rx` (already-encoded envelopes).
pub fn stream_response(rx: mpsc::Receiver<Bytes>) -> Response<Body> {
    let mut r = Response::new(Body::Channel(rx));
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/connect+json"),
    );
    r
}

/// A server stream that fails at once: 200 + an end-of-stream envelope with the error.
pub fn stream_error(e: &RpcError) -> Response<Body> {
    full(
        200,
        "application/connect+json",
        connect::end_envelope(Some(e)),
    )
}

/// Per-request facts from the headers.
#[derive(Debug, Clone)]
pub struct Ctx {
    /// User from `Authorization: Basic base64("<user>:")`.
    pub user: Option<String>,
    /// `connect-timeout-ms`.
    pub timeout: Option<Duration>,
    /// `keepalive-ping-interval` (seconds; default 90).
    pub keepalive: Duration,
}

fn ctx_of(req: &Request<Incoming>) -> Result<Ctx, RpcError> {
    ctx_of_headers(req.headers())
}

/// The per-request facts of a request's headers (public for the fuzz targets).
#[doc(hidden)]
pub fn ctx_of_headers(h: &hyper::HeaderMap) -> Result<Ctx, RpcError> {
    let user = match h.get(hyper::header::AUTHORIZATION) {
        None => None,
        Some(v) => {
            let v = v.to_str().unwrap_or_default().trim();
            let b64 = v
                .strip_prefix("Basic ")
                .or_else(|| v.strip_prefix("basic "))
                .ok_or_else(|| {
                    RpcError::new(Code::Unauthenticated, "unsupported authorization scheme")
                })?;
            use base64::Engine as _;
            let raw = base64::engine::general_purpose::STANDARD
                .decode(b64.trim())
                .map_err(|_| {
                    RpcError::new(Code::Unauthenticated, "malformed basic authorization")
                })?;
            let s = String::from_utf8(raw).map_err(|_| {
                RpcError::new(Code::Unauthenticated, "malformed basic authorization")
            })?;
            Some(s.split(':').next().unwrap_or_default().to_string())
        }
    };
    let num = |name: &str| {
        h.get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    let timeout = num("connect-timeout-ms")
        .filter(|&t| t > 0)
        .map(Duration::from_millis);
    let keepalive = Duration::from_secs(
        num("keepalive-ping-interval")
            .filter(|&t| t > 0)
            .unwrap_or(90),
    );
    Ok(Ctx {
        user,
        timeout,
        keepalive,
    })
}

/// Serve one HTTP request.
pub async fn handle(
    state: Arc<State>,
    req: Request<Incoming>,
) -> Result<Response<Body>, std::convert::Infallible> {
    let mut resp = route(state, req).await;
    resp.headers_mut()
        .insert("x-rampart-agent-version", HeaderValue::from_static(VERSION));
    Ok(resp)
}

async fn route(state: Arc<State>, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_string();
    match (req.method(), path.as_str()) {
        (&Method::GET, "/health") | (&Method::HEAD, "/health") => {
            let mut r = Response::new(Body::Full(None));
            *r.status_mut() = StatusCode::NO_CONTENT;
            r
        }
        (&Method::GET, "/info") => json(&crate::proto::AgentInfo {
            version: VERSION.into(),
            protocol: crate::proto::PROTOCOL_VERSION,
        }),
        (&Method::GET, "/files") => files::download(&state, req).await,
        (&Method::POST, "/files") => files::upload(&state, req).await,
        (_, p) if p.starts_with(tunnel::PREFIX) => {
            let rest = p[tunnel::PREFIX.len()..].to_string();
            tunnel::tunnel(req, &rest).await
        }
        (&Method::POST, p)
            if p.starts_with("/process.Process/") || p.starts_with("/filesystem.Filesystem/") =>
        {
            rpc(state, req, p.to_string()).await
        }
        (_, "/health" | "/info" | "/files") => http_error(405, "method not allowed"),
        _ => http_error(404, &format!("no such endpoint: {path}")),
    }
}

fn content_type(req: &Request<Incoming>) -> String {
    req.headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_ascii_lowercase()
}

/// Read a whole (small) request body.
pub async fn read_body(body: Incoming, limit: usize) -> Result<Bytes, RpcError> {
    let limited = http_body_util::Limited::new(body, limit);
    match limited.collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) => {
            if e.is::<http_body_util::LengthLimitError>() {
                Err(RpcError::new(
                    Code::ResourceExhausted,
                    "request body too large",
                ))
            } else {
                Err(RpcError::new(
                    Code::InvalidArgument,
                    format!("reading request body: {e}"),
                ))
            }
        }
    }
}

fn parse<T: DeserializeOwned>(b: &[u8]) -> Result<T, RpcError> {
    connect::decode_json(b)
}

/// Read the single enveloped message of a server-streaming request.
async fn read_stream_request<T: DeserializeOwned>(body: Incoming) -> Result<T, RpcError> {
    let raw = read_body(body, connect::MAX_ENVELOPE + 5).await?;
    connect::decode_stream_request(&raw)
}

const SERVER_STREAMS: [&str; 3] = [
    "/process.Process/Start",
    "/process.Process/Connect",
    "/filesystem.Filesystem/WatchDir",
];

async fn rpc(state: Arc<State>, req: Request<Incoming>, path: String) -> Response<Body> {
    let ct = content_type(&req);
    let base_ct = ct.split(';').next().unwrap_or_default().trim().to_string();
    let streaming =
        SERVER_STREAMS.contains(&path.as_str()) || path == "/process.Process/StreamInput";
    let bad_encoding = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| !v.trim().eq_ignore_ascii_case("identity"))
    };
    if streaming {
        if base_ct != "application/connect+json" {
            return full(
                415,
                "application/json",
                RpcError::new(
                    Code::InvalidArgument,
                    format!("unsupported content-type {ct:?}"),
                )
                .to_json(),
            );
        }
        if bad_encoding("connect-content-encoding") {
            return stream_error(&RpcError::new(
                Code::Unimplemented,
                "only identity encoding is supported",
            ));
        }
    } else {
        if base_ct != "application/json" {
            return full(
                415,
                "application/json",
                RpcError::new(
                    Code::InvalidArgument,
                    format!("unsupported content-type {ct:?}"),
                )
                .to_json(),
            );
        }
        if bad_encoding("content-encoding") {
            return rpc_error(&RpcError::new(
                Code::Unimplemented,
                "only identity encoding is supported",
            ));
        }
    }
    let ctx = match ctx_of(&req) {
        Ok(c) => c,
        Err(e) if streaming => return stream_error(&e),
        Err(e) => return rpc_error(&e),
    };
    let body = req.into_body();
    if path == "/process.Process/StreamInput" {
        return process::stream_input(&state, body).await;
    }
    if SERVER_STREAMS.contains(&path.as_str()) {
        let r = match path.as_str() {
            "/process.Process/Start" => match read_stream_request(body).await {
                Ok(m) => process::start(&state, &ctx, m),
                Err(e) => Err(e),
            },
            "/process.Process/Connect" => match read_stream_request(body).await {
                Ok(m) => process::connect(&state, &ctx, m),
                Err(e) => Err(e),
            },
            _ => match read_stream_request(body).await {
                Ok(m) => watch::watch_dir(&state, &ctx, m).await,
                Err(e) => Err(e),
            },
        };
        return r.unwrap_or_else(|e| stream_error(&e));
    }
    let raw = match read_body(body, MAX_UNARY).await {
        Ok(b) => b,
        Err(e) => return rpc_error(&e),
    };
    let result = unary(&state, &ctx, &path, &raw).await;
    result.unwrap_or_else(|e| rpc_error(&e))
}

async fn unary(
    state: &Arc<State>,
    ctx: &Ctx,
    path: &str,
    raw: &[u8],
) -> Result<Response<Body>, RpcError> {
    use crate::proto::*;
    Ok(match path {
        "/process.Process/List" => json(&state.procs.list()),
        "/process.Process/SendInput" => {
            json(&process::send_input(state, parse::<SendInputRequest>(raw)?).await?)
        }
        "/process.Process/CloseStdin" => {
            json(&process::close_stdin(state, parse::<SelectorRequest>(raw)?).await?)
        }
        "/process.Process/SendSignal" => json(&process::send_signal(
            state,
            parse::<SendSignalRequest>(raw)?,
        )?),
        "/process.Process/Update" => json(&process::update(state, parse::<UpdateRequest>(raw)?)?),
        "/filesystem.Filesystem/Stat" => {
            json(&fs::stat(state, ctx, parse::<PathRequest>(raw)?).await?)
        }
        "/filesystem.Filesystem/MakeDir" => {
            json(&fs::make_dir(state, ctx, parse::<PathRequest>(raw)?).await?)
        }
        "/filesystem.Filesystem/Move" => {
            json(&fs::rename(state, ctx, parse::<MoveRequest>(raw)?).await?)
        }
        "/filesystem.Filesystem/ListDir" => {
            json(&fs::list_dir(state, ctx, parse::<ListDirRequest>(raw)?).await?)
        }
        "/filesystem.Filesystem/Remove" => {
            json(&fs::remove(state, ctx, parse::<PathRequest>(raw)?).await?)
        }
        "/filesystem.Filesystem/CreateWatcher" => {
            json(&watch::create_watcher(state, ctx, parse::<WatchRequest>(raw)?).await?)
        }
        "/filesystem.Filesystem/GetWatcherEvents" => {
            json(&watch::get_watcher_events(state, parse::<WatcherId>(raw)?)?)
        }
        "/filesystem.Filesystem/RemoveWatcher" => {
            json(&watch::remove_watcher(state, parse::<WatcherId>(raw)?)?)
        }
        _ => {
            let e = RpcError::new(Code::Unimplemented, format!("unknown procedure {path}"));
            return Ok(full(404, "application/json", e.to_json()));
        }
    })
}

/// Spawn a task that feeds a server stream; returns the response.
pub fn spawn_stream<F, Fut>(f: F) -> Response<Body>
where
    F: FnOnce(mpsc::Sender<Bytes>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = mpsc::channel(8);
    tokio::spawn(f(tx));
    stream_response(rx)
}

/// Serve connections on `listener` until the process ends.
///
/// Its connections are its own: when this future is dropped (the agent lets go of its
/// socket for a checkpoint), every connection closes with it.
pub async fn serve(listener: tokio::net::UnixListener, state: Arc<State>) {
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
        };
        let stream = match accepted {
            Ok((s, _)) => s,
            Err(e) => {
                eprintln!("rampart-agent: accept: {e}");
                // Out of fds or similar: let other tasks make progress before retrying.
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let state = state.clone();
        conns.spawn(async move {
            let svc = hyper::service::service_fn(move |req| handle(state.clone(), req));
            let io = hyper_util::rt::TokioIo::new(stream);
            let _ = hyper::server::conn::http1::Builder::new()
                .keep_alive(true)
                .serve_connection(io, svc)
                .with_upgrades()
                .await;
        });
    }
}

/// Resolve a path of a request: absolute, or relative to `home`; cleaned lexically.
pub fn resolve_path(path: &str, home: &str) -> std::path::PathBuf {
    use std::path::{Component, PathBuf};
    let joined = if path.starts_with('/') {
        PathBuf::from(path)
    } else if let Some(rest) = path.strip_prefix("~/") {
        // `~//x` is `~/x`: a rest that starts with `/` must not replace the home.
        PathBuf::from(home).join(rest.trim_start_matches('/'))
    } else if path == "~" {
        PathBuf::from(home)
    } else {
        PathBuf::from(home).join(path)
    };
    let mut out = PathBuf::from("/");
    for c in joined.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_resolve() {
        assert_eq!(
            resolve_path("a/b", "/home/user"),
            std::path::Path::new("/home/user/a/b")
        );
        assert_eq!(
            resolve_path("/x/../y/./z", "/h"),
            std::path::Path::new("/y/z")
        );
        assert_eq!(resolve_path("", "/h"), std::path::Path::new("/h"));
        assert_eq!(resolve_path("../../..", "/h"), std::path::Path::new("/"));
        assert_eq!(resolve_path("~/f", "/h"), std::path::Path::new("/h/f"));
        assert_eq!(resolve_path("~//etc", "/h"), std::path::Path::new("/h/etc"));
    }
}
