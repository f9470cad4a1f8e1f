//! Lifecycle endpoints: create, list, get, destroy, set timeout.

use crate::error::ApiError;
use crate::extract::{ApiJson, QueryPairs, SandboxPath};
use crate::AppState;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use rampart_types::{
    ApiErrorBody, CreateSandbox, PauseSandbox, ResumeSandbox, SandboxInfo, SandboxState,
    SandboxStats, SetTimeout,
};
use std::collections::BTreeMap;

/// `POST /v1/sandboxes`: creates a sandbox and answers once its agent is up.
#[utoipa::path(post, path = "/v1/sandboxes", tag = "sandboxes",
    request_body = CreateSandbox,
    responses(
        (status = 201, description = "Created and running; with its `access_token`", body = SandboxInfo),
        (status = 400, description = "Bad input; the message names the field", body = ApiErrorBody),
        (status = 413, description = "Body above 1 MiB", body = ApiErrorBody),
        (status = 422, description = "A limit above the daemon's maximum", body = ApiErrorBody),
        (status = 503, description = "The host is out of capacity", body = ApiErrorBody),
    ))]
pub(crate) async fn create(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
    ApiJson(req): ApiJson<CreateSandbox>,
) -> Result<(StatusCode, Json<SandboxInfo>), ApiError> {
    // Core validates the public ports and records the access token with the sandbox.
    let info = st.manager.create(&who, req).await?;
    Ok((StatusCode::CREATED, Json(info)))
}

/// Parses the list filters: `state=S`, `metadata=k=v` (repeatable) or `metadata.k=v`.
fn list_filters(
    pairs: Vec<(String, String)>,
) -> Result<(Option<SandboxState>, BTreeMap<String, String>), ApiError> {
    let mut state = None;
    let mut metadata = BTreeMap::new();
    for (k, v) in pairs {
        if k == "state" {
            if v.is_empty() {
                continue;
            }
            let s = SandboxState::parse(&v).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "state: unknown state {v:?}; expected one of creating, running, stopping, \
                     destroyed, failed"
                ))
            })?;
            state = Some(s);
        } else if k == "metadata" {
            let (mk, mv) = v.split_once('=').ok_or_else(|| {
                ApiError::bad_request(format!("metadata: expected key=value, got {v:?}"))
            })?;
            if mk.is_empty() {
                return Err(ApiError::bad_request("metadata: empty key"));
            }
            metadata.insert(mk.to_owned(), mv.to_owned());
        } else if let Some(mk) = k.strip_prefix("metadata.") {
            if mk.is_empty() {
                return Err(ApiError::bad_request("metadata: empty key"));
            }
            metadata.insert(mk.to_owned(), v);
        } else {
            return Err(ApiError::bad_request(format!(
                "{k}: unknown query parameter; expected state, metadata=key=value or metadata.key=value"
            )));
        }
    }
    Ok((state, metadata))
}

/// `GET /v1/sandboxes`: the sandboxes matching the filters (the alive ones without `state`).
#[utoipa::path(get, path = "/v1/sandboxes", tag = "sandboxes",
    params(
        ("state" = Option<String>, Query, description = "Only sandboxes in this state \
            (creating, running, stopping, destroyed, failed); alive ones when absent"),
        ("metadata" = Option<Vec<String>>, Query, description = "Repeatable `key=value`: only \
            sandboxes whose metadata has every pair. `metadata.key=value` works too."),
    ),
    responses(
        (status = 200, description = "The matching sandboxes", body = Vec<SandboxInfo>),
        (status = 400, description = "Bad filter", body = ApiErrorBody),
    ))]
pub(crate) async fn list(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
    QueryPairs(pairs): QueryPairs,
) -> Result<Json<Vec<SandboxInfo>>, ApiError> {
    let (state, metadata) = list_filters(pairs)?;
    Ok(Json(st.manager.list(&who, state, &metadata)?))
}

/// `GET /v1/sandboxes/{id}`.
#[utoipa::path(get, path = "/v1/sandboxes/{id}", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, description = "The sandbox (any state; with its `access_token` while running or paused)", body = SandboxInfo),
        (status = 400, description = "Malformed id", body = ApiErrorBody),
        (status = 404, description = "No such sandbox", body = ApiErrorBody),
    ))]
pub(crate) async fn get_one(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
    SandboxPath(id): SandboxPath,
) -> Result<Json<SandboxInfo>, ApiError> {
    let mut info = st.manager.sandbox(&who, &id)?.info()?;
    if matches!(info.state, SandboxState::Running | SandboxState::Paused) {
        info.access_token = Some(st.ports.ensure_token(&id).await?);
    }
    Ok(Json(info))
}

/// `GET /v1/sandboxes/{id}/stats`: its CPU, memory and processes now, from its cgroup.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/stats", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, description = "One sample", body = SandboxStats),
        (status = 400, description = "Malformed id", body = ApiErrorBody),
        (status = 404, description = "No such sandbox", body = ApiErrorBody),
        (status = 409, description = "The sandbox is not running or paused", body = ApiErrorBody),
    ))]
pub(crate) async fn stats(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
    SandboxPath(id): SandboxPath,
) -> Result<Json<SandboxStats>, ApiError> {
    let manager = &*st.manager;
    let info = manager.sandbox(&who, &id)?.info()?;
    let u = manager.sandbox(&who, &id)?.usage().await?;
    let taken_at_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    Ok(Json(SandboxStats {
        taken_at_ms,
        cpu_usec: u.cpu_usec,
        cpus: info.limits.cpus,
        memory_bytes: u.memory_bytes,
        memory_peak_bytes: u.memory_peak_bytes,
        memory_limit_bytes: info.limits.memory_bytes,
        pids: u.pids,
        pids_limit: info.limits.pids,
    }))
}

/// `DELETE /v1/sandboxes/{id}`: destroys the sandbox, answers its final record.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, description = "Destroyed; the final record", body = SandboxInfo),
        (status = 400, description = "Malformed id", body = ApiErrorBody),
        (status = 404, description = "No such sandbox", body = ApiErrorBody),
        (status = 409, description = "Not in a state that can be destroyed", body = ApiErrorBody),
    ))]
pub(crate) async fn destroy(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
    SandboxPath(id): SandboxPath,
) -> Result<Json<SandboxInfo>, ApiError> {
    // Its access is forgotten by the store with its end.
    Ok(Json(st.manager.sandbox(&who, &id)?.destroy().await?))
}

/// `POST /v1/sandboxes/{id}/timeout`: sets the deadline to now + `timeout_secs`.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/timeout", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = SetTimeout,
    responses(
        (status = 200, description = "The sandbox with its new deadline", body = SandboxInfo),
        (status = 400, description = "Bad input", body = ApiErrorBody),
        (status = 404, description = "No such sandbox", body = ApiErrorBody),
        (status = 409, description = "The sandbox is not running", body = ApiErrorBody),
        (status = 422, description = "Above the daemon's maximum timeout", body = ApiErrorBody),
    ))]
pub(crate) async fn set_timeout(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
    SandboxPath(id): SandboxPath,
    ApiJson(req): ApiJson<SetTimeout>,
) -> Result<Json<SandboxInfo>, ApiError> {
    Ok(Json(
        st.manager
            .sandbox(&who, &id)?
            .set_timeout(req.timeout_secs)
            .await?,
    ))
}

/// `POST /v1/sandboxes/{id}/pause`: freezes every process of the sandbox (no CPU used,
/// memory kept); commands and files answer 409 until it is resumed. Idempotent. With the
/// optional body `{"memory": false}`, pauses it to its filesystem instead: every process
/// ends, the disk is kept, and the resume boots it again from that disk.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/pause", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body(content = PauseSandbox, description = "Optional"),
    responses(
        (status = 200, description = "Paused (or already paused)", body = SandboxInfo),
        (status = 400, description = "Malformed id", body = ApiErrorBody),
        (status = 404, description = "No such sandbox", body = ApiErrorBody),
        (status = 409, description = "The sandbox is neither running nor paused", body = ApiErrorBody),
    ))]
pub(crate) async fn pause(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
    SandboxPath(id): SandboxPath,
    body: axum::body::Bytes,
) -> Result<Json<SandboxInfo>, ApiError> {
    let req: PauseSandbox = optional_body(&body)?;
    if req.disk {
        return Ok(Json(
            st.manager
                .sandbox(&who, &id)?
                .pause_to_disk(req.memory)
                .await?,
        ));
    }
    if req.memory {
        return Ok(Json(st.manager.sandbox(&who, &id)?.pause().await?));
    }
    let m = &*st.manager;
    Ok(Json(m.sandbox(&who, &id)?.pause_with(false).await?))
}

/// An optional JSON body: empty is `T::default()`.
fn optional_body<T: serde::de::DeserializeOwned + Default>(body: &[u8]) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    crate::extract::parse_json(body)
}

/// `POST /v1/sandboxes/{id}/resume`: every process of a paused sandbox continues where it
/// was. Idempotent. If its deadline passed while it was paused (`on_timeout: pause`), the new
/// deadline is now + the daemon's default timeout. A sandbox paused to its filesystem, or
/// any with the optional body `{"reboot": true}`, boots again from its disk instead.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/resume", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body(content = ResumeSandbox, description = "Optional"),
    responses(
        (status = 200, description = "Running again (or was running)", body = SandboxInfo),
        (status = 400, description = "Malformed id", body = ApiErrorBody),
        (status = 404, description = "No such sandbox", body = ApiErrorBody),
        (status = 409, description = "The sandbox is neither running nor paused", body = ApiErrorBody),
    ))]
pub(crate) async fn resume(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
    SandboxPath(id): SandboxPath,
    body: axum::body::Bytes,
) -> Result<Json<SandboxInfo>, ApiError> {
    let req: ResumeSandbox = optional_body(&body)?;
    if !req.reboot {
        return Ok(Json(st.manager.sandbox(&who, &id)?.resume().await?));
    }
    let m = &*st.manager;
    Ok(Json(m.sandbox(&who, &id)?.resume_with(true).await?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn filters_parse() {
        let (s, m) = list_filters(pairs(&[
            ("state", "running"),
            ("metadata", "a=1"),
            ("metadata.b", "x=y"),
        ]))
        .unwrap();
        assert_eq!(s, Some(SandboxState::Running));
        assert_eq!(m.get("a").map(String::as_str), Some("1"));
        assert_eq!(m.get("b").map(String::as_str), Some("x=y"));
        assert!(list_filters(pairs(&[("state", "zombie")])).is_err());
        assert!(list_filters(pairs(&[("metadata", "novalue")])).is_err());
        assert!(list_filters(pairs(&[("limit", "3")])).is_err());
    }
}

/// `GET /v1/pools` (admin): the node's warm pools, with the ids of the sandboxes they hold
/// (nobody's until a create claims one).
#[utoipa::path(get, path = "/v1/pools", tag = "sandboxes",
    responses(
        (status = 200, description = "Each pool: template, tier, size, ready, filling", body = Vec<rampart_types::PoolInfo>),
        (status = 403, description = "A tenant's key: pools are the node's", body = ApiErrorBody),
    ))]
pub(crate) async fn pools(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
) -> Result<Json<Vec<rampart_types::PoolInfo>>, ApiError> {
    if who.tenant.is_some() {
        return Err(ApiError::new(
            axum::http::StatusCode::FORBIDDEN,
            "forbidden",
            "warm pools are the node's: a tenant's key cannot see them",
        ));
    }
    Ok(Json(st.manager.pools()))
}
