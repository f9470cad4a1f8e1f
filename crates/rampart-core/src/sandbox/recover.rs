//! Recovery at start: sandboxes a previous run left are re-attached when their init is the
//! same live process and their agent answers (paused ones when their cgroup is frozen);
//! every other trace is removed and recorded as ended.

use super::*;

impl Sandboxes {
    /// Re-attaches to the sandboxes that still run; cleans up the rest and any leftover.
    pub(super) async fn recover(self: &Arc<Self>) -> Result<(), CoreError> {
        let alive = self.store.alive().map_err(CoreError::from)?;
        // Sandboxes paused to their filesystem: nothing of them runs, their disks wait.
        let mut cold = std::collections::HashSet::new();
        for rec in alive {
            if matches!(rec.state, SandboxState::Running | SandboxState::Paused) {
                // Its declared-sensitive values, before anything of it is recorded again.
                let req = self.persist.source_request(&rec);
                self.audit.set_secrets(&rec.id, Audit::secret_values(&req));
            }
            if rec.state == SandboxState::Running && self.try_reattach(&rec).await {
                info!(id = %rec.id, "re-attached to running sandbox");
                self.network
                    .reattach(self.store.as_ref(), &rec, &self.ask_hosts(&rec.id))
                    .await;
                continue;
            }
            if rec.state == SandboxState::Paused
                && rec.pid.is_none()
                && self.is_cold(&rec.id).await?
            {
                info!(id = %rec.id, "kept a sandbox paused to its filesystem");
                cold.insert(rec.id.clone());
                continue;
            }
            if rec.state == SandboxState::Paused && self.try_reattach_paused(&rec).await {
                info!(id = %rec.id, "re-attached to paused sandbox");
                self.network
                    .reattach(self.store.as_ref(), &rec, &self.ask_hosts(&rec.id))
                    .await;
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
            reap_if_dead_child(&rec);
            self.network
                .teardown_stored(self.store.as_ref(), &rec.id, rec.uid_slot)
                .await;
            // What it left as artifacts: its disk is still there until the tier's destroy.
            let artifacts = if rec.state == SandboxState::Creating {
                None
            } else {
                self.pin_artifacts(&rec.id).await
            };
            if let Err(e) = self.iso_destroy(&rec.id).await {
                error!(id = %rec.id, "recovery could not clean up sandbox: {e}");
                continue;
            }
            let artifacts = self.keep_artifacts(&rec.id, artifacts).await;
            self.record_end(
                &rec.id,
                state,
                reason,
                "recovery",
                &rampart_store::tenants::FinalUsage::default(),
                artifacts,
            )?;
            self.metrics
                .destroyed
                .with_label_values(&["recovery"])
                .inc();
            info!(id = %rec.id, reason, "cleaned up sandbox left by a previous run");
        }
        // Warm sandboxes a previous run launched are nobody's: they end, and this run's
        // pools launch their own.
        for rec in self.store.pooled().map_err(CoreError::from)? {
            reap_if_dead_child(&rec);
            self.discard(&rec.id, rec.uid_slot, "the daemon restarted")
                .await;
            info!(id = %rec.id, "removed a warm sandbox left by a previous run");
        }
        self.network.clean_leftovers(self.store.as_ref()).await;
        let iso = self.iso.clone();
        let leftovers = tokio::task::spawn_blocking(move || iso.leftovers())
            .await
            .map_err(CoreError::task("listing leftovers"))?
            .map_err(|e| CoreError::isolation("listing leftovers", e))?;
        for id in leftovers {
            if self.registry.contains(&id) || cold.contains(&id) {
                continue;
            }
            let ours = self.store.get(&id).map_err(CoreError::from)?.is_some()
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
    pub(super) async fn try_reattach(self: &Arc<Self>, rec: &SandboxRecord) -> bool {
        let Some((pid, fd, sock)) = live_init(rec) else {
            return false;
        };
        // A pause or resume interrupted by the daemon's end can leave the cgroup frozen: the
        // store has the last word, and it says running.
        if self.frozen(&rec.id).await == Some(true) {
            if let Err(e) = self.iso_freeze(&rec.id, false).await {
                warn!(id = %rec.id, "cannot thaw a running sandbox's frozen processes: {e}");
                return false;
            }
        }
        let client = AgentClient::new(PathBuf::from(sock));
        let deadline = health_deadline(rec.isolation, REATTACH_HEALTH_DEADLINE);
        if let Err(e) = wait_health(&client, deadline).await {
            warn!(id = %rec.id, "sandbox process lives but its agent does not answer: {e}");
            return false;
        }
        let terms = self.terms(
            &rec.id,
            rec.expires_at_ms,
            false,
            rec.on_timeout,
            rec.tenant.clone(),
            rec.idle_pause_secs,
        );
        self.register(&rec.id, client, pid, fd, terms);
        true
    }

    /// Re-attaches to a sandbox recorded as paused if its init is the same live process and
    /// its cgroup is frozen (a frozen agent cannot answer a health check). A cgroup found
    /// thawed (a resume cut short) is frozen again: the store says paused.
    pub(super) async fn try_reattach_paused(self: &Arc<Self>, rec: &SandboxRecord) -> bool {
        let Some((pid, fd, sock)) = live_init(rec) else {
            return false;
        };
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
        let terms = self.terms(
            &rec.id,
            rec.expires_at_ms,
            true,
            rec.on_timeout,
            rec.tenant.clone(),
            rec.idle_pause_secs,
        );
        self.register(&rec.id, client, pid, fd, terms);
        true
    }

    /// Whether the sandbox's cgroup is frozen (None when the tier cannot tell).
    pub(super) async fn frozen(&self, id: &SandboxId) -> Option<bool> {
        let iso = self.iso.clone();
        let id2 = id.clone();
        tokio::task::spawn_blocking(move || iso.freezer()?.is_frozen(&id2))
            .await
            .ok()?
            .ok()
    }

    /// Freezes (`freeze`) or thaws the sandbox's processes.
    pub(super) async fn iso_freeze(&self, id: &SandboxId, freeze: bool) -> Result<(), CoreError> {
        let iso = self.iso.clone();
        let id2 = id.clone();
        tokio::task::spawn_blocking(move || {
            if freeze {
                iso.freezer()?.freeze(&id2)
            } else {
                iso.freezer()?.thaw(&id2)
            }
        })
        .await
        .map_err(CoreError::task("freeze"))?
        .map_err(|e| match e {
            IsolationError::Unsupported(m) => CoreError::WrongState {
                id: id.to_string(),
                state: format!("running ({m})"),
            },
            e => CoreError::isolation(if freeze { "pause" } else { "resume" }, e),
        })
    }
}

/// The init of a recorded sandbox if it is still the same live process: its pid, a pidfd of
/// it (opened first: the start time matching afterwards proves the fd is that process) and
/// its agent's socket.
fn live_init(rec: &SandboxRecord) -> Option<(i32, OwnedFd, &str)> {
    let (Some(pid), Some(start), Some(sock)) =
        (rec.pid, rec.pid_start_time, rec.agent_socket.as_deref())
    else {
        return None;
    };
    let fd = proc::pidfd_open(pid).ok()?;
    proc::is_same_live_process(pid, start).then_some((pid, fd, sock))
}

/// If the init `rec` names is our (dead) child, still the same process, reaps it so that
/// no zombie stays behind.
fn reap_if_dead_child(rec: &SandboxRecord) {
    if let (Some(pid), Some(start)) = (rec.pid, rec.pid_start_time) {
        if let Ok(fd) = proc::pidfd_open(pid) {
            if proc::proc_stat(pid).is_some_and(|s| s.start_time == start) {
                let _ = proc::try_reap(&fd);
            }
        }
    }
}
