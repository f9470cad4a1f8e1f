//! Pauses to the filesystem and boots from the disk (E2B's `mode="filesystem"` pause and
//! `on_resume="reboot"`): the sandbox's processes end and its disk stays on the tier
//! ([`crate::ColdStop::stop`]); its resume boots it again on that disk
//! ([`crate::ColdStop::relaunch`]) with the same id, uid range, limits, environment, network
//! policy, volumes and tokens. Nothing of its memory or processes comes back.
//!
//! Such a sandbox is `paused` in the store with no pid (what recovery reads: it keeps the
//! disk and waits) and is not in the registry (nothing of it runs: no deadline fires for
//! it; it waits until it is resumed or destroyed, as a sandbox paused by its expiry does).

use super::*;
use crate::events::Kind;
use crate::isolation::{LaunchExtras, VolumeSpec};
use rampart_types::audit::{Pause, Resume};
use serde_json::json;

/// What [`Sandboxes::boot`] made.
pub(super) struct Booted {
    pub(super) pid: i32,
    pub(super) pidfd: OwnedFd,
    pub(super) start: u64,
    pub(super) sock: String,
    pub(super) client: AgentClient,
    /// Restored from a checkpoint: its processes are the ones it was paused with.
    pub(super) restored: bool,
}

impl Sandboxes {
    /// Whether `id` is paused to its filesystem: paused in the store, with no pid, its disk
    /// kept by the tier.
    pub(crate) async fn is_cold(&self, id: &SandboxId) -> Result<bool, CoreError> {
        let Some(rec) = self.store.get(id).map_err(CoreError::from)? else {
            return Ok(false);
        };
        if rec.state != SandboxState::Paused || rec.pid.is_some() {
            return Ok(false);
        }
        let iso = self.iso.clone();
        let id2 = id.clone();
        tokio::task::spawn_blocking(move || iso.is_stopped(&id2))
            .await
            .map_err(CoreError::task("stopped"))
    }

    /// Pauses a running or paused sandbox to its filesystem: its disk is flushed and kept,
    /// every process ends, and `paused` is recorded with `memory: false`. A sandbox paused
    /// to its filesystem already is left as it is. If the tier fails once the processes are
    /// being ended, the sandbox is destroyed (the record says why): it is never left half
    /// stopped.
    ///
    /// With `memory`, its processes are saved too (a checkpoint beside its disk, on a tier
    /// that can, [`crate::ColdStop::checkpoint`]; refused as a 400 naming `disk` on one that
    /// cannot, the sandbox untouched), and its resume restores them where they were.
    pub(crate) async fn pause_to_disk(
        self: &Arc<Self>,
        id: &SandboxId,
        memory: bool,
    ) -> Result<SandboxInfo, CoreError> {
        self.pause_to_disk_for(id, memory, false).await
    }

    /// [`Sandboxes::pause_to_disk`]; `idle`: it is put to sleep for its idleness (refused
    /// with `Conflict` when a request came in since it was found idle).
    pub(super) async fn pause_to_disk_for(
        self: &Arc<Self>,
        id: &SandboxId,
        memory: bool,
        idle: bool,
    ) -> Result<SandboxInfo, CoreError> {
        let failed = {
            let op = self.op_lock(id);
            let _guard = op.lock().await;
            match self.stop_locked(id, memory, idle).await {
                Ok(()) => None,
                Err(Stop::Refused(e)) => return Err(e),
                Err(Stop::Broken(e)) => Some(e),
            }
        };
        if let Some(e) = failed {
            error!(id = %id, "pausing to the filesystem failed: {e}; destroying the sandbox");
            let why = format!("pausing to the filesystem failed: {e}");
            if let Err(de) = self.clone().destroy(id, EndReason::Died(why)).await {
                error!(id = %id, "destroying after a failed pause: {de}");
            }
            return Err(e);
        }
        self.get(id)
    }

    /// [`Sandboxes::pause_to_disk`] under the sandbox's operation lock.
    pub(super) async fn stop_locked(
        self: &Arc<Self>,
        id: &SandboxId,
        memory: bool,
        idle: bool,
    ) -> Result<(), Stop> {
        if self.iso.cold().is_err() {
            return Err(Stop::Refused(CoreError::Unsupported(format!(
                "the {} tier cannot pause a sandbox to its filesystem (or boot it from its disk)",
                self.iso.name()
            ))));
        }
        let was_running = match self.registry.standing(id) {
            Standing::Running(_) => true,
            Standing::Paused => false,
            Standing::Gone => {
                return if self.is_cold(id).await.map_err(Stop::Refused)? {
                    Ok(())
                } else {
                    Err(Stop::Refused(self.not_running(id)))
                };
            }
        };
        // Asked of the tier before anything changes: one that cannot save this sandbox's
        // memory leaves it untouched.
        if memory && !self.iso.cold().is_ok_and(|c| c.can_checkpoint(id)) {
            return Err(Stop::Refused(CoreError::BadRequest {
                field: "disk".into(),
                message: "only a sandbox on the gvisor tier can save its memory to disk: pause it with its memory kept in RAM (the default) or to its filesystem (\"memory\": false)".into(),
            }));
        }
        if memory {
            // Room on the node's disk for it, asked before anything changes.
            let iso = self.iso.clone();
            let id2 = id.clone();
            tokio::task::spawn_blocking(move || iso.cold()?.room_to_checkpoint(&id2))
                .await
                .map_err(|e| Stop::Refused(CoreError::task("checkpoint room")(e)))?
                .map_err(|e| Stop::Refused(e.into()))?;
        }
        let rec = self
            .store
            .get(id)
            .map_err(|e| Stop::Refused(e.into()))?
            .ok_or_else(|| Stop::Refused(CoreError::NotFound(id.to_string())))?;
        if was_running {
            // Its tenant's `max_paused`.
            self.store
                .admit_transition(id, SandboxState::Paused)
                .map_err(|e| Stop::Refused(e.into()))?;
            let start = match idle {
                true => self.registry.begin_sleep(id),
                false => self.registry.begin_pause(id),
            };
            match start {
                PauseStart::Started => {}
                PauseStart::Busy => {
                    return Err(Stop::Refused(CoreError::Conflict(format!(
                        "sandbox {id} is busy"
                    ))))
                }
                _ => return Err(Stop::Refused(self.not_running(id))),
            }
            // Frozen first: a sandbox that cannot be frozen keeps running, untouched.
            if let Err(e) = self.iso_freeze(id, true).await {
                self.registry.unpause(id);
                return Err(Stop::Refused(e));
            }
        }
        let t0 = Instant::now();
        // From here its init's end is ours: the watcher leaves it alone.
        self.registry.begin_stop(id);
        self.network
            .teardown_stored(self.store.as_ref(), id, rec.uid_slot)
            .await;
        let iso = self.iso.clone();
        let id2 = id.clone();
        tokio::task::spawn_blocking(move || {
            let cold = iso.cold()?;
            if memory {
                cold.checkpoint(&id2)
            } else {
                cold.stop(&id2)
            }
        })
        .await
        .map_err(|e| Stop::Broken(CoreError::task("stop")(e)))?
        .map_err(|e| Stop::Broken(CoreError::isolation("pause to disk", e)))?;
        self.registry.remove(id);
        self.netaudit.record_suppressed(id);
        let store = &self.store;
        self.audit
            .record(
                id,
                false,
                |_| {
                    EventBody::Paused(Pause {
                        memory: Some(memory),
                        idle: idle.then_some(true),
                    })
                },
                Vec::new(),
                |e| store.set_stopped_audited(id, e),
            )
            .map_err(Stop::Broken)?;
        self.metrics.pauses.inc();
        info!(id = %id, ms = t0.elapsed().as_millis() as u64, memory, "sandbox paused to disk");
        let info = self.get(id).map_err(Stop::Refused)?;
        let data = json!({"execution": super::lifecycle::execution(&info)});
        self.lifecycle(Kind::Paused, &info, None, data);
        Ok(())
    }

    /// Boots a sandbox paused to its filesystem on its disk, or (`reboot` of a frozen one)
    /// pauses it to its filesystem first: its processes start afresh (its template's start
    /// command and servers too), `resumed` is recorded with `reboot: true`. A deadline that
    /// passed while it was paused is moved to now + the default timeout. If the boot fails,
    /// the sandbox stays paused to its filesystem, its disk as it was.
    /// `woken`: by a request for it (its record says so).
    pub(crate) async fn reboot(
        self: &Arc<Self>,
        id: &SandboxId,
        woken: bool,
    ) -> Result<SandboxInfo, CoreError> {
        let failed = {
            let op = self.op_lock(id);
            let _guard = op.lock().await;
            match self.registry.standing(id) {
                Standing::Running(_) => return self.get(id),
                Standing::Paused => match self.stop_locked(id, false, false).await {
                    Ok(()) => None,
                    Err(Stop::Refused(e)) => return Err(e),
                    Err(Stop::Broken(e)) => Some(e),
                },
                Standing::Gone => None,
            }
        };
        if let Some(e) = failed {
            let why = format!("pausing to the filesystem failed: {e}");
            if let Err(de) = self.clone().destroy(id, EndReason::Died(why)).await {
                error!(id = %id, "destroying after a failed pause: {de}");
            }
            return Err(e);
        }
        let op = self.op_lock(id);
        let guard = op.lock().await;
        let (info, expired) = self.boot_cold_locked(id, woken).await?;
        drop(guard);
        if expired {
            return self.set_timeout(id, self.cfg.default_timeout_secs);
        }
        Ok(info)
    }

    /// Boots a sandbox paused to its filesystem (its operation lock held): [`Sandboxes::reboot`]
    /// without the pause first. Returns it, and whether its deadline had passed (the caller
    /// sets a new one once the lock is let go).
    pub(super) async fn boot_cold_locked(
        self: &Arc<Self>,
        id: &SandboxId,
        woken: bool,
    ) -> Result<(SandboxInfo, bool), CoreError> {
        if !self.is_cold(id).await? {
            return match self.registry.standing(id) {
                Standing::Running(_) => Ok((self.get(id)?, false)),
                _ => Err(self.not_running(id)),
            };
        }
        let rec = self
            .store
            .get(id)
            .map_err(CoreError::from)?
            .ok_or_else(|| CoreError::NotFound(id.to_string()))?;
        // Its tenant's `max_sandboxes` and `max_vcpus` count it again once it runs.
        self.store
            .admit_transition(id, SandboxState::Running)
            .map_err(CoreError::from)?;
        let t0 = Instant::now();
        let net = self
            .store
            .network(id)
            .map_err(CoreError::from)?
            .filter(|n| n.policy.mode != rampart_types::NetworkMode::None);
        let new = NewSandbox {
            id: rec.id.clone(),
            template: rec.template.clone(),
            limits: rec.limits.clone(),
            env: rec.env.clone(),
            metadata: rec.metadata.clone(),
            created_at_ms: rec.created_at_ms,
            expires_at_ms: rec.expires_at_ms,
            access: None,
            on_timeout: rec.on_timeout,
            network: net.clone(),
            request: None,
            tenant: rec.tenant.clone(),
            isolation: rec.isolation,
            idle_pause_secs: rec.idle_pause_secs,
            pooled: false,
        };
        let extras = LaunchExtras {
            disk: None,
            volumes: self.volumes_of(&rec)?,
        };
        let booted = match self
            .boot(&new, rec.uid_slot, net.as_ref(), extras, true)
            .await
        {
            Ok(b) => b,
            Err(e) => {
                warn!(id = %id, "booting a sandbox paused to its filesystem failed: {e}");
                if net.is_some() {
                    self.network.teardown(id, rec.uid_slot).await;
                }
                // The tier put the disk back; whatever of the boot runs goes.
                let iso = self.iso.clone();
                let id2 = id.clone();
                let _ = tokio::task::spawn_blocking(move || iso.cold()?.stop(&id2)).await;
                return Err(e);
            }
        };
        let store = &self.store;
        self.audit.record(
            id,
            false,
            |_| {
                EventBody::Resumed(Resume {
                    reboot: Some(!booted.restored),
                    woken: woken.then_some(true),
                })
            },
            Vec::new(),
            |e| store.set_running_audited(id, booted.pid, booted.start, &booted.sock, e),
        )?;
        // A deadline that passed while it was paused: a new one (set below) from now, already
        // in the registry so the reaper does not take it for expired meanwhile.
        let expired = rec.expires_at_ms <= now_ms();
        let deadline_ms = if expired {
            now_ms().saturating_add((self.cfg.default_timeout_secs as i64).saturating_mul(1000))
        } else {
            rec.expires_at_ms
        };
        let terms = self.terms(
            id,
            deadline_ms,
            false,
            rec.on_timeout,
            rec.tenant.clone(),
            rec.idle_pause_secs,
        );
        self.register(id, booted.client, booted.pid, booted.pidfd, terms);
        self.metrics.resumes.inc();
        let restored = booted.restored;
        info!(id = %id, ms = t0.elapsed().as_millis() as u64, restored, "sandbox booted from its disk");
        let info = self.get(id)?;
        self.lifecycle(Kind::Resumed, &info, None, json!({"reboot": !restored}));
        Ok((info, expired))
    }

    /// The volumes a sandbox was made with (from its kept create request), for its boot.
    fn volumes_of(&self, rec: &SandboxRecord) -> Result<Vec<VolumeSpec>, CoreError> {
        self.persist
            .source_request(rec)
            .volumes
            .iter()
            .map(|v| {
                Ok(VolumeSpec {
                    image: self.iso.volumes()?.volume_image(&v.name)?,
                    path: v.path.clone(),
                    read_only: v.read_only,
                })
            })
            .collect()
    }
}

/// Why a pause to the filesystem did not happen.
pub(super) enum Stop {
    /// Refused before anything changed: the sandbox is as it was.
    Refused(CoreError),
    /// Failed once its processes were being ended.
    Broken(CoreError),
}
