//! The file API: raw bytes streamed both ways, plus stat, list, mkdir, move, remove, watch.
//!
//! Paths are interpreted by the sandbox's agent, inside the sandbox's own root; relative paths
//! are relative to the acting user's home.

use crate::error::ApiError;
use crate::extract::{ApiJson, ApiQuery, SandboxPath};
use crate::AppState;
use axum::body::Body;
use axum::extract::State;
use axum::http::header::{CONNECTION, CONTENT_TYPE};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::StreamExt;
use rampart_core::{AgentError, CoreError, EntryInfo, FileKind};
use rampart_types::{
    ApiErrorBody, FileEntry, FileList, FileType, FileWatchEvent, MakeDir, MoveFile, SandboxId,
};
use serde::Deserialize;
use std::convert::Infallible;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// Deepest `depth` a listing may ask for.
pub const MAX_LIST_DEPTH: u32 = 32;

/// `?path=&user=`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct PathQuery {
    /// Path inside the sandbox (relative: to the user's home).
    path: String,
    /// User to act as (`user` by default, or `root`).
    #[serde(default)]
    user: Option<String>,
}

/// `?path=&depth=&user=`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct ListQuery {
    /// Directory to list.
    path: String,
    /// How deep to descend (1 = the directory's own entries; at most 32).
    #[serde(default)]
    depth: Option<u32>,
    /// User to act as.
    #[serde(default)]
    user: Option<String>,
}

/// `?path=&recursive=&user=`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct WatchQuery {
    /// Directory to watch.
    path: String,
    /// Watch subdirectories too.
    #[serde(default)]
    recursive: Option<bool>,
    /// User to act as.
    #[serde(default)]
    user: Option<String>,
}

/// Refuses paths the agent could never mean: empty or containing NUL.
fn check_path(field: &str, path: &str) -> Result<(), ApiError> {
    if path.is_empty() {
        return Err(ApiError::bad_request(format!("{field}: must not be empty")));
    }
    if path.contains('\0') {
        return Err(ApiError::bad_request(format!(
            "{field}: contains a NUL byte"
        )));
    }
    Ok(())
}

fn check_user(user: Option<&str>) -> Result<(), ApiError> {
    if user.is_some_and(|u| u.is_empty() || u.contains('\0')) {
        return Err(ApiError::bad_request("user: empty or contains a NUL byte"));
    }
    Ok(())
}

fn entry(e: EntryInfo) -> FileEntry {
    FileEntry {
        name: e.name,
        path: e.path,
        file_type: match e.kind {
            FileKind::File => FileType::File,
            FileKind::Directory => FileType::Directory,
            FileKind::Symlink => FileType::Symlink,
            FileKind::Other => FileType::Other,
        },
        size: e.size,
        mode: e.mode,
        permissions: e.permissions,
        owner: e.owner,
        group: e.group,
        modified_at: e.modified_time,
        symlink_target: e.symlink_target,
    }
}

/// The error of a file operation that writes: the agent's `resource_exhausted` (ENOSPC or
/// EDQUOT inside the sandbox) is `507 no_space`; everything else maps as usual.
fn write_error(e: AgentError) -> ApiError {
    match e {
        AgentError::Rpc { code, message } if code == "resource_exhausted" => {
            ApiError::new(StatusCode::INSUFFICIENT_STORAGE, "no_space", message)
        }
        e => ApiError::from(e),
    }
}

/// [`write_error`] for an agent error that came through core; other errors as they are.
fn core_write_error(e: CoreError) -> ApiError {
    match e {
        CoreError::Agent(e) => write_error(e),
        other => other.into(),
    }
}

fn is_not_found(e: &CoreError) -> bool {
    matches!(e, CoreError::Agent(AgentError::Rpc { code, .. }) if code == "not_found")
}

/// `GET /v1/sandboxes/{id}/files?path=`: the file's bytes, streamed.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files", tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), PathQuery),
    responses(
        (status = 200, description = "The file's bytes, streamed", content(("application/octet-stream"))),
        (status = 400, description = "Bad path (e.g. a directory)", body = ApiErrorBody),
        (status = 404, description = "No such sandbox or file", body = ApiErrorBody),
        (status = 409, description = "The sandbox is not running", body = ApiErrorBody),
    ))]
pub(crate) async fn read(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
    SandboxPath(id): SandboxPath,
    ApiQuery(q): ApiQuery<PathQuery>,
) -> Result<Response, ApiError> {
    check_path("path", &q.path)?;
    check_user(q.user.as_deref())?;
    let stream = st
        .manager
        .sandbox(&who, &id)?
        .read_file(&q.path, q.user.as_deref())
        .await?;
    let body = stream.map(|r| r.map_err(|e| std::io::Error::other(e.to_string())));
    let mut resp = Body::from_stream(body).into_response();
    resp.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    Ok(resp)
}

/// `PUT /v1/sandboxes/{id}/files?path=`: writes the body to the file (streamed), creating
/// parent directories; answers the file's entry (201 if it is new, 200 if replaced).
#[utoipa::path(put, path = "/v1/sandboxes/{id}/files", tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), PathQuery),
    request_body(description = "The file's new content (raw bytes, streamed)",
        content(("application/octet-stream"))),
    responses(
        (status = 201, description = "Created", body = FileEntry),
        (status = 200, description = "Replaced", body = FileEntry),
        (status = 400, description = "Bad path", body = ApiErrorBody),
        (status = 404, description = "No such sandbox", body = ApiErrorBody),
        (status = 409, description = "The sandbox is not running, or the path is a directory", body = ApiErrorBody),
        (status = 403, description = "The user may not write there (`permission_denied`)", body = ApiErrorBody),
        (status = 507, description = "The sandbox's disk is full (`no_space`)", body = ApiErrorBody),
    ))]
pub(crate) async fn write(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
    SandboxPath(id): SandboxPath,
    ApiQuery(q): ApiQuery<PathQuery>,
    body: Body,
) -> Response {
    let (stream, stop) = pump(body);
    match write_inner(&st, &who, &id, &q, stream).await {
        Ok(ok) => ok.into_response(),
        Err(e) => {
            // The client may still be sending: the rest of its body is read and discarded
            // for a while, so that it sees this answer rather than a reset connection.
            let _ = stop.send(());
            let mut r = e.into_response();
            r.headers_mut()
                .insert(CONNECTION, HeaderValue::from_static("close"));
            r
        }
    }
}

async fn write_inner(
    st: &AppState,
    who: &rampart_core::Principal,
    id: &SandboxId,
    q: &PathQuery,
    stream: BoxStream<'static, Result<Bytes, std::io::Error>>,
) -> Result<(StatusCode, Json<FileEntry>), ApiError> {
    check_path("path", &q.path)?;
    check_user(q.user.as_deref())?;
    let sandbox = st.manager.sandbox(who, id)?;
    sandbox.wake().await?;
    let user = q.user.as_deref();
    let existed = match sandbox.stat(&q.path, user).await {
        Ok(_) => true,
        Err(e) if is_not_found(&e) => false,
        // A parent that does not exist yet, or one that is not a directory: let the write say.
        Err(_) => false,
    };
    let written = sandbox
        .write_file(&q.path, user, stream)
        .await
        .map_err(core_write_error)?;
    let info = sandbox.stat(&written, user).await?;
    let status = if existed {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((status, Json(entry(info))))
}

/// How long a failed upload keeps reading (and discarding) the client's body.
const LINGER: Duration = Duration::from_secs(5);

/// Forwards an upload's body to the agent. Once `stop` fires (the write failed) or the agent
/// side stops taking data, the rest is read and discarded for at most [`LINGER`] (a client
/// that is still sending then reads the error answer instead of a reset), then dropped.
fn pump(
    body: Body,
) -> (
    BoxStream<'static, Result<Bytes, std::io::Error>>,
    oneshot::Sender<()>,
) {
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(4);
    let (stop_tx, mut stop) = oneshot::channel::<()>();
    tokio::spawn(async move {
        let mut data = body.into_data_stream();
        loop {
            let next = tokio::select! {
                biased;
                _ = &mut stop => break,
                next = data.next() => next,
            };
            let Some(chunk) = next else { return };
            let failed = chunk.is_err();
            let sent = tokio::select! {
                biased;
                _ = &mut stop => break,
                sent = tx.send(chunk.map_err(std::io::Error::other)) => sent,
            };
            if failed {
                return;
            }
            if sent.is_err() {
                break;
            }
        }
        // Ends the agent's request body; then discard what the client still sends.
        drop(tx);
        let deadline = tokio::time::Instant::now() + LINGER;
        while let Ok(Some(Ok(_))) = tokio::time::timeout_at(deadline, data.next()).await {}
    });
    let stream =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|c| (c, rx)) })
            .boxed();
    (stream, stop_tx)
}

/// `DELETE /v1/sandboxes/{id}/files?path=`: removes a file or a directory tree.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}/files", tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), PathQuery),
    responses(
        (status = 204, description = "Removed"),
        (status = 400, description = "Bad path", body = ApiErrorBody),
        (status = 404, description = "No such sandbox or file", body = ApiErrorBody),
    ))]
pub(crate) async fn remove(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
    SandboxPath(id): SandboxPath,
    ApiQuery(q): ApiQuery<PathQuery>,
) -> Result<StatusCode, ApiError> {
    check_path("path", &q.path)?;
    check_user(q.user.as_deref())?;
    st.manager
        .sandbox(&who, &id)?
        .remove_file(&q.path, q.user.as_deref())
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /v1/sandboxes/{id}/files/stat?path=`.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/stat", tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), PathQuery),
    responses(
        (status = 200, description = "The entry", body = FileEntry),
        (status = 404, description = "No such sandbox or file", body = ApiErrorBody),
    ))]
pub(crate) async fn stat(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
    SandboxPath(id): SandboxPath,
    ApiQuery(q): ApiQuery<PathQuery>,
) -> Result<Json<FileEntry>, ApiError> {
    check_path("path", &q.path)?;
    check_user(q.user.as_deref())?;
    let sandbox = st.manager.sandbox(&who, &id)?;
    Ok(Json(entry(sandbox.stat(&q.path, q.user.as_deref()).await?)))
}

/// `GET /v1/sandboxes/{id}/files/list?path=&depth=`.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/list", tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), ListQuery),
    responses(
        (status = 200, description = "The entries", body = FileList),
        (status = 400, description = "Bad path or depth", body = ApiErrorBody),
        (status = 404, description = "No such sandbox or directory", body = ApiErrorBody),
    ))]
pub(crate) async fn list(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
    SandboxPath(id): SandboxPath,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<Json<FileList>, ApiError> {
    check_path("path", &q.path)?;
    check_user(q.user.as_deref())?;
    let depth = q.depth.unwrap_or(1);
    if !(1..=MAX_LIST_DEPTH).contains(&depth) {
        return Err(ApiError::bad_request(format!(
            "depth: must be 1 to {MAX_LIST_DEPTH}"
        )));
    }
    let sandbox = st.manager.sandbox(&who, &id)?;
    let entries = sandbox.list_dir(&q.path, depth, q.user.as_deref()).await?;
    Ok(Json(FileList {
        entries: entries.into_iter().map(entry).collect(),
    }))
}

/// `POST /v1/sandboxes/{id}/files/mkdir`: creates a directory and its parents.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/files/mkdir", tag = "files",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = MakeDir,
    responses(
        (status = 201, description = "Created", body = FileEntry),
        (status = 400, description = "Bad input", body = ApiErrorBody),
        (status = 404, description = "No such sandbox", body = ApiErrorBody),
        (status = 409, description = "It already exists", body = ApiErrorBody),
        (status = 507, description = "The sandbox's disk is full (`no_space`)", body = ApiErrorBody),
    ))]
pub(crate) async fn mkdir(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
    SandboxPath(id): SandboxPath,
    ApiJson(req): ApiJson<MakeDir>,
) -> Result<(StatusCode, Json<FileEntry>), ApiError> {
    check_path("path", &req.path)?;
    check_user(req.user.as_deref())?;
    let info = st
        .manager
        .sandbox(&who, &id)?
        .make_dir(&req.path, req.user.as_deref())
        .await
        .map_err(core_write_error)?;
    Ok((StatusCode::CREATED, Json(entry(info))))
}

/// `POST /v1/sandboxes/{id}/files/move`: renames `from` to `to`.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/files/move", tag = "files",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = MoveFile,
    responses(
        (status = 200, description = "Moved; the entry at its new path", body = FileEntry),
        (status = 400, description = "Bad input", body = ApiErrorBody),
        (status = 404, description = "No such sandbox or source", body = ApiErrorBody),
    ))]
pub(crate) async fn rename(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
    SandboxPath(id): SandboxPath,
    ApiJson(req): ApiJson<MoveFile>,
) -> Result<Json<FileEntry>, ApiError> {
    check_path("from", &req.from)?;
    check_path("to", &req.to)?;
    check_user(req.user.as_deref())?;
    Ok(Json(entry(
        st.manager
            .sandbox(&who, &id)?
            .rename(&req.from, &req.to, req.user.as_deref())
            .await
            .map_err(core_write_error)?,
    )))
}

/// `GET /v1/sandboxes/{id}/files/watch?path=&recursive=`: NDJSON lines of changes, until the
/// client closes the connection.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/watch", tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), WatchQuery),
    responses(
        (status = 200, description = "NDJSON stream of changes", content_type = "application/x-ndjson", body = FileWatchEvent),
        (status = 404, description = "No such sandbox or directory", body = ApiErrorBody),
    ))]
pub(crate) async fn watch(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
    SandboxPath(id): SandboxPath,
    ApiQuery(q): ApiQuery<WatchQuery>,
) -> Result<Response, ApiError> {
    check_path("path", &q.path)?;
    check_user(q.user.as_deref())?;
    let sandbox = st.manager.sandbox(&who, &id)?;
    let events = sandbox
        .watch(&q.path, q.recursive.unwrap_or(false), q.user.as_deref())
        .await?;
    let lines = events
        .take_while(|r| {
            if let Err(e) = r {
                tracing::debug!("watch ended: {e}");
            }
            futures::future::ready(r.is_ok())
        })
        .filter_map(|r| futures::future::ready(r.ok()))
        .map(|ev| {
            let mut v = serde_json::to_vec(&FileWatchEvent {
                name: ev.name,
                kind: ev.kind,
            })
            .unwrap_or_default();
            v.push(b'\n');
            Ok::<_, Infallible>(Bytes::from(v))
        });
    Ok(crate::ndjson::response(Body::from_stream(lines)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_disk_is_507_no_space() {
        let e = write_error(AgentError::Rpc {
            code: "resource_exhausted".into(),
            message: "not enough disk space to write '/home/user/big'".into(),
        });
        assert_eq!((e.status.as_u16(), e.code), (507, "no_space"));
        assert!(e.message.contains("disk space"), "{e}");
        let e = write_error(AgentError::Rpc {
            code: "permission_denied".into(),
            message: "m".into(),
        });
        assert_eq!((e.status.as_u16(), e.code), (403, "permission_denied"));
        let e = write_error(AgentError::Unreachable("gone".into()));
        assert_eq!((e.status.as_u16(), e.code), (502, "agent_unreachable"));
    }
}
