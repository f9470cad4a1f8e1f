//! The namespace isolation tier.
//!
//! CONTRACT (used by rampart-core; keep these signatures):
//! - [`Jail::new`] probes the host and refuses, naming the feature, when one is missing.
//! - [`Jail::launch`] builds a sandbox and returns once its agent (PID 1) has exec'd and is
//!   accepting on `agent_socket`. Blocking: callers run it on a blocking thread.
//!   On any error nothing remains: no mount, cgroup, loop device, directory or process.
//! - [`Jail::destroy`] kills every process of the sandbox (by its cgroup), waits for them,
//!   removes the cgroup and the sandbox directory. Idempotent; fine on a half-built sandbox.
//! - [`Jail::leftovers`] lists the ids that still have any trace on the host (directory or
//!   cgroup), for restart recovery.

use rampart_types::{Limits, SandboxId};
use std::path::PathBuf;

/// Errors of the jail tier.
#[derive(Debug, thiserror::Error)]
pub enum JailError {
    /// A kernel feature Rampart needs is missing on this host.
    #[error("host is missing a required kernel feature: {feature}: {detail}")]
    MissingFeature {
        /// The feature, e.g. "user namespaces", "cgroup memory controller".
        feature: &'static str,
        /// What the probe saw.
        detail: String,
    },
    /// A system call or setup step failed.
    #[error("{step}: {source}")]
    Sys {
        /// The step that failed, e.g. "mount overlay".
        step: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The template is missing or broken.
    #[error("template: {0}")]
    Template(String),
    /// The sandbox's init failed before exec'ing the agent.
    #[error("sandbox init failed: {0}")]
    Init(String),
}

/// Which cgroup hierarchy the host gives us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    /// Legacy per-controller hierarchies under /sys/fs/cgroup/<controller>.
    V1,
    /// Unified hierarchy with memory, pids and cpu controllers enabled.
    V2,
}

/// What the probe found.
#[derive(Debug, Clone)]
pub struct HostFeatures {
    /// The cgroup hierarchy used.
    pub cgroup: CgroupVersion,
    /// Landlock ABI version, if Landlock is enabled.
    pub landlock_abi: Option<u32>,
}

/// Configuration of the tier.
#[derive(Debug, Clone)]
pub struct JailConfig {
    /// Directory holding one subdirectory per sandbox (`<state_dir>/<id>/`).
    pub state_dir: PathBuf,
    /// The `rampart-jailer` binary.
    pub jailer_bin: PathBuf,
    /// The `rampart-agent` binary exec'd as PID 1 of each sandbox.
    pub agent_bin: PathBuf,
    /// Name of Rampart's cgroup subtree (`rampart`); sandboxes are `<subtree>/<id>`.
    pub cgroup_subtree: String,
}

/// What to launch.
#[derive(Debug, Clone)]
pub struct LaunchSpec {
    /// The sandbox id (names its directory and cgroup).
    pub id: SandboxId,
    /// Root of the built template (see [`template`]).
    pub template_dir: PathBuf,
    /// First host uid/gid of the sandbox's private range of 65536.
    pub uid_base: u32,
    /// Resource limits.
    pub limits: Limits,
    /// Host name inside the sandbox.
    pub hostname: String,
    /// Environment the agent starts with (inherited by every process it starts).
    pub env: Vec<(String, String)>,
}

/// A launched sandbox.
#[derive(Debug, Clone)]
pub struct Launched {
    /// Host pid of the sandbox's PID 1 (the agent).
    pub pid: i32,
    /// Host path of the agent's Unix socket.
    pub agent_socket: PathBuf,
}

/// Resource usage read from a sandbox's cgroup.
#[derive(Debug, Clone, Default)]
pub struct Usage {
    /// Memory in use, bytes.
    pub memory_bytes: u64,
    /// Peak memory, bytes (0 if the host cannot tell).
    pub memory_peak_bytes: u64,
    /// CPU time used, microseconds.
    pub cpu_usec: u64,
    /// Live processes.
    pub pids: u64,
}

/// The tier.
#[derive(Debug)]
pub struct Jail {
    cfg: JailConfig,
    features: HostFeatures,
}

impl Jail {
    /// Probes the host and prepares the tier.
    pub fn new(cfg: JailConfig) -> Result<Jail, JailError> {
        let _ = &cfg;
        unimplemented!("jail probe")
    }
    /// What the probe found.
    pub fn features(&self) -> &HostFeatures {
        &self.features
    }
    /// The configuration.
    pub fn config(&self) -> &JailConfig {
        &self.cfg
    }
    /// Builds and starts a sandbox. Blocking.
    pub fn launch(&self, spec: &LaunchSpec) -> Result<Launched, JailError> {
        let _ = spec;
        unimplemented!("launch")
    }
    /// Kills and removes every trace of a sandbox. Idempotent. Blocking.
    pub fn destroy(&self, id: &SandboxId) -> Result<(), JailError> {
        let _ = id;
        unimplemented!("destroy")
    }
    /// Ids with any trace left on the host (directory or cgroup).
    pub fn leftovers(&self) -> Result<Vec<SandboxId>, JailError> {
        unimplemented!("leftovers")
    }
    /// Current usage of a sandbox's cgroup.
    pub fn usage(&self, id: &SandboxId) -> Result<Usage, JailError> {
        let _ = id;
        unimplemented!("usage")
    }
}

/// Templates: building the `base` template.
pub mod template {
    use super::JailError;
    use std::path::Path;

    /// Builds the `base` template into `dest` (made atomically: built in a temp dir, renamed).
    pub fn build_base(dest: &Path) -> Result<(), JailError> {
        let _ = dest;
        unimplemented!("build_base")
    }
}
