//! Snapshots, fork and volumes: the persistence service (see `docs/persistence.md`). It owns
//! its tables of `state.db` and which snapshots and volumes creates are using; the tier, the
//! state store and a source's record come in as arguments, and the coordinator (`sandbox/`)
//! holds a sandbox's operation lock around a consistent point and runs fork's creates.
//!
//! - A **snapshot** is a consistent copy of a sandbox's writable disk (the tier freezes the
//!   sandbox, flushes its filesystem, clones the image, thaws: [`crate::Disks::snapshot_disk`])
//!   kept as `<store>/snapshots/<name>/disk.img`, with a row in `state.db` (source, template,
//!   uid range, limits, env, the source's create request). It is made under a temporary name
//!   and renamed into place, so a failed or interrupted snapshot leaves nothing but a
//!   `.tmp-*` directory that the next start removes. Memory is not kept (this tier has no
//!   process checkpoint): `memory: true` is refused with the reason.
//! - **Create from a snapshot** fills the template (and unset limits) from the snapshot and
//!   launches on a clone of its image ([`crate::Disks::launch_with`]).
//! - **Fork** takes one consistent point of the source (a hidden snapshot `.fork-*` that
//!   lives for the duration of the call) and creates N sandboxes from it through the normal
//!   create path with the source's create request (template, limits, env, metadata, network
//!   policy, volumes, ...): each has a fresh id, host name, machine id, tokens and addresses.
//!   If one of them fails, those already made are destroyed.
//! - A **volume** is an ext4 image `<store>/volumes/<name>.img` (its size is its quota)
//!   with a row in `state.db`; mounted at create, outliving sandboxes. It cannot be removed
//!   while a sandbox has it mounted (its loop device is attached) or a create using it runs.

use crate::isolation::{DiskSource, Isolation, LaunchExtras, VolumeSpec};
use crate::util::lock;
use crate::CoreError;
use rampart_store::keys::random_hex;
use rampart_store::persist::{PersistStore, SnapshotRow};
use rampart_store::{now_ms, SandboxRecord, SandboxStore, StoreError};
use rampart_types::{
    CreateSandbox, CreateSnapshot, CreateVolume, Limits, LimitsRequest, SandboxId, SnapshotInfo,
    VolumeInfo,
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

/// Most sandboxes one fork call makes (E2B's limit too).
pub const MAX_FORK: u32 = 20;
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

/// Keeps snapshots and volumes marked busy while a create (or a volume file call) uses
/// them.
#[derive(Debug, Default)]
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

/// Checks a snapshot or volume name as a caller gives it: 1 to 64 of letters, digits, `.`,
/// `_`, `-`, starting with a letter or digit.
pub fn check_plain_name(field: &str, name: &str) -> Result<(), CoreError> {
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

/// Checks a snapshot or volume name as stored: a plain name ([`check_plain_name`]), or a
/// tenant's, `<tenant>:<plain name>` (see [`crate::principal`]).
pub fn check_name(field: &str, name: &str) -> Result<(), CoreError> {
    match name.split_once(':') {
        Some((tenant, plain)) => {
            rampart_types::tenant::check_tenant_name(tenant).map_err(|m| bad(field, m))?;
            check_plain_name(field, plain)
        }
        None => check_plain_name(field, name),
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

/// The file, in a snapshot's (or fork point's) directory, naming where its state came from:
/// the source, its chain head at the point, the digest of the saved processes (see
/// `sandbox::fork`).
pub(crate) const LINEAGE: &str = "lineage.json";

/// Whether the snapshot in `dir` kept its sandbox's processes (its lineage names their
/// digest).
fn kept_memory(dir: &Path) -> bool {
    std::fs::read(dir.join(LINEAGE))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .is_some_and(|v| v["checkpoint_digest"].is_string())
}

/// The API view of a snapshot; `root`: the tier's store, where it says whether the snapshot
/// kept memory.
fn snapshot_info(r: &SnapshotRow, root: Option<&Path>) -> SnapshotInfo {
    SnapshotInfo {
        name: r.name.clone(),
        source: r.source.clone(),
        template: r.template.clone(),
        memory: root.is_some_and(|root| kept_memory(&root.join("snapshots").join(&r.name))),
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
        // (The request itself is written with the sandbox's row: `NewSandbox::request`.)
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

/// What [`Persist::prepare_create`] found.
#[derive(Debug)]
pub(crate) struct Staged {
    extras: LaunchExtras,
    request: String,
    /// Marks the snapshot and volumes busy until the create ends.
    busy: Busy,
}

impl Staged {
    /// The create request as kept for fork (secret values included: it lives only as long
    /// as its sandbox).
    pub(crate) fn request(&self) -> &str {
        &self.request
    }

    /// Nothing staged beyond the request: no disk source, no volumes.
    pub(crate) fn is_plain(&self) -> bool {
        self.extras.is_empty()
    }
}

fn fill_limits(req: &mut LimitsRequest, l: &Limits) {
    req.cpus.get_or_insert(l.cpus);
    req.memory_bytes.get_or_insert(l.memory_bytes);
    req.pids.get_or_insert(l.pids);
    req.disk_bytes.get_or_insert(l.disk_bytes);
    req.open_files.get_or_insert(l.open_files);
}

/// The create request a snapshot row keeps: the source's, without its secrets (a snapshot
/// outlives its sandbox; the secret values given at its create must not).
fn snapshot_request(mut req: CreateSandbox) -> String {
    req.secrets.clear();
    if let Some(p) = req.network.as_mut().and_then(|n| n.upstream_proxy.as_mut()) {
        p.password = None;
    }
    serde_json::to_string(&req).unwrap_or_default()
}

/// A fork's consistent point: a hidden snapshot (`.fork-*`) that creates can name from
/// [`Persist::take_fork_point`] to [`Persist::release`].
#[derive(Debug)]
pub(crate) struct ForkPoint {
    name: String,
    dir: PathBuf,
    image: PathBuf,
}

impl ForkPoint {
    /// The hidden snapshot name a create gives to start from this point.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Its directory (under the tier's `snapshots/`).
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }
}

/// Checks a fork of `count` sandboxes on this tier and names its consistent point (nothing
/// is taken yet).
pub(crate) fn fork_point(iso: &dyn Isolation, count: u32) -> Result<ForkPoint, CoreError> {
    if count == 0 || count > MAX_FORK {
        return Err(bad("count", format!("must be 1 to {MAX_FORK}")));
    }
    let root = iso
        .store_root()
        .ok_or_else(|| CoreError::Unsupported(format!("the {} tier cannot fork", iso.name())))?;
    let name = format!(".fork-{}", random_hex(16));
    let dir = root.join("snapshots").join(&name);
    let image = iso.disks()?.snapshot_image(&dir)?;
    Ok(ForkPoint { name, dir, image })
}

impl Persist {
    /// Resolves a create's `snapshot` (fills the template and unset limits from it) and
    /// `volumes` (they must exist) on tier `iso`; marks them busy until the returned value
    /// is dropped.
    pub(crate) fn prepare_create(
        &self,
        iso: &dyn Isolation,
        req: &mut CreateSandbox,
    ) -> Result<Staged, CoreError> {
        let mut extras = LaunchExtras::default();
        let mut busy = Busy { held: Vec::new() };
        let needs_store = req.snapshot.is_some() || !req.volumes.is_empty();
        let root = iso.store_root();
        if needs_store && root.is_none() {
            return Err(CoreError::Unsupported(format!(
                "the {} tier has no snapshots or volumes",
                iso.name()
            )));
        }
        if let (Some(name), Some(root)) = (req.snapshot.clone(), root.as_ref()) {
            let found = lock(&self.hidden)
                .get(&name)
                .map(|(row, img)| (row.clone(), img.clone()));
            let (row, image) = match found {
                Some(x) => x,
                None => {
                    check_name("snapshot", &name)?;
                    let row = self
                        .db
                        .snapshot(&name)
                        .map_err(CoreError::from)?
                        .ok_or_else(|| bad("snapshot", format!("no snapshot named {name:?}")))?;
                    (
                        row,
                        iso.disks()?
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
            busy.hold(&self.busy_snapshots, &name);
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
                // Checked and marked busy under one lock, which delete_volume holds from its
                // own checks to the row's removal: a volume is either removed or mounted,
                // never both.
                let mut m = lock(&self.busy_volumes);
                if self.db.volume(&v.name).map_err(CoreError::from)?.is_none() {
                    return Err(bad("volumes.name", format!("no volume named {:?}", v.name)));
                }
                busy.hold_locked(&mut m, &self.busy_volumes, &v.name);
            }
            extras.volumes.push(VolumeSpec {
                image: iso.volumes()?.volume_image(&v.name)?,
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

    /// The approval policy sandbox `id` was created with (from its kept create request).
    pub(crate) fn approval_policy(
        &self,
        id: &SandboxId,
    ) -> Result<Option<rampart_types::ApprovalPolicy>, CoreError> {
        let Some(text) = self.db.request(id.as_str())? else {
            return Ok(None);
        };
        let req: CreateSandbox = serde_json::from_str(&text).map_err(|e| {
            CoreError::Internal(format!(
                "the create request kept for sandbox {id} does not parse ({e}); its approval \
                 policy cannot be read, so nothing it asks to run is started"
            ))
        })?;
        Ok(req.approvals)
    }

    /// The `artifacts` paths sandbox `id` was created with (from its kept create request);
    /// none when it kept no request. A request that does not parse is an error: the caller
    /// records that nothing could be kept rather than pretend nothing was asked.
    pub(crate) fn artifact_paths(&self, id: &SandboxId) -> Result<Vec<String>, CoreError> {
        let Some(text) = self.db.request(id.as_str())? else {
            return Ok(Vec::new());
        };
        let req: CreateSandbox = serde_json::from_str(&text).map_err(|e| {
            CoreError::Internal(format!(
                "the create request kept for sandbox {id} does not parse ({e}); its artifacts \
                 cannot be named"
            ))
        })?;
        Ok(req.artifacts)
    }

    /// The request a sandbox was created with (or one rebuilt from its record).
    pub(crate) fn source_request(&self, rec: &SandboxRecord) -> CreateSandbox {
        let kept = self
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

    /// The tier snapshot `name` was taken on, when its row says (fork points and snapshots
    /// taken before the tier was kept say nothing). A cheap read of one row.
    pub(crate) fn snapshot_tier(&self, name: &str) -> Option<rampart_types::Tier> {
        if name.starts_with('.') {
            return None;
        }
        let row = self.db.snapshot(name).ok()??;
        serde_json::from_str::<CreateSandbox>(&row.request)
            .ok()?
            .isolation
    }

    /// Checks a snapshot of sandbox `id` before it is taken: memory refused unless its tier keeps it (`keeps_memory`), the name (given
    /// or made) valid and free, tier `iso` able to. Returns the name and the tier's store.
    pub(crate) fn snapshot_target(
        &self,
        iso: &dyn Isolation,
        id: &SandboxId,
        req: &CreateSnapshot,
        keeps_memory: bool,
    ) -> Result<(String, PathBuf), CoreError> {
        if req.memory && !keeps_memory {
            return Err(bad("memory", MEMORY_REFUSAL));
        }
        let name = req
            .name
            .clone()
            .unwrap_or_else(|| format!("{id}-{}", random_hex(4)));
        check_name("name", &name)?;
        let root = iso.store_root().ok_or_else(|| {
            CoreError::Unsupported(format!("the {} tier cannot snapshot sandboxes", iso.name()))
        })?;
        if self.db.snapshot(&name).map_err(CoreError::from)?.is_some() {
            return Err(bad("name", format!("a snapshot named {name:?} exists")));
        }
        Ok((name, root))
    }

    /// Takes snapshot `name` of the sandbox of `rec` (running or paused, its operation lock
    /// held by the caller; `uid_base` its first host uid) into `root/snapshots`: `take`
    /// fills the directory it is given (which does not exist yet; see [`take_point`]) and
    /// returns the bytes it holds.
    pub(crate) async fn take_snapshot(
        &self,
        take: impl FnOnce(PathBuf) -> TakePoint,
        rec: &SandboxRecord,
        uid_base: u32,
        name: &str,
        root: &Path,
    ) -> Result<SnapshotInfo, CoreError> {
        let id = &rec.id;
        let mut source = self.source_request(rec);
        // A create from it runs on its tier.
        source.isolation = Some(rec.isolation);
        let request = snapshot_request(source);
        let dir = root.join("snapshots");
        let tmp = dir.join(format!(".tmp-{name}-{}", random_hex(4)));
        let dest = dir.join(name);
        let size = take(tmp.clone()).await?;
        if let Err(e) = crate::isolation::rename_noreplace(&tmp, &dest) {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(bad(
                "name",
                format!("a snapshot named {name:?} exists ({e})"),
            ));
        }
        let row = SnapshotRow {
            name: name.to_owned(),
            source: id.to_string(),
            template: rec.template.clone(),
            uid_base,
            limits: serde_json::to_string(&rec.limits).unwrap_or_default(),
            env: serde_json::to_string(&rec.env).unwrap_or_default(),
            request,
            size_bytes: size,
            created_at_ms: now_ms(),
        };
        if let Err(e) = self.db.insert_snapshot(&row) {
            let _ = std::fs::remove_dir_all(&dest);
            return Err(match e {
                StoreError::Duplicate(_) => {
                    bad("name", format!("a snapshot named {name:?} exists"))
                }
                e => CoreError::from(e),
            });
        }
        info!(id = %id, name, size, "snapshot taken");
        // Whether it kept memory is known once its lineage is written (the caller's).
        Ok(snapshot_info(&row, None))
    }

    /// Every snapshot, oldest first (`root`: the tier's store).
    pub(crate) fn snapshots(&self, root: Option<&Path>) -> Result<Vec<SnapshotInfo>, CoreError> {
        Ok(self
            .db
            .snapshots()
            .map_err(CoreError::from)?
            .iter()
            .map(|r| snapshot_info(r, root))
            .collect())
    }

    /// One snapshot (`root`: the tier's store).
    pub(crate) fn snapshot(
        &self,
        name: &str,
        root: Option<&Path>,
    ) -> Result<SnapshotInfo, CoreError> {
        check_name("name", name)?;
        self.db
            .snapshot(name)
            .map_err(CoreError::from)?
            .map(|r| snapshot_info(&r, root))
            .ok_or_else(|| CoreError::NotFound(format!("snapshot {name}")))
    }

    /// Removes a snapshot and its image on tier `iso`. Refused (409) while a create is
    /// cloning it.
    pub(crate) async fn delete_snapshot(
        &self,
        iso: &Arc<dyn Isolation>,
        name: &str,
    ) -> Result<(), CoreError> {
        check_name("name", name)?;
        if lock(&self.busy_snapshots).contains_key(name) {
            return Err(CoreError::WrongState {
                id: format!("snapshot {name}"),
                state: "in use by a create".into(),
            });
        }
        if !self.db.delete_snapshot(name).map_err(CoreError::from)? {
            return Err(CoreError::NotFound(format!("snapshot {name}")));
        }
        if let Some(root) = iso.store_root() {
            let dir = root.join("snapshots").join(name);
            let gone = dir.with_file_name(format!(".tmp-rm-{name}-{}", random_hex(4)));
            if std::fs::rename(&dir, &gone).is_ok() {
                let iso = iso.clone();
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

    /// Takes `point` of the sandbox of `rec` (running or paused, its operation lock held by
    /// the caller; `uid_base` its first host uid); creates can name it until
    /// [`Persist::release`].
    pub(crate) async fn take_fork_point(
        &self,
        take: impl FnOnce(PathBuf) -> TakePoint,
        point: &ForkPoint,
        rec: &SandboxRecord,
        uid_base: u32,
    ) -> Result<(), CoreError> {
        take(point.dir.clone()).await?;
        let row = SnapshotRow {
            name: point.name.clone(),
            source: rec.id.to_string(),
            template: rec.template.clone(),
            uid_base,
            limits: serde_json::to_string(&rec.limits).unwrap_or_default(),
            env: String::new(),
            request: String::new(),
            size_bytes: 0,
            created_at_ms: now_ms(),
        };
        lock(&self.hidden).insert(point.name.clone(), (row, point.image.clone()));
        Ok(())
    }

    /// Forgets a fork's consistent point and removes its image.
    pub(crate) async fn release(&self, point: ForkPoint) {
        lock(&self.hidden).remove(&point.name);
        let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(point.dir)).await;
    }

    /// Checks a new volume before disk admission: name, size, tier `iso` able to, the name
    /// free.
    pub(crate) fn check_new_volume(
        &self,
        iso: &dyn Isolation,
        req: &CreateVolume,
    ) -> Result<(), CoreError> {
        check_name("name", &req.name)?;
        if req.size_mib < 16 || req.size_mib > MAX_VOLUME_MIB {
            return Err(bad(
                "size_mib",
                format!("must be 16 to {MAX_VOLUME_MIB} MiB"),
            ));
        }
        iso.store_root().ok_or_else(|| {
            CoreError::Unsupported(format!("the {} tier has no volumes", iso.name()))
        })?;
        if self
            .db
            .volume(&req.name)
            .map_err(CoreError::from)?
            .is_some()
        {
            return Err(bad("name", format!("a volume named {:?} exists", req.name)));
        }
        Ok(())
    }

    /// Makes the volume `req` (checked by [`Persist::check_new_volume`] and admitted) on tier
    /// `iso`.
    pub(crate) async fn make_volume(
        &self,
        iso: &Arc<dyn Isolation>,
        req: &CreateVolume,
    ) -> Result<VolumeInfo, CoreError> {
        let image = iso.volumes()?.volume_image(&req.name)?;
        let (img2, size, iso) = (image.clone(), req.size_mib, iso.clone());
        let made = tokio::task::spawn_blocking(move || iso.volumes()?.create_volume(&img2, size))
            .await
            .map_err(CoreError::failed("volume"))?
            .map_err(|e| CoreError::isolation(format!("making volume {}", req.name), e))?;
        if made == crate::isolation::NewVolume::Exists {
            return Err(bad("name", format!("a volume named {:?} exists", req.name)));
        }
        let row = match self.db.insert_volume(&req.name, req.size_mib) {
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

    /// Every volume, with what its image uses on tier `iso`.
    pub(crate) fn volumes(&self, iso: &dyn Isolation) -> Result<Vec<VolumeInfo>, CoreError> {
        let root = iso.store_root();
        Ok(self
            .db
            .volumes()
            .map_err(CoreError::from)?
            .into_iter()
            .map(|r| VolumeInfo {
                used_bytes: root
                    .as_ref()
                    .and_then(|_| iso.volumes().ok()?.volume_image(&r.name).ok())
                    .map(|p| crate::isolation::allocated_bytes(&p))
                    .unwrap_or(0),
                name: r.name,
                size_mib: r.size_mib,
                created_at: rfc3339(r.created_at_ms),
            })
            .collect())
    }

    /// Marks the volume `name` busy (its removal is refused while the mark is held) if it
    /// exists: checked and marked under the lock [`Persist::delete_volume`] holds from its
    /// checks to the row's removal.
    pub(crate) fn hold_volume(&self, name: &str) -> Result<Busy, CoreError> {
        check_name("name", name)?;
        let mut m = lock(&self.busy_volumes);
        if self.db.volume(name).map_err(CoreError::from)?.is_none() {
            return Err(CoreError::NotFound(format!("volume {name}")));
        }
        let mut busy = Busy::default();
        busy.hold_locked(&mut m, &self.busy_volumes, name);
        Ok(busy)
    }

    /// Removes a volume and its image on tier `iso`. Refused (409) while a sandbox alive in
    /// `store` has it mounted or a create is about to.
    pub(crate) async fn delete_volume(
        &self,
        iso: &Arc<dyn Isolation>,
        store: &dyn SandboxStore,
        name: &str,
    ) -> Result<(), CoreError> {
        check_name("name", name)?;
        if self.db.volume(name).map_err(CoreError::from)?.is_none() {
            return Err(CoreError::NotFound(format!("volume {name}")));
        }
        let in_use = || CoreError::WrongState {
            id: format!("volume {name}"),
            state: "mounted by a sandbox".into(),
        };
        let mounted_by_alive = || -> Result<bool, CoreError> {
            for rec in store.alive().map_err(CoreError::from)? {
                let Some(r) = self.db.request(rec.id.as_str()).map_err(CoreError::from)? else {
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
        if lock(&self.busy_volumes).contains_key(name) || mounted_by_alive()? {
            return Err(in_use());
        }
        let image = iso
            .store_root()
            .and_then(|_| iso.volumes().ok()?.volume_image(name).ok());
        if let Some(image) = &image {
            // A sandbox just destroyed: its mounts (and so the loop device) go a moment later.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
            while iso.volume_in_use(image) {
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
            let busy = lock(&self.busy_volumes);
            if busy.contains_key(name)
                || mounted_by_alive()?
                || image.as_ref().is_some_and(|i| iso.volume_in_use(i))
            {
                return Err(in_use());
            }
            self.db.delete_volume(name).map_err(CoreError::from)?;
        }
        if let Some(image) = image {
            if let Err(e) = std::fs::remove_file(&image) {
                warn!(name, "removing volume image: {e}");
            }
            let iso = iso.clone();
            let _ = tokio::task::spawn_blocking(move || iso.trim_store()).await;
        }
        info!(name, "volume removed");
        Ok(())
    }
}

/// Takes the consistent point of `id` into the new directory `dir` (`dir/disk.img`); on error
/// nothing of `dir` remains.
/// What fills a consistent point's directory (see [`Persist::take_snapshot`]).
pub(crate) type TakePoint = futures::future::BoxFuture<'static, Result<u64, CoreError>>;

/// Takes a consistent point of sandbox `id`'s disk into the new directory `dir` (the
/// tier's [`crate::Disks::snapshot_disk`]); on error `dir` does not exist.
pub(crate) async fn take_point(
    iso: Arc<dyn Isolation>,
    id: SandboxId,
    dir: PathBuf,
) -> Result<u64, CoreError> {
    let dir = dir.as_path();
    let img = iso.disks()?.snapshot_image(dir)?;
    std::fs::create_dir(dir).map_err(CoreError::io(format!("mkdir {}", dir.display())))?;
    let r = tokio::task::spawn_blocking(move || iso.disks()?.snapshot_disk(&id, &img))
        .await
        .map_err(CoreError::task("snapshot"))
        .and_then(|r| r.map_err(|e| CoreError::isolation("snapshot", e)));
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
