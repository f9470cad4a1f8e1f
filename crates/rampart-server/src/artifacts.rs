//! The artifacts API: what a sandbox kept when it ended (`artifacts` at create), listed and
//! downloaded after it is gone, while the node's retention lasts.

use crate::error::ApiError;
use crate::extract::{ApiQuery, SandboxPath};
use crate::AppState;
use axum::body::Body;
use axum::extract::State;
use axum::http::header::{CONTENT_DISPOSITION, CONTENT_LENGTH, CONTENT_TYPE, ETAG};
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use axum::Json;
use rampart_types::ApiErrorBody;
use serde::Deserialize;

/// `?path=`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct ArtifactQuery {
    /// The file to download: its absolute path inside the sandbox, as the list names it.
    /// Absent: the list.
    #[serde(default)]
    path: Option<String>,
}

/// `GET /v1/sandboxes/{id}/artifacts`: the files the sandbox kept when it ended, with their
/// sizes and SHA-256 digests (as its `destroyed` record lists them); with `?path=P`, the
/// bytes of one (`X-Rampart-Sha256` names their digest).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/artifacts", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id"), ArtifactQuery),
    responses(
        (status = 200, description = "The list (JSON), or with `path` the file's bytes", body = rampart_types::ArtifactList),
        (status = 404, description = "No such sandbox, no artifacts (none kept, or their retention passed), or no such file", body = ApiErrorBody),
        (status = 409, description = "The sandbox still runs: nothing is kept before it ends", body = ApiErrorBody),
    ))]
pub(crate) async fn get(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
    SandboxPath(id): SandboxPath,
    ApiQuery(q): ApiQuery<ArtifactQuery>,
) -> Result<Response, ApiError> {
    let m = &*st.manager;
    let Some(path) = q.path else {
        return Ok(Json(m.sandbox(&who, &id)?.artifacts()?).into_response());
    };
    let (f, file) = m.sandbox(&who, &id)?.artifact(&path)?;
    let stream = tokio_util::io::ReaderStream::new(tokio::fs::File::from_std(file));
    let mut resp = Body::from_stream(stream).into_response();
    let h = resp.headers_mut();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    h.insert(CONTENT_LENGTH, HeaderValue::from(f.size));
    let hex = f.digest.to_hex();
    if let Ok(v) = HeaderValue::from_str(&hex) {
        h.insert("x-rampart-sha256", v);
    }
    if let Ok(v) = HeaderValue::from_str(&format!("\"{hex}\"")) {
        h.insert(ETAG, v);
    }
    let name: String = path
        .rsplit('/')
        .next()
        .unwrap_or("artifact")
        .chars()
        .filter(|c| c.is_ascii_graphic() && *c != '"' && *c != '\\')
        .collect();
    if let Ok(v) = HeaderValue::from_str(&format!("attachment; filename=\"{name}\"")) {
        h.insert(CONTENT_DISPOSITION, v);
    }
    Ok(resp)
}
