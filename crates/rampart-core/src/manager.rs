//! The manager's state and its background tasks (reaper, PID 1 watchers).

use crate::audit::{self, Audit};
use crate::interpreter;
use crate::isolation::{Isolation, IsolationError, LaunchSpec, Usage};
use crate::metrics::Metrics;
use crate::proc::{self, ExitStatus};
use crate::validate::{self, check_exec, check_timeout};
use crate::{CoreConfig, CoreError, Exec, ExecControl};
use base64::Engine;
use futures::stream::{BoxStream, StreamExt};
use prometheus::Histogram;
use rampart_agent::client::{AgentClient, ClientError, ProcessEvent};
use rampart_audit::{ContentHasher, EventBody};
use rampart_store::{now_ms, NewSandbox, SandboxRecord, SandboxStore, SqliteStore, StoreError};
use rampart_types::audit::{Created, Destroyed, Empty, Exit, FileChange, FileOp, TimeoutChanged};
use rampart_types::{
    CreateSandbox, ExecEvent, ExecRequest, OnTimeout, SandboxId, SandboxInfo, SandboxState,
};
use std::collections::{BTreeMap, HashMap};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::task::AbortHandle;
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

/// Size of each sandbox's uid range.
const UID_RANGE: u64 = 65536;
/// How long a new (or re-attached) sandbox's agent has to answer its first health check.
const HEALTH_DEADLINE: Duration = Duration::from_secs(5);
/// How long a re-attach waits for an agent on start.
const REATTACH_HEALTH_DEADLINE: Duration = Duration::from_secs(2);
/// After a failed destroy, when the reaper tries again.
const DESTROY_RETRY: Duration = Duration::from_secs(10);
/// After core kills a timed-out process, how long it waits for the agent's end event.
const KILL_GRACE: Duration = Duration::from_secs(5);
/// Ended sandboxes are kept in the store this long for history.
const HISTORY_MS: i64 = 7 * 24 * 3600 * 1000;
/// Chunk size for stdin sent to the agent.
const STDIN_CHUNK: usize = 64 * 1024;
/// Environment every sandbox starts with (a request's env overrides it).
const BASE_ENV: &[(&str, &str)] = &[
    (
        "PATH",
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    ),
    ("LANG", "C.UTF-8"),
];

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

/// What the manager keeps in memory about a running (or paused) sandbox.
#[derive(Debug)]
struct Live {
    client: AgentClient,
    pid: i32,
    deadline: Option<Instant>,
    stopping: bool,
    /// Frozen (or being frozen): its agent cannot answer, so nothing talks to it.
    paused: bool,
    /// What expiry does.
    on_timeout: OnTimeout,
    watcher: Option<AbortHandle>,
}

/// What the reaper does with an expired sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expiry {
    Destroy,
    Pause,
}

/// The manager's shared state.
#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) cfg: CoreConfig,
    pub(crate) store: Arc<dyn SandboxStore>,
    pub(crate) audit: Arc<Audit>,
    pub(crate) iso: Arc<dyn Isolation>,
    state_dir: PathBuf,
    templates_dir: PathBuf,
    live: Mutex<HashMap<SandboxId, Live>>,
    locks: Mutex<HashMap<SandboxId, Arc<tokio::sync::Mutex<()>>>>,
    wake_reaper: Notify,
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
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The data behind these locks stays consistent at every await-free step, so a poisoned
    // lock (a panic elsewhere) is taken over rather than spreading the panic.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn db(e: StoreError) -> CoreError {
    CoreError::Internal(format!("state store: {e}"))
}

fn iso_err(what: &str, e: IsolationError) -> CoreError {
    match e {
        IsolationError::Unsupported(m) => CoreError::Unsupported(m),
        IsolationError::Failed(m) => CoreError::Internal(format!("{what}: {m}")),
    }
}

fn join_err(what: &str, e: tokio::task::JoinError) -> CoreError {
    CoreError::Internal(format!("{what}: task failed: {e}"))
}

/// RFC 3339 of a unix-ms time.
pub(crate) fn rfc3339(ms: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| ms.to_string())
}

/// The API view of a stored sandbox (never env values).
pub(crate) fn info_of(rec: &SandboxRecord) -> SandboxInfo {
    SandboxInfo {
        id: rec.id.clone(),
        template: rec.template.clone(),
        state: rec.state,
        limits: rec.limits.clone(),
        metadata: rec.metadata.clone(),
        env_names: rec.env.keys().cloned().collect(),
        created_at: rfc3339(rec.created_at_ms),
        expires_at: rfc3339(rec.expires_at_ms),
        ended_at: rec.ended_at_ms.map(rfc3339),
        reason: rec.reason.clone(),
        access_token: None,
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

impl Inner {
    /// Opens everything, recovers, starts the reaper.
    pub(crate) async fn start(
        cfg: CoreConfig,
        iso: Arc<dyn Isolation>,
    ) -> Result<Arc<Inner>, CoreError> {
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
                .map_err(|e| CoreError::Internal(format!("creating {}: {e}", d.display())))?;
        }
        let store: Arc<dyn SandboxStore> =
            Arc::new(SqliteStore::open(&cfg.data_dir.join("state.db")).map_err(db)?);
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
                    .map_err(|e| join_err("building template", e))?
                    .map_err(|e| iso_err(&format!("building template {name}"), e))?;
            }
        }
        let ci = templates_dir.join(interpreter::TEMPLATE);
        tokio::task::spawn_blocking(move || interpreter::install(&ci))
            .await
            .map_err(|e| join_err("installing the code interpreter", e))?
            .map_err(|e| CoreError::Internal(format!("installing the code interpreter: {e}")))?;
        if audit.enabled() {
            for name in validate::TEMPLATES {
                let dir = templates_dir.join(name);
                let digest = tokio::task::spawn_blocking(move || audit::template_digest(&dir))
                    .await
                    .map_err(|e| join_err("template digest", e))?
                    .map_err(|e| CoreError::Internal(format!("template {name} digest: {e}")))?;
                info!(template = name, digest, "template content digest");
                audit.set_template_digest(name, digest);
            }
        }
        if let Err(e) = proc::set_child_subreaper() {
            warn!("cannot become a child subreaper ({e}); sandbox init processes will be reaped by the system");
        }
        let metrics = Metrics::new().map_err(|e| CoreError::Internal(format!("metrics: {e}")))?;
        let network = crate::network::Network::start(&cfg.network, &cfg.data_dir).await;
        let persist = crate::persist::Persist::open(&cfg.data_dir.join("state.db"))?;
        persist.clean(iso.store_root().as_deref());
        let secrets = crate::secrets::Secrets::new(&cfg.data_dir);
        let inner = Arc::new(Inner {
            cfg,
            store,
            audit,
            iso,
            state_dir,
            templates_dir,
            live: Mutex::new(HashMap::new()),
            locks: Mutex::new(HashMap::new()),
            wake_reaper: Notify::new(),
            metrics,
            tasks: Mutex::new(Vec::new()),
            stopped: AtomicBool::new(false),
            persist,
            network,
            secrets,
            disk_admission: tokio::sync::Mutex::new(()),
        });
        inner.recover().await?;
        let c = inner.cfg.clone();
        let _ =
            tokio::task::spawn_blocking(move || crate::templates::clean_build_leftovers(&c)).await;
        match inner.store.prune_ended(now_ms() - HISTORY_MS) {
            Ok(n) if n > 0 => info!(count = n, "forgot old ended sandboxes"),
            Ok(_) => {}
            Err(e) => warn!("pruning history: {e}"),
        }
        let reaper = tokio::spawn(reaper(inner.clone()));
        lock(&inner.tasks).push(reaper.abort_handle());
        if inner.audit.enabled() {
            let publisher = tokio::spawn(publisher(inner.audit.clone()));
            lock(&inner.tasks).push(publisher.abort_handle());
            if let Some(rx) = inner.network.take_events() {
                let t = tokio::spawn(crate::netaudit::run(inner.audit.clone(), rx));
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
        for l in lock(&self.live).values_mut() {
            if let Some(w) = l.watcher.take() {
                w.abort();
            }
        }
        // Warm jailers of the tier die now, not with the process (sandboxes keep running).
        self.iso.shutdown();
    }

    pub(crate) fn op_lock(&self, id: &SandboxId) -> Arc<tokio::sync::Mutex<()>> {
        lock(&self.locks).entry(id.clone()).or_default().clone()
    }

    /// Re-attaches to the sandboxes that still run; cleans up the rest and any leftover.
    async fn recover(self: &Arc<Self>) -> Result<(), CoreError> {
        let alive = self.store.alive().map_err(db)?;
        for rec in alive {
            if rec.state == SandboxState::Running && self.try_reattach(&rec).await {
                info!(id = %rec.id, "re-attached to running sandbox");
                self.network_reattach(&rec).await;
                continue;
            }
            if rec.state == SandboxState::Paused && self.try_reattach_paused(&rec).await {
                info!(id = %rec.id, "re-attached to paused sandbox");
                self.network_reattach(&rec).await;
                continue;
            }
            let (state, reason) = if rec.state == SandboxState::Creating {
                (
                    SandboxState::Failed,
                    "daemon restarted while the sandbox was being created",
                )
            } else {
                (
                    SandboxState::Destroyed,
                    "daemon restarted; sandbox was not running",
                )
            };
            // If its init is our (dead) child, reap it so no zombie stays behind.
            if let (Some(pid), Some(start)) = (rec.pid, rec.pid_start_time) {
                if let Ok(fd) = proc::pidfd_open(pid) {
                    if proc::proc_stat(pid).is_some_and(|s| s.start_time == start) {
                        let _ = proc::try_reap(&fd);
                    }
                }
            }
            self.network_teardown(&rec.id, rec.uid_slot).await;
            if let Err(e) = self.iso_destroy(&rec.id).await {
                error!(id = %rec.id, "recovery could not clean up sandbox: {e}");
                continue;
            }
            self.record_end(&rec.id, state, reason, "recovery")?;
            self.metrics
                .destroyed
                .with_label_values(&["recovery"])
                .inc();
            info!(id = %rec.id, reason, "cleaned up sandbox left by a previous run");
        }
        self.network_leftovers().await;
        let iso = self.iso.clone();
        let leftovers = tokio::task::spawn_blocking(move || iso.leftovers())
            .await
            .map_err(|e| join_err("listing leftovers", e))?
            .map_err(|e| iso_err("listing leftovers", e))?;
        for id in leftovers {
            if lock(&self.live).contains_key(&id) {
                continue;
            }
            let ours = self.store.get(&id).map_err(db)?.is_some()
                || self.state_dir.join(id.as_str()).exists();
            if !ours {
                warn!(id = %id, "a sandbox trace unknown to this daemon's store is left alone (another daemon's?)");
                continue;
            }
            match self.iso_destroy(&id).await {
                Ok(()) => info!(id = %id, "removed leftover sandbox traces"),
                Err(e) => error!(id = %id, "could not remove leftover sandbox traces: {e}"),
            }
        }
        Ok(())
    }

    /// Re-attaches to a sandbox recorded as running if its init is the same live process and
    /// its agent answers.
    async fn try_reattach(self: &Arc<Self>, rec: &SandboxRecord) -> bool {
        let (Some(pid), Some(start), Some(sock)) =
            (rec.pid, rec.pid_start_time, rec.agent_socket.as_ref())
        else {
            return false;
        };
        // Open the pidfd first: if the start time matches afterwards, the fd is that process.
        let Ok(fd) = proc::pidfd_open(pid) else {
            return false;
        };
        if !proc::is_same_live_process(pid, start) {
            return false;
        }
        // A pause or resume interrupted by the daemon's end can leave the cgroup frozen: the
        // store has the last word, and it says running.
        if self.frozen(&rec.id).await == Some(true) {
            if let Err(e) = self.iso_freeze(&rec.id, false).await {
                warn!(id = %rec.id, "cannot thaw a running sandbox's frozen processes: {e}");
                return false;
            }
        }
        let client = AgentClient::new(PathBuf::from(sock));
        if let Err(e) = wait_health(&client, REATTACH_HEALTH_DEADLINE).await {
            warn!(id = %rec.id, "sandbox process lives but its agent does not answer: {e}");
            return false;
        }
        self.register(
            &rec.id,
            client,
            pid,
            fd,
            rec.expires_at_ms,
            false,
            rec.on_timeout,
        );
        true
    }

    /// Re-attaches to a sandbox recorded as paused if its init is the same live process and
    /// its cgroup is frozen (a frozen agent cannot answer a health check). A cgroup found
    /// thawed (a resume cut short) is frozen again: the store says paused.
    async fn try_reattach_paused(self: &Arc<Self>, rec: &SandboxRecord) -> bool {
        let (Some(pid), Some(start), Some(sock)) =
            (rec.pid, rec.pid_start_time, rec.agent_socket.as_ref())
        else {
            return false;
        };
        let Ok(fd) = proc::pidfd_open(pid) else {
            return false;
        };
        if !proc::is_same_live_process(pid, start) {
            return false;
        }
        match self.frozen(&rec.id).await {
            Some(true) => {}
            Some(false) => {
                if let Err(e) = self.iso_freeze(&rec.id, true).await {
                    warn!(id = %rec.id, "cannot freeze a paused sandbox again: {e}");
                    return false;
                }
            }
            None => {
                warn!(id = %rec.id, "paused sandbox without a freezer cgroup");
                return false;
            }
        }
        let client = AgentClient::new(PathBuf::from(sock));
        self.register(
            &rec.id,
            client,
            pid,
            fd,
            rec.expires_at_ms,
            true,
            rec.on_timeout,
        );
        true
    }

    /// Whether the sandbox's cgroup is frozen (None when the tier cannot tell).
    async fn frozen(&self, id: &SandboxId) -> Option<bool> {
        let iso = self.iso.clone();
        let id2 = id.clone();
        tokio::task::spawn_blocking(move || iso.is_frozen(&id2))
            .await
            .ok()?
            .ok()
    }

    /// Freezes (`freeze`) or thaws the sandbox's processes.
    async fn iso_freeze(&self, id: &SandboxId, freeze: bool) -> Result<(), CoreError> {
        let iso = self.iso.clone();
        let id2 = id.clone();
        tokio::task::spawn_blocking(move || {
            if freeze {
                iso.freeze(&id2)
            } else {
                iso.thaw(&id2)
            }
        })
        .await
        .map_err(|e| join_err("freeze", e))?
        .map_err(|e| match e {
            IsolationError::Unsupported(m) => CoreError::WrongState {
                id: id.to_string(),
                state: format!("running ({m})"),
            },
            e => iso_err(if freeze { "pause" } else { "resume" }, e),
        })
    }

    /// Keeps a running (or paused) sandbox in memory, watches its init and arms its
    /// deadline.
    #[allow(clippy::too_many_arguments)]
    fn register(
        self: &Arc<Self>,
        id: &SandboxId,
        client: AgentClient,
        pid: i32,
        pidfd: OwnedFd,
        expires_at_ms: i64,
        paused: bool,
        on_timeout: OnTimeout,
    ) {
        let mut live = lock(&self.live);
        live.insert(
            id.clone(),
            Live {
                client,
                pid,
                deadline: Some(instant_of(expires_at_ms)),
                stopping: false,
                paused,
                on_timeout,
                watcher: None,
            },
        );
        // Spawned after the insert: an init that died at once still finds its entry.
        let watcher = tokio::spawn(watch_init(self.clone(), id.clone(), pidfd));
        if let Some(l) = live.get_mut(id) {
            l.watcher = Some(watcher.abort_handle());
        }
        drop(live);
        self.wake_reaper.notify_one();
    }

    async fn iso_destroy(&self, id: &SandboxId) -> Result<(), CoreError> {
        let iso = self.iso.clone();
        let id2 = id.clone();
        tokio::task::spawn_blocking(move || iso.destroy(&id2))
            .await
            .map_err(|e| join_err("destroy", e))?
            .map_err(|e| iso_err("destroy", e))
    }

    /// The error for a sandbox that is not running.
    fn not_running(&self, id: &SandboxId) -> CoreError {
        match self.store.get(id) {
            Ok(None) => CoreError::NotFound(id.to_string()),
            Ok(Some(rec)) => {
                let state = if rec.state == SandboxState::Running {
                    // Running in the store but being torn down here.
                    SandboxState::Stopping
                } else {
                    rec.state
                };
                CoreError::WrongState {
                    id: id.to_string(),
                    state: state.as_str().to_owned(),
                }
            }
            Err(e) => db(e),
        }
    }

    /// The `created` body of a sandbox (env names only, never values).
    fn created_body(&self, new: &NewSandbox) -> EventBody {
        let spec = serde_json::json!({
            "template": new.template,
            "limits": new.limits,
            "env_names": new.env.keys().collect::<Vec<_>>(),
            "metadata": new.metadata,
            "created_at": rfc3339(new.created_at_ms),
            "expires_at": rfc3339(new.expires_at_ms),
        });
        EventBody::Created(Created {
            spec,
            template: new.template.clone(),
            template_digest: self.audit.template_digest(&new.template),
            policy: serde_json::Value::Null,
            caller: crate::recorder::current_caller(),
        })
    }

    /// Records a sandbox's end (`destroyed`, in the transaction of its final state), then
    /// publishes its chain head to the node log and forgets its chain.
    fn record_end(
        &self,
        id: &SandboxId,
        state: SandboxState,
        reason: &str,
        label: &str,
    ) -> Result<(), CoreError> {
        let store = &self.store;
        let why = format!("{label}: {reason}");
        self.audit.record(
            id,
            true,
            |_| {
                EventBody::Destroyed(Destroyed {
                    reason: why,
                    manifest_digest: self.audit.take_manifest(id),
                })
            },
            Vec::new(),
            |e| store.set_state_audited(id, state, Some(now_ms()), Some(reason), e),
        )?;
        if let Err(e) = self.audit.publish(std::slice::from_ref(id)) {
            error!(id = %id, "publishing the audit chain head: {e}");
        }
        self.audit.forget(id);
        Ok(())
    }

    /// Records a file operation made through the API.
    pub(crate) fn record_file(&self, id: &SandboxId, change: FileChange) -> Result<(), CoreError> {
        self.audit
            .append(id, |_| EventBody::File(change), Vec::new())
    }

    /// Writes a file through the agent, hashing the bytes as they pass, and records it.
    pub(crate) async fn write_file(
        &self,
        id: &SandboxId,
        path: &str,
        user: Option<&str>,
        body: BoxStream<'static, Result<bytes::Bytes, std::io::Error>>,
    ) -> Result<String, CoreError> {
        let agent = self.agent(id)?;
        if !self.audit.enabled() {
            return Ok(agent.write_file(path, user, body).await?);
        }
        let hasher = Arc::new(Mutex::new(ContentHasher::new(0)));
        let h2 = hasher.clone();
        let body = body
            .map(move |chunk| {
                if let Ok(b) = &chunk {
                    lock(&h2).update(b);
                }
                chunk
            })
            .boxed();
        let written = agent.write_file(path, user, body).await?;
        let hasher = std::mem::replace(&mut *lock(&hasher), ContentHasher::new(0));
        let (rec, _) = hasher.finish();
        self.record_file(
            id,
            FileChange {
                op: FileOp::Write,
                path: written.clone(),
                to: None,
                size: Some(rec.size),
                digest: Some(rec.digest),
            },
        )?;
        Ok(written)
    }

    /// Disk admission (see `capacity`): whether `asked` more bytes of quota fit beside what
    /// live sandboxes, snapshots and volumes were promised. The guard keeps other admissions
    /// out until the caller has recorded what it admitted.
    pub(crate) async fn admit_disk(
        &self,
        what: &str,
        asked: u64,
    ) -> Result<tokio::sync::MutexGuard<'_, ()>, CoreError> {
        let guard = self.disk_admission.lock().await;
        let sandboxes: u64 = self
            .store
            .alive()
            .map_err(db)?
            .iter()
            .map(|r| r.limits.disk_bytes)
            .sum();
        let committed = sandboxes.saturating_add(self.persist.committed_bytes()?);
        let (data, root, ratio) = (
            self.cfg.data_dir.clone(),
            self.iso.store_root(),
            self.cfg.disk_overcommit,
        );
        let budget = tokio::task::spawn_blocking(move || {
            crate::capacity::measure(&data, root.as_deref(), ratio)
        })
        .await
        .map_err(|e| join_err("disk admission", e))?
        .map_err(|e| CoreError::Internal(format!("disk admission: {e}")))?;
        crate::capacity::check(what, asked, committed, &budget)?;
        Ok(guard)
    }

    pub(crate) async fn create(
        self: &Arc<Self>,
        mut req: CreateSandbox,
    ) -> Result<SandboxInfo, CoreError> {
        let t0 = Instant::now();
        let cfg = &self.cfg;
        // Secrets by name (`/v1/secrets`) become secrets with their stored value, before the
        // request is kept for fork (a fork binds the same values).
        match crate::secrets::resolve(&self.secrets, &req.secrets) {
            Ok(s) => req.secrets = s,
            Err(e) => {
                self.metrics.creates.with_label_values(&["rejected"]).inc();
                return Err(e);
            }
        }
        // Snapshot and volumes (fills the template from the snapshot).
        let staged = match crate::persist::prepare_create(self, &mut req) {
            Ok(s) => s,
            Err(e) => {
                self.metrics.creates.with_label_values(&["rejected"]).inc();
                return Err(e);
            }
        };
        let v = match validate::check_create_with(
            &req,
            &cfg.default_limits,
            &cfg.max_limits,
            cfg.default_timeout_secs,
            cfg.max_timeout_secs,
            &|n| crate::templates::is_built(&cfg.data_dir, n),
        ) {
            Ok(v) => v,
            Err(e) => {
                self.metrics.creates.with_label_values(&["rejected"]).inc();
                return Err(e);
            }
        };
        let net = match self.network.check(req.network.as_ref(), &req.secrets) {
            Ok(n) => n,
            Err(e) => {
                self.metrics.creates.with_label_values(&["rejected"]).inc();
                return Err(e);
            }
        };
        let created = now_ms();
        let new = NewSandbox {
            id: SandboxId::generate(),
            template: v.template,
            limits: v.limits,
            env: req.env,
            metadata: req.metadata,
            created_at_ms: created,
            expires_at_ms: created.saturating_add((v.timeout_secs as i64).saturating_mul(1000)),
        };
        let id = new.id.clone();
        let admitted = match self.admit_disk("a sandbox", new.limits.disk_bytes).await {
            Ok(g) => g,
            Err(e) => {
                self.metrics.creates.with_label_values(&["rejected"]).inc();
                return Err(e);
            }
        };
        let _busy = self.persist.stage(&id, staged);
        let op = self.op_lock(&id);
        let _guard = op.lock().await;
        let inserted = self
            .store
            .insert_creating(&new, cfg.max_sandboxes, cfg.uid_slots);
        drop(admitted);
        let slot = match inserted {
            Ok(s) => s,
            Err(e @ (StoreError::Full { .. } | StoreError::NoFreeSlot { .. })) => {
                self.metrics.creates.with_label_values(&["rejected"]).inc();
                lock(&self.locks).remove(&id);
                return Err(CoreError::Capacity(e.to_string()));
            }
            Err(e) => {
                self.metrics.creates.with_label_values(&["error"]).inc();
                lock(&self.locks).remove(&id);
                return Err(db(e));
            }
        };
        let on_timeout = req.on_timeout.unwrap_or_default();
        let res = match on_timeout {
            OnTimeout::Destroy => self.launch(&new, slot, on_timeout, net.as_ref()).await,
            OnTimeout::Pause => match self.store.set_on_timeout(&id, on_timeout) {
                Ok(()) => self.launch(&new, slot, on_timeout, net.as_ref()).await,
                Err(e) => Err(db(e)),
            },
        };
        lock(&self.locks).remove(&id);
        self.persist.unstage(&id);
        match res {
            Ok(info) => {
                self.metrics.creates.with_label_values(&["ok"]).inc();
                self.metrics
                    .create_seconds
                    .observe(t0.elapsed().as_secs_f64());
                info!(id = %id, slot, ms = t0.elapsed().as_millis() as u64, "sandbox created");
                Ok(info)
            }
            Err(e) => {
                self.metrics.creates.with_label_values(&["error"]).inc();
                warn!(id = %id, "sandbox create failed: {e}");
                if net.is_some() {
                    self.network.teardown(&id, slot).await;
                }
                if let Err(de) = self.iso_destroy(&id).await {
                    error!(id = %id, "cleaning up a failed create: {de}");
                }
                if let Err(se) = self.store.set_state(
                    &id,
                    SandboxState::Failed,
                    Some(now_ms()),
                    Some(&e.to_string()),
                ) {
                    error!(id = %id, "recording a failed create: {se}");
                }
                Err(e)
            }
        }
    }

    async fn launch(
        self: &Arc<Self>,
        new: &NewSandbox,
        slot: u32,
        on_timeout: OnTimeout,
        net: Option<&rampart_store::StoredNetwork>,
    ) -> Result<SandboxInfo, CoreError> {
        let uid_base = uid_base(self.cfg.uid_range_start, slot, self.cfg.uid_slots)
            .ok_or_else(|| CoreError::Capacity(format!("uid slot {slot} is out of range")))?;
        // A built template (rampart-image): its layers, metadata and start command.
        let builtin = validate::TEMPLATES.contains(&new.template.as_str());
        // Held from the resolution until the launch made the sandbox's directory (a pin
        // counts only once it exists): gc cannot remove the layers in between.
        let pin_guard = if builtin {
            None
        } else {
            crate::templates::pin_guard(&self.cfg.data_dir)?
        };
        let image = if builtin {
            None
        } else {
            crate::templates::resolve(&self.cfg.data_dir, &new.template)?
        };
        if let Some(i) = &image {
            let dir = self.state_dir.join(new.id.as_str());
            crate::templates::pin(&self.cfg.data_dir, new.id.as_str(), &dir, i)?;
        }
        let mut prepared = None;
        let mut attaching = None;
        if let Some(n) = net {
            self.store.set_network(&new.id, n).map_err(db)?;
            if n.secrets.is_empty() {
                // Nothing of the attachment goes into the environment: attach while launching.
                let (me, id, n) = (self.clone(), new.id.clone(), n.clone());
                attaching = Some(tokio::task::spawn_blocking(move || {
                    me.network.prepare(&id, slot, &n)
                }));
            } else {
                prepared = Some(self.network.prepare(&new.id, slot, n)?);
            }
        }
        let mut env = launch_env(&crate::templates::merged_env(image.as_ref(), &new.env));
        if let Some(p) = &prepared {
            env.extend(p.env());
        }
        let spec = LaunchSpec {
            id: new.id.clone(),
            template_dir: self.templates_dir.join(&new.template),
            uid_base,
            limits: new.limits.clone(),
            hostname: new.id.to_string(),
            env,
            layers: image.as_ref().map(|i| i.layers.clone()).unwrap_or_default(),
            agent_args: crate::templates::agent_args(image.as_ref()),
        };
        let t0 = Instant::now();
        let iso = self.iso.clone();
        let extras = self.persist.take_staged(&new.id);
        let launched = tokio::task::spawn_blocking(move || iso.launch_with(&spec, &extras))
            .await
            .map_err(|e| join_err("launch", e))
            .and_then(|r| r.map_err(|e| iso_err("launch", e)));
        drop(pin_guard);
        if let Some(t) = attaching {
            // Awaited even when the launch failed, so that the teardown finds it attached.
            prepared = Some(t.await.map_err(|e| join_err("egress attach", e))??);
        }
        let launched = launched?;
        let pid = launched.pid;
        let pidfd = proc::pidfd_open(pid).map_err(|e| {
            CoreError::Internal(format!("the sandbox's init (pid {pid}) is gone: {e}"))
        })?;
        let start = proc::proc_stat(pid)
            .filter(|s| !matches!(s.state, 'Z' | 'X' | 'x'))
            .ok_or_else(|| {
                CoreError::Internal(format!("the sandbox's init (pid {pid}) exited at start"))
            })?
            .start_time;
        let launched_at = Instant::now();
        let client = AgentClient::new(launched.agent_socket.clone());
        // The network is wired while the agent comes up.
        let wiring = async {
            match &prepared {
                Some(_) => self.network.wire(slot, pid).await.map(|_| ()),
                None => Ok(()),
            }
        };
        let (wired, healthy) = tokio::join!(wiring, wait_health(&client, HEALTH_DEADLINE));
        wired?;
        healthy?;
        if new.template == interpreter::TEMPLATE {
            interpreter::start(&client).await?;
        }
        if let Some(i) = &image {
            crate::templates::start(&client, i).await?;
            self.audit
                .set_template_digest(&new.template, format!("sha256:{}", i.id));
        }
        if let Some(p) = &prepared {
            let tdir = self.templates_dir.join(&new.template);
            self.network
                .configure_inside(&client, p, new.id.as_str(), &tdir)
                .await?;
        }
        let healthy_at = Instant::now();
        let sock = launched.agent_socket.to_string_lossy().into_owned();
        let mut created = self.created_body(new);
        if let (EventBody::Created(c), Some(n)) = (&mut created, net) {
            // The policy it starts with (its secrets are named in no record).
            c.policy = serde_json::to_value(&n.policy).unwrap_or_default();
        }
        let store = &self.store;
        self.audit.record(
            &new.id,
            false,
            |_| created,
            Vec::new(),
            |e| store.set_running_audited(&new.id, pid, start, &sock, e),
        )?;
        self.register(
            &new.id,
            client,
            pid,
            pidfd,
            new.expires_at_ms,
            false,
            on_timeout,
        );
        debug!(
            id = %new.id,
            launch_us = (launched_at - t0).as_micros() as u64,
            health_us = (healthy_at - launched_at).as_micros() as u64,
            record_us = healthy_at.elapsed().as_micros() as u64,
            "create phases"
        );
        Ok(SandboxInfo {
            id: new.id.clone(),
            template: new.template.clone(),
            state: SandboxState::Running,
            limits: new.limits.clone(),
            metadata: new.metadata.clone(),
            env_names: new.env.keys().cloned().collect(),
            created_at: rfc3339(new.created_at_ms),
            expires_at: rfc3339(new.expires_at_ms),
            ended_at: None,
            reason: None,
            access_token: None,
        })
    }

    pub(crate) fn get(&self, id: &SandboxId) -> Result<SandboxInfo, CoreError> {
        match self.store.get(id).map_err(db)? {
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
            .map_err(db)?
            .iter()
            .map(info_of)
            .collect())
    }

    pub(crate) async fn destroy(
        self: Arc<Self>,
        id: &SandboxId,
        why: EndReason,
    ) -> Result<SandboxInfo, CoreError> {
        let op = self.op_lock(id);
        let _guard = op.lock().await;
        let rec = self
            .store
            .get(id)
            .map_err(db)?
            .ok_or_else(|| CoreError::NotFound(id.to_string()))?;
        if !rec.state.is_alive() {
            return Ok(info_of(&rec));
        }
        if let Some(l) = lock(&self.live).get_mut(id) {
            l.stopping = true;
            l.deadline = None;
        }
        if rec.state != SandboxState::Stopping {
            self.store
                .set_state(id, SandboxState::Stopping, None, None)
                .map_err(db)?;
        }
        self.network_teardown(id, rec.uid_slot).await;
        // The writable layer, pinned before its processes are killed (fs_diff below).
        let upper = self.pin_upper(id, &rec.template).await;
        if let Err(e) = self.iso_destroy(id).await {
            error!(id = %id, "destroy failed: {e}; will retry");
            if let Some(l) = lock(&self.live).get_mut(id) {
                l.deadline = Some(Instant::now() + DESTROY_RETRY);
            }
            self.wake_reaper.notify_one();
            return Err(e);
        }
        // The init watcher (if it has not fired yet) reaps the dead init and then sees no
        // entry; it is not aborted so that no zombie is left.
        lock(&self.live).remove(id);
        if let Some(pinned) = upper {
            self.record_fs_diff(id, pinned, "destroy").await;
        }
        // What the network events budget left out (its processes are dead: no more entries).
        self.audit.record_net_suppressed(id);
        let reason = why.message();
        let label = match &why {
            EndReason::Request => "api",
            EndReason::Expired => "timeout",
            EndReason::Died(_) => "died",
        };
        self.record_end(id, SandboxState::Destroyed, &reason, label)?;
        self.metrics
            .destroyed
            .with_label_values(&[why.label()])
            .inc();
        lock(&self.locks).remove(id);
        info!(id = %id, reason, "sandbox destroyed");
        self.get(id)
    }

    pub(crate) fn set_timeout(&self, id: &SandboxId, secs: u64) -> Result<SandboxInfo, CoreError> {
        check_timeout("timeout_secs", secs, self.cfg.max_timeout_secs)?;
        {
            let mut live = lock(&self.live);
            match live.get_mut(id) {
                Some(l) if !l.stopping => {
                    l.deadline = Some(Instant::now() + Duration::from_secs(secs));
                }
                _ => {
                    drop(live);
                    return Err(self.not_running(id));
                }
            }
            let expires = now_ms().saturating_add((secs as i64).saturating_mul(1000));
            let store = &self.store;
            self.audit.record(
                id,
                false,
                |_| {
                    EventBody::TimeoutChanged(TimeoutChanged {
                        expires_at: rampart_audit::format_time(
                            time::OffsetDateTime::from_unix_timestamp_nanos(
                                i128::from(expires) * 1_000_000,
                            )
                            .unwrap_or(time::OffsetDateTime::UNIX_EPOCH),
                        ),
                    })
                },
                Vec::new(),
                |e| store.set_expiry_audited(id, expires, e),
            )?;
        }
        self.wake_reaper.notify_one();
        self.get(id)
    }

    pub(crate) fn agent(&self, id: &SandboxId) -> Result<AgentClient, CoreError> {
        match lock(&self.live).get(id) {
            Some(l) if !l.stopping && !l.paused => return Ok(l.client.clone()),
            Some(l) if !l.stopping => {
                return Err(CoreError::WrongState {
                    id: id.to_string(),
                    state: SandboxState::Paused.as_str().to_owned(),
                })
            }
            _ => {}
        }
        Err(self.not_running(id))
    }

    /// Pauses a running sandbox: freezes its processes, then records `paused` (state and
    /// audit event in one transaction). Nothing talks to its agent until it is resumed.
    /// Pausing a paused sandbox changes nothing.
    pub(crate) async fn pause(&self, id: &SandboxId) -> Result<SandboxInfo, CoreError> {
        let op = self.op_lock(id);
        let _guard = op.lock().await;
        {
            let mut live = lock(&self.live);
            match live.get_mut(id) {
                Some(l) if !l.stopping && l.paused => {
                    drop(live);
                    return self.get(id);
                }
                // From now on new requests get 409 (a frozen agent would not answer them).
                Some(l) if !l.stopping => l.paused = true,
                _ => {
                    drop(live);
                    return Err(self.not_running(id));
                }
            }
        }
        let unpause = || {
            if let Some(l) = lock(&self.live).get_mut(id) {
                l.paused = false;
            }
        };
        let t0 = Instant::now();
        if let Err(e) = self.iso_freeze(id, true).await {
            unpause();
            return Err(e);
        }
        let frozen_at = Instant::now();
        let store = &self.store;
        let recorded = self.audit.record(
            id,
            false,
            |_| EventBody::Paused(Empty {}),
            Vec::new(),
            |e| store.set_state_audited(id, SandboxState::Paused, None, None, e),
        );
        if let Err(e) = recorded {
            // Not recorded: it is not paused.
            let _ = self.iso_freeze(id, false).await;
            unpause();
            return Err(e);
        }
        self.metrics.pauses.inc();
        debug!(
            id = %id,
            freeze_us = (frozen_at - t0).as_micros() as u64,
            record_us = frozen_at.elapsed().as_micros() as u64,
            "sandbox paused"
        );
        self.get(id)
    }

    /// Resumes a paused sandbox: thaws its processes (they continue where they were), then
    /// records `running` (and `resumed`). A deadline that passed while it was paused (it was
    /// paused by its expiry) is moved to now + the default timeout. Resuming a running
    /// sandbox changes nothing.
    pub(crate) async fn resume(&self, id: &SandboxId) -> Result<SandboxInfo, CoreError> {
        let op = self.op_lock(id);
        let _guard = op.lock().await;
        match lock(&self.live).get(id) {
            Some(l) if !l.stopping && l.paused => {}
            Some(l) if !l.stopping => return self.get(id),
            _ => return Err(self.not_running(id)),
        }
        let t0 = Instant::now();
        self.iso_freeze(id, false).await?;
        let thawed_at = Instant::now();
        let store = &self.store;
        let recorded = self.audit.record(
            id,
            false,
            |_| EventBody::Resumed(Empty {}),
            Vec::new(),
            |e| store.set_state_audited(id, SandboxState::Running, None, None, e),
        );
        if let Err(e) = recorded {
            // Still paused as far as the store knows: freeze again.
            if let Err(fe) = self.iso_freeze(id, true).await {
                error!(id = %id, "resume not recorded ({e}) and freezing again failed: {fe}");
            }
            return Err(e);
        }
        let expired = {
            let mut live = lock(&self.live);
            match live.get_mut(id) {
                Some(l) => {
                    l.paused = false;
                    l.deadline.is_none()
                }
                None => false,
            }
        };
        self.metrics.resumes.inc();
        debug!(
            id = %id,
            thaw_us = (thawed_at - t0).as_micros() as u64,
            record_us = thawed_at.elapsed().as_micros() as u64,
            "sandbox resumed"
        );
        if expired {
            return self.set_timeout(id, self.cfg.default_timeout_secs);
        }
        self.get(id)
    }

    pub(crate) async fn usage(&self, id: &SandboxId) -> Result<Usage, CoreError> {
        if lock(&self.live).get(id).is_none_or(|l| l.stopping) {
            return Err(self.not_running(id));
        }
        let iso = self.iso.clone();
        let id2 = id.clone();
        tokio::task::spawn_blocking(move || iso.usage(&id2))
            .await
            .map_err(|e| join_err("usage", e))?
            .map_err(|e| iso_err("usage", e))
    }

    pub(crate) async fn exec(
        &self,
        id: &SandboxId,
        req: ExecRequest,
        keep_stdin_open: bool,
    ) -> Result<Exec, CoreError> {
        let client = self.agent(id)?;
        let v = check_exec(&req, keep_stdin_open)?;
        self.metrics.execs.inc();
        let t0 = Instant::now();
        let feed_stdin = v.opts.stdin;
        let mut audit = if self.audit.enabled() {
            Some(self.record_exec(id, &req, &v, feed_stdin)?)
        } else {
            None
        };
        let started = async {
            let mut stream = client.start(v.opts).await?;
            match stream.next().await {
                Some(Ok(ProcessEvent::Start { pid })) => Ok((stream, pid)),
                Some(Ok(other)) => Err(CoreError::Agent(ClientError::Protocol(format!(
                    "expected the process's start event, got {other:?}"
                )))),
                Some(Err(e)) => Err(e.into()),
                None => Err(CoreError::Agent(ClientError::Protocol(
                    "the agent ended the stream before the process started".into(),
                ))),
            }
        }
        .await;
        let (stream, pid) = match started {
            Ok(s) => s,
            Err(e) => {
                if let Some(a) = audit.take() {
                    a.finish(None, None, false, t0.elapsed());
                }
                return Err(e);
            }
        };
        let control = ExecControl {
            client,
            pid,
            pty: v.pty,
            streamed: audit.as_ref().map(|a| a.streamed.clone()),
        };
        if feed_stdin && (v.stdin.is_some() || !keep_stdin_open) {
            tokio::spawn(feed(
                control.clone(),
                v.stdin.unwrap_or_default(),
                !keep_stdin_open,
            ));
        }
        let events = exec_events(ExecState {
            inner: stream,
            control: control.clone(),
            timer: v
                .timeout
                .map(|t| Box::pin(tokio::time::sleep_until(t0 + t))),
            timeout: v.timeout,
            killed: false,
            timed_out: false,
            t0,
            done: false,
            hist: self.metrics.exec_seconds.clone(),
            audit,
        });
        Ok(Exec {
            pid,
            events,
            control,
        })
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

    /// Records an `exec` (before the process starts) and returns what its `exit` needs.
    fn record_exec(
        &self,
        id: &SandboxId,
        req: &ExecRequest,
        v: &validate::ValidExec,
        stdin_open: bool,
    ) -> Result<ExecAudit, CoreError> {
        self.record_exec_of(
            id,
            rampart_types::audit::Exec {
                exec_id: String::new(),
                argv: req.cmd.clone(),
                cwd: req.cwd.clone(),
                user: req.user.clone().unwrap_or_else(|| "user".into()),
                env_names: req.env.keys().cloned().collect(),
                stdin: stdin_open,
                pty: v.pty,
                input: None,
            },
            v.stdin.as_deref(),
        )
    }

    /// Records `exec` (its `exec_id` and `input` are filled in here, `input` from `stdin`)
    /// and returns what its `exit` needs.
    pub(crate) fn record_exec_of(
        &self,
        id: &SandboxId,
        mut exec: rampart_types::audit::Exec,
        stdin: Option<&[u8]>,
    ) -> Result<ExecAudit, CoreError> {
        let cap = self.audit.blob_cap();
        let (input, blob) = match stdin {
            Some(b) => {
                let (r, blob) = audit::content(b, cap);
                (Some(r), blob)
            }
            None => (None, None),
        };
        exec.input = input;
        let mut exec_id = String::new();
        self.audit.append(
            id,
            |seq| {
                exec_id = format!("x{seq}");
                exec.exec_id = exec_id.clone();
                EventBody::Exec(exec)
            },
            blob.into_iter().collect(),
        )?;
        let meter = self.audit.meter(id, || self.iso.counter_files(id));
        let cpu0 = match &meter {
            Some(m) => m.cpu_usec(),
            None => self.iso.usage(id).ok().map(|u| u.cpu_usec),
        };
        Ok(ExecAudit {
            audit: self.audit.clone(),
            iso: self.iso.clone(),
            sandbox: id.clone(),
            exec_id,
            meter,
            cpu0,
            stdout: ContentHasher::new(cap),
            stderr: ContentHasher::new(cap),
            streamed: Arc::new(Mutex::new(ContentHasher::new(cap))),
        })
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
        self.metrics.text()
    }

    fn next_deadline(&self) -> Option<Instant> {
        lock(&self.live).values().filter_map(|l| l.deadline).min()
    }

    /// The sandboxes whose deadline passed (their deadlines are disarmed) and what to do:
    /// destroy, or pause a running one created with `on_timeout: pause` (a paused one of
    /// those just stays paused, without a deadline, until resumed or destroyed).
    fn take_expired(&self) -> Vec<(SandboxId, Expiry)> {
        let now = Instant::now();
        let mut out = Vec::new();
        for (id, l) in lock(&self.live).iter_mut() {
            if l.deadline.is_some_and(|d| d <= now) {
                l.deadline = None;
                match (l.on_timeout, l.paused) {
                    (OnTimeout::Destroy, _) => out.push((id.clone(), Expiry::Destroy)),
                    (OnTimeout::Pause, false) => out.push((id.clone(), Expiry::Pause)),
                    (OnTimeout::Pause, true) => {}
                }
            }
        }
        out
    }
}

/// Sends `data` to a process's stdin in chunks, then closes it if asked.
async fn feed(control: ExecControl, data: Vec<u8>, close: bool) {
    let data = bytes::Bytes::from(data);
    let mut off = 0;
    while off < data.len() {
        let end = (off + STDIN_CHUNK).min(data.len());
        let sent = control
            .client
            .send_input(control.pid, data.slice(off..end), control.pty)
            .await;
        if let Err(e) = sent {
            debug!(pid = control.pid, "sending stdin stopped: {e}");
            return;
        }
        off = end;
    }
    if close {
        let closed = if control.pty {
            control
                .client
                .send_input(control.pid, bytes::Bytes::from_static(b"\x04"), true)
                .await
        } else {
            control.client.close_stdin(control.pid).await
        };
        if let Err(e) = closed {
            debug!(pid = control.pid, "closing stdin: {e}");
        }
    }
}

/// Sleeps until the earliest deadline (or a change of deadlines) and destroys what expired.
async fn reaper(inner: Arc<Inner>) {
    loop {
        let next = inner.next_deadline();
        let changed = inner.wake_reaper.notified();
        match next {
            Some(t) => {
                tokio::select! {
                    () = tokio::time::sleep_until(t) => {}
                    () = changed => {}
                }
            }
            None => changed.await,
        }
        if inner.stopped.load(Ordering::SeqCst) {
            return;
        }
        for (id, what) in inner.take_expired() {
            let inner2 = inner.clone();
            tokio::spawn(async move {
                if what == Expiry::Pause {
                    info!(id = %id, "deadline passed; pausing (on_timeout: pause)");
                    match inner2.pause(&id).await {
                        Ok(_) => return,
                        Err(e) => warn!(id = %id, "reaper: pausing failed ({e}); destroying"),
                    }
                } else {
                    info!(id = %id, "deadline passed; destroying");
                }
                if let Err(e) = inner2.destroy(&id, EndReason::Expired).await {
                    warn!(id = %id, "reaper: {e}");
                }
            });
        }
    }
}

/// Publishes the chain heads of live sandboxes that moved, at the configured interval.
async fn publisher(audit: Arc<Audit>) {
    let every = audit.publish_interval().max(Duration::from_secs(1));
    let mut tick = tokio::time::interval_at(Instant::now() + every, every);
    loop {
        tick.tick().await;
        let a = audit.clone();
        match tokio::task::spawn_blocking(move || a.publish_live()).await {
            Ok(Ok(Some(size))) => debug!(tree_size = size, "published audit chain heads"),
            Ok(Ok(None)) => {}
            Ok(Err(e)) => warn!("publishing audit chain heads: {e}"),
            Err(e) => warn!("publishing audit chain heads: task failed: {e}"),
        }
    }
}

/// What an exec's `exit` record needs.
pub(crate) struct ExecAudit {
    audit: Arc<Audit>,
    iso: Arc<dyn Isolation>,
    sandbox: SandboxId,
    exec_id: String,
    /// The sandbox's counter files (None: read the tier's usage).
    meter: Option<Arc<audit::Meter>>,
    /// The sandbox's CPU time when the exec started, microseconds.
    cpu0: Option<u64>,
    pub(crate) stdout: ContentHasher,
    pub(crate) stderr: ContentHasher,
    pub(crate) streamed: Arc<Mutex<ContentHasher>>,
}

impl ExecAudit {
    /// Records the `exit`. CPU time is the sandbox's (cgroup) CPU time during the exec and
    /// peak memory the sandbox's peak since it started: the cgroup is per sandbox, not per
    /// process.
    pub(crate) fn finish(
        self,
        exit_code: Option<i32>,
        signal: Option<i32>,
        timed_out: bool,
        wall: Duration,
    ) {
        let (cpu1, peak) = match &self.meter {
            Some(m) => (m.cpu_usec(), m.peak_memory_bytes()),
            None => match self.iso.usage(&self.sandbox) {
                Ok(u) => (
                    Some(u.cpu_usec),
                    Some(u.memory_peak_bytes).filter(|&p| p > 0),
                ),
                Err(_) => (None, None),
            },
        };
        let cpu_ms = match (self.cpu0, cpu1) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a) / 1000),
            _ => None,
        };
        let (stdout, out_blob) = self.stdout.finish();
        let (stderr, err_blob) = self.stderr.finish();
        let streamed = std::mem::replace(&mut *lock(&self.streamed), ContentHasher::new(0));
        let (streamed, in_blob) = streamed.finish();
        let streamed_input = (streamed.size > 0).then_some(streamed);
        let in_blob = if streamed_input.is_some() {
            in_blob
        } else {
            None
        };
        let blobs = [out_blob, err_blob, in_blob]
            .into_iter()
            .flatten()
            .collect();
        let exec_id = self.exec_id;
        if let Err(e) = self.audit.append(
            &self.sandbox,
            |_| {
                EventBody::Exit(Exit {
                    exec_id,
                    exit_code,
                    signal,
                    timed_out,
                    wall_ms: wall.as_millis() as u64,
                    cpu_ms,
                    peak_memory_bytes: peak,
                    stdout,
                    stderr,
                    streamed_input,
                })
            },
            blobs,
        ) {
            error!(id = %self.sandbox, "recording an exit: {e}");
        }
    }
}

/// Waits for a sandbox's init to exit, reaps it, and destroys the sandbox unless that exit
/// was ours.
async fn watch_init(inner: Arc<Inner>, id: SandboxId, pidfd: OwnedFd) {
    let how = match proc::wait_exit(pidfd).await {
        Ok(Some(ExitStatus::Code(c))) => format!("exit status {c}"),
        Ok(Some(ExitStatus::Signal(s))) => format!("killed by signal {s}"),
        Ok(None) => "status unknown".to_owned(),
        Err(e) => {
            warn!(id = %id, "cannot watch the sandbox's init: {e}");
            return;
        }
    };
    if inner.stopped.load(Ordering::SeqCst) {
        return;
    }
    let unexpected = lock(&inner.live).get(&id).is_some_and(|l| !l.stopping);
    if unexpected {
        let pid = lock(&inner.live).get(&id).map(|l| l.pid);
        warn!(id = %id, pid, how, "the sandbox's init exited by itself; destroying the sandbox");
        let inner2 = inner.clone();
        tokio::spawn(async move {
            if let Err(e) = inner2.destroy(&id, EndReason::Died(how)).await {
                warn!(id = %id, "cleaning up a dead sandbox: {e}");
            }
        });
    }
}

/// State of one exec's event stream.
struct ExecState {
    inner: BoxStream<'static, Result<ProcessEvent, ClientError>>,
    control: ExecControl,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    timeout: Option<Duration>,
    killed: bool,
    timed_out: bool,
    t0: Instant,
    done: bool,
    hist: Histogram,
    audit: Option<ExecAudit>,
}

impl Drop for ExecState {
    /// A stream dropped before the end (the client went away): keep reading the agent's
    /// events in the background so the `exit` is still recorded.
    fn drop(&mut self) {
        if self.done || self.audit.is_none() {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let mut rest = ExecState {
            inner: std::mem::replace(&mut self.inner, futures::stream::empty().boxed()),
            control: self.control.clone(),
            timer: self.timer.take(),
            timeout: self.timeout,
            killed: self.killed,
            timed_out: self.timed_out,
            t0: self.t0,
            done: false,
            hist: self.hist.clone(),
            audit: self.audit.take(),
        };
        self.done = true;
        rt.spawn(async move { while rest.next_event().await.is_some() {} });
    }
}

enum Step {
    Event(Option<Result<ProcessEvent, ClientError>>),
    Timer,
}

fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

impl ExecState {
    fn exit(&mut self, exit_code: Option<i32>, signal: Option<i32>) -> ExecEvent {
        self.done = true;
        let elapsed = self.t0.elapsed();
        self.hist.observe(elapsed.as_secs_f64());
        // The agent's own (backstop) timeout may have killed it first.
        let timed_out =
            self.timed_out || (signal == Some(9) && self.timeout.is_some_and(|t| elapsed >= t));
        if let Some(a) = self.audit.take() {
            a.finish(exit_code, signal, timed_out, elapsed);
        }
        ExecEvent::Exit {
            exit_code,
            signal,
            timed_out,
            duration_ms: elapsed.as_millis() as u64,
        }
    }

    fn lost(&mut self, message: String) -> ExecEvent {
        if self.timed_out {
            return self.exit(None, Some(9));
        }
        self.done = true;
        self.hist.observe(self.t0.elapsed().as_secs_f64());
        if let Some(a) = self.audit.take() {
            a.finish(None, None, false, self.t0.elapsed());
        }
        ExecEvent::Error { message }
    }

    async fn next_event(&mut self) -> Option<ExecEvent> {
        if self.done {
            return None;
        }
        loop {
            let step = {
                let timer = async {
                    match self.timer.as_mut() {
                        Some(t) => t.await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    ev = self.inner.next() => Step::Event(ev),
                    () = timer => Step::Timer,
                }
            };
            match step {
                Step::Timer if !self.killed => {
                    self.killed = true;
                    self.timed_out = true;
                    if let Err(e) = self.control.signal(true).await {
                        debug!(pid = self.control.pid, "killing a timed-out process: {e}");
                    }
                    self.timer = Some(Box::pin(tokio::time::sleep(KILL_GRACE)));
                }
                Step::Timer => {
                    // Killed, but the agent never reported the end.
                    self.timer = None;
                    return Some(self.exit(None, Some(9)));
                }
                Step::Event(None) => {
                    return Some(self.lost(
                        "the process's output ended without an exit status; the sandbox may have stopped"
                            .into(),
                    ));
                }
                Step::Event(Some(Err(e))) => {
                    return Some(self.lost(format!("lost the process: {e}")));
                }
                Step::Event(Some(Ok(ev))) => match ev {
                    ProcessEvent::Start { .. } => {}
                    ProcessEvent::Stdout(b) => {
                        if let Some(a) = self.audit.as_mut() {
                            a.stdout.update(&b);
                        }
                        return Some(ExecEvent::Stdout { data: b64(&b) });
                    }
                    ProcessEvent::Stderr(b) => {
                        if let Some(a) = self.audit.as_mut() {
                            a.stderr.update(&b);
                        }
                        return Some(ExecEvent::Stderr { data: b64(&b) });
                    }
                    ProcessEvent::Pty(b) => {
                        if let Some(a) = self.audit.as_mut() {
                            a.stdout.update(&b);
                        }
                        return Some(ExecEvent::Pty { data: b64(&b) });
                    }
                    ProcessEvent::End {
                        exit_code,
                        exited,
                        status,
                        error,
                    } => {
                        if let Some(err) = error.filter(|e| !e.is_empty()) {
                            debug!(pid = self.control.pid, status, "process ended with: {err}");
                        }
                        let (code, sig) = validate::exit_of(exit_code, exited, &status);
                        return Some(self.exit(code, sig));
                    }
                },
            }
        }
    }
}

fn exec_events(st: ExecState) -> BoxStream<'static, ExecEvent> {
    futures::stream::unfold(st, |mut st| async move {
        let ev = st.next_event().await?;
        Some((ev, st))
    })
    .boxed()
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

    #[test]
    fn times_are_rfc3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_500), "1970-01-01T00:00:01.5Z");
    }
}
