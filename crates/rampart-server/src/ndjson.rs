//! NDJSON streaming responses and the `?after=&limit=&follow=` query of the paged logs
//! (audit, network), shared by the handlers that stream or page.

use crate::error::ApiError;
use axum::body::Body;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::Serialize;
use std::convert::Infallible;
use tokio::sync::mpsc;

/// A `follow=` (or similar) flag: `1`, `true` or `yes`.
pub(crate) fn is_true(v: Option<&str>) -> bool {
    matches!(v, Some("1" | "true" | "yes"))
}

/// A page size: `limit`, or `default` when absent; 400 unless it is 1 to `max`.
pub(crate) fn page_limit(
    limit: Option<usize>,
    default: usize,
    max: usize,
) -> Result<usize, ApiError> {
    let limit = limit.unwrap_or(default);
    if !(1..=max).contains(&limit) {
        return Err(ApiError::bad_request(format!("limit: must be 1 to {max}")));
    }
    Ok(limit)
}

/// One NDJSON line: `v` as JSON and a newline (an empty line if it cannot be serialized).
pub(crate) fn line<T: Serialize>(v: &T) -> Bytes {
    let mut l = serde_json::to_vec(v).unwrap_or_default();
    l.push(b'\n');
    Bytes::from(l)
}

/// A 200 `application/x-ndjson` response, not cached, with `body`.
pub(crate) fn response(body: Body) -> Response {
    let mut resp = body.into_response();
    let h = resp.headers_mut();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

/// [`response`] whose body is the lines a task sends on `rx`, ending when it drops its sender.
pub(crate) fn channel_response(rx: mpsc::Receiver<Result<Bytes, Infallible>>) -> Response {
    let stream =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|c| (c, rx)) });
    response(Body::from_stream(stream))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_limit_is_1_to_max_with_a_default() {
        assert_eq!(page_limit(None, 1000, 10_000).unwrap(), 1000);
        assert_eq!(page_limit(Some(1), 1000, 10_000).unwrap(), 1);
        assert_eq!(page_limit(Some(10_000), 1000, 10_000).unwrap(), 10_000);
        for bad in [0, 10_001] {
            let e = page_limit(Some(bad), 1000, 10_000).unwrap_err();
            assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST);
        }
    }

    #[test]
    fn follow_flags() {
        for t in ["1", "true", "yes"] {
            assert!(is_true(Some(t)));
        }
        for f in ["0", "false", "", "TRUE"] {
            assert!(!is_true(Some(f)));
        }
        assert!(!is_true(None));
    }
}
