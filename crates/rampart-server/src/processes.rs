//! Background processes: `POST /v1/sandboxes/{id}/processes` starts a command that keeps
//! running with no client attached; its output is attached to (now or later, replayed from
//! what is kept), and it takes input and signals, by pid.

use crate::error::ApiError;
use crate::extract::{ApiJson, SandboxPath};
use crate::AppState;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::Response;
use axum::Json;
use futures::StreamExt as _;
use rampart_types::{ApiErrorBody, ExecEvent, ExecInput, ExecRequest, ProcessInfo, SandboxId};
use std::convert::Infallible;

/// The header of an attach that says how many output bytes were dropped before the replay.
pub(crate) const DROPPED_HEADER: &str = "x-rampart-dropped-bytes";

/// The `{id}` and `{pid}` of a process's path.
pub(crate) struct ProcessPath(SandboxId, u32);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for ProcessPath {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, ApiError> {
        let Path((raw_id, raw_pid)) = Path::<(String, String)>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::bad_request(e.body_text()))?;
        let id =
            SandboxId::parse(&raw_id).map_err(|e| ApiError::bad_request(format!("id: {e}")))?;
        let pid = raw_pid
            .parse()
            .map_err(|_| ApiError::bad_request(format!("pid: {raw_pid:?} is not a process id")))?;
        Ok(ProcessPath(id, pid))
    }
}

/// `POST /v1/sandboxes/{id}/processes`: starts the exec request in the background.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes", tag = "exec",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = ExecRequest,
    responses(
        (status = 201, description = "Started; runs until it ends, with or without a client", body = ProcessInfo),
        (status = 400, description = "Bad input; the message names the field", body = ApiErrorBody),
        (status = 404, description = "No such sandbox", body = ApiErrorBody),
        (status = 409, description = "Not running, or as many background processes as it may", body = ApiErrorBody),
    ))]
pub(crate) async fn start(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
    SandboxPath(id): SandboxPath,
    ApiJson(req): ApiJson<ExecRequest, { crate::EXEC_BODY_LIMIT }>,
) -> Result<(StatusCode, Json<ProcessInfo>), ApiError> {
    let info = st.manager.sandbox(&who, &id)?.spawn_process(req).await?;
    Ok((StatusCode::CREATED, Json(info)))
}

/// `GET /v1/sandboxes/{id}/processes`: its background processes, running and recently ended.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/processes", tag = "exec",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, description = "Oldest first", body = Vec<ProcessInfo>),
        (status = 404, description = "No such sandbox", body = ApiErrorBody),
        (status = 409, description = "The sandbox is not running", body = ApiErrorBody),
    ))]
pub(crate) async fn list(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
    SandboxPath(id): SandboxPath,
) -> Result<Json<Vec<ProcessInfo>>, ApiError> {
    Ok(Json(st.manager.sandbox(&who, &id)?.processes()?))
}

/// `GET /v1/sandboxes/{id}/processes/{pid}`.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/processes/{pid}", tag = "exec",
    params(("id" = String, Path, description = "Sandbox id"), ("pid" = u32, Path, description = "Its pid")),
    responses(
        (status = 200, description = "The process", body = ProcessInfo),
        (status = 404, description = "No such sandbox or process", body = ApiErrorBody),
    ))]
pub(crate) async fn get_one(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
    ProcessPath(id, pid): ProcessPath,
) -> Result<Json<ProcessInfo>, ApiError> {
    Ok(Json(st.manager.sandbox(&who, &id)?.process(pid)?.status()))
}

/// `GET /v1/sandboxes/{id}/processes/{pid}/events`: attaches. NDJSON lines of `ExecEvent`:
/// the output kept so far (the last 256 KiB; `X-Rampart-Dropped-Bytes` says how much came
/// before it), then what comes, until `exit` or `error`. Leaving does not stop the process.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/processes/{pid}/events", tag = "exec",
    params(("id" = String, Path, description = "Sandbox id"), ("pid" = u32, Path, description = "Its pid")),
    responses(
        (status = 200, description = "NDJSON lines of ExecEvent, `exit` or `error` last", body = ExecEvent, content_type = "application/x-ndjson"),
        (status = 404, description = "No such sandbox or process", body = ApiErrorBody),
    ))]
pub(crate) async fn events(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
    ProcessPath(id, pid): ProcessPath,
) -> Result<Response, ApiError> {
    let attach = st.manager.sandbox(&who, &id)?.process(pid)?.attach();
    let replay = futures::stream::iter(attach.replay);
    let live = futures::stream::unfold(attach.live, |rx| async move {
        use tokio::sync::broadcast::error::RecvError;
        let mut rx = rx?;
        match rx.recv().await {
            Ok(ev) => {
                let last = matches!(ev, ExecEvent::Exit { .. } | ExecEvent::Error { .. });
                Some((ev, (!last).then_some(rx)))
            }
            Err(RecvError::Lagged(n)) => Some((
                ExecEvent::Error {
                    message: format!(
                        "this client fell {n} events behind the process's output and was \
                         detached (the process runs on); attach again"
                    ),
                },
                None,
            )),
            Err(RecvError::Closed) => None,
        }
    });
    let body = replay
        .chain(live)
        .map(|ev| Ok::<_, Infallible>(crate::ndjson::line(&ev)));
    let mut resp = crate::ndjson::response(Body::from_stream(body));
    resp.headers_mut()
        .insert(DROPPED_HEADER, HeaderValue::from(attach.dropped_bytes));
    Ok(resp)
}

/// `POST /v1/sandboxes/{id}/processes/{pid}/input`: one `ExecInput` (`stdin` with base64
/// `data`, `close_stdin`, `resize`, `signal`).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes/{pid}/input", tag = "exec",
    params(("id" = String, Path, description = "Sandbox id"), ("pid" = u32, Path, description = "Its pid")),
    request_body = ExecInput,
    responses(
        (status = 204, description = "Delivered"),
        (status = 400, description = "Bad input", body = ApiErrorBody),
        (status = 404, description = "No such sandbox or process", body = ApiErrorBody),
        (status = 409, description = "The process has ended", body = ApiErrorBody),
    ))]
pub(crate) async fn input(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
    ProcessPath(id, pid): ProcessPath,
    ApiJson(inp): ApiJson<ExecInput, { crate::EXEC_BODY_LIMIT }>,
) -> Result<StatusCode, ApiError> {
    use base64::Engine as _;
    let p = st.manager.sandbox(&who, &id)?.process(pid)?;
    if p.ended() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "conflict",
            format!("process {pid} of sandbox {id} has ended"),
        ));
    }
    let c = p.control();
    match inp {
        ExecInput::Stdin { data } => {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(data.as_bytes())
                .map_err(|e| ApiError::bad_request(format!("data: not base64: {e}")))?;
            c.send_stdin(bytes.into()).await?
        }
        ExecInput::CloseStdin => c.close_stdin().await?,
        ExecInput::Resize { cols, rows } => c.resize(cols, rows).await?,
        ExecInput::Signal { kill } => c.signal(kill).await?,
    }
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE /v1/sandboxes/{id}/processes/{pid}`: kills it (SIGKILL); answers what it is now
/// (its end follows on the events).
#[utoipa::path(delete, path = "/v1/sandboxes/{id}/processes/{pid}", tag = "exec",
    params(("id" = String, Path, description = "Sandbox id"), ("pid" = u32, Path, description = "Its pid")),
    responses(
        (status = 200, description = "Killed (or had ended)", body = ProcessInfo),
        (status = 404, description = "No such sandbox or process", body = ApiErrorBody),
    ))]
pub(crate) async fn kill(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
    ProcessPath(id, pid): ProcessPath,
) -> Result<Json<ProcessInfo>, ApiError> {
    let p = st.manager.sandbox(&who, &id)?.process(pid)?;
    if !p.ended() {
        p.control().signal(true).await?;
    }
    Ok(Json(p.status()))
}
