//! The `Isolation` trait: what every isolation tier implements.
//!
//! The manager only talks to a tier through this trait, so a second tier (a microVM) is one
//! more implementation running the same agent. Every method blocks; the manager calls them on
//! a blocking thread.
//!
//! The types of the trait are core's own and say nothing of how a tier isolates: a
//! [`LaunchSpec`] (what to start), a [`Launched`] sandbox (its init's host pid and its agent's
//! socket), [`Usage`], and for persistence a [`LaunchExtras`] ([`DiskSource`],
//! [`VolumeSpec`]). Each tier converts them to its own (the namespace tier in `jail.rs`).
//!
//! The trait is what every tier must do (launch, destroy, usage, leftovers, templates).
//! What only some tiers can do is a capability trait of its own, declared by
//! [`Isolation::capabilities`]: [`Freeze`] (pause with memory kept), [`Disks`] (a sandbox's
//! writable disk, snapshots, launches from a copy), [`Volumes`], [`ColdStop`] (pause to the
//! filesystem). Core asks for one through `dyn Isolation`'s accessors (`freezer()`,
//! `disks()`, `volumes()`, `cold()`), which refuse with [`IsolationError::Unsupported`]
//! naming the tier and what it lacks; a create that needs one (a snapshot to start from,
//! volumes) is refused before anything is made.
//!
//! Where snapshots and volumes are kept is the tier's: the manager names them and asks the
//! tier for their paths ([`Disks::snapshot_image`], [`Volumes::volume_image`]) and for the
//! work on them ([`Volumes::create_volume`], [`Volumes::volume_in_use`],
//! [`Disks::trim_store`]). Only the two directories under [`Disks::store_root`]
//! (`snapshots/<name>/`, `volumes/`) are shared knowledge.
//!
//! Tiers: [`rampart_jail::Jail`] (namespaces, the daemon's), and [`FakeTier`] (a plain child
//! process, for tests and development only).

mod fake;
mod gvisor;
mod jail;
mod tiers;

pub use fake::{FakeTier, FakeTierError};
pub use gvisor::{find_runsc, Gvisor, GvisorConfig, GvisorError};
pub use tiers::Tiers;

use rampart_types::{SandboxId, Tier};
use std::path::{Path, PathBuf};

/// Errors of a tier.
#[derive(Debug, thiserror::Error)]
pub enum IsolationError {
    /// The host lacks a feature the tier needs, or the tier cannot do this; the message
    /// names it.
    #[error("{0}")]
    Unsupported(String),
    /// The namespace tier failed (its error, with its own source).
    #[error(transparent)]
    Jail(rampart_jail::JailError),
    /// The fake tier failed.
    #[error(transparent)]
    Fake(fake::FakeTierError),
    /// The gVisor tier failed.
    #[error(transparent)]
    Gvisor(gvisor::GvisorError),
    /// What the request asks cannot be done on the tier the sandbox runs on (the caller's
    /// choice of tier, a 400 naming `isolation`).
    #[error("{0}")]
    NotOnTier(String),
    /// A request the tier refuses (a 400 naming `field`).
    #[error("{field}: {message}")]
    Refused {
        /// The request's field.
        field: &'static str,
        /// Why.
        message: String,
    },
    /// A template the tier does not know how to build.
    #[error("unknown template {0:?}")]
    UnknownTemplate(String),
    /// A sandbox's template is not built where the launch spec says.
    #[error("template {} is not built", .0.display())]
    TemplateNotBuilt(PathBuf),
}

impl From<IsolationError> for crate::CoreError {
    fn from(e: IsolationError) -> Self {
        crate::CoreError::isolation("the isolation tier", e)
    }
}

// The tier's seam types, once for every tier (the jail takes the same).
pub use rampart_types::launch::{
    DiskSource, InitFile, LaunchExtras, LaunchSpec, Launched, Usage, VolumeSpec,
};

/// What [`Volumes::create_volume`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NewVolume {
    /// The image was made.
    Created,
    /// An image is there already (nothing was changed).
    Exists,
}

/// How a CPU time counter file spells its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuFormat {
    /// One number, nanoseconds (cgroup v1 `cpuacct.usage`).
    Nanoseconds,
    /// A `usage_usec <n>` line among others, microseconds (cgroup v2 `cpu.stat`).
    StatUsageUsec,
}

/// The files holding the counters an exec's audit record reads at its start and end, for a
/// reader that keeps them open and re-reads them from offset 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterFiles {
    /// The sandbox's CPU time.
    pub cpu: PathBuf,
    /// How `cpu` spells it.
    pub cpu_format: CpuFormat,
    /// The sandbox's peak memory in bytes (one number), if the host keeps it.
    pub peak_memory: Option<PathBuf>,
}

/// An isolation tier: what every tier must do. All methods block.
///
/// What only some tiers can do is a capability of its own ([`Freeze`], [`Disks`],
/// [`Volumes`], [`ColdStop`]), declared by [`Isolation::capabilities`] and asked for by
/// core through `dyn Isolation`'s accessors ([`freezer`](trait.Isolation.html#method.freezer)
/// and friends), which refuse with [`IsolationError::Unsupported`] naming the tier and
/// what it lacks. A create that needs a capability (a snapshot to start from, volumes) is
/// refused before anything is made.
pub trait Isolation: Send + Sync + std::fmt::Debug {
    /// Short name of the tier, e.g. `namespace`.
    fn name(&self) -> &'static str;
    /// Whether sandboxes of `tier` can be launched here (by default: the namespace tier's
    /// own, which the fake tier stands in for).
    fn offers(&self, tier: Tier) -> bool {
        tier == Tier::Namespace
    }
    /// Why sandboxes of `tier` cannot be launched here, when they cannot (a sentence naming
    /// what is missing and how to add it).
    fn missing(&self, tier: Tier) -> Option<String> {
        (!self.offers(tier)).then(|| format!("this node has no {tier} isolation tier"))
    }
    /// Builds the template `name` into `dest` (which does not exist yet).
    fn prepare_template(&self, name: &str, dest: &Path) -> Result<(), IsolationError>;
    /// Builds and starts a sandbox; returns once its agent accepts connections.
    /// On error nothing of the sandbox remains.
    fn launch(&self, spec: &LaunchSpec) -> Result<Launched, IsolationError>;
    /// Kills and removes every trace of a sandbox. Idempotent.
    fn destroy(&self, id: &SandboxId) -> Result<(), IsolationError>;
    /// Ids that still have a trace on the host.
    fn leftovers(&self) -> Result<Vec<SandboxId>, IsolationError>;
    /// Resource usage of a sandbox.
    fn usage(&self, id: &SandboxId) -> Result<Usage, IsolationError>;
    /// The counter files of a sandbox (see [`CounterFiles`]), when the tier has such files;
    /// otherwise (the default) the exec record reads [`Isolation::usage`].
    fn counter_files(&self, _id: &SandboxId) -> Option<CounterFiles> {
        None
    }
    /// What the tier can do beyond launching and destroying (none by default).
    fn capabilities(&self) -> Capabilities<'_> {
        Capabilities::default()
    }
    /// Releases what the tier holds for the daemon (pools, helpers) at shutdown. Blocking;
    /// the default does nothing.
    fn shutdown(&self) {}
}

/// The optional capabilities of a tier: each is there or not.
#[derive(Clone, Copy, Default)]
pub struct Capabilities<'a> {
    /// Pause and resume with memory kept.
    pub freeze: Option<&'a dyn Freeze>,
    /// A sandbox's writable disk: reading it, consistent copies, launches from a copy.
    pub disks: Option<&'a dyn Disks>,
    /// Named volumes.
    pub volumes: Option<&'a dyn Volumes>,
    /// Ending a sandbox's processes while keeping its disk, and booting it again.
    pub cold: Option<&'a dyn ColdStop>,
}

impl std::fmt::Debug for Capabilities<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Capabilities")
            .field("freeze", &self.freeze.is_some())
            .field("disks", &self.disks.is_some())
            .field("volumes", &self.volumes.is_some())
            .field("cold", &self.cold.is_some())
            .finish()
    }
}

/// Pause and resume with memory kept (the namespace tier: the cgroup freezer).
pub trait Freeze: Send + Sync {
    /// Freezes every process of a sandbox (pause): returns once they are all frozen.
    /// Frozen processes use no CPU and keep their memory. Idempotent.
    fn freeze(&self, id: &SandboxId) -> Result<(), IsolationError>;
    /// Thaws a frozen sandbox (resume): every process continues where it was. Idempotent.
    fn thaw(&self, id: &SandboxId) -> Result<(), IsolationError>;
    /// Whether a sandbox's processes are (all) frozen.
    fn is_frozen(&self, id: &SandboxId) -> Result<bool, IsolationError>;
}

/// A sandbox's writable disk, its consistent copies (snapshots, fork points) and launches
/// from them; where the tier keeps them.
pub trait Disks: Send + Sync {
    /// Like [`Isolation::launch`], starting from a disk image (a snapshot or a fork's
    /// consistent point) and/or with volumes.
    fn launch_with(
        &self,
        spec: &LaunchSpec,
        extras: &LaunchExtras,
    ) -> Result<Launched, IsolationError>;
    /// A descriptor (read-only directory, close-on-exec) of the root of a running or paused
    /// sandbox's writable disk: `upper/` is the overlayfs upper directory of `/`,
    /// `usr-upper/` that of `/usr` (whiteouts are 0/0 character devices, opaque directories
    /// carry `trusted.overlay.opaque=y`; owners are host ids of the sandbox's uid range).
    /// Use `openat`-family calls relative to it (never follow symlinks found there: they are
    /// the sandbox's). Holding it pins the filesystem; close it when done. For a consistent
    /// view, call it while the sandbox is frozen ([`Freeze::freeze`]).
    fn upper_root(&self, id: &SandboxId) -> Result<std::os::fd::OwnedFd, IsolationError>;
    /// [`Disks::upper_root`], also for a sandbox whose processes are gone but whose disk is
    /// still there (its init died; found dead at the daemon's start): what the sandbox left,
    /// read-only, until [`Isolation::destroy`]. Nothing of the sandbox writes any more then.
    fn disk_root(&self, id: &SandboxId) -> Result<std::os::fd::OwnedFd, IsolationError>;
    /// Takes a consistent copy of a sandbox's disk at `dest` (which must not exist): freeze,
    /// flush, clone, thaw. Returns its allocated bytes. On error `dest` does not exist.
    fn snapshot_disk(&self, id: &SandboxId, dest: &Path) -> Result<u64, IsolationError>;
    /// Where snapshots (`snapshots/`) and volumes (`volumes/`) live.
    fn store_root(&self) -> PathBuf;
    /// The file a snapshot's disk is kept in, inside the snapshot's directory `dir`
    /// (`<store_root>/snapshots/<name>/`): where [`Disks::snapshot_disk`] is asked to write,
    /// and what a [`DiskSource`] names. Cheap, touches nothing.
    fn snapshot_image(&self, dir: &Path) -> Result<PathBuf, IsolationError>;
    /// Gives back to the store's file system the space of what was removed, when it holds
    /// on to it. Blocking.
    fn trim_store(&self);
}

/// Named volumes, kept under [`Disks::store_root`].
pub trait Volumes: Send + Sync {
    /// The image of the volume named `name` (which may not exist). Cheap, touches nothing.
    fn volume_image(&self, name: &str) -> Result<PathBuf, IsolationError>;
    /// Makes a volume image of `size_mib` MiB at `image` (a path from
    /// [`Volumes::volume_image`]); an image already there is left alone
    /// ([`NewVolume::Exists`]). Nothing is left on error.
    fn create_volume(&self, image: &Path, size_mib: u64) -> Result<NewVolume, IsolationError>;
    /// Whether a volume's image is in use (mounted by a sandbox, or just released).
    fn volume_in_use(&self, image: &Path) -> bool;
    /// A descriptor of the root of the volume whose image is `image`, mounted for the
    /// daemon's own use (the volume file API), sharing the file system instance of any
    /// sandbox that has it mounted. Blocking.
    fn volume_root(&self, image: &Path) -> Result<std::os::fd::OwnedFd, IsolationError>;
}

/// Ending a sandbox's processes while keeping its disk (a filesystem-only pause), and
/// booting that disk again.
pub trait ColdStop: Send + Sync {
    /// Ends every process of a running or paused sandbox, keeping its disk: its file
    /// system is flushed first, and this returns once the disk is at rest. Afterwards
    /// [`Disks::disk_root`] and [`Disks::snapshot_disk`] read the disk, [`ColdStop::relaunch`]
    /// boots it again, [`Isolation::destroy`] removes it. Idempotent.
    fn stop(&self, id: &SandboxId) -> Result<(), IsolationError>;
    /// Boots a stopped sandbox ([`ColdStop::stop`]) again on its own disk, with `spec` (the
    /// same id and uid range as before) and `extras`' volumes: what it wrote is there,
    /// nothing of its processes. On error it is stopped as before, its disk kept.
    fn relaunch(
        &self,
        spec: &LaunchSpec,
        extras: &LaunchExtras,
    ) -> Result<Launched, IsolationError>;
    /// Whether a sandbox is stopped ([`ColdStop::stop`]): its disk kept, nothing running.
    fn is_stopped(&self, id: &SandboxId) -> bool;
    /// Whether [`ColdStop::checkpoint`] can save sandbox `id` (cheap; false by default).
    fn can_checkpoint(&self, _id: &SandboxId) -> bool {
        false
    }
    /// Like [`ColdStop::stop`], keeping its processes too: their memory, open files and
    /// state are saved beside its disk, and [`ColdStop::relaunch`] restores them where they
    /// were ([`Launched::restored`]). By default the tier cannot (a 400 naming `disk`).
    fn checkpoint(&self, _id: &SandboxId) -> Result<(), IsolationError> {
        Err(IsolationError::Refused {
            field: "disk",
            message: "this sandbox's tier cannot save its memory to disk: pause it with its memory kept in RAM (the default) or to its filesystem (\"memory\": false), or run it on the gvisor tier".into(),
        })
    }
    /// Whether the node's disk can hold a checkpoint of sandbox `id` now (beside the
    /// daemon's reserve): asked before anything of it changes; a 400 naming `disk` when
    /// not. Nothing to check by default.
    fn room_to_checkpoint(&self, _id: &SandboxId) -> Result<(), IsolationError> {
        Ok(())
    }
    /// Forgets the processes a sandbox saved by [`ColdStop::checkpoint`] (its disk kept): its
    /// next [`ColdStop::relaunch`] boots it afresh from its disk. Idempotent; nothing to do
    /// by default.
    fn discard_saved(&self, _id: &SandboxId) -> Result<(), IsolationError> {
        Ok(())
    }
    /// Copies a sandbox saved by [`ColdStop::checkpoint`] (at rest) to `dest`, a path from
    /// [`Disks::snapshot_image`]: its disk, and with `memory` its processes beside it, what
    /// [`Disks::launch_with`] then starts a new sandbox from (its processes continuing from
    /// the saved point). Returns the bytes the copy holds. By default the tier cannot.
    fn copy_saved(
        &self,
        id: &SandboxId,
        _dest: &Path,
        _memory: bool,
    ) -> Result<u64, IsolationError> {
        Err(IsolationError::Unsupported(format!(
            "sandbox {id}'s tier cannot copy a saved sandbox"
        )))
    }
}

impl dyn Isolation + '_ {
    fn lacks(&self, what: &str) -> IsolationError {
        IsolationError::Unsupported(format!("the {} tier {what}", self.name()))
    }
    /// Its [`Freeze`] capability, or why not.
    pub fn freezer(&self) -> Result<&dyn Freeze, IsolationError> {
        self.capabilities()
            .freeze
            .ok_or_else(|| self.lacks("cannot pause sandboxes"))
    }
    /// Its [`Disks`] capability, or why not.
    pub fn disks(&self) -> Result<&dyn Disks, IsolationError> {
        self.capabilities()
            .disks
            .ok_or_else(|| self.lacks("has no snapshots (no access to a sandbox's disk)"))
    }
    /// Its [`Volumes`] capability, or why not.
    pub fn volumes(&self) -> Result<&dyn Volumes, IsolationError> {
        self.capabilities()
            .volumes
            .ok_or_else(|| self.lacks("has no volumes"))
    }
    /// Its [`ColdStop`] capability, or why not.
    pub fn cold(&self) -> Result<&dyn ColdStop, IsolationError> {
        self.capabilities()
            .cold
            .ok_or_else(|| self.lacks("cannot stop a sandbox and keep its disk"))
    }
    /// Launches `spec` with `extras`: a plain [`Isolation::launch`] when there are none;
    /// otherwise the tier must have [`Disks`] (and [`Volumes`] for volumes), or the launch
    /// is refused before anything is made.
    pub fn launch_with(
        &self,
        spec: &LaunchSpec,
        extras: &LaunchExtras,
    ) -> Result<Launched, IsolationError> {
        if extras.is_empty() {
            return self.launch(spec);
        }
        if !extras.volumes.is_empty() {
            self.volumes()?;
        }
        self.disks()?.launch_with(spec, extras)
    }
    /// Whether a sandbox is stopped (false on a tier that cannot stop sandboxes).
    pub fn is_stopped(&self, id: &SandboxId) -> bool {
        self.capabilities().cold.is_some_and(|c| c.is_stopped(id))
    }
    /// Where snapshots and volumes live, if the tier has them.
    pub fn store_root(&self) -> Option<PathBuf> {
        self.capabilities().disks.map(|d| d.store_root())
    }
    /// Whether a volume's image is in use (false on a tier without volumes).
    pub fn volume_in_use(&self, image: &Path) -> bool {
        self.capabilities()
            .volumes
            .is_some_and(|v| v.volume_in_use(image))
    }
    /// Gives back the space of what was removed from the store (nothing to do on a tier
    /// without [`Disks`]).
    pub fn trim_store(&self) {
        if let Some(d) = self.capabilities().disks {
            d.trim_store()
        }
    }
}

/// Bytes allocated to a file on the host (0 if it cannot be read).
pub(crate) fn allocated_bytes(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(p).map(|m| m.blocks() * 512).unwrap_or(0)
}

/// Renames `from` to `to`, failing (`EEXIST`) if `to` exists, atomically.
pub(crate) fn rename_noreplace(from: &Path, to: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt as _;
    let c = |p: &Path| {
        std::ffi::CString::new(p.as_os_str().as_bytes())
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "NUL in a path"))
    };
    let (f, t) = (c(from)?, c(to)?);
    // SAFETY: renameat2 reads two NUL-terminated paths that live across the call; AT_FDCWD
    // makes them relative to the working directory; no other memory is touched.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            f.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rename_noreplace_refuses_to_replace() {
        let d = tempfile::tempdir().unwrap();
        let (a, b) = (d.path().join("a"), d.path().join("b"));
        std::fs::create_dir(&a).unwrap();
        std::fs::create_dir(&b).unwrap();
        let e = rename_noreplace(&a, &b).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EEXIST));
        std::fs::remove_dir(&b).unwrap();
        rename_noreplace(&a, &b).unwrap();
        assert!(b.is_dir() && !a.exists());
    }

    #[test]
    fn allocated_bytes_counts_blocks_not_length() {
        let d = tempfile::tempdir().unwrap();
        let sparse = d.path().join("sparse");
        std::fs::File::create(&sparse)
            .unwrap()
            .set_len(64 << 20)
            .unwrap();
        assert!(allocated_bytes(&sparse) < 1 << 20);
        assert_eq!(allocated_bytes(&d.path().join("missing")), 0);
    }

    #[test]
    fn a_tier_without_capabilities_refuses_them_by_name() {
        #[derive(Debug)]
        struct Bare;
        impl Isolation for Bare {
            fn name(&self) -> &'static str {
                "bare"
            }
            fn prepare_template(&self, _: &str, _: &Path) -> Result<(), IsolationError> {
                Ok(())
            }
            fn launch(&self, _: &LaunchSpec) -> Result<Launched, IsolationError> {
                Err(IsolationError::UnknownTemplate("no".into()))
            }
            fn destroy(&self, _: &SandboxId) -> Result<(), IsolationError> {
                Ok(())
            }
            fn leftovers(&self) -> Result<Vec<SandboxId>, IsolationError> {
                Ok(Vec::new())
            }
            fn usage(&self, _: &SandboxId) -> Result<Usage, IsolationError> {
                Ok(Usage::default())
            }
        }
        let b: &dyn Isolation = &Bare;
        for e in [
            b.freezer().err(),
            b.disks().err(),
            b.volumes().err(),
            b.cold().err(),
        ] {
            match e {
                Some(IsolationError::Unsupported(m)) => assert!(m.starts_with("the bare tier")),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(b.store_root(), None);
        assert!(!b.is_stopped(&SandboxId::parse("s").unwrap()));
    }
}
