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
pub mod template_builds;
pub mod templates;
mod util;
pub mod validate;
pub mod volume_files;
pub mod webhook;

pub use audit::fsdiff::{diff_layer, DiffLimits, LayerDiff, Layers};
pub use audit::AuditConfig;
pub use audit::NetEventBudget;
pub use config::CoreConfig;
pub use error::CoreError;
pub use exec::{Exec, ExecControl, ExecRecorder, ExecStart, InputSink};
pub use isolation::{FakeTier, InitFile, Isolation, IsolationError, LaunchSpec, Launched, Usage};
pub use namespace::{DEFAULT_CGROUP_SUBTREE, JAIL_POOL_ENV};
pub use network::NetworkConfig;
pub use principal::{current as current_principal, with_caller, with_principal, Principal};
pub use sandbox::{CreateOptions, CreatedSandbox};
// The envd proxy's recorded execs (`Manager::add_exec_input`).
pub use exec::{ExecRef, ExecTicket};

use rampart_agent::client::AgentClient;
use rampart_types::audit as audit_types;
use rampart_types::{CreateSandbox, ExecRequest, SandboxId, SandboxInfo, SandboxState};
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
        Self::start_with(cfg, Arc::new(jail)).await
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
        ));
        Ok(Arc::new(Manager {
            inner,
            tenant_approvals: std::sync::OnceLock::new(),
            builds,
        }))
    }

    /// Sets where tenants' default approval policies are read (once; later calls are
    /// ignored). Without it, tenants have none.
    pub fn set_tenant_approvals(&self, f: TenantApprovals) {
        let _ = self.tenant_approvals.set(f);
    }
    /// Creates a sandbox and returns once its agent answers.
    pub async fn create(&self, req: CreateSandbox) -> Result<SandboxInfo, CoreError> {
        Ok(self.create_with(req, CreateOptions::default()).await?.info)
    }
    /// Like [`Manager::create`], with what a front end asks beyond the request: the E2B API
    /// asks for E2B facts (an envd access token and the template name it was given), which
    /// are recorded with the sandbox, in the same transaction, and forgotten when it ends
    /// (read them back through [`Manager::access`]).
    pub async fn create_with(
        &self,
        req: CreateSandbox,
        opts: CreateOptions,
    ) -> Result<CreatedSandbox, CoreError> {
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
        if principal::current_tenant().is_some() {
            if let Some(t) = &mut req.template {
                *t = match templates::lookup(self.inner.data_dir(), t, templates::Access::Read) {
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
    }
    /// One sandbox (any state, including destroyed ones kept for history).
    pub fn get(&self, id: &SandboxId) -> Result<SandboxInfo, CoreError> {
        self.inner.visible(id)?;
        self.inner.get(id)
    }
    /// Sandboxes matching a state (alive ones when None) and all the given metadata pairs.
    pub fn list(
        &self,
        state: Option<SandboxState>,
        metadata: &BTreeMap<String, String>,
    ) -> Result<Vec<SandboxInfo>, CoreError> {
        let mut all = self.inner.list(state, metadata)?;
        all.retain(|s| principal::may_see(s.tenant.as_deref()));
        Ok(all)
    }
    /// Destroys a sandbox; returns its final record.
    pub async fn destroy(&self, id: &SandboxId) -> Result<SandboxInfo, CoreError> {
        self.inner.visible(id)?;
        self.inner
            .clone()
            .destroy(id, sandbox::EndReason::Request)
            .await
    }
    /// Pauses a running sandbox: every process is frozen (no CPU used, memory kept) and
    /// commands and files answer 409 until [`Manager::resume`]. Its deadline still applies
    /// (expiry destroys it, or with `on_timeout: pause` leaves it paused without a deadline).
    /// Survives a daemon restart. Pausing a paused sandbox changes nothing.
    pub async fn pause(&self, id: &SandboxId) -> Result<SandboxInfo, CoreError> {
        self.inner.visible(id)?;
        self.inner.pause(id).await
    }
    /// Resumes a paused sandbox: every process continues where it was. If its deadline
    /// passed while paused, the new one is now + the default timeout. Resuming a running
    /// sandbox changes nothing.
    pub async fn resume(&self, id: &SandboxId) -> Result<SandboxInfo, CoreError> {
        self.resume_with(id, false).await
    }
    /// Pauses a sandbox; `memory: false` pauses it to its filesystem: its processes end, its
    /// disk is kept, and its resume boots it again from that disk (see `sandbox/cold.rs`).
    pub async fn pause_with(&self, id: &SandboxId, memory: bool) -> Result<SandboxInfo, CoreError> {
        self.inner.visible(id)?;
        if memory {
            self.inner.pause(id).await
        } else {
            self.inner.pause_to_disk(id).await
        }
    }
    /// Resumes a paused sandbox. One paused to its filesystem, or any with `reboot`, boots
    /// again from its disk (its processes start afresh, its memory is gone); a frozen one
    /// otherwise continues where it was. A running sandbox is left as it is.
    pub async fn resume_with(
        &self,
        id: &SandboxId,
        reboot: bool,
    ) -> Result<SandboxInfo, CoreError> {
        self.inner.visible(id)?;
        self.inner.resume_with(id, reboot).await
    }
    /// Sets the deadline to now + `secs`.
    pub async fn set_timeout(&self, id: &SandboxId, secs: u64) -> Result<SandboxInfo, CoreError> {
        self.inner.visible(id)?;
        self.inner.set_timeout(id, secs)
    }
    /// The agent client of a running sandbox (for the file API).
    pub fn agent(&self, id: &SandboxId) -> Result<AgentClient, CoreError> {
        self.inner.visible(id)?;
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
        self.inner.visible(id)?;
        self.inner.exec(id, req, keep_stdin_open).await
    }
    /// The requests held for approval that the caller may see (its tenant's; all for the
    /// node), oldest first.
    pub fn approvals(&self) -> Vec<rampart_types::ApprovalInfo> {
        self.inner
            .approvals
            .list(|a| principal::may_see(a.tenant.as_deref()))
    }
    /// Held request `id`.
    pub fn approval(&self, id: &str) -> Result<rampart_types::ApprovalInfo, CoreError> {
        self.inner
            .approvals
            .get(id, |a| principal::may_see(a.tenant.as_deref()))
    }
    /// Decides held request `id` as the current principal (who may not decide its own
    /// unless the policy allows it); the held exec then runs or is refused.
    pub fn decide_approval(
        &self,
        id: &str,
        approve: bool,
        reason: Option<String>,
    ) -> Result<rampart_types::Decision, CoreError> {
        self.inner.approvals.decide(id, approve, reason, |a| {
            principal::may_see(a.tenant.as_deref())
        })
    }
    /// Holds a command about to start by another road (the E2B envd proxy) if the sandbox's
    /// approval policy says so: the approval it runs under (put it in its `ExecStart`), or
    /// `Denied`.
    pub async fn authorize_exec(
        &self,
        id: &SandboxId,
        start: &ExecStart,
    ) -> Result<Option<String>, CoreError> {
        self.inner.visible(id)?;
        let req = ExecRequest {
            cmd: start.argv.clone(),
            env: start
                .env_names
                .iter()
                .map(|n| (n.clone(), String::new()))
                .collect(),
            cwd: start.cwd.clone(),
            user: Some(start.user.clone()),
            stdin: None,
            stdin_base64: None,
            tty: None,
            timeout_secs: None,
            stream: false,
            max_output_bytes: None,
        };
        self.inner.gate(id, &req).await
    }
    /// Starts a background process: the exec `req` (its `stream` is ignored) runs with no
    /// client attached, recorded like any exec; its stdin stays open. Attach to it, send it
    /// input and signals by pid; it is kept [`exec::background::RETAIN_FINISHED`] after it
    /// ends, and goes with the sandbox.
    pub async fn spawn_process(
        &self,
        id: &SandboxId,
        req: ExecRequest,
    ) -> Result<rampart_types::ProcessInfo, CoreError> {
        self.inner.visible(id)?;
        let cmd = req.cmd.clone();
        let exec = self.inner.exec(id, req, true).await?;
        let weak = Arc::downgrade(&self.inner);
        let sid = id.clone();
        let p = exec::background::Process::spawn(exec, cmd, move |pid| {
            tokio::spawn(async move {
                tokio::time::sleep(exec::background::RETAIN_FINISHED).await;
                if let Some(inner) = weak.upgrade() {
                    inner.registry.remove_process(&sid, pid);
                }
            });
        });
        let status = p.status();
        match self.inner.registry.add_process(id, p.clone()) {
            sandbox::registry::AddProcess::Added => Ok(status),
            refused => {
                // Not kept: it must not run unseen.
                let _ = p.control().signal(true).await;
                Err(match refused {
                    sandbox::registry::AddProcess::Full => CoreError::TooManyProcesses {
                        id: id.to_string(),
                        max: exec::background::MAX_PER_SANDBOX,
                    },
                    _ => self.inner.not_running(id),
                })
            }
        }
    }
    /// The background processes of a running sandbox, oldest first.
    pub fn processes(&self, id: &SandboxId) -> Result<Vec<rampart_types::ProcessInfo>, CoreError> {
        self.inner.visible(id)?;
        self.inner.agent(id)?;
        Ok(self
            .inner
            .registry
            .processes(id)
            .iter()
            .map(|p| p.status())
            .collect())
    }
    /// Background process `pid` of a running sandbox (attach, control).
    pub fn process(
        &self,
        id: &SandboxId,
        pid: u32,
    ) -> Result<Arc<exec::background::Process>, CoreError> {
        self.inner.visible(id)?;
        self.inner.agent(id)?;
        self.inner
            .registry
            .process(id, pid)
            .ok_or_else(|| CoreError::NoProcess {
                id: id.to_string(),
                pid,
            })
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
        self.inner.visible(id)?;
        self.inner.write_file(id, path, user, body).await
    }
    /// Removes a file or directory tree in a running sandbox and records it.
    pub async fn remove_file(
        &self,
        id: &SandboxId,
        path: &str,
        user: Option<&str>,
    ) -> Result<(), CoreError> {
        self.inner.visible(id)?;
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
                caller: None,
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
        self.inner.visible(id)?;
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
                caller: None,
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
        self.inner.visible(id)?;
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
                caller: None,
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
        self.inner.visible(id)?;
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
        self.inner.visible(id)?;
        self.inner.get(id)?;
        let audit = self.inner.audit.clone();
        let kept = self.inner.artifacts.clone();
        let id = id.clone();
        tokio::task::spawn_blocking(move || audit.bundle_with(&id, &|d| kept.blob(&id, d)))
            .await
            .map_err(CoreError::task("bundle"))?
    }
    /// The record as a signed DSSE envelope around an in-toto Statement v1 (subject: its
    /// chain head; predicate: its session).
    pub async fn audit_attestation(&self, id: &SandboxId) -> Result<Vec<u8>, CoreError> {
        self.inner.visible(id)?;
        self.inner.get(id)?;
        let audit = self.inner.audit.clone();
        let kept = self.inner.artifacts.clone();
        let id = id.clone();
        tokio::task::spawn_blocking(move || audit.attestation(&id, &|d| kept.blob(&id, d)))
            .await
            .map_err(CoreError::task("attestation"))?
    }
    /// What sandbox `id` kept as artifacts when it ended (`destroyed.artifacts`), while its
    /// retention lasts. A sandbox that still runs has kept nothing yet (409); one that kept
    /// nothing, or whose artifacts' retention passed, is 404.
    pub fn artifacts(&self, id: &SandboxId) -> Result<rampart_types::ArtifactList, CoreError> {
        self.inner.visible(id)?;
        match self.inner.get(id) {
            Ok(info) if info.state.is_alive() => {
                return Err(CoreError::WrongState {
                    id: id.to_string(),
                    state: info.state.as_str().to_owned(),
                })
            }
            Ok(_) => {}
            // Gone from the history (7 days) but still kept (a longer retention): the node
            // still serves them (a tenant's key was refused above: its sandbox is unknown).
            Err(CoreError::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
        let Some(i) = self.inner.artifacts.index(id)? else {
            return Err(CoreError::NotFound(format!(
                "artifacts of sandbox {id} (none were kept, or their retention passed)"
            )));
        };
        Ok(rampart_types::ArtifactList {
            sandbox_id: id.to_string(),
            kept_at: util::rfc3339(i.kept_at_ms),
            expires_at: util::rfc3339(i.expires_at_ms),
            artifacts: i.artifacts,
        })
    }
    /// One file of sandbox `id`'s artifacts (its path inside the sandbox, as listed): its
    /// entry and its bytes, opened.
    pub fn artifact(
        &self,
        id: &SandboxId,
        path: &str,
    ) -> Result<(audit_types::ArtifactFile, std::fs::File), CoreError> {
        let list = self.artifacts(id)?;
        let Some(f) = list.artifacts.files.into_iter().find(|f| f.path == path) else {
            return Err(CoreError::NotFound(format!(
                "artifact {path:?} of sandbox {id} (not a file it kept)"
            )));
        };
        let file = self
            .inner
            .artifacts
            .open_blob(id, &f.digest)
            .ok_or_else(|| {
                CoreError::NotFound(format!("artifact {path:?} of sandbox {id} (removed)"))
            })?;
        Ok((f, file))
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
    /// Current resource usage of a running sandbox.
    pub async fn usage(&self, id: &SandboxId) -> Result<Usage, CoreError> {
        self.inner.visible(id)?;
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
    /// One template by name (another tenant's is [`CoreError::NoTemplate`], as a name that
    /// does not exist).
    pub fn template(&self, name: &str) -> Result<rampart_types::TemplateInfo, CoreError> {
        templates::get(self.inner.data_dir(), name)
    }
    /// Resolves a template name a client gave, for the request's caller: the one owner
    /// check of templates ([`templates::lookup`]), which every road that names a template
    /// goes through.
    pub fn template_ref(
        &self,
        name: &str,
        access: templates::Access,
    ) -> Result<templates::TemplateRef, CoreError> {
        templates::lookup(self.inner.data_dir(), name, access)
    }
    /// Whether the request's caller sees the template stored as `stored`, and the name it
    /// knows it by.
    pub fn template_visible_name(&self, stored: &str) -> Option<String> {
        templates::visible_name(stored)
    }
    /// The limits a sandbox gets when its request names none.
    pub fn default_limits(&self) -> rampart_types::Limits {
        self.inner.cfg.default_limits.clone()
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
    /// A sandbox's network policy and addresses.
    pub fn network(
        &self,
        id: &SandboxId,
    ) -> Result<rampart_types::network::NetworkInfo, CoreError> {
        self.inner.visible(id)?;
        self.inner.network.info(self.inner.store.as_ref(), id)
    }
    /// Replaces a running sandbox's network policy; new connections obey it at once and live
    /// connections it denies are cut. From or to mode `none` the sandbox is (un)wired.
    pub async fn set_network(
        &self,
        id: &SandboxId,
        policy: rampart_types::NetworkPolicy,
    ) -> Result<rampart_types::network::NetworkInfo, CoreError> {
        self.inner.visible(id)?;
        self.inner.set_network(id, policy, None).await
    }
    /// [`Manager::set_network`] that also replaces the sandbox's secrets (a secret that keeps
    /// its name keeps its placeholder; requests on live intercepted connections use the new
    /// set from their next one). A sandbox that had no egress CA gets one, written into its
    /// trust store through its agent.
    pub async fn set_network_and_secrets(
        &self,
        id: &SandboxId,
        policy: rampart_types::NetworkPolicy,
        secrets: Vec<rampart_types::SecretSpec>,
    ) -> Result<rampart_types::network::NetworkInfo, CoreError> {
        self.inner.visible(id)?;
        // References to stored secrets (empty values) are resolved as at create.
        let secrets = self.inner.secrets.resolve(&secrets)?;
        self.inner.set_network(id, policy, Some(secrets)).await
    }
    /// A sandbox's network log entries with `seq > after`, at most `limit` (empty without a
    /// network, or once the sandbox has ended).
    pub fn network_log(
        &self,
        id: &SandboxId,
        after: u64,
        limit: usize,
    ) -> Result<Vec<rampart_types::NetLogEntry>, CoreError> {
        self.inner.visible(id)?;
        self.inner.network_log(id, after, limit)
    }
    /// New network log entries as they happen (None when the sandbox has no network log).
    pub fn network_subscribe(
        &self,
        id: &SandboxId,
    ) -> Result<Option<tokio::sync::broadcast::Receiver<rampart_types::NetLogEntry>>, CoreError>
    {
        self.inner.visible(id)?;
        self.inner.network_subscribe(id)
    }
    /// Every sandbox's access token, public ports and E2B facts (the port and envd proxies
    /// check tokens against it; public ports are changed through it). Written with the
    /// sandbox at create, forgotten at its end.
    pub fn access(&self) -> Arc<rampart_store::access::AccessStore> {
        self.inner.access.clone()
    }
    /// Records the `exec` of a command that is about to be started in a running sandbox by
    /// another road than [`Manager::exec`] (committed before this returns, so before the
    /// command starts), and returns its recorder. With the audit log off it records nothing.
    pub fn record_exec_start(
        &self,
        id: &SandboxId,
        start: ExecStart,
    ) -> Result<ExecRecorder, CoreError> {
        self.inner.visible(id)?;
        self.inner.record_exec_start(id, start)
    }
    /// Keeps the input sink of an exec recorded by another road (see
    /// [`Manager::record_exec_start`]) that started as `pid`, with `tag`, in sandbox `id`:
    /// input sent to it later is counted there ([`Manager::exec_input`]). It stays until
    /// [`Manager::remove_exec_input`] removes it or the sandbox ends (whatever ends it);
    /// None when the sandbox is not up (neither running nor paused).
    pub fn add_exec_input(
        &self,
        id: &SandboxId,
        pid: u32,
        tag: Option<&str>,
        sink: InputSink,
    ) -> Option<ExecTicket> {
        if self.inner.visible(id).is_err() {
            return None;
        }
        self.inner.registry.add_input(id, pid, tag, sink)
    }
    /// The input sink of the exec `which` names among those [`Manager::add_exec_input`]
    /// keeps for sandbox `id`.
    pub fn exec_input(&self, id: &SandboxId, which: ExecRef<'_>) -> Option<InputSink> {
        if self.inner.visible(id).is_err() {
            return None;
        }
        self.inner.registry.input(id, which)
    }
    /// Removes what `ticket` registered (a later registration of the same pid or tag stays).
    pub fn remove_exec_input(&self, id: &SandboxId, ticket: &ExecTicket) {
        if self.inner.visible(id).is_err() {
            return;
        }
        self.inner.registry.remove_input(id, ticket)
    }
    /// Records a file operation made in a sandbox by another road than the file methods.
    pub fn record_file_change(
        &self,
        id: &SandboxId,
        change: audit_types::FileChange,
    ) -> Result<(), CoreError> {
        self.inner.visible(id)?;
        self.inner.record_file(id, change)
    }
    /// Takes a snapshot of a running or paused sandbox's filesystem (see [`crate::persist`]
    /// docs); with `stop`, destroys the sandbox afterwards ("pause to disk").
    pub async fn snapshot(
        &self,
        id: &SandboxId,
        req: rampart_types::CreateSnapshot,
    ) -> Result<rampart_types::SnapshotInfo, CoreError> {
        self.inner.visible(id)?;
        let mut req = req;
        // A tenant's snapshot is named `<tenant>:<name>`; its default name (the sandbox id
        // and a random suffix) is given here so that it is too.
        let plain = match req.name.take() {
            Some(n) => {
                persist::check_plain_name("name", &n)?;
                n
            }
            None => format!("{id}-{}", rampart_store::keys::random_hex(4)),
        };
        req.name = Some(principal::qualify(&plain));
        self.inner.admit_tenant_disk(0)?;
        let info = self.inner.snapshot(id, req).await?;
        Ok(own_snapshot(info))
    }
    /// Lifecycle events of the sandboxes the caller may see (a tenant its own), in the
    /// shape of E2B's events (`events`).
    pub fn lifecycle_events(
        &self,
        q: &events::EventQuery,
    ) -> Result<Vec<serde_json::Value>, CoreError> {
        // Filtered by the caller's tenant: another tenant's sandbox has no events for it.
        self.inner.events.list(q)
    }
    /// Registers a webhook of the caller's tenant (`events`).
    pub fn create_webhook(&self, c: events::WebhookChange) -> Result<events::Webhook, CoreError> {
        self.inner.events.create_webhook(c)
    }
    /// The caller's webhooks.
    pub fn webhooks(&self) -> Result<Vec<events::Webhook>, CoreError> {
        self.inner.events.webhooks()
    }
    /// One of the caller's webhooks.
    pub fn webhook(&self, id: &str) -> Result<events::Webhook, CoreError> {
        self.inner.events.webhook(id)
    }
    /// Changes the fields `c` sets of one of the caller's webhooks.
    pub fn update_webhook(
        &self,
        id: &str,
        c: events::WebhookChange,
    ) -> Result<events::Webhook, CoreError> {
        self.inner.events.update_webhook(id, c)
    }
    /// Removes one of the caller's webhooks.
    pub fn delete_webhook(&self, id: &str) -> Result<(), CoreError> {
        self.inner.events.delete_webhook(id)
    }
    /// Every snapshot (a tenant's own), oldest first.
    pub fn list_snapshots(&self) -> Result<Vec<rampart_types::SnapshotInfo>, CoreError> {
        Ok(self
            .inner
            .persist
            .snapshots()?
            .into_iter()
            .filter_map(|s| principal::unqualify(&s.name).map(|_| own_snapshot(s)))
            .collect())
    }
    /// One snapshot.
    pub fn get_snapshot(&self, name: &str) -> Result<rampart_types::SnapshotInfo, CoreError> {
        let stored = principal::qualify(name);
        self.inner
            .persist
            .snapshot(&stored)
            .map(own_snapshot)
            .map_err(|e| renamed(e, &stored, name))
    }
    /// Removes a snapshot. Refused (409) while a create is cloning it; sandboxes made from it
    /// are not affected (each has its own copy).
    pub async fn delete_snapshot(&self, name: &str) -> Result<(), CoreError> {
        let stored = principal::qualify(name);
        self.inner
            .persist
            .delete_snapshot(&self.inner.iso, &stored)
            .await
            .map_err(|e| renamed(e, &stored, name))
    }
    /// Makes `count` sandboxes from one consistent point of a running or paused sandbox.
    pub async fn fork(
        &self,
        id: &SandboxId,
        req: rampart_types::ForkSandbox,
    ) -> Result<rampart_types::ForkResult, CoreError> {
        self.inner.visible(id)?;
        let made = self
            .inner
            .fork(id, req, CreateOptions::default(), true)
            .await?;
        Ok(rampart_types::ForkResult {
            sandboxes: made
                .into_iter()
                .filter_map(Result::ok)
                .map(|c| c.info)
                .collect(),
        })
    }
    /// Like [`Manager::fork`], each fork made with `opts` (the E2B API asks for E2B facts:
    /// the source's template name and options; each fork gets an envd token of its own), and
    /// each succeeding or failing on its own: one result per fork, in order (E2B's fork). A
    /// failure before any fork is made (the source, its consistent point) is the call's.
    pub async fn fork_each(
        &self,
        id: &SandboxId,
        req: rampart_types::ForkSandbox,
        opts: CreateOptions,
    ) -> Result<Vec<Result<CreatedSandbox, CoreError>>, CoreError> {
        self.inner.visible(id)?;
        self.inner.fork(id, req, opts, false).await
    }
    /// Makes a volume.
    pub async fn create_volume(
        &self,
        req: rampart_types::CreateVolume,
    ) -> Result<rampart_types::VolumeInfo, CoreError> {
        let mut req = req;
        persist::check_plain_name("name", &req.name)?;
        let plain = req.name.clone();
        req.name = principal::qualify(&req.name);
        self.inner.admit_tenant_disk(req.size_mib << 20)?;
        let stored = req.name.clone();
        let mut info = self
            .inner
            .create_volume(req)
            .await
            .map_err(|e| renamed(e, &stored, &plain))?;
        info.name = plain;
        Ok(info)
    }
    /// Every volume (a tenant's own).
    pub fn list_volumes(&self) -> Result<Vec<rampart_types::VolumeInfo>, CoreError> {
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
    }
    /// One volume (a tenant's own).
    pub fn volume(&self, name: &str) -> Result<rampart_types::VolumeInfo, CoreError> {
        persist::check_plain_name("name", name)?;
        self.list_volumes()?
            .into_iter()
            .find(|v| v.name == name)
            .ok_or_else(|| CoreError::NotFound(format!("volume {name}")))
    }
    /// Opens the volume `name` (a tenant's own) for the file API
    /// ([`volume_files::VolumeRoot`]): its removal is refused until the handle is dropped.
    /// Its file system is the one sandboxes mounting it share.
    pub async fn open_volume(
        &self,
        name: &str,
    ) -> Result<std::sync::Arc<volume_files::VolumeRoot>, CoreError> {
        persist::check_plain_name("name", name)?;
        let stored = principal::qualify(name);
        let busy = self
            .inner
            .persist
            .hold_volume(&stored)
            .map_err(|e| renamed(e, &stored, name))?;
        let image = self.inner.iso.volume_image(&stored)?;
        let iso = self.inner.iso.clone();
        let root = tokio::task::spawn_blocking(move || iso.volume_root(&image))
            .await
            .map_err(|e| CoreError::Internal(format!("volume: {e}")))??;
        Ok(std::sync::Arc::new(volume_files::VolumeRoot::new(
            root, busy,
        )))
    }
    /// Removes a volume and its data. Refused (409) while a sandbox has it mounted.
    pub async fn delete_volume(&self, name: &str) -> Result<(), CoreError> {
        let inner = &self.inner;
        let stored = principal::qualify(name);
        inner
            .persist
            .delete_volume(&inner.iso, inner.store.as_ref(), &stored)
            .await
            .map_err(|e| renamed(e, &stored, name))
    }
    /// A descriptor of the root of a running or paused sandbox's writable disk (see
    /// [`crate::Isolation::upper_root`]). Blocking-free: the tier's work runs on a blocking
    /// thread.
    pub async fn upper_root(&self, id: &SandboxId) -> Result<std::os::fd::OwnedFd, CoreError> {
        self.inner.visible(id)?;
        self.inner.upper_root(id).await
    }
    /// Creates or replaces the stored secret `spec.name`. Running sandboxes keep the copy
    /// they were created with.
    pub fn set_secret(
        &self,
        spec: rampart_types::SecretSpec,
    ) -> Result<rampart_types::network::StoredSecretInfo, CoreError> {
        self.inner.secrets.set(spec)
    }
    /// The stored secrets (never their values), by name.
    pub fn list_secrets(&self) -> Result<Vec<rampart_types::network::StoredSecretInfo>, CoreError> {
        self.inner.secrets.list()
    }
    /// Makes the stored secret `name` for the E2B face: unbound (a sandbox binds it to a
    /// host and header by a `network.rules` placeholder). `Conflict` if the name is taken.
    pub fn create_e2b_secret(
        &self,
        name: &str,
        value: &str,
        metadata: Option<&BTreeMap<String, String>>,
    ) -> Result<secrets::E2bSecretInfo, CoreError> {
        self.inner.secrets.create_e2b(name, value, metadata)
    }
    /// Gives the stored secret `id_or_name` a new value (its next version).
    pub fn update_e2b_secret(
        &self,
        id_or_name: &str,
        value: &str,
        metadata: Option<&BTreeMap<String, String>>,
    ) -> Result<secrets::E2bSecretInfo, CoreError> {
        self.inner.secrets.update_e2b(id_or_name, value, metadata)
    }
    /// The stored secret `id_or_name` as the E2B face shows it (never its value).
    pub fn e2b_secret(&self, id_or_name: &str) -> Result<secrets::E2bSecretInfo, CoreError> {
        self.inner.secrets.get_e2b(id_or_name)
    }
    /// The caller's stored secrets as the E2B face shows them (never their values).
    pub fn list_e2b_secrets(&self) -> Result<Vec<secrets::E2bSecretInfo>, CoreError> {
        self.inner.secrets.list_e2b()
    }
    /// Removes the stored secret `id_or_name`.
    pub fn delete_e2b_secret(&self, id_or_name: &str) -> Result<(), CoreError> {
        self.inner.secrets.delete_e2b(id_or_name)
    }
    /// Removes the stored secret `name` (`NotFound` if there is none). Running sandboxes keep
    /// the copy they were created with.
    pub fn delete_secret(&self, name: &str) -> Result<(), CoreError> {
        self.inner.secrets.delete(name)
    }
    /// The usage of the caller's tenant (a tenant's principal: its own, whatever `tenant`
    /// says; the node: `tenant`'s, or every sandbox's when None) in `[from_ms, to_ms)`,
    /// hash-chained and signed by the node key (see `docs/tenants.md`).
    pub async fn usage_report(
        &self,
        tenant: Option<String>,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<rampart_types::tenant::UsageReport, CoreError> {
        let tenant = principal::current_tenant().or(tenant);
        self.inner.usage_report(tenant, from_ms, to_ms).await
    }
    /// The node's change log: entries with `seq > after`, at most `limit` (a tenant's
    /// principal: its own entries only).
    pub fn changes(
        &self,
        after: i64,
        limit: usize,
    ) -> Result<Vec<rampart_store::tenants::Change>, CoreError> {
        let tenant = principal::current_tenant();
        self.inner
            .store
            .changes(tenant.as_deref(), after, limit)
            .map_err(CoreError::from)
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
    /// Stops the reaper; sandboxes keep running (a restarted daemon re-attaches).
    pub async fn shutdown(&self) {
        self.inner.stop_tasks();
        self.inner.network.shutdown(self.inner.store.as_ref()).await;
    }
}

/// A snapshot as its tenant knows it (its name without the tenant).
fn own_snapshot(mut s: rampart_types::SnapshotInfo) -> rampart_types::SnapshotInfo {
    if let Some(n) = principal::unqualify(&s.name) {
        s.name = n;
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
