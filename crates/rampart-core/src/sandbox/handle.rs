//! The one way to a sandbox: [`crate::Manager::sandbox`] resolves an id for a caller, checks
//! once that the caller may see it (a tenant sees only its own; another tenant's id is not
//! found, exactly as an id that does not exist), and hands out a [`Sandbox`] whose methods
//! are the verbs. `Manager` has no method that takes a sandbox id, and a `Sandbox` cannot be
//! made any other way (its fields are private), so a verb cannot skip the check.
//!
//! Every verb runs on behalf of the handle's caller: the record names it, and the tenant's
//! named objects (snapshots) are its own.

use super::envd::{body::EnvdBody, EnvdError};
use super::*;
use crate::exec::{ExecRef, ExecTicket, InputSink};
use crate::principal::{self, Principal};
use crate::util;
use crate::{AgentError, EntryInfo, FsEvent};
use futures::future::BoxFuture;
use rampart_types::audit as audit_types;
use rampart_types::ApprovalInfo;

/// A sandbox, resolved for a caller who may see it. Made by [`crate::Manager::sandbox`].
pub struct Sandbox<'m> {
    core: &'m Arc<Sandboxes>,
    who: Principal,
    id: SandboxId,
}

impl std::fmt::Debug for Sandbox<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox")
            .field("id", &self.id)
            .field("caller", &self.who.caller)
            .finish_non_exhaustive()
    }
}

/// How an exec began: running, or held by the sandbox's approval policy.
#[derive(Debug)]
pub enum Started {
    /// It runs.
    Running(Exec),
    /// The approval policy holds it until someone decides ([`Held::decided`]).
    Held(Held),
}

/// An exec held for approval.
pub struct Held {
    /// The approval it waits for (its id, the request as the approver sees it).
    pub approval: ApprovalInfo,
    decision: BoxFuture<'static, Result<Exec, CoreError>>,
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Held")
            .field("approval", &self.approval)
            .finish_non_exhaustive()
    }
}

impl Held {
    /// Waits for the decision: the exec running once approved, `Denied` when refused or
    /// when nobody decided in time. Dropping it withdraws the request.
    pub async fn decided(self) -> Result<Exec, CoreError> {
        self.decision.await
    }
}

impl<'m> Sandbox<'m> {
    /// Resolves `id` for `who` (see the module's doc).
    pub(crate) fn resolve(
        core: &'m Arc<Sandboxes>,
        who: &Principal,
        id: &SandboxId,
    ) -> Result<Self, CoreError> {
        core.visible(who.tenant.as_deref(), id)?;
        Ok(Sandbox {
            core,
            who: who.clone(),
            id: id.clone(),
        })
    }

    /// Runs `f` on behalf of the handle's caller.
    async fn scoped<T>(&self, f: impl std::future::Future<Output = T>) -> T {
        principal::scope(self.who.clone(), f).await
    }

    /// Runs `f` on behalf of the handle's caller.
    fn scoped_sync<T>(&self, f: impl FnOnce() -> T) -> T {
        principal::sync_scope(self.who.clone(), f)
    }

    /// Its id.
    pub fn id(&self) -> &SandboxId {
        &self.id
    }

    /// Who acts on it.
    pub fn caller(&self) -> &Principal {
        &self.who
    }

    /// What it is (any state, including destroyed ones kept for history).
    pub fn info(&self) -> Result<SandboxInfo, CoreError> {
        self.core.get(&self.id)
    }

    /// Destroys it; returns its final record.
    pub async fn destroy(&self) -> Result<SandboxInfo, CoreError> {
        self.scoped(self.core.clone().destroy(&self.id, EndReason::Request))
            .await
    }

    /// Pauses it: every process is frozen (no CPU used, memory kept) and commands and
    /// files answer 409 until [`Sandbox::resume`]. Its deadline still applies (expiry
    /// destroys it, or with `on_timeout: pause` leaves it paused without a deadline).
    /// Survives a daemon restart. Pausing a paused sandbox changes nothing.
    pub async fn pause(&self) -> Result<SandboxInfo, CoreError> {
        self.scoped(self.core.pause(&self.id)).await
    }

    /// Pauses it; `memory: false` pauses it to its filesystem: its processes end, its disk
    /// is kept, and its resume boots it again from that disk (see `sandbox/cold.rs`).
    pub async fn pause_with(&self, memory: bool) -> Result<SandboxInfo, CoreError> {
        if memory {
            self.pause().await
        } else {
            self.scoped(self.core.pause_to_disk(&self.id, false)).await
        }
    }

    /// Pauses it to disk: its processes end and its disk is kept; with `memory`, its
    /// processes' memory and state are saved beside the disk (the gVisor tier; refused
    /// otherwise) and its resume restores them where they were. Holds no memory or CPU
    /// while so paused and survives a daemon restart.
    pub async fn pause_to_disk(&self, memory: bool) -> Result<SandboxInfo, CoreError> {
        self.scoped(self.core.pause_to_disk(&self.id, memory)).await
    }

    /// Resumes it: every process continues where it was. If its deadline passed while
    /// paused, the new one is now + the default timeout. Resuming a running sandbox changes
    /// nothing.
    pub async fn resume(&self) -> Result<SandboxInfo, CoreError> {
        self.resume_with(false).await
    }

    /// Resumes it. One paused to its filesystem, or any with `reboot`, boots again from its
    /// disk (its processes start afresh, its memory is gone); a frozen one otherwise
    /// continues where it was. A running sandbox is left as it is.
    pub async fn resume_with(&self, reboot: bool) -> Result<SandboxInfo, CoreError> {
        self.scoped(self.core.resume_with(&self.id, reboot)).await
    }

    /// Sets its deadline to now + `secs`.
    pub async fn set_timeout(&self, secs: u64) -> Result<SandboxInfo, CoreError> {
        self.scoped_sync(|| self.core.set_timeout(&self.id, secs))
    }

    /// Whether it runs (its agent takes requests): `WrongState` when paused, not found or
    /// not running otherwise. Wakes nothing (see [`Sandbox::wake`]).
    pub fn running(&self) -> Result<(), CoreError> {
        self.core.agent(&self.id).map(drop)
    }

    /// Makes sure it runs for a request: one asleep (or paused) with an idle sleep is woken
    /// (see `idle_pause_secs`); otherwise as [`Sandbox::running`].
    pub async fn wake(&self) -> Result<(), CoreError> {
        self.scoped(self.core.awake(&self.id)).await.map(drop)
    }

    /// Its agent's client for a request, woken first if it sleeps, with the request's
    /// activity (keep it until the request is done), for the verbs that speak to it (in
    /// this crate only: nothing outside core and the agent speaks the agent's protocol).
    pub(crate) async fn awake(&self) -> Result<super::idle::Awake, CoreError> {
        self.scoped(self.core.awake(&self.id)).await
    }

    /// The room that holds the sandboxes (for the verbs that outlive the handle).
    pub(crate) fn core(&self) -> &'m Arc<Sandboxes> {
        self.core
    }

    /// The E2B envd face's road to its agent ([`super::envd`]): `req` goes to the agent as
    /// it came and its answer comes back, both read on their way; an exec is recorded,
    /// held for approval and its output hashed (secrets redacted) as on the native exec
    /// path, file changes are recorded, and what cannot be read for the record is refused
    /// (answered here in the protocol's error form, never forwarded). `Err` when the agent
    /// gave no answer.
    pub async fn envd<B>(
        &self,
        req: http::Request<B>,
    ) -> Result<http::Response<EnvdBody>, EnvdError>
    where
        B: hyper::body::Body<Data = bytes::Bytes> + Send + 'static,
        B::Error: Into<super::envd::body::BoxError>,
    {
        super::envd::serve(self, req.map(super::envd::body::boxed)).await
    }

    /// Reads a file, streamed.
    pub async fn read_file(
        &self,
        path: &str,
        user: Option<&str>,
    ) -> Result<BoxStream<'static, Result<bytes::Bytes, AgentError>>, CoreError> {
        let a = self.awake().await?;
        let s = a.client.read_file(path, user).await?;
        Ok(super::idle::Awake::hold(a.activity, s))
    }

    /// A file's (or directory's) entry.
    pub async fn stat(&self, path: &str, user: Option<&str>) -> Result<EntryInfo, CoreError> {
        Ok(self.awake().await?.client.stat(path, user).await?)
    }

    /// A directory's entries, `depth` levels down.
    pub async fn list_dir(
        &self,
        path: &str,
        depth: u32,
        user: Option<&str>,
    ) -> Result<Vec<EntryInfo>, CoreError> {
        Ok(self
            .awake()
            .await?
            .client
            .list_dir(path, depth, user)
            .await?)
    }

    /// Changes under a directory as they happen.
    pub async fn watch(
        &self,
        path: &str,
        recursive: bool,
        user: Option<&str>,
    ) -> Result<BoxStream<'static, Result<FsEvent, AgentError>>, CoreError> {
        let a = self.awake().await?;
        let s = a.client.watch(path, recursive, user).await?;
        Ok(super::idle::Awake::hold(a.activity, s))
    }

    /// A connection to `127.0.0.1:port` inside it, through its agent's tunnel (it stays
    /// awake while the connection is open).
    pub async fn tunnel(&self, port: u16) -> Result<super::Tunnel, CoreError> {
        let a = self.awake().await?;
        let io = a.client.tunnel(port).await?;
        Ok(super::Tunnel::new(io, a.activity))
    }

    /// The ports listening inside it on an address the tunnel reaches.
    pub async fn listening_ports(&self) -> Result<Vec<u16>, CoreError> {
        Ok(self.awake().await?.client.listening_ports().await?)
    }

    /// Whether its agent answers its health check.
    pub async fn health(&self) -> Result<(), CoreError> {
        Ok(self.awake().await?.client.health().await?)
    }

    /// Starts a command: it runs ([`Started::Running`]), or the sandbox's approval policy
    /// holds it ([`Started::Held`]) until someone decides. `Exec::events` yields output,
    /// then exactly one `Exit` or `Error` (the `Start` event is already consumed into
    /// `Exec::pid`). Applies the request's timeout (kills the process, `timed_out: true`).
    /// With `keep_stdin_open` the request's `stdin` bytes (if any) are sent and stdin stays
    /// open for `ExecControl::send_stdin`; otherwise stdin is closed after them.
    pub async fn start(
        &self,
        req: ExecRequest,
        keep_stdin_open: bool,
    ) -> Result<Started, CoreError> {
        self.start_with(req, keep_stdin_open, true).await
    }

    /// [`Sandbox::start`]; `client`: someone reads its events, which keep the sandbox awake
    /// until they end (a background process's do not).
    async fn start_with(
        &self,
        req: ExecRequest,
        keep_stdin_open: bool,
        client: bool,
    ) -> Result<Started, CoreError> {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let core = self.core.clone();
        let id = self.id.clone();
        // Bad input is refused whatever the sandbox (validated once, here), and wakes
        // nothing.
        let v = crate::validate::check_exec(&req, keep_stdin_open)?;
        // Woken first if it sleeps; awake until the exec's events end (or it is refused).
        let activity = self.awake().await?.activity.filter(|_| client);
        let mut run: BoxFuture<'static, Result<Exec, CoreError>> = Box::pin(principal::scope(
            self.who.clone(),
            crate::approvals::on_hold(tx, async move {
                let mut exec = core.exec(&id, req, v, keep_stdin_open).await?;
                exec.events = super::idle::Awake::hold(activity, exec.events);
                Ok(exec)
            }),
        ));
        tokio::select! {
            r = &mut run => r.map(Started::Running),
            Some(approval) = rx.recv() => Ok(Started::Held(Held { approval, decision: run })),
        }
    }

    /// Runs a command, waiting through an approval hold if its policy asks for one (see
    /// [`Sandbox::start`]).
    pub async fn exec(&self, req: ExecRequest, keep_stdin_open: bool) -> Result<Exec, CoreError> {
        match self.start(req, keep_stdin_open).await? {
            Started::Running(e) => Ok(e),
            Started::Held(h) => h.decided().await,
        }
    }

    /// Holds a command about to start by another road (the E2B envd proxy) if the
    /// sandbox's approval policy says so: the approval it runs under (put it in its
    /// `ExecStart`), or `Denied`.
    pub async fn authorize_exec(&self, start: &ExecStart) -> Result<Option<String>, CoreError> {
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
        self.scoped(self.core.gate(&self.id, &req)).await
    }

    /// Starts a background process: the exec `req` (its `stream` is ignored) runs with no
    /// client attached, recorded like any exec; its stdin stays open. Attach to it, send it
    /// input and signals by pid; it is kept [`crate::exec::background::RETAIN_FINISHED`]
    /// after it ends, and goes with the sandbox.
    pub async fn spawn_process(
        &self,
        req: ExecRequest,
    ) -> Result<rampart_types::ProcessInfo, CoreError> {
        use crate::exec::background;
        let cmd = req.cmd.clone();
        // No client reads it: it does not keep the sandbox awake.
        let exec = match self.start_with(req, true, false).await? {
            Started::Running(e) => e,
            Started::Held(h) => h.decided().await?,
        };
        let weak = Arc::downgrade(self.core);
        let sid = self.id.clone();
        let p = background::Process::spawn(exec, cmd, move |pid| {
            tokio::spawn(async move {
                tokio::time::sleep(background::RETAIN_FINISHED).await;
                if let Some(core) = weak.upgrade() {
                    core.registry.remove_process(&sid, pid);
                }
            });
        });
        let status = p.status();
        match self.core.registry.add_process(&self.id, p.clone()) {
            registry::AddProcess::Added => Ok(status),
            refused => {
                // Not kept: it must not run unseen.
                let _ = p.control().signal(true).await;
                Err(match refused {
                    registry::AddProcess::Full => CoreError::TooManyProcesses {
                        id: self.id.to_string(),
                        max: background::MAX_PER_SANDBOX,
                    },
                    _ => self.core.not_running(&self.id),
                })
            }
        }
    }

    /// Its background processes, oldest first (it must be running).
    pub fn processes(&self) -> Result<Vec<rampart_types::ProcessInfo>, CoreError> {
        self.core.agent(&self.id)?;
        Ok(self
            .core
            .registry
            .processes(&self.id)
            .iter()
            .map(|p| p.status())
            .collect())
    }

    /// Its background process `pid` (attach, control; it must be running).
    pub fn process(&self, pid: u32) -> Result<Arc<crate::exec::background::Process>, CoreError> {
        self.core.agent(&self.id)?;
        self.core
            .registry
            .process(&self.id, pid)
            .ok_or_else(|| CoreError::NoProcess {
                id: self.id.to_string(),
                pid,
            })
    }

    /// Writes a file (streamed), hashing the bytes as they pass, and records a `file`
    /// event (path, size, digest). Returns the absolute path written.
    pub async fn write_file(
        &self,
        path: &str,
        user: Option<&str>,
        body: BoxStream<'static, Result<bytes::Bytes, std::io::Error>>,
    ) -> Result<String, CoreError> {
        // Woken first if it sleeps, and awake until the write is done.
        let _awake = self.awake().await?;
        self.scoped(self.core.write_file(&self.id, path, user, body))
            .await
    }

    /// Removes a file or directory tree and records it.
    pub async fn remove_file(&self, path: &str, user: Option<&str>) -> Result<(), CoreError> {
        let awake = self.awake().await?;
        let agent = &awake.client;
        agent.stat(path, user).await?;
        agent.remove(path, user).await?;
        self.record_file_change(FileChange {
            op: FileOp::Remove,
            path: path.to_owned(),
            to: None,
            size: None,
            digest: None,
            caller: None,
        })
    }

    /// Makes a directory (and its parents) and records it.
    pub async fn make_dir(&self, path: &str, user: Option<&str>) -> Result<EntryInfo, CoreError> {
        let awake = self.awake().await?;
        let agent = &awake.client;
        let info = agent.make_dir(path, user).await?;
        self.record_file_change(FileChange {
            op: FileOp::Mkdir,
            path: info.path.clone(),
            to: None,
            size: None,
            digest: None,
            caller: None,
        })?;
        Ok(info)
    }

    /// Moves `from` to `to` and records it.
    pub async fn rename(
        &self,
        from: &str,
        to: &str,
        user: Option<&str>,
    ) -> Result<EntryInfo, CoreError> {
        let awake = self.awake().await?;
        let agent = &awake.client;
        let info = agent.rename(from, to, user).await?;
        self.record_file_change(FileChange {
            op: FileOp::Move,
            path: from.to_owned(),
            to: Some(info.path.clone()),
            size: None,
            digest: None,
            caller: None,
        })?;
        Ok(info)
    }

    /// Records a file operation made in it by another road than the file methods.
    pub fn record_file_change(&self, change: FileChange) -> Result<(), CoreError> {
        self.scoped_sync(|| self.core.record_file(&self.id, change))
    }

    /// Its audit events with `seq > after` (from the start when None), at most `limit`.
    /// Works for destroyed sandboxes too.
    pub fn audit_events(
        &self,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<audit_types::Event>, CoreError> {
        self.core.get(&self.id)?;
        self.core.audit.events(&self.id, after, limit)
    }

    /// The bundle (`docs/proof.md`) of its log: publishes its chain head to the node log
    /// and signs a tree head first if the chain moved since its last publication.
    pub async fn audit_bundle(&self) -> Result<Vec<u8>, CoreError> {
        self.core.get(&self.id)?;
        let audit = self.core.audit.clone();
        let kept = self.core.artifacts.clone();
        let id = self.id.clone();
        tokio::task::spawn_blocking(move || audit.bundle_with(&id, &|d| kept.blob(&id, d)))
            .await
            .map_err(CoreError::task("bundle"))?
    }

    /// Its record as a signed DSSE envelope around an in-toto Statement v1 (subject: its
    /// chain head; predicate: its session).
    pub async fn audit_attestation(&self) -> Result<Vec<u8>, CoreError> {
        self.core.get(&self.id)?;
        let audit = self.core.audit.clone();
        let kept = self.core.artifacts.clone();
        let id = self.id.clone();
        tokio::task::spawn_blocking(move || audit.attestation(&id, &|d| kept.blob(&id, d)))
            .await
            .map_err(CoreError::task("attestation"))?
    }

    /// What it kept as artifacts when it ended (`destroyed.artifacts`), while their
    /// retention lasts. A sandbox that still runs has kept nothing yet (409); one that kept
    /// nothing, or whose artifacts' retention passed, is 404.
    pub fn artifacts(&self) -> Result<rampart_types::ArtifactList, CoreError> {
        let id = &self.id;
        match self.core.get(id) {
            Ok(info) if info.state.is_alive() => {
                return Err(CoreError::WrongState {
                    id: id.to_string(),
                    state: info.state.as_str().to_owned(),
                })
            }
            Ok(_) => {}
            // Gone from the history (7 days) but still kept (a longer retention): the node
            // still serves them (a tenant's key was refused at resolve: its sandbox is
            // unknown).
            Err(CoreError::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
        let Some(i) = self.core.artifacts.index(id)? else {
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

    /// One file of its artifacts (its path inside the sandbox, as listed): its entry and
    /// its bytes, opened.
    pub fn artifact(
        &self,
        path: &str,
    ) -> Result<(audit_types::ArtifactFile, std::fs::File), CoreError> {
        let id = &self.id;
        let list = self.artifacts()?;
        let Some(f) = list.artifacts.files.into_iter().find(|f| f.path == path) else {
            return Err(CoreError::NotFound(format!(
                "artifact {path:?} of sandbox {id} (not a file it kept)"
            )));
        };
        let file = self
            .core
            .artifacts
            .open_blob(id, &f.digest)
            .ok_or_else(|| {
                CoreError::NotFound(format!("artifact {path:?} of sandbox {id} (removed)"))
            })?;
        Ok((f, file))
    }

    /// Its current resource usage (it must be running).
    pub async fn usage(&self) -> Result<Usage, CoreError> {
        self.core.usage(&self.id).await
    }

    /// Its network policy and addresses.
    pub fn network(&self) -> Result<NetworkInfo, CoreError> {
        self.core.network.info(self.core.store.as_ref(), &self.id)
    }

    /// Replaces its network policy; new connections obey it at once and live connections
    /// it denies are cut. From or to mode `none` the sandbox is (un)wired.
    pub async fn set_network(&self, policy: NetworkPolicy) -> Result<NetworkInfo, CoreError> {
        self.scoped(self.core.set_network(&self.id, policy, None))
            .await
    }

    /// [`Sandbox::set_network`] that also replaces its secrets (a secret that keeps its
    /// name keeps its placeholder; requests on live intercepted connections use the new set
    /// from their next one). A sandbox that had no egress CA gets one, written into its
    /// trust store through its agent.
    pub async fn set_network_and_secrets(
        &self,
        policy: NetworkPolicy,
        secrets: Vec<rampart_types::SecretSpec>,
    ) -> Result<NetworkInfo, CoreError> {
        self.scoped(async {
            // References to stored secrets (empty values) are resolved as at create.
            let secrets = self.core.secrets.resolve(&secrets)?;
            self.core.set_network(&self.id, policy, Some(secrets)).await
        })
        .await
    }

    /// Its network log entries with `seq > after`, at most `limit` (empty without a
    /// network, or once the sandbox has ended).
    pub fn network_log(&self, after: u64, limit: usize) -> Result<Vec<NetLogEntry>, CoreError> {
        self.core.network_log(&self.id, after, limit)
    }

    /// New network log entries as they happen (None when it has no network log).
    pub fn network_subscribe(
        &self,
    ) -> Result<Option<tokio::sync::broadcast::Receiver<NetLogEntry>>, CoreError> {
        self.core.network_subscribe(&self.id)
    }

    /// Records the `exec` of a command about to be started in it by another road than
    /// [`Sandbox::exec`] (committed before this returns, so before the command starts),
    /// and returns its recorder. With the audit log off it records nothing.
    pub fn record_exec_start(&self, start: ExecStart) -> Result<ExecRecorder, CoreError> {
        self.scoped_sync(|| self.core.record_exec_start(&self.id, start))
    }

    /// Keeps the input sink of an exec recorded by another road (see
    /// [`Sandbox::record_exec_start`]) that started as `pid`, with `tag`: input sent to it
    /// later is counted there ([`Sandbox::exec_input`]). It stays until
    /// [`Sandbox::remove_exec_input`] removes it or the sandbox ends (whatever ends it);
    /// None when the sandbox is not up (neither running nor paused).
    pub fn add_exec_input(
        &self,
        pid: u32,
        tag: Option<&str>,
        sink: InputSink,
    ) -> Option<ExecTicket> {
        self.core.registry.add_input(&self.id, pid, tag, sink)
    }

    /// The input sink of the exec `which` names among those [`Sandbox::add_exec_input`]
    /// keeps.
    pub fn exec_input(&self, which: ExecRef<'_>) -> Option<InputSink> {
        self.core.registry.input(&self.id, which)
    }

    /// Removes what `ticket` registered (a later registration of the same pid or tag
    /// stays).
    pub fn remove_exec_input(&self, ticket: &ExecTicket) {
        self.core.registry.remove_input(&self.id, ticket)
    }

    /// Takes a snapshot of its filesystem (running or paused; see [`crate::persist`]);
    /// with `stop`, destroys it afterwards ("pause to disk"). The snapshot is the caller's
    /// tenant's.
    pub async fn snapshot(
        &self,
        req: rampart_types::CreateSnapshot,
    ) -> Result<rampart_types::SnapshotInfo, CoreError> {
        self.scoped(async {
            let mut req = req;
            // A tenant's snapshot is named `<tenant>:<name>`; its default name (the sandbox
            // id and a random suffix) is given here so that it is too.
            let plain = match req.name.take() {
                Some(n) => {
                    crate::persist::check_plain_name("name", &n)?;
                    n
                }
                None => format!("{}-{}", self.id, rampart_store::keys::random_hex(4)),
            };
            req.name = Some(principal::qualify(&plain));
            self.core.admit_tenant_disk(self.who.tenant.as_deref(), 0)?;
            let info = self.core.snapshot(&self.id, req).await?;
            Ok(crate::own_snapshot(self.who.tenant.as_deref(), info))
        })
        .await
    }

    /// Makes `count` sandboxes from one consistent point of it (running or paused).
    pub async fn fork(
        &self,
        req: rampart_types::ForkSandbox,
    ) -> Result<rampart_types::ForkResult, CoreError> {
        let made = self
            .scoped(
                self.core
                    .fork(&self.id, req, CreateOptions::default(), true),
            )
            .await?;
        Ok(rampart_types::ForkResult {
            sandboxes: made
                .into_iter()
                .filter_map(Result::ok)
                .map(|c| c.info)
                .collect(),
        })
    }

    /// Like [`Sandbox::fork`], each fork made with `opts` (the E2B API asks for E2B facts:
    /// the source's template name and options; each fork gets an envd token of its own),
    /// and each succeeding or failing on its own: one result per fork, in order (E2B's
    /// fork). A failure before any fork is made (the source, its consistent point) is the
    /// call's.
    pub async fn fork_each(
        &self,
        req: rampart_types::ForkSandbox,
        opts: CreateOptions,
    ) -> Result<Vec<Result<CreatedSandbox, CoreError>>, CoreError> {
        self.scoped(self.core.fork(&self.id, req, opts, false))
            .await
    }

    /// A descriptor of the root of its writable disk (running or paused; see
    /// [`crate::Disks::upper_root`]). The tier's work runs on a blocking thread.
    pub async fn upper_root(&self) -> Result<OwnedFd, CoreError> {
        self.core.upper_root(&self.id).await
    }
}
