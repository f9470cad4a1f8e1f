//! `/metrics`: the manager's metrics plus the HTTP layer's own (requests by route and status,
//! time to response headers).

use crate::AppState;
use axum::extract::{MatchedPath, Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry, TextEncoder,
};
use std::time::Instant;

/// The HTTP layer's metrics, in a registry of their own.
#[derive(Debug)]
pub(crate) struct HttpMetrics {
    registry: Registry,
    requests: Option<IntCounterVec>,
    duration: Option<HistogramVec>,
}

impl HttpMetrics {
    pub(crate) fn new() -> Self {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new(
                "rampart_http_requests_total",
                "HTTP requests by method, route and status",
            ),
            &["method", "route", "status"],
        )
        .ok()
        .filter(|c| registry.register(Box::new(c.clone())).is_ok());
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "rampart_http_request_duration_seconds",
                "Time from request to response headers, by method and route",
            )
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                10.0, 30.0,
            ]),
            &["method", "route"],
        )
        .ok()
        .filter(|h| registry.register(Box::new(h.clone())).is_ok());
        HttpMetrics {
            registry,
            requests,
            duration,
        }
    }

    fn observe(&self, method: &str, route: &str, status: u16, secs: f64) {
        if let Some(c) = &self.requests {
            c.with_label_values(&[method, route, &status.to_string()])
                .inc();
        }
        if let Some(h) = &self.duration {
            h.with_label_values(&[method, route]).observe(secs);
        }
    }

    fn text(&self) -> String {
        let mut buf = Vec::new();
        if TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .is_err()
        {
            return String::new();
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}

/// Middleware recording every request.
pub(crate) async fn track(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let start = Instant::now();
    let method = req.method().as_str().to_owned();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "unmatched".to_owned());
    let resp = next.run(req).await;
    st.http_metrics.observe(
        &method,
        &route,
        resp.status().as_u16(),
        start.elapsed().as_secs_f64(),
    );
    resp
}

/// `GET /metrics`: Prometheus text exposition.
#[utoipa::path(get, path = "/metrics", tag = "daemon",
    responses((status = 200, description = "Prometheus text format", content_type = "text/plain", body = String)))]
pub(crate) async fn serve_metrics(State(st): State<AppState>) -> Response {
    let mut text = st.manager.metrics_text();
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(&st.http_metrics.text());
    let mut resp = text.into_response();
    resp.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    resp
}
