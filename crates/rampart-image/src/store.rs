//! The layer store under `<data>/images/`.
//!
//! ```text
//! images/
//!   lock                      flock(2): builds, rm and gc take it exclusively
//!   layers/<key>/fs/          a layer: a directory in overlayfs format (whiteouts are 0/0
//!                             character devices, opaque directories carry
//!                             trusted.overlay.opaque=y), owners as seen inside (root = 0)
//!   layers/<key>/layer.json   what made it, when, its size
//!   manifests/<id>.json       a template: ordered layer keys (bottom first) + metadata;
//!                             id = SHA-256 of this file's bytes
//!   names/<name>.json         name -> id
//!   tmp/                      layers being made (renamed into layers/ when complete)
//!   pins/<sandbox>.json       layers a sandbox uses and its directory: gc keeps them while
//!                             that directory exists
//!   build/ cache/             the build sandboxes' jail state
//! ```
//!
//! A layer's key is the cache key of what made it (see [`crate::build`]); a layer never
//! changes once renamed into place.

use crate::digest::{is_hex64, sha256_hex};
use crate::spec::StartSpec;
use crate::{io, ImageError};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The current manifest schema.
pub const SCHEMA: u32 = 1;

/// A template's metadata: what sandboxes of it start with.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TemplateConfig {
    /// Default user of execs and file operations (none: the agent's default, `user`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Default working directory of execs (none: the user's home).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    /// Environment of every process.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Started at create.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<StartSpec>,
    /// The isolation tier its sandboxes run on unless their create names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<rampart_types::Tier>,
}

/// A template: ordered layers and metadata. Its id is the SHA-256 of its JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// [`SCHEMA`].
    pub schema: u32,
    /// Layer keys, bottom first.
    pub layers: Vec<String>,
    /// Metadata.
    pub config: TemplateConfig,
    /// A built-in template the layers stack on (`base`: its root file system and the host's
    /// `/usr` under them); none: the layers are the whole root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
}

impl Manifest {
    /// The canonical bytes (the id is their digest).
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
    /// The template id.
    pub fn id(&self) -> String {
        sha256_hex(&self.to_bytes())
    }
}

/// What made a layer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LayerInfo {
    /// Its key.
    pub key: String,
    /// A description of the step or source.
    pub source: String,
    /// When it was made (RFC 3339).
    pub created_at: String,
    /// Bytes of file content.
    pub size_bytes: u64,
}

/// A name's record.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NameRecord {
    /// The name.
    pub name: String,
    /// The template id.
    pub id: String,
    /// When the name was (last) set.
    pub created_at: String,
    /// The build that set it (E2B's `buildID`), if a build through the API did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build: Option<String>,
}

/// One template as listed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TemplateEntry {
    /// Name.
    pub name: String,
    /// Id (manifest digest).
    pub id: String,
    /// When built.
    pub created_at: String,
    /// Layer keys, bottom first.
    pub layers: Vec<String>,
    /// Sum of the layers' sizes.
    pub size_bytes: u64,
    /// Metadata.
    pub config: TemplateConfig,
}

/// What [`Store::gc`] removed.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct GcReport {
    /// Layers removed.
    pub layers: Vec<String>,
    /// Manifests removed (no name points at them).
    pub manifests: Vec<String>,
    /// Bytes of layer content freed.
    pub bytes: u64,
}

/// The store.
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
}

/// An exclusive hold on the store's lock; released on drop.
#[derive(Debug)]
pub struct StoreLock {
    _f: std::fs::File,
}

/// A temporary directory under `images/tmp/`, removed on drop unless kept.
#[derive(Debug)]
pub struct TmpDir {
    path: PathBuf,
}

impl TmpDir {
    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TmpDir {
    fn drop(&mut self) {
        let _ = remove_tree(&self.path);
    }
}

/// Removes a directory tree (making directories writable first, as a layer may hold
/// read-only ones); missing is fine.
pub fn remove_tree(p: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(_) => {
            chmod_dirs(p);
            match std::fs::remove_dir_all(p) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                r => r,
            }
        }
    }
}

fn chmod_dirs(p: &Path) {
    if let Ok(md) = std::fs::symlink_metadata(p) {
        if md.is_dir() {
            let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o700));
            if let Ok(rd) = std::fs::read_dir(p) {
                for e in rd.flatten() {
                    chmod_dirs(&e.path());
                }
            }
        }
    }
}

/// Now, RFC 3339.
pub fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// Makes directory `p` (with its missing parents when `parents`) with mode 0700, whatever
/// the umask; an existing one is left as it is.
fn private_dir(p: &Path, parents: bool) -> Result<(), ImageError> {
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new()
        .recursive(parents)
        .mode(0o700)
        .create(p)
        .map_err(io(format!("mkdir {}", p.display())))
}

/// Writes a new file of mode 0600 (the store's own records; never readable by other users,
/// whatever the umask), replacing an old one.
fn write_private(p: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(p)?;
    f.write_all(data)
}

/// Opens (creating, mode 0600) a lock file.
fn open_lock(p: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(p)
}

/// Writes a file atomically (temp + rename), mode 0600.
fn write_atomic(p: &Path, data: &[u8]) -> Result<(), ImageError> {
    let tmp = p.with_extension(format!("tmp.{}", std::process::id()));
    write_private(&tmp, data).map_err(io(format!("write {}", tmp.display())))?;
    std::fs::rename(&tmp, p).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io(format!("rename {}", p.display()))(e)
    })
}

/// Bytes of regular file content under `p` (hard links counted once per name).
pub fn tree_size(p: &Path) -> u64 {
    let mut n = 0;
    if let Ok(rd) = std::fs::read_dir(p) {
        for e in rd.flatten() {
            if let Ok(md) = e.path().symlink_metadata() {
                if md.is_dir() {
                    n += tree_size(&e.path());
                } else if md.is_file() {
                    n += md.size();
                }
            }
        }
    }
    n
}

/// The key of the skeleton layer at the bottom of every template: the mount points the
/// jail needs (`proc`, `dev`, `sys`, `tmp`, ...), overridden by anything above.
pub fn skeleton_key() -> String {
    sha256_hex(b"rampart skeleton layer v1")
}

impl Store {
    /// Opens (creating) the store of the data directory `data`. `layers/` and `tmp/` (where
    /// layers are made) are mode 0700: layers keep the images' owners and modes, so a
    /// setuid-root program of an image (or one a build step made) is a setuid-root file on
    /// the host; host users must not reach it. The jailer binds and stacks layers as host
    /// root; `build/` (a build sandbox's own directory, which its user namespace walks)
    /// stays reachable.
    ///
    /// Everything the store makes for itself (its directories, manifests, names, pins, layer
    /// records, locks) is private to the daemon (0700, 0600) whatever the umask; a layer's
    /// content (`layers/<key>/fs/`) keeps the modes its maker gave it, for sandboxes to read.
    pub fn open(data: &Path) -> Result<Store, ImageError> {
        let root = data.join("images");
        for d in ["layers", "manifests", "names", "tmp", "pins"] {
            let p = root.join(d);
            private_dir(&p, true)?;
        }
        for d in ["layers", "tmp"] {
            let p = root.join(d);
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o700))
                .map_err(io(format!("chmod {}", p.display())))?;
        }
        Ok(Store { root })
    }

    /// Opens the store only if it exists (no directories are created).
    pub fn open_existing(data: &Path) -> Option<Store> {
        let root = data.join("images");
        root.join("manifests").is_dir().then_some(Store { root })
    }

    /// `<data>/images`.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Takes the store's lock (builds, rm, gc); fails at once if another process holds it.
    pub fn lock(&self) -> Result<StoreLock, ImageError> {
        let p = self.root.join("lock");
        let f = open_lock(&p).map_err(io(format!("open {}", p.display())))?;
        // SAFETY: flock on an fd we own.
        let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            return Err(ImageError::Locked(p.display().to_string()));
        }
        Ok(StoreLock { _f: f })
    }

    /// Takes `pins.lock` with flock operation `op` (blocking).
    fn pins_lock(&self, op: libc::c_int) -> Result<StoreLock, ImageError> {
        let p = self.root.join("pins.lock");
        let f = open_lock(&p).map_err(io(format!("open {}", p.display())))?;
        // SAFETY: flock on an fd we own.
        if unsafe { libc::flock(f.as_raw_fd(), op) } != 0 {
            return Err(io(format!("lock {}", p.display()))(
                std::io::Error::last_os_error(),
            ));
        }
        Ok(StoreLock { _f: f })
    }

    /// A shared hold that keeps [`Store::gc`] from choosing what to remove: a create takes
    /// it before it resolves a template and keeps it until its sandbox's directory exists
    /// (a [`Store::pin`] counts only then), so that gc never removes the layers in between
    /// (gc holds it only while it picks and moves layers aside, not while it deletes them).
    pub fn pin_guard(&self) -> Result<StoreLock, ImageError> {
        self.pins_lock(libc::LOCK_SH)
    }

    /// Removes what an interrupted build left in `tmp/` (call with the lock held).
    pub fn clean_tmp(&self) {
        // A step's disk a killed build left mounted: unmounted first (its loop device then
        // detaches), so nothing is removed through it.
        crate::step_disk::unmount_under(&self.root.join("tmp"));
        if let Ok(rd) = std::fs::read_dir(self.root.join("tmp")) {
            for e in rd.flatten() {
                let _ = remove_tree(&e.path());
            }
        }
    }

    /// A fresh temporary directory (removed on drop).
    pub fn tmp_dir(&self, label: &str) -> Result<TmpDir, ImageError> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let p = self.root.join("tmp").join(format!(
            "{label}.{}.{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        private_dir(&p, false)?;
        Ok(TmpDir { path: p })
    }

    /// The directory of layer `key` (its `fs/`).
    pub fn layer_fs(&self, key: &str) -> PathBuf {
        self.root.join("layers").join(key).join("fs")
    }

    /// Whether layer `key` is complete in the store.
    pub fn has_layer(&self, key: &str) -> bool {
        self.root
            .join("layers")
            .join(key)
            .join("layer.json")
            .is_file()
    }

    /// The record of layer `key`.
    pub fn layer_info(&self, key: &str) -> Option<LayerInfo> {
        let b = std::fs::read(self.root.join("layers").join(key).join("layer.json")).ok()?;
        serde_json::from_slice(&b).ok()
    }

    /// Moves a finished layer (`fs`, a directory on the store's file system) into place as
    /// `key`. If another build made the same layer meanwhile, that one is kept.
    pub fn commit_layer(&self, fs: &Path, key: &str, source: &str) -> Result<(), ImageError> {
        if !is_hex64(key) {
            return Err(ImageError::Corrupt(format!("bad layer key {key:?}")));
        }
        if self.has_layer(key) {
            return Ok(());
        }
        let staging = self.tmp_dir(&format!("commit-{}", &key[..12]))?;
        let sfs = staging.path().join("fs");
        std::fs::rename(fs, &sfs).map_err(io(format!("move {}", fs.display())))?;
        let info = LayerInfo {
            key: key.to_owned(),
            source: source.to_owned(),
            created_at: now_rfc3339(),
            size_bytes: tree_size(&sfs),
        };
        write_private(
            &staging.path().join("layer.json"),
            &serde_json::to_vec_pretty(&info).unwrap_or_default(),
        )
        .map_err(io("write layer.json"))?;
        let dest = self.root.join("layers").join(key);
        // A half-made directory (no layer.json: impossible through this path, but a crash
        // of an older version) is replaced.
        let _ = remove_tree(&dest);
        std::fs::rename(staging.path(), &dest)
            .map_err(io(format!("rename layer into {}", dest.display())))?;
        Ok(())
    }

    /// Makes the skeleton layer if missing; returns its key.
    pub fn ensure_skeleton(&self) -> Result<String, ImageError> {
        let key = skeleton_key();
        if self.has_layer(&key) {
            return Ok(key);
        }
        let t = self.tmp_dir("skeleton")?;
        let fs = t.path().join("fs");
        for (d, mode) in [
            ("", 0o755),
            ("proc", 0o555),
            ("dev", 0o755),
            ("sys", 0o555),
            ("tmp", 0o1777),
            ("run", 0o755),
            ("etc", 0o755),
            ("root", 0o700),
            ("home", 0o755),
        ] {
            let p = fs.join(d);
            std::fs::create_dir_all(&p).map_err(io(format!("mkdir {}", p.display())))?;
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode))
                .map_err(io(format!("chmod {}", p.display())))?;
        }
        self.commit_layer(&fs, &key, "rampart skeleton (mount points)")?;
        Ok(key)
    }

    /// Stores a manifest; returns its id.
    pub fn put_manifest(&self, m: &Manifest) -> Result<String, ImageError> {
        let id = m.id();
        let p = self.root.join("manifests").join(format!("{id}.json"));
        if !p.is_file() {
            write_atomic(&p, &m.to_bytes())?;
        }
        Ok(id)
    }

    /// Reads a manifest by id, checking its digest.
    pub fn manifest(&self, id: &str) -> Result<Manifest, ImageError> {
        if !is_hex64(id) {
            return Err(ImageError::Corrupt(format!("bad template id {id:?}")));
        }
        let p = self.root.join("manifests").join(format!("{id}.json"));
        let b = std::fs::read(&p).map_err(io(format!("read {}", p.display())))?;
        if sha256_hex(&b) != id {
            return Err(ImageError::Corrupt(format!(
                "{} does not match its id",
                p.display()
            )));
        }
        serde_json::from_slice(&b).map_err(|e| ImageError::Corrupt(format!("{}: {e}", p.display())))
    }

    /// Points `name` (a name, or `name:tag`, see [`crate::check_ref`]) at template `id`.
    pub fn tag(&self, name: &str, id: &str) -> Result<(), ImageError> {
        self.tag_build(name, id, None)
    }

    /// [`Store::tag`], recording the build that made it.
    pub fn tag_build(&self, name: &str, id: &str, build: Option<&str>) -> Result<(), ImageError> {
        let name = crate::check_ref(name)?;
        let rec = NameRecord {
            name: name.clone(),
            id: id.to_owned(),
            created_at: now_rfc3339(),
            build: build.map(str::to_owned),
        };
        write_atomic(
            &self.root.join("names").join(format!("{name}.json")),
            &serde_json::to_vec_pretty(&rec).unwrap_or_default(),
        )
    }

    /// The record of `name` (a name or `name:tag`; `name:default` is `name`), if it exists.
    pub fn name(&self, name: &str) -> Option<NameRecord> {
        let name = crate::check_ref(name).ok()?;
        let b = std::fs::read(self.root.join("names").join(format!("{name}.json"))).ok()?;
        serde_json::from_slice(&b).ok()
    }

    /// The tags of template `name`: (`default` for the bare name, then `name:TAG`'s tags),
    /// each with its record.
    pub fn tags(&self, name: &str) -> Vec<(String, NameRecord)> {
        let mut out = Vec::new();
        if crate::check_stored_name(name).is_err() {
            return out;
        }
        if let Some(r) = self.name(name) {
            out.push((crate::DEFAULT_TAG.to_owned(), r));
        }
        let prefix = format!("{name}:");
        let Ok(rd) = std::fs::read_dir(self.root.join("names")) else {
            return out;
        };
        let mut tagged = Vec::new();
        for e in rd.flatten() {
            let f = e.file_name().to_string_lossy().into_owned();
            let Some(r) = f.strip_suffix(".json") else {
                continue;
            };
            if let Some(tag) = r.strip_prefix(&prefix) {
                if let Some(rec) = self.name(r) {
                    tagged.push((tag.to_owned(), rec));
                }
            }
        }
        tagged.sort_by(|a, b| a.0.cmp(&b.0));
        out.extend(tagged);
        out
    }

    /// Resolves a name to its id and manifest.
    pub fn resolve(&self, name: &str) -> Result<(String, Manifest), ImageError> {
        let rec = self
            .name(name)
            .ok_or_else(|| ImageError::UnknownTemplate(name.to_owned()))?;
        let m = self.manifest(&rec.id)?;
        Ok((rec.id, m))
    }

    /// The host directories of a manifest's layers, bottom first; fails if one is missing.
    pub fn layer_paths(&self, m: &Manifest) -> Result<Vec<PathBuf>, ImageError> {
        m.layers
            .iter()
            .map(|k| {
                if self.has_layer(k) {
                    Ok(self.layer_fs(k))
                } else {
                    Err(ImageError::Corrupt(format!("layer {k} is missing")))
                }
            })
            .collect()
    }

    /// Every named template, sorted by name.
    pub fn list(&self) -> Vec<TemplateEntry> {
        let mut out = Vec::new();
        let Ok(rd) = std::fs::read_dir(self.root.join("names")) else {
            return out;
        };
        for e in rd.flatten() {
            let f = e.file_name().to_string_lossy().into_owned();
            let Some(name) = f.strip_suffix(".json") else {
                continue;
            };
            let Some(rec) = self.name(name) else { continue };
            let Ok(m) = self.manifest(&rec.id) else {
                continue;
            };
            let size_bytes = m
                .layers
                .iter()
                .filter_map(|k| self.layer_info(k))
                .map(|i| i.size_bytes)
                .sum();
            out.push(TemplateEntry {
                name: rec.name,
                id: rec.id,
                created_at: rec.created_at,
                layers: m.layers,
                size_bytes,
                config: m.config,
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// Removes a name or `name:tag` (its manifest and layers stay until [`Store::gc`]).
    pub fn remove(&self, name: &str) -> Result<(), ImageError> {
        if self.name(name).is_none() {
            return Err(ImageError::UnknownTemplate(name.to_owned()));
        }
        let name = crate::check_ref(name)?;
        let p = self.root.join("names").join(format!("{name}.json"));
        std::fs::remove_file(&p).map_err(io(format!("remove {}", p.display())))
    }

    /// Records that the sandbox `sandbox`, whose directory is `sandbox_dir`, uses `layers`:
    /// [`Store::gc`] keeps them while that directory exists (a destroyed sandbox's pin is
    /// pruned by the next gc).
    pub fn pin(
        &self,
        sandbox: &str,
        sandbox_dir: &Path,
        layers: &[String],
    ) -> Result<(), ImageError> {
        let dir = self.root.join("pins");
        private_dir(&dir, true)?;
        let v = serde_json::json!({"sandbox_dir": sandbox_dir, "layers": layers});
        write_atomic(
            &dir.join(format!("{sandbox}.json")),
            &serde_json::to_vec(&v).unwrap_or_default(),
        )
    }

    /// The directories of the layers pinned for `sandbox` at its create, in the manifest's
    /// order (None without a pin): what its root is made of, even after its template's
    /// name was rebuilt or removed.
    pub fn pinned_layers(&self, sandbox: &str) -> Option<Vec<PathBuf>> {
        #[derive(Deserialize)]
        struct Pin {
            layers: Vec<String>,
        }
        if sandbox.is_empty() || sandbox.contains(['/', '.']) {
            return None;
        }
        let b = std::fs::read(self.root.join("pins").join(format!("{sandbox}.json"))).ok()?;
        let pin: Pin = serde_json::from_slice(&b).ok()?;
        Some(pin.layers.iter().map(|k| self.layer_fs(k)).collect())
    }

    /// Layers pinned by live sandboxes; removes the pins of gone ones.
    fn live_pins(&self) -> BTreeSet<String> {
        #[derive(Deserialize)]
        struct Pin {
            sandbox_dir: PathBuf,
            layers: Vec<String>,
        }
        let mut keep = BTreeSet::new();
        let Ok(rd) = std::fs::read_dir(self.root.join("pins")) else {
            return keep;
        };
        for e in rd.flatten() {
            let pin: Option<Pin> = std::fs::read(e.path())
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok());
            match pin {
                Some(p) if p.sandbox_dir.exists() => keep.extend(p.layers),
                _ => {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        keep
    }

    /// Removes manifests no name points at and layers no remaining manifest or live
    /// sandbox (see [`Store::pin`]) uses (call with the lock held). Layers are first renamed into `tmp/` so that a crash mid-removal
    /// leaves no half layer under `layers/`.
    pub fn gc(&self) -> Result<GcReport, ImageError> {
        let guard = self.pins_lock(libc::LOCK_EX)?;
        let mut rep = GcReport::default();
        let named: BTreeSet<String> = std::fs::read_dir(self.root.join("names"))
            .map_err(io("read names"))?
            .flatten()
            .filter_map(|e| {
                let f = e.file_name().to_string_lossy().into_owned();
                self.name(f.strip_suffix(".json")?).map(|r| r.id)
            })
            .collect();
        let mut keep: BTreeSet<String> = self.live_pins();
        let mut graves = Vec::new();
        for e in std::fs::read_dir(self.root.join("manifests"))
            .map_err(io("read manifests"))?
            .flatten()
        {
            let f = e.file_name().to_string_lossy().into_owned();
            let Some(id) = f.strip_suffix(".json") else {
                continue;
            };
            if named.contains(id) {
                if let Ok(m) = self.manifest(id) {
                    keep.extend(m.layers);
                }
            } else {
                std::fs::remove_file(e.path()).map_err(io(format!("remove manifest {id}")))?;
                rep.manifests.push(id.to_owned());
            }
        }
        for e in std::fs::read_dir(self.root.join("layers"))
            .map_err(io("read layers"))?
            .flatten()
        {
            let key = e.file_name().to_string_lossy().into_owned();
            if keep.contains(&key) {
                continue;
            }
            rep.bytes += self.layer_info(&key).map(|i| i.size_bytes).unwrap_or(0);
            let grave = self.root.join("tmp").join(format!("gc-{key}"));
            std::fs::rename(e.path(), &grave).map_err(io(format!("move layer {key}")))?;
            graves.push(grave);
            rep.layers.push(key);
        }
        drop(guard);
        for g in graves {
            remove_tree(&g).map_err(io(format!("remove {}", g.display())))?;
        }
        rep.layers.sort();
        rep.manifests.sort();
        Ok(rep)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
    }

    /// The store's own files and directories are private whatever the umask (022 in tests as
    /// a rule); a layer's content keeps the modes its maker gave it.
    #[test]
    fn the_stores_own_records_are_private() {
        let d = tempfile::tempdir().unwrap();
        let data = d.path().join("data");
        let s = Store::open(&data).unwrap();
        for dir in ["", "layers", "manifests", "names", "tmp", "pins"] {
            assert_eq!(mode(&s.root().join(dir)), 0o700, "images/{dir}");
        }
        drop(s.lock().unwrap());
        drop(s.pin_guard().unwrap());
        let key = s.ensure_skeleton().unwrap();
        let id = s
            .put_manifest(&Manifest {
                schema: SCHEMA,
                layers: vec![key.clone()],
                config: TemplateConfig::default(),
                base: None,
            })
            .unwrap();
        s.tag("t", &id).unwrap();
        s.pin("sbx", d.path(), std::slice::from_ref(&key)).unwrap();
        for f in [
            "lock".to_owned(),
            "pins.lock".to_owned(),
            format!("manifests/{id}.json"),
            "names/t.json".to_owned(),
            "pins/sbx.json".to_owned(),
            format!("layers/{key}/layer.json"),
        ] {
            assert_eq!(mode(&s.root().join(&f)), 0o600, "images/{f}");
        }
        assert_eq!(mode(&s.root().join("layers").join(&key)), 0o700);
        let fs = s.layer_fs(&key);
        assert_eq!(mode(&fs), 0o755);
        assert_eq!(mode(&fs.join("tmp")), 0o1777);
        assert_eq!(mode(&fs.join("root")), 0o700);
    }
}
