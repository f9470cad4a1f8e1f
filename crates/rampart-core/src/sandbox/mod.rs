//! Sandboxes: their lifecycle (create, launch, destroy, pause, resume, recovery, snapshot
//! and fork), driven through the registry (in-memory state), the store (what is true), the
//! tier and the services (audit, network, persist, secrets: each called with what it needs),
//! and the background tasks (reaper, PID 1 watchers, chain-head publisher).

mod cold;
pub(crate) mod envd;
mod fork;
pub(crate) mod handle;
mod idle;
mod lifecycle;
mod ops;
mod plan;
mod pool;
mod recover;
pub(crate) mod registry;
mod tasks;
mod usage;

use cold::Booted;
use tasks::{publisher, reaper, watch_init};

pub use handle::{Held, Sandbox, Started};
pub use idle::Tunnel;
pub use plan::CreateOptions;

pub(crate) use registry::Registry;
use registry::{Expiry, PauseStart, Standing};

use crate::audit::manifest::Manifests;
use crate::audit::netaudit::{self, NetAudit};
use crate::audit::{self, Audit};
use crate::exec::{self, Exec, ExecContext, ExecRecorder, ExecStart};
use crate::interpreter;
use crate::isolation::{Isolation, IsolationError, LaunchSpec, Usage};
use crate::metrics::Metrics;
use crate::network::networked;
use crate::proc::{self, ExitStatus};
use crate::util::{lock, rfc3339};
use crate::validate::{self, check_timeout};
use crate::{CoreConfig, CoreError};
use futures::stream::{BoxStream, StreamExt};
use rampart_agent::client::AgentClient;
use rampart_audit::{ContentHasher, EventBody};
use rampart_store::access::AccessStore;
use rampart_store::{
    now_ms, NewSandbox, SandboxRecord, SandboxStore, SqliteStore, StoreError, StoredNetwork,
};
use rampart_types::audit::{Created, Destroyed, FileChange, FileOp, TimeoutChanged};
use rampart_types::network::NetworkInfo;
use rampart_types::{
    CreateSandbox, ExecRequest, NetLogEntry, NetworkPolicy, OnTimeout, SandboxId, SandboxInfo,
    SandboxState,
};
use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::task::AbortHandle;
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

/// Size of each sandbox's uid range.
const UID_RANGE: u64 = 65536;
/// How long a new (or re-attached) sandbox's agent has to answer its first health check.
const HEALTH_DEADLINE: Duration = Duration::from_secs(5);
/// [`HEALTH_DEADLINE`] and [`REATTACH_HEALTH_DEADLINE`] of a sandbox on the gVisor tier:
/// its agent answers through the Sentry, which a loaded host (ptrace) slows down by far more.
const GVISOR_HEALTH_DEADLINE: Duration = Duration::from_secs(30);

/// How long a sandbox of `tier` may take to answer its first health check.
fn health_deadline(tier: rampart_types::Tier, usual: Duration) -> Duration {
    match tier {
        rampart_types::Tier::Gvisor => GVISOR_HEALTH_DEADLINE,
        _ => usual,
    }
}
/// How long a re-attach waits for an agent on start.
const REATTACH_HEALTH_DEADLINE: Duration = Duration::from_secs(2);
/// After a failed destroy, when the reaper tries again.
const DESTROY_RETRY: Duration = Duration::from_secs(10);
/// Ended sandboxes are kept in the store this long for history.
const HISTORY_MS: i64 = 7 * 24 * 3600 * 1000;
/// Environment every sandbox starts with (a request's env overrides it).
const BASE_ENV: &[(&str, &str)] = &[
    (
        "PATH",
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    ),
    ("LANG", "C.UTF-8"),
];

/// A sandbox just made.
#[derive(Debug, Clone)]
pub struct CreatedSandbox {
    /// It, running.
    pub info: SandboxInfo,
    /// Its E2B facts, when [`CreateOptions::e2b_template`] asked for them.
    pub e2b: Option<rampart_store::access::E2bSandbox>,
}

/// Why a sandbox ended.
#[derive(Debug, Clone)]
pub(crate) enum EndReason {
    /// `DELETE` through the API.
    Request,
    /// Its deadline passed.
    Expired,
    /// Its PID 1 exited by itself.
    Died(String),
}

impl EndReason {
    fn label(&self) -> &'static str {
        match self {
            EndReason::Request => "request",
            EndReason::Expired => "expired",
            EndReason::Died(_) => "died",
        }
    }
    fn message(&self) -> String {
        match self {
            EndReason::Request => "destroyed by request".to_owned(),
            EndReason::Expired => "timeout expired".to_owned(),
            EndReason::Died(how) => format!("the sandbox's init exited unexpectedly ({how})"),
        }
    }
}

/// The manager's shared state.
#[derive(Debug)]
pub(crate) struct Sandboxes {
    pub(crate) cfg: CoreConfig,
    pub(crate) store: Arc<dyn SandboxStore>,
    pub(crate) audit: Arc<Audit>,
    /// Network decisions in the record, within their budget.
    netaudit: Arc<NetAudit>,
    pub(crate) iso: Arc<dyn Isolation>,
    state_dir: PathBuf,
    templates_dir: PathBuf,
    /// Live sandboxes and their operation locks.
    pub(crate) registry: Registry,
    /// Each live sandbox's access token, public ports and E2B facts (written with the
    /// sandbox by the store, forgotten at its end); the proxies read it.
    pub(crate) access: Arc<AccessStore>,
    metrics: Metrics,
    tasks: Mutex<Vec<AbortHandle>>,
    stopped: AtomicBool,
    /// Snapshots, fork, volumes.
    pub(crate) persist: crate::persist::Persist,
    /// Sandbox networks (wiring and egress).
    pub(crate) network: crate::network::Network,
    /// Named secrets (`/v1/secrets`).
    pub(crate) secrets: crate::secrets::Secrets,
    /// Held from a disk admission check until what it admitted counts (see `capacity`).
    disk_admission: tokio::sync::Mutex<()>,
    /// Requests held for approval, and the sandboxes' approval policies.
    pub(crate) approvals: crate::approvals::Approvals,
    /// The files sandboxes left as artifacts.
    pub(crate) artifacts: crate::artifacts::ArtifactStore,
    /// Lifecycle events and their webhooks.
    pub(crate) events: Arc<crate::events::Lifecycle>,
    /// Warm pools: sandboxes launched ahead of the creates that claim them.
    pools: pool::Pools,
}

/// The API view of a stored sandbox (never env values).
pub(crate) fn info_of(rec: &SandboxRecord) -> SandboxInfo {
    SandboxInfo {
        id: rec.id.clone(),
        template: rec.template.clone(),
        isolation: rec.isolation,
        state: rec.state,
        limits: rec.limits.clone(),
        metadata: rec.metadata.clone(),
        env_names: rec.env.keys().cloned().collect(),
        created_at: rfc3339(rec.created_at_ms),
        expires_at: rfc3339(rec.expires_at_ms),
        ended_at: rec.ended_at_ms.map(rfc3339),
        reason: rec.reason.clone(),
        access_token: None,
        tenant: rec.tenant.clone(),
        idle_pause_secs: rec.idle_pause_secs,
    }
}

/// The instant of a unix-ms deadline.
fn instant_of(ms: i64) -> Instant {
    let left = ms.saturating_sub(now_ms()).max(0) as u64;
    Instant::now() + Duration::from_millis(left)
}

/// The environment a sandbox starts with: the base, overridden and extended by the request's.
pub(crate) fn launch_env(req: &BTreeMap<String, String>) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = BASE_ENV
        .iter()
        .filter(|(k, _)| !req.contains_key(*k))
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    env.extend(req.iter().map(|(k, v)| (k.clone(), v.clone())));
    env
}

/// The first host uid of slot `slot`, if the configured ranges hold it.
pub(crate) fn uid_base(start: u32, slot: u32, slots: u32) -> Option<u32> {
    if slot >= slots {
        return None;
    }
    let base = u64::from(start) + u64::from(slot) * UID_RANGE;
    // The whole range must fit below the highest uid.
    (base + UID_RANGE <= u64::from(u32::MAX)).then_some(base as u32)
}

/// Polls the agent's health until it answers, with a short backoff, bounded by `within`.
async fn wait_health(client: &AgentClient, within: Duration) -> Result<(), CoreError> {
    let deadline = Instant::now() + within;
    let mut delay = Duration::from_millis(1);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let err = match tokio::time::timeout(left, client.health()).await {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) => e.to_string(),
            Err(_) => "no answer".to_owned(),
        };
        if Instant::now() + delay >= deadline {
            return Err(CoreError::Internal(format!(
                "the sandbox's agent did not answer within {} ms: {err}",
                within.as_millis()
            )));
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(50));
    }
}

impl Sandboxes {
    /// Opens everything, recovers, starts the reaper.
    pub(crate) async fn start(
        cfg: CoreConfig,
        iso: Arc<dyn Isolation>,
    ) -> Result<Arc<Sandboxes>, CoreError> {
        if cfg.uid_slots == 0
            || uid_base(cfg.uid_range_start, cfg.uid_slots - 1, cfg.uid_slots).is_none()
        {
            return Err(CoreError::Internal(format!(
                "uid ranges do not fit: {} slots of {UID_RANGE} from uid {}",
                cfg.uid_slots, cfg.uid_range_start
            )));
        }
        if cfg.uid_range_start == 0 {
            return Err(CoreError::Internal(
                "uid_range_start must not be 0: sandbox root must never be host root".into(),
            ));
        }
        // Sandbox directories live on the tier's store when it has one (rampart_jail::store).
        let state_dir = iso
            .store_root()
            .map(|r| r.join("sandboxes"))
            .unwrap_or_else(|| cfg.data_dir.join("sandboxes"));
        let templates_dir = cfg.data_dir.join("templates");
        for d in [&cfg.data_dir, &state_dir, &templates_dir] {
            std::fs::create_dir_all(d)
                .map_err(CoreError::io(format!("creating {}", d.display())))?;
        }
        let store: Arc<dyn SandboxStore> =
            Arc::new(SqliteStore::open(&cfg.data_dir.join("state.db")).map_err(CoreError::from)?);
        let access = Arc::new(AccessStore::open(&cfg.data_dir.join("state.db"))?);
        let audit = Arc::new(Audit::open(
            cfg.audit.clone(),
            store.clone(),
            &cfg.data_dir,
        )?);
        for name in validate::TEMPLATES {
            let dest = templates_dir.join(name);
            if !dest.exists() {
                info!(template = name, dest = %dest.display(), "building template");
                let iso2 = iso.clone();
                tokio::task::spawn_blocking(move || iso2.prepare_template(name, &dest))
                    .await
                    .map_err(CoreError::task("building template"))?
                    .map_err(|e| CoreError::isolation(format!("building template {name}"), e))?;
            }
        }
        let ci = templates_dir.join(interpreter::TEMPLATE);
        tokio::task::spawn_blocking(move || interpreter::install(&ci))
            .await
            .map_err(CoreError::task("installing the code interpreter"))?
            .map_err(CoreError::io("installing the code interpreter"))?;
        if audit.enabled() {
            for name in validate::TEMPLATES {
                let dir = templates_dir.join(name);
                let digest = tokio::task::spawn_blocking(move || audit::template_digest(&dir))
                    .await
                    .map_err(CoreError::task("template digest"))?
                    .map_err(CoreError::io(format!("template {name} digest")))?;
                info!(template = name, digest, "template content digest");
                audit.set_template_digest(name, digest);
            }
        }
        if let Err(e) = proc::set_child_subreaper() {
            warn!("cannot become a child subreaper ({e}); sandbox init processes will be reaped by the system");
        }
        let metrics = Metrics::new().map_err(CoreError::failed("metrics"))?;
        let network = crate::network::Network::start(&cfg.network, &cfg.data_dir).await;
        let persist = crate::persist::Persist::open(&cfg.data_dir.join("state.db"))?;
        persist.clean(iso.store_root().as_deref());
        let secrets = crate::secrets::Secrets::new(&cfg.data_dir);
        let netaudit = Arc::new(NetAudit::new(audit.clone()));
        let artifacts = crate::artifacts::ArtifactStore::new(&cfg.data_dir, cfg.artifacts);
        let events = Arc::new(crate::events::Lifecycle::open(
            &cfg.data_dir,
            cfg.events.clone(),
        )?);
        let inner = Arc::new(Sandboxes {
            cfg,
            store,
            audit,
            netaudit,
            iso,
            state_dir,
            templates_dir,
            registry: Registry::default(),
            access,
            metrics,
            tasks: Mutex::new(Vec::new()),
            stopped: AtomicBool::new(false),
            persist,
            network,
            secrets,
            disk_admission: tokio::sync::Mutex::new(()),
            approvals: Default::default(),
            artifacts,
            events,
            pools: Default::default(),
        });
        if let Some(w) = inner.cfg.approvals_webhook.clone() {
            let n = crate::webhook::Notifier::start(w).map_err(|e| CoreError::BadRequest {
                field: "approvals.webhook_url".into(),
                message: e,
            })?;
            let _ = inner.approvals.webhook.set(n);
        }
        if let Some(e) = inner.network.egress() {
            e.set_asker(Arc::new(ops::HostApprovals(Arc::downgrade(&inner))));
        }
        inner.recover().await?;
        let c = inner.cfg.clone();
        let _ =
            tokio::task::spawn_blocking(move || crate::templates::clean_build_leftovers(&c)).await;
        // Access of sandboxes that ended while no daemon ran (or before access was written
        // with the sandbox: tokens, public ports, E2B facts the server used to keep) opens
        // nothing.
        let alive: Vec<String> = inner
            .store
            .alive()?
            .into_iter()
            .map(|r| r.id.as_str().to_owned())
            .collect();
        let keep: Vec<&str> = alive.iter().map(String::as_str).collect();
        match inner.access.retain(&keep) {
            Ok(n) if n > 0 => debug!(count = n, "forgot the access of ended sandboxes"),
            Ok(_) => {}
            Err(e) => warn!("forgetting the access of ended sandboxes: {e}"),
        }
        match inner.store.prune_ended(now_ms() - HISTORY_MS) {
            Ok(n) if n > 0 => info!(count = n, "forgot old ended sandboxes"),
            Ok(_) => {}
            Err(e) => warn!("pruning history: {e}"),
        }
        let warm = inner.cfg.warm.clone();
        inner.start_pools(&warm)?;
        let reaper = tokio::spawn(reaper(inner.clone()));
        lock(&inner.tasks).push(reaper.abort_handle());
        let pruner = tokio::spawn(tasks::artifact_pruner(inner.clone()));
        lock(&inner.tasks).push(pruner.abort_handle());
        let deliveries = inner.events.start_delivery();
        lock(&inner.tasks).push(deliveries.abort_handle());
        if inner.audit.enabled() {
            let publisher = tokio::spawn(publisher(inner.audit.clone()));
            lock(&inner.tasks).push(publisher.abort_handle());
            if let Some(rx) = inner.network.take_events() {
                let t = tokio::spawn(netaudit::run(inner.netaudit.clone(), rx));
                lock(&inner.tasks).push(t.abort_handle());
            }
        }
        Ok(inner)
    }

    /// Stops the background tasks; sandboxes keep running.
    pub(crate) fn stop_tasks(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        for t in lock(&self.tasks).drain(..) {
            t.abort();
        }
        self.registry.stop_watchers();
        // Warm jailers of the tier die now, not with the process (sandboxes keep running).
        self.iso.shutdown();
    }

    pub(crate) fn op_lock(&self, id: &SandboxId) -> Arc<tokio::sync::Mutex<()>> {
        self.registry.op_lock(id)
    }

    /// Keeps a running (or paused) sandbox in memory, watches its init and arms its
    /// deadline and idle sleep.
    fn register(
        self: &Arc<Self>,
        id: &SandboxId,
        client: AgentClient,
        pid: i32,
        pidfd: OwnedFd,
        terms: registry::Terms,
    ) {
        let me = self.clone();
        self.registry.insert(id, client, pid, terms, || {
            tokio::spawn(watch_init(me, id.clone(), pid, pidfd)).abort_handle()
        });
    }

    /// The terms a sandbox is kept under: deadline at `expires_at_ms`, what its expiry
    /// does, its tenant, its idle sleep (on a tier that cannot save a sandbox's memory to
    /// disk, frozen for the node's `idle_cold_secs`, then paused to its filesystem).
    pub(super) fn terms(
        &self,
        id: &SandboxId,
        expires_at_ms: i64,
        paused: bool,
        on_timeout: OnTimeout,
        tenant: Option<String>,
        idle_pause_secs: Option<u64>,
    ) -> registry::Terms {
        let idle = idle_pause_secs.map(|secs| {
            let keeps_memory = self.iso.cold().is_ok_and(|c| c.can_checkpoint(id));
            let cold = match keeps_memory {
                true => None,
                false => self.cfg.idle_cold_secs.map(Duration::from_secs),
            };
            (Duration::from_secs(secs), cold)
        });
        registry::Terms {
            deadline: instant_of(expires_at_ms),
            paused,
            on_timeout,
            tenant,
            idle,
        }
    }

    async fn iso_destroy(&self, id: &SandboxId) -> Result<(), CoreError> {
        let iso = self.iso.clone();
        let id2 = id.clone();
        tokio::task::spawn_blocking(move || iso.destroy(&id2))
            .await
            .map_err(CoreError::task("destroy"))?
            .map_err(|e| CoreError::isolation("destroy", e))
    }

    /// Whether a caller of `tenant` may see sandbox `id` (`crate::principal`): the node
    /// (no tenant) sees every sandbox, a tenant its own; any other is not found, exactly as
    /// an id that does not exist. Only [`handle::Sandbox::resolve`] asks.
    fn visible(&self, tenant: Option<&str>, id: &SandboxId) -> Result<(), CoreError> {
        let Some(tenant) = tenant else {
            // A warm sandbox is nobody's, the node administrator's neither, until claimed.
            if !self.registry.contains(id) && self.is_pooled(id) {
                return Err(CoreError::NotFound(id.to_string()));
            }
            return Ok(());
        };
        let owner = match self.registry.tenant(id) {
            Some(owner) => owner,
            None => self
                .store
                .get(id)
                .map_err(CoreError::from)?
                .and_then(|r| r.tenant),
        };
        if owner.as_deref() == Some(tenant) {
            Ok(())
        } else {
            Err(CoreError::NotFound(id.to_string()))
        }
    }

    /// Checks that `tenant` (if any) may take on `bytes` more disk (a volume; 0: a
    /// snapshot, refused once its disk quota is used up).
    pub(crate) fn admit_tenant_disk(
        &self,
        tenant: Option<&str>,
        bytes: u64,
    ) -> Result<(), CoreError> {
        let Some(tenant) = tenant else {
            return Ok(());
        };
        self.store
            .admit_demand(
                tenant,
                &rampart_store::tenants::Demand {
                    disk_bytes: bytes.max(1),
                    ..Default::default()
                },
            )
            .map_err(CoreError::from)
    }

    pub(crate) fn get(&self, id: &SandboxId) -> Result<SandboxInfo, CoreError> {
        match self.store.get(id).map_err(CoreError::from)? {
            Some(rec) => Ok(info_of(&rec)),
            None => Err(CoreError::NotFound(id.to_string())),
        }
    }

    pub(crate) fn list(
        &self,
        state: Option<SandboxState>,
        metadata: &BTreeMap<String, String>,
    ) -> Result<Vec<SandboxInfo>, CoreError> {
        Ok(self
            .store
            .list(state, metadata)
            .map_err(CoreError::from)?
            .iter()
            .map(info_of)
            .collect())
    }

    pub(crate) fn agent(&self, id: &SandboxId) -> Result<AgentClient, CoreError> {
        match self.registry.standing(id) {
            Standing::Running(client) => Ok(client),
            Standing::Paused => Err(CoreError::WrongState {
                id: id.to_string(),
                state: SandboxState::Paused.as_str().to_owned(),
            }),
            Standing::Gone => Err(self.not_running(id)),
        }
    }

    pub(crate) fn data_dir(&self) -> &std::path::Path {
        &self.cfg.data_dir
    }

    pub(crate) fn store(&self) -> &Arc<dyn SandboxStore> {
        &self.store
    }

    pub(crate) fn templates_dir(&self) -> &std::path::Path {
        &self.templates_dir
    }

    pub(crate) fn metrics_text(&self) -> String {
        match self.store.counts() {
            Ok(counts) => {
                for s in SandboxState::ALL {
                    let n = counts.get(&s).copied().unwrap_or(0);
                    self.metrics
                        .sandboxes
                        .with_label_values(&[s.as_str()])
                        .set(i64::try_from(n).unwrap_or(i64::MAX));
                }
            }
            Err(e) => warn!("metrics: counting sandboxes: {e}"),
        }
        match self.store.alive() {
            Ok(alive) => {
                let m = &self.metrics;
                // Rebuilt at each scrape: a tenant with nothing alive has no series.
                m.tenant_sandboxes.reset();
                m.tenant_millicpus.reset();
                for r in &alive {
                    let t = r.tenant.as_deref().unwrap_or("-");
                    m.tenant_sandboxes
                        .with_label_values(&[t, r.state.as_str()])
                        .inc();
                    if r.state != SandboxState::Paused {
                        m.tenant_millicpus
                            .with_label_values(&[t])
                            .add((r.limits.cpus * 1000.0).round() as i64);
                    }
                }
            }
            Err(e) => warn!("metrics: listing alive sandboxes: {e}"),
        }
        self.metrics.text()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uid_bases_do_not_overlap_or_overflow() {
        assert_eq!(uid_base(100_000, 0, 10), Some(100_000));
        assert_eq!(uid_base(100_000, 1, 10), Some(165_536));
        assert_eq!(uid_base(100_000, 10, 10), None);
        assert_eq!(uid_base(u32::MAX - 65535, 0, 1), None);
        assert_eq!(uid_base(u32::MAX - 65536, 0, 1), Some(u32::MAX - 65536));
        assert_eq!(
            uid_base(u32::MAX - 65536 * 2, 0, 1),
            Some(u32::MAX - 65536 * 2)
        );
    }

    #[test]
    fn env_overrides_the_base() {
        let req: BTreeMap<String, String> = [
            ("LANG".to_string(), "fr_FR.UTF-8".to_string()),
            ("X".to_string(), "1".to_string()),
        ]
        .into();
        let env = launch_env(&req);
        assert!(env.iter().any(|(k, _)| k == "PATH"));
        assert_eq!(env.iter().filter(|(k, _)| k == "LANG").count(), 1);
        assert!(env.contains(&("LANG".to_string(), "fr_FR.UTF-8".to_string())));
        assert!(env.contains(&("X".to_string(), "1".to_string())));
    }
}
