//! E2B secrets (`/secrets`) on the daemon's secret store (`/v1/secrets`: one store, two
//! faces). A value is write-only: no answer carries it, and it never enters a sandbox. A
//! sandbox uses a secret through a placeholder `${e2b.secrets.<name>}` (the SDK's
//! `Secret.fill`) in a `network.rules` header transform: the egress proxy sets that header,
//! with the stored value in place of the placeholder, on the sandbox's requests to the
//! rule's host (see `network.rs`).

use super::{E2b, E2bError};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use rampart_core::secrets::E2bSecretInfo;
use rampart_core::CoreError;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// Most secrets per page (and the page when `limit` is not given).
const MAX_PAGE: usize = 100;

#[derive(Debug, Default, Deserialize)]
struct NewSecret {
    #[serde(default)]
    name: String,
    #[serde(default)]
    value: String,
    #[serde(default)]
    metadata: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Default, Deserialize)]
struct SecretUpdate {
    #[serde(default)]
    value: String,
    #[serde(default)]
    metadata: Option<BTreeMap<String, String>>,
}

/// `Secret` (never the value).
fn secret_json(s: &E2bSecretInfo) -> Value {
    json!({
        "secretID": s.id,
        "name": s.name,
        "currentVersion": s.version,
        "metadata": s.metadata,
        "createdAt": s.created_at,
        "updatedAt": s.updated_at,
    })
}

fn secret_err(id: &str, e: CoreError) -> E2bError {
    match e {
        CoreError::NotFound(_) => {
            E2bError::new(StatusCode::NOT_FOUND, format!("secret {id:?} not found"))
        }
        e => E2bError::from(e),
    }
}

/// `POST /secrets`: 201 `Secret` (version 1); 409 if the name is taken.
pub(crate) async fn create(
    State(st): State<E2b>,
    crate::caller::Caller(who): crate::caller::Caller,
    body: axum::body::Bytes,
) -> Result<Response, E2bError> {
    let n: NewSecret = super::wire::parse_body(&body)?;
    // The store is SQLite on the daemon's disk: quick, called inline as `/v1/secrets` is.
    let s = st
        .manager
        .create_e2b_secret(&who, &n.name, &n.value, n.metadata.as_ref())?;
    Ok((StatusCode::CREATED, Json(secret_json(&s))).into_response())
}

/// `POST /secrets/{id}`: the new value as the next version.
pub(crate) async fn update(
    State(st): State<E2b>,
    crate::caller::Caller(who): crate::caller::Caller,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<Json<Value>, E2bError> {
    let u: SecretUpdate = super::wire::parse_body(&body)?;
    let s = st
        .manager
        .update_e2b_secret(&who, &id, &u.value, u.metadata.as_ref())
        .map_err(|e| secret_err(&id, e))?;
    Ok(Json(secret_json(&s)))
}

/// `GET /secrets/{id}` (an id or a name).
pub(crate) async fn get_one(
    State(st): State<E2b>,
    crate::caller::Caller(who): crate::caller::Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, E2bError> {
    let s = st
        .manager
        .e2b_secret(&who, &id)
        .map_err(|e| secret_err(&id, e))?;
    Ok(Json(secret_json(&s)))
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct ListQuery {
    #[serde(default)]
    limit: Option<usize>,
    #[serde(default, rename = "nextToken")]
    next_token: Option<String>,
}

/// `GET /secrets`: by name, `limit` a page (at most 100), the next page's token in
/// `x-next-token` (the last name of the page).
pub(crate) async fn list(
    State(st): State<E2b>,
    crate::caller::Caller(who): crate::caller::Caller,
    Query(q): Query<ListQuery>,
) -> Result<Response, E2bError> {
    let all = st.manager.list_e2b_secrets(&who)?;
    let limit = match q.limit {
        Some(0) => return Err(E2bError::bad_request("limit: at least 1")),
        Some(n) => n.min(MAX_PAGE),
        None => MAX_PAGE,
    };
    let after = q.next_token.unwrap_or_default();
    let rest: Vec<&E2bSecretInfo> = all
        .iter()
        .filter(|s| after.is_empty() || s.name.as_str() > after.as_str())
        .collect();
    let page = &rest[..rest.len().min(limit)];
    let mut r = Json(Value::Array(page.iter().map(|s| secret_json(s)).collect())).into_response();
    if rest.len() > page.len() {
        if let Some(last) = page.last() {
            if let Ok(v) = HeaderValue::from_str(&last.name) {
                r.headers_mut().insert("x-next-token", v);
            }
        }
    }
    Ok(r)
}

/// `DELETE /secrets/{id}`: 204. Sandboxes already using it keep their copy until they end.
pub(crate) async fn delete(
    State(st): State<E2b>,
    crate::caller::Caller(who): crate::caller::Caller,
    Path(id): Path<String>,
) -> Result<StatusCode, E2bError> {
    st.manager
        .delete_e2b_secret(&who, &id)
        .map_err(|e| secret_err(&id, e))?;
    Ok(StatusCode::NO_CONTENT)
}
