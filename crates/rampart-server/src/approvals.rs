//! `/v1/approvals`: the requests sandboxes' approval policies hold, and their decisions (a
//! key with the `approve` scope; a tenant's key decides only its tenant's).

use crate::error::ApiError;
use crate::extract::parse_json;
use crate::AppState;
use axum::extract::{Path, State};
use axum::Json;
use rampart_types::{ApiErrorBody, ApprovalInfo, Decide, Decision};

/// `GET /v1/approvals`: what is held, oldest first.
#[utoipa::path(get, path = "/v1/approvals", tag = "approvals",
    responses(
        (status = 200, description = "Pending approvals", body = Vec<ApprovalInfo>),
        (status = 403, description = "The key lacks the approve scope", body = ApiErrorBody),
    ))]
pub(crate) async fn list(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
) -> Result<Json<Vec<ApprovalInfo>>, ApiError> {
    Ok(Json(st.manager.approvals(&who)))
}

/// `GET /v1/approvals/{id}`.
#[utoipa::path(get, path = "/v1/approvals/{id}", tag = "approvals",
    params(("id" = String, Path, description = "Approval id")),
    responses(
        (status = 200, description = "The pending approval", body = ApprovalInfo),
        (status = 404, description = "No such pending approval", body = ApiErrorBody),
        (status = 409, description = "Already decided", body = ApiErrorBody),
    ))]
pub(crate) async fn get_one(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
    Path(id): Path<String>,
) -> Result<Json<ApprovalInfo>, ApiError> {
    Ok(Json(st.manager.approval(&who, &id)?))
}

async fn decide(
    st: AppState,
    who: crate::caller::Caller,
    id: String,
    approve: bool,
    body: axum::body::Bytes,
) -> Result<Json<Decision>, ApiError> {
    // The body is optional: none, or `{"reason": ...}`.
    let reason = if body.iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        parse_json::<Decide>(&body)?.reason
    };
    if reason.as_ref().is_some_and(|r| r.len() > 4096) {
        return Err(ApiError::bad_request("reason: at most 4096 bytes"));
    }
    Ok(Json(
        st.manager.decide_approval(&who, &id, approve, reason)?,
    ))
}

/// `POST /v1/approvals/{id}/approve`: the held exec runs, exactly as it was asked.
#[utoipa::path(post, path = "/v1/approvals/{id}/approve", tag = "approvals",
    params(("id" = String, Path, description = "Approval id")),
    request_body(content = Decide, description = "Optional: `{\"reason\": ...}`"),
    responses(
        (status = 200, description = "Approved", body = Decision),
        (status = 403, description = "The key lacks the approve scope, or asked for it itself", body = ApiErrorBody),
        (status = 404, description = "No such pending approval", body = ApiErrorBody),
        (status = 409, description = "Already decided", body = ApiErrorBody),
    ))]
pub(crate) async fn approve(
    State(st): State<AppState>,
    who: crate::caller::Caller,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<Json<Decision>, ApiError> {
    decide(st, who, id, true, body).await
}

/// `POST /v1/approvals/{id}/deny`: the held exec answers 403 `denied` and never starts.
#[utoipa::path(post, path = "/v1/approvals/{id}/deny", tag = "approvals",
    params(("id" = String, Path, description = "Approval id")),
    request_body(content = Decide, description = "Optional: `{\"reason\": ...}`"),
    responses(
        (status = 200, description = "Denied", body = Decision),
        (status = 403, description = "The key lacks the approve scope, or asked for it itself", body = ApiErrorBody),
        (status = 404, description = "No such pending approval", body = ApiErrorBody),
        (status = 409, description = "Already decided", body = ApiErrorBody),
    ))]
pub(crate) async fn deny(
    State(st): State<AppState>,
    who: crate::caller::Caller,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<Json<Decision>, ApiError> {
    decide(st, who, id, false, body).await
}
