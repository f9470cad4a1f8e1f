//! Snapshots, fork and volumes (see `docs/persistence.md`).

use crate::error::ApiError;
use crate::extract::{ApiJson, SandboxPath};
use crate::AppState;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use rampart_core::CoreError;
use rampart_types::{
    ApiErrorBody, CreateSnapshot, CreateVolume, ForkResult, ForkSandbox, SnapshotInfo, VolumeInfo,
};

/// Maps the errors of a named snapshot or volume (`what` = "snapshot NAME").
fn named(what: &str, e: CoreError) -> ApiError {
    match e {
        CoreError::NotFound(_) => ApiError::not_found(format!("{what} not found")),
        CoreError::WrongState { state, .. } => ApiError::new(
            StatusCode::CONFLICT,
            "conflict",
            format!("{what} is {state}"),
        ),
        e => e.into(),
    }
}

/// `POST /v1/sandboxes/{id}/snapshots`: takes a snapshot of the sandbox's filesystem.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/snapshots", tag = "persistence",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = CreateSnapshot,
    responses(
        (status = 201, description = "Taken (the sandbox was frozen while its disk was copied)", body = SnapshotInfo),
        (status = 400, description = "Bad name, a name in use, or `memory: true` (this tier keeps the filesystem only; the message says why)", body = ApiErrorBody),
        (status = 404, description = "No such sandbox", body = ApiErrorBody),
        (status = 409, description = "The sandbox is neither running nor paused", body = ApiErrorBody),
    ))]
pub(crate) async fn snapshot(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
    SandboxPath(id): SandboxPath,
    ApiJson(req): ApiJson<CreateSnapshot>,
) -> Result<(StatusCode, Json<SnapshotInfo>), ApiError> {
    let info = st.manager.sandbox(&who, &id)?.snapshot(req).await?;
    Ok((StatusCode::CREATED, Json(info)))
}

/// `GET /v1/snapshots`: every snapshot.
#[utoipa::path(get, path = "/v1/snapshots", tag = "persistence",
    responses((status = 200, description = "Snapshots, oldest first", body = [SnapshotInfo])))]
pub(crate) async fn list_snapshots(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
) -> Result<Json<Vec<SnapshotInfo>>, ApiError> {
    Ok(Json(st.manager.list_snapshots(&who)?))
}

/// `GET /v1/snapshots/{name}`: one snapshot.
#[utoipa::path(get, path = "/v1/snapshots/{name}", tag = "persistence",
    params(("name" = String, Path, description = "Snapshot name")),
    responses(
        (status = 200, description = "The snapshot", body = SnapshotInfo),
        (status = 404, description = "No such snapshot", body = ApiErrorBody),
    ))]
pub(crate) async fn get_snapshot(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
    Path(name): Path<String>,
) -> Result<Json<SnapshotInfo>, ApiError> {
    let m = st.manager;
    m.get_snapshot(&who, &name)
        .map(Json)
        .map_err(|e| named(&format!("snapshot {name}"), e))
}

/// `DELETE /v1/snapshots/{name}`: removes a snapshot (sandboxes made from it keep their own
/// copy). 409 while a create is cloning it.
#[utoipa::path(delete, path = "/v1/snapshots/{name}", tag = "persistence",
    params(("name" = String, Path, description = "Snapshot name")),
    responses(
        (status = 204, description = "Removed"),
        (status = 404, description = "No such snapshot", body = ApiErrorBody),
        (status = 409, description = "A create is using it", body = ApiErrorBody),
    ))]
pub(crate) async fn delete_snapshot(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    st.manager
        .delete_snapshot(&who, &name)
        .await
        .map_err(|e| named(&format!("snapshot {name}"), e))?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/sandboxes/{id}/fork`: makes `count` sandboxes from one consistent point.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/fork", tag = "persistence",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = ForkSandbox,
    responses(
        (status = 201, description = "The new sandboxes, each with a fresh identity and its own `access_token` (the source's public ports stay public)", body = ForkResult),
        (status = 400, description = "Bad count", body = ApiErrorBody),
        (status = 404, description = "No such sandbox", body = ApiErrorBody),
        (status = 409, description = "The sandbox is neither running nor paused", body = ApiErrorBody),
        (status = 503, description = "Out of capacity (no fork is left behind)", body = ApiErrorBody),
    ))]
pub(crate) async fn fork(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
    SandboxPath(id): SandboxPath,
    ApiJson(req): ApiJson<ForkSandbox>,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse as _;
    // A fork of `count` is `count` creates against its tenant's rate: the guard counted
    // one, the rest are counted here, all or none.
    let more = u64::from(req.count).saturating_sub(1);
    let tenant = who.tenant.clone();
    if let (Some(t), Some(tenancy), true) = (tenant, &st.tenancy, more > 0) {
        if let Err(refused) = tenancy.take_creates(&t, more) {
            return Ok(refused.native());
        }
    }
    // Each fork has its own access token and the source's public ports, from core.
    let res = st.manager.sandbox(&who, &id)?.fork(req).await?;
    Ok((StatusCode::CREATED, Json(res)).into_response())
}

/// `POST /v1/volumes`: makes a volume.
#[utoipa::path(post, path = "/v1/volumes", tag = "persistence",
    request_body = CreateVolume,
    responses(
        (status = 201, description = "Made", body = VolumeInfo),
        (status = 400, description = "Bad name or size, or a name in use", body = ApiErrorBody),
    ))]
pub(crate) async fn create_volume(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
    ApiJson(req): ApiJson<CreateVolume>,
) -> Result<(StatusCode, Json<VolumeInfo>), ApiError> {
    let v = st.manager.create_volume(&who, req).await?;
    Ok((StatusCode::CREATED, Json(v)))
}

/// `GET /v1/volumes`: every volume.
#[utoipa::path(get, path = "/v1/volumes", tag = "persistence",
    responses((status = 200, description = "Volumes by name", body = [VolumeInfo])))]
pub(crate) async fn list_volumes(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
) -> Result<Json<Vec<VolumeInfo>>, ApiError> {
    Ok(Json(st.manager.list_volumes(&who)?))
}

/// `DELETE /v1/volumes/{name}`: removes a volume and its data; 409 while mounted.
#[utoipa::path(delete, path = "/v1/volumes/{name}", tag = "persistence",
    params(("name" = String, Path, description = "Volume name")),
    responses(
        (status = 204, description = "Removed"),
        (status = 404, description = "No such volume", body = ApiErrorBody),
        (status = 409, description = "A sandbox has it mounted", body = ApiErrorBody),
    ))]
pub(crate) async fn delete_volume(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    st.manager
        .delete_volume(&who, &name)
        .await
        .map_err(|e| named(&format!("volume {name}"), e))?;
    Ok(StatusCode::NO_CONTENT)
}
