//! The `Isolation` trait: what every isolation tier implements.
//!
//! The manager only talks to a tier through this trait, so a second tier (a microVM) is one
//! more implementation running the same agent. Every method blocks; the manager calls them on
//! a blocking thread.

use rampart_jail::{CgroupVersion, Jail, JailError};
use rampart_types::SandboxId;
use std::path::{Path, PathBuf};

pub use rampart_jail::persist::{DiskSource, LaunchExtras, VolumeSpec};
pub use rampart_jail::{LaunchSpec, Launched, Usage};

/// Errors of a tier.
#[derive(Debug, thiserror::Error)]
pub enum IsolationError {
    /// The host lacks a feature the tier needs; the message names it.
    #[error("{0}")]
    Unsupported(String),
    /// The tier failed; the message says where.
    #[error("{0}")]
    Failed(String),
}

impl From<JailError> for IsolationError {
    fn from(e: JailError) -> Self {
        match e {
            JailError::MissingFeature { .. } => IsolationError::Unsupported(e.to_string()),
            other => IsolationError::Failed(other.to_string()),
        }
    }
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

/// An isolation tier. All methods block.
pub trait Isolation: Send + Sync + std::fmt::Debug {
    /// Short name of the tier, e.g. `namespace`.
    fn name(&self) -> &'static str;
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
    /// Freezes every process of a sandbox (pause): returns once they are all frozen.
    /// Frozen processes use no CPU and keep their memory. Idempotent.
    fn freeze(&self, id: &SandboxId) -> Result<(), IsolationError> {
        let _ = id;
        Err(IsolationError::Unsupported(format!(
            "the {} tier cannot pause sandboxes",
            self.name()
        )))
    }
    /// Thaws a frozen sandbox (resume): every process continues where it was. Idempotent.
    fn thaw(&self, id: &SandboxId) -> Result<(), IsolationError> {
        let _ = id;
        Err(IsolationError::Unsupported(format!(
            "the {} tier cannot resume sandboxes",
            self.name()
        )))
    }
    /// Whether a sandbox's processes are (all) frozen.
    fn is_frozen(&self, id: &SandboxId) -> Result<bool, IsolationError> {
        let _ = id;
        Ok(false)
    }
    /// The counter files of a sandbox (see [`CounterFiles`]), when the tier has such files;
    /// otherwise (the default) the exec record reads [`Isolation::usage`].
    fn counter_files(&self, _id: &SandboxId) -> Option<CounterFiles> {
        None
    }
    /// Like [`Isolation::launch`], starting from a disk image (a snapshot or a fork's
    /// consistent point) and/or with volumes. The default refuses anything beyond a launch.
    fn launch_with(
        &self,
        spec: &LaunchSpec,
        extras: &LaunchExtras,
    ) -> Result<Launched, IsolationError> {
        if extras.is_empty() {
            return self.launch(spec);
        }
        Err(IsolationError::Unsupported(format!(
            "the {} tier has no snapshots or volumes",
            self.name()
        )))
    }
    /// A descriptor (read-only directory, close-on-exec) of the root of a running or paused
    /// sandbox's writable disk: `upper/` is the overlayfs upper directory of `/`,
    /// `usr-upper/` that of `/usr` (whiteouts are 0/0 character devices, opaque directories
    /// carry `trusted.overlay.opaque=y`; owners are host ids of the sandbox's uid range).
    /// Use `openat`-family calls relative to it (never follow symlinks found there: they are
    /// the sandbox's). Holding it pins the filesystem; close it when done. For a consistent
    /// view, call it while the sandbox is frozen ([`Isolation::freeze`]).
    fn upper_root(&self, id: &SandboxId) -> Result<std::os::fd::OwnedFd, IsolationError> {
        let _ = id;
        Err(IsolationError::Unsupported(format!(
            "the {} tier gives no access to a sandbox's writable layer",
            self.name()
        )))
    }
    /// Takes a consistent copy of a sandbox's disk at `dest` (which must not exist): freeze,
    /// flush, clone, thaw. Returns its allocated bytes. On error `dest` does not exist.
    fn snapshot_disk(&self, id: &SandboxId, dest: &Path) -> Result<u64, IsolationError> {
        let _ = (id, dest);
        Err(IsolationError::Unsupported(format!(
            "the {} tier cannot snapshot sandboxes",
            self.name()
        )))
    }
    /// Where snapshots (`snapshots/`) and volumes (`volumes/`) live, if the tier has them.
    fn store_root(&self) -> Option<PathBuf> {
        None
    }
    /// Releases what the tier keeps warm for fast launches (pre-spawned processes and their
    /// cgroups) and finishes the removals of destroyed sandboxes still in progress. Sandboxes
    /// keep running; later launches still work, only slower. Blocking.
    fn shutdown(&self) {}
}

impl Isolation for Jail {
    fn name(&self) -> &'static str {
        "namespace"
    }
    fn prepare_template(&self, name: &str, dest: &Path) -> Result<(), IsolationError> {
        match name {
            // The code interpreter's server is added by core (`interpreter::install`).
            "base" | crate::interpreter::TEMPLATE => Ok(rampart_jail::template::build_base(dest)?),
            other => Err(IsolationError::Failed(format!(
                "unknown template {other:?}"
            ))),
        }
    }
    fn launch(&self, spec: &LaunchSpec) -> Result<Launched, IsolationError> {
        Ok(Jail::launch(self, spec)?)
    }
    fn destroy(&self, id: &SandboxId) -> Result<(), IsolationError> {
        Ok(Jail::destroy(self, id)?)
    }
    fn leftovers(&self) -> Result<Vec<SandboxId>, IsolationError> {
        Ok(Jail::leftovers(self)?)
    }
    fn usage(&self, id: &SandboxId) -> Result<Usage, IsolationError> {
        Ok(Jail::usage(self, id)?)
    }
    fn counter_files(&self, id: &SandboxId) -> Option<CounterFiles> {
        let dirs = self.cgroup_dirs(id);
        match self.features().cgroup {
            CgroupVersion::V2 => {
                let d = dirs.first()?;
                let peak = d.join("memory.peak");
                Some(CounterFiles {
                    cpu: d.join("cpu.stat"),
                    cpu_format: CpuFormat::StatUsageUsec,
                    peak_memory: peak.exists().then_some(peak),
                })
            }
            CgroupVersion::V1 => Some(CounterFiles {
                cpu: dirs
                    .iter()
                    .map(|d| d.join("cpuacct.usage"))
                    .find(|p| p.exists())?,
                cpu_format: CpuFormat::Nanoseconds,
                peak_memory: dirs
                    .iter()
                    .map(|d| d.join("memory.max_usage_in_bytes"))
                    .find(|p| p.exists()),
            }),
        }
    }
    fn freeze(&self, id: &SandboxId) -> Result<(), IsolationError> {
        Ok(Jail::freeze(self, id)?)
    }
    fn thaw(&self, id: &SandboxId) -> Result<(), IsolationError> {
        Ok(Jail::thaw(self, id)?)
    }
    fn is_frozen(&self, id: &SandboxId) -> Result<bool, IsolationError> {
        Ok(Jail::is_frozen(self, id)?)
    }
    fn launch_with(
        &self,
        spec: &LaunchSpec,
        extras: &LaunchExtras,
    ) -> Result<Launched, IsolationError> {
        Ok(Jail::launch_with(self, spec, extras)?)
    }
    fn upper_root(&self, id: &SandboxId) -> Result<std::os::fd::OwnedFd, IsolationError> {
        Ok(Jail::upper_root(self, id)?)
    }
    fn snapshot_disk(&self, id: &SandboxId, dest: &Path) -> Result<u64, IsolationError> {
        Ok(Jail::snapshot_disk(self, id, dest)?)
    }
    fn store_root(&self) -> Option<PathBuf> {
        Some(Jail::store_root(self))
    }
    fn shutdown(&self) {
        self.close_pool();
        self.settle();
    }
}
