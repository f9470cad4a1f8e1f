//! The seam of an isolation tier: what a launch takes and what it gives back. One set of
//! types for every tier (the namespace jail, gVisor, the fake tier of tests) and for core,
//! which drives them through its `Isolation` trait; `rampart-jail` and `rampart-core`
//! re-export them where their users look for them.

use crate::{Limits, SandboxId, Tier};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// What to launch.
#[derive(Debug, Clone)]
pub struct LaunchSpec {
    /// The sandbox id (names whatever the tier keeps of it: its directory, its cgroup).
    pub id: SandboxId,
    /// The tier it runs on (what core's router of tiers launches it with; a tier driven
    /// directly, as a template build drives the jail, ignores it).
    pub tier: Tier,
    /// Root of the built template: `rootfs/` holds its root filesystem.
    pub template_dir: PathBuf,
    /// First host uid/gid of the sandbox's private range of 65536 (tiers that map ids).
    pub uid_base: u32,
    /// Resource limits.
    pub limits: Limits,
    /// Host name inside the sandbox.
    pub hostname: String,
    /// Environment the agent starts with (inherited by every process it starts).
    pub env: Vec<(String, String)>,
    /// Layered root (built templates, see `rampart-image`): the host directories of the
    /// template's layers, bottom first, each in overlayfs format. When non-empty they are
    /// the overlay's lower layers (each idmapped like the `base` rootfs), `template_dir` is
    /// not used and the host's `/usr` is NOT mounted.
    pub layers: Vec<PathBuf>,
    /// The layers stack on the `base` template at `template_dir`: its `rootfs` is the bottom
    /// lower layer of `/`, and `/usr` is an overlay of the layers' `usr/` directories over
    /// the host's `/usr` (idmapped, as for `base`). A template built `from = "template:base"`.
    pub layers_on_base: bool,
    /// Build sandboxes only (see [`BuildMounts`]); `None` for every sandbox of the API (core
    /// never makes build sandboxes: template builds drive the jail themselves).
    pub build: Option<BuildMounts>,
    /// Extra arguments of the agent (e.g. `--default-user NAME`).
    pub agent_args: Vec<String>,
    /// Files written into the root before PID 1 starts (see [`InitFile`]).
    pub files: Vec<InitFile>,
}

/// A file the tier writes into a sandbox's root before its PID 1 starts (the resolver
/// configuration, the egress CA): what the daemon knows before launch, so that no agent
/// round trip is needed after it. The path is resolved inside the sandbox's root (never out
/// of it: the jailer uses `openat2` with `RESOLVE_IN_ROOT`, so a symlink of the template
/// cannot lead out), missing directories are made (0755), and the file ends up a regular
/// file owned by the sandbox's root with `mode`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct InitFile {
    /// Absolute path inside the sandbox.
    pub path: String,
    /// Its content (text: a resolver configuration, PEM certificates).
    pub text: String,
    /// Its permission bits.
    pub mode: u32,
}

/// How a template build step's sandbox differs from an API sandbox. Builds are an operator
/// action from a trusted spec; nothing the API accepts can ask for this.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct BuildMounts {
    /// The overlay's upper directory on the host (it becomes the new layer); owned by the
    /// sandbox's root through the launch.
    pub upper: PathBuf,
    /// The overlay's work directory (same file system as `upper`).
    pub work: PathBuf,
    /// A host file whose content is bound read-only over `/etc/resolv.conf` (created empty in
    /// the upper if the template has none; the builder removes that empty file from the
    /// layer). The jailer reads it; PID 1 never needs to reach its path. A build step has a
    /// network namespace of its own like every sandbox: its way out is what the builder
    /// wires into it.
    pub resolv_conf: Option<PathBuf>,
    /// With [`LaunchSpec::layers_on_base`]: the upper and work directories (host) of the
    /// `/usr` overlay, which the builder moves into the layer's `usr/` afterwards.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usr_upper: Option<PathBuf>,
    /// The `/usr` overlay's work directory (same file system as `usr_upper`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usr_work: Option<PathBuf>,
}

/// A launched sandbox.
#[derive(Debug, Clone)]
pub struct Launched {
    /// Host pid of the sandbox's init (the agent): core watches it with a pidfd, so it must
    /// be a process of this host's pid namespace that lives as long as the sandbox.
    pub pid: i32,
    /// Host path of the agent's Unix socket.
    pub agent_socket: PathBuf,
    /// Its processes were restored from a checkpoint (core's `ColdStop::checkpoint`): what
    /// a boot starts (the template's start command, its servers) runs already.
    pub restored: bool,
}

/// Resource usage of a sandbox (read from its cgroup).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    /// Memory in use, bytes.
    pub memory_bytes: u64,
    /// Peak memory, bytes (0 if the tier cannot tell).
    pub memory_peak_bytes: u64,
    /// CPU time used, microseconds.
    pub cpu_usec: u64,
    /// Live processes.
    pub pids: u64,
}

/// A disk image to start from instead of an empty disk.
#[derive(Debug, Clone)]
pub struct DiskSource {
    /// The image (cloned, never modified): a path the tier gave (core's
    /// `Disks::snapshot_image`).
    pub image: PathBuf,
    /// First host uid of the range its files belong to (the sandbox it was taken from).
    pub uid_base: u32,
}

/// A volume to mount.
#[derive(Debug, Clone)]
pub struct VolumeSpec {
    /// The volume's image (an ext4 image): a path the tier gave (core's
    /// `Volumes::volume_image`).
    pub image: PathBuf,
    /// Absolute path inside the sandbox.
    pub path: String,
    /// Read-only mount.
    pub read_only: bool,
}

/// What a launch takes beyond its [`LaunchSpec`].
#[derive(Debug, Clone, Default)]
pub struct LaunchExtras {
    /// Start from this disk.
    pub disk: Option<DiskSource>,
    /// Volumes.
    pub volumes: Vec<VolumeSpec>,
}

impl LaunchExtras {
    /// Nothing beyond a plain launch.
    pub fn is_empty(&self) -> bool {
        self.disk.is_none() && self.volumes.is_empty()
    }
}
