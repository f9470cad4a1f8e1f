//! Snapshots, fork and volumes: the manager's side (see `docs/persistence.md`).
//!
//! - A **snapshot** is a consistent copy of a sandbox's writable disk (the tier freezes the
//!   sandbox, flushes its filesystem, clones the image, thaws: [`Isolation::snapshot_disk`])
//!   kept as `<store>/snapshots/<name>/disk.img`, with a row in `state.db` (source, template,
//!   uid range, limits, env, the source's create request). It is made under a temporary name
//!   and renamed into place, so a failed or interrupted snapshot leaves nothing but a
//!   `.tmp-*` directory that the next start removes. Memory is not kept (this tier has no
//!   process checkpoint): `memory: true` is refused with the reason.
//! - **Create from a snapshot** fills the template (and unset limits) from the snapshot and
//!   launches on a clone of its image ([`Isolation::launch_with`]).
//! - **Fork** takes one consistent point of the source (a hidden snapshot `.fork-*` that
//!   lives for the duration of the call) and creates N sandboxes from it through the normal
//!   create path with the source's create request (template, limits, env, metadata, network
//!   policy, volumes, ...): each has a fresh id, host name, machine id, tokens and addresses.
//!   If one of them fails, those already made are destroyed.
//! - A **volume** is an ext4 image `<store>/volumes/<name>.img` (its size is its quota)
//!   with a row in `state.db`; mounted at create, outliving sandboxes. It cannot be removed
//!   while a sandbox has it mounted (its loop device is attached) or a create using it runs.

use crate::isolation::{DiskSource, LaunchExtras, VolumeSpec};
use crate::sandbox::{EndReason, Sandboxes};
use crate::util::lock;
use crate::{CoreError, Manager};
use rampart_store::keys::random_hex;
use rampart_store::persist::{PersistStore, SnapshotRow};
use rampart_store::{now_ms, StoreError};
use rampart_types::{
    CreateSandbox, CreateSnapshot, CreateVolume, ForkResult, ForkSandbox, Limits, LimitsRequest,
    SandboxId, SandboxState, SnapshotInfo, VolumeInfo,
};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tracing::{info, warn};

/// Why a memory snapshot is refused.
pub const MEMORY_REFUSAL: &str = "this isolation tier (namespaces) keeps the filesystem only: a \
snapshot holds the sandbox's writable layer, not its processes or memory (no process \
checkpoint/restore on this kernel); a future microVM tier will keep memory. Use \
\"memory\": false, or pause (which keeps memory while the sandbox stays on this host)";

/// Most sandboxes one fork call makes.
pub const MAX_FORK: u32 = 16;
/// Largest volume, MiB (1 TiB).
pub const MAX_VOLUME_MIB: u64 = 1 << 20;

type Counts = Arc<Mutex<HashMap<String, usize>>>;

/// The manager's persistence state.
#[derive(Debug)]
pub(crate) struct Persist {
    db: PersistStore,
    /// Snapshot name -> creates cloning it right now.
    busy_snapshots: Counts,
    /// Volume name -> creates mounting it right now.
    busy_volumes: Counts,
    /// Fork consistent points, by hidden name: (row, image).
    hidden: Mutex<HashMap<String, (SnapshotRow, PathBuf)>>,
    /// What a create staged for its launch, by sandbox id.
    staged: Mutex<HashMap<SandboxId, LaunchExtras>>,
    /// When the create requests of ended sandboxes were last pruned (unix ms).
    pruned_at_ms: std::sync::atomic::AtomicI64,
}

impl Persist {
    /// Bytes promised to snapshots (what their images held when taken) and volumes (their
    /// sizes), for disk admission.
    pub(crate) fn committed_bytes(&self) -> Result<u64, CoreError> {
        let snaps: u64 = self
            .db
            .snapshots()
            .map_err(CoreError::from)?
            .iter()
            .map(|s| s.size_bytes)
            .sum();
        let vols: u64 = self
            .db
            .volumes()
            .map_err(CoreError::from)?
            .iter()
            .map(|v| v.size_mib << 20)
            .sum();
        Ok(snaps.saturating_add(vols))
    }
}

/// Keeps snapshots and volumes marked busy while a create uses them.
#[derive(Debug)]
pub(crate) struct Busy {
    held: Vec<(Counts, String)>,
}

impl Busy {
    fn hold(&mut self, c: &Counts, name: &str) {
        let mut m = lock(c);
        self.hold_locked(&mut m, c, name);
    }

    /// Marks `name` busy in `c`, whose lock the caller holds as `m`.
    fn hold_locked(&mut self, m: &mut HashMap<String, usize>, c: &Counts, name: &str) {
        *m.entry(name.to_owned()).or_default() += 1;
        self.held.push((c.clone(), name.to_owned()));
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        for (c, n) in self.held.drain(..) {
            let mut m = lock(&c);
            if let Some(v) = m.get_mut(&n) {
                *v = v.saturating_sub(1);
                if *v == 0 {
                    m.remove(&n);
                }
            }
        }
    }
}

fn bad(field: &str, message: impl Into<String>) -> CoreError {
    CoreError::BadRequest {
        field: field.to_owned(),
        message: message.into(),
    }
}

/// Checks a snapshot or volume name: 1 to 64 of letters, digits, `.`, `_`, `-`, starting
/// with a letter or digit.
pub fn check_name(field: &str, name: &str) -> Result<(), CoreError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(bad(
            field,
            format!(
                "{name:?} is not a valid name (1-64 letters, digits, '.', '_', '-'; first a letter or digit)"
            ),
        ))
    }
}

/// Checks a volume's mount path: absolute, normal (no `.`, `..`, empty components), at most
/// 256 bytes, not `/` and not under `/proc`, `/dev` or `/sys`.
pub fn check_volume_path(path: &str) -> Result<(), CoreError> {
    let field = "volumes.path";
    if !path.starts_with('/') || path.len() > 256 || path.contains('\0') {
        return Err(bad(field, format!("{path:?} must be an absolute path")));
    }
    let comps: Vec<&str> = path.split('/').skip(1).collect();
    if comps
        .iter()
        .any(|c| c.is_empty() || *c == "." || *c == "..")
        && path != "/"
    {
        return Err(bad(field, format!("{path:?} is not a normal path")));
    }
    if path == "/" || matches!(comps.first(), Some(&("proc" | "dev" | "sys"))) {
        return Err(bad(field, format!("{path:?}: cannot mount a volume there")));
    }
    Ok(())
}

fn rfc3339(ms: i64) -> String {
    crate::util::rfc3339(ms)
}

fn snapshot_info(r: &SnapshotRow) -> SnapshotInfo {
    SnapshotInfo {
        name: r.name.clone(),
        source: r.source.clone(),
        template: r.template.clone(),
        memory: false,
        size_bytes: r.size_bytes,
        created_at: rfc3339(r.created_at_ms),
    }
}

impl Persist {
    /// Opens the tables of `state.db` (after the state store migrated it).
    pub(crate) fn open(state_db: &Path) -> Result<Persist, CoreError> {
        Ok(Persist {
            db: PersistStore::open(state_db).map_err(CoreError::from)?,
            busy_snapshots: Arc::default(),
            busy_volumes: Arc::default(),
            hidden: Mutex::default(),
            staged: Mutex::default(),
            pruned_at_ms: std::sync::atomic::AtomicI64::new(now_ms()),
        })
    }

    /// Start-up: removes what interrupted operations left (`.tmp-*`, `.fork-*`) and the
    /// create requests of sandboxes that ended.
    pub(crate) fn clean(&self, root: Option<&Path>) {
        if let Some(root) = root {
            for d in ["snapshots", "volumes"] {
                let Ok(rd) = std::fs::read_dir(root.join(d)) else {
                    continue;
                };
                for e in rd.flatten() {
                    let n = e.file_name().to_string_lossy().into_owned();
                    if n.starts_with(".tmp-") || n.starts_with(".fork-") {
                        let p = e.path();
                        let r = if p.is_dir() {
                            std::fs::remove_dir_all(&p)
                        } else {
                            std::fs::remove_file(&p)
                        };
                        match r {
                            Ok(()) => {
                                info!(path = %p.display(), "removed an interrupted snapshot or volume")
                            }
                            Err(e) => warn!(path = %p.display(), "cannot remove: {e}"),
                        }
                    }
                }
            }
        }
        if let Err(e) = self.db.prune_requests() {
            warn!("pruning create requests: {e}");
        }
    }

    /// What a create launches with (taken once, by the launch).
    pub(crate) fn take_staged(&self, id: &SandboxId) -> LaunchExtras {
        lock(&self.staged).remove(id).unwrap_or_default()
    }

    /// Forgets what a create staged (its launch did not run).
    pub(crate) fn unstage(&self, id: &SandboxId) {
        lock(&self.staged).remove(id);
    }

    /// Keeps a sandbox's create request and what its launch needs; the returned value keeps
    /// its snapshot and volumes busy until dropped (the end of the create).
    pub(crate) fn stage(&self, id: &SandboxId, staged: Staged) -> Busy {
        if let Err(e) = self.db.set_request(id.as_str(), &staged.request) {
            warn!(id = %id, "keeping the create request (fork will use defaults): {e}");
        }
        // Requests (with the secret values given inline) are kept only while their sandbox
        // lives: the ended ones go at most a minute after the next create, not only at start.
        if prune_due(&self.pruned_at_ms, now_ms()) {
            if let Err(e) = self.db.prune_ended_requests() {
                warn!("pruning create requests: {e}");
            }
        }
        lock(&self.staged).insert(id.clone(), staged.extras);
        staged.busy
    }
}

/// Whether a minute passed since `last` (then `last` becomes `now`: one caller prunes).
fn prune_due(last: &std::sync::atomic::AtomicI64, now: i64) -> bool {
    use std::sync::atomic::Ordering;
    let l = last.load(Ordering::Relaxed);
    now.saturating_sub(l) >= 60_000
        && last
            .compare_exchange(l, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
}

/// What [`prepare_create`] found.
#[derive(Debug)]
pub(crate) struct Staged {
    extras: LaunchExtras,
    request: String,
    /// Marks the snapshot and volumes busy until the create ends.
    busy: Busy,
}

/// Resolves a create's `snapshot` (fills the template and unset limits from it) and
/// `volumes` (they must exist); marks them busy until the returned value is dropped.
pub(crate) fn prepare_create(
    inner: &Sandboxes,
    req: &mut CreateSandbox,
) -> Result<Staged, CoreError> {
    let p = &inner.persist;
    let mut extras = LaunchExtras::default();
    let mut busy = Busy { held: Vec::new() };
    let needs_store = req.snapshot.is_some() || !req.volumes.is_empty();
    let root = inner.iso.store_root();
    if needs_store && root.is_none() {
        return Err(CoreError::Unsupported(format!(
            "the {} tier has no snapshots or volumes",
            inner.iso.name()
        )));
    }
    if let (Some(name), Some(root)) = (req.snapshot.clone(), root.as_ref()) {
        let found = lock(&p.hidden)
            .get(&name)
            .map(|(row, img)| (row.clone(), img.clone()));
        let (row, image) = match found {
            Some(x) => x,
            None => {
                check_name("snapshot", &name)?;
                let row =
                    p.db.snapshot(&name)
                        .map_err(CoreError::from)?
                        .ok_or_else(|| bad("snapshot", format!("no snapshot named {name:?}")))?;
                (
                    row,
                    inner
                        .iso
                        .snapshot_image(&root.join("snapshots").join(&name))?,
                )
            }
        };
        if let Some(t) = &req.template {
            if *t != row.template {
                return Err(bad(
                    "template",
                    format!(
                        "snapshot {name:?} sits on template {:?}; leave template out or give that one",
                        row.template
                    ),
                ));
            }
        }
        req.template = Some(row.template.clone());
        if let Ok(l) = serde_json::from_str::<Limits>(&row.limits) {
            fill_limits(&mut req.limits, &l);
            if req.limits.disk_bytes != Some(l.disk_bytes) {
                return Err(bad(
                    "limits.disk_bytes",
                    format!(
                        "a sandbox made from a snapshot keeps its disk ({} bytes)",
                        l.disk_bytes
                    ),
                ));
            }
        }
        busy.hold(&p.busy_snapshots, &name);
        extras.disk = Some(DiskSource {
            image,
            uid_base: row.uid_base,
        });
    }
    let mut paths = Vec::new();
    for v in &req.volumes {
        check_name("volumes.name", &v.name)?;
        check_volume_path(&v.path)?;
        if paths.contains(&v.path) {
            return Err(bad("volumes.path", format!("{:?} is given twice", v.path)));
        }
        paths.push(v.path.clone());
        if root.is_none() {
            continue;
        }
        {
            // Checked and marked busy under one lock, which delete_volume holds from its own
            // checks to the row's removal: a volume is either removed or mounted, never both.
            let mut m = lock(&p.busy_volumes);
            if p.db.volume(&v.name).map_err(CoreError::from)?.is_none() {
                return Err(bad("volumes.name", format!("no volume named {:?}", v.name)));
            }
            busy.hold_locked(&mut m, &p.busy_volumes, &v.name);
        }
        extras.volumes.push(VolumeSpec {
            image: inner.iso.volume_image(&v.name)?,
            path: v.path.clone(),
            read_only: v.read_only,
        });
    }
    let mut kept = req.clone();
    // A fork's hidden consistent point is not the request's to keep.
    if kept.snapshot.as_ref().is_some_and(|s| s.starts_with('.')) {
        kept.snapshot = None;
    }
    let request = serde_json::to_string(&kept).unwrap_or_default();
    Ok(Staged {
        extras,
        request,
        busy,
    })
}

fn fill_limits(req: &mut LimitsRequest, l: &Limits) {
    req.cpus.get_or_insert(l.cpus);
    req.memory_bytes.get_or_insert(l.memory_bytes);
    req.pids.get_or_insert(l.pids);
    req.disk_bytes.get_or_insert(l.disk_bytes);
    req.open_files.get_or_insert(l.open_files);
}

/// The request a sandbox was created with (or one rebuilt from its record).
fn source_request(inner: &Sandboxes, rec: &rampart_store::SandboxRecord) -> CreateSandbox {
    let kept = inner
        .persist
        .db
        .request(rec.id.as_str())
        .ok()
        .flatten()
        .and_then(|s| serde_json::from_str::<CreateSandbox>(&s).ok());
    let mut req = kept.unwrap_or_else(|| CreateSandbox {
        template: Some(rec.template.clone()),
        env: rec.env.clone(),
        metadata: rec.metadata.clone(),
        ..Default::default()
    });
    req.template = Some(rec.template.clone());
    req.limits = LimitsRequest::default();
    fill_limits(&mut req.limits, &rec.limits);
    req.snapshot = None;
    req
}

/// The record and first host uid of a sandbox a consistent point can be taken of (running
/// or paused). The caller holds its operation lock.
fn source_of(
    inner: &Sandboxes,
    id: &SandboxId,
) -> Result<(rampart_store::SandboxRecord, u32), CoreError> {
    let rec = inner
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
    let uid_base =
        crate::sandbox::uid_base(inner.cfg.uid_range_start, rec.uid_slot, inner.cfg.uid_slots)
            .ok_or_else(|| CoreError::Internal("uid slot out of range".into()))?;
    Ok((rec, uid_base))
}

/// The create request a snapshot row keeps: the source's, without its secrets (a snapshot
/// outlives its sandbox; the secret values given at its create must not).
fn snapshot_request(mut req: CreateSandbox) -> String {
    req.secrets.clear();
    serde_json::to_string(&req).unwrap_or_default()
}

impl Manager {
    /// Takes a snapshot of a running or paused sandbox's filesystem (see [`crate::persist`]
    /// docs); with `stop`, destroys the sandbox afterwards ("pause to disk").
    pub async fn snapshot(
        &self,
        id: &SandboxId,
        req: CreateSnapshot,
    ) -> Result<SnapshotInfo, CoreError> {
        let inner = &self.inner;
        if req.memory {
            return Err(bad("memory", MEMORY_REFUSAL));
        }
        let name = req
            .name
            .clone()
            .unwrap_or_else(|| format!("{id}-{}", random_hex(4)));
        check_name("name", &name)?;
        let root = inner.iso.store_root().ok_or_else(|| {
            CoreError::Unsupported(format!(
                "the {} tier cannot snapshot sandboxes",
                inner.iso.name()
            ))
        })?;
        if inner
            .persist
            .db
            .snapshot(&name)
            .map_err(CoreError::from)?
            .is_some()
        {
            return Err(bad("name", format!("a snapshot named {name:?} exists")));
        }
        let info = {
            let op = inner.op_lock(id);
            let _g = op.lock().await;
            let (rec, uid_base) = source_of(inner, id)?;
            let request = snapshot_request(source_request(inner, &rec));
            let dir = root.join("snapshots");
            let tmp = dir.join(format!(".tmp-{name}-{}", random_hex(4)));
            let dest = dir.join(&name);
            let size = take_point(inner, id, &tmp).await?;
            if let Err(e) = crate::isolation::rename_noreplace(&tmp, &dest) {
                let _ = std::fs::remove_dir_all(&tmp);
                return Err(bad(
                    "name",
                    format!("a snapshot named {name:?} exists ({e})"),
                ));
            }
            let row = SnapshotRow {
                name: name.clone(),
                source: id.to_string(),
                template: rec.template.clone(),
                uid_base,
                limits: serde_json::to_string(&rec.limits).unwrap_or_default(),
                env: serde_json::to_string(&rec.env).unwrap_or_default(),
                request,
                size_bytes: size,
                created_at_ms: now_ms(),
            };
            if let Err(e) = inner.persist.db.insert_snapshot(&row) {
                let _ = std::fs::remove_dir_all(&dest);
                return Err(match e {
                    StoreError::Duplicate(_) => {
                        bad("name", format!("a snapshot named {name:?} exists"))
                    }
                    e => CoreError::from(e),
                });
            }
            info!(id = %id, name, size, "snapshot taken");
            // The audit record: fs_diff (reason snapshot) and snapshot.
            inner
                .manifests()
                .record_snapshot(id, &rec.template, rec.state == SandboxState::Paused, &name)
                .await;
            snapshot_info(&row)
        };
        if req.stop {
            inner.clone().destroy(id, EndReason::Request).await?;
        }
        Ok(info)
    }

    /// Every snapshot, oldest first.
    pub fn list_snapshots(&self) -> Result<Vec<SnapshotInfo>, CoreError> {
        Ok(self
            .inner
            .persist
            .db
            .snapshots()
            .map_err(CoreError::from)?
            .iter()
            .map(snapshot_info)
            .collect())
    }

    /// One snapshot.
    pub fn get_snapshot(&self, name: &str) -> Result<SnapshotInfo, CoreError> {
        check_name("name", name)?;
        self.inner
            .persist
            .db
            .snapshot(name)
            .map_err(CoreError::from)?
            .map(|r| snapshot_info(&r))
            .ok_or_else(|| CoreError::NotFound(format!("snapshot {name}")))
    }

    /// Removes a snapshot. Refused (409) while a create is cloning it; sandboxes made from it
    /// are not affected (each has its own copy).
    pub async fn delete_snapshot(&self, name: &str) -> Result<(), CoreError> {
        let inner = &self.inner;
        check_name("name", name)?;
        if lock(&inner.persist.busy_snapshots).contains_key(name) {
            return Err(CoreError::WrongState {
                id: format!("snapshot {name}"),
                state: "in use by a create".into(),
            });
        }
        if !inner
            .persist
            .db
            .delete_snapshot(name)
            .map_err(CoreError::from)?
        {
            return Err(CoreError::NotFound(format!("snapshot {name}")));
        }
        if let Some(root) = inner.iso.store_root() {
            let dir = root.join("snapshots").join(name);
            let gone = dir.with_file_name(format!(".tmp-rm-{name}-{}", random_hex(4)));
            if std::fs::rename(&dir, &gone).is_ok() {
                let iso = inner.iso.clone();
                tokio::task::spawn_blocking(move || {
                    let r = std::fs::remove_dir_all(&gone);
                    iso.trim_store();
                    r
                })
                .await
                .ok();
            }
        }
        info!(name, "snapshot removed");
        Ok(())
    }

    /// Makes `count` sandboxes from one consistent point of a running or paused sandbox.
    pub async fn fork(&self, id: &SandboxId, req: ForkSandbox) -> Result<ForkResult, CoreError> {
        let inner = &self.inner;
        if req.count == 0 || req.count > MAX_FORK {
            return Err(bad("count", format!("must be 1 to {MAX_FORK}")));
        }
        let root = inner.iso.store_root().ok_or_else(|| {
            CoreError::Unsupported(format!("the {} tier cannot fork", inner.iso.name()))
        })?;
        let hidden = format!(".fork-{}", random_hex(16));
        let dir = root.join("snapshots").join(&hidden);
        let image = inner.iso.snapshot_image(&dir)?;
        let (base_req, row) = {
            let op = inner.op_lock(id);
            let _g = op.lock().await;
            let (rec, uid_base) = source_of(inner, id)?;
            let mut base = source_request(inner, &rec);
            // A fork runs the same servers: the source's public ports (as they are now) stay
            // public; each fork gets a token of its own at its create.
            base.public_ports = inner
                .access
                .public_ports(id.as_str())
                .map_err(CoreError::from)?;
            if let Some(t) = req.timeout_secs {
                base.timeout_secs = Some(t);
            }
            take_point(inner, id, &dir).await?;
            let row = SnapshotRow {
                name: hidden.clone(),
                source: id.to_string(),
                template: rec.template.clone(),
                uid_base,
                limits: serde_json::to_string(&rec.limits).unwrap_or_default(),
                env: String::new(),
                request: String::new(),
                size_bytes: 0,
                created_at_ms: now_ms(),
            };
            (base, row)
        };
        lock(&inner.persist.hidden).insert(hidden.clone(), (row, image));
        let mut made = Vec::new();
        let mut failure = None;
        for _ in 0..req.count {
            let mut r = base_req.clone();
            r.snapshot = Some(hidden.clone());
            match self.create(r).await {
                Ok(info) => made.push(info),
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        lock(&inner.persist.hidden).remove(&hidden);
        let d2 = dir.clone();
        let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(d2)).await;
        if let Some(e) = failure {
            for s in &made {
                if let Err(de) = self.destroy(&s.id).await {
                    warn!(id = %s.id, "destroying a fork after a failed fork: {de}");
                }
            }
            return Err(e);
        }
        info!(id = %id, count = made.len(), "forked");
        Ok(ForkResult { sandboxes: made })
    }

    /// Makes a volume.
    pub async fn create_volume(&self, req: CreateVolume) -> Result<VolumeInfo, CoreError> {
        let inner = &self.inner;
        check_name("name", &req.name)?;
        if req.size_mib < 16 || req.size_mib > MAX_VOLUME_MIB {
            return Err(bad(
                "size_mib",
                format!("must be 16 to {MAX_VOLUME_MIB} MiB"),
            ));
        }
        inner.iso.store_root().ok_or_else(|| {
            CoreError::Unsupported(format!("the {} tier has no volumes", inner.iso.name()))
        })?;
        if inner
            .persist
            .db
            .volume(&req.name)
            .map_err(CoreError::from)?
            .is_some()
        {
            return Err(bad("name", format!("a volume named {:?} exists", req.name)));
        }
        // Held until the volume's row counts.
        let _admitted = inner
            .admit_disk(&format!("volume {:?}", req.name), req.size_mib << 20)
            .await?;
        let image = inner.iso.volume_image(&req.name)?;
        let (img2, size, iso) = (image.clone(), req.size_mib, inner.iso.clone());
        let made = tokio::task::spawn_blocking(move || iso.create_volume(&img2, size))
            .await
            .map_err(|e| CoreError::Internal(format!("volume: {e}")))?
            .map_err(|e| CoreError::Internal(format!("making volume {}: {e}", req.name)))?;
        if made == crate::isolation::NewVolume::Exists {
            return Err(bad("name", format!("a volume named {:?} exists", req.name)));
        }
        let row = match inner.persist.db.insert_volume(&req.name, req.size_mib) {
            Ok(r) => r,
            Err(e) => {
                let _ = std::fs::remove_file(&image);
                return Err(match e {
                    StoreError::Duplicate(_) => {
                        bad("name", format!("a volume named {:?} exists", req.name))
                    }
                    e => CoreError::from(e),
                });
            }
        };
        info!(name = req.name, size_mib = req.size_mib, "volume made");
        Ok(VolumeInfo {
            name: row.name,
            size_mib: row.size_mib,
            used_bytes: crate::isolation::allocated_bytes(&image),
            created_at: rfc3339(row.created_at_ms),
        })
    }

    /// Every volume.
    pub fn list_volumes(&self) -> Result<Vec<VolumeInfo>, CoreError> {
        let root = self.inner.iso.store_root();
        Ok(self
            .inner
            .persist
            .db
            .volumes()
            .map_err(CoreError::from)?
            .into_iter()
            .map(|r| VolumeInfo {
                used_bytes: root
                    .as_ref()
                    .and_then(|_| self.inner.iso.volume_image(&r.name).ok())
                    .map(|p| crate::isolation::allocated_bytes(&p))
                    .unwrap_or(0),
                name: r.name,
                size_mib: r.size_mib,
                created_at: rfc3339(r.created_at_ms),
            })
            .collect())
    }

    /// Removes a volume and its data. Refused (409) while a sandbox has it mounted.
    pub async fn delete_volume(&self, name: &str) -> Result<(), CoreError> {
        let inner = &self.inner;
        check_name("name", name)?;
        if inner
            .persist
            .db
            .volume(name)
            .map_err(CoreError::from)?
            .is_none()
        {
            return Err(CoreError::NotFound(format!("volume {name}")));
        }
        let in_use = || CoreError::WrongState {
            id: format!("volume {name}"),
            state: "mounted by a sandbox".into(),
        };
        let mounted_by_alive = || -> Result<bool, CoreError> {
            for rec in inner.store.alive().map_err(CoreError::from)? {
                let Some(r) = inner
                    .persist
                    .db
                    .request(rec.id.as_str())
                    .map_err(CoreError::from)?
                else {
                    continue;
                };
                if serde_json::from_str::<CreateSandbox>(&r)
                    .is_ok_and(|c| c.volumes.iter().any(|v| v.name == name))
                {
                    return Ok(true);
                }
            }
            Ok(false)
        };
        if lock(&inner.persist.busy_volumes).contains_key(name) || mounted_by_alive()? {
            return Err(in_use());
        }
        let image = inner
            .iso
            .store_root()
            .and_then(|_| inner.iso.volume_image(name).ok());
        if let Some(image) = &image {
            // A sandbox just destroyed: its mounts (and so the loop device) go a moment later.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
            while inner.iso.volume_in_use(image) {
                if std::time::Instant::now() > deadline {
                    return Err(in_use());
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        }
        {
            // Checked again under the lock prepare_create takes to mark a volume busy: a
            // create that started during the wait above either holds it now (refused here)
            // or will find no volume.
            let busy = lock(&inner.persist.busy_volumes);
            if busy.contains_key(name)
                || mounted_by_alive()?
                || image.as_ref().is_some_and(|i| inner.iso.volume_in_use(i))
            {
                return Err(in_use());
            }
            inner
                .persist
                .db
                .delete_volume(name)
                .map_err(CoreError::from)?;
        }
        if let Some(image) = image {
            if let Err(e) = std::fs::remove_file(&image) {
                warn!(name, "removing volume image: {e}");
            }
            let iso = inner.iso.clone();
            let _ = tokio::task::spawn_blocking(move || iso.trim_store()).await;
        }
        info!(name, "volume removed");
        Ok(())
    }

    /// A descriptor of the root of a running or paused sandbox's writable disk (see
    /// [`crate::Isolation::upper_root`]). Blocking-free: the tier's work runs on a blocking
    /// thread.
    pub async fn upper_root(&self, id: &SandboxId) -> Result<std::os::fd::OwnedFd, CoreError> {
        let iso = self.inner.iso.clone();
        let id2 = id.clone();
        tokio::task::spawn_blocking(move || iso.upper_root(&id2))
            .await
            .map_err(|e| CoreError::Internal(format!("upper root: {e}")))?
            .map_err(|e| match e {
                crate::IsolationError::Unsupported(m) => CoreError::Unsupported(m),
                crate::IsolationError::Failed(m) => CoreError::Internal(m),
            })
    }
}

/// Takes the consistent point of `id` into the new directory `dir` (`dir/disk.img`); on error
/// nothing of `dir` remains.
async fn take_point(inner: &Sandboxes, id: &SandboxId, dir: &Path) -> Result<u64, CoreError> {
    let img = inner.iso.snapshot_image(dir)?;
    std::fs::create_dir(dir).map_err(CoreError::io(format!("mkdir {}", dir.display())))?;
    let iso = inner.iso.clone();
    let id2 = id.clone();
    let r = tokio::task::spawn_blocking(move || iso.snapshot_disk(&id2, &img))
        .await
        .map_err(|e| CoreError::Internal(format!("snapshot: {e}")))
        .and_then(|r| {
            r.map_err(|e| match e {
                crate::IsolationError::Unsupported(m) => CoreError::Unsupported(m),
                crate::IsolationError::Failed(m) => CoreError::Internal(format!("snapshot: {m}")),
            })
        });
    if r.is_err() {
        let _ = std::fs::remove_dir_all(dir);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        for ok in ["a", "s1", "my-snap_2.x", &"a".repeat(64)] {
            assert!(check_name("name", ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            ".hidden",
            "-x",
            "../x",
            "a/b",
            "a b",
            &"a".repeat(65),
            "é",
        ] {
            assert!(check_name("name", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn volume_paths_are_checked() {
        for ok in ["/data", "/home/user/work", "/mnt/a.b"] {
            assert!(check_volume_path(ok).is_ok(), "{ok}");
        }
        for bad in [
            "", "/", "data", "/a/../b", "/a/./b", "/a//b", "/a/", "/proc", "/proc/x", "/dev/x",
            "/sys",
        ] {
            assert!(check_volume_path(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn busy_marks_are_released_on_drop() {
        let c: Counts = Arc::default();
        {
            let mut b = Busy { held: Vec::new() };
            b.hold(&c, "s");
            b.hold(&c, "s");
            assert_eq!(lock(&c).get("s"), Some(&2));
        }
        assert!(lock(&c).is_empty());
    }

    #[test]
    fn ended_requests_are_pruned_once_a_minute() {
        let last = std::sync::atomic::AtomicI64::new(1_000);
        assert!(!prune_due(&last, 30_000));
        assert!(prune_due(&last, 61_000));
        assert!(!prune_due(&last, 61_001), "once per minute");
        assert!(prune_due(&last, 121_000));
    }

    #[test]
    fn a_snapshot_keeps_no_secret_value() {
        let req: CreateSandbox = serde_json::from_value(serde_json::json!({
            "template": "base",
            "secrets": [{"name": "gh", "value": "s3cret-value", "hosts": ["api.github.com"]}],
        }))
        .unwrap();
        assert_eq!(req.secrets.len(), 1);
        let kept = snapshot_request(req);
        assert!(!kept.contains("s3cret-value"), "{kept}");
        assert!(kept.contains("base"), "{kept}");
    }

    #[test]
    fn a_memory_snapshot_is_refused_with_the_reason() {
        assert!(MEMORY_REFUSAL.contains("filesystem only"));
        assert!(MEMORY_REFUSAL.contains("microVM"));
    }
}
