//! The network API: a sandbox's policy (read, replace) and its network log (paged or
//! followed).

use crate::error::ApiError;
use crate::extract::{ApiJson, ApiQuery, SandboxPath};
use crate::ndjson;
use crate::AppState;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use rampart_types::network::{NetLogPage, NetworkInfo};
use rampart_types::{ApiErrorBody, NetworkPolicy};
use serde::Deserialize;
use std::convert::Infallible;
use std::time::Duration;
use tokio::sync::broadcast::error::RecvError;

/// Default page size of `GET /v1/sandboxes/{id}/network/log`.
pub const DEFAULT_NET_LOG_PAGE: usize = 1000;
/// Largest page size.
pub const MAX_NET_LOG_PAGE: usize = 10_000;

/// `?after=&limit=&follow=`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct NetLogQuery {
    /// Only entries with a larger `seq` (default: from the first kept).
    #[serde(default)]
    after: Option<u64>,
    /// Most entries per page (default 1000, at most 10000).
    #[serde(default)]
    limit: Option<usize>,
    /// `1` or `true`: stream NDJSON, one entry per line, as they happen, until the sandbox
    /// has ended (or the client leaves).
    #[serde(default)]
    follow: Option<String>,
}

/// `GET /v1/sandboxes/{id}/network`: the policy in force and the sandbox's addresses.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/network", tag = "network",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, description = "The policy and addresses", body = NetworkInfo),
        (status = 404, description = "No such sandbox", body = ApiErrorBody),
    ))]
pub(crate) async fn get(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
    SandboxPath(id): SandboxPath,
) -> Result<Json<NetworkInfo>, ApiError> {
    Ok(Json(st.manager.sandbox(&who, &id)?.network()?))
}

/// `PUT /v1/sandboxes/{id}/network`: replaces the policy of a running sandbox. New
/// connections obey it at once; live connections it denies are cut. Changing from or to
/// mode `none` adds or removes the sandbox's network link.
#[utoipa::path(put, path = "/v1/sandboxes/{id}/network", tag = "network",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = NetworkPolicy,
    responses(
        (status = 200, description = "The policy now in force", body = NetworkInfo),
        (status = 400, description = "Bad policy (unknown key, bad rule)", body = ApiErrorBody),
        (status = 404, description = "No such sandbox", body = ApiErrorBody),
        (status = 409, description = "The sandbox is not running", body = ApiErrorBody),
        (status = 503, description = "Sandbox networks are unavailable on this daemon", body = ApiErrorBody),
    ))]
pub(crate) async fn put(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
    SandboxPath(id): SandboxPath,
    ApiJson(policy): ApiJson<NetworkPolicy>,
) -> Result<Json<NetworkInfo>, ApiError> {
    Ok(Json(
        st.manager.sandbox(&who, &id)?.set_network(policy).await?,
    ))
}

/// `GET /v1/sandboxes/{id}/network/log`: every DNS answer and connection decision of the
/// sandbox (time, name, address, port, verdict, the rule that decided, bytes), paged; with
/// `?follow=1`, an NDJSON stream of entries as they happen.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/network/log", tag = "network",
    params(("id" = String, Path, description = "Sandbox id"), NetLogQuery),
    responses(
        (status = 200, description = "A page of entries (or, with follow, NDJSON lines of entries)", body = NetLogPage),
        (status = 400, description = "Bad query", body = ApiErrorBody),
        (status = 404, description = "No such sandbox", body = ApiErrorBody),
    ))]
pub(crate) async fn log(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
    SandboxPath(id): SandboxPath,
    ApiQuery(q): ApiQuery<NetLogQuery>,
) -> Result<Response, ApiError> {
    let limit = ndjson::page_limit(q.limit, DEFAULT_NET_LOG_PAGE, MAX_NET_LOG_PAGE)?;
    let after = q.after.unwrap_or(0);
    if !ndjson::is_true(q.follow.as_deref()) {
        let entries = st.manager.sandbox(&who, &id)?.network_log(after, limit)?;
        return Ok(Json(NetLogPage { entries }).into_response());
    }
    // Subscribe before reading the backlog, so no entry falls between the two.
    let mut sub = st.manager.sandbox(&who, &id)?.network_subscribe()?;
    let manager = st.manager.clone();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, Infallible>>(64);
    tokio::spawn(async move {
        let mut after = after;
        loop {
            // The backlog (or what a lagging receiver missed).
            loop {
                let page = match manager
                    .sandbox(&who, &id)
                    .and_then(|s| s.network_log(after, MAX_NET_LOG_PAGE))
                {
                    Ok(p) => p,
                    Err(_) => return,
                };
                let n = page.len();
                for e in &page {
                    after = e.seq;
                    if tx.send(Ok(ndjson::line(e))).await.is_err() {
                        return;
                    }
                }
                if n < MAX_NET_LOG_PAGE {
                    break;
                }
            }
            let Some(rx) = sub.as_mut() else {
                return;
            };
            loop {
                let got = tokio::select! {
                    r = rx.recv() => Some(r),
                    () = tokio::time::sleep(Duration::from_secs(1)) => None,
                    () = tx.closed() => return,
                };
                match got {
                    Some(Ok(e)) => {
                        if e.seq <= after {
                            continue;
                        }
                        after = e.seq;
                        if tx.send(Ok(ndjson::line(&e))).await.is_err() {
                            return;
                        }
                    }
                    Some(Err(RecvError::Lagged(_))) => break,
                    Some(Err(RecvError::Closed)) => return,
                    None => {
                        let alive = manager
                            .sandbox(&who, &id)
                            .and_then(|s| s.info())
                            .map(|i| i.state.is_alive())
                            .unwrap_or(false);
                        if !alive {
                            return;
                        }
                    }
                }
            }
        }
    });
    Ok(ndjson::channel_response(rx))
}
