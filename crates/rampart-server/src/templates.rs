//! Templates (read-only; builds are `rampart template build` on the host, see
//! `docs/templates.md`).

use crate::error::ApiError;
use crate::AppState;
use axum::extract::{Path, State};
use axum::Json;
use rampart_core::CoreError;
use rampart_types::{ApiErrorBody, TemplateInfo};

/// `GET /v1/templates`: the built-in templates and the built ones the caller sees (a tenant:
/// the operator's and its own).
#[utoipa::path(get, path = "/v1/templates", tag = "templates",
    responses((status = 200, description = "Templates: built-in first, then built ones by name", body = [TemplateInfo])))]
pub(crate) async fn list(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
) -> Result<Json<Vec<TemplateInfo>>, ApiError> {
    Ok(Json(st.manager.templates(&who)))
}

/// `GET /v1/templates/{name}`: one template.
#[utoipa::path(get, path = "/v1/templates/{name}", tag = "templates",
    params(("name" = String, Path, description = "Template name")),
    responses(
        (status = 200, description = "The template", body = TemplateInfo),
        (status = 404, description = "No such template", body = ApiErrorBody),
    ))]
pub(crate) async fn get_one(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
    Path(name): Path<String>,
) -> Result<Json<TemplateInfo>, ApiError> {
    // Another tenant's template is not found, as a name that does not exist.
    match st.manager.template(&who, &name) {
        Ok(t) => Ok(Json(t)),
        Err(CoreError::NoTemplate(_)) => {
            Err(ApiError::not_found(format!("template {name} not found")))
        }
        Err(e) => Err(e.into()),
    }
}
