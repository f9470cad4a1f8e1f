//! A gateway's `/metrics` (admin): its requests by route and status class, their time to
//! response headers, each etcd operation's time, and the fleet as the gateway sees it.

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};
use std::time::Instant;

/// The buckets of every latency histogram, seconds.
const BUCKETS: &[f64] = &[
    0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// The gateway's metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    request_seconds: HistogramVec,
    etcd_seconds: HistogramVec,
    nodes: IntGaugeVec,
    sandboxes: IntGauge,
}

impl Metrics {
    /// A registry with the gateway's metrics in it.
    pub fn new() -> Result<Metrics, prometheus::Error> {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new(
                "rampart_gateway_requests_total",
                "Requests by route and status class",
            ),
            &["route", "status"],
        )?;
        let request_seconds = HistogramVec::new(
            HistogramOpts::new(
                "rampart_gateway_request_seconds",
                "Time from request to response headers, by route",
            )
            .buckets(BUCKETS.to_vec()),
            &["route"],
        )?;
        let etcd_seconds = HistogramVec::new(
            HistogramOpts::new(
                "rampart_gateway_etcd_seconds",
                "Time of each etcd operation on a request's path (retries included), by operation",
            )
            .buckets(BUCKETS.to_vec()),
            &["op"],
        )?;
        let nodes = IntGaugeVec::new(
            Opts::new(
                "rampart_gateway_nodes",
                "Nodes by state, as this gateway sees them",
            ),
            &["state"],
        )?;
        let sandboxes = IntGauge::new(
            "rampart_gateway_catalog_sandboxes",
            "Sandboxes in the catalog, as this gateway sees it",
        )?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(request_seconds.clone()))?;
        registry.register(Box::new(etcd_seconds.clone()))?;
        registry.register(Box::new(nodes.clone()))?;
        registry.register(Box::new(sandboxes.clone()))?;
        Ok(Metrics {
            registry,
            requests,
            request_seconds,
            etcd_seconds,
            nodes,
            sandboxes,
        })
    }

    /// A request to `route` answered `status` after `since`.
    pub fn request(&self, route: &str, status: u16, since: Instant) {
        let class = format!("{}xx", status / 100);
        self.requests.with_label_values(&[route, &class]).inc();
        self.request_seconds
            .with_label_values(&[route])
            .observe(since.elapsed().as_secs_f64());
    }

    /// An etcd operation `op` that began at `since`.
    pub fn etcd(&self, op: &str, since: Instant) {
        self.etcd_seconds
            .with_label_values(&[op])
            .observe(since.elapsed().as_secs_f64());
    }

    /// The text exposition, with the fleet's gauges set first.
    pub fn render(&self, ready: i64, draining: i64, lost: i64, sandboxes: i64) -> String {
        self.nodes.with_label_values(&["ready"]).set(ready);
        self.nodes.with_label_values(&["draining"]).set(draining);
        self.nodes.with_label_values(&["lost"]).set(lost);
        self.sandboxes.set(sandboxes);
        let mut out = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            tracing::warn!("gateway metrics: {e}");
        }
        String::from_utf8(out).unwrap_or_default()
    }
}
