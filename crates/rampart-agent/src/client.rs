//! Host-side client of the agent, over its Unix socket.
//!
//! CONTRACT (used by rampart-core; keep these signatures).
//!
//! Connections are kept for reuse: a call takes an idle HTTP/1.1 connection to the agent (or
//! opens one), drives it in the caller's own task while the answer is read (no connection
//! task, no cross-thread hand-off), and gives it back once the answer has been read to its
//! end. An answer dropped half-read closes its connection. A pooled connection that turns out
//! dead before the request was written is replaced by a new one transparently. The client is
//! `Clone` and cheap; clones share the pool.

use crate::connect::{self, Code};
use crate::proto;
use bytes::{Bytes, BytesMut};
use futures::stream::BoxStream;
use futures::StreamExt as _;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt as _, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use hyper::{Request, Response};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::BTreeMap;
use std::future::Future as _;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

/// Errors talking to an agent.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Could not reach the agent's socket (the sandbox is gone or not started).
    #[error("agent unreachable: {0}")]
    Unreachable(String),
    /// The agent answered with a Connect/HTTP error.
    #[error("{code}: {message}")]
    Rpc {
        /// Connect code string: `not_found`, `invalid_argument`, `already_exists`,
        /// `unauthenticated`, `resource_exhausted`, `deadline_exceeded`, `internal`, ...
        code: String,
        /// The agent's message.
        message: String,
    },
    /// The agent's answer could not be decoded.
    #[error("bad answer from agent: {0}")]
    Protocol(String),
}

/// How to start a process.
#[derive(Debug, Clone, Default)]
pub struct StartOptions {
    /// Program (looked up in PATH).
    pub cmd: String,
    /// Arguments after the program.
    pub args: Vec<String>,
    /// Extra environment.
    pub envs: BTreeMap<String, String>,
    /// Working directory (user's home when None).
    pub cwd: Option<String>,
    /// User name (`user` when None).
    pub user: Option<String>,
    /// Keep stdin open for [`AgentClient::send_stdin`].
    pub stdin: bool,
    /// Run under a PTY of (cols, rows).
    pub pty: Option<(u16, u16)>,
    /// Tag to find the process again by.
    pub tag: Option<String>,
    /// Process lifetime: the agent kills it when this elapses (sent as connect-timeout-ms).
    pub timeout: Option<Duration>,
}

/// One event of a process's output stream.
#[derive(Debug, Clone, PartialEq)]
pub enum ProcessEvent {
    /// Started, with its pid inside the sandbox.
    Start {
        /// Pid.
        pid: u32,
    },
    /// Stdout bytes.
    Stdout(Bytes),
    /// Stderr bytes.
    Stderr(Bytes),
    /// PTY bytes.
    Pty(Bytes),
    /// Ended. When the agent killed the process at its deadline (`StartOptions::timeout`),
    /// the stream yields `Err(ClientError::Rpc { code: "deadline_exceeded", .. })` right after.
    End {
        /// Exit code (-1 when killed by a signal, as envd reports it; see `status`).
        exit_code: i32,
        /// Whether it exited normally.
        exited: bool,
        /// e.g. "exit status 1", "signal: killed".
        status: String,
        /// Error text if the agent reported one.
        error: Option<String>,
    },
}

/// Kind of a filesystem entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// Regular file.
    File,
    /// Directory.
    Directory,
    /// Symbolic link (only when its target does not resolve).
    Symlink,
    /// Anything else.
    Other,
}

/// A filesystem entry as the agent reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct EntryInfo {
    /// Base name.
    pub name: String,
    /// Kind (of the target, for a symlink that resolves).
    pub kind: FileKind,
    /// Absolute path inside the sandbox.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    /// `ls -l` style permissions.
    pub permissions: String,
    /// Owner name.
    pub owner: String,
    /// Group name.
    pub group: String,
    /// Modification time, RFC 3339.
    pub modified_time: String,
    /// Symlink target if the entry is a symlink.
    pub symlink_target: Option<String>,
}

/// A filesystem change seen by a watch.
#[derive(Debug, Clone, PartialEq)]
pub struct FsEvent {
    /// Path relative to the watched directory, e.g. `nested/file.txt`.
    pub name: String,
    /// `create`, `write`, `remove`, `rename` or `chmod`.
    pub kind: String,
}

/// Client of one agent.
#[derive(Debug, Clone)]
pub struct AgentClient {
    socket: PathBuf,
    pool: Arc<Pool>,
}

type ReqBody = UnsyncBoxBody<Bytes, std::io::Error>;
type Conn = hyper::client::conn::http1::Connection<
    hyper_util::rt::TokioIo<tokio::net::UnixStream>,
    ReqBody,
>;

/// Most idle connections kept per agent.
const MAX_IDLE: usize = 8;

/// One HTTP/1.1 connection to the agent: its request handle and the connection itself, which
/// whoever holds the lease polls (`None` once it has ended).
struct Lease {
    sender: hyper::client::conn::http1::SendRequest<ReqBody>,
    conn: Option<Pin<Box<Conn>>>,
}

impl Lease {
    /// Drive the connection; `false` once it has ended.
    fn drive(&mut self, cx: &mut Context<'_>) -> bool {
        if let Some(c) = self.conn.as_mut() {
            if c.as_mut().poll(cx).is_ready() {
                self.conn = None;
            }
        }
        self.conn.is_some()
    }
}

/// Idle connections to one agent.
#[derive(Default)]
struct Pool {
    idle: Mutex<Vec<Lease>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.idle.lock().map_or(0, |v| v.len());
        f.debug_struct("Pool").field("idle", &n).finish()
    }
}

impl Pool {
    fn take(&self) -> Option<Lease> {
        self.idle.lock().ok()?.pop()
    }
    fn put(&self, lease: Lease) {
        if lease.conn.is_none() {
            return;
        }
        if let Ok(mut idle) = self.idle.lock() {
            if idle.len() < MAX_IDLE {
                idle.push(lease);
            }
        }
    }
}

/// The body of an answer from the agent. It drives its connection while it is read and hands
/// the connection back to the pool once read to the end; dropped half-read, it closes it.
pub struct Driven {
    body: Incoming,
    lease: Option<Lease>,
    pool: Arc<Pool>,
}

impl hyper::body::Body for Driven {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        if let Some(l) = this.lease.as_mut() {
            l.drive(cx);
        }
        let r = Pin::new(&mut this.body).poll_frame(cx);
        if let Poll::Ready(None) = r {
            if let Some(l) = this.lease.take() {
                this.pool.put(l);
            }
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

impl std::fmt::Debug for Driven {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driven")
            .field("pooled", &self.lease.is_some())
            .finish_non_exhaustive()
    }
}

impl Drop for Driven {
    fn drop(&mut self) {
        // Reusable only when the answer was read whole; otherwise dropping closes it.
        if let Some(l) = self.lease.take() {
            if hyper::body::Body::is_end_stream(&self.body) {
                self.pool.put(l);
            }
        }
    }
}

/// Whether a request asks for a protocol upgrade: an `Upgrade` header and `upgrade` among
/// the `Connection` tokens.
fn is_upgrade(headers: &hyper::HeaderMap) -> bool {
    headers.contains_key(hyper::header::UPGRADE)
        && headers
            .get_all(hyper::header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

fn full_body(b: impl Into<Bytes>) -> ReqBody {
    Full::new(b.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// Percent-encode a query value (everything but unreserved characters).
fn enc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'/') {
            o.push(b as char);
        } else {
            o.push_str(&format!("%{b:02X}"));
        }
    }
    o
}

fn files_uri(path: &str, user: Option<&str>) -> String {
    let mut u = format!("/files?path={}", enc(path));
    if let Some(user) = user {
        u.push_str("&username=");
        u.push_str(&enc(user));
    }
    u
}

fn basic(user: &str) -> Option<HeaderValue> {
    use base64::Engine as _;
    let v = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:"))
    );
    HeaderValue::from_str(&v).ok()
}

/// Build the error of a non-200 answer from its body.
fn error_from(status: u16, body: &[u8]) -> ClientError {
    #[derive(serde::Deserialize)]
    struct E {
        code: serde_json::Value,
        #[serde(default)]
        message: String,
    }
    if let Ok(e) = serde_json::from_slice::<E>(body) {
        let code = match e.code {
            serde_json::Value::String(s) => s,
            serde_json::Value::Number(n) => Code::from_http_status(
                n.as_u64()
                    .and_then(|n| u16::try_from(n).ok())
                    .unwrap_or(status),
            )
            .as_str()
            .to_string(),
            _ => Code::from_http_status(status).as_str().to_string(),
        };
        return ClientError::Rpc {
            code,
            message: e.message,
        };
    }
    ClientError::Rpc {
        code: Code::from_http_status(status).as_str().to_string(),
        message: String::from_utf8_lossy(body).into_owned(),
    }
}

fn entry(e: proto::EntryInfo) -> EntryInfo {
    let kind = match e.file_type {
        proto::FileType::File => FileKind::File,
        proto::FileType::Directory => FileKind::Directory,
        proto::FileType::Symlink => FileKind::Symlink,
        proto::FileType::Unspecified if e.is_symlink || e.symlink_target.is_some() => {
            FileKind::Symlink
        }
        proto::FileType::Unspecified => FileKind::Other,
    };
    EntryInfo {
        name: e.name,
        kind,
        path: e.path,
        size: u64::try_from(e.size).unwrap_or(0),
        mode: e.mode,
        permissions: e.permissions,
        owner: e.owner,
        group: e.group,
        modified_time: e.modified_time.unwrap_or_default(),
        symlink_target: e.symlink_target,
    }
}

fn proc_event(ev: proto::ProcessEvent) -> Option<ProcessEvent> {
    if let Some(s) = ev.start {
        return Some(ProcessEvent::Start { pid: s.pid });
    }
    if let Some(d) = ev.data {
        if let Some(b) = d.stdout {
            return Some(ProcessEvent::Stdout(b));
        }
        if let Some(b) = d.stderr {
            return Some(ProcessEvent::Stderr(b));
        }
        if let Some(b) = d.pty {
            return Some(ProcessEvent::Pty(b));
        }
        return None;
    }
    if let Some(e) = ev.end {
        return Some(ProcessEvent::End {
            exit_code: e.exit_code,
            exited: e.exited,
            status: e.status,
            error: e.error,
        });
    }
    None
}

/// After a stream's last message: take the rest of the body (the chunked terminator, which
/// the agent writes together with the end-of-stream envelope) so the connection goes back to
/// the pool. Never waits: what is not here already is left, and the connection is closed.
async fn finish(body: &mut Driven) {
    for _ in 0..4 {
        match futures::poll!(body.frame()) {
            Poll::Ready(Some(Ok(_))) => continue,
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) | Poll::Pending => return,
        }
    }
}

/// Messages of a server stream: payloads, then `Err` if the end-of-stream carried an error.
fn envelopes(body: Driven) -> BoxStream<'static, Result<Bytes, ClientError>> {
    struct St {
        body: Driven,
        buf: BytesMut,
        done: bool,
    }
    futures::stream::unfold(
        St {
            body,
            buf: BytesMut::new(),
            done: false,
        },
        |mut st| async move {
            if st.done {
                return None;
            }
            loop {
                match connect::take_envelope(&mut st.buf) {
                    Err(e) => {
                        st.done = true;
                        return Some((Err(ClientError::Protocol(e.to_string())), st));
                    }
                    Ok(Some((flags, payload))) => {
                        if flags & connect::FLAG_END_STREAM == 0 {
                            return Some((Ok(payload), st));
                        }
                        st.done = true;
                        finish(&mut st.body).await;
                        #[derive(serde::Deserialize)]
                        struct End {
                            error: Option<EndErr>,
                        }
                        #[derive(serde::Deserialize)]
                        struct EndErr {
                            #[serde(default)]
                            code: String,
                            #[serde(default)]
                            message: String,
                        }
                        return match serde_json::from_slice::<End>(&payload) {
                            Ok(End { error: None }) => None,
                            Ok(End { error: Some(e) }) => Some((
                                Err(ClientError::Rpc {
                                    code: e.code,
                                    message: e.message,
                                }),
                                st,
                            )),
                            Err(e) => Some((
                                Err(ClientError::Protocol(format!("bad end-of-stream: {e}"))),
                                st,
                            )),
                        };
                    }
                    Ok(None) => {}
                }
                match st.body.frame().await {
                    None => {
                        st.done = true;
                        return Some((
                            Err(ClientError::Unreachable(
                                "stream ended without end-of-stream".into(),
                            )),
                            st,
                        ));
                    }
                    Some(Err(e)) => {
                        st.done = true;
                        return Some((
                            Err(ClientError::Unreachable(format!("stream broken: {e}"))),
                            st,
                        ));
                    }
                    Some(Ok(f)) => {
                        if let Ok(d) = f.into_data() {
                            st.buf.extend_from_slice(&d);
                        }
                    }
                }
            }
        },
    )
    .boxed()
}

impl AgentClient {
    /// A client for the agent listening on `socket`. Does not connect yet.
    pub fn new(socket: PathBuf) -> Self {
        AgentClient {
            socket,
            pool: Arc::default(),
        }
    }
    /// The socket path.
    pub fn socket(&self) -> &std::path::Path {
        &self.socket
    }

    /// A new HTTP/1 connection to the agent's socket (not driven yet).
    async fn handshake(
        &self,
    ) -> Result<(hyper::client::conn::http1::SendRequest<ReqBody>, Conn), ClientError> {
        let at = rampart_types::sockpath::SocketPath::new(&self.socket)
            .map_err(|e| ClientError::Unreachable(format!("{}: {e}", self.socket.display())))?;
        let stream = tokio::net::UnixStream::connect(at.path())
            .await
            .map_err(|e| ClientError::Unreachable(format!("{}: {e}", self.socket.display())))?;
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| ClientError::Unreachable(format!("handshake: {e}")))
    }

    async fn connect_new(&self) -> Result<Lease, ClientError> {
        let (sender, conn) = self.handshake().await?;
        Ok(Lease {
            sender,
            conn: Some(Box::pin(conn)),
        })
    }

    /// Send a request on a pooled (or new) connection, driving it in this task until the
    /// answer's head arrives; the answer's body keeps driving it.
    async fn send(&self, mut req: Request<ReqBody>) -> Result<Response<Driven>, ClientError> {
        loop {
            let (mut lease, pooled) = match self.pool.take() {
                Some(l) => (l, true),
                None => (self.connect_new().await?, false),
            };
            // Ready for a request (a pooled one may have died while idle).
            let ready = futures::future::poll_fn(|cx| {
                if !lease.drive(cx) {
                    return Poll::Ready(false);
                }
                lease.sender.poll_ready(cx).map(|r| r.is_ok())
            })
            .await;
            if !ready {
                if pooled {
                    continue;
                }
                return Err(ClientError::Unreachable(
                    "the agent closed the connection".into(),
                ));
            }
            let mut answer = std::pin::pin!(lease.sender.try_send_request(req));
            let mut conn = lease.conn.take();
            let result = futures::future::poll_fn(|cx| {
                if let Some(c) = conn.as_mut() {
                    if c.as_mut().poll(cx).is_ready() {
                        conn = None;
                    }
                }
                answer.as_mut().poll(cx)
            })
            .await;
            lease.conn = conn;
            match result {
                Ok(resp) => {
                    let pool = self.pool.clone();
                    return Ok(resp.map(|body| Driven {
                        body,
                        lease: Some(lease),
                        pool,
                    }));
                }
                Err(mut e) => match e.take_message() {
                    // Never written: safe to try again on a fresh connection.
                    Some(r) if pooled => req = r,
                    _ => {
                        return Err(ClientError::Unreachable(format!(
                            "request failed: {}",
                            e.error()
                        )))
                    }
                },
            }
        }
    }

    /// Sends `req` as it is (method, URI, headers; the body streamed as it comes) and returns
    /// the agent's answer with its body streamed: for a proxy in front of the agent. Nothing
    /// is added or removed; the caller sets `Host` and strips what must not reach the agent.
    ///
    /// The request goes on a pooled connection (see the module's contract), which is reused
    /// once the answer has been read to its end, and which is driven by whoever polls first
    /// the answer, then its body (a request body still being written after the answer's head
    /// came is written as the answer's body is read). A request that asks for a protocol
    /// upgrade (`Connection: upgrade` and `Upgrade`) goes on a connection of its own, driven in
    /// a task with upgrades on, so that `hyper::upgrade::on` of a `101` answer gives the
    /// upgraded connection.
    pub async fn forward<B>(&self, req: Request<B>) -> Result<Response<Driven>, ClientError>
    where
        B: hyper::body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let req = req.map(|b| b.map_err(std::io::Error::other).boxed_unsync());
        if !is_upgrade(req.headers()) {
            return self.send(req).await;
        }
        let (mut sender, conn) = self.handshake().await?;
        tokio::spawn(async move {
            let _ = conn.with_upgrades().await;
        });
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| ClientError::Unreachable(format!("request failed: {e}")))?;
        let pool = self.pool.clone();
        Ok(resp.map(|body| Driven {
            body,
            lease: None,
            pool,
        }))
    }

    fn request(
        method: &str,
        uri: &str,
        content_type: &'static str,
        user: Option<&str>,
    ) -> hyper::http::request::Builder {
        let mut b = Request::builder()
            .method(method)
            .uri(uri)
            .header("host", "agent")
            .header(CONTENT_TYPE, content_type)
            .header("connect-protocol-version", "1");
        if let Some(v) = user.and_then(basic) {
            b = b.header(AUTHORIZATION, v);
        }
        b
    }

    async fn read_all(resp: Response<Driven>) -> Result<(u16, Bytes), ClientError> {
        let status = resp.status().as_u16();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| ClientError::Unreachable(format!("reading answer: {e}")))?
            .to_bytes();
        Ok((status, body))
    }

    async fn unary<Q: Serialize, A: DeserializeOwned>(
        &self,
        procedure: &str,
        user: Option<&str>,
        msg: &Q,
    ) -> Result<A, ClientError> {
        let body = serde_json::to_vec(msg).map_err(|e| ClientError::Protocol(e.to_string()))?;
        let req = Self::request("POST", &format!("/{procedure}"), "application/json", user)
            .body(full_body(body))
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let (status, body) = Self::read_all(self.send(req).await?).await?;
        if status != 200 {
            return Err(error_from(status, &body));
        }
        serde_json::from_slice(&body)
            .map_err(|e| ClientError::Protocol(format!("{procedure}: {e}")))
    }

    async fn server_stream<Q: Serialize>(
        &self,
        procedure: &str,
        user: Option<&str>,
        msg: &Q,
        timeout: Option<Duration>,
    ) -> Result<BoxStream<'static, Result<Bytes, ClientError>>, ClientError> {
        let mut b = Self::request(
            "POST",
            &format!("/{procedure}"),
            "application/connect+json",
            user,
        )
        .header("connect-content-encoding", "identity")
        .header("connect-accept-encoding", "identity");
        if let Some(t) = timeout {
            b = b.header("connect-timeout-ms", t.as_millis().max(1).to_string());
        }
        let req = b
            .body(full_body(connect::message_envelope(msg)))
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let resp = self.send(req).await?;
        if resp.status() != 200 {
            let (status, body) = Self::read_all(resp).await?;
            return Err(error_from(status, &body));
        }
        let ct = resp
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        if ct != "application/connect+json" {
            return Err(ClientError::Protocol(format!(
                "unexpected content-type {ct:?}"
            )));
        }
        Ok(envelopes(resp.into_body()))
    }

    /// `GET /health`; Ok when the agent answers 2xx.
    pub async fn health(&self) -> Result<(), ClientError> {
        let req = Request::get("/health")
            .header("host", "agent")
            .body(full_body(Bytes::new()))
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let (status, body) = Self::read_all(self.send(req).await?).await?;
        if (200..300).contains(&status) {
            Ok(())
        } else {
            Err(error_from(status, &body))
        }
    }

    /// `GET path`, expecting 200 and a JSON body.
    async fn get_json<T: serde::de::DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        let req = Request::get(path)
            .header("host", "agent")
            .body(full_body(Bytes::new()))
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let (status, body) = Self::read_all(self.send(req).await?).await?;
        if status != 200 {
            return Err(error_from(status, &body));
        }
        serde_json::from_slice(&body).map_err(|e| ClientError::Protocol(e.to_string()))
    }

    /// `GET /info`: the agent's crate version and protocol version.
    pub async fn info(&self) -> Result<proto::AgentInfo, ClientError> {
        self.get_json("/info").await
    }

    /// `GET /tunnel/`: the TCP ports listening inside the sandbox on an address the tunnel
    /// reaches (`127.0.0.1`, `0.0.0.0`, `::`), ascending.
    pub async fn listening_ports(&self) -> Result<Vec<u16>, ClientError> {
        #[derive(serde::Deserialize)]
        struct Listening {
            listening: Vec<u16>,
        }
        Ok(self.get_json::<Listening>("/tunnel/").await?.listening)
    }

    /// `process.Process/Start`: the returned stream yields `Start` first, then output, then `End`.
    pub async fn start(
        &self,
        opts: StartOptions,
    ) -> Result<BoxStream<'static, Result<ProcessEvent, ClientError>>, ClientError> {
        let req = proto::StartRequest {
            process: Some(proto::ProcessConfig {
                cmd: opts.cmd,
                args: opts.args,
                envs: opts.envs,
                cwd: opts.cwd,
            }),
            pty: opts.pty.map(|(cols, rows)| proto::Pty {
                size: Some(proto::PtySize {
                    cols: u32::from(cols),
                    rows: u32::from(rows),
                }),
            }),
            tag: opts.tag,
            stdin: Some(opts.stdin),
        };
        let stream = self
            .server_stream(
                "process.Process/Start",
                opts.user.as_deref(),
                &req,
                opts.timeout,
            )
            .await?;
        Self::process_events(stream).await
    }

    /// `process.Process/Connect`: reattach to a running process by pid; yields `Start` first,
    /// then live output, then `End`.
    pub async fn connect(
        &self,
        pid: u32,
    ) -> Result<BoxStream<'static, Result<ProcessEvent, ClientError>>, ClientError> {
        let req = proto::SelectorRequest {
            process: Some(proto::ProcessSelector {
                pid: Some(pid),
                tag: None,
            }),
        };
        let stream = self
            .server_stream("process.Process/Connect", None, &req, None)
            .await?;
        Self::process_events(stream).await
    }

    /// `process.Process/List`: `(pid, tag, config)` of every running process.
    pub async fn list(&self) -> Result<Vec<proto::ProcessInfo>, ClientError> {
        let r: proto::ListResponse = self
            .unary("process.Process/List", None, &proto::Empty {})
            .await?;
        Ok(r.processes)
    }

    async fn process_events(
        mut stream: BoxStream<'static, Result<Bytes, ClientError>>,
    ) -> Result<BoxStream<'static, Result<ProcessEvent, ClientError>>, ClientError> {
        // The first message must be the start event; errors before it fail the call itself.
        let first = loop {
            match stream.next().await {
                None => {
                    return Err(ClientError::Protocol(
                        "stream ended before the start event".into(),
                    ))
                }
                Some(Err(e)) => return Err(e),
                Some(Ok(p)) => {
                    let r: proto::ProcessEventResponse = serde_json::from_slice(&p)
                        .map_err(|e| ClientError::Protocol(e.to_string()))?;
                    match r.event.and_then(proc_event) {
                        Some(ev @ ProcessEvent::Start { .. }) => break ev,
                        Some(_) => {
                            return Err(ClientError::Protocol("first event is not start".into()))
                        }
                        None => continue,
                    }
                }
            }
        };
        fn event(m: Result<Bytes, ClientError>) -> Option<Result<ProcessEvent, ClientError>> {
            match m {
                Err(e) => Some(Err(e)),
                Ok(p) => match serde_json::from_slice::<proto::ProcessEventResponse>(&p) {
                    Err(e) => Some(Err(ClientError::Protocol(e.to_string()))),
                    Ok(r) => r.event.and_then(proc_event).map(Ok),
                },
            }
        }
        type Stash = Option<Result<Bytes, ClientError>>;
        let rest =
            futures::stream::unfold((stream, None::<Stash>), |(mut stream, stash)| async move {
                // What was taken after the end event, if anything (`Some(None)`: the stream ended).
                let mut next = stash;
                loop {
                    let m = match next.take() {
                        Some(m) => m?,
                        None => stream.next().await?,
                    };
                    let Some(ev) = event(m) else { continue };
                    let mut stash = None;
                    if matches!(ev, Ok(ProcessEvent::End { .. })) {
                        // The end-of-stream envelope comes in the same write as the end event: take
                        // it now if it is here, so the connection is back in the pool as soon as
                        // the caller has the end (callers stop reading there). Never waits.
                        if let Poll::Ready(m) = futures::poll!(stream.next()) {
                            stash = Some(m);
                        }
                    }
                    return Some((ev, (stream, stash)));
                }
            });
        Ok(futures::stream::once(async move { Ok(first) })
            .chain(rest)
            .boxed())
    }

    fn selector(pid: u32) -> Option<proto::ProcessSelector> {
        Some(proto::ProcessSelector {
            pid: Some(pid),
            tag: None,
        })
    }

    /// `process.Process/SendInput` (stdin, or PTY input when the process has a PTY).
    pub async fn send_input(&self, pid: u32, data: Bytes, pty: bool) -> Result<(), ClientError> {
        let input = if pty {
            proto::ProcessInput {
                pty: Some(data),
                stdin: None,
            }
        } else {
            proto::ProcessInput {
                stdin: Some(data),
                pty: None,
            }
        };
        let req = proto::SendInputRequest {
            process: Self::selector(pid),
            input: Some(input),
        };
        let _: proto::Empty = self.unary("process.Process/SendInput", None, &req).await?;
        Ok(())
    }
    /// `process.Process/CloseStdin`.
    pub async fn close_stdin(&self, pid: u32) -> Result<(), ClientError> {
        let req = proto::SelectorRequest {
            process: Self::selector(pid),
        };
        let _: proto::Empty = self.unary("process.Process/CloseStdin", None, &req).await?;
        Ok(())
    }
    /// `process.Process/SendSignal` with SIGKILL (`kill = true`) or SIGTERM.
    pub async fn signal(&self, pid: u32, kill: bool) -> Result<(), ClientError> {
        let signal = if kill {
            proto::Signal::Sigkill
        } else {
            proto::Signal::Sigterm
        };
        let req = proto::SendSignalRequest {
            process: Self::selector(pid),
            signal,
        };
        let _: proto::Empty = self.unary("process.Process/SendSignal", None, &req).await?;
        Ok(())
    }
    /// `process.Process/Update`: resize a PTY.
    pub async fn resize(&self, pid: u32, cols: u16, rows: u16) -> Result<(), ClientError> {
        let req = proto::UpdateRequest {
            process: Self::selector(pid),
            pty: Some(proto::Pty {
                size: Some(proto::PtySize {
                    cols: u32::from(cols),
                    rows: u32::from(rows),
                }),
            }),
        };
        let _: proto::Empty = self.unary("process.Process/Update", None, &req).await?;
        Ok(())
    }
    /// `filesystem.Filesystem/Stat`.
    pub async fn stat(&self, path: &str, user: Option<&str>) -> Result<EntryInfo, ClientError> {
        let r: proto::EntryResponse = self
            .unary(
                "filesystem.Filesystem/Stat",
                user,
                &proto::PathRequest { path: path.into() },
            )
            .await?;
        r.entry
            .map(entry)
            .ok_or_else(|| ClientError::Protocol("Stat answered no entry".into()))
    }
    /// `filesystem.Filesystem/ListDir` with a depth (>= 1).
    pub async fn list_dir(
        &self,
        path: &str,
        depth: u32,
        user: Option<&str>,
    ) -> Result<Vec<EntryInfo>, ClientError> {
        let req = proto::ListDirRequest {
            path: path.into(),
            depth: depth.max(1),
        };
        let r: proto::ListDirResponse = self
            .unary("filesystem.Filesystem/ListDir", user, &req)
            .await?;
        Ok(r.entries.into_iter().map(entry).collect())
    }
    /// `filesystem.Filesystem/MakeDir` (creates parents; `already_exists` if it exists).
    pub async fn make_dir(&self, path: &str, user: Option<&str>) -> Result<EntryInfo, ClientError> {
        let r: proto::EntryResponse = self
            .unary(
                "filesystem.Filesystem/MakeDir",
                user,
                &proto::PathRequest { path: path.into() },
            )
            .await?;
        r.entry
            .map(entry)
            .ok_or_else(|| ClientError::Protocol("MakeDir answered no entry".into()))
    }
    /// `filesystem.Filesystem/Move`.
    pub async fn rename(
        &self,
        from: &str,
        to: &str,
        user: Option<&str>,
    ) -> Result<EntryInfo, ClientError> {
        let req = proto::MoveRequest {
            source: from.into(),
            destination: to.into(),
        };
        let r: proto::EntryResponse = self.unary("filesystem.Filesystem/Move", user, &req).await?;
        r.entry
            .map(entry)
            .ok_or_else(|| ClientError::Protocol("Move answered no entry".into()))
    }
    /// `filesystem.Filesystem/Remove` (recursive; no error if missing).
    pub async fn remove(&self, path: &str, user: Option<&str>) -> Result<(), ClientError> {
        let _: proto::Empty = self
            .unary(
                "filesystem.Filesystem/Remove",
                user,
                &proto::PathRequest { path: path.into() },
            )
            .await?;
        Ok(())
    }
    /// `GET /files?path=`: the file's bytes as a stream (never buffered whole).
    pub async fn read_file(
        &self,
        path: &str,
        user: Option<&str>,
    ) -> Result<BoxStream<'static, Result<Bytes, ClientError>>, ClientError> {
        let req = Request::get(files_uri(path, user))
            .header("host", "agent")
            .body(full_body(Bytes::new()))
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let resp = self.send(req).await?;
        if resp.status() != 200 {
            let (status, body) = Self::read_all(resp).await?;
            return Err(error_from(status, &body));
        }
        let s = http_body_util::BodyStream::new(resp.into_body()).filter_map(|f| async move {
            match f {
                Ok(f) => f.into_data().ok().map(Ok),
                Err(e) => Some(Err(ClientError::Unreachable(format!(
                    "download broken: {e}"
                )))),
            }
        });
        Ok(s.boxed())
    }
    /// `POST /files?path=` with `application/octet-stream`: writes the stream to the file,
    /// creating parent directories. Returns the written entry's path.
    pub async fn write_file(
        &self,
        path: &str,
        user: Option<&str>,
        body: BoxStream<'static, Result<Bytes, std::io::Error>>,
    ) -> Result<String, ClientError> {
        let body = StreamBody::new(body.map(|r| r.map(Frame::data))).boxed_unsync();
        let req = Request::post(files_uri(path, user))
            .header("host", "agent")
            .header(CONTENT_TYPE, "application/octet-stream")
            .body(body)
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let (status, body) = Self::read_all(self.send(req).await?).await?;
        if status != 200 {
            return Err(error_from(status, &body));
        }
        let entries: Vec<proto::WrittenEntry> =
            serde_json::from_slice(&body).map_err(|e| ClientError::Protocol(e.to_string()))?;
        entries
            .into_iter()
            .next()
            .map(|e| e.path)
            .ok_or_else(|| ClientError::Protocol("upload answered no entry".into()))
    }
    /// `filesystem.Filesystem/WatchDir`: a stream of changes under `path` (recursive if asked),
    /// which ends when dropped.
    pub async fn watch(
        &self,
        path: &str,
        recursive: bool,
        user: Option<&str>,
    ) -> Result<BoxStream<'static, Result<FsEvent, ClientError>>, ClientError> {
        let req = proto::WatchRequest {
            path: path.into(),
            recursive,
            ..Default::default()
        };
        let mut stream = self
            .server_stream("filesystem.Filesystem/WatchDir", user, &req, None)
            .await?;
        // Wait for the start message: the watch is in place once it arrives.
        match stream.next().await {
            None => return Err(ClientError::Protocol("watch ended before its start".into())),
            Some(Err(e)) => return Err(e),
            Some(Ok(p)) => {
                let r: proto::WatchDirResponse =
                    serde_json::from_slice(&p).map_err(|e| ClientError::Protocol(e.to_string()))?;
                if r.start.is_none() {
                    return Err(ClientError::Protocol(
                        "first watch message is not start".into(),
                    ));
                }
            }
        }
        let s = stream.filter_map(|m| async move {
            match m {
                Err(e) => Some(Err(e)),
                Ok(p) => match serde_json::from_slice::<proto::WatchDirResponse>(&p) {
                    Err(e) => Some(Err(ClientError::Protocol(e.to_string()))),
                    Ok(r) => r.filesystem.map(|f| {
                        let kind = match f.event_type {
                            proto::EventType::Create => "create",
                            proto::EventType::Write => "write",
                            proto::EventType::Remove => "remove",
                            proto::EventType::Rename => "rename",
                            proto::EventType::Chmod => "chmod",
                            proto::EventType::Unspecified => "unknown",
                        };
                        Ok(FsEvent {
                            name: f.name,
                            kind: kind.to_string(),
                        })
                    }),
                },
            }
        });
        Ok(s.boxed())
    }

    /// Opens a byte tunnel to `127.0.0.1:port` inside the sandbox (`GET /tunnel/{port}`,
    /// upgraded to `rampart-tunnel`): whatever is written goes to the port, whatever it sends
    /// comes back. Uses a connection of its own (never the pool). A port with nothing
    /// listening gives `ClientError::Rpc { code: "unavailable", message: "port is not open" }`.
    pub async fn tunnel(&self, port: u16) -> Result<hyper::upgrade::Upgraded, ClientError> {
        let (mut sender, conn) = self.handshake().await?;
        // The connection must be driven until the upgrade has been handed over.
        tokio::spawn(async move {
            let _ = conn.with_upgrades().await;
        });
        let req = Request::builder()
            .method("GET")
            .uri(format!("/tunnel/{port}"))
            .header("host", "agent")
            .header(hyper::header::CONNECTION, "upgrade")
            .header(hyper::header::UPGRADE, "rampart-tunnel")
            .body(full_body(Bytes::new()))
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| ClientError::Unreachable(format!("request failed: {e}")))?;
        let status = resp.status().as_u16();
        if status != 101 {
            let body = resp
                .into_body()
                .collect()
                .await
                .map(|c| c.to_bytes())
                .unwrap_or_default();
            return Err(error_from(status, &body));
        }
        hyper::upgrade::on(resp)
            .await
            .map_err(|e| ClientError::Unreachable(format!("tunnel upgrade: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    /// A server on a Unix socket: `/echo` streams the request body back as it comes,
    /// `/upgrade` switches to an echo of raw bytes. Counts the connections it accepted.
    async fn server(dir: &std::path::Path) -> (PathBuf, Arc<AtomicUsize>) {
        let path = dir.join("agent.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let n = accepted.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                n.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(|mut req: Request<Incoming>| async move {
                        if req.uri().path() == "/upgrade" {
                            let on = hyper::upgrade::on(&mut req);
                            tokio::spawn(async move {
                                let Ok(up) = on.await else { return };
                                let mut io = hyper_util::rt::TokioIo::new(up);
                                let mut b = [0u8; 64];
                                while let Ok(k @ 1..) = io.read(&mut b).await {
                                    if io.write_all(&b[..k]).await.is_err() {
                                        return;
                                    }
                                }
                            });
                            let r = Response::builder()
                                .status(101)
                                .header(hyper::header::CONNECTION, "upgrade")
                                .header(hyper::header::UPGRADE, "echo")
                                .body(UnsyncBoxBody::new(
                                    Full::new(Bytes::new()).map_err(|never| match never {}),
                                ))
                                .unwrap();
                            return Ok::<_, std::convert::Infallible>(r);
                        }
                        Ok(Response::new(req.into_body().boxed_unsync()))
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                        .with_upgrades()
                        .await;
                });
            }
        });
        (path, accepted)
    }

    fn post(uri: &str, body: &'static [u8]) -> Request<Full<Bytes>> {
        Request::post(uri)
            .header("host", "agent")
            .body(Full::new(Bytes::from_static(body)))
            .unwrap()
    }

    #[tokio::test]
    async fn forward_reuses_pooled_connections_and_drops_half_read_ones() {
        let dir = tempfile::tempdir().unwrap();
        let (sock, accepted) = server(dir.path()).await;
        let c = AgentClient::new(sock);
        for body in [&b"one"[..], b"two"] {
            let resp = c.forward(post("/echo", body)).await.unwrap();
            assert_eq!(resp.status(), 200);
            let got = resp.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(&got[..], body);
        }
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "the second reused the first"
        );
        // An answer dropped before its end closes its connection: the next call opens one.
        let (_tx, req) = streamed_echo(b"x").await;
        let resp = c.forward(req).await.unwrap();
        drop(resp);
        let resp = c.forward(post("/echo", b"three")).await.unwrap();
        let got = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&got[..], b"three");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    /// Channel of a streamed body, already holding `first`.
    type BodyTx = futures::channel::mpsc::Sender<Result<Frame<Bytes>, std::io::Error>>;
    type BodyRx = futures::channel::mpsc::Receiver<Result<Frame<Bytes>, std::io::Error>>;

    /// A `POST /echo` whose body streams from the returned sender, `first` already sent.
    async fn streamed_echo(first: &'static [u8]) -> (BodyTx, Request<StreamBody<BodyRx>>) {
        let (mut tx, rx) = futures::channel::mpsc::channel(1);
        let req = Request::post("/echo")
            .header("host", "agent")
            .body(StreamBody::new(rx))
            .unwrap();
        futures::SinkExt::send(&mut tx, Ok(Frame::data(Bytes::from_static(first))))
            .await
            .unwrap();
        (tx, req)
    }

    #[tokio::test]
    async fn forward_streams_a_request_body_written_after_the_answer_came() {
        let dir = tempfile::tempdir().unwrap();
        let (sock, _) = server(dir.path()).await;
        let c = AgentClient::new(sock);
        let (mut tx, req) = streamed_echo(b"first").await;
        let mut body = c.forward(req).await.unwrap().into_body();
        let f = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&f[..], b"first");
        // Written while the answer is being read.
        futures::SinkExt::send(&mut tx, Ok(Frame::data(Bytes::from_static(b"second"))))
            .await
            .unwrap();
        let f = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&f[..], b"second");
        drop(tx);
        assert!(body.frame().await.is_none());
    }

    #[tokio::test]
    async fn forward_passes_upgrades() {
        let dir = tempfile::tempdir().unwrap();
        let (sock, _) = server(dir.path()).await;
        let c = AgentClient::new(sock);
        let req = Request::get("/upgrade")
            .header("host", "agent")
            .header(hyper::header::CONNECTION, "upgrade")
            .header(hyper::header::UPGRADE, "echo")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let mut resp = c.forward(req).await.unwrap();
        assert_eq!(resp.status(), 101);
        let up = hyper::upgrade::on(&mut resp).await.unwrap();
        let mut io = hyper_util::rt::TokioIo::new(up);
        io.write_all(b"ping").await.unwrap();
        let mut b = [0u8; 4];
        io.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"ping");
    }
}
