//! The audit API: a sandbox's event log (paged or followed), its bundle, the node's key.

use crate::error::ApiError;
use crate::extract::{ApiQuery, SandboxPath};
use crate::ndjson;
use crate::AppState;
use axum::body::Body;
use axum::extract::State;
use axum::http::header::{CONTENT_DISPOSITION, CONTENT_TYPE};
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use rampart_types::ApiErrorBody;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::time::Duration;

/// Default page size of `GET /v1/sandboxes/{id}/audit`.
pub const DEFAULT_AUDIT_PAGE: usize = 1000;
/// Largest page size.
pub const MAX_AUDIT_PAGE: usize = 10_000;

/// `?after=&limit=&follow=`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct AuditQuery {
    /// Only events with a larger `seq` (default: from the first).
    #[serde(default)]
    after: Option<u64>,
    /// Most events per page (default 1000, at most 10000).
    #[serde(default)]
    limit: Option<usize>,
    /// `1` or `true`: stream NDJSON, one event per line, as they are appended, until the
    /// sandbox has ended and its last event was sent (or the client leaves).
    #[serde(default)]
    follow: Option<String>,
}

/// A page of a sandbox's audit log.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct AuditPage {
    /// Events in order (see `docs/proof.md` for their format).
    #[schema(value_type = Vec<Object>)]
    pub events: Vec<rampart_types::audit::Event>,
    /// The `seq` to pass as `after` for the next page; `null` when this page is empty.
    pub next_after: Option<u64>,
}

/// The node's audit key.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AuditKey {
    /// The Ed25519 public key: `ed25519:<64 hex>`.
    pub public_key: String,
    /// SHA-256 of the raw public key, hex.
    pub key_id: String,
    /// Content digest of each template, as `created` events record it.
    pub templates: BTreeMap<String, String>,
}

/// `GET /v1/sandboxes/{id}/audit`: the sandbox's audit events, paged; with `?follow=1`, an
/// NDJSON stream of them as they are appended.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/audit", tag = "audit",
    params(("id" = String, Path, description = "Sandbox id"), AuditQuery),
    responses(
        (status = 200, description = "A page of events (or, with follow, NDJSON lines of events)", body = AuditPage),
        (status = 400, description = "Bad query", body = ApiErrorBody),
        (status = 404, description = "No such sandbox", body = ApiErrorBody),
    ))]
pub(crate) async fn events(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
    SandboxPath(id): SandboxPath,
    ApiQuery(q): ApiQuery<AuditQuery>,
) -> Result<Response, ApiError> {
    let limit = ndjson::page_limit(q.limit, DEFAULT_AUDIT_PAGE, MAX_AUDIT_PAGE)?;
    if !ndjson::is_true(q.follow.as_deref()) {
        let events = st
            .manager
            .sandbox(&who, &id)?
            .audit_events(q.after, limit)?;
        let next_after = events.last().map(|e| e.seq).or(q.after);
        return Ok(Json(AuditPage { events, next_after }).into_response());
    }
    // Checks the sandbox exists before answering 200.
    st.manager.sandbox(&who, &id)?.info()?;
    let mut changes = st.manager.audit_subscribe();
    let manager = st.manager.clone();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, Infallible>>(16);
    let mut after = q.after;
    tokio::spawn(async move {
        loop {
            // Mark the current version seen before reading, so no append is missed.
            changes.borrow_and_update();
            let sandbox = match manager.sandbox(&who, &id) {
                Ok(s) => s,
                Err(e) => {
                    tracing::debug!(id = %id, "following the audit log: {e}");
                    return;
                }
            };
            let ended = sandbox.info().map(|i| !i.state.is_alive()).unwrap_or(true);
            let events = match sandbox.audit_events(after, MAX_AUDIT_PAGE) {
                Ok(e) => e,
                Err(e) => {
                    tracing::debug!(id = %id, "following the audit log: {e}");
                    return;
                }
            };
            let got = events.len();
            for e in events {
                after = Some(e.seq);
                if tx.send(Ok(ndjson::line(&e))).await.is_err() {
                    return;
                }
            }
            if got == MAX_AUDIT_PAGE {
                continue;
            }
            if ended {
                return;
            }
            // Wake on an append, or re-check the sandbox's state now and then.
            tokio::select! {
                _ = changes.changed() => {}
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
                () = tx.closed() => return,
            }
        }
    });
    Ok(ndjson::channel_response(rx))
}

/// `GET /v1/sandboxes/{id}/packages`: the packages the sandbox fetched (or was refused)
/// through its network, read from its audit record (`package` events), oldest first. Works
/// as long as the record does, after the sandbox is destroyed too.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/packages", tag = "audit",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, description = "Package downloads, oldest first", body = Vec<rampart_types::network::PackageEntry>),
        (status = 404, description = "No such sandbox", body = ApiErrorBody),
    ))]
pub(crate) async fn packages(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
    SandboxPath(id): SandboxPath,
) -> Result<Json<Vec<rampart_types::network::PackageEntry>>, ApiError> {
    use rampart_types::audit::EventBody;
    let mut out = Vec::new();
    let mut after = None;
    loop {
        let events = st
            .manager
            .sandbox(&who, &id)?
            .audit_events(after, MAX_AUDIT_PAGE)?;
        let n = events.len();
        for e in events {
            after = Some(e.seq);
            if let EventBody::Package(p) = e.body {
                out.push(rampart_types::network::PackageEntry {
                    seq: e.seq,
                    time: e.time,
                    ecosystem: p.ecosystem,
                    name: p.name,
                    version: p.version,
                    registry: p.registry,
                    path: p.path,
                    sha256: p.sha256.map(|h| h.to_hex()),
                    size: p.size,
                    verdict: p.verdict,
                    rule: p.rule,
                });
            }
        }
        if n < MAX_AUDIT_PAGE {
            return Ok(Json(out));
        }
    }
}

/// `GET /v1/sandboxes/{id}/audit/bundle`: the sandbox's bundle (events, blobs, signed tree
/// head, inclusion proof, public key), verifiable offline with `rampart audit verify`.
/// Publishes the sandbox's chain head first if it moved since its last publication.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/audit/bundle", tag = "audit",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, description = "The bundle (`rampart.audit.bundle.v1`, JSON)", content_type = "application/json"),
        (status = 400, description = "No audit event was recorded for this sandbox", body = ApiErrorBody),
        (status = 404, description = "No such sandbox", body = ApiErrorBody),
    ))]
pub(crate) async fn bundle(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
    SandboxPath(id): SandboxPath,
) -> Result<Response, ApiError> {
    let bytes = st.manager.sandbox(&who, &id)?.audit_bundle().await?;
    let mut resp = Body::from(bytes).into_response();
    let h = resp.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Ok(v) = HeaderValue::from_str(&format!("attachment; filename=\"{id}.audit.json\"")) {
        h.insert(CONTENT_DISPOSITION, v);
    }
    Ok(resp)
}

/// `GET /v1/sandboxes/{id}/audit/dsse`: the record as a DSSE envelope
/// (`application/vnd.in-toto+json` payload: an in-toto Statement v1 whose subject is the
/// chain head), signed with the node's key.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/audit/dsse", tag = "audit",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, description = "The DSSE envelope (JSON)"),
        (status = 404, description = "No such sandbox", body = ApiErrorBody),
    ))]
pub(crate) async fn dsse(
    State(st): State<AppState>,
    crate::caller::Caller(who): crate::caller::Caller,
    SandboxPath(id): SandboxPath,
) -> Result<Response, ApiError> {
    let bytes = st.manager.sandbox(&who, &id)?.audit_attestation().await?;
    let mut resp = Body::from(bytes).into_response();
    let h = resp.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Ok(v) = HeaderValue::from_str(&format!("attachment; filename=\"{id}.dsse.json\"")) {
        h.insert(CONTENT_DISPOSITION, v);
    }
    Ok(resp)
}

/// `GET /v1/audit/checkpoint`: the node log's head as a C2SP checkpoint in a signed note
/// (`text/plain`); `X-Rampart-Note-Key` carries the note verifier key.
#[utoipa::path(get, path = "/v1/audit/checkpoint", tag = "audit",
    responses(
        (status = 200, description = "The checkpoint (text/plain, c2sp.org/tlog-checkpoint)"),
        (status = 503, description = "This daemon keeps no audit record", body = ApiErrorBody),
    ))]
pub(crate) async fn checkpoint(State(st): State<AppState>) -> Result<Response, ApiError> {
    let (note, vkey) = st.manager.audit_checkpoint();
    let mut resp = note.into_response();
    let h = resp.headers_mut();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    if let Ok(v) = HeaderValue::from_str(&vkey) {
        h.insert("x-rampart-note-key", v);
    }
    Ok(resp)
}

/// `GET /v1/audit/key`: the node's public key (pin it to verify bundles) and the template
/// digests.
#[utoipa::path(get, path = "/v1/audit/key", tag = "audit",
    responses(
        (status = 200, description = "The node's audit key", body = AuditKey),
        (status = 404, description = "This daemon keeps no audit record", body = ApiErrorBody),
    ))]
pub(crate) async fn key(State(st): State<AppState>) -> Result<Json<AuditKey>, ApiError> {
    let (public_key, key_id) = st.manager.audit_key();
    let templates = rampart_core::validate::TEMPLATES
        .iter()
        .map(|t| ((*t).to_owned(), st.manager.template_digest(t)))
        .collect();
    Ok(Json(AuditKey {
        public_key,
        key_id,
        templates,
    }))
}
