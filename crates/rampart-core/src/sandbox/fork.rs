//! Snapshot and fork of a sandbox, and new volumes: the parts that need the coordinator (the
//! sandbox's operation lock while its consistent point is taken, the audit record, fork's
//! creates and their destroy on failure, disk admission), on the pieces `crate::persist`
//! provides.

use super::*;
use rampart_types::VolumeInfo;
use rampart_types::{CreateSnapshot, CreateVolume, ForkSandbox, SnapshotInfo};

impl Sandboxes {
    /// The record and first host uid of a sandbox a consistent point can be taken of (running
    /// or paused). The caller holds its operation lock.
    fn point_source(&self, id: &SandboxId) -> Result<(SandboxRecord, u32), CoreError> {
        let rec = self
            .store
            .get(id)
            .map_err(CoreError::from)?
            .ok_or_else(|| CoreError::NotFound(id.to_string()))?;
        if !matches!(rec.state, SandboxState::Running | SandboxState::Paused) {
            return Err(CoreError::WrongState {
                id: id.to_string(),
                state: rec.state.as_str().to_owned(),
            });
        }
        let uid_base = uid_base(self.cfg.uid_range_start, rec.uid_slot, self.cfg.uid_slots)
            .ok_or_else(|| CoreError::Internal("uid slot out of range".into()))?;
        Ok((rec, uid_base))
    }

    /// Takes a snapshot of a running or paused sandbox and records it; with `stop`, destroys
    /// the sandbox afterwards.
    pub(crate) async fn snapshot(
        self: &Arc<Self>,
        id: &SandboxId,
        req: CreateSnapshot,
    ) -> Result<SnapshotInfo, CoreError> {
        let (name, root) = self.persist.snapshot_target(self.iso.as_ref(), id, &req)?;
        let info = {
            let op = self.op_lock(id);
            let _g = op.lock().await;
            let (rec, uid_base) = self.point_source(id)?;
            let info = self
                .persist
                .take_snapshot(&self.iso, &rec, uid_base, &name, &root)
                .await?;
            // The audit record: fs_diff (reason snapshot) and snapshot.
            self.manifests()
                .record_snapshot(id, &rec.template, rec.state == SandboxState::Paused, &name)
                .await;
            let data = serde_json::json!({"snapshot_id": crate::principal::unqualify(&name)});
            self.lifecycle(
                crate::events::Kind::Checkpointed,
                &info_of(&rec),
                None,
                data,
            );
            info
        };
        if req.stop {
            self.clone().destroy(id, EndReason::Request).await?;
        }
        Ok(info)
    }

    /// Makes `count` sandboxes from one consistent point of a running or paused sandbox,
    /// through the normal create path with the source's create request and `opts` (the E2B
    /// API's facts, each fork getting a token of its own). `all_or_none`: if one fails, those
    /// already made are destroyed and the call fails; otherwise each fork succeeds or fails
    /// on its own, one result per fork in order (E2B's fork). A failure before any fork is
    /// made (the source, the consistent point) fails the call either way.
    pub(crate) async fn fork(
        self: &Arc<Self>,
        id: &SandboxId,
        req: ForkSandbox,
        opts: CreateOptions,
        all_or_none: bool,
    ) -> Result<Vec<Result<CreatedSandbox, CoreError>>, CoreError> {
        let point = crate::persist::fork_point(self.iso.as_ref(), req.count)?;
        let owner;
        let base_req = {
            let op = self.op_lock(id);
            let _g = op.lock().await;
            let (rec, uid_base) = self.point_source(id)?;
            owner = rec.tenant.clone();
            let mut base = self.persist.source_request(&rec);
            // A fork runs the same servers: the source's public ports (as they are now) stay
            // public; each fork gets a token of its own at its create.
            base.public_ports = self
                .access
                .public_ports(id.as_str())
                .map_err(CoreError::from)?;
            if let Some(t) = req.timeout_secs {
                base.timeout_secs = Some(t);
            }
            self.persist
                .take_fork_point(&self.iso, &point, &rec, uid_base)
                .await?;
            base
        };
        let mut made = Vec::new();
        let mut failure = None;
        let mut results = Vec::new();
        for _ in 0..req.count {
            let mut r = base_req.clone();
            r.snapshot = Some(point.name().to_owned());
            // A fork is its source's tenant's, whoever asked for it (and counts against
            // that tenant's quotas).
            let on_behalf = crate::principal::Principal {
                caller: crate::principal::current_caller(),
                tenant: owner.clone(),
                key_id: crate::principal::current().and_then(|p| p.key_id),
            };
            let made_one = crate::principal::scope(on_behalf, self.create(r, opts.clone())).await;
            match made_one {
                Ok(c) if all_or_none => made.push(c),
                Err(e) if all_or_none => {
                    failure = Some(e);
                    break;
                }
                r => {
                    if let Err(e) = &r {
                        warn!(id = %id, "one fork failed: {e}");
                    }
                    results.push(r);
                }
            }
        }
        self.persist.release(point).await;
        if let Some(e) = failure {
            for s in &made {
                let fork = &s.info.id;
                if let Err(de) = self.clone().destroy(fork, EndReason::Request).await {
                    warn!(id = %fork, "destroying a fork after a failed fork: {de}");
                }
            }
            return Err(e);
        }
        if all_or_none {
            results = made.into_iter().map(Ok).collect();
        }
        let ok = results.iter().filter(|r| r.is_ok()).count();
        info!(id = %id, count = ok, failed = results.len() - ok, "forked");
        Ok(results)
    }

    /// Makes a volume, its size admitted against the disk beside what else was promised.
    pub(crate) async fn create_volume(&self, req: CreateVolume) -> Result<VolumeInfo, CoreError> {
        self.persist.check_new_volume(self.iso.as_ref(), &req)?;
        // Held until the volume's row counts.
        let _admitted = self
            .admit_disk(&format!("volume {:?}", req.name), req.size_mib << 20)
            .await?;
        self.persist.make_volume(&self.iso, &req).await
    }
}
