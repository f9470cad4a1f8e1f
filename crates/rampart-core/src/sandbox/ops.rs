//! What callers do with a live sandbox: exec, files, network policy and log, usage, the
//! root of its writable disk.

use super::*;
use rampart_types::SecretSpec;

impl Sandboxes {
    /// Records a file operation made through the API.
    pub(crate) fn record_file(&self, id: &SandboxId, change: FileChange) -> Result<(), CoreError> {
        let change = FileChange {
            caller: Some(crate::principal::current_caller()),
            ..change
        };
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
                caller: None,
            },
        )?;
        Ok(written)
    }

    pub(crate) async fn usage(&self, id: &SandboxId) -> Result<Usage, CoreError> {
        if !self.registry.is_up(id) {
            return Err(self.not_running(id));
        }
        let iso = self.iso.clone();
        let id2 = id.clone();
        tokio::task::spawn_blocking(move || iso.usage(&id2))
            .await
            .map_err(CoreError::task("usage"))?
            .map_err(|e| CoreError::isolation("usage", e))
    }

    /// A descriptor of the root of a running or paused sandbox's writable disk (see
    /// [`crate::Disks::upper_root`]); the tier's work runs on a blocking thread.
    pub(crate) async fn upper_root(&self, id: &SandboxId) -> Result<OwnedFd, CoreError> {
        let iso = self.iso.clone();
        let id2 = id.clone();
        tokio::task::spawn_blocking(move || iso.disks()?.upper_root(&id2))
            .await
            .map_err(CoreError::task("upper root"))?
            .map_err(|e| CoreError::isolation("the sandbox's disk", e))
    }

    /// `PUT /v1/sandboxes/{id}/network`: replaces the policy of a running sandbox. Between
    /// two modes with a network the egress proxy applies it at once (live connections it now
    /// denies are cut); from `none` the sandbox is wired now, and to `none` unwired.
    pub(crate) async fn set_network(
        self: &Arc<Self>,
        id: &SandboxId,
        policy: NetworkPolicy,
        new_secrets: Option<Vec<SecretSpec>>,
    ) -> Result<NetworkInfo, CoreError> {
        let op = self.op_lock(id);
        let _guard = op.lock().await;
        let client = self.agent(id)?;
        let rec = self
            .store()
            .get(id)
            .map_err(CoreError::from)?
            .ok_or_else(|| CoreError::NotFound(id.to_string()))?;
        if rec.state != SandboxState::Running {
            return Err(CoreError::WrongState {
                id: id.to_string(),
                state: rec.state.as_str().into(),
            });
        }
        let old = self.store.network(id).map_err(CoreError::from)?;
        let changes_secrets = new_secrets.is_some();
        let secrets = match new_secrets {
            Some(s) => s,
            None => old.as_ref().map(|n| n.secrets.clone()).unwrap_or_default(),
        };
        let was = networked(&old);
        // Secrets are checked against the new policy only when they change (the kept ones
        // were checked when given).
        let checked: &[SecretSpec] = if changes_secrets { &secrets } else { &[] };
        let new = self.network.check(Some(&policy), checked)?;
        self.network.check_proxy(Some(&policy)).await?;
        match (was, new.is_some()) {
            (true, true) => {
                // Both checked above, so neither fails on its input.
                self.network.set_policy(id, policy.clone())?;
                if changes_secrets {
                    if let Some(ca) = self.network.set_secrets(id, secrets.clone())? {
                        // The sandbox had no CA: its trust store gets the one just made,
                        // else HTTPS to the bound hosts fails its certificate check.
                        let files = self
                            .network
                            .ca_files(&ca, &self.templates_dir().join(&rec.template));
                        crate::network::Network::write_inside(&client, files).await?;
                    }
                }
            }
            (false, true) => {
                let stored = StoredNetwork {
                    policy: policy.clone(),
                    secrets: secrets.clone(),
                };
                let p = self
                    .network
                    .prepare(id, rec.uid_slot, &stored, &self.ask_hosts(id))?;
                let pid = rec
                    .pid
                    .ok_or_else(|| CoreError::Internal("running sandbox without a pid".into()))?;
                let wired = match self.network.wire(rec.uid_slot, pid).await {
                    Ok(_) => match self.network.init_files(
                        rec.uid_slot,
                        p.ca_pem(),
                        &self.templates_dir().join(&rec.template),
                    ) {
                        Ok(files) => crate::network::Network::write_inside(&client, files).await,
                        Err(e) => Err(e),
                    },
                    Err(e) => Err(e),
                };
                if let Err(e) = wired {
                    self.network.teardown(id, rec.uid_slot).await;
                    return Err(e);
                }
            }
            (true, false) => self.network.teardown(id, rec.uid_slot).await,
            (false, false) => {}
        }
        // The proxy's password is in no record.
        let recorded = serde_json::to_value(policy.public()).unwrap_or_default();
        let data = serde_json::json!({"network": recorded.clone()});
        self.store
            .set_network(id, &StoredNetwork { policy, secrets })
            .map_err(CoreError::from)?;
        self.audit.append(
            id,
            |_| {
                rampart_audit::EventBody::PolicyChanged(rampart_types::audit::PolicyChanged {
                    policy: recorded,
                })
            },
            Vec::new(),
        )?;
        let info = info_of(&rec);
        self.lifecycle(crate::events::Kind::Updated, &info, None, data);
        self.network.info(self.store.as_ref(), id)
    }

    /// `GET /v1/sandboxes/{id}/network/log`: entries with `seq > after`, at most `limit`.
    /// Empty for a sandbox without network, or once it has ended.
    pub(crate) fn network_log(
        &self,
        id: &SandboxId,
        after: u64,
        limit: usize,
    ) -> Result<Vec<NetLogEntry>, CoreError> {
        self.get(id)?;
        Ok(self
            .network
            .egress()
            .and_then(|e| e.log(id.as_str(), after, limit))
            .unwrap_or_default())
    }

    /// New network log entries of a sandbox as they happen (None: no network log).
    pub(crate) fn network_subscribe(
        &self,
        id: &SandboxId,
    ) -> Result<Option<tokio::sync::broadcast::Receiver<NetLogEntry>>, CoreError> {
        self.get(id)?;
        Ok(self.network.egress().and_then(|e| e.subscribe(id.as_str())))
    }

    pub(crate) fn manifests(&self) -> Manifests<'_> {
        Manifests {
            audit: &self.audit,
            iso: &self.iso,
            store: &self.store,
            data_dir: &self.cfg.data_dir,
        }
    }

    pub(super) fn exec_context(&self) -> ExecContext<'_> {
        ExecContext {
            audit: &self.audit,
            iso: &self.iso,
            hist: &self.metrics.exec_seconds,
        }
    }

    /// Starts `req` (`v`: its validation) in `id`, which its caller found running (and woke,
    /// `Sandboxes::awake`): held first if its approval policy says so.
    pub(crate) async fn exec(
        &self,
        id: &SandboxId,
        req: ExecRequest,
        v: crate::validate::ValidExec,
        keep_stdin_open: bool,
    ) -> Result<Exec, CoreError> {
        let approval = self.gate(id, &req).await?;
        // Looked up again: the sandbox may have been paused or ended while it was held.
        let client = self.agent(id)?;
        self.metrics.execs.inc();
        exec::start(
            &self.exec_context(),
            client,
            id,
            &req,
            v,
            keep_stdin_open,
            approval,
        )
        .await
    }

    /// Holds `req` if the sandbox's approval policy says so: the approval it may run under
    /// (None: not held), or `Denied`.
    pub(crate) async fn gate(
        &self,
        id: &SandboxId,
        req: &ExecRequest,
    ) -> Result<Option<String>, CoreError> {
        let Some(policy) = self
            .approvals
            .policy(id, || self.persist.approval_policy(id))?
        else {
            return Ok(None);
        };
        let tenant = self.registry.tenant(id).flatten();
        let record =
            |body: rampart_audit::EventBody| self.audit.append(id, move |_| body, Vec::new());
        match self
            .approvals
            .hold(id, tenant, &policy, req, record)
            .await?
        {
            None => Ok(None),
            Some(crate::approvals::Outcome::Approved(a)) => Ok(Some(a)),
            Some(crate::approvals::Outcome::Refused(d)) => Err(CoreError::Denied {
                approval: d.id,
                reason: match d.reason {
                    Some(r) => format!("{} by {}: {r}", d.decision, d.by),
                    None => format!("{} by {}", d.decision, d.by),
                },
            }),
        }
    }

    /// The hosts the approval policy of `id` asks about (none when it has no policy, or
    /// the policy cannot be read: such connections are then refused, never let through).
    pub(crate) fn ask_hosts(&self, id: &SandboxId) -> Vec<String> {
        match self
            .approvals
            .policy(id, || self.persist.approval_policy(id))
        {
            Ok(p) => p.map(|p| p.hosts.clone()).unwrap_or_default(),
            Err(e) => {
                warn!(id = %id, "reading the approval policy: {e}; its hosts are refused, not asked about");
                Vec::new()
            }
        }
    }

    /// Decides a connection the egress proxy holds (see [`HostApprovals`]).
    async fn ask_host(&self, ask: rampart_egress::ask::Ask) -> rampart_egress::ask::Answer {
        use rampart_egress::ask::Answer;
        let refused = |approval: String| Answer {
            approved: false,
            approval,
            lasting: false,
        };
        let Ok(id) = SandboxId::parse(&ask.sandbox) else {
            return refused("none".into());
        };
        let policy = match self
            .approvals
            .policy(&id, || self.persist.approval_policy(&id))
        {
            Ok(Some(p)) => p,
            Ok(None) | Err(_) => return refused("none".into()),
        };
        let tenant = self.registry.tenant(&id).flatten();
        let record =
            |body: rampart_audit::EventBody| self.audit.append(&id, move |_| body, Vec::new());
        match self
            .approvals
            .hold_host(&id, tenant, &policy, &ask, record)
            .await
        {
            Ok(crate::approvals::Outcome::Approved(a)) => Answer {
                approved: true,
                approval: a,
                lasting: true,
            },
            Ok(crate::approvals::Outcome::Refused(d)) => Answer {
                approved: false,
                lasting: d.decision == "denied",
                approval: d.id,
            },
            // Too many waiting: the sandbox's doing, refused quietly (it could fill the log).
            Err(CoreError::Conflict(_)) => refused("too-many-waiting".into()),
            Err(e) => {
                warn!(id = %id, host = %ask.host, "holding a connection for approval: {e}; refused");
                refused("none".into())
            }
        }
    }

    pub(crate) fn record_exec_start(
        &self,
        id: &SandboxId,
        start: ExecStart,
    ) -> Result<ExecRecorder, CoreError> {
        ExecRecorder::start(&self.exec_context(), id, start)
    }
}

/// The daemon's approvals as the egress proxy's [`rampart_egress::ask::HostAsker`].
pub(crate) struct HostApprovals(pub std::sync::Weak<Sandboxes>);

impl rampart_egress::ask::HostAsker for HostApprovals {
    fn ask(
        &self,
        ask: rampart_egress::ask::Ask,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = rampart_egress::ask::Answer> + Send + 'static>,
    > {
        let me = self.0.clone();
        Box::pin(async move {
            match me.upgrade() {
                Some(s) => s.ask_host(ask).await,
                None => rampart_egress::ask::Answer {
                    approved: false,
                    approval: "none".into(),
                    lasting: false,
                },
            }
        })
    }
}
