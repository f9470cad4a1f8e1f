//! The sandbox manager.
//!
//! CONTRACT (used by rampart-server; keep these signatures).
//!
//! The manager owns the lifecycle of every sandbox: it validates requests, records each step
//! in the store before it happens, drives the isolation tier (through the [`Isolation`]
//! trait), talks to each sandbox's agent, destroys sandboxes at their deadline (the reaper),
//! notices at once when a sandbox's PID 1 dies (a pidfd per sandbox; the daemon is a child
//! subreaper so it also reaps them), and on start re-attaches to the sandboxes a previous run
//! left running and removes every trace of the rest.

mod audit;
pub mod capacity;
mod fsdiff;
mod interpreter;
pub mod isolation;
mod journal;
mod manager;
mod metrics;
mod netaudit;
mod network;
pub mod persist;
mod proc;
mod recorder;
mod secrets;
mod templates;
pub mod validate;

pub use audit::AuditConfig;
pub use fsdiff::{diff_layer, DiffLimits, LayerDiff, Layers};
pub use isolation::{FakeTier, Isolation, IsolationError, LaunchSpec, Launched, Usage};
pub use netaudit::NetEventBudget;
pub use network::NetworkConfig;
pub use recorder::{with_caller, ExecRecorder, ExecStart, InputSink};

use rampart_agent::client::{AgentClient, ClientError};
use rampart_types::audit as audit_types;
use rampart_types::{
    CreateSandbox, ExecEvent, ExecRequest, LimitError, Limits, SandboxId, SandboxInfo, SandboxState,
};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

/// Errors of the manager. Each maps to one HTTP status in the server.
#[derive(Debug, thiserror::Error)]
pub enum CoreError {
    /// 404: no such sandbox.
    #[error("sandbox {0} not found")]
    NotFound(String),
    /// 400: bad input; `field` names the offending field.
    #[error("{field}: {message}")]
    BadRequest {
        /// The field.
        field: String,
        /// Why.
        message: String,
    },
    /// 409: the sandbox is not in a state that allows this.
    #[error("sandbox {id} is {state}, not running")]
    WrongState {
        /// The sandbox.
        id: String,
        /// Its state.
        state: String,
    },
    /// 422: a limit above the daemon's maximum (or below the minimum).
    #[error(transparent)]
    Limit(#[from] LimitError),
    /// 503: the host is out of capacity (sandbox count, uid ranges).
    #[error("out of capacity: {0}")]
    Capacity(String),
    /// 413: input too large.
    #[error("too large: {0}")]
    TooLarge(String),
    /// The agent answered an error (mapped by its Connect code) or is unreachable (502).
    #[error(transparent)]
    Agent(#[from] ClientError),
    /// The host lacks a kernel feature the isolation tier needs (the message names it).
    #[error("this host cannot run sandboxes: {0}")]
    Unsupported(String),
    /// 500: anything else; the message says what.
    #[error("internal error: {0}")]
    Internal(String),
}

/// Daemon configuration.
#[derive(Debug, Clone)]
pub struct CoreConfig {
    /// Data directory: `state.db`, `templates/`, `sandboxes/`.
    pub data_dir: PathBuf,
    /// `rampart-jailer` binary.
    pub jailer_bin: PathBuf,
    /// `rampart-agent` binary.
    pub agent_bin: PathBuf,
    /// Limits applied when a request leaves a field unset.
    pub default_limits: Limits,
    /// The most a request may ask for.
    pub max_limits: Limits,
    /// Timeout when the request gives none (300 s).
    pub default_timeout_secs: u64,
    /// Longest timeout a request may ask for.
    pub max_timeout_secs: u64,
    /// Most sandboxes alive at once (503 beyond).
    pub max_sandboxes: usize,
    /// First host uid of the sandbox uid ranges; sandbox slot `n` gets
    /// `[uid_range_start + n * 65536, +65536)`.
    pub uid_range_start: u32,
    /// Number of slots (ranges) available.
    pub uid_slots: u32,
    /// The audit record: on/off, blob cap, publication interval.
    pub audit: AuditConfig,
    /// Sandbox networks: address pool, nftables table, egress ports.
    pub network: NetworkConfig,
    /// How far the disk quotas of sandboxes, snapshots and volumes may exceed the space the
    /// store can hold (see [`capacity`]); 1.0, the default, admits no overcommit.
    pub disk_overcommit: f64,
}

impl CoreConfig {
    /// A configuration with the documented defaults: default limits of 1 vCPU, 512 MiB,
    /// 1024 pids, 2 GiB disk; maxima of every host CPU, 8 GiB, 32768 pids, 50 GiB disk;
    /// 300 s default and 24 h maximum timeouts; 1024 sandboxes; uid ranges from host uid
    /// 2^29 (536870912), one of 65536 per sandbox slot.
    pub fn with_defaults(data_dir: PathBuf, jailer_bin: PathBuf, agent_bin: PathBuf) -> Self {
        let cpus = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1) as f64;
        CoreConfig {
            data_dir,
            jailer_bin,
            agent_bin,
            default_limits: Limits::default(),
            max_limits: Limits {
                cpus,
                memory_bytes: 8 << 30,
                pids: 32768,
                disk_bytes: 50 << 30,
                open_files: 1 << 20,
            },
            default_timeout_secs: 300,
            max_timeout_secs: 24 * 3600,
            max_sandboxes: 1024,
            uid_range_start: 1 << 29,
            uid_slots: 1024,
            audit: AuditConfig::default(),
            network: NetworkConfig::default(),
            disk_overcommit: 1.0,
        }
    }
}

/// A started process.
pub struct Exec {
    /// Its pid inside the sandbox.
    pub pid: u32,
    /// Output and the final event.
    pub events: futures::stream::BoxStream<'static, ExecEvent>,
    /// Control of the running process.
    pub control: ExecControl,
}

impl std::fmt::Debug for Exec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exec")
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

/// Control of a started process: input, resize, kill.
#[derive(Debug, Clone)]
pub struct ExecControl {
    client: AgentClient,
    pid: u32,
    pty: bool,
    /// Input sent after start, hashed for the `exit` record (None when not audited).
    streamed: Option<Arc<std::sync::Mutex<rampart_audit::ContentHasher>>>,
}

impl ExecControl {
    /// Sends bytes to its stdin (or PTY).
    pub async fn send_stdin(&self, data: bytes::Bytes) -> Result<(), CoreError> {
        if let Some(h) = &self.streamed {
            h.lock().unwrap_or_else(|p| p.into_inner()).update(&data);
        }
        Ok(self.client.send_input(self.pid, data, self.pty).await?)
    }
    /// Closes its stdin (for a PTY: sends EOT, ^D).
    pub async fn close_stdin(&self) -> Result<(), CoreError> {
        if self.pty {
            return self.send_stdin(bytes::Bytes::from_static(b"\x04")).await;
        }
        Ok(self.client.close_stdin(self.pid).await?)
    }
    /// Resizes its PTY.
    pub async fn resize(&self, cols: u16, rows: u16) -> Result<(), CoreError> {
        Ok(self.client.resize(self.pid, cols, rows).await?)
    }
    /// Sends SIGKILL (`kill`) or SIGTERM.
    pub async fn signal(&self, kill: bool) -> Result<(), CoreError> {
        Ok(self.client.signal(self.pid, kill).await?)
    }
}

/// Environment variable setting how many jailers the namespace tier keeps warm (cgroup v1
/// hosts; 0 disables the pool). Default [`rampart_jail::DEFAULT_POOL_SIZE`].
pub const JAIL_POOL_ENV: &str = "RAMPART_JAIL_POOL";

fn jail_pool_size() -> usize {
    match std::env::var(JAIL_POOL_ENV) {
        Ok(v) => match v.trim().parse::<usize>() {
            Ok(n) => n.min(64),
            Err(_) => {
                tracing::warn!("{JAIL_POOL_ENV}={v:?} is not a number; using the default");
                rampart_jail::DEFAULT_POOL_SIZE
            }
        },
        Err(_) => rampart_jail::DEFAULT_POOL_SIZE,
    }
}

/// Name of the cgroup subtree holding the sandboxes' cgroups.
pub const DEFAULT_CGROUP_SUBTREE: &str = "rampart";

/// The manager. Cheap to share (`Arc`).
#[derive(Debug)]
pub struct Manager {
    inner: Arc<manager::Inner>,
}

impl Manager {
    /// Probes the host, opens the store, builds the `base` template if missing, recovers
    /// sandboxes left by a previous run (re-attach the live, clean the rest), starts the reaper.
    pub async fn start(cfg: CoreConfig) -> Result<Arc<Manager>, CoreError> {
        Self::start_with_cgroup_subtree(cfg, DEFAULT_CGROUP_SUBTREE).await
    }

    /// Like [`Manager::start`], with the sandboxes' cgroups under `subtree` instead of
    /// [`DEFAULT_CGROUP_SUBTREE`] (so that tests, or two daemons, do not see each other's).
    pub async fn start_with_cgroup_subtree(
        cfg: CoreConfig,
        subtree: &str,
    ) -> Result<Arc<Manager>, CoreError> {
        // The copy-on-write store (snapshots, fork, volumes): `<data>` or a loop-mounted XFS
        // image at `<data>/store` (rampart_jail::store); sandbox directories live on it.
        let data = cfg.data_dir.clone();
        let store = tokio::task::spawn_blocking(move || rampart_jail::store::Store::open(&data))
            .await
            .map_err(|e| CoreError::Internal(format!("store: {e}")))?
            .map_err(|e| CoreError::Internal(format!("store: {e}")))?;
        // The root of the store mounted at `<data>/store` has the mode its file system was
        // made with (0755): private to the daemon, like the rest of the data directory.
        if store.root() != cfg.data_dir.as_path() {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(store.root(), std::fs::Permissions::from_mode(0o700))
                .map_err(|e| {
                    CoreError::Internal(format!("chmod {}: {e}", store.root().display()))
                })?;
        }
        let jail_cfg = rampart_jail::JailConfig {
            state_dir: store.sandboxes_dir(),
            jailer_bin: cfg.jailer_bin.clone(),
            agent_bin: cfg.agent_bin.clone(),
            cgroup_subtree: subtree.to_owned(),
        };
        // Private to the daemon (0700), whatever the umask: the jailer reaches each sandbox's
        // directory as host root.
        std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
            .create(&jail_cfg.state_dir)
            .map_err(|e| {
                CoreError::Internal(format!("creating {}: {e}", jail_cfg.state_dir.display()))
            })?;
        let pool = jail_pool_size();
        // Warm jailers have disks of the default size ready.
        let disk = cfg.default_limits.disk_bytes;
        let jail = tokio::task::spawn_blocking(move || {
            rampart_jail::Jail::new(jail_cfg).and_then(|j| j.with_pool(pool, disk))
        })
        .await
        .map_err(|e| CoreError::Internal(format!("host probe: {e}")))?
        .map_err(|e| match e {
            rampart_jail::JailError::MissingFeature { .. } => CoreError::Unsupported(e.to_string()),
            other => CoreError::Internal(other.to_string()),
        })?;
        Self::start_with(cfg, Arc::new(jail)).await
    }

    /// Like [`Manager::start`], with a given isolation tier.
    pub async fn start_with(
        cfg: CoreConfig,
        isolation: Arc<dyn Isolation>,
    ) -> Result<Arc<Manager>, CoreError> {
        let inner = manager::Inner::start(cfg, isolation).await?;
        Ok(Arc::new(Manager { inner }))
    }
    /// Creates a sandbox and returns once its agent answers.
    pub async fn create(&self, req: CreateSandbox) -> Result<SandboxInfo, CoreError> {
        self.inner.create(req).await
    }
    /// One sandbox (any state, including destroyed ones kept for history).
    pub fn get(&self, id: &SandboxId) -> Result<SandboxInfo, CoreError> {
        self.inner.get(id)
    }
    /// Sandboxes matching a state (alive ones when None) and all the given metadata pairs.
    pub fn list(
        &self,
        state: Option<SandboxState>,
        metadata: &BTreeMap<String, String>,
    ) -> Result<Vec<SandboxInfo>, CoreError> {
        self.inner.list(state, metadata)
    }
    /// Destroys a sandbox; returns its final record.
    pub async fn destroy(&self, id: &SandboxId) -> Result<SandboxInfo, CoreError> {
        self.inner
            .clone()
            .destroy(id, manager::EndReason::Request)
            .await
    }
    /// Pauses a running sandbox: every process is frozen (no CPU used, memory kept) and
    /// commands and files answer 409 until [`Manager::resume`]. Its deadline still applies
    /// (expiry destroys it, or with `on_timeout: pause` leaves it paused without a deadline).
    /// Survives a daemon restart. Pausing a paused sandbox changes nothing.
    pub async fn pause(&self, id: &SandboxId) -> Result<SandboxInfo, CoreError> {
        self.inner.pause(id).await
    }
    /// Resumes a paused sandbox: every process continues where it was. If its deadline
    /// passed while paused, the new one is now + the default timeout. Resuming a running
    /// sandbox changes nothing.
    pub async fn resume(&self, id: &SandboxId) -> Result<SandboxInfo, CoreError> {
        self.inner.resume(id).await
    }
    /// Sets the deadline to now + `secs`.
    pub async fn set_timeout(&self, id: &SandboxId, secs: u64) -> Result<SandboxInfo, CoreError> {
        self.inner.set_timeout(id, secs)
    }
    /// The agent client of a running sandbox (for the file API).
    pub fn agent(&self, id: &SandboxId) -> Result<AgentClient, CoreError> {
        self.inner.agent(id)
    }
    /// Runs a command. `Exec::events` yields output, then exactly one `Exit` or `Error`
    /// (the `Start` event is already consumed into `Exec::pid`). Applies the request's timeout
    /// (kills the process, `timed_out: true`). With `keep_stdin_open` the request's `stdin`
    /// bytes (if any) are sent and stdin stays open for `ExecControl::send_stdin`; otherwise
    /// stdin is closed after them.
    pub async fn exec(
        &self,
        id: &SandboxId,
        req: ExecRequest,
        keep_stdin_open: bool,
    ) -> Result<Exec, CoreError> {
        self.inner.exec(id, req, keep_stdin_open).await
    }
    /// Writes a file in a running sandbox (streamed), hashing the bytes as they pass, and
    /// records a `file` event (path, size, digest). Returns the absolute path written.
    pub async fn write_file(
        &self,
        id: &SandboxId,
        path: &str,
        user: Option<&str>,
        body: futures::stream::BoxStream<'static, Result<bytes::Bytes, std::io::Error>>,
    ) -> Result<String, CoreError> {
        self.inner.write_file(id, path, user, body).await
    }
    /// Removes a file or directory tree in a running sandbox and records it.
    pub async fn remove_file(
        &self,
        id: &SandboxId,
        path: &str,
        user: Option<&str>,
    ) -> Result<(), CoreError> {
        let agent = self.inner.agent(id)?;
        agent.stat(path, user).await?;
        agent.remove(path, user).await?;
        self.inner.record_file(
            id,
            audit_types::FileChange {
                op: audit_types::FileOp::Remove,
                path: path.to_owned(),
                to: None,
                size: None,
                digest: None,
            },
        )
    }
    /// Makes a directory (and its parents) in a running sandbox and records it.
    pub async fn make_dir(
        &self,
        id: &SandboxId,
        path: &str,
        user: Option<&str>,
    ) -> Result<rampart_agent::client::EntryInfo, CoreError> {
        let agent = self.inner.agent(id)?;
        let info = agent.make_dir(path, user).await?;
        self.inner.record_file(
            id,
            audit_types::FileChange {
                op: audit_types::FileOp::Mkdir,
                path: info.path.clone(),
                to: None,
                size: None,
                digest: None,
            },
        )?;
        Ok(info)
    }
    /// Moves `from` to `to` in a running sandbox and records it.
    pub async fn rename(
        &self,
        id: &SandboxId,
        from: &str,
        to: &str,
        user: Option<&str>,
    ) -> Result<rampart_agent::client::EntryInfo, CoreError> {
        let agent = self.inner.agent(id)?;
        let info = agent.rename(from, to, user).await?;
        self.inner.record_file(
            id,
            audit_types::FileChange {
                op: audit_types::FileOp::Move,
                path: from.to_owned(),
                to: Some(info.path.clone()),
                size: None,
                digest: None,
            },
        )?;
        Ok(info)
    }
    /// A sandbox's audit events with `seq > after` (from the start when None), at most
    /// `limit`. Works for destroyed sandboxes too.
    pub fn audit_events(
        &self,
        id: &SandboxId,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<audit_types::Event>, CoreError> {
        self.inner.get(id)?;
        self.inner.audit.events(id, after, limit)
    }
    /// A receiver that changes whenever any audit event is appended (for following a log).
    pub fn audit_subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.audit.subscribe()
    }
    /// The bundle (`docs/proof.md`) of a sandbox's log: publishes its chain head to the node
    /// log and signs a tree head first if the chain moved since its last publication.
    pub async fn audit_bundle(&self, id: &SandboxId) -> Result<Vec<u8>, CoreError> {
        self.inner.get(id)?;
        let audit = self.inner.audit.clone();
        let id = id.clone();
        tokio::task::spawn_blocking(move || audit.bundle(&id))
            .await
            .map_err(|e| CoreError::Internal(format!("bundle: task failed: {e}")))?
    }
    /// The node's public key (`ed25519:<hex>`) and its key id (hex).
    pub fn audit_key(&self) -> (String, String) {
        self.inner.audit.key()
    }
    /// The content digest of a template, as recorded in `created` events.
    pub fn template_digest(&self, template: &str) -> String {
        self.inner.audit.template_digest(template)
    }
    /// Current resource usage of a running sandbox.
    pub async fn usage(&self, id: &SandboxId) -> Result<Usage, CoreError> {
        self.inner.usage(id).await
    }
    /// The daemon's data directory (`state.db`, `templates/`, `sandboxes/`).
    pub fn data_dir(&self) -> &std::path::Path {
        self.inner.data_dir()
    }
    /// Every template sandboxes can be created from: the built-in ones and those built
    /// into `<data>/images` (read at each call; see `docs/templates.md`).
    pub fn templates(&self) -> Vec<rampart_types::TemplateInfo> {
        templates::list(self.inner.data_dir())
    }
    /// One template by name.
    pub fn template(&self, name: &str) -> Result<rampart_types::TemplateInfo, CoreError> {
        templates::get(self.inner.data_dir(), name)
            .ok_or_else(|| CoreError::NotFound(format!("template {name}")))
    }
    /// Prometheus text exposition of the daemon's metrics.
    pub fn metrics_text(&self) -> String {
        self.inner.metrics_text()
    }
    /// Whether sandboxes can have a network on this daemon (see `docs/network.md`).
    pub fn network_available(&self) -> bool {
        self.inner.network.available()
    }
    /// A sandbox's network policy and addresses.
    pub fn network(
        &self,
        id: &SandboxId,
    ) -> Result<rampart_types::network::NetworkInfo, CoreError> {
        self.inner.network_info(id)
    }
    /// Replaces a running sandbox's network policy; new connections obey it at once and live
    /// connections it denies are cut. From or to mode `none` the sandbox is (un)wired.
    pub async fn set_network(
        &self,
        id: &SandboxId,
        policy: rampart_types::NetworkPolicy,
    ) -> Result<rampart_types::network::NetworkInfo, CoreError> {
        self.inner.set_network(id, policy).await
    }
    /// A sandbox's network log entries with `seq > after`, at most `limit` (empty without a
    /// network, or once the sandbox has ended).
    pub fn network_log(
        &self,
        id: &SandboxId,
        after: u64,
        limit: usize,
    ) -> Result<Vec<rampart_types::NetLogEntry>, CoreError> {
        self.inner.network_log(id, after, limit)
    }
    /// New network log entries as they happen (None when the sandbox has no network log).
    pub fn network_subscribe(
        &self,
        id: &SandboxId,
    ) -> Result<Option<tokio::sync::broadcast::Receiver<rampart_types::NetLogEntry>>, CoreError>
    {
        self.inner.network_subscribe(id)
    }
    /// Stops the reaper; sandboxes keep running (a restarted daemon re-attaches).
    pub async fn shutdown(&self) {
        self.inner.stop_tasks();
        self.inner.network_shutdown().await;
    }
}

impl Drop for Manager {
    fn drop(&mut self) {
        self.inner.stop_tasks();
    }
}
