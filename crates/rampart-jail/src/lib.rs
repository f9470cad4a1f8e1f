//! The namespace isolation tier.
//!
//! CONTRACT (used by rampart-core; keep these signatures):
//! - [`Jail::new`] probes the host and refuses, naming the feature, when one is missing.
//! - [`Jail::launch`] builds a sandbox and returns once its agent (PID 1) has exec'd and is
//!   accepting on `agent_socket`. Blocking: callers run it on a blocking thread.
//!   On any error nothing remains: no mount, cgroup, loop device, directory or process.
//! - [`Jail::destroy`] kills every process of the sandbox (by its cgroup) and removes the
//!   cgroup and the sandbox directory; on cgroup v1 the wait for the killed processes to end
//!   and the removal finish on the janitor's thread, under a `dying-<id>` name (see
//!   [`janitor`]). Idempotent; fine on a half-built sandbox.
//! - [`Jail::freeze`] / [`Jail::thaw`] pause and resume every process of a sandbox (its
//!   cgroup's freezer; on v1 sandboxes are placed in the freezer hierarchy too);
//!   [`Jail::is_frozen`] tells. Destroy works on a frozen sandbox (it thaws after SIGKILL).
//! - [`Jail::leftovers`] lists the ids that still have any trace on the host (directory or
//!   cgroup), for restart recovery.
//!
//! How a sandbox is built (see [`jailer`]): `launch` creates the cgroup (v2 if the unified
//! hierarchy offers memory+pids+cpu, else v1) and a sparse copy of a cached empty ext4 image
//! (the disk quota), then spawns `rampart-jailer` with a [`JailerSpec`] on stdin (or takes a
//! warm one from the [`pool`], which did those steps ahead of time). The jailer moves itself
//! into the cgroup (v1; on v2 PID 1 is cloned into it), works in a private mount namespace:
//! loop-mounts the image, mounts overlays for `/` (lower:
//! the template rootfs) and `/usr` (lower: the host's `/usr`), both lowers idmapped through
//! the sandbox's user namespace, and clones PID 1 into new user, pid, net, ipc and uts
//! namespaces. PID 1 unshares mount and cgroup namespaces, mounts `/proc` (masked), `/dev`,
//! `/sys` (read-only), pivots, cuts the capability bounding set, installs the seccomp filter
//! of [`seccomp::default_policy`] (without `no_new_privs`, so setuid `sudo` works inside)
//! and execs the agent with its listening socket in [`AGENT_FD_ENV`].
//!
//! Not used: Landlock. After `pivot_root` the sandbox's filesystem view holds only its own
//! overlay, `/proc`, `/sys` (read-only) and a minimal `/dev`; a Landlock ruleset would only
//! restate that, and would stop root inside from administering its own root filesystem.

use rampart_types::{Limits, SandboxId};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

pub mod cgroup;
pub mod disk;
pub mod jailer;
pub mod janitor;
pub mod persist;
pub mod pool;
pub mod seccomp;
pub mod store;
pub mod sys;
pub mod template;

/// Environment variable telling the agent which inherited fd is its listening Unix socket.
pub const AGENT_FD_ENV: &str = "RAMPART_AGENT_FD";

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

// The tier's seam types live once, in `rampart-types` (core's `Isolation` takes the same).
pub use rampart_types::launch::{BuildMounts, InitFile, LaunchSpec, Launched, Usage};

/// The tier.
#[derive(Debug)]
pub struct Jail {
    cfg: JailConfig,
    features: HostFeatures,
    cgroups: cgroup::Cgroups,
    pool: Option<pool::Pool>,
    janitor: janitor::Janitor,
    /// Sandboxes a [`Jail::relaunch`] of this process is booting (their disk moved aside):
    /// [`Jail::is_stopped`] puts a disk back only when no relaunch holds it.
    relaunching: std::sync::Mutex<std::collections::HashSet<SandboxId>>,
}

/// Default size of the warm jailer pool (see [`Jail::with_pool`]).
pub const DEFAULT_POOL_SIZE: usize = 4;

/// What `Jail::launch` sends to `rampart-jailer` on its stdin (one JSON document).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JailerSpec {
    /// `<state_dir>/<id>`.
    pub sandbox_dir: PathBuf,
    /// The template's root filesystem (lower layer of `/`).
    pub rootfs: PathBuf,
    /// The host directory used as lower layer of `/usr`.
    pub usr_source: PathBuf,
    /// The sandbox's ext4 disk image.
    pub disk_image: PathBuf,
    /// First host uid/gid of the sandbox's range of 65536.
    pub uid_base: u32,
    /// Host name inside.
    pub hostname: String,
    /// Environment of the agent.
    pub env: Vec<(String, String)>,
    /// RLIMIT_NOFILE.
    pub open_files: u64,
    /// `cgroup.procs` files of the sandbox's cgroup, which the jailer joins itself before it
    /// clones PID 1 (none when it already runs there, or with `clone_into_cgroup`).
    pub cgroup_procs: Vec<PathBuf>,
    /// cgroup v2: the sandbox's cgroup directory, which PID 1 is cloned straight into
    /// (`clone3` with `CLONE_INTO_CGROUP`, no migration).
    #[serde(default)]
    pub clone_into_cgroup: Option<PathBuf>,
    /// The agent binary.
    pub agent_bin: PathBuf,
    /// Where the agent's socket is bound.
    pub agent_socket: PathBuf,
    /// Layered root: lower layers, bottom first (see [`LaunchSpec::layers`]).
    #[serde(default)]
    pub layers: Vec<PathBuf>,
    /// The layers stack on `rootfs` and `usr_source` (see [`LaunchSpec::layers_on_base`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub layers_on_base: bool,
    /// Build sandbox mounts (see [`BuildMounts`]).
    #[serde(default)]
    pub build: Option<BuildMounts>,
    /// Extra agent arguments.
    #[serde(default)]
    pub agent_args: Vec<String>,
    /// The disk was cloned from a sandbox whose uid range starts here: its files' owners are
    /// moved to this sandbox's range first (see [`persist::shift_uids`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shift_uids_from: Option<u32>,
    /// Volumes to mount (see [`persist::mount_volumes`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<persist::JailerVolume>,
    /// Files to write into the root (see [`InitFile`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<InitFile>,
}

/// What a pool member's jailer gets first on its stdin (one line), before its spec: the
/// directory and disk image to prepare ([`jailer::prepare`]). It answers `{"ready":true}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JailerPrepare {
    /// The directory to prepare (renamed to the sandbox's directory before the spec comes).
    pub prepare_dir: PathBuf,
    /// The disk image in it.
    pub prepare_disk: PathBuf,
    /// `cgroup.procs` files of the member's cgroup, which the jailer joins first.
    pub prepare_cgroup: Vec<PathBuf>,
}

/// The jailer's one-line answer on stdout.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct JailerResult {
    /// Host pid of the sandbox's PID 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<i32>,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The answer to a [`JailerPrepare`]: prepared, waiting for the spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<bool>,
}

fn io(step: String) -> impl FnOnce(std::io::Error) -> JailError {
    move |source| JailError::Sys { step, source }
}

/// Checks that the host offers what the tier needs.
fn probe_kernel() -> Result<(), JailError> {
    let need = |feature: &'static str, ok: bool, detail: &str| {
        if ok {
            Ok(())
        } else {
            Err(JailError::MissingFeature {
                feature,
                detail: detail.to_owned(),
            })
        }
    };
    need(
        "root",
        nix::unistd::geteuid().is_root(),
        "the namespace tier must run as root",
    )?;
    for ns in ["user", "pid", "net", "ipc", "uts", "mnt", "cgroup"] {
        need(
            "namespaces",
            Path::new(&format!("/proc/self/ns/{ns}")).exists(),
            &format!("no {ns} namespace"),
        )?;
    }
    let maxns = std::fs::read_to_string("/proc/sys/user/max_user_namespaces").unwrap_or_default();
    need(
        "user namespaces",
        maxns.trim().parse::<u64>().unwrap_or(0) > 0,
        "user.max_user_namespaces is 0",
    )?;
    let fss = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
    for fs in ["overlay", "ext4", "proc", "tmpfs", "devpts"] {
        need(
            "filesystems",
            fss.split_whitespace().any(|f| f == fs),
            &format!("kernel lacks {fs}"),
        )?;
    }
    need(
        "loop devices",
        Path::new("/dev/loop-control").exists(),
        "no /dev/loop-control",
    )?;
    let seccomp = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    need(
        "seccomp",
        seccomp.lines().any(|l| l.starts_with("Seccomp:")),
        "kernel without seccomp",
    )?;
    Ok(())
}

fn landlock_abi() -> Option<u32> {
    // SAFETY: landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION) only queries.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32,
        )
    };
    (v > 0).then_some(v as u32)
}

impl Jail {
    /// Probes the host and prepares the tier.
    pub fn new(cfg: JailConfig) -> Result<Jail, JailError> {
        probe_kernel()?;
        let cg = cgroup::probe(&cfg.cgroup_subtree)?;
        std::fs::create_dir_all(&cfg.state_dir)
            .map_err(io(format!("mkdir {}", cfg.state_dir.display())))?;
        let features = HostFeatures {
            cgroup: cg.version,
            landlock_abi: landlock_abi(),
        };
        pool::remove_stale(&cg, &cfg.state_dir);
        janitor::remove_stale(&cg, &cfg.state_dir);
        let janitor = janitor::Janitor::new(cg.clone(), cfg.state_dir.clone());
        Ok(Jail {
            cfg,
            features,
            cgroups: cg,
            pool: None,
            janitor,
            relaunching: std::sync::Mutex::default(),
        })
    }

    /// Keeps `size` jailers warm, each already inside a cgroup of its own and with its disk
    /// mounted, so that a launch skips those steps (see [`pool`]). cgroup v1 only: on v2 PID 1 is cloned
    /// straight into its cgroup and this is a no-op, as is a size of 0. The members die with
    /// the daemon (they are spawned by the pool's own thread with `PR_SET_PDEATHSIG`), and
    /// [`Jail::close_pool`] or dropping the `Jail` removes them.
    ///
    /// Members have a disk of `disk_bytes` ready (copied and mounted in the jailer's private
    /// mount namespace); launches asking for another disk size start a fresh jailer.
    pub fn with_pool(mut self, size: usize, disk_bytes: u64) -> Result<Jail, JailError> {
        if let Some(p) = self.pool.take() {
            p.close();
        }
        if size > 0 && self.features.cgroup == CgroupVersion::V1 {
            let cfg = pool::PoolConfig {
                size,
                jailer_bin: self.cfg.jailer_bin.clone(),
                state_dir: self.cfg.state_dir.clone(),
                cache_dir: self.cache_dir(),
                disk_bytes,
            };
            self.pool = Some(pool::Pool::start(self.cgroups.clone(), cfg)?);
        }
        Ok(self)
    }

    /// The warm pool, if any.
    pub fn pool(&self) -> Option<&pool::Pool> {
        self.pool.as_ref()
    }

    /// Stops the pool's refill and removes its members (processes and cgroups); launches
    /// go on without it. Idempotent.
    pub fn close_pool(&self) {
        if let Some(p) = &self.pool {
            p.close();
        }
    }
    /// What the probe found.
    pub fn features(&self) -> &HostFeatures {
        &self.features
    }
    /// The configuration.
    pub fn config(&self) -> &JailConfig {
        &self.cfg
    }
    /// The directory of a sandbox.
    pub fn sandbox_dir(&self, id: &SandboxId) -> PathBuf {
        self.cfg.state_dir.join(id.as_str())
    }
    /// The cgroup directories of a sandbox (one per controller on v1).
    pub fn cgroup_dirs(&self, id: &SandboxId) -> Vec<PathBuf> {
        self.cgroups.dirs(id.as_str())
    }
    fn cache_dir(&self) -> PathBuf {
        match self.cfg.state_dir.parent() {
            Some(p) => p.join("cache"),
            None => self.cfg.state_dir.join(".cache"),
        }
    }

    /// Builds and starts a sandbox. Blocking.
    pub fn launch(&self, spec: &LaunchSpec) -> Result<Launched, JailError> {
        self.launch_with(spec, &persist::LaunchExtras::default())
    }

    /// Like [`Jail::launch`], starting from a disk image and/or with volumes (see
    /// [`persist`]). Blocking.
    pub fn launch_with(
        &self,
        spec: &LaunchSpec,
        extras: &persist::LaunchExtras,
    ) -> Result<Launched, JailError> {
        let dir = self.sandbox_dir(&spec.id);
        if dir.exists()
            || self
                .cgroups
                .dirs(spec.id.as_str())
                .iter()
                .any(|d| d.exists())
        {
            // Never touch a sandbox that already exists under this id.
            return Err(JailError::Init(format!(
                "sandbox {} already exists",
                spec.id
            )));
        }
        let r = self.try_launch(spec, extras);
        if r.is_err() {
            let _ = self.destroy(&spec.id);
        }
        r
    }

    fn try_launch(
        &self,
        spec: &LaunchSpec,
        extras: &persist::LaunchExtras,
    ) -> Result<Launched, JailError> {
        let rootfs = spec.template_dir.join("rootfs");
        if let Some(l) = spec.layers.iter().find(|l| !l.is_dir()) {
            return Err(JailError::Template(format!(
                "layer {} is missing",
                l.display()
            )));
        }
        if (spec.layers.is_empty() || spec.layers_on_base)
            && (!rootfs.join("usr").is_dir() || !rootfs.join("etc").is_dir())
        {
            return Err(JailError::Template(format!(
                "{} is not a built template (no rootfs/usr, rootfs/etc)",
                spec.template_dir.display()
            )));
        }
        if spec.uid_base == 0 || spec.uid_base.checked_add(65536).is_none() {
            return Err(JailError::Init(format!(
                "uid_base {} is not a valid unprivileged range",
                spec.uid_base
            )));
        }
        if spec.hostname.is_empty() || spec.hostname.len() > 64 {
            return Err(JailError::Init("hostname must be 1 to 64 bytes".into()));
        }
        let dir = self.sandbox_dir(&spec.id);
        let mut js = JailerSpec {
            sandbox_dir: dir.clone(),
            rootfs,
            usr_source: PathBuf::from("/usr"),
            disk_image: dir.join("disk.img"),
            uid_base: spec.uid_base,
            hostname: spec.hostname.clone(),
            env: spec.env.clone(),
            open_files: spec.limits.open_files,
            cgroup_procs: Vec::new(),
            clone_into_cgroup: None,
            agent_bin: self.cfg.agent_bin.clone(),
            agent_socket: dir.join("agent.sock"),
            layers: spec.layers.clone(),
            layers_on_base: spec.layers_on_base,
            build: spec.build.clone(),
            agent_args: spec.agent_args.clone(),
            shift_uids_from: None,
            volumes: Vec::new(),
            files: spec.files.clone(),
        };
        let id = spec.id.as_str();
        let member = match extras.disk {
            // A pool member's disk is an empty one.
            None => self.take_member(id, &spec.limits, &dir),
            Some(_) => None,
        };
        let mut holds = Vec::new();
        if !extras.volumes.is_empty() {
            let (v, h) = self.attach_volumes(extras)?;
            js.volumes = v;
            holds = h;
        }
        let child = match member {
            // The jailer already runs in the sandbox's (limited) cgroup, with its disk mounted
            // in the sandbox's directory.
            Some(child) => child,
            None => {
                std::fs::create_dir(&dir).map_err(io(format!("mkdir {}", dir.display())))?;
                match &extras.disk {
                    Some(src) => {
                        // The disk keeps the size it was made with.
                        store::clone_file(&src.image, &js.disk_image)?;
                        js.shift_uids_from = Some(src.uid_base);
                    }
                    None => {
                        let cached = disk::cached_image(&self.cache_dir(), spec.limits.disk_bytes)?;
                        store::clone_file(&cached, &js.disk_image)?;
                    }
                }
                self.cgroups.create(id, &spec.limits)?;
                match self.cgroups.version {
                    CgroupVersion::V1 => js.cgroup_procs = self.cgroups.procs_files(id),
                    CgroupVersion::V2 => {
                        js.clone_into_cgroup = self.cgroups.dirs(id).into_iter().next()
                    }
                }
                pool::spawn_jailer(&self.cfg.jailer_bin)?
            }
        };
        let pid = run_jailer(child, &js)?;
        drop(holds);
        Ok(Launched {
            pid,
            agent_socket: js.agent_socket,
            // The jail boots its sandboxes; it restores no checkpoint.
            restored: false,
        })
    }

    /// Takes a pool member with the right disk size and makes it the sandbox's: limits
    /// first (before any sandbox code can run in its cgroup), then its cgroup and its
    /// directory are renamed to the sandbox's. None (and nothing left of the member) when the
    /// pool has none or that fails.
    fn take_member(&self, id: &str, limits: &Limits, dir: &Path) -> Option<std::process::Child> {
        let m = self.pool.as_ref()?.take(limits.disk_bytes)?;
        let r = self
            .cgroups
            .set_limits(&m.name, limits)
            .and_then(|()| self.cgroups.rename(&m.name, id))
            .and_then(|()| {
                sys::rename_noreplace(&m.dir, dir).inspect_err(|_| {
                    // Back to the member's name, so that discarding it finds everything.
                    let _ = self.cgroups.rename(id, &m.name);
                })
            });
        match r {
            Ok(()) => Some(m.child),
            Err(e) => {
                tracing::warn!("using pool member {}: {e}; starting a fresh jailer", m.name);
                pool::discard(&self.cgroups, m);
                None
            }
        }
    }

    /// Kills and removes every trace of a sandbox. Idempotent. Blocking.
    ///
    /// On cgroup v1 it returns once every process of the sandbox has been sent SIGKILL and its
    /// cgroup and directory are renamed `dying-<id>` (nothing under the id is left); the
    /// janitor's thread waits for the processes to end and removes both (see [`janitor`];
    /// [`Jail::settle`] waits for it). Elsewhere it waits for the processes itself.
    pub fn destroy(&self, id: &SandboxId) -> Result<(), JailError> {
        // A stopped sandbox's disk moved aside by a relaunch cut short comes back, to go
        // with the rest.
        self.is_stopped(id);
        let dir = self.sandbox_dir(id);
        let dying = format!("{}{id}", janitor::DYING_PREFIX);
        let mut handed_over = false;
        if self.cgroups.version == CgroupVersion::V1
            && self.cgroups.dirs(id.as_str()).iter().all(|d| d.exists())
        {
            // SIGKILL to PID 1 ends its whole pid namespace; the rest of the cgroup too.
            for p in self.cgroups.pids(id.as_str()) {
                // SAFETY: kill(2) with a pid read from the sandbox's own cgroup.
                unsafe { libc::kill(p, libc::SIGKILL) };
            }
            // A paused sandbox: its frozen tasks act on the SIGKILL only once thawed, and
            // being killed already, run none of their own code again.
            self.cgroups.thaw_quiet(id.as_str());
            match self.cgroups.rename(id.as_str(), &dying) {
                Ok(()) => handed_over = true,
                Err(e) => tracing::warn!("destroy {id}: {e}; waiting for its processes"),
            }
        }
        if !handed_over {
            self.cgroups.destroy(id.as_str())?;
        }
        // No wait for the disk's loop device: it holds the image open (unlinking it is fine)
        // and detaches itself (autoclear) once the last mount of the disk is gone, which the
        // kernel finishes a moment after the sandbox's last process has exited.
        if handed_over {
            let to = self.cfg.state_dir.join(&dying);
            let moved = match std::fs::rename(&dir, &to) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(e),
            };
            self.janitor.push(dying);
            if moved.is_ok() {
                return Ok(());
            }
        }
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io(format!("remove {}", dir.display()))(e)),
        }
    }

    /// Waits until the removals [`Jail::destroy`] handed to the janitor are finished.
    pub fn settle(&self) {
        self.janitor.settle();
    }

    /// Ids with any trace left on the host (directory or cgroup).
    pub fn leftovers(&self) -> Result<Vec<SandboxId>, JailError> {
        let mut ids = self.cgroups.list();
        let rd = std::fs::read_dir(&self.cfg.state_dir)
            .map_err(io(format!("read {}", self.cfg.state_dir.display())))?;
        for e in rd.flatten() {
            if let Some(n) = e.file_name().to_str() {
                ids.push(n.to_owned());
            }
        }
        ids.sort();
        ids.dedup();
        Ok(ids
            .into_iter()
            .filter_map(|s| SandboxId::parse(&s).ok())
            .collect())
    }

    /// Current usage of a sandbox's cgroup.
    pub fn usage(&self, id: &SandboxId) -> Result<Usage, JailError> {
        self.cgroups.usage(id.as_str())
    }

    /// Pauses a sandbox: freezes every task of its cgroup (v1 freezer, v2 `cgroup.freeze`)
    /// and returns once the kernel reports the cgroup frozen (at most
    /// [`cgroup::FREEZE_DEADLINE`]; on timeout it is thawed again and this fails). Frozen
    /// tasks use no CPU and keep their memory. Idempotent. Blocking.
    pub fn freeze(&self, id: &SandboxId) -> Result<(), JailError> {
        self.cgroups.freeze(id.as_str(), cgroup::FREEZE_DEADLINE)
    }

    /// Resumes a paused sandbox: every task continues where it was. Idempotent.
    pub fn thaw(&self, id: &SandboxId) -> Result<(), JailError> {
        self.cgroups.thaw(id.as_str())
    }

    /// Whether a sandbox's cgroup is frozen (fully: a freeze still in progress is `false`).
    pub fn is_frozen(&self, id: &SandboxId) -> Result<bool, JailError> {
        Ok(self.cgroups.freezer_state(id.as_str())? == cgroup::FreezerState::Frozen)
    }
}

/// Whether a loop device is still backed by `image`.
pub fn loop_backing(image: &Path) -> bool {
    let Ok(rd) = std::fs::read_dir("/sys/block") else {
        return false;
    };
    let want = image.to_string_lossy();
    rd.flatten().any(|e| {
        e.file_name().to_string_lossy().starts_with("loop")
            && std::fs::read_to_string(e.path().join("loop/backing_file"))
                .map(|s| {
                    let s = s.trim();
                    s == want || s.strip_suffix(" (deleted)") == Some(&want)
                })
                .unwrap_or(false)
    })
}

/// Sends the spec to a spawned jailer and reads its answer. The jailer is reaped on a
/// thread of its own: its exit (tearing down its mount namespace) can take an RCU grace
/// period, and its answer already says everything.
fn run_jailer(mut child: std::process::Child, spec: &JailerSpec) -> Result<i32, JailError> {
    let body = serde_json::to_vec(spec)
        .map_err(|e| JailError::Init(format!("encode jailer spec: {e}")))?;
    if let Some(mut sin) = child.stdin.take() {
        let _ = sin.write_all(&body);
    }
    let mut out = String::new();
    if let Some(mut so) = child.stdout.take() {
        let _ = so.read_to_string(&mut out);
    }
    let res: Option<JailerResult> = out.lines().rev().find_map(|l| serde_json::from_str(l).ok());
    match res {
        Some(JailerResult { pid: Some(pid), .. }) => {
            reap_later(child);
            Ok(pid)
        }
        Some(JailerResult { error: Some(e), .. }) => {
            reap_later(child);
            Err(JailError::Init(e))
        }
        _ => {
            let mut err = String::new();
            if let Some(mut se) = child.stderr.take() {
                let _ = se.read_to_string(&mut err);
            }
            let status = child.wait().map_err(io("wait for jailer".into()))?;
            Err(JailError::Init(format!(
                "jailer failed ({status}): {}",
                err.trim()
            )))
        }
    }
}

fn reap_later(mut child: std::process::Child) {
    let spawned = std::thread::Builder::new()
        .name("rampart-jailer-reap".into())
        .spawn(move || {
            let _ = child.wait();
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot start a thread to reap a jailer: {e}");
    }
}
