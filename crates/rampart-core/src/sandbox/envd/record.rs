//! The audit record of what goes through the envd road ([`super::serve`]).
//!
//! The face streams E2B's requests to the agent as they are; this module reads them on the
//! way and records the same events as the native API:
//!
//! - `process.Process/Start`: `exec` (argv, cwd, user, env names, stdin, PTY) is committed
//!   before the request reaches the agent (held first if the sandbox's approval policy says
//!   so, as a native exec is); the answer's output is hashed as it streams back, and `exit`
//!   is committed before the client sees the end of the stream. A client that leaves early
//!   (a background command) does not stop the recording: the rest of the answer is read in
//!   the background until the process ends.
//! - `SendInput` / `StreamInput`: the input is counted in `exit.streamed_input` of the exec
//!   it is sent to.
//! - `filesystem.Filesystem/Move`, `Remove`, `MakeDir` and `POST /files` (uploads,
//!   multipart or raw): `file` events once the agent answered with success, writes with the
//!   size and SHA-256 of the bytes as they passed through.
//!
//! It fails closed. A request is read with the agent's own decoders (`connect::decode_json`,
//! `connect::decode_stream_request`, `server::ctx_of_headers`) and under the agent's own
//! rules (content type, encoding), so what is read here is what the agent will act on.
//! One that must be recorded and cannot be read that way, input for a process this road is
//! not recording, and any call of the process or filesystem service this module does not
//! know (it cannot tell what that would run or change) are refused before they reach the
//! agent: 400 (404 for an unknown process) with Connect's error body for a call, envd's for
//! `/files`. A `StreamInput`'s first message is read before the agent hears of the call;
//! each later message reaches the agent only once it has been read and counted, and one
//! that cannot be breaks the call off (the client gets the refusal). Calls that change
//! nothing recorded (`Connect`, `List`, `Stat`, `ListDir`, watches, signals...) and the
//! other endpoints (`GET /files`, `/health`) pass as they are.

use super::body::{self, BoxError, EnvdBody};
use crate::exec::{ExecRecorder, ExecRef, ExecStart, ExecTicket, InputSink};
use crate::principal::Principal;
use crate::sandbox::handle::Sandbox;
use crate::sandbox::Sandboxes;
use crate::CoreError;
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use http::{header, HeaderMap, Method, StatusCode};
use rampart_agent::connect::{self, take_envelope, Code, RpcError, FLAG_END_STREAM};
use rampart_agent::proto;
use rampart_types::audit::{FileChange, FileOp};
use rampart_types::SandboxId;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Poll;

type Request = http::Request<EnvdBody>;
type Response = http::Response<EnvdBody>;

/// Largest request body read whole to be recorded (a Start, SendInput, Move... request).
const MAX_REQUEST: usize = connect::MAX_ENVELOPE + 5;
/// Largest unary answer read whole (a Move or MakeDir answer, an upload's list).
const MAX_ANSWER: usize = 1 << 20;

/// envd's plain error: `{"code": <status>, "message"}`.
fn error(status: StatusCode, message: &str) -> Response {
    let body = serde_json::json!({"code": status.as_u16(), "message": message});
    let mut r = Response::new(body::full(body.to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

fn internal(message: &str) -> Response {
    error(StatusCode::INTERNAL_SERVER_ERROR, message)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A request refused before it reached the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    code: Code,
    message: String,
    /// envd's plain error body (`/files`) rather than Connect's.
    plain: bool,
}

impl Refusal {
    /// A call of `rpc` that cannot be read as the agent would read it.
    fn unreadable(rpc: &str, why: impl std::fmt::Display) -> Self {
        Refusal {
            code: Code::InvalidArgument,
            message: format!(
                "{rpc}: the envd proxy cannot parse this request, so it is not forwarded \
                 (nothing reaches the sandbox unrecorded): {why}"
            ),
            plain: false,
        }
    }

    fn invalid(message: String) -> Self {
        Refusal {
            code: Code::InvalidArgument,
            message,
            plain: false,
        }
    }

    /// Input for a process the proxy is not recording.
    fn unknown_process(rpc: &str, sel: Option<&proto::ProcessSelector>) -> Self {
        let which = match sel {
            Some(proto::ProcessSelector { pid: Some(p), .. }) => format!("with pid {p}"),
            Some(proto::ProcessSelector { tag: Some(t), .. }) => format!("with tag {t}"),
            _ => {
                return Refusal::unreadable(rpc, "it names no process (a pid or a tag)");
            }
        };
        Refusal {
            code: Code::NotFound,
            message: format!(
                "{rpc}: process {which} not found among the processes started through this \
                 envd proxy; input to it is not forwarded, as it could not be recorded"
            ),
            plain: false,
        }
    }

    /// An upload that cannot be read (envd's plain error, as `/files` answers).
    fn upload(why: impl std::fmt::Display) -> Self {
        Refusal {
            code: Code::InvalidArgument,
            message: format!(
                "POST /files: the envd proxy cannot parse this upload, so it is not forwarded \
                 (nothing is written unrecorded): {why}"
            ),
            plain: true,
        }
    }

    pub(crate) fn response(&self) -> Response {
        if self.plain {
            return error(StatusCode::BAD_REQUEST, &self.message);
        }
        let status =
            StatusCode::from_u16(self.code.http_status()).unwrap_or(StatusCode::BAD_REQUEST);
        let mut r = Response::new(body::full(
            RpcError::new(self.code, self.message.clone()).to_json(),
        ));
        *r.status_mut() = status;
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        r
    }
}

/// Where the execs the envd proxy records are kept, by sandbox: core's table of them
/// ([`Sandbox::add_exec_input`]), which a sandbox's end drops. An exec's entry goes when its
/// Start's answer ends (the process ended, the stream broke, the recording was dropped).
pub(crate) trait Execs: Send + Sync {
    /// The input sink of the recorded exec `which` names in sandbox `id`.
    fn sink(&self, id: &SandboxId, which: ExecRef<'_>) -> Option<InputSink>;
    /// Registers an exec of sandbox `id` that started as `pid` (None: the sandbox is gone).
    fn add(
        &self,
        id: &SandboxId,
        pid: u32,
        tag: Option<&str>,
        sink: InputSink,
    ) -> Option<ExecTicket>;
    /// Removes what `ticket` registered (not a later registration of the same pid or tag).
    fn remove(&self, id: &SandboxId, ticket: &ExecTicket);
}

/// Core's table of a caller's sandboxes' recorded execs, each reached through its checked
/// handle.
struct CoreExecs {
    core: Arc<Sandboxes>,
    who: Principal,
}

impl CoreExecs {
    fn sandbox(&self, id: &SandboxId) -> Option<Sandbox<'_>> {
        Sandbox::resolve(&self.core, &self.who, id).ok()
    }
}

impl Execs for CoreExecs {
    fn sink(&self, id: &SandboxId, which: ExecRef<'_>) -> Option<InputSink> {
        self.sandbox(id)?.exec_input(which)
    }
    fn add(
        &self,
        id: &SandboxId,
        pid: u32,
        tag: Option<&str>,
        sink: InputSink,
    ) -> Option<ExecTicket> {
        self.sandbox(id)?.add_exec_input(pid, tag, sink)
    }
    fn remove(&self, id: &SandboxId, ticket: &ExecTicket) {
        if let Some(s) = self.sandbox(id) {
            s.remove_exec_input(ticket)
        }
    }
}

/// The recorded exec a process selector names: by pid, else by tag.
fn which(sel: Option<&proto::ProcessSelector>) -> Option<ExecRef<'_>> {
    match sel? {
        proto::ProcessSelector { pid: Some(p), .. } => Some(ExecRef::Pid(*p)),
        proto::ProcessSelector { tag: Some(t), .. } => Some(ExecRef::Tag(t)),
        _ => None,
    }
}

/// The input sink of the recorded exec `sel` names in sandbox `id`.
fn sink_of(
    execs: &dyn Execs,
    id: &SandboxId,
    sel: Option<&proto::ProcessSelector>,
) -> Option<InputSink> {
    execs.sink(id, which(sel)?)
}

/// What to do with the agent's answer.
pub(crate) enum Tap {
    /// Nothing to record.
    None,
    /// A Start's event stream.
    Exec(Box<ExecTap>),
    /// Input to count once the agent accepted it.
    Input(InputSink, Vec<u8>),
    /// A StreamInput whose messages are counted on their way; a message that cannot be read
    /// breaks the call off, and its refusal is the answer.
    Gated(Arc<Mutex<Option<Refusal>>>),
    /// A file operation to record once the agent answered with success.
    File(FileTap),
    /// An upload: the parts' records come from `parts` (in order), paths from the answer.
    Upload(tokio::sync::oneshot::Receiver<Vec<(u64, String)>>),
}

impl Tap {
    /// The refusal that broke the request off on its way, if one did.
    pub(crate) fn refusal(&self) -> Option<Response> {
        match self {
            Tap::Gated(slot) => lock(slot).as_ref().map(Refusal::response),
            _ => None,
        }
    }
}

/// A file operation waiting for its answer.
pub(crate) struct FileTap {
    op: FileOp,
    path: String,
    to: Option<String>,
}

/// Reads a whole body (up to `max` bytes).
async fn read_all(b: EnvdBody, max: usize) -> Result<Bytes, String> {
    let mut out = BytesMut::new();
    let mut s = body::data(b);
    while let Some(chunk) = s.next().await {
        let chunk = chunk.map_err(|e| format!("reading the request: {e}"))?;
        if out.len() + chunk.len() > max {
            return Err(format!("request larger than {max} bytes"));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out.freeze())
}

/// The calls that change nothing the record holds: forwarded as they are.
const UNRECORDED: [&str; 11] = [
    "process.Process/Connect",
    "process.Process/List",
    "process.Process/CloseStdin",
    "process.Process/SendSignal",
    "process.Process/Update",
    "filesystem.Filesystem/Stat",
    "filesystem.Filesystem/ListDir",
    "filesystem.Filesystem/WatchDir",
    "filesystem.Filesystem/CreateWatcher",
    "filesystem.Filesystem/GetWatcherEvents",
    "filesystem.Filesystem/RemoveWatcher",
];

/// A call whose request is read to be recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Recorded {
    Start,
    SendInput,
    StreamInput,
    Move,
    Remove,
    MakeDir,
}

impl Recorded {
    fn name(self) -> &'static str {
        match self {
            Recorded::Start => "process.Process/Start",
            Recorded::SendInput => "process.Process/SendInput",
            Recorded::StreamInput => "process.Process/StreamInput",
            Recorded::Move => "filesystem.Filesystem/Move",
            Recorded::Remove => "filesystem.Filesystem/Remove",
            Recorded::MakeDir => "filesystem.Filesystem/MakeDir",
        }
    }

    /// A server- or client-streaming call (enveloped messages), not a unary one.
    fn streaming(self) -> bool {
        matches!(self, Recorded::Start | Recorded::StreamInput)
    }
}

/// What a request for the envd port is, for the record.
#[derive(Debug, PartialEq, Eq)]
enum Kind {
    /// Forwarded as it is.
    Pass,
    /// Read (and recorded) on its way.
    Recorded(Recorded),
    /// `POST /files`.
    Upload,
    /// Refused: a call of the process or filesystem service that is not known here.
    Unknown(String),
}

fn kind_of(method: &Method, path: &str) -> Kind {
    if path == "/files" {
        return if method == Method::POST {
            Kind::Upload
        } else {
            Kind::Pass
        };
    }
    let Some(rpc) = path
        .strip_prefix('/')
        .filter(|p| p.starts_with("process.Process/") || p.starts_with("filesystem.Filesystem/"))
    else {
        return Kind::Pass;
    };
    if method != Method::POST {
        return Kind::Unknown(format!(
            "{method} {rpc}: the envd proxy forwards Connect calls sent with POST only"
        ));
    }
    let recorded = [
        Recorded::Start,
        Recorded::SendInput,
        Recorded::StreamInput,
        Recorded::Move,
        Recorded::Remove,
        Recorded::MakeDir,
    ];
    if let Some(r) = recorded.into_iter().find(|r| r.name() == rpc) {
        return Kind::Recorded(r);
    }
    if UNRECORDED.contains(&rpc) {
        return Kind::Pass;
    }
    Kind::Unknown(format!(
        "unknown procedure {rpc}: not forwarded, as the envd proxy cannot tell what it would \
         run or change, so it could not record it"
    ))
}

/// Checks that a call's request is in the form the agent reads (as its `rpc` does): the
/// content type of its kind and no compression.
fn check_form(rpc: Recorded, headers: &HeaderMap) -> Result<(), Refusal> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_ascii_lowercase();
    let base = ct.split(';').next().unwrap_or_default().trim();
    let (want, encoding) = if rpc.streaming() {
        ("application/connect+json", "connect-content-encoding")
    } else {
        ("application/json", "content-encoding")
    };
    if base != want {
        return Err(Refusal::unreadable(
            rpc.name(),
            format!("content-type {ct:?} (it is read as {want})"),
        ));
    }
    if let Some(e) = headers
        .get(encoding)
        .map(|v| v.to_str().unwrap_or("?").trim())
        .filter(|v| !v.eq_ignore_ascii_case("identity"))
    {
        return Err(Refusal::unreadable(
            rpc.name(),
            format!("{encoding} {e:?} (only identity is read)"),
        ));
    }
    Ok(())
}

/// Looks at a request for the envd port before it is forwarded: records what must be
/// recorded before it reaches the agent, and says what to do with the answer. A request
/// whose body had to be read comes back with the same bytes. `Err` is the answer to give
/// instead: the request must not reach the agent.
pub(crate) async fn request(
    sandbox: &Sandbox<'_>,
    req: Request,
) -> Result<(Request, Tap), Response> {
    let execs: Arc<dyn Execs> = Arc::new(CoreExecs {
        core: sandbox.core().clone(),
        who: sandbox.caller().clone(),
    });
    let (req, plan) = read(&execs, sandbox.id(), req).await?;
    let tap = match plan {
        Plan::Tap(t) => t,
        Plan::Exec(mut e) => {
            // Held here if the sandbox's approval policy says so; refused if denied.
            let held = sandbox.authorize_exec(&e.start).await;
            e.start.approval = held.map_err(|err| {
                let code = match &err {
                    CoreError::Denied { .. } => Code::PermissionDenied,
                    CoreError::NotFound(_) => Code::NotFound,
                    _ => Code::Internal,
                };
                Refusal {
                    code,
                    message: err.to_string(),
                    plain: false,
                }
                .response()
            })?;
            start_exec(sandbox, &execs, *e).map_err(|r| *r)?
        }
    };
    Ok((req, tap))
}

/// What a request that may go on needs.
enum Plan {
    /// An exec to record before it goes.
    Exec(Box<Exec>),
    Tap(Tap),
}

/// A Start, as read.
struct Exec {
    start: ExecStart,
    tag: Option<String>,
}

/// Reads a request for the envd port as the agent will read it (see the module's doc).
async fn read(
    execs: &Arc<dyn Execs>,
    id: &SandboxId,
    req: Request,
) -> Result<(Request, Plan), Response> {
    let rpc = match kind_of(req.method(), req.uri().path()) {
        Kind::Pass => return Ok((req, Plan::Tap(Tap::None))),
        Kind::Unknown(why) => return Err(Refusal::invalid(why).response()),
        Kind::Upload => {
            return upload(req)
                .map(|(r, t)| (r, Plan::Tap(t)))
                .map_err(|r| r.response())
        }
        Kind::Recorded(rpc) => rpc,
    };
    check_form(rpc, req.headers()).map_err(|r| r.response())?;
    if rpc == Recorded::StreamInput {
        return stream_input(execs.clone(), id.clone(), req)
            .await
            .map(|(r, t)| (r, Plan::Tap(t)))
            .map_err(|r| r.response());
    }
    let (parts, body) = req.into_parts();
    let bytes = match read_all(body, MAX_REQUEST).await {
        Ok(b) => b,
        Err(e) => return Err(Refusal::unreadable(rpc.name(), e).response()),
    };
    let unreadable = |e: RpcError| Refusal::unreadable(rpc.name(), e.message).response();
    let plan = match rpc {
        Recorded::Start => {
            let start: proto::StartRequest =
                connect::decode_stream_request(&bytes).map_err(unreadable)?;
            Plan::Exec(Box::new(
                exec_of(&parts.headers, start).map_err(|r| r.response())?,
            ))
        }
        Recorded::SendInput => {
            let r: proto::SendInputRequest = connect::decode_json(&bytes).map_err(unreadable)?;
            let Some(sink) = sink_of(execs.as_ref(), id, r.process.as_ref()) else {
                return Err(Refusal::unknown_process(rpc.name(), r.process.as_ref()).response());
            };
            let input = r.input.unwrap_or_default();
            let data = input.pty.or(input.stdin).unwrap_or_default();
            Plan::Tap(Tap::Input(sink, data.to_vec()))
        }
        Recorded::Move => {
            let r: proto::MoveRequest = connect::decode_json(&bytes).map_err(unreadable)?;
            Plan::Tap(Tap::File(FileTap {
                op: FileOp::Move,
                path: r.source,
                to: Some(r.destination),
            }))
        }
        Recorded::Remove | Recorded::MakeDir => {
            let r: proto::PathRequest = connect::decode_json(&bytes).map_err(unreadable)?;
            Plan::Tap(Tap::File(FileTap {
                op: if rpc == Recorded::Remove {
                    FileOp::Remove
                } else {
                    FileOp::Mkdir
                },
                path: r.path,
                to: None,
            }))
        }
        Recorded::StreamInput => unreachable!("handled above"),
    };
    Ok((Request::from_parts(parts, body::full(bytes)), plan))
}

/// The `exec` a Start records: its process as the agent will start it, and the user as the
/// agent will read it from the same `Authorization` header (`user` when none is named).
fn exec_of(headers: &HeaderMap, start: proto::StartRequest) -> Result<Exec, Refusal> {
    let rpc = Recorded::Start.name();
    let ctx = rampart_agent::server::ctx_of_headers(headers)
        .map_err(|e| Refusal::unreadable(rpc, format!("Authorization: {}", e.message)))?;
    let process = start.process.unwrap_or_default();
    if process.cmd.is_empty() {
        return Err(Refusal::unreadable(rpc, "process.cmd is required"));
    }
    let mut argv = Vec::with_capacity(process.args.len() + 1);
    argv.push(process.cmd);
    argv.extend(process.args);
    Ok(Exec {
        start: ExecStart {
            argv,
            cwd: process.cwd.filter(|c| !c.is_empty()),
            user: ctx
                .user
                .filter(|u| !u.is_empty())
                .unwrap_or_else(|| "user".into()),
            env_names: process.envs.keys().cloned().collect(),
            stdin: start.stdin.unwrap_or(true),
            pty: start.pty.is_some(),
            input: None,
            approval: None,
        },
        tag: start.tag.filter(|t| !t.is_empty()),
    })
}

/// Records a Start's `exec` (refusing the request if that fails: nothing runs unrecorded).
fn start_exec(
    sandbox: &Sandbox<'_>,
    execs: &Arc<dyn Execs>,
    exec: Exec,
) -> Result<Tap, Box<Response>> {
    let id = sandbox.id();
    let rec = sandbox.record_exec_start(exec.start).map_err(|e| {
        tracing::error!(id = %id, "recording an exec: {e}");
        Box::new(internal(&format!("recording the exec: {e}")))
    })?;
    Ok(Tap::Exec(Box::new(ExecTap {
        execs: execs.clone(),
        sandbox: id.clone(),
        tag: exec.tag,
        rec: Some(rec),
        ticket: None,
        buf: BytesMut::new(),
        end: None,
    })))
}

/// A StreamInput's messages on their way to the agent: each is passed on only once it has
/// been read and its input counted.
struct InputGate {
    execs: Arc<dyn Execs>,
    sandbox: SandboxId,
    inner: body::Data,
    buf: BytesMut,
    sink: Option<InputSink>,
    /// The end-of-stream message was passed on: the agent reads nothing after it.
    ended: bool,
}

impl InputGate {
    /// The next message, enveloped as it came; `Ok(None)` at the end of the request.
    async fn next(&mut self) -> Result<Option<Bytes>, GateError> {
        let rpc = Recorded::StreamInput.name();
        loop {
            if self.ended {
                return Ok(None);
            }
            match take_envelope(&mut self.buf) {
                Err(e) => return Err(GateError::Refused(Refusal::unreadable(rpc, e))),
                Ok(Some((flags, payload))) => {
                    if flags & FLAG_END_STREAM != 0 {
                        self.ended = true;
                    } else {
                        self.read(&payload)?;
                    }
                    return Ok(Some(connect::envelope(flags, &payload)));
                }
                Ok(None) => {}
            }
            match self.inner.next().await {
                Some(Ok(c)) => self.buf.extend_from_slice(&c),
                Some(Err(e)) => return Err(GateError::Body(e)),
                None if self.buf.is_empty() => return Ok(None),
                None => {
                    return Err(GateError::Refused(Refusal::unreadable(
                        rpc,
                        "the request ends inside a message",
                    )))
                }
            }
        }
    }

    /// Reads one message as the agent will: `start` names the process the input that
    /// follows goes to, `data` is counted in its exec's record.
    fn read(&mut self, payload: &[u8]) -> Result<(), GateError> {
        let rpc = Recorded::StreamInput.name();
        let m: proto::StreamInputRequest = connect::decode_json(payload)
            .map_err(|e| GateError::Refused(Refusal::unreadable(rpc, e.message)))?;
        if let Some(s) = m.start {
            match sink_of(self.execs.as_ref(), &self.sandbox, s.process.as_ref()) {
                Some(sink) => self.sink = Some(sink),
                None => {
                    return Err(GateError::Refused(Refusal::unknown_process(
                        rpc,
                        s.process.as_ref(),
                    )))
                }
            }
        } else if let Some(d) = m.data {
            let Some(sink) = &self.sink else {
                return Err(GateError::Refused(Refusal::unreadable(
                    rpc,
                    "input before the start message",
                )));
            };
            let input = d.input.unwrap_or_default();
            sink.update(&input.pty.or(input.stdin).unwrap_or_default());
        }
        Ok(())
    }
}

enum GateError {
    Refused(Refusal),
    /// The client's body broke off.
    Body(BoxError),
}

/// A StreamInput: its first message is read before the request goes on (refused if it
/// cannot be, or names no recorded process); the later ones as they come.
async fn stream_input(
    execs: Arc<dyn Execs>,
    sandbox: SandboxId,
    req: Request,
) -> Result<(Request, Tap), Refusal> {
    let (parts, body) = req.into_parts();
    let mut gate = InputGate {
        execs,
        sandbox,
        inner: body::data(body),
        buf: BytesMut::new(),
        sink: None,
        ended: false,
    };
    let first = match gate.next().await {
        Ok(Some(m)) => m,
        Ok(None) => {
            return Err(Refusal::unreadable(
                Recorded::StreamInput.name(),
                "the request has no message",
            ))
        }
        Err(GateError::Refused(r)) => return Err(r),
        Err(GateError::Body(e)) => {
            return Err(Refusal::unreadable(
                Recorded::StreamInput.name(),
                format!("reading the request: {e}"),
            ))
        }
    };
    let slot = Arc::new(Mutex::new(None));
    let refused = slot.clone();
    let rest = futures::stream::unfold(Some(gate), move |gate| {
        let refused = refused.clone();
        async move {
            let mut gate = gate?;
            match gate.next().await {
                Ok(Some(m)) => Some((Ok(m), Some(gate))),
                Ok(None) => None,
                Err(GateError::Body(e)) => Some((Err(std::io::Error::other(e)), None)),
                Err(GateError::Refused(r)) => {
                    let e = std::io::Error::other(r.message.clone());
                    *lock(&refused) = Some(r);
                    Some((Err(e), None))
                }
            }
        }
    });
    let body = futures::stream::once(async move { Ok(first) }).chain(rest);
    Ok((
        Request::from_parts(parts, body::stream(body)),
        Tap::Gated(slot),
    ))
}

/// An upload: the body goes to the agent as it comes and, through a channel, to a parser
/// that hashes each file part (or the whole body when it is not multipart). Refused when it
/// is not in a form the agent takes (as its `upload` decides): an encoding other than
/// identity or gzip, gzip with multipart, a multipart type without a usable boundary.
///
/// A gzip-encoded raw upload goes through, recorded without size or digest: the agent
/// writes it decompressed, and the proxy has no decoder to hash what is written.
fn upload(req: Request) -> Result<(Request, Tap), Refusal> {
    let (parts, body) = req.into_parts();
    let ct = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let encoding = match parts.headers.get(header::CONTENT_ENCODING) {
        None => String::new(),
        Some(v) => v
            .to_str()
            .map_err(|_| Refusal::upload("a content-encoding that is not text"))?
            .trim()
            .to_ascii_lowercase(),
    };
    let gzip = match encoding.as_str() {
        "" | "identity" => false,
        "gzip" | "x-gzip" => true,
        other => return Err(Refusal::upload(format!("content-encoding {other:?}"))),
    };
    let boundary = if ct.to_ascii_lowercase().starts_with("multipart/form-data") {
        if gzip {
            return Err(Refusal::upload("gzip with a multipart body"));
        }
        Some(
            multer::parse_boundary(&ct)
                .map_err(|e| Refusal::upload(format!("content-type {ct:?}: {e}")))?,
        )
    } else {
        None
    };
    let (tx, rx) = futures::channel::mpsc::unbounded::<Result<Bytes, std::io::Error>>();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let mut out = Vec::new();
        match boundary {
            Some(b) => {
                let mut mp = multer::Multipart::new(rx, b);
                while let Ok(Some(mut field)) = mp.next_field().await {
                    if field.name() != Some("file") {
                        continue;
                    }
                    let mut h = rampart_audit::ContentHasher::new(0);
                    let mut ok = true;
                    loop {
                        match field.chunk().await {
                            Ok(Some(c)) => h.update(&c),
                            Ok(None) => break,
                            Err(_) => {
                                ok = false;
                                break;
                            }
                        }
                    }
                    if !ok {
                        break;
                    }
                    let (r, _) = h.finish();
                    out.push((r.size, r.digest.to_hex()));
                }
            }
            None if gzip => {}
            None => {
                let mut h = rampart_audit::ContentHasher::new(0);
                let mut rx = rx;
                while let Some(Ok(c)) = rx.next().await {
                    h.update(&c);
                }
                let (r, _) = h.finish();
                out.push((r.size, r.digest.to_hex()));
            }
        }
        let _ = done_tx.send(out);
    });
    let stream = body::data(body).map(move |chunk| {
        if let Ok(c) = &chunk {
            let _ = tx.unbounded_send(Ok(c.clone()));
        }
        chunk
    });
    Ok((
        Request::from_parts(parts, body::stream(stream)),
        Tap::Upload(done_rx),
    ))
}

/// Handles the agent's answer according to `tap`.
pub(crate) async fn answer(sandbox: &Sandbox<'_>, tap: Tap, resp: Response) -> Response {
    let id = sandbox.id();
    match tap {
        Tap::None => resp,
        Tap::Gated(slot) => match lock(&slot).take() {
            Some(r) => r.response(),
            None => resp,
        },
        Tap::Exec(t) => {
            if !resp.status().is_success() {
                // Its start failed: the recorder, dropped, records the exit as unknown.
                return resp;
            }
            let (parts, body) = resp.into_parts();
            Response::from_parts(parts, body::stream(t.stream(body)))
        }
        Tap::Input(sink, data) => {
            if resp.status().is_success() {
                sink.update(&data);
            }
            resp
        }
        Tap::File(f) => {
            if !resp.status().is_success() {
                return resp;
            }
            let (parts, body) = resp.into_parts();
            let Ok(bytes) = read_all(body, MAX_ANSWER).await else {
                return internal("reading the agent's answer");
            };
            let entry_path = serde_json::from_slice::<proto::EntryResponse>(&bytes)
                .ok()
                .and_then(|r| r.entry)
                .map(|e| e.path)
                .filter(|p| !p.is_empty());
            let change = match f.op {
                FileOp::Move => FileChange {
                    op: FileOp::Move,
                    path: f.path,
                    to: entry_path.or(f.to),
                    size: None,
                    digest: None,
                    caller: None,
                },
                op => FileChange {
                    op,
                    path: if op == FileOp::Mkdir {
                        entry_path.unwrap_or(f.path)
                    } else {
                        f.path
                    },
                    to: None,
                    size: None,
                    digest: None,
                    caller: None,
                },
            };
            if let Err(e) = sandbox.record_file_change(change) {
                tracing::error!(id = %id, "recording a file operation: {e}");
                return internal(&format!("recording the operation: {e}"));
            }
            Response::from_parts(parts, body::full(bytes))
        }
        Tap::Upload(done) => {
            if !resp.status().is_success() {
                return resp;
            }
            let (parts, body) = resp.into_parts();
            let Ok(bytes) = read_all(body, MAX_ANSWER).await else {
                return internal("reading the agent's answer");
            };
            let written: Vec<proto::WrittenEntry> =
                serde_json::from_slice(&bytes).unwrap_or_default();
            // The agent answered after reading the whole body: the parser has seen it all.
            let digests = done.await.unwrap_or_default();
            for (i, w) in written.iter().enumerate() {
                let (size, digest) = match digests.get(i) {
                    Some((s, d)) => (Some(*s), rampart_audit::Hash::parse(d).ok()),
                    None => (None, None),
                };
                let change = FileChange {
                    op: FileOp::Write,
                    path: w.path.clone(),
                    to: None,
                    size,
                    digest,
                    caller: None,
                };
                if let Err(e) = sandbox.record_file_change(change) {
                    tracing::error!(id = %id, "recording a file write: {e}");
                    return internal(&format!("recording the write: {e}"));
                }
            }
            Response::from_parts(parts, body::full(bytes))
        }
    }
}

/// A Start's answer being recorded.
pub(crate) struct ExecTap {
    execs: Arc<dyn Execs>,
    sandbox: SandboxId,
    tag: Option<String>,
    rec: Option<ExecRecorder>,
    /// Its registration in `execs` while the process runs.
    ticket: Option<ExecTicket>,
    buf: BytesMut,
    /// The end event seen, waiting for the end of the stream: `(exit code, signal)`.
    end: Option<(Option<i32>, Option<i32>)>,
}

impl Drop for ExecTap {
    /// However the recording ends, the exec takes no more input.
    fn drop(&mut self) {
        self.unregister();
    }
}

impl ExecTap {
    /// A tap with nothing left to record (what stays behind when the recording moves).
    fn spent(&self) -> Box<ExecTap> {
        Box::new(ExecTap {
            execs: self.execs.clone(),
            sandbox: self.sandbox.clone(),
            tag: None,
            rec: None,
            ticket: None,
            buf: BytesMut::new(),
            end: None,
        })
    }

    /// Reads the envelopes of `chunk`; returns true once the exit is recorded.
    fn feed(&mut self, chunk: &[u8]) -> bool {
        self.buf.extend_from_slice(chunk);
        loop {
            let (flags, msg) = match take_envelope(&mut self.buf) {
                Ok(Some(e)) => e,
                Ok(None) => return false,
                Err(_) => {
                    self.finish(None);
                    return true;
                }
            };
            if flags & FLAG_END_STREAM != 0 {
                let timed_out = serde_json::from_slice::<serde_json::Value>(&msg)
                    .ok()
                    .and_then(|v| v.get("error")?.get("code")?.as_str().map(str::to_owned))
                    .is_some_and(|c| c == "deadline_exceeded");
                self.finish(Some(timed_out));
                return true;
            }
            let Ok(r) = serde_json::from_slice::<proto::ProcessEventResponse>(&msg) else {
                continue;
            };
            let Some(ev) = r.event else { continue };
            if let Some(s) = ev.start {
                self.started(s.pid);
            }
            if let (Some(d), Some(rec)) = (ev.data, self.rec.as_mut()) {
                if let Some(b) = d.stdout.as_ref().or(d.pty.as_ref()) {
                    rec.stdout(b);
                }
                if let Some(b) = &d.stderr {
                    rec.stderr(b);
                }
            }
            if let Some(e) = ev.end {
                self.end = Some(crate::validate::exit_of(e.exit_code, e.exited, &e.status));
            }
        }
    }

    /// The process started: input for it (by pid or tag) is counted from now on.
    fn started(&mut self, pid: u32) {
        let Some(sink) = self.rec.as_ref().map(ExecRecorder::input_sink) else {
            return;
        };
        self.unregister();
        self.ticket = self
            .execs
            .add(&self.sandbox, pid, self.tag.as_deref(), sink);
    }

    fn unregister(&mut self) {
        if let Some(ticket) = self.ticket.take() {
            self.execs.remove(&self.sandbox, &ticket);
        }
    }

    /// Records the exit: the end event's status if one came (`timed_out` from the end of
    /// the stream), else unknown.
    fn finish(&mut self, timed_out: Option<bool>) {
        self.unregister();
        let Some(rec) = self.rec.take() else { return };
        match self.end.take() {
            Some((code, sig)) => rec.finish(code, sig, timed_out.unwrap_or(false)),
            None => rec.finish(None, None, false),
        }
    }

    /// The answer's body, recorded as it passes. Chunks after the end event are held until
    /// the exit is recorded (so the client never sees the end first).
    fn stream(
        self: Box<Self>,
        body: EnvdBody,
    ) -> impl futures::Stream<Item = Result<Bytes, BoxError>> + Send + 'static {
        struct St {
            tap: Box<ExecTap>,
            inner: Option<body::Data>,
            held: Vec<Bytes>,
            done: bool,
        }
        impl Drop for St {
            /// The client left before the end: read the rest in the background.
            fn drop(&mut self) {
                if self.done || self.tap.rec.is_none() {
                    return;
                }
                let (Some(mut inner), Ok(rt)) =
                    (self.inner.take(), tokio::runtime::Handle::try_current())
                else {
                    return;
                };
                let spent = self.tap.spent();
                let mut tap = std::mem::replace(&mut self.tap, spent);
                rt.spawn(async move {
                    while let Some(Ok(c)) = inner.next().await {
                        if tap.feed(&c) {
                            return;
                        }
                    }
                    tap.finish(None);
                });
            }
        }
        let st = St {
            tap: self,
            inner: Some(body::data(body)),
            held: Vec::new(),
            done: false,
        };
        futures::stream::unfold(st, |mut st| async move {
            loop {
                if st.done {
                    if st.held.is_empty() {
                        return None;
                    }
                    let c = st.held.remove(0);
                    return Some((Ok(c), st));
                }
                let next = match st.inner.as_mut() {
                    Some(i) => i.next().await,
                    None => None,
                };
                match next {
                    Some(Ok(c)) => {
                        let recorded = st.tap.feed(&c);
                        if recorded {
                            st.done = true;
                            st.held.push(c);
                            if let Some(inner) = st.inner.as_mut() {
                                rest_at_hand(inner, &mut st.held).await;
                            }
                            continue;
                        }
                        if st.tap.end.is_some() || !st.held.is_empty() {
                            st.held.push(c);
                            continue;
                        }
                        return Some((Ok(c), st));
                    }
                    Some(Err(e)) => {
                        st.tap.finish(None);
                        st.done = true;
                        return Some((Err(e), st));
                    }
                    None => {
                        st.tap.finish(None);
                        st.done = true;
                    }
                }
            }
        })
    }
}

/// After the end-of-stream message: takes what of the rest of the answer is already here
/// (the end of its chunked body, which the agent writes with that message) so that its
/// connection, read to the end, goes back to the agent client's pool. Never waits: what is
/// not here is left, and that connection is closed instead.
async fn rest_at_hand(inner: &mut body::Data, held: &mut Vec<Bytes>) {
    for _ in 0..4 {
        match futures::poll!(inner.next()) {
            Poll::Ready(Some(Ok(c))) => held.push(c),
            Poll::Ready(_) | Poll::Pending => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;

    fn req(method: &str, path: &str, headers: &[(&str, &str)], data: impl Into<Bytes>) -> Request {
        let mut b = http::Request::builder().method(method).uri(path);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(body::full(data)).unwrap()
    }

    const STREAM: (&str, &str) = ("content-type", "application/connect+json");
    const UNARY: (&str, &str) = ("content-type", "application/json");

    /// What `read` does with a request: `Ok(true)` if it goes on with a record to make or a
    /// tap, `Ok(false)` if it goes on as it is, `Err((status, body))` if refused.
    /// No exec is recorded (core's table is tested in core).
    struct NoExecs;

    impl Execs for NoExecs {
        fn sink(&self, _: &SandboxId, _: ExecRef<'_>) -> Option<InputSink> {
            None
        }
        fn add(&self, _: &SandboxId, _: u32, _: Option<&str>, _: InputSink) -> Option<ExecTicket> {
            None
        }
        fn remove(&self, _: &SandboxId, _: &ExecTicket) {}
    }

    fn no_execs() -> Arc<dyn Execs> {
        Arc::new(NoExecs)
    }

    async fn outcome(execs: &Arc<dyn Execs>, r: Request) -> Result<bool, (u16, serde_json::Value)> {
        let id = SandboxId::parse("sbxtest1").unwrap();
        match read(execs, &id, r).await {
            Ok((_, Plan::Tap(Tap::None))) => Ok(false),
            Ok(_) => Ok(true),
            Err(resp) => {
                let status = resp.status().as_u16();
                let body = read_all(resp.into_body(), 1 << 20).await.unwrap();
                Err((status, serde_json::from_slice(&body).unwrap()))
            }
        }
    }

    /// Asserts a refusal: its status, Connect's `code` (or envd's numeric one) and that
    /// the message names `what`.
    fn refused(
        o: Result<bool, (u16, serde_json::Value)>,
        status: u16,
        code: serde_json::Value,
        what: &str,
    ) {
        let Err((s, body)) = o else {
            panic!("not refused: {o:?}")
        };
        assert_eq!(s, status, "{body}");
        assert_eq!(body["code"], code, "{body}");
        let m = body["message"].as_str().unwrap();
        assert!(m.contains(what), "{m:?} does not name {what:?}");
    }

    #[tokio::test]
    async fn a_start_that_cannot_be_parsed_is_refused_before_the_agent() {
        let running = no_execs();
        let start = "/process.Process/Start";
        let bad = serde_json::json!("invalid_argument");
        let ok = connect::envelope(0, br#"{"process":{"cmd":"/bin/true"}}"#);
        // The well-formed one goes on, with an exec to record first.
        assert_eq!(
            outcome(&running, req("POST", start, &[STREAM], ok.clone())).await,
            Ok(true)
        );
        let mut truncated = ok.to_vec();
        truncated.truncate(8);
        let mut compressed = ok.to_vec();
        compressed[0] = connect::FLAG_COMPRESSED;
        for (body, why) in [
            (
                connect::envelope(0, b"{not json").to_vec(),
                "invalid request",
            ),
            (
                connect::envelope(0, br#"{"process":{"cmd":5}}"#).to_vec(),
                "invalid request",
            ),
            (
                connect::envelope(0, b"{}").to_vec(),
                "process.cmd is required",
            ),
            (connect::end_envelope(None).to_vec(), "no message envelope"),
            (truncated, "no message envelope"),
            (compressed, "compressed"),
            (Vec::new(), "no message envelope"),
            (br#"{"process":{"cmd":"/bin/true"}}"#.to_vec(), ""),
        ] {
            let o = outcome(&running, req("POST", start, &[STREAM], body.clone())).await;
            refused(
                o,
                400,
                bad.clone(),
                "process.Process/Start: the envd proxy cannot parse",
            );
            let o = outcome(&running, req("POST", start, &[STREAM], body)).await;
            refused(o, 400, bad.clone(), why);
        }
        // Not in the form the agent reads: another content type, a compressed body, an
        // Authorization the agent would not take.
        let o = outcome(&running, req("POST", start, &[UNARY], ok.clone())).await;
        refused(o, 400, bad.clone(), "content-type \"application/json\"");
        let gz = ("connect-content-encoding", "gzip");
        let o = outcome(&running, req("POST", start, &[STREAM, gz], ok.clone())).await;
        refused(o, 400, bad.clone(), "connect-content-encoding \"gzip\"");
        let auth = ("authorization", "Bearer x");
        let o = outcome(&running, req("POST", start, &[STREAM, auth], ok.clone())).await;
        refused(
            o,
            400,
            bad.clone(),
            "Authorization: unsupported authorization scheme",
        );
        let o = outcome(&running, req("GET", start, &[STREAM], ok)).await;
        refused(o, 400, bad, "POST only");
    }

    #[tokio::test]
    async fn the_user_of_a_start_is_the_one_the_agent_reads() {
        let start = proto::StartRequest {
            process: Some(proto::ProcessConfig {
                cmd: "id".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut h = HeaderMap::new();
        let e = exec_of(&h, start.clone()).unwrap();
        assert_eq!(e.start.user, "user");
        let v = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode("root:")
        );
        h.insert(header::AUTHORIZATION, v.parse().unwrap());
        assert_eq!(exec_of(&h, start).unwrap().start.user, "root");
    }

    #[tokio::test]
    async fn input_and_file_calls_that_cannot_be_parsed_are_refused() {
        let running = no_execs();
        let bad = serde_json::json!("invalid_argument");
        for rpc in [
            "process.Process/SendInput",
            "filesystem.Filesystem/Move",
            "filesystem.Filesystem/Remove",
            "filesystem.Filesystem/MakeDir",
        ] {
            let path = format!("/{rpc}");
            let o = outcome(&running, req("POST", &path, &[UNARY], "{nope")).await;
            refused(
                o,
                400,
                bad.clone(),
                &format!("{rpc}: the envd proxy cannot parse"),
            );
            let o = outcome(
                &running,
                req("POST", &path, &[UNARY], r#"{"path":1,"source":2}"#),
            )
            .await;
            if rpc.ends_with("SendInput") {
                // Parsed, but it names no process.
                refused(o, 400, bad.clone(), "names no process");
            } else {
                refused(o, 400, bad.clone(), "invalid type");
            }
            let o = outcome(&running, req("POST", &path, &[STREAM], "{}")).await;
            refused(o, 400, bad.clone(), "it is read as application/json");
            let o = outcome(
                &running,
                req("POST", &path, &[UNARY, ("content-encoding", "gzip")], "{}"),
            )
            .await;
            refused(o, 400, bad.clone(), "content-encoding");
        }
        // Input for a process the proxy is not recording.
        let o = outcome(
            &running,
            req(
                "POST",
                "/process.Process/SendInput",
                &[UNARY],
                r#"{"process":{"pid":7},"input":{"stdin":"aGk="}}"#,
            ),
        )
        .await;
        refused(
            o,
            404,
            serde_json::json!("not_found"),
            "process with pid 7 not found",
        );
        // Well-formed file calls go on, to be recorded once answered.
        let o = outcome(
            &running,
            req(
                "POST",
                "/filesystem.Filesystem/MakeDir",
                &[UNARY],
                r#"{"path":"/d"}"#,
            ),
        )
        .await;
        assert_eq!(o, Ok(true));
    }

    #[tokio::test]
    async fn stream_input_is_read_before_the_agent_hears_of_it() {
        let running = no_execs();
        let path = "/process.Process/StreamInput";
        let bad = serde_json::json!("invalid_argument");
        let start = connect::envelope(0, br#"{"start":{"process":{"pid":7}}}"#);
        let o = outcome(&running, req("POST", path, &[STREAM], start)).await;
        refused(
            o,
            404,
            serde_json::json!("not_found"),
            "process with pid 7 not found",
        );
        let data = connect::envelope(0, br#"{"data":{"input":{"stdin":"aGk="}}}"#);
        let o = outcome(&running, req("POST", path, &[STREAM], data)).await;
        refused(o, 400, bad.clone(), "input before the start message");
        let o = outcome(
            &running,
            req("POST", path, &[STREAM], connect::envelope(0, b"[")),
        )
        .await;
        refused(o, 400, bad.clone(), "invalid request");
        let o = outcome(&running, req("POST", path, &[STREAM], Bytes::new())).await;
        refused(o, 400, bad.clone(), "the request has no message");
        let o = outcome(&running, req("POST", path, &[UNARY], Bytes::new())).await;
        refused(o, 400, bad, "it is read as application/connect+json");
    }

    #[tokio::test]
    async fn unknown_calls_are_refused_and_unrecorded_ones_pass() {
        let running = no_execs();
        let bad = serde_json::json!("invalid_argument");
        for path in [
            "/process.Process/Exec",
            "/process.Process/Start/",
            "/process.Process/St%61rt",
            "/filesystem.Filesystem/WriteFile",
        ] {
            let o = outcome(&running, req("POST", path, &[UNARY], "{}")).await;
            refused(o, 400, bad.clone(), "unknown procedure");
        }
        for (method, path) in [
            ("POST", "/process.Process/List"),
            ("POST", "/process.Process/Connect"),
            ("POST", "/process.Process/SendSignal"),
            ("POST", "/filesystem.Filesystem/Stat"),
            ("POST", "/filesystem.Filesystem/WatchDir"),
            ("GET", "/files?path=/a"),
            ("GET", "/health"),
            ("POST", "/something/else"),
        ] {
            let o = outcome(&running, req(method, path, &[UNARY], "{not even json")).await;
            assert_eq!(o, Ok(false), "{method} {path}");
        }
    }

    #[tokio::test]
    async fn uploads_not_in_a_form_the_agent_takes_are_refused() {
        let running = no_execs();
        let code = serde_json::json!(400);
        let mp = ("content-type", "multipart/form-data");
        let o = outcome(&running, req("POST", "/files?path=/a", &[mp], "x")).await;
        refused(
            o,
            400,
            code.clone(),
            "POST /files: the envd proxy cannot parse this upload",
        );
        let br = ("content-encoding", "br");
        let o = outcome(&running, req("POST", "/files?path=/a", &[br], "x")).await;
        refused(o, 400, code.clone(), "content-encoding \"br\"");
        let mp = ("content-type", "multipart/form-data; boundary=X");
        let gz = ("content-encoding", "gzip");
        let o = outcome(&running, req("POST", "/files?path=/a", &[mp, gz], "x")).await;
        refused(o, 400, code, "gzip with a multipart body");
        let o = outcome(&running, req("POST", "/files?path=/a", &[mp], "x")).await;
        assert_eq!(o, Ok(true));
        let o = outcome(&running, req("POST", "/files?path=/a", &[gz], "x")).await;
        assert_eq!(o, Ok(true));
    }

    #[test]
    fn a_selector_names_an_exec_by_pid_else_by_tag() {
        let sel = |pid: Option<u32>, tag: Option<&str>| proto::ProcessSelector {
            pid,
            tag: tag.map(str::to_owned),
        };
        assert_eq!(which(Some(&sel(Some(7), Some("t")))), Some(ExecRef::Pid(7)));
        assert_eq!(which(Some(&sel(None, Some("t")))), Some(ExecRef::Tag("t")));
        assert_eq!(which(Some(&sel(None, None))), None);
        assert_eq!(which(None), None);
    }
}
