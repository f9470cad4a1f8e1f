//! The daemon's Prometheus metrics.

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

/// Every metric, in the manager's own registry.
#[derive(Debug)]
pub(crate) struct Metrics {
    registry: Registry,
    pub sandboxes: IntGaugeVec,
    /// Alive sandboxes by tenant (`-`: the node's own) and state.
    pub tenant_sandboxes: IntGaugeVec,
    /// vCPUs of the alive sandboxes that are not paused, by tenant (milli-vCPUs).
    pub tenant_millicpus: IntGaugeVec,
    pub creates: IntCounterVec,
    pub create_seconds: Histogram,
    /// Time of each step of a launched create (`plan`, `admit`, `insert`, `launch`,
    /// `health`, `start`, `record`): `rampart bench --profile` reads it.
    pub create_step_seconds: HistogramVec,
    pub execs: IntCounter,
    pub exec_seconds: Histogram,
    pub destroyed: IntCounterVec,
    pub pauses: IntCounter,
    pub resumes: IntCounter,
    /// Sandboxes put to sleep for their idleness.
    pub sleeps: IntCounter,
    /// Sleeping (or paused) sandboxes woken by a request.
    pub wakes: IntCounter,
    /// Warm sandboxes ready to be claimed, by template and tier.
    pub pool_ready: IntGaugeVec,
    /// Creates that asked a warm pool, by result (`hit`, `miss`).
    pub pool_claims: IntCounterVec,
    /// Time to launch one warm sandbox.
    pub pool_refill_seconds: Histogram,
}

impl Metrics {
    pub(crate) fn new() -> Result<Metrics, prometheus::Error> {
        let registry = Registry::new();
        let sandboxes = IntGaugeVec::new(
            Opts::new(
                "rampart_sandboxes",
                "Sandboxes known to the store, by state.",
            ),
            &["state"],
        )?;
        let tenant_sandboxes = IntGaugeVec::new(
            Opts::new(
                "rampart_tenant_sandboxes",
                "Alive sandboxes, by tenant (`-`: the node's own) and state.",
            ),
            &["tenant", "state"],
        )?;
        let tenant_millicpus = IntGaugeVec::new(
            Opts::new(
                "rampart_tenant_millicpus",
                "vCPUs (in thousandths) of the sandboxes not paused, by tenant.",
            ),
            &["tenant"],
        )?;
        let creates = IntCounterVec::new(
            Opts::new(
                "rampart_sandbox_creates_total",
                "Sandbox creations, by result.",
            ),
            &["result"],
        )?;
        let create_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "rampart_sandbox_create_seconds",
                "Time from a create request to a running sandbox.",
            )
            .buckets(vec![
                0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
            ]),
        )?;
        let create_step_seconds = HistogramVec::new(
            HistogramOpts::new(
                "rampart_sandbox_create_step_seconds",
                "Time of each step of a launched (not pooled) create.",
            )
            .buckets(vec![
                0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5,
            ]),
            &["step"],
        )?;
        registry.register(Box::new(create_step_seconds.clone()))?;
        let execs = IntCounter::new("rampart_execs_total", "Commands started in sandboxes.")?;
        let exec_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "rampart_exec_seconds",
                "Wall time of commands, from start to exit.",
            )
            .buckets(vec![
                0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0, 600.0,
            ]),
        )?;
        let destroyed = IntCounterVec::new(
            Opts::new(
                "rampart_sandboxes_destroyed_total",
                "Sandboxes destroyed, by reason.",
            ),
            &["reason"],
        )?;
        let pauses = IntCounter::new("rampart_sandbox_pauses_total", "Sandboxes paused.")?;
        let resumes = IntCounter::new("rampart_sandbox_resumes_total", "Sandboxes resumed.")?;
        let sleeps = IntCounter::new(
            "rampart_sandbox_sleeps_total",
            "Sandboxes put to sleep (paused) after their idle time without a request.",
        )?;
        let wakes = IntCounter::new(
            "rampart_sandbox_wakes_total",
            "Sleeping or paused sandboxes woken by a request for them.",
        )?;
        registry.register(Box::new(sleeps.clone()))?;
        registry.register(Box::new(wakes.clone()))?;
        let pool_ready = IntGaugeVec::new(
            Opts::new(
                "rampart_pool_ready",
                "Warm sandboxes ready to be claimed, by template and tier.",
            ),
            &["template", "isolation"],
        )?;
        let pool_claims = IntCounterVec::new(
            Opts::new(
                "rampart_pool_claims_total",
                "Creates a warm pool could serve (hit) or could not (miss: it was empty).",
            ),
            &["result"],
        )?;
        let pool_refill_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "rampart_pool_refill_seconds",
                "Time to launch one warm sandbox for a pool.",
            )
            .buckets(vec![0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0]),
        )?;
        registry.register(Box::new(pool_ready.clone()))?;
        registry.register(Box::new(pool_claims.clone()))?;
        registry.register(Box::new(pool_refill_seconds.clone()))?;
        registry.register(Box::new(pauses.clone()))?;
        registry.register(Box::new(resumes.clone()))?;
        registry.register(Box::new(sandboxes.clone()))?;
        registry.register(Box::new(tenant_sandboxes.clone()))?;
        registry.register(Box::new(tenant_millicpus.clone()))?;
        registry.register(Box::new(creates.clone()))?;
        registry.register(Box::new(create_seconds.clone()))?;
        registry.register(Box::new(execs.clone()))?;
        registry.register(Box::new(exec_seconds.clone()))?;
        registry.register(Box::new(destroyed.clone()))?;
        Ok(Metrics {
            registry,
            sandboxes,
            tenant_sandboxes,
            tenant_millicpus,
            creates,
            create_seconds,
            create_step_seconds,
            execs,
            exec_seconds,
            destroyed,
            pauses,
            resumes,
            sleeps,
            wakes,
            pool_ready,
            pool_claims,
            pool_refill_seconds,
        })
    }

    pub(crate) fn text(&self) -> String {
        let mut buf = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            return format!("# error encoding metrics: {e}\n");
        }
        String::from_utf8_lossy(&buf).into_owned()
    }
}
