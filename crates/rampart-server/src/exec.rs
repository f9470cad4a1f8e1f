//! Running commands: waited (JSON result with capped output), streamed (NDJSON or SSE) and
//! interactive (WebSocket). A client that goes away takes its process with it.

use crate::error::ApiError;
use crate::extract::{parse_json, ApiJson, SandboxPath};
use crate::AppState;
use axum::body::Body;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::http::header::{ACCEPT, ORIGIN};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use rampart_core::{Exec, ExecControl, Principal, Started};
use rampart_types::exec::DEFAULT_OUTPUT_CAP;
use rampart_types::{ApiErrorBody, ExecEvent, ExecInput, ExecRequest, ExecResult, SandboxId};
use std::convert::Infallible;
use std::time::Duration;

/// The largest `max_output_bytes` a waited exec may ask for (64 MiB); stream for more.
pub const MAX_OUTPUT_CAP: u64 = 64 << 20;

/// How long the exec WebSocket waits for the client's first message (the exec request).
const WS_FIRST_MESSAGE_TIMEOUT: Duration = Duration::from_secs(30);

/// Kills the process when dropped unless disarmed: the client went away before the exit.
struct KillOnDrop(Option<ExecControl>);

impl KillOnDrop {
    fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(control) = self.0.take() {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    tracing::debug!("client went away; killing its process");
                    if let Err(e) = control.signal(true).await {
                        tracing::debug!("kill after disconnect: {e}");
                    }
                });
            }
        }
    }
}

/// Whether an event ends the exec.
fn is_final(ev: &ExecEvent) -> bool {
    matches!(
        ev,
        ExecEvent::Exit { .. } | ExecEvent::Error { .. } | ExecEvent::Denied { .. }
    )
}

/// Decodes an event's base64 payload (falling back to the raw text, which cannot happen with a
/// well-behaved core).
/// Accumulates a waited exec's output up to a cap per stream, discarding (but counting as
/// truncated) what comes after.
#[derive(Debug, Clone)]
pub struct OutputCollector {
    cap: usize,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    stdout_truncated: bool,
    stderr_truncated: bool,
}

impl OutputCollector {
    /// A collector keeping at most `cap` bytes of stdout and of stderr.
    pub fn new(cap: u64) -> Self {
        OutputCollector {
            cap: usize::try_from(cap).unwrap_or(usize::MAX),
            stdout: Vec::new(),
            stderr: Vec::new(),
            stdout_truncated: false,
            stderr_truncated: false,
        }
    }

    fn append(buf: &mut Vec<u8>, truncated: &mut bool, data: &[u8], cap: usize) {
        let room = cap.saturating_sub(buf.len());
        if data.len() > room {
            *truncated = true;
        }
        buf.extend_from_slice(&data[..data.len().min(room)]);
    }

    /// Takes one event; returns the result when it is the exit, `Err` with a message when the
    /// exec failed.
    pub fn push(&mut self, ev: ExecEvent) -> Option<Result<ExecResult, String>> {
        match ev {
            ExecEvent::Start { .. } => None,
            ExecEvent::Stdout { data } | ExecEvent::Pty { data } => {
                let cap = self.cap;
                Self::append(
                    &mut self.stdout,
                    &mut self.stdout_truncated,
                    data.as_bytes(),
                    cap,
                );
                None
            }
            ExecEvent::Stderr { data } => {
                let cap = self.cap;
                Self::append(
                    &mut self.stderr,
                    &mut self.stderr_truncated,
                    data.as_bytes(),
                    cap,
                );
                None
            }
            ExecEvent::Exit {
                exit_code,
                signal,
                timed_out,
                duration_ms,
            } => Some(Ok(ExecResult {
                exit_code,
                signal,
                stdout: String::from_utf8_lossy(&self.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&self.stderr).into_owned(),
                stdout_truncated: self.stdout_truncated,
                stderr_truncated: self.stderr_truncated,
                timed_out,
                duration_ms,
            })),
            ExecEvent::Error { message } => Some(Err(message)),
            ExecEvent::Denied { reason, .. } => Some(Err(reason)),
            ExecEvent::PendingApproval { .. } => None,
        }
    }
}

/// Drains `events` (all of it: output past the cap is read and discarded so the process never
/// blocks on a full pipe) into a result.
pub async fn collect_output(
    mut events: impl Stream<Item = ExecEvent> + Unpin,
    cap: u64,
) -> Result<ExecResult, String> {
    let mut c = OutputCollector::new(cap);
    while let Some(ev) = events.next().await {
        if let Some(done) = c.push(ev) {
            return done;
        }
    }
    Err("the process's output ended without an exit status".into())
}

/// The output cap of a waited exec (the HTTP layer's own concern); everything else of the
/// request is validated once, by core, before the sandbox is looked at.
fn output_cap(req: &ExecRequest) -> Result<u64, ApiError> {
    let cap = req.max_output_bytes.unwrap_or(DEFAULT_OUTPUT_CAP);
    if cap > MAX_OUTPUT_CAP {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "limit_exceeded",
            format!(
                "max_output_bytes: {cap} is above this daemon's maximum {MAX_OUTPUT_CAP}; \
                 use \"stream\": true for more output"
            ),
        ));
    }
    Ok(cap)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Wait,
    Ndjson,
    Sse,
}

fn mode(headers: &HeaderMap, req: &ExecRequest) -> Mode {
    let accept = headers
        .get_all(ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect::<Vec<_>>()
        .join(",")
        .to_ascii_lowercase();
    if accept.contains("text/event-stream") {
        Mode::Sse
    } else if req.stream || accept.contains("application/x-ndjson") {
        Mode::Ndjson
    } else {
        Mode::Wait
    }
}

/// The events of an exec, `start` first, disarming the kill guard at the final event; dropping
/// the stream before that (client gone) kills the process.
fn event_stream(exec: Exec) -> impl Stream<Item = ExecEvent> + Send + 'static {
    let Exec {
        pid,
        events,
        control,
    } = exec;
    let guard = KillOnDrop(Some(control));
    let rest = futures::stream::unfold((Some(events), guard), |(events, mut guard)| async move {
        let mut events = events?;
        let ev = events.next().await?;
        if is_final(&ev) {
            guard.disarm();
            Some((ev, (None, guard)))
        } else {
            Some((ev, (Some(events), guard)))
        }
    });
    futures::stream::once(async move { ExecEvent::Start { pid } }).chain(rest)
}

fn ndjson_line(ev: &ExecEvent) -> Bytes {
    let mut v = serde_json::to_vec(ev).unwrap_or_else(|_| b"{\"type\":\"error\"}".to_vec());
    v.push(b'\n');
    Bytes::from(v)
}

/// `POST /v1/sandboxes/{id}/exec`.
///
/// Waits and answers an [`ExecResult`] by default; streams [`ExecEvent`]s as NDJSON with
/// `"stream": true` or `Accept: application/x-ndjson`, or as SSE with
/// `Accept: text/event-stream`. Closing the connection early kills the process.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/exec", tag = "exec",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = ExecRequest,
    responses(
        (status = 200, description = "Waited: the result (output capped, `*_truncated` set). \
            Streamed: NDJSON lines of ExecEvent (`start` first, `exit` or `error` last).",
            content(
                (ExecResult = "application/json"),
                (ExecEvent = "application/x-ndjson"),
                (ExecEvent = "text/event-stream"),
            )),
        (status = 400, description = "Bad input; the message names the field", body = ApiErrorBody),
        (status = 404, description = "No such sandbox", body = ApiErrorBody),
        (status = 409, description = "The sandbox is not running", body = ApiErrorBody),
        (status = 413, description = "Body above 16 MiB", body = ApiErrorBody),
        (status = 422, description = "max_output_bytes above the maximum", body = ApiErrorBody),
        (status = 502, description = "The sandbox's agent failed or is unreachable", body = ApiErrorBody),
    ))]
pub(crate) async fn exec(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
    SandboxPath(id): SandboxPath,
    headers: HeaderMap,
    ApiJson(req): ApiJson<ExecRequest, { crate::EXEC_BODY_LIMIT }>,
) -> Result<Response, ApiError> {
    let cap = output_cap(&req)?;
    let mode = mode(&headers, &req);
    if mode == Mode::Wait {
        let Exec {
            events, control, ..
        } = st.manager.sandbox(&who, &id)?.exec(req, false).await?;
        let mut guard = KillOnDrop(Some(control));
        let result = collect_output(events, cap).await;
        guard.disarm();
        return match result {
            Ok(r) => Ok(Json(r).into_response()),
            Err(m) => Err(ApiError::new(
                StatusCode::BAD_GATEWAY,
                "exec_failed",
                format!("the command failed to run: {m}"),
            )),
        };
    }
    // Streamed: a request the sandbox's approval policy holds answers 200 at once with
    // `pending_approval`, then the events (or `denied`) once it is decided.
    // Once held, the exec is polled by the response's body, after this handler returned.
    let held = match st.manager.sandbox(&who, &id)?.start(req, false).await? {
        Started::Running(exec) => return Ok(streamed(mode, event_stream(exec).boxed())),
        Started::Held(held) => held,
    };
    let pending = ExecEvent::PendingApproval {
        approval_id: held.approval.id.clone(),
        request: held.approval.request.clone(),
    };
    let rest = futures::stream::once(held.decided()).flat_map(|r| match r {
        Ok(exec) => event_stream(exec).boxed(),
        Err(rampart_core::CoreError::Denied { approval, reason }) => {
            futures::stream::once(std::future::ready(ExecEvent::Denied {
                approval_id: approval,
                reason,
            }))
            .boxed()
        }
        Err(e) => futures::stream::once(std::future::ready(ExecEvent::Error {
            message: ApiError::from(e).message,
        }))
        .boxed(),
    });
    let events = futures::stream::once(std::future::ready(pending)).chain(rest);
    Ok(streamed(mode, events.boxed()))
}

/// A streamed exec's answer: NDJSON lines, or server-sent events named by type.
fn streamed(mode: Mode, events: futures::stream::BoxStream<'static, ExecEvent>) -> Response {
    if mode != Mode::Sse {
        let body = events.map(|ev| Ok::<_, Infallible>(ndjson_line(&ev)));
        return crate::ndjson::response(Body::from_stream(body));
    }
    let events = events.map(|ev| {
        let name = match &ev {
            ExecEvent::Start { .. } => "start",
            ExecEvent::Stdout { .. } => "stdout",
            ExecEvent::Stderr { .. } => "stderr",
            ExecEvent::Pty { .. } => "pty",
            ExecEvent::Exit { .. } => "exit",
            ExecEvent::Error { .. } => "error",
            ExecEvent::PendingApproval { .. } => "pending_approval",
            ExecEvent::Denied { .. } => "denied",
        };
        let data = serde_json::to_string(&ev).unwrap_or_default();
        Ok::<_, Infallible>(Event::default().event(name).data(data))
    });
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// `GET /v1/sandboxes/{id}/exec/ws`: interactive exec over a WebSocket.
///
/// The first client message is an [`ExecRequest`] (JSON text); then [`ExecInput`] messages
/// (binary messages are raw stdin). The server sends [`ExecEvent`] JSON texts: `start`, output,
/// then `exit` or `error`, and closes. Closing the socket early kills the process. A browser
/// page may connect only from the daemon's own origin (the console), its key offered as the
/// subprotocol `rampart.key.<key>` beside `rampart.v1`.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/exec/ws", tag = "exec",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 101, description = "Upgraded; see the description for the messages"),
        (status = 400, description = "Not a WebSocket request, or a malformed id", body = ApiErrorBody),
        (status = 403, description = "A page of another origin asked", body = ApiErrorBody),
        (status = 404, description = "No such sandbox", body = ApiErrorBody),
    ))]
pub(crate) async fn exec_ws(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
    SandboxPath(id): SandboxPath,
    headers: HeaderMap,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    // Browsers send `Origin` on every WebSocket: only the console's own pages are let in.
    if headers.contains_key(ORIGIN) && !crate::ports::same_origin(&headers) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "cross-origin WebSocket requests are refused (an Origin other than the daemon's)",
        ));
    }
    let ws = ws
        .map_err(|e| {
            ApiError::bad_request(format!("expected a WebSocket upgrade: {}", e.body_text()))
        })?
        .protocols([crate::auth::WS_PROTOCOL]);
    // Answer an unknown sandbox with a plain 404 before upgrading.
    st.manager.sandbox(&who, &id)?.info()?;
    // The session runs after this request's task: it keeps acting for its caller (the
    // record names it; a tenant stays confined to its own).
    Ok(ws.on_upgrade(move |socket| ws_session(st, who, id, socket)))
}

async fn ws_send(socket: &mut WebSocket, ev: &ExecEvent) -> Result<(), axum::Error> {
    let text = serde_json::to_string(ev).unwrap_or_default();
    socket.send(Message::Text(text.into())).await
}

async fn ws_fail(mut socket: WebSocket, message: String) {
    let _ = ws_send(&mut socket, &ExecEvent::Error { message }).await;
    ws_close(socket).await;
}

/// How long the closing handshake waits for the client's Close.
const WS_CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Closes with a handshake: sends Close, then reads (discarding) until the client's Close.
/// Dropping the socket with client data still unread would reset the connection, and a reset
/// can destroy the last events before the client has read them.
async fn ws_close(mut socket: WebSocket) {
    if socket.send(Message::Close(None)).await.is_err() {
        return;
    }
    let drain = async {
        while let Some(Ok(m)) = socket.recv().await {
            if matches!(m, Message::Close(_)) {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(WS_CLOSE_TIMEOUT, drain).await;
}

async fn ws_session(st: AppState, who: Principal, id: SandboxId, mut socket: WebSocket) {
    let first = tokio::time::timeout(WS_FIRST_MESSAGE_TIMEOUT, socket.recv()).await;
    let parsed = match first {
        Ok(Some(Ok(Message::Text(t)))) => parse_json::<ExecRequest>(t.as_bytes()),
        Ok(Some(Ok(Message::Binary(b)))) => parse_json::<ExecRequest>(&b),
        Ok(Some(Ok(_))) => Err(ApiError::bad_request(
            "the first message must be the exec request",
        )),
        Ok(_) => return,
        Err(_) => Err(ApiError::bad_request("no exec request within 30 s")),
    };
    let req = match parsed.and_then(|r| output_cap(&r).map(|_| r)) {
        Ok(r) => r,
        Err(e) => return ws_fail(socket, e.message).await,
    };
    // A request the approval policy holds: `pending_approval` first, then the decision.
    let started = match st.manager.sandbox(&who, &id) {
        Ok(s) => s.start(req, true).await,
        Err(e) => Err(e),
    };
    let result = match started {
        Ok(Started::Running(exec)) => Ok(exec),
        Ok(Started::Held(held)) => {
            let ev = ExecEvent::PendingApproval {
                approval_id: held.approval.id.clone(),
                request: held.approval.request.clone(),
            };
            if ws_send(&mut socket, &ev).await.is_err() {
                return;
            }
            let mut decided = std::pin::pin!(held.decided());
            loop {
                tokio::select! {
                    r = &mut decided => break r,
                    // Input sent while held is not read as the command's: the client left
                    // (withdrawn, by dropping it), or it is dropped.
                    msg = socket.recv() => {
                        if !matches!(msg, Some(Ok(Message::Text(_) | Message::Binary(_) | Message::Ping(_) | Message::Pong(_)))) {
                            return;
                        }
                    }
                }
            }
        }
        Err(e) => Err(e),
    };
    let exec = match result {
        Ok(e) => e,
        Err(rampart_core::CoreError::Denied { approval, reason }) => {
            let _ = ws_send(
                &mut socket,
                &ExecEvent::Denied {
                    approval_id: approval,
                    reason,
                },
            )
            .await;
            return ws_close(socket).await;
        }
        Err(e) => return ws_fail(socket, ApiError::from(e).message).await,
    };
    let Exec {
        pid,
        mut events,
        control,
    } = exec;
    let mut guard = KillOnDrop(Some(control.clone()));
    if ws_send(&mut socket, &ExecEvent::Start { pid })
        .await
        .is_err()
    {
        return;
    }
    loop {
        tokio::select! {
            ev = events.next() => {
                let Some(ev) = ev else {
                    let _ = ws_send(&mut socket, &ExecEvent::Error {
                        message: "the process's output ended without an exit status".into(),
                    }).await;
                    break;
                };
                let done = is_final(&ev);
                if done {
                    guard.disarm();
                }
                if ws_send(&mut socket, &ev).await.is_err() || done {
                    break;
                }
            }
            msg = socket.recv() => {
                let input = match msg {
                    Some(Ok(Message::Text(t))) => match parse_json::<ExecInput>(t.as_bytes()) {
                        Ok(i) => i,
                        Err(e) => {
                            let _ = ws_send(&mut socket, &ExecEvent::Error { message: e.message }).await;
                            break;
                        }
                    },
                    Some(Ok(Message::Binary(b))) => ExecInput::Stdin { data: B64.encode(&b) },
                    Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                    Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break,
                };
                if let Err(e) = apply_input(&control, input).await {
                    match e {
                        InputError::Bad(m) => {
                            let _ = ws_send(&mut socket, &ExecEvent::Error { message: m }).await;
                            break;
                        }
                        // The process may have just exited; its exit event follows.
                        InputError::Failed(m) => tracing::debug!("exec input: {m}"),
                    }
                }
            }
        }
    }
    ws_close(socket).await;
}

enum InputError {
    Bad(String),
    Failed(String),
}

async fn apply_input(control: &ExecControl, input: ExecInput) -> Result<(), InputError> {
    let r = match input {
        ExecInput::Stdin { data } => {
            let bytes = B64
                .decode(&data)
                .map_err(|_| InputError::Bad("stdin.data: not valid base64".into()))?;
            control.send_stdin(Bytes::from(bytes)).await
        }
        ExecInput::CloseStdin => control.close_stdin().await,
        ExecInput::Resize { cols, rows } => {
            if cols == 0 || rows == 0 {
                return Err(InputError::Bad(
                    "resize: cols and rows must be at least 1".into(),
                ));
            }
            control.resize(cols, rows).await
        }
        ExecInput::Signal { kill } => control.signal(kill).await,
    };
    r.map_err(|e| InputError::Failed(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out(s: &[u8]) -> ExecEvent {
        ExecEvent::Stdout { data: s.into() }
    }

    #[tokio::test]
    async fn output_is_capped_and_drained() {
        let events = vec![
            ExecEvent::Start { pid: 7 },
            out(b"hello "),
            out(b"world"),
            ExecEvent::Stderr {
                data: (&b"e"[..]).into(),
            },
            out(b"more"),
            ExecEvent::Exit {
                exit_code: Some(3),
                signal: None,
                timed_out: false,
                duration_ms: 5,
            },
        ];
        let r = collect_output(futures::stream::iter(events), 8)
            .await
            .unwrap();
        assert_eq!(r.stdout, "hello wo");
        assert!(r.stdout_truncated);
        assert_eq!(r.stderr, "e");
        assert!(!r.stderr_truncated);
        assert_eq!(r.exit_code, Some(3));
    }

    #[tokio::test]
    async fn exact_cap_is_not_truncated_and_errors_surface() {
        let events = vec![
            out(b"12345678"),
            ExecEvent::Exit {
                exit_code: Some(0),
                signal: None,
                timed_out: false,
                duration_ms: 1,
            },
        ];
        let r = collect_output(futures::stream::iter(events), 8)
            .await
            .unwrap();
        assert!(!r.stdout_truncated);
        let err = collect_output(
            futures::stream::iter(vec![ExecEvent::Error {
                message: "gone".into(),
            }]),
            8,
        )
        .await
        .unwrap_err();
        assert_eq!(err, "gone");
        assert!(collect_output(futures::stream::iter(vec![out(b"x")]), 8)
            .await
            .is_err());
    }

    #[test]
    fn the_output_cap_is_bounded() {
        let ok = ExecRequest {
            cmd: vec!["true".into()],
            ..Default::default()
        };
        assert_eq!(output_cap(&ok).unwrap(), DEFAULT_OUTPUT_CAP);
        let e = output_cap(&ExecRequest {
            max_output_bytes: Some(u64::MAX),
            ..ok
        })
        .unwrap_err();
        assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert!(e.message.starts_with("max_output_bytes"));
    }
}
