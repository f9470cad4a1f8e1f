//! Create (admission, insert, launch, record), destroy, pause, resume and the deadline of
//! a sandbox; each step is recorded in the store before it is true in memory.

use super::plan::{CreateOptions, Plan};
use super::*;
use crate::events::Kind;
use rampart_types::audit::{Pause, Resume};
use serde_json::{json, Value};

impl Sandboxes {
    /// Disk admission (see `capacity`): whether `asked` more bytes of quota fit beside what
    /// live sandboxes, snapshots and volumes were promised. The guard keeps other admissions
    /// out until the caller has recorded what it admitted.
    pub(crate) async fn admit_disk(
        &self,
        what: &str,
        asked: u64,
    ) -> Result<tokio::sync::MutexGuard<'_, ()>, CoreError> {
        let guard = self.disk_admission.lock().await;
        let sandboxes = self.store.alive_disk_bytes()?;
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
        .map_err(CoreError::task("disk admission"))?
        .map_err(CoreError::io("disk admission"))?;
        crate::capacity::check(what, asked, committed, &budget)?;
        Ok(guard)
    }

    /// What the host's disk has left beside what live sandboxes, snapshots and volumes
    /// were promised (see `capacity`), bytes: the most an upload may take.
    pub(crate) async fn disk_room(&self) -> Result<u64, CoreError> {
        let sandboxes = self.store.alive_disk_bytes()?;
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
        .map_err(CoreError::task("disk admission"))?
        .map_err(CoreError::io("disk admission"))?;
        Ok(budget.holdable.saturating_sub(committed))
    }

    /// Whether the daemon is stopping.
    pub(crate) fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    pub(crate) async fn create(
        self: &Arc<Self>,
        req: CreateSandbox,
        opts: CreateOptions,
    ) -> Result<CreatedSandbox, CoreError> {
        let t0 = Instant::now();
        let cfg = &self.cfg;
        let approvals = req.approvals.clone();
        let secrets = Audit::secret_values(&req);
        if let Err(e) = self.network.check_proxy(req.network.as_ref()).await {
            self.metrics.creates.with_label_values(&["rejected"]).inc();
            return Err(e);
        }
        let Plan { new, staged } = match self.plan(req, opts) {
            Ok(p) => p,
            Err(e) => {
                self.metrics.creates.with_label_values(&["rejected"]).inc();
                return Err(e);
            }
        };
        // A warm sandbox serves it when one can: a claim, not a launch.
        match self
            .claim(&new, staged.is_plain(), &approvals, &secrets)
            .await
        {
            Ok(Some(info)) => return Ok(self.created(info, new, t0, "from a warm pool")),
            Ok(None) => {}
            Err(e) => {
                self.metrics.creates.with_label_values(&["rejected"]).inc();
                return Err(e);
            }
        }
        let step = |name: &str, since: Instant| {
            self.metrics
                .create_step_seconds
                .with_label_values(&[name])
                .observe(since.elapsed().as_secs_f64());
        };
        step("plan", t0);
        let id = new.id.clone();
        let t = Instant::now();
        let admitted = match self.admit_disk("a sandbox", new.limits.disk_bytes).await {
            Ok(g) => g,
            Err(e) => {
                self.metrics.creates.with_label_values(&["rejected"]).inc();
                return Err(e);
            }
        };
        step("admit", t);
        let _busy = self.persist.stage(&id, staged);
        let op = self.op_lock(&id);
        let _guard = op.lock().await;
        let t = Instant::now();
        let mut inserted = self
            .store
            .insert_creating(&new, cfg.max_sandboxes, cfg.uid_slots);
        if matches!(
            inserted,
            Err(StoreError::Full { .. } | StoreError::NoFreeSlot { .. })
        ) && self.evict_pooled().await
        {
            // A warm sandbox gave its place to a create it could not serve.
            inserted = self
                .store
                .insert_creating(&new, cfg.max_sandboxes, cfg.uid_slots);
        }
        drop(admitted);
        step("insert", t);
        let slot = match inserted {
            Ok(s) => s,
            Err(e @ (StoreError::Full { .. } | StoreError::NoFreeSlot { .. })) => {
                self.metrics.creates.with_label_values(&["rejected"]).inc();
                self.registry.forget_lock(&id);
                return Err(CoreError::Capacity(e.to_string()));
            }
            Err(e) => {
                self.metrics.creates.with_label_values(&["error"]).inc();
                self.registry.forget_lock(&id);
                return Err(CoreError::from(e));
            }
        };
        let net = new.network.as_ref();
        // Its approval policy, kept now: the launch reads its hosts, its first exec reads
        // nothing from the store.
        self.approvals.keep(&id, approvals);
        self.audit.set_secrets(&id, secrets);
        let res = self.launch(&new, slot, new.on_timeout, net).await;
        self.registry.forget_lock(&id);
        self.persist.unstage(&id);
        match res {
            Ok(info) => Ok(self.created(info, new, t0, "launched")),
            Err(e) => {
                self.metrics.creates.with_label_values(&["error"]).inc();
                warn!(id = %id, "sandbox create failed: {e}");
                self.approvals.forget(&id);
                self.audit.set_secrets(&id, Vec::new());
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

    /// A create that succeeded (`how`: launched, or from a warm pool): its metrics, log line
    /// and lifecycle event, and its answer.
    fn created(
        &self,
        info: SandboxInfo,
        new: NewSandbox,
        t0: Instant,
        how: &'static str,
    ) -> CreatedSandbox {
        self.metrics.creates.with_label_values(&["ok"]).inc();
        self.metrics
            .create_seconds
            .observe(t0.elapsed().as_secs_f64());
        info!(id = %info.id, us = t0.elapsed().as_micros() as u64, how, "sandbox created");
        let e2b = new.access.and_then(|a| a.e2b);
        // Known here: no read of the access store on the create path.
        let template = e2b.as_ref().map_or(&info.template, |e| &e.template).clone();
        self.lifecycle(Kind::Created, &info, Some(template), Value::Null);
        CreatedSandbox { info, e2b }
    }

    pub(super) async fn launch(
        self: &Arc<Self>,
        new: &NewSandbox,
        slot: u32,
        on_timeout: OnTimeout,
        net: Option<&rampart_store::StoredNetwork>,
    ) -> Result<SandboxInfo, CoreError> {
        let extras = self.persist.take_staged(&new.id);
        // Made from a snapshot or a fork's point: its record begins where its parent's
        // was (the parent, its chain head then, the digest of the saved processes).
        let parent = extras
            .disk
            .as_ref()
            .and_then(|d| std::fs::read(d.image.with_file_name(crate::persist::LINEAGE)).ok())
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok());
        let booted = self.boot(new, slot, net, extras, false).await?;
        let mut created = self.created_body(new);
        if let (EventBody::Created(c), Some(p)) = (&mut created, parent) {
            c.spec["parent"] = p;
        }
        if let (EventBody::Created(c), Some(n)) = (&mut created, net) {
            // The policy it starts with (its secrets are named in no record).
            c.policy = serde_json::to_value(n.policy.public()).unwrap_or_default();
        }
        if let EventBody::Created(c) = &mut created {
            // Its approval policy (kept at create): what holds its commands and hosts.
            if let Ok(Some(p)) = self
                .approvals
                .policy(&new.id, || self.persist.approval_policy(&new.id))
            {
                c.spec["approvals"] = serde_json::to_value(&p.source).unwrap_or_default();
            }
        }
        let t = Instant::now();
        let store = &self.store;
        self.audit.record(
            &new.id,
            false,
            |_| created,
            Vec::new(),
            |e| store.set_running_audited(&new.id, booted.pid, booted.start, &booted.sock, e),
        )?;
        let terms = self.terms(
            &new.id,
            new.expires_at_ms,
            false,
            on_timeout,
            new.tenant.clone(),
            new.idle_pause_secs,
        );
        self.register(&new.id, booted.client, booted.pid, booted.pidfd, terms);
        self.metrics
            .create_step_seconds
            .with_label_values(&["record"])
            .observe(t.elapsed().as_secs_f64());
        Ok(super::pool::running_info(new))
    }

    /// Builds and starts the sandbox `new` on the tier (`again`: boots a sandbox paused to
    /// its filesystem on its own disk, [`crate::ColdStop::relaunch`]), wires its network, waits for
    /// its agent and starts its template's servers. Records nothing: the caller does.
    pub(super) async fn boot(
        self: &Arc<Self>,
        new: &NewSandbox,
        slot: u32,
        net: Option<&rampart_store::StoredNetwork>,
        extras: crate::isolation::LaunchExtras,
        again: bool,
    ) -> Result<Booted, CoreError> {
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
        let mut image = if builtin {
            None
        } else {
            crate::templates::resolve(&self.cfg.data_dir, &new.template)?
        };
        if let Some(i) = &mut image {
            if again {
                // Its disk's writable layer sits on the layers it was made with, even if
                // the template's name was built again since.
                if let Some(l) = rampart_image::Store::open_existing(&self.cfg.data_dir)
                    .and_then(|s| s.pinned_layers(new.id.as_str()))
                {
                    i.layers = l;
                }
            } else {
                let dir = self.state_dir.join(new.id.as_str());
                crate::templates::pin(&self.cfg.data_dir, new.id.as_str(), &dir, i)?;
            }
        }
        let mut prepared = None;
        let mut attaching = None;
        if let Some(n) = net {
            let ask = self.ask_hosts(&new.id);
            if n.secrets.is_empty() && !rampart_egress::policy_needs_ca(&n.policy) {
                // Nothing of the attachment goes into the environment or the trust store
                // (no secrets, no registry to intercept): attach while launching.
                let (me, id, n) = (self.clone(), new.id.clone(), n.clone());
                attaching = Some(tokio::task::spawn_blocking(move || {
                    me.network.prepare(&id, slot, &n, &ask)
                }));
            } else {
                prepared = Some(self.network.prepare(&new.id, slot, n, &ask)?);
            }
        }
        let mut env = launch_env(&crate::templates::merged_env(image.as_ref(), &new.env));
        if let Some(p) = &prepared {
            env.extend(p.env());
        }
        // A template built on `base` stacks its layers on base's root.
        let on_base = image.as_ref().and_then(|i| i.on_base.clone());
        let template_dir = self
            .templates_dir
            .join(on_base.as_deref().unwrap_or(&new.template));
        // Written by the tier before the agent starts: no round trip after health.
        let files = match net {
            Some(_) => {
                let ca = prepared.as_ref().and_then(|p| p.ca_pem());
                self.network.init_files(slot, ca, &template_dir)?
            }
            None => Vec::new(),
        };
        let spec = LaunchSpec {
            id: new.id.clone(),
            tier: new.isolation,
            template_dir,
            uid_base,
            limits: new.limits.clone(),
            hostname: new.id.to_string(),
            env,
            layers: image.as_ref().map(|i| i.layers.clone()).unwrap_or_default(),
            layers_on_base: on_base.is_some(),
            // Core's sandboxes are never build sandboxes (template builds drive the jail).
            build: None,
            agent_args: crate::templates::agent_args(image.as_ref()),
            files,
        };
        let t0 = Instant::now();
        let iso = self.iso.clone();
        let launched = tokio::task::spawn_blocking(move || {
            if again {
                iso.cold()?.relaunch(&spec, &extras)
            } else {
                iso.launch_with(&spec, &extras)
            }
        })
        .await
        .map_err(CoreError::task("launch"))
        .and_then(|r| r.map_err(|e| CoreError::isolation("launch", e)));
        drop(pin_guard);
        if let Some(t) = attaching {
            // Awaited even when the launch failed, so that the teardown finds it attached.
            prepared = Some(t.await.map_err(CoreError::task("egress attach"))??);
        }
        let launched = launched?;
        let pid = launched.pid;
        let restored = launched.restored;
        let pidfd = proc::pidfd_open(pid).map_err(CoreError::io(format!(
            "the sandbox's init (pid {pid}) is gone"
        )))?;
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
        let (wired, healthy) = tokio::join!(
            wiring,
            wait_health(&client, health_deadline(new.isolation, HEALTH_DEADLINE))
        );
        wired?;
        healthy?;
        let healthy_at = Instant::now();
        // The code interpreter's server: `code-interpreter-v1`, or a template built on it
        // (a restored sandbox's runs already, as everything it had started).
        if !restored
            && (new.template == interpreter::TEMPLATE
                || on_base.as_deref() == Some(interpreter::TEMPLATE))
        {
            interpreter::start(&client).await?;
        }
        if let Some(i) = &image {
            if !restored {
                crate::templates::start(&client, i).await?;
            }
            self.audit
                .set_template_digest(&new.template, format!("sha256:{}", i.id));
        }
        if !again && !new.pooled {
            let m = &self.metrics.create_step_seconds;
            let secs = |d: Duration| d.as_secs_f64();
            m.with_label_values(&["launch"])
                .observe(secs(launched_at - t0));
            m.with_label_values(&["health"])
                .observe(secs(healthy_at - launched_at));
            m.with_label_values(&["start"])
                .observe(secs(healthy_at.elapsed()));
        }
        debug!(
            id = %new.id,
            launch_us = (launched_at - t0).as_micros() as u64,
            health_us = launched_at.elapsed().as_micros() as u64,
            again,
            "boot phases"
        );
        Ok(Booted {
            pid,
            pidfd,
            start,
            sock: launched.agent_socket.to_string_lossy().into_owned(),
            client,
            restored,
        })
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
            .map_err(CoreError::from)?
            .ok_or_else(|| CoreError::NotFound(id.to_string()))?;
        if !rec.state.is_alive() {
            return Ok(info_of(&rec));
        }
        let t0 = Instant::now();
        self.registry.begin_stop(id);
        if rec.state != SandboxState::Stopping {
            self.store
                .set_state(id, SandboxState::Stopping, None, None)
                .map_err(CoreError::from)?;
        }
        self.network
            .teardown_stored(self.store.as_ref(), id, rec.uid_slot)
            .await;
        let unwired_at = Instant::now();
        // The writable layer, pinned before its processes are killed (fs_diff below).
        let upper = self.manifests().pin_upper(id, &rec.template).await;
        // Its disk for the artifacts, pinned too (mounted read-only when its init is gone).
        let artifacts = self.pin_artifacts(id).await;
        let pinned_at = Instant::now();
        // Its CPU time and peak memory, read from the tier before its cgroup goes.
        let used = {
            let iso = self.iso.clone();
            let id2 = id.clone();
            tokio::task::spawn_blocking(move || iso.usage(&id2))
                .await
                .ok()
                .and_then(Result::ok)
        };
        if let Err(e) = self.iso_destroy(id).await {
            error!(id = %id, "destroy failed: {e}; will retry");
            self.registry.retry_at(id, Instant::now() + DESTROY_RETRY);
            return Err(e);
        }
        // The init watcher (if it has not fired yet) reaps the dead init and then sees no
        // entry; it is not aborted so that no zombie is left.
        self.registry.remove(id);
        self.approvals.forget(id);
        let removed_at = Instant::now();
        if let Some(pinned) = upper {
            self.manifests().record_fs_diff(id, pinned, "destroy").await;
        }
        let artifacts = self.keep_artifacts(id, artifacts).await;
        let diffed_at = Instant::now();
        // What the network events budget left out (its processes are dead: no more entries).
        self.netaudit.record_suppressed(id);
        // Its usage, final, written with its end.
        let finals = rampart_store::tenants::FinalUsage {
            cpu_usec: used.as_ref().map_or(0, |u| u.cpu_usec),
            memory_peak_bytes: used.as_ref().map_or(0, |u| u.memory_peak_bytes),
            egress_bytes: self.netaudit.take_egress_bytes(id),
        };
        // The template its creator named (E2B's facts are forgotten with its end).
        let e2b_template = self
            .access
            .e2b(id.as_str())
            .ok()
            .flatten()
            .map(|e| e.template);
        let reason = why.message();
        let label = match &why {
            EndReason::Request => "api",
            EndReason::Expired => "timeout",
            EndReason::Died(_) => "died",
        };
        self.record_end(
            id,
            SandboxState::Destroyed,
            &reason,
            label,
            &finals,
            artifacts,
        )?;
        self.metrics
            .destroyed
            .with_label_values(&[why.label()])
            .inc();
        self.registry.forget_lock(id);
        debug!(
            id = %id,
            unwire_us = (unwired_at - t0).as_micros() as u64,
            pin_us = (pinned_at - unwired_at).as_micros() as u64,
            tier_us = (removed_at - pinned_at).as_micros() as u64,
            fs_diff_us = (diffed_at - removed_at).as_micros() as u64,
            record_us = diffed_at.elapsed().as_micros() as u64,
            "destroy phases"
        );
        info!(id = %id, reason, "sandbox destroyed");
        let info = self.get(id)?;
        let data = json!({"execution": execution(&info), "reason": label});
        self.lifecycle(Kind::Killed, &info, e2b_template, data);
        Ok(info)
    }

    pub(crate) fn set_timeout(&self, id: &SandboxId, secs: u64) -> Result<SandboxInfo, CoreError> {
        check_timeout("timeout_secs", secs, self.cfg.max_timeout_secs)?;
        {
            if !self
                .registry
                .set_deadline(id, Instant::now() + Duration::from_secs(secs))
            {
                return Err(self.not_running(id));
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
        let info = self.get(id)?;
        let data = json!({"set_timeout": info.expires_at});
        self.lifecycle(Kind::Updated, &info, None, data);
        Ok(info)
    }

    /// Pauses a running sandbox: freezes its processes, then records `paused` (state and
    /// audit event in one transaction). Nothing talks to its agent until it is resumed.
    /// Pausing a paused sandbox changes nothing.
    pub(crate) async fn pause(&self, id: &SandboxId) -> Result<SandboxInfo, CoreError> {
        self.pause_for(id, false).await
    }

    /// [`Sandboxes::pause`]; `idle`: it is put to sleep for its idleness (refused with
    /// `Conflict` when a request came in since it was found idle).
    pub(super) async fn pause_for(
        &self,
        id: &SandboxId,
        idle: bool,
    ) -> Result<SandboxInfo, CoreError> {
        let op = self.op_lock(id);
        let _guard = op.lock().await;
        if matches!(self.registry.standing(id), Standing::Running(_)) {
            // Its tenant's `max_paused` (the reaper destroys what it may not pause).
            self.store
                .admit_transition(id, SandboxState::Paused)
                .map_err(CoreError::from)?;
        }
        // From now on new requests get 409 (a frozen agent would not answer them).
        let start = match idle {
            true => self.registry.begin_sleep(id),
            false => self.registry.begin_pause(id),
        };
        match start {
            PauseStart::Busy => return Err(CoreError::Conflict(format!("sandbox {id} is busy"))),
            PauseStart::AlreadyPaused => return self.get(id),
            // Paused to its filesystem: paused already.
            PauseStart::NotRunning if self.is_cold(id).await? => return self.get(id),
            PauseStart::NotRunning => return Err(self.not_running(id)),
            PauseStart::Started => {}
        }
        let unpause = || {
            self.registry.unpause(id);
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
            |_| {
                EventBody::Paused(Pause {
                    memory: None,
                    idle: idle.then_some(true),
                })
            },
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
        let info = self.get(id)?;
        let data = json!({"execution": execution(&info)});
        self.lifecycle(Kind::Paused, &info, None, data);
        Ok(info)
    }

    /// Resumes a paused sandbox: thaws its processes (they continue where they were), then
    /// records `running` (and `resumed`). A deadline that passed while it was paused (it was
    /// paused by its expiry) is moved to now + the default timeout. Resuming a running
    /// sandbox changes nothing.
    pub(crate) async fn resume(&self, id: &SandboxId) -> Result<SandboxInfo, CoreError> {
        self.resume_for(id, false).await
    }

    /// [`Sandboxes::resume`]; `woken`: by a request for it (its record says so).
    pub(super) async fn resume_for(
        &self,
        id: &SandboxId,
        woken: bool,
    ) -> Result<SandboxInfo, CoreError> {
        let op = self.op_lock(id);
        let _guard = op.lock().await;
        match self.registry.standing(id) {
            Standing::Paused => {}
            Standing::Running(_) => return self.get(id),
            Standing::Gone => return Err(self.not_running(id)),
        }
        // Its tenant's `max_sandboxes` and `max_vcpus` count it again once it runs.
        self.store
            .admit_transition(id, SandboxState::Running)
            .map_err(CoreError::from)?;
        let t0 = Instant::now();
        self.iso_freeze(id, false).await?;
        let thawed_at = Instant::now();
        let store = &self.store;
        let recorded = self.audit.record(
            id,
            false,
            |_| {
                EventBody::Resumed(Resume {
                    reboot: None,
                    woken: woken.then_some(true),
                })
            },
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
        let expired = self.registry.unpause(id);
        self.metrics.resumes.inc();
        debug!(
            id = %id,
            thaw_us = (thawed_at - t0).as_micros() as u64,
            record_us = thawed_at.elapsed().as_micros() as u64,
            "sandbox resumed"
        );
        let info = self.get(id)?;
        self.lifecycle(Kind::Resumed, &info, None, Value::Null);
        if expired {
            return self.set_timeout(id, self.cfg.default_timeout_secs);
        }
        Ok(info)
    }

    /// Resumes a paused sandbox: thaws it ([`Sandboxes::resume`]), or boots it from its disk
    /// when it was paused to its filesystem or `reboot` asks for it ([`Sandboxes::reboot`]).
    pub(crate) async fn resume_with(
        self: &Arc<Self>,
        id: &SandboxId,
        reboot: bool,
    ) -> Result<SandboxInfo, CoreError> {
        if reboot && self.is_cold(id).await? {
            // Asked to boot afresh: what it saved of its processes is dropped first.
            let iso = self.iso.clone();
            let id2 = id.clone();
            tokio::task::spawn_blocking(move || iso.cold()?.discard_saved(&id2))
                .await
                .map_err(CoreError::task("discard"))?
                .map_err(|e| CoreError::isolation("reboot", e))?;
        }
        if reboot || self.is_cold(id).await? {
            return self.reboot(id, false).await;
        }
        self.resume(id).await
    }

    /// The error for a sandbox that is not running.
    pub(crate) fn not_running(&self, id: &SandboxId) -> CoreError {
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
            Err(e) => CoreError::from(e),
        }
    }

    /// The `created` body of a sandbox (env names only, never values).
    pub(super) fn created_body(&self, new: &NewSandbox) -> EventBody {
        let mut spec = serde_json::json!({
            "template": new.template,
            "isolation": new.isolation,
            "limits": new.limits,
            "env_names": new.env.keys().collect::<Vec<_>>(),
            "metadata": new.metadata,
            "created_at": rfc3339(new.created_at_ms),
            "expires_at": rfc3339(new.expires_at_ms),
        });
        // The paths it keeps as artifacts, when it asked for some.
        let artifacts = new
            .request
            .as_deref()
            .and_then(|r| serde_json::from_str::<CreateSandbox>(r).ok())
            .map(|r| r.artifacts)
            .unwrap_or_default();
        if !artifacts.is_empty() {
            spec["artifacts"] = serde_json::json!(artifacts);
        }
        if let Some(node) = &self.cfg.node_name {
            spec["node"] = serde_json::json!(node);
        }
        EventBody::Created(Created {
            spec,
            template: new.template.clone(),
            template_digest: self.audit.template_digest(&new.template),
            policy: serde_json::Value::Null,
            caller: crate::principal::current_caller(),
        })
    }

    /// The disk of sandbox `id` held for its artifacts, if it asked for any: its paths and
    /// the disk's root (None when the tier gives no access; then nothing can be kept).
    /// Called before its processes are killed, or once they are gone (the disk stays until
    /// the tier's destroy).
    pub(super) async fn pin_artifacts(
        &self,
        id: &SandboxId,
    ) -> Option<(Vec<String>, Option<OwnedFd>)> {
        let paths = match self.persist.artifact_paths(id) {
            Ok(p) if p.is_empty() => return None,
            Ok(p) => p,
            Err(e) => {
                error!(id = %id, "artifacts: {e}");
                return Some((Vec::new(), None));
            }
        };
        let iso = self.iso.clone();
        let id2 = id.clone();
        let root = match tokio::task::spawn_blocking(move || iso.disks()?.disk_root(&id2)).await {
            Ok(Ok(fd)) => Some(fd),
            Ok(Err(e)) => {
                warn!(id = %id, "artifacts: no access to the sandbox's disk: {e}");
                None
            }
            Err(e) => {
                warn!(id = %id, "artifacts: {e}");
                None
            }
        };
        Some((paths, root))
    }

    /// Captures and keeps what [`Sandboxes::pin_artifacts`] held (call it once nothing of
    /// the sandbox runs): what `destroyed.artifacts` lists. A disk that could not be read
    /// gives an empty, `truncated` list.
    pub(super) async fn keep_artifacts(
        &self,
        id: &SandboxId,
        pinned: Option<(Vec<String>, Option<OwnedFd>)>,
    ) -> Option<rampart_types::audit::Artifacts> {
        let (paths, root) = pinned?;
        let failed = |paths: Vec<String>| rampart_types::audit::Artifacts {
            paths,
            files: Vec::new(),
            skipped: 0,
            truncated: true,
        };
        let Some(root) = root else {
            // A capture that finished before the daemon was killed (its disk went since).
            if let Ok(Some(i)) = self.artifacts.index(id) {
                return Some(i.artifacts);
            }
            return Some(failed(paths));
        };
        let store = self.artifacts.clone();
        let (id2, paths2) = (id.clone(), paths.clone());
        let tenant = self.store.get(id).ok().flatten().and_then(|r| r.tenant);
        let db = self.store.clone();
        let kept = tokio::task::spawn_blocking(move || {
            use std::os::fd::AsFd;
            let a = store.keep(&id2, root.as_fd(), &paths2, now_ms())?;
            // What the tenant makes the host keep (`crate::stored`).
            if let Some(t) = tenant.as_deref() {
                crate::stored::add_artifacts(&*db, t, &store.dir_of(&id2));
            }
            Ok::<_, CoreError>(a)
        })
        .await;
        match kept {
            Ok(Ok(a)) => {
                info!(
                    id = %id,
                    files = a.files.len(),
                    skipped = a.skipped,
                    truncated = a.truncated,
                    "artifacts kept"
                );
                Some(a)
            }
            Ok(Err(e)) => {
                error!(id = %id, "keeping artifacts: {e}");
                Some(failed(paths))
            }
            Err(e) => {
                error!(id = %id, "keeping artifacts: {e}");
                Some(failed(paths))
            }
        }
    }

    /// Records a sandbox's end (`destroyed`, in the transaction of its final state, with
    /// the artifacts kept), then publishes its chain head to the node log and forgets its
    /// chain.
    pub(super) fn record_end(
        &self,
        id: &SandboxId,
        state: SandboxState,
        reason: &str,
        label: &str,
        usage: &rampart_store::tenants::FinalUsage,
        artifacts: Option<rampart_types::audit::Artifacts>,
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
                    artifacts,
                })
            },
            Vec::new(),
            |e| store.set_ended_audited(id, state, now_ms(), Some(reason), usage, e),
        )?;
        if let Err(e) = self.audit.publish(std::slice::from_ref(id)) {
            error!(id = %id, "publishing the audit chain head: {e}");
        }
        self.audit.forget(id);
        Ok(())
    }
}

impl Sandboxes {
    /// Records lifecycle event `kind` of the sandbox `info` describes; `template` is the
    /// template its creator named when it is no longer in the access store.
    pub(crate) fn lifecycle(
        &self,
        kind: Kind,
        info: &SandboxInfo,
        template: Option<String>,
        data: Value,
    ) {
        let template = template
            .or_else(|| {
                self.access
                    .e2b(info.id.as_str())
                    .ok()
                    .flatten()
                    .map(|e| e.template)
            })
            .unwrap_or_else(|| info.template.clone());
        let subject = crate::events::Subject {
            id: info.id.as_str(),
            tenant: info.tenant.as_deref(),
            template: &template,
            metadata: &info.metadata,
        };
        self.events.emit(kind, &subject, data);
    }
}

/// What a `killed` or `paused` event says of the run: when it started, its size, how long
/// it has run (ms).
pub(super) fn execution(info: &SandboxInfo) -> Value {
    let started = time::OffsetDateTime::parse(
        &info.created_at,
        &time::format_description::well_known::Rfc3339,
    )
    .ok();
    let ran_ms = started
        .map(|t| {
            (time::OffsetDateTime::now_utc() - t)
                .whole_milliseconds()
                .max(0) as u64
        })
        .unwrap_or(0);
    json!({
        "started_at": info.created_at,
        "vcpu_count": info.limits.cpus.ceil() as u64,
        "memory_mb": info.limits.memory_bytes >> 20,
        "execution_time": ran_ms,
    })
}
