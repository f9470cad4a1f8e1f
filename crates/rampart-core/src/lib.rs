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
//!
//! Every method below that takes a sandbox id first checks that the request's principal
//! may see it ([`principal`]: a tenant sees only its own; another tenant's id is not found,
//! as an id that does not exist), and the named objects (snapshots, volumes, stored
//! secrets) of a tenant are its own. A new method that takes an id must do the same.

pub mod approvals;
pub mod artifacts;
mod audit;
pub mod capacity;
mod config;
mod desktop;
mod error;
pub mod events;
mod exec;
mod interpreter;
pub mod isolation;
mod metrics;
mod namespace;
mod network;
pub mod persist;
pub mod principal;
mod proc;
mod sandbox;
pub mod secrets;
pub mod stored;
pub mod template_builds;
pub mod templates;
mod util;
pub mod validate;
pub mod volume_files;
pub mod webhook;

pub use audit::fsdiff::{diff_layer, DiffLimits, LayerDiff, Layers};
pub use audit::AuditConfig;
pub use audit::NetEventBudget;
pub use config::{CoreConfig, WarmPool};
pub use error::CoreError;
pub use exec::{Exec, ExecControl, ExecRecorder, ExecStart, InputSink};
pub use isolation::{
    Capabilities, ColdStop, Disks, FakeTier, Freeze, Gvisor, GvisorConfig, InitFile, Isolation,
    IsolationError, LaunchSpec, Launched, Tiers, Usage, Volumes,
};
pub use namespace::{DEFAULT_CGROUP_SUBTREE, JAIL_POOL_ENV};
pub use network::NetworkConfig;
pub use principal::Principal;
pub use sandbox::envd::body::{BoxError, EnvdBody};
pub use sandbox::envd::EnvdError;
pub use sandbox::{CreateOptions, CreatedSandbox, Held, Sandbox, Started, Tunnel};
// The agent's entry, watch-event and error types, as the handle's file and port verbs
// answer them (core's own names for them: nothing outside core speaks the agent's protocol).
pub use rampart_agent::client::{ClientError as AgentError, EntryInfo, FileKind, FsEvent};
// The envd proxy's recorded execs (`Manager::add_exec_input`).
pub use exec::{ExecRef, ExecTicket};

use rampart_types::{CreateSandbox, SandboxId, SandboxInfo, SandboxState};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The manager. Cheap to share (`Arc`).
pub struct Manager {
    inner: Arc<sandbox::Sandboxes>,
    tenant_approvals: std::sync::OnceLock<TenantApprovals>,
    builds: Arc<template_builds::TemplateBuilds>,
}

impl std::fmt::Debug for Manager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Manager")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

/// Reads a tenant's default approval policy (the server's tenant store).
pub type TenantApprovals =
    Arc<dyn Fn(&str) -> Result<Option<rampart_types::ApprovalPolicy>, String> + Send + Sync>;

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
        let jail = namespace::open(&cfg, subtree).await?;
        let (gcfg, data, agent, sub) = (
            cfg.gvisor.clone(),
            cfg.data_dir.clone(),
            cfg.agent_bin.clone(),
            subtree.to_owned(),
        );
        let gvisor = tokio::task::spawn_blocking(move || {
            isolation::Gvisor::open(&gcfg, &data, &agent, &sub)
        })
        .await
        .map_err(CoreError::task("opening the gvisor tier"))?;
        match &gvisor {
            Ok(g) => tracing::info!(platform = g.platform(), "gvisor tier ready"),
            Err(why) => tracing::info!("no gvisor tier: {why}"),
        }
        let tiers = isolation::Tiers::new(Arc::new(jail), gvisor);
        Self::start_with(cfg, Arc::new(tiers)).await
    }

    /// Like [`Manager::start`], with a given isolation tier.
    pub async fn start_with(
        cfg: CoreConfig,
        isolation: Arc<dyn Isolation>,
    ) -> Result<Arc<Manager>, CoreError> {
        let jailed = isolation.name() == "namespace";
        let inner = sandbox::Sandboxes::start(cfg, isolation).await?;
        let builds = Arc::new(template_builds::TemplateBuilds::new(
            &inner.cfg,
            inner.templates_dir(),
            jailed,
            inner.store.clone(),
        ));
        // What tenants make the host keep: measured, counted and collected (`stored`).
        tokio::spawn(stored::run(inner.clone(), builds.clone()));
        // A template built again drains its warm pools (they refill from the new build).
        let weak = Arc::downgrade(&inner);
        builds.on_built(move |name| {
            if let Some(s) = weak.upgrade() {
                let name = name.to_owned();
                tokio::spawn(async move { s.drain_pools(&name).await });
            }
        });
        Ok(Arc::new(Manager {
            inner,
            tenant_approvals: std::sync::OnceLock::new(),
            builds,
        }))
    }

    /// Sandbox `id` as `who` may see it: the one way to a sandbox's verbs. A tenant sees
    /// only its own (another tenant's id is not found, exactly as an id that does not
    /// exist); the node sees every sandbox, including ended ones kept for history.
    pub fn sandbox(&self, who: &Principal, id: &SandboxId) -> Result<Sandbox<'_>, CoreError> {
        Sandbox::resolve(&self.inner, who, id)
    }

    /// Sets where tenants' default approval policies are read (once; later calls are
    /// ignored). Without it, tenants have none.
    pub fn set_tenant_approvals(&self, f: TenantApprovals) {
        let _ = self.tenant_approvals.set(f);
    }
    /// Creates a sandbox and returns once its agent answers.
    pub async fn create(
        &self,
        who: &Principal,
        req: CreateSandbox,
    ) -> Result<SandboxInfo, CoreError> {
        principal::scope(who.clone(), async {
            Ok(self
                .create_with(who, req, CreateOptions::default())
                .await?
                .info)
        })
        .await
    }
    /// Like [`Manager::create`], with what a front end asks beyond the request: the E2B API
    /// asks for E2B facts (an envd access token and the template name it was given), which
    /// are recorded with the sandbox, in the same transaction, and forgotten when it ends
    /// (read them back through [`Manager::access`]).
    pub async fn create_with(
        &self,
        who: &Principal,
        req: CreateSandbox,
        opts: CreateOptions,
    ) -> Result<CreatedSandbox, CoreError> {
        principal::scope(who.clone(), async {
            let mut req = req;
            // A tenant's default approval policy is a floor under the sandbox's own.
            if let (Some(t), Some(f)) = (principal::current_tenant(), self.tenant_approvals.get()) {
                let default = f(&t).map_err(CoreError::Internal)?;
                if let Some(d) = default {
                    req.approvals = Some(approvals::floor(&d, req.approvals.take()));
                }
            }
            // A tenant's snapshot, volumes and stored secrets are its own (`principal`).
            if let Some(name) = &mut req.snapshot {
                *name = principal::qualify(name);
            }
            for v in &mut req.volumes {
                v.name = principal::qualify(&v.name);
            }
            // A tenant's template by its name for it: its own, the operator's or a built-in
            // one; another tenant's is unknown, as a name that does not exist (the node names
            // the store as it is).
            if who.tenant.is_some() {
                if let Some(t) = &mut req.template {
                    let tenant = who.tenant.as_deref();
                    *t = match templates::lookup(
                        self.inner.data_dir(),
                        tenant,
                        t,
                        templates::Access::Read,
                    ) {
                        Ok(r) => r.stored_ref(),
                        Err(CoreError::NoTemplate(_)) => {
                            return Err(CoreError::BadRequest {
                                field: "template".into(),
                                message: format!(
                                    "unknown template {t:?}; available: {}",
                                    validate::TEMPLATES.join(", ")
                                ),
                            })
                        }
                        Err(e) => return Err(e),
                    };
                }
            }
            self.inner.create(req, opts).await
        })
        .await
    }
    /// Sandboxes matching a state (alive ones when None) and all the given metadata pairs.
    pub fn list(
        &self,
        who: &Principal,
        state: Option<SandboxState>,
        metadata: &BTreeMap<String, String>,
    ) -> Result<Vec<SandboxInfo>, CoreError> {
        principal::sync_scope(who.clone(), || {
            let mut all = self.inner.list(state, metadata)?;
            all.retain(|s| principal::may_see(s.tenant.as_deref()));
            Ok(all)
        })
    }
    /// The requests held for approval that the caller may see (its tenant's; all for the
    /// node), oldest first.
    pub fn approvals(&self, who: &Principal) -> Vec<rampart_types::ApprovalInfo> {
        principal::sync_scope(who.clone(), || {
            self.inner
                .approvals
                .list(|a| principal::may_see(a.tenant.as_deref()))
        })
    }
    /// Held request `id`.
    pub fn approval(
        &self,
        who: &Principal,
        id: &str,
    ) -> Result<rampart_types::ApprovalInfo, CoreError> {
        principal::sync_scope(who.clone(), || {
            self.inner
                .approvals
                .get(id, |a| principal::may_see(a.tenant.as_deref()))
        })
    }
    /// Decides held request `id` as the current principal (who may not decide its own
    /// unless the policy allows it); the held exec then runs or is refused.
    pub fn decide_approval(
        &self,
        who: &Principal,
        id: &str,
        approve: bool,
        reason: Option<String>,
    ) -> Result<rampart_types::Decision, CoreError> {
        principal::sync_scope(who.clone(), || {
            self.inner.approvals.decide(id, approve, reason, |a| {
                principal::may_see(a.tenant.as_deref())
            })
        })
    }
    /// A receiver that changes whenever any audit event is appended (for following a log).
    pub fn audit_subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.audit.subscribe()
    }
    /// The node log's head as a C2SP checkpoint (signed note), and the note verifier key.
    pub fn audit_checkpoint(&self) -> (String, String) {
        self.inner.audit.checkpoint()
    }
    /// The node's public key (`ed25519:<hex>`) and its key id (hex).
    pub fn audit_key(&self) -> (String, String) {
        self.inner.audit.key()
    }
    /// The content digest of a template, as recorded in `created` events.
    pub fn template_digest(&self, template: &str) -> String {
        self.inner.audit.template_digest(template)
    }
    /// The daemon's data directory (`state.db`, `templates/`, `sandboxes/`).
    pub fn data_dir(&self) -> &std::path::Path {
        self.inner.data_dir()
    }
    /// Every template sandboxes can be created from: the built-in ones and those built
    /// into `<data>/images` (read at each call; see `docs/templates.md`).
    pub fn templates(&self, who: &Principal) -> Vec<rampart_types::TemplateInfo> {
        templates::list(self.inner.data_dir(), who.tenant.as_deref())
    }
    /// One template by name (another tenant's is [`CoreError::NoTemplate`], as a name that
    /// does not exist).
    pub fn template(
        &self,
        who: &Principal,
        name: &str,
    ) -> Result<rampart_types::TemplateInfo, CoreError> {
        templates::get(self.inner.data_dir(), who.tenant.as_deref(), name)
    }
    /// Resolves a template name a client gave, for `who`: the one owner check of
    /// templates ([`templates::lookup`]), which every road that names a template goes
    /// through.
    pub fn template_ref(
        &self,
        who: &Principal,
        name: &str,
        access: templates::Access,
    ) -> Result<templates::TemplateRef, CoreError> {
        templates::lookup(self.inner.data_dir(), who.tenant.as_deref(), name, access)
    }
    /// Whether `who` sees the template stored as `stored`, and the name it knows it by.
    pub fn template_visible_name(&self, who: &Principal, stored: &str) -> Option<String> {
        templates::visible_name(who.tenant.as_deref(), stored)
    }
    /// The limits a sandbox gets when its request names none.
    pub fn default_limits(&self) -> rampart_types::Limits {
        self.inner.cfg.default_limits.clone()
    }
    /// Starts receiving an upload of `ticket` (see
    /// [`template_builds::TemplateBuilds::begin_upload`]), bounded by what its owner's disk
    /// quota and the host's disk have left.
    pub async fn begin_upload(
        &self,
        ticket: &template_builds::UploadTicket,
    ) -> Result<template_builds::UploadBound, CoreError> {
        let room = self.inner.disk_room().await?;
        self.builds.begin_upload(ticket, room)
    }

    /// Template builds through the API (see [`template_builds`]).
    pub fn template_builds(&self) -> &Arc<template_builds::TemplateBuilds> {
        &self.builds
    }
    /// The built templates' store, if any template was built (see `docs/templates.md`).
    pub fn template_store(&self) -> Option<rampart_image::Store> {
        rampart_image::Store::open_existing(self.inner.data_dir())
    }
    /// Prometheus text exposition of the daemon's metrics.
    pub fn metrics_text(&self) -> String {
        self.inner.metrics_text()
    }
    /// Whether sandboxes can have a network on this daemon (see `docs/network.md`).
    pub fn network_available(&self) -> bool {
        self.inner.network.available()
    }
    /// Every sandbox's access token, public ports and E2B facts (the port and envd proxies
    /// check tokens against it; public ports are changed through it). Written with the
    /// sandbox at create, forgotten at its end.
    pub fn access(&self) -> Arc<rampart_store::access::AccessStore> {
        self.inner.access.clone()
    }
    /// Lifecycle events of the sandboxes the caller may see (a tenant its own), in the
    /// shape of E2B's events (`events`).
    pub fn lifecycle_events(
        &self,
        who: &Principal,
        q: &events::EventQuery,
    ) -> Result<Vec<serde_json::Value>, CoreError> {
        principal::sync_scope(who.clone(), || {
            // Filtered by the caller's tenant: another tenant's sandbox has no events for it.
            self.inner.events.list(q)
        })
    }
    /// Registers a webhook of the caller's tenant (`events`).
    pub fn create_webhook(
        &self,
        who: &Principal,
        c: events::WebhookChange,
    ) -> Result<events::Webhook, CoreError> {
        principal::sync_scope(who.clone(), || self.inner.events.create_webhook(c))
    }
    /// The caller's webhooks.
    pub fn webhooks(&self, who: &Principal) -> Result<Vec<events::Webhook>, CoreError> {
        principal::sync_scope(who.clone(), || self.inner.events.webhooks())
    }
    /// One of the caller's webhooks.
    pub fn webhook(&self, who: &Principal, id: &str) -> Result<events::Webhook, CoreError> {
        principal::sync_scope(who.clone(), || self.inner.events.webhook(id))
    }
    /// Changes the fields `c` sets of one of the caller's webhooks.
    pub fn update_webhook(
        &self,
        who: &Principal,
        id: &str,
        c: events::WebhookChange,
    ) -> Result<events::Webhook, CoreError> {
        principal::sync_scope(who.clone(), || self.inner.events.update_webhook(id, c))
    }
    /// Removes one of the caller's webhooks.
    pub fn delete_webhook(&self, who: &Principal, id: &str) -> Result<(), CoreError> {
        principal::sync_scope(who.clone(), || self.inner.events.delete_webhook(id))
    }
    /// Every snapshot (a tenant's own), oldest first.
    pub fn list_snapshots(
        &self,
        who: &Principal,
    ) -> Result<Vec<rampart_types::SnapshotInfo>, CoreError> {
        principal::sync_scope(who.clone(), || {
            Ok(self
                .inner
                .persist
                .snapshots(self.inner.iso.store_root().as_deref())?
                .into_iter()
                .filter_map(|s| {
                    principal::unqualify(&s.name).map(|_| own_snapshot(who.tenant.as_deref(), s))
                })
                .collect())
        })
    }
    /// One snapshot.
    pub fn get_snapshot(
        &self,
        who: &Principal,
        name: &str,
    ) -> Result<rampart_types::SnapshotInfo, CoreError> {
        principal::sync_scope(who.clone(), || {
            let stored = principal::qualify(name);
            self.inner
                .persist
                .snapshot(&stored, self.inner.iso.store_root().as_deref())
                .map(|s| own_snapshot(who.tenant.as_deref(), s))
                .map_err(|e| renamed(e, &stored, name))
        })
    }
    /// Removes a snapshot. Refused (409) while a create is cloning it; sandboxes made from it
    /// are not affected (each has its own copy).
    pub async fn delete_snapshot(&self, who: &Principal, name: &str) -> Result<(), CoreError> {
        principal::scope(who.clone(), async {
            let stored = principal::qualify(name);
            self.inner
                .persist
                .delete_snapshot(&self.inner.iso, &stored)
                .await
                .map_err(|e| renamed(e, &stored, name))
        })
        .await
    }
    /// Makes a volume.
    pub async fn create_volume(
        &self,
        who: &Principal,
        req: rampart_types::CreateVolume,
    ) -> Result<rampart_types::VolumeInfo, CoreError> {
        principal::scope(who.clone(), async {
            let mut req = req;
            persist::check_plain_name("name", &req.name)?;
            let plain = req.name.clone();
            req.name = principal::qualify(&req.name);
            self.inner
                .admit_tenant_disk(who.tenant.as_deref(), req.size_mib << 20)?;
            let stored = req.name.clone();
            let mut info = self
                .inner
                .create_volume(req)
                .await
                .map_err(|e| renamed(e, &stored, &plain))?;
            info.name = plain;
            Ok(info)
        })
        .await
    }
    /// Every volume (a tenant's own).
    pub fn list_volumes(
        &self,
        who: &Principal,
    ) -> Result<Vec<rampart_types::VolumeInfo>, CoreError> {
        principal::sync_scope(who.clone(), || {
            Ok(self
                .inner
                .persist
                .volumes(self.inner.iso.as_ref())?
                .into_iter()
                .filter_map(|mut v| {
                    principal::unqualify(&v.name).map(|n| {
                        v.name = n;
                        v
                    })
                })
                .collect())
        })
    }
    /// One volume (a tenant's own).
    pub fn volume(
        &self,
        who: &Principal,
        name: &str,
    ) -> Result<rampart_types::VolumeInfo, CoreError> {
        principal::sync_scope(who.clone(), || {
            persist::check_plain_name("name", name)?;
            self.list_volumes(who)?
                .into_iter()
                .find(|v| v.name == name)
                .ok_or_else(|| CoreError::NotFound(format!("volume {name}")))
        })
    }
    /// Opens the volume `name` (a tenant's own) for the file API
    /// ([`volume_files::VolumeRoot`]): its removal is refused until the handle is dropped.
    /// Its file system is the one sandboxes mounting it share.
    pub async fn open_volume(
        &self,
        who: &Principal,
        name: &str,
    ) -> Result<std::sync::Arc<volume_files::VolumeRoot>, CoreError> {
        principal::scope(who.clone(), async {
            persist::check_plain_name("name", name)?;
            let stored = principal::qualify(name);
            let busy = self
                .inner
                .persist
                .hold_volume(&stored)
                .map_err(|e| renamed(e, &stored, name))?;
            let image = self.inner.iso.volumes()?.volume_image(&stored)?;
            let iso = self.inner.iso.clone();
            let root = tokio::task::spawn_blocking(move || iso.volumes()?.volume_root(&image))
                .await
                .map_err(CoreError::failed("volume"))??;
            Ok(std::sync::Arc::new(volume_files::VolumeRoot::new(
                root, busy,
            )))
        })
        .await
    }
    /// Removes a volume and its data. Refused (409) while a sandbox has it mounted.
    pub async fn delete_volume(&self, who: &Principal, name: &str) -> Result<(), CoreError> {
        principal::scope(who.clone(), async {
            let inner = &self.inner;
            let stored = principal::qualify(name);
            inner
                .persist
                .delete_volume(&inner.iso, inner.store.as_ref(), &stored)
                .await
                .map_err(|e| renamed(e, &stored, name))
        })
        .await
    }
    /// Creates or replaces the stored secret `spec.name`. Running sandboxes keep the copy
    /// they were created with.
    pub fn set_secret(
        &self,
        who: &Principal,
        spec: rampart_types::SecretSpec,
    ) -> Result<rampart_types::network::StoredSecretInfo, CoreError> {
        principal::sync_scope(who.clone(), || self.inner.secrets.set(spec))
    }
    /// The stored secrets (never their values), by name.
    pub fn list_secrets(
        &self,
        who: &Principal,
    ) -> Result<Vec<rampart_types::network::StoredSecretInfo>, CoreError> {
        principal::sync_scope(who.clone(), || self.inner.secrets.list())
    }
    /// Makes the stored secret `name` for the E2B face: unbound (a sandbox binds it to a
    /// host and header by a `network.rules` placeholder). `Conflict` if the name is taken.
    pub fn create_e2b_secret(
        &self,
        who: &Principal,
        name: &str,
        value: &str,
        metadata: Option<&BTreeMap<String, String>>,
    ) -> Result<secrets::E2bSecretInfo, CoreError> {
        principal::sync_scope(who.clone(), || {
            self.inner.secrets.create_e2b(name, value, metadata)
        })
    }
    /// Gives the stored secret `id_or_name` a new value (its next version).
    pub fn update_e2b_secret(
        &self,
        who: &Principal,
        id_or_name: &str,
        value: &str,
        metadata: Option<&BTreeMap<String, String>>,
    ) -> Result<secrets::E2bSecretInfo, CoreError> {
        principal::sync_scope(who.clone(), || {
            self.inner.secrets.update_e2b(id_or_name, value, metadata)
        })
    }
    /// The stored secret `id_or_name` as the E2B face shows it (never its value).
    pub fn e2b_secret(
        &self,
        who: &Principal,
        id_or_name: &str,
    ) -> Result<secrets::E2bSecretInfo, CoreError> {
        principal::sync_scope(who.clone(), || self.inner.secrets.get_e2b(id_or_name))
    }
    /// The caller's stored secrets as the E2B face shows them (never their values).
    pub fn list_e2b_secrets(
        &self,
        who: &Principal,
    ) -> Result<Vec<secrets::E2bSecretInfo>, CoreError> {
        principal::sync_scope(who.clone(), || self.inner.secrets.list_e2b())
    }
    /// Removes the stored secret `id_or_name`.
    pub fn delete_e2b_secret(&self, who: &Principal, id_or_name: &str) -> Result<(), CoreError> {
        principal::sync_scope(who.clone(), || self.inner.secrets.delete_e2b(id_or_name))
    }
    /// Removes the stored secret `name` (`NotFound` if there is none). Running sandboxes keep
    /// the copy they were created with.
    pub fn delete_secret(&self, who: &Principal, name: &str) -> Result<(), CoreError> {
        principal::sync_scope(who.clone(), || self.inner.secrets.delete(name))
    }
    /// The usage of the caller's tenant (a tenant's principal: its own, whatever `tenant`
    /// says; the node: `tenant`'s, or every sandbox's when None) in `[from_ms, to_ms)`,
    /// hash-chained and signed by the node key (see `docs/tenants.md`).
    pub async fn usage_report(
        &self,
        who: &Principal,
        tenant: Option<String>,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<rampart_types::tenant::UsageReport, CoreError> {
        principal::scope(who.clone(), async {
            let tenant = principal::current_tenant().or(tenant);
            self.inner.usage_report(tenant, from_ms, to_ms).await
        })
        .await
    }
    /// The node's change log: entries with `seq > after`, at most `limit` (a tenant's
    /// principal: its own entries only).
    pub fn changes(
        &self,
        who: &Principal,
        after: i64,
        limit: usize,
    ) -> Result<Vec<rampart_store::tenants::Change>, CoreError> {
        principal::sync_scope(who.clone(), || {
            let tenant = principal::current_tenant();
            self.inner
                .store
                .changes(tenant.as_deref(), after, limit)
                .map_err(CoreError::from)
        })
    }
    /// Appends entries to the node's change log (the API server's record of every call
    /// that changes something).
    pub fn record_changes(
        &self,
        changes: &[rampart_store::tenants::Change],
    ) -> Result<(), CoreError> {
        self.inner
            .store
            .append_changes(changes)
            .map_err(CoreError::from)
    }
    /// The node's warm pools and what they hold (the node's view: admin only).
    pub fn pools(&self) -> Vec<rampart_types::PoolInfo> {
        self.inner.pools()
    }

    /// Stops the reaper; sandboxes keep running (a restarted daemon re-attaches).
    pub async fn shutdown(&self) {
        // Warm sandboxes are nobody's: they end with the daemon that launched them.
        self.inner.drain_all_pools().await;
        self.inner.stop_tasks();
        self.inner.network.shutdown(self.inner.store.as_ref()).await;
    }
}

/// A snapshot as `tenant` knows it (its name without the tenant).
pub(crate) fn own_snapshot(
    tenant: Option<&str>,
    mut s: rampart_types::SnapshotInfo,
) -> rampart_types::SnapshotInfo {
    if let Some(n) = tenant.and_then(|t| s.name.strip_prefix(t)?.strip_prefix(':')) {
        s.name = n.to_owned();
    }
    s
}

/// `e` with the stored name of an object replaced by the name its tenant gave.
fn renamed(e: CoreError, stored: &str, given: &str) -> CoreError {
    if stored == given {
        return e;
    }
    match e {
        CoreError::NotFound(m) => CoreError::NotFound(m.replace(stored, given)),
        CoreError::BadRequest { field, message } => CoreError::BadRequest {
            field,
            message: message.replace(stored, given),
        },
        other => other,
    }
}

impl Drop for Manager {
    fn drop(&mut self) {
        self.inner.stop_tasks();
    }
}
