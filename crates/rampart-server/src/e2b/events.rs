//! E2B's lifecycle events and webhooks (REST only; the SDKs have no calls for them):
//! `GET /events/sandboxes[/{id}]` (`offset`, `limit`, `orderAsc`, `types`), and
//! `/events/webhooks` (`POST`, `GET`) and `/events/webhooks/{id}` (`GET`, `PATCH`,
//! `DELETE`). The events, their delivery and the signatures are core's
//! (`rampart_core::events`); this module reads requests and writes E2B's shapes.

use super::{E2b, E2bError};
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use rampart_core::events::{EventQuery, Kind, Webhook, WebhookChange};
use serde::Deserialize;
use serde_json::{json, Value};

/// E2B's default page of events.
const DEFAULT_LIMIT: u64 = 10;

fn query(raw: Option<&str>, sandbox: Option<String>) -> Result<EventQuery, E2bError> {
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(raw.unwrap_or_default())
        .map_err(|e| E2bError::bad_request(format!("query: {e}")))?;
    let mut q = EventQuery {
        sandbox,
        limit: DEFAULT_LIMIT,
        ..Default::default()
    };
    let number = |k: &str, v: &str| {
        v.parse::<u64>()
            .map_err(|_| E2bError::bad_request(format!("{k}: expected a number, got {v:?}")))
    };
    for (k, v) in pairs {
        match k.as_str() {
            "offset" => q.offset = number(&k, &v)?,
            "limit" => q.limit = number(&k, &v)?,
            "orderAsc" => {
                q.ascending = match v.as_str() {
                    "true" => true,
                    "false" => false,
                    _ => {
                        return Err(E2bError::bad_request(format!(
                            "orderAsc: expected true or false, got {v:?}"
                        )))
                    }
                }
            }
            "types" | "type" => q.kinds.push(Kind::from_type(&v).ok_or_else(|| {
                E2bError::bad_request(format!("types: unknown event type {v:?}"))
            })?),
            _ => {}
        }
    }
    // `limit` is checked by core (1 to 100), for every face.
    Ok(q)
}

/// `GET /events/sandboxes`: the latest events of the key's sandboxes.
pub(crate) async fn list(
    State(st): State<E2b>,
    crate::caller::Caller(who): crate::caller::Caller,
    RawQuery(raw): RawQuery,
) -> Result<Response, E2bError> {
    let q = query(raw.as_deref(), None)?;
    Ok(Json(Value::Array(st.manager.lifecycle_events(&who, &q)?)).into_response())
}

/// `GET /events/sandboxes/{id}`: one sandbox's events (also after it ended).
pub(crate) async fn list_one(
    State(st): State<E2b>,
    crate::caller::Caller(who): crate::caller::Caller,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Response, E2bError> {
    let q = query(raw.as_deref(), Some(id))?;
    Ok(Json(Value::Array(st.manager.lifecycle_events(&who, &q)?)).into_response())
}

/// A webhook's fields as E2B takes them (create: `url`, `events` and `signatureSecret`
/// required; update: any).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct WebhookBody {
    name: Option<String>,
    url: Option<String>,
    events: Option<Vec<String>>,
    enabled: Option<bool>,
    signature_secret: Option<String>,
}

impl From<WebhookBody> for WebhookChange {
    fn from(b: WebhookBody) -> Self {
        WebhookChange {
            name: b.name,
            url: b.url,
            events: b.events,
            enabled: b.enabled,
            secret: b.signature_secret,
        }
    }
}

fn shown(w: Webhook) -> Value {
    let created =
        time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(w.created_at_ms) * 1_000_000)
            .ok()
            .and_then(|t| {
                t.format(&time::format_description::well_known::Rfc3339)
                    .ok()
            })
            .unwrap_or_default();
    let team = w.tenant.unwrap_or_default();
    json!({
        "id": w.id,
        "teamID": team,
        "teamId": team,
        "name": w.name,
        "createdAt": created,
        "enabled": w.enabled,
        "url": w.url,
        "events": w.events,
    })
}

/// `POST /events/webhooks`: 201 with the webhook.
pub(crate) async fn create(
    State(st): State<E2b>,
    crate::caller::Caller(who): crate::caller::Caller,
    body: Bytes,
) -> Result<Response, E2bError> {
    let mut b: WebhookBody = super::wire::parse_body(&body)?;
    if b.name.is_none() {
        b.name = Some("webhook".into());
    }
    let w = st.manager.create_webhook(&who, b.into())?;
    Ok((StatusCode::CREATED, Json(shown(w))).into_response())
}

/// `GET /events/webhooks`: the key's webhooks.
pub(crate) async fn list_webhooks(
    State(st): State<E2b>,
    crate::caller::Caller(who): crate::caller::Caller,
) -> Result<Response, E2bError> {
    let all: Vec<Value> = st.manager.webhooks(&who)?.into_iter().map(shown).collect();
    Ok(Json(Value::Array(all)).into_response())
}

/// `GET /events/webhooks/{id}`.
pub(crate) async fn get_webhook(
    State(st): State<E2b>,
    crate::caller::Caller(who): crate::caller::Caller,
    Path(id): Path<String>,
) -> Result<Response, E2bError> {
    Ok(Json(shown(st.manager.webhook(&who, &id)?)).into_response())
}

/// `PATCH /events/webhooks/{id}`: replaces the fields given.
pub(crate) async fn update_webhook(
    State(st): State<E2b>,
    crate::caller::Caller(who): crate::caller::Caller,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, E2bError> {
    let b: WebhookBody = super::wire::parse_body(&body)?;
    Ok(Json(shown(st.manager.update_webhook(&who, &id, b.into())?)).into_response())
}

/// `DELETE /events/webhooks/{id}`: 200.
pub(crate) async fn delete_webhook(
    State(st): State<E2b>,
    crate::caller::Caller(who): crate::caller::Caller,
    Path(id): Path<String>,
) -> Result<Response, E2bError> {
    st.manager.delete_webhook(&who, &id)?;
    Ok(StatusCode::OK.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_query_is_read_as_e2b_documents_it() {
        let q = query(
            Some("limit=5&offset=2&orderAsc=true&types=sandbox.lifecycle.created&types=sandbox.lifecycle.killed"),
            None,
        )
        .unwrap();
        assert_eq!((q.limit, q.offset, q.ascending), (5, 2, true));
        assert_eq!(q.kinds, vec![Kind::Created, Kind::Killed]);
        let d = query(None, Some("x".into())).unwrap();
        assert_eq!((d.limit, d.offset, d.ascending), (10, 0, false));
        assert_eq!(d.sandbox.as_deref(), Some("x"));
        for bad in [
            "limit=x",
            "orderAsc=yes",
            "types=sandbox.lifecycle.nope",
            "offset=-1",
        ] {
            assert!(query(Some(bad), None).is_err(), "{bad}");
        }
    }
}
