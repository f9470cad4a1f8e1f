//! The audit record of what goes through the envd proxy.
//!
//! The proxy streams E2B's requests to the agent as they are; this module reads them on the
//! way and records the same events as the native API:
//!
//! - `process.Process/Start`: `exec` (argv, cwd, user, env names, stdin, PTY) is committed
//!   before the request reaches the agent; the answer's output is hashed as it streams back,
//!   and `exit` is committed before the client sees the end of the stream. A client that
//!   leaves early (a background command) does not stop the recording: the rest of the
//!   answer is read in the background until the process ends.
//! - `SendInput` / `StreamInput`: the input is counted in `exit.streamed_input` of the exec
//!   it is sent to.
//! - `filesystem.Filesystem/Move`, `Remove`, `MakeDir` and `POST /files` (uploads,
//!   multipart or raw): `file` events once the agent answered with success, writes with the
//!   size and SHA-256 of the bytes as they passed through.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::Response;
use base64::Engine as _;
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use rampart_agent::connect::{self, take_envelope, FLAG_END_STREAM};
use rampart_agent::proto;
use rampart_core::{ExecRecorder, ExecStart, InputSink, Manager};
use rampart_types::audit::{FileChange, FileOp};
use rampart_types::SandboxId;
use std::collections::HashMap;
use std::sync::{LazyLock, Mutex, MutexGuard};

/// Largest request body read whole to be recorded (a Start, SendInput, Move... request).
const MAX_REQUEST: usize = connect::MAX_ENVELOPE + 5;
/// Largest unary answer read whole (a Move or MakeDir answer, an upload's list).
const MAX_ANSWER: usize = 1 << 20;

/// envd's plain error: `{"code": <status>, "message"}`.
fn error(status: StatusCode, message: &str) -> Response {
    let body = serde_json::json!({"code": status.as_u16(), "message": message});
    let mut r = Response::new(Body::from(body.to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/json"),
    );
    r
}

fn internal(message: &str) -> Response {
    error(StatusCode::INTERNAL_SERVER_ERROR, message)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Input sinks of the execs being recorded, by sandbox and pid (and tag).
#[derive(Default)]
struct Running {
    by_pid: HashMap<(SandboxId, u32), InputSink>,
    tags: HashMap<(SandboxId, String), u32>,
}

static RUNNING: LazyLock<Mutex<Running>> = LazyLock::new(|| Mutex::new(Running::default()));

fn sink_of(id: &SandboxId, sel: Option<&proto::ProcessSelector>) -> Option<InputSink> {
    let sel = sel?;
    let r = lock(&RUNNING);
    let pid = match (&sel.pid, &sel.tag) {
        (Some(p), _) => *p,
        (None, Some(t)) => *r.tags.get(&(id.clone(), t.clone()))?,
        (None, None) => return None,
    };
    r.by_pid.get(&(id.clone(), pid)).cloned()
}

/// What to do with the agent's answer.
pub(crate) enum Tap {
    /// Nothing to record.
    None,
    /// A Start's event stream.
    Exec(Box<ExecTap>),
    /// Input to count once the agent accepted it.
    Input(InputSink, Vec<u8>),
    /// A file operation to record once the agent answered with success.
    File(FileTap),
    /// An upload: the parts' records come from `parts` (in order), paths from the answer.
    Upload(tokio::sync::oneshot::Receiver<Vec<(u64, String)>>),
}

/// A file operation waiting for its answer.
pub(crate) struct FileTap {
    op: FileOp,
    path: String,
    to: Option<String>,
}

/// The user a request runs as (`Authorization: Basic base64("<user>:")`), default `user`.
fn user_of(headers: &HeaderMap) -> String {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().strip_prefix("Basic "))
        .and_then(|b| {
            base64::engine::general_purpose::STANDARD
                .decode(b.trim())
                .ok()
        })
        .and_then(|b| String::from_utf8(b).ok())
        .map(|s| s.split(':').next().unwrap_or_default().to_owned())
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "user".into())
}

/// Reads a whole body (up to `max` bytes).
async fn read_all(body: Body, max: usize) -> Result<Bytes, String> {
    let mut out = BytesMut::new();
    let mut s = body.into_data_stream();
    while let Some(chunk) = s.next().await {
        let chunk = chunk.map_err(|e| format!("reading the request: {e}"))?;
        if out.len() + chunk.len() > max {
            return Err(format!("request larger than {max} bytes"));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out.freeze())
}

/// The message of a unary (`application/json`) or enveloped (`application/connect+json`)
/// request body.
fn message_of(headers: &HeaderMap, body: &Bytes) -> Option<Bytes> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_ascii_lowercase();
    if ct.starts_with("application/connect+") {
        let mut buf = BytesMut::from(&body[..]);
        match take_envelope(&mut buf) {
            Ok(Some((flags, m))) if flags & FLAG_END_STREAM == 0 => Some(m),
            _ => None,
        }
    } else {
        Some(body.clone())
    }
}

/// Looks at a request for the envd port before it is forwarded: records what must be
/// recorded before it reaches the agent, and says what to do with the answer. A request
/// whose body had to be read comes back with the same bytes.
pub(crate) async fn request(
    manager: &Manager,
    id: &SandboxId,
    req: Request,
) -> Result<(Request, Tap), Response> {
    let path = req.uri().path().to_owned();
    let rpc = path.strip_prefix('/').unwrap_or_default();
    let wanted = matches!(
        rpc,
        "process.Process/Start"
            | "process.Process/SendInput"
            | "process.Process/StreamInput"
            | "filesystem.Filesystem/Move"
            | "filesystem.Filesystem/Remove"
            | "filesystem.Filesystem/MakeDir"
    ) || (rpc == "files" && req.method() == axum::http::Method::POST);
    if !wanted {
        return Ok((req, Tap::None));
    }
    if rpc == "files" {
        return Ok(upload(req));
    }
    if rpc == "process.Process/StreamInput" {
        return Ok((stream_input(id.clone(), req), Tap::None));
    }
    let (parts, body) = req.into_parts();
    let bytes = match read_all(body, MAX_REQUEST).await {
        Ok(b) => b,
        Err(e) => return Err(error(StatusCode::BAD_REQUEST, &e)),
    };
    let msg = message_of(&parts.headers, &bytes);
    let parse = |m: &Bytes| serde_json::from_slice::<serde_json::Value>(m).ok();
    let tap = match (rpc, msg.as_ref()) {
        ("process.Process/Start", Some(m)) => {
            match serde_json::from_slice::<proto::StartRequest>(m) {
                Ok(start) => start_exec(manager, id, &parts.headers, start).map_err(|r| *r)?,
                Err(_) => Tap::None,
            }
        }
        ("process.Process/SendInput", Some(m)) => {
            match serde_json::from_slice::<proto::SendInputRequest>(m) {
                Ok(r) => match (sink_of(id, r.process.as_ref()), r.input) {
                    (Some(sink), Some(input)) => {
                        let data = input.pty.or(input.stdin).unwrap_or_default();
                        Tap::Input(sink, data.to_vec())
                    }
                    _ => Tap::None,
                },
                Err(_) => Tap::None,
            }
        }
        ("filesystem.Filesystem/Move", Some(m)) => {
            match serde_json::from_slice::<proto::MoveRequest>(m) {
                Ok(r) => Tap::File(FileTap {
                    op: FileOp::Move,
                    path: r.source,
                    to: Some(r.destination),
                }),
                Err(_) => Tap::None,
            }
        }
        ("filesystem.Filesystem/Remove" | "filesystem.Filesystem/MakeDir", Some(m)) => {
            match parse(m).and_then(|v| v.get("path")?.as_str().map(str::to_owned)) {
                Some(p) => Tap::File(FileTap {
                    op: if rpc.ends_with("Remove") {
                        FileOp::Remove
                    } else {
                        FileOp::Mkdir
                    },
                    path: p,
                    to: None,
                }),
                None => Tap::None,
            }
        }
        _ => Tap::None,
    };
    Ok((Request::from_parts(parts, Body::from(bytes)), tap))
}

/// Records a Start's `exec` (refusing the request if that fails: nothing runs unrecorded).
fn start_exec(
    manager: &Manager,
    id: &SandboxId,
    headers: &HeaderMap,
    start: proto::StartRequest,
) -> Result<Tap, Box<Response>> {
    let process = start.process.unwrap_or_default();
    let mut argv = Vec::with_capacity(process.args.len() + 1);
    argv.push(process.cmd);
    argv.extend(process.args);
    let rec = manager
        .record_exec_start(
            id,
            ExecStart {
                argv,
                cwd: process.cwd.filter(|c| !c.is_empty()),
                user: user_of(headers),
                env_names: process.envs.keys().cloned().collect(),
                stdin: start.stdin.unwrap_or(true),
                pty: start.pty.is_some(),
                input: None,
            },
        )
        .map_err(|e| {
            tracing::error!(id = %id, "recording an exec: {e}");
            Box::new(internal(&format!("recording the exec: {e}")))
        })?;
    Ok(Tap::Exec(Box::new(ExecTap {
        sandbox: id.clone(),
        tag: start.tag.filter(|t| !t.is_empty()),
        rec: Some(rec),
        pid: None,
        buf: BytesMut::new(),
        end: None,
    })))
}

/// A StreamInput request: its data messages are counted as they go to the agent.
fn stream_input(id: SandboxId, req: Request) -> Request {
    let (parts, body) = req.into_parts();
    let mut buf = BytesMut::new();
    let mut sink: Option<InputSink> = None;
    let stream = body.into_data_stream().map(move |chunk| {
        if let Ok(c) = &chunk {
            buf.extend_from_slice(c);
            while let Ok(Some((flags, m))) = take_envelope(&mut buf) {
                if flags & FLAG_END_STREAM != 0 {
                    continue;
                }
                let Ok(r) = serde_json::from_slice::<proto::StreamInputRequest>(&m) else {
                    continue;
                };
                if let Some(s) = r.start {
                    sink = sink_of(&id, s.process.as_ref());
                }
                if let (Some(s), Some(d)) = (&sink, r.data.and_then(|d| d.input)) {
                    s.update(&d.pty.or(d.stdin).unwrap_or_default());
                }
            }
        }
        chunk
    });
    Request::from_parts(parts, Body::from_stream(stream))
}

/// An upload: the body goes to the agent as it comes and, through a channel, to a parser
/// that hashes each file part (or the whole body when it is not multipart).
fn upload(req: Request) -> (Request, Tap) {
    let (parts, body) = req.into_parts();
    let ct = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let (tx, rx) = futures::channel::mpsc::unbounded::<Result<Bytes, std::io::Error>>();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let boundary = if ct.to_ascii_lowercase().starts_with("multipart/form-data") {
        multer::parse_boundary(&ct).ok()
    } else {
        None
    };
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
    let stream = body.into_data_stream().map(move |chunk| {
        if let Ok(c) = &chunk {
            let _ = tx.unbounded_send(Ok(c.clone()));
        }
        chunk
    });
    (
        Request::from_parts(parts, Body::from_stream(stream)),
        Tap::Upload(done_rx),
    )
}

/// Handles the agent's answer according to `tap`.
pub(crate) async fn answer(
    manager: &Manager,
    id: &SandboxId,
    tap: Tap,
    resp: Response,
) -> Response {
    match tap {
        Tap::None => resp,
        Tap::Exec(t) => {
            if !resp.status().is_success() {
                // Its start failed: the recorder, dropped, records the exit as unknown.
                return resp;
            }
            let (parts, body) = resp.into_parts();
            Response::from_parts(parts, Body::from_stream(t.stream(body)))
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
                },
            };
            if let Err(e) = manager.record_file_change(id, change) {
                tracing::error!(id = %id, "recording a file operation: {e}");
                return internal(&format!("recording the operation: {e}"));
            }
            Response::from_parts(parts, Body::from(bytes))
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
                };
                if let Err(e) = manager.record_file_change(id, change) {
                    tracing::error!(id = %id, "recording a file write: {e}");
                    return internal(&format!("recording the write: {e}"));
                }
            }
            Response::from_parts(parts, Body::from(bytes))
        }
    }
}

/// A Start's answer being recorded.
pub(crate) struct ExecTap {
    sandbox: SandboxId,
    tag: Option<String>,
    rec: Option<ExecRecorder>,
    pid: Option<u32>,
    buf: BytesMut,
    /// The end event seen, waiting for the end of the stream: `(exit code, signal)`.
    end: Option<(Option<i32>, Option<i32>)>,
}

impl ExecTap {
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
                self.end = Some(rampart_core::validate::exit_of(
                    e.exit_code,
                    e.exited,
                    &e.status,
                ));
            }
        }
    }

    fn started(&mut self, pid: u32) {
        self.pid = Some(pid);
        let Some(rec) = &self.rec else { return };
        let mut r = lock(&RUNNING);
        r.by_pid
            .insert((self.sandbox.clone(), pid), rec.input_sink());
        if let Some(t) = &self.tag {
            r.tags.insert((self.sandbox.clone(), t.clone()), pid);
        }
    }

    /// Records the exit: the end event's status if one came (`timed_out` from the end of
    /// the stream), else unknown.
    fn finish(&mut self, timed_out: Option<bool>) {
        if let Some(pid) = self.pid {
            let mut r = lock(&RUNNING);
            r.by_pid.remove(&(self.sandbox.clone(), pid));
            if let Some(t) = &self.tag {
                r.tags.remove(&(self.sandbox.clone(), t.clone()));
            }
        }
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
        body: Body,
    ) -> impl futures::Stream<Item = Result<Bytes, axum::Error>> + Send + 'static {
        struct St {
            tap: Box<ExecTap>,
            inner: Option<axum::body::BodyDataStream>,
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
                let sandbox = self.tap.sandbox.clone();
                let mut tap = std::mem::replace(
                    &mut self.tap,
                    Box::new(ExecTap {
                        sandbox,
                        tag: None,
                        rec: None,
                        pid: None,
                        buf: BytesMut::new(),
                        end: None,
                    }),
                );
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
            inner: Some(body.into_data_stream()),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_come_from_basic_authorization() {
        let mut h = HeaderMap::new();
        assert_eq!(user_of(&h), "user");
        let v = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode("root:")
        );
        h.insert(header::AUTHORIZATION, v.parse().unwrap());
        assert_eq!(user_of(&h), "root");
    }

    #[test]
    fn messages_come_from_envelopes_or_plain_bodies() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            "application/connect+json".parse().unwrap(),
        );
        let env = connect::envelope(0, b"{\"a\":1}");
        assert_eq!(message_of(&h, &env).as_deref(), Some(&b"{\"a\":1}"[..]));
        h.insert(header::CONTENT_TYPE, "application/json".parse().unwrap());
        assert_eq!(
            message_of(&h, &Bytes::from_static(b"{}")).as_deref(),
            Some(&b"{}"[..])
        );
    }
}
