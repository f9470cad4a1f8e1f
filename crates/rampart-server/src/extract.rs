//! Request extractors whose failures are API errors (400/413/415 with a JSON body) rather than
//! axum's plain-text rejections.

use crate::error::ApiError;
use axum::body::Body;
use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use axum::http::header::CONTENT_TYPE;
use axum::http::request::Parts;
use axum::http::StatusCode;
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use rampart_types::SandboxId;
use serde::de::DeserializeOwned;
use std::time::Duration;

/// A JSON body: `Content-Type: application/json` required (a browser cannot send it across
/// origins without a preflight, which this API never answers), unknown fields and wrong types
/// refused with the path of the offending field, the size bounded by `DefaultBodyLimit`.
#[derive(Debug, Clone)]
pub struct ApiJson<T, const LIMIT: usize = { crate::JSON_BODY_LIMIT }>(pub T);

/// Whether a content type is JSON (`application/json`, `application/x+json; charset=...`).
fn is_json(content_type: &str) -> bool {
    let mime = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    mime == "application/json" || (mime.starts_with("application/") && mime.ends_with("+json"))
}

/// After a body turns out too large, read (and discard) at most this much more of it, so the
/// client, still sending, gets the 413 rather than a reset connection.
const DRAIN_MAX: usize = 32 << 20;
/// ... and for at most this long.
const DRAIN_TIME: Duration = Duration::from_secs(5);

/// Reads a whole body of at most `limit` bytes (413 beyond).
async fn read_bounded(body: Body, limit: usize) -> Result<Bytes, ApiError> {
    let mut stream = body.into_data_stream();
    let mut buf = BytesMut::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk
            .map_err(|e| ApiError::bad_request(format!("could not read the request body: {e}")))?;
        if buf.len() + chunk.len() > limit {
            let drain = async {
                let mut drained = 0usize;
                while let Some(Ok(c)) = stream.next().await {
                    drained += c.len();
                    if drained > DRAIN_MAX {
                        break;
                    }
                }
            };
            let _ = tokio::time::timeout(DRAIN_TIME, drain).await;
            return Err(ApiError::too_large(format!(
                "the request body is above this endpoint's limit of {limit} bytes"
            )));
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf.freeze())
}

/// Parses JSON, naming the field path in the error.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    let value: T = serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path.is_empty() || path == "." {
            ApiError::bad_request(format!("invalid JSON body: {inner}"))
        } else {
            ApiError::bad_request(format!("{path}: {inner}"))
        }
    })?;
    Ok(value)
}

impl<S, T, const LIMIT: usize> FromRequest<S> for ApiJson<T, LIMIT>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, ApiError> {
        let content_type = req
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let bytes = read_bounded(req.into_body(), LIMIT).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err(ApiError::bad_request(
                "a JSON request body is required (Content-Type: application/json)",
            ));
        }
        match content_type {
            Some(ct) if is_json(&ct) => {}
            other => {
                return Err(ApiError::new(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "unsupported_media_type",
                    format!(
                        "expected Content-Type: application/json, got {}",
                        other.as_deref().unwrap_or("none")
                    ),
                ))
            }
        }
        // Every body of this API is an object; serde would also take a struct as an array.
        if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            return Err(ApiError::bad_request(
                "the request body must be a JSON object",
            ));
        }
        parse_json(&bytes).map(ApiJson)
    }
}

/// A query string parsed into `T` (which should `deny_unknown_fields`); errors are 400s.
#[derive(Debug, Clone)]
pub struct ApiQuery<T>(pub T);

impl<S, T> FromRequestParts<S> for ApiQuery<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        let q = parts.uri.query().unwrap_or("");
        serde_urlencoded::from_str(q)
            .map(ApiQuery)
            .map_err(|e| ApiError::bad_request(format!("query string: {e}")))
    }
}

/// The query string as decoded `(key, value)` pairs, in order (keys may repeat).
#[derive(Debug, Clone)]
pub struct QueryPairs(pub Vec<(String, String)>);

impl<S: Send + Sync> FromRequestParts<S> for QueryPairs {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        let q = parts.uri.query().unwrap_or("");
        serde_urlencoded::from_str(q)
            .map(QueryPairs)
            .map_err(|e| ApiError::bad_request(format!("query string: {e}")))
    }
}

/// The `{id}` of a `/v1/sandboxes/{id}/...` path, validated (400 when malformed).
#[derive(Debug, Clone)]
pub struct SandboxPath(pub SandboxId);

impl<S: Send + Sync> FromRequestParts<S> for SandboxPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(raw) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::bad_request(format!("id: {}", e.body_text())))?;
        SandboxId::parse(&raw)
            .map(SandboxPath)
            .map_err(|e| ApiError::bad_request(format!("id: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rampart_types::CreateSandbox;

    #[test]
    fn json_content_types() {
        assert!(is_json("application/json"));
        assert!(is_json("application/json; charset=utf-8"));
        assert!(is_json("application/vnd.rampart+json"));
        assert!(!is_json("text/plain"));
        assert!(!is_json("application/x-www-form-urlencoded"));
    }

    #[test]
    fn json_errors_name_the_field() {
        let e = parse_json::<CreateSandbox>(br#"{"limits":{"memory":1}}"#).unwrap_err();
        assert!(e.message.starts_with("limits"), "{}", e.message);
        assert!(e.message.contains("memory"), "{}", e.message);
        let e = parse_json::<CreateSandbox>(br#"{"timeout_secs":"x"}"#).unwrap_err();
        assert!(e.message.starts_with("timeout_secs"), "{}", e.message);
        let e = parse_json::<CreateSandbox>(b"{").unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
    }
}
