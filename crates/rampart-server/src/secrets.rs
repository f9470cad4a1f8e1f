//! Named secrets held by the daemon (`/v1/secrets`, see `docs/network.md`): set (create or
//! replace), list (never the values), delete. A create refers to one by a `secrets` entry
//! with its name and no value.

use crate::error::ApiError;
use crate::extract::ApiJson;
use crate::AppState;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use rampart_core::CoreError;
use rampart_types::network::StoredSecretInfo;
use rampart_types::{ApiErrorBody, SecretSpec};

/// `POST /v1/secrets`: creates or replaces a named secret. The answer has everything but
/// the value.
#[utoipa::path(post, path = "/v1/secrets", tag = "secrets",
    request_body = SecretSpec,
    responses(
        (status = 200, description = "Stored (created or replaced); the value is not returned", body = StoredSecretInfo),
        (status = 400, description = "Bad name, empty value or one with CR/LF/NUL, no hosts or an address as host, bad injection or env var", body = ApiErrorBody),
    ))]
pub(crate) async fn set(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
    ApiJson(spec): ApiJson<SecretSpec>,
) -> Result<Json<StoredSecretInfo>, ApiError> {
    Ok(Json(st.manager.set_secret(&who, spec)?))
}

/// `GET /v1/secrets`: the stored secrets, by name, without their values.
#[utoipa::path(get, path = "/v1/secrets", tag = "secrets",
    responses((status = 200, description = "Stored secrets (never their values)", body = [StoredSecretInfo])))]
pub(crate) async fn list(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
) -> Result<Json<Vec<StoredSecretInfo>>, ApiError> {
    Ok(Json(st.manager.list_secrets(&who)?))
}

/// `DELETE /v1/secrets/{name}`: removes a stored secret. Sandboxes created with it keep
/// their copy until they end.
#[utoipa::path(delete, path = "/v1/secrets/{name}", tag = "secrets",
    params(("name" = String, Path, description = "Secret name")),
    responses(
        (status = 204, description = "Removed"),
        (status = 404, description = "No such secret", body = ApiErrorBody),
    ))]
pub(crate) async fn delete(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    match st.manager.delete_secret(&who, &name) {
        Ok(()) => Ok(StatusCode::NO_CONTENT),
        Err(CoreError::NotFound(_)) => Err(ApiError::not_found(format!("secret {name} not found"))),
        Err(e) => Err(e.into()),
    }
}
