//! Snapshot and fork of a sandbox, and new volumes: the parts that need the coordinator (the
//! sandbox's operation lock while its consistent point is taken, the audit record, fork's
//! creates and their destroy on failure, disk admission), on the pieces `crate::persist`
//! provides.

use super::cold::Stop;
use super::*;
use crate::persist::TakePoint;
use rampart_types::{CreateSnapshot, CreateVolume, ForkSandbox, SnapshotInfo};
use rampart_types::{Tier, VolumeInfo};
use std::path::Path;

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

    /// What takes a consistent point of `rec`'s sandbox (its operation lock held): the
    /// tier's copy of its disk, or for a gVisor sandbox a copy of it saved to disk with
    /// its memory (its processes too with `memory`; see [`Sandboxes::take_saved_point`]).
    fn point_taker(
        self: &Arc<Self>,
        rec: &SandboxRecord,
        memory: bool,
    ) -> impl FnOnce(PathBuf) -> TakePoint {
        let me = self.clone();
        let id = rec.id.clone();
        let saved = rec.isolation == Tier::Gvisor;
        move |dir| -> TakePoint {
            if saved {
                Box::pin(async move { me.take_saved_point(&id, dir, memory).await })
            } else {
                Box::pin(crate::persist::take_point(me.iso.clone(), id, dir))
            }
        }
    }

    /// A consistent point of gVisor sandbox `id` (its operation lock held) into the new
    /// directory `dir`: it is saved to disk with its memory (a frozen one stays paused so;
    /// a running one is restored and runs on, its processes where they were), and its disk
    /// and (with `memory`) its processes are copied. The record says `paused {"memory":
    /// true}` and `resumed` around it. A save that fails once its processes were being
    /// ended destroys the sandbox, saying why (never half stopped); on error `dir` does not
    /// exist.
    async fn take_saved_point(
        self: &Arc<Self>,
        id: &SandboxId,
        dir: PathBuf,
        memory: bool,
    ) -> Result<u64, CoreError> {
        let standing = self.registry.standing(id);
        let running = matches!(standing, Standing::Running(_));
        if !matches!(standing, Standing::Gone) {
            match self.stop_locked(id, true, false).await {
                Ok(()) => {}
                Err(Stop::Refused(e)) => return Err(e),
                Err(Stop::Broken(e)) => {
                    // Destroyed once this operation lets go of its lock.
                    let me = self.clone();
                    let id2 = id.clone();
                    let why = format!("saving it to disk for a snapshot failed: {e}");
                    tokio::spawn(async move {
                        if let Err(de) = me.destroy(&id2, EndReason::Died(why)).await {
                            error!(id = %id2, "destroying after a failed save: {de}");
                        }
                    });
                    return Err(e);
                }
            }
        }
        let img = self.iso.disks()?.snapshot_image(&dir)?;
        std::fs::create_dir(&dir).map_err(CoreError::io(format!("mkdir {}", dir.display())))?;
        let iso = self.iso.clone();
        let id2 = id.clone();
        let copied =
            tokio::task::spawn_blocking(move || iso.cold()?.copy_saved(&id2, &img, memory))
                .await
                .map_err(CoreError::task("copy"))
                .and_then(|r| r.map_err(|e| CoreError::isolation("snapshot", e)));
        if copied.is_err() {
            let _ = std::fs::remove_dir_all(&dir);
        }
        if running {
            match self.boot_cold_locked(id, false).await {
                Ok((_, false)) => {}
                Ok((_, true)) => {
                    // Its deadline passed meanwhile: a new one, as a resume gives.
                    self.set_timeout(id, self.cfg.default_timeout_secs)?;
                }
                Err(e) => {
                    warn!(id = %id, "restoring after its snapshot failed ({e}); it stays paused to disk")
                }
            }
        }
        copied
    }

    /// Records a consistent point taken of `rec`'s sandbox into `dir` (a snapshot named
    /// `name`, or a fork's point for `forks` sandboxes): the `snapshot` event, with the
    /// digest of the saved processes when the point has them; then `lineage.json` beside
    /// it, naming the source and its chain head at that event (and that digest), which
    /// every sandbox made from the point puts in its `created` event (`spec.parent`): its
    /// record begins where its parent's was.
    /// Returns the digest of the saved processes, when the point has them.
    async fn record_point(
        &self,
        rec: &SandboxRecord,
        name: &str,
        dir: &Path,
        forks: Option<u32>,
    ) -> Option<String> {
        let image = self.iso.disks().and_then(|d| d.snapshot_image(dir)).ok();
        let dir2 = dir.to_owned();
        let digest = tokio::task::spawn_blocking(move || saved_digest(&dir2, image.as_deref()))
            .await
            .ok()
            .flatten();
        let body = rampart_types::audit::Snapshot {
            name: name.to_owned(),
            memory: digest.is_some().then_some(true),
            checkpoint_digest: digest.clone(),
            forks,
        };
        self.manifests()
            .record_snapshot(
                &rec.id,
                &rec.template,
                rec.state == SandboxState::Paused,
                body,
            )
            .await;
        let head = match self.audit.head(&rec.id) {
            Ok(h) => h,
            Err(e) => {
                warn!(id = %rec.id, "reading the chain head for a snapshot's lineage: {e}");
                None
            }
        };
        let lineage = serde_json::json!({
            "sandbox": rec.id,
            "snapshot": name,
            "seq": head.as_ref().map(|h| h.0),
            "head": head.map(|h| h.1),
            "checkpoint_digest": digest,
        });
        let path = dir.join(LINEAGE);
        if let Err(e) = std::fs::write(&path, lineage.to_string()) {
            warn!(id = %rec.id, "writing {}: {e}", path.display());
        }
        digest
    }

    /// Takes a snapshot of a running or paused sandbox and records it; with `stop`, destroys
    /// the sandbox afterwards.
    pub(crate) async fn snapshot(
        self: &Arc<Self>,
        id: &SandboxId,
        req: CreateSnapshot,
    ) -> Result<SnapshotInfo, CoreError> {
        // Its tier can keep its memory when it can save it to disk.
        let keeps_memory = self.iso.cold().is_ok_and(|c| c.can_checkpoint(id));
        let (name, root) =
            self.persist
                .snapshot_target(self.iso.as_ref(), id, &req, keeps_memory)?;
        let info = {
            let op = self.op_lock(id);
            let _g = op.lock().await;
            let (rec, uid_base) = self.point_source(id)?;
            let take = self.point_taker(&rec, req.memory);
            let mut info = self
                .persist
                .take_snapshot(take, &rec, uid_base, &name, &root)
                .await?;
            // The audit record: fs_diff (reason snapshot) and snapshot, and the lineage a
            // sandbox made from it names.
            info.memory = self
                .record_point(&rec, &name, &root.join("snapshots").join(&name), None)
                .await
                .is_some();
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
            // Each fork runs on its source's tier (on gVisor, with its memory).
            base.isolation = Some(rec.isolation);
            // A fork runs the same servers: the source's public ports (as they are now) stay
            // public; each fork gets a token of its own at its create.
            base.public_ports = self
                .access
                .public_ports(id.as_str())
                .map_err(CoreError::from)?;
            if let Some(t) = req.timeout_secs {
                base.timeout_secs = Some(t);
            }
            let take = self.point_taker(&rec, true);
            self.persist
                .take_fork_point(take, &point, &rec, uid_base)
                .await?;
            self.record_point(&rec, point.name(), point.dir(), Some(req.count))
                .await;
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

use crate::persist::LINEAGE;

/// The digest (`sha256:<hex>`) of what a point's directory `dir` holds beyond its disk
/// image `image` and its lineage: the saved processes and memory (each file's relative
/// path and SHA-256, in name order). None when it holds nothing more (a disk-only point).
fn saved_digest(dir: &Path, image: Option<&Path>) -> Option<String> {
    use sha2::{Digest as _, Sha256};
    let mut files = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).ok()?.flatten() {
            let p = e.path();
            let t = e.file_type().ok()?;
            if t.is_dir() {
                stack.push(p);
            } else if t.is_file() && Some(p.as_path()) != image && e.file_name() != LINEAGE {
                files.push(p);
            }
        }
    }
    if files.is_empty() {
        return None;
    }
    files.sort();
    let mut all = Sha256::new();
    for f in files {
        let mut one = Sha256::new();
        std::io::copy(&mut std::fs::File::open(&f).ok()?, &mut one).ok()?;
        let rel = f.strip_prefix(dir).ok()?.to_string_lossy().into_owned();
        all.update(rel.as_bytes());
        all.update([0]);
        all.update(one.finalize());
    }
    let h: [u8; 32] = all.finalize().into();
    Some(format!("sha256:{}", rampart_types::audit::Hash(h).to_hex()))
}
