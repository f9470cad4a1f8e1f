//! Per-sandbox cgroups, v1 (one directory per controller) or v2 (unified).

use crate::{sys, CgroupVersion, JailError, Usage};
use rampart_types::Limits;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// v1 controllers a sandbox is placed in.
pub const V1_CONTROLLERS: [&str; 4] = ["memory", "pids", "cpu", "cpuacct"];
/// The v1 freezer controller: a sandbox is placed in it too when the host mounts it (pause
/// and resume need it); its directory comes last in [`Cgroups::dirs`].
pub const V1_FREEZER: &str = "freezer";
/// How long a freeze may take before it is given up (and undone).
pub const FREEZE_DEADLINE: Duration = Duration::from_secs(5);
/// v2 controllers needed.
pub const V2_CONTROLLERS: [&str; 3] = ["memory", "pids", "cpu"];
const CFS_PERIOD_US: u64 = 100_000;

/// Where the cgroup hierarchies live.
#[derive(Debug, Clone)]
pub struct Cgroups {
    /// The version in use.
    pub version: CgroupVersion,
    /// `/sys/fs/cgroup` (v1) or the unified mount point (v2).
    pub root: PathBuf,
    /// Rampart's subtree name.
    pub subtree: String,
    /// v1: the freezer controller is mounted and sandboxes are placed in it.
    pub v1_freezer: bool,
}

/// A cgroup's freezer state as the kernel reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FreezerState {
    /// Every task is frozen.
    Frozen,
    /// Freezing is under way (some tasks still run).
    Freezing,
    /// Not frozen.
    Thawed,
}

/// The bound on TCP buffer memory of a sandbox with `memory_bytes` of memory on cgroup v1:
/// a quarter of it, at least 4 MiB (page aligned).
pub fn tcp_limit(memory_bytes: u64) -> u64 {
    (memory_bytes / 4).max(4 << 20) & !4095
}

fn read_trim(p: &Path) -> Option<String> {
    std::fs::read_to_string(p).ok().map(|s| s.trim().to_owned())
}

/// Finds a usable hierarchy: v2 when the unified hierarchy offers memory, pids and cpu,
/// else v1 when those controllers (and cpuacct) are mounted.
pub fn probe(subtree: &str) -> Result<Cgroups, JailError> {
    for root in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
        let root = Path::new(root);
        if let Some(c) = read_trim(&root.join("cgroup.controllers")) {
            let have: Vec<&str> = c.split_whitespace().collect();
            if V2_CONTROLLERS.iter().all(|k| have.contains(k)) {
                return Ok(Cgroups {
                    version: CgroupVersion::V2,
                    root: root.into(),
                    subtree: subtree.into(),
                    v1_freezer: false,
                });
            }
        }
    }
    let root = Path::new("/sys/fs/cgroup");
    for c in V1_CONTROLLERS {
        if !root.join(c).join("cgroup.procs").exists() {
            return Err(JailError::MissingFeature {
                feature: "cgroup controllers (memory, pids, cpu)",
                detail: format!(
                    "no cgroup v2 hierarchy with memory+pids+cpu, and no v1 {c} controller"
                ),
            });
        }
    }
    Ok(Cgroups {
        version: CgroupVersion::V1,
        root: root.into(),
        subtree: subtree.into(),
        v1_freezer: root.join(V1_FREEZER).join("cgroup.procs").exists(),
    })
}

fn io(step: String) -> impl FnOnce(std::io::Error) -> JailError {
    move |source| JailError::Sys { step, source }
}

impl Cgroups {
    /// The v1 controllers a sandbox is placed in: [`V1_CONTROLLERS`], then the freezer if
    /// the host has it.
    pub fn v1_controllers(&self) -> Vec<&'static str> {
        let mut c = V1_CONTROLLERS.to_vec();
        if self.v1_freezer {
            c.push(V1_FREEZER);
        }
        c
    }

    /// The directories of a sandbox's cgroup (one per controller on v1, in the order of
    /// [`Cgroups::v1_controllers`]).
    pub fn dirs(&self, id: &str) -> Vec<PathBuf> {
        match self.version {
            CgroupVersion::V2 => vec![self.root.join(&self.subtree).join(id)],
            CgroupVersion::V1 => self
                .v1_controllers()
                .iter()
                .map(|c| self.root.join(c).join(&self.subtree).join(id))
                .collect(),
        }
    }

    /// The file that freezes the cgroup `name`: v1 `freezer.state`, v2 `cgroup.freeze`.
    fn freeze_file(&self, name: &str) -> Option<PathBuf> {
        match self.version {
            CgroupVersion::V2 => Some(
                self.root
                    .join(&self.subtree)
                    .join(name)
                    .join("cgroup.freeze"),
            ),
            CgroupVersion::V1 => self.v1_freezer.then(|| {
                self.root
                    .join(V1_FREEZER)
                    .join(&self.subtree)
                    .join(name)
                    .join("freezer.state")
            }),
        }
    }

    /// The freezer state of the cgroup `name`. An error when the cgroup (or the freezer) is
    /// missing.
    pub fn freezer_state(&self, name: &str) -> Result<FreezerState, JailError> {
        let f = self
            .freeze_file(name)
            .ok_or_else(|| JailError::MissingFeature {
                feature: "cgroup freezer",
                detail: "the v1 freezer controller is not mounted".into(),
            })?;
        match self.version {
            CgroupVersion::V1 => {
                let s = std::fs::read_to_string(&f).map_err(io(format!("read {}", f.display())))?;
                Ok(match s.trim() {
                    "FROZEN" => FreezerState::Frozen,
                    "FREEZING" => FreezerState::Freezing,
                    _ => FreezerState::Thawed,
                })
            }
            CgroupVersion::V2 => {
                let want =
                    std::fs::read_to_string(&f).map_err(io(format!("read {}", f.display())))?;
                let ev = f.with_file_name("cgroup.events");
                let events =
                    std::fs::read_to_string(&ev).map_err(io(format!("read {}", ev.display())))?;
                let frozen = events.lines().any(|l| l.trim() == "frozen 1");
                Ok(match (want.trim() == "1", frozen) {
                    (_, true) => FreezerState::Frozen,
                    (true, false) => FreezerState::Freezing,
                    (false, false) => FreezerState::Thawed,
                })
            }
        }
    }

    /// Freezes every task of the cgroup `name` and waits (polling, at most `within`) until
    /// the kernel reports it frozen. On failure or timeout the cgroup is thawed again.
    pub fn freeze(&self, name: &str, within: Duration) -> Result<(), JailError> {
        let f = self
            .freeze_file(name)
            .ok_or_else(|| JailError::MissingFeature {
                feature: "cgroup freezer",
                detail: "the v1 freezer controller is not mounted".into(),
            })?;
        let on = match self.version {
            CgroupVersion::V1 => "FROZEN",
            CgroupVersion::V2 => "1",
        };
        sys::write_file(&f, on)?;
        let deadline = Instant::now() + within;
        let mut nap = Duration::from_micros(20);
        loop {
            match self.freezer_state(name) {
                Ok(FreezerState::Frozen) => return Ok(()),
                Ok(_) if Instant::now() < deadline => {
                    std::thread::sleep(nap);
                    nap = (nap * 2).min(Duration::from_millis(5));
                }
                Ok(_) => {
                    let _ = self.thaw(name);
                    return Err(JailError::Sys {
                        step: format!("freeze cgroup {name}: still freezing after {within:?}"),
                        source: std::io::Error::from_raw_os_error(libc::ETIMEDOUT),
                    });
                }
                Err(e) => {
                    let _ = self.thaw(name);
                    return Err(e);
                }
            }
        }
    }

    /// Thaws the cgroup `name`: its tasks continue where they were. Returns at once (a thaw
    /// takes effect when the write returns).
    pub fn thaw(&self, name: &str) -> Result<(), JailError> {
        let f = self
            .freeze_file(name)
            .ok_or_else(|| JailError::MissingFeature {
                feature: "cgroup freezer",
                detail: "the v1 freezer controller is not mounted".into(),
            })?;
        let off = match self.version {
            CgroupVersion::V1 => "THAWED",
            CgroupVersion::V2 => "0",
        };
        sys::write_file(&f, off)
    }

    /// Thaws the cgroup `name` if it exists and has a freezer; errors are ignored (used
    /// when tearing down, after SIGKILL: on cgroup v1 a frozen task only dies once thawed).
    pub fn thaw_quiet(&self, name: &str) {
        if let Some(f) = self.freeze_file(name) {
            if f.exists() {
                let _ = std::fs::write(
                    &f,
                    match self.version {
                        CgroupVersion::V1 => "THAWED",
                        CgroupVersion::V2 => "0",
                    },
                );
            }
        }
    }

    /// The `cgroup.procs` files a sandbox's first process is written to.
    pub fn procs_files(&self, id: &str) -> Vec<PathBuf> {
        self.dirs(id)
            .into_iter()
            .map(|d| d.join("cgroup.procs"))
            .collect()
    }

    fn subtree_dirs(&self) -> Vec<PathBuf> {
        match self.version {
            CgroupVersion::V2 => vec![self.root.join(&self.subtree)],
            CgroupVersion::V1 => self
                .v1_controllers()
                .iter()
                .map(|c| self.root.join(c).join(&self.subtree))
                .collect(),
        }
    }

    /// Creates the sandbox's cgroup and writes its limits.
    pub fn create(&self, id: &str, limits: &Limits) -> Result<(), JailError> {
        self.mkdirs(id)?;
        self.set_limits(id, limits)
    }

    /// Creates the (empty, unlimited) cgroup directories `name` under the subtree.
    pub fn mkdirs(&self, name: &str) -> Result<(), JailError> {
        match self.version {
            CgroupVersion::V2 => {
                let sub = self.root.join(&self.subtree);
                if !sub.exists() {
                    std::fs::create_dir(&sub)
                        .or_else(|e| {
                            if e.kind() == std::io::ErrorKind::AlreadyExists {
                                Ok(())
                            } else {
                                Err(e)
                            }
                        })
                        .map_err(io(format!("mkdir {}", sub.display())))?;
                }
                let want = "+memory +pids +cpu";
                let _ = std::fs::write(self.root.join("cgroup.subtree_control"), want);
                sys::write_file(&sub.join("cgroup.subtree_control"), want)?;
                let d = sub.join(name);
                std::fs::create_dir(&d).map_err(io(format!("mkdir {}", d.display())))?;
            }
            CgroupVersion::V1 => {
                for d in self.dirs(name) {
                    std::fs::create_dir_all(&d).map_err(io(format!("mkdir {}", d.display())))?;
                }
            }
        }
        Ok(())
    }

    /// Writes a sandbox's limits into the cgroup `name`.
    ///
    /// On cgroup v1 this includes `memory.kmem.tcp.limit_in_bytes` ([`tcp_limit`]): socket
    /// buffers are charged there and not to the memory limit.
    pub fn set_limits(&self, name: &str, limits: &Limits) -> Result<(), JailError> {
        let quota = ((limits.cpus * CFS_PERIOD_US as f64).round() as u64).max(1000);
        match self.version {
            CgroupVersion::V2 => {
                let d = self.root.join(&self.subtree).join(name);
                sys::write_file(&d.join("memory.max"), &limits.memory_bytes.to_string())?;
                if d.join("memory.swap.max").exists() {
                    sys::write_file(&d.join("memory.swap.max"), "0")?;
                }
                sys::write_file(&d.join("pids.max"), &limits.pids.to_string())?;
                sys::write_file(&d.join("cpu.max"), &format!("{quota} {CFS_PERIOD_US}"))?;
            }
            CgroupVersion::V1 => {
                for (c, d) in V1_CONTROLLERS.iter().zip(self.dirs(name)) {
                    match *c {
                        "memory" => {
                            sys::write_file(
                                &d.join("memory.limit_in_bytes"),
                                &limits.memory_bytes.to_string(),
                            )?;
                            let sw = d.join("memory.memsw.limit_in_bytes");
                            if sw.exists() {
                                sys::write_file(&sw, &limits.memory_bytes.to_string())?;
                            }
                            let _ = std::fs::write(d.join("memory.swappiness"), "0");
                            // v1 keeps TCP buffer memory out of `memory.limit_in_bytes`
                            // (v2 counts it in `memory.max`): give it a bound of its own, a
                            // quarter of the sandbox's memory, so sockets cannot hold host
                            // memory beyond the sandbox's share.
                            let tcp = d.join("memory.kmem.tcp.limit_in_bytes");
                            if tcp.exists() {
                                sys::write_file(&tcp, &tcp_limit(limits.memory_bytes).to_string())?;
                            }
                        }
                        "pids" => sys::write_file(&d.join("pids.max"), &limits.pids.to_string())?,
                        "cpu" => {
                            sys::write_file(
                                &d.join("cpu.cfs_period_us"),
                                &CFS_PERIOD_US.to_string(),
                            )?;
                            sys::write_file(&d.join("cpu.cfs_quota_us"), &quota.to_string())?;
                        }
                        _ => {}
                    }
                }
            }
        }
        Ok(())
    }

    /// Renames the cgroup `from` to `to` (same parent) in every hierarchy. Only cgroup v1
    /// supports this; the processes inside stay where they are and see the new name.
    /// On error, the directories already renamed are renamed back where possible.
    pub fn rename(&self, from: &str, to: &str) -> Result<(), JailError> {
        let (a, b) = (self.dirs(from), self.dirs(to));
        for (i, (f, t)) in a.iter().zip(&b).enumerate() {
            if let Err(e) = std::fs::rename(f, t) {
                for (f2, t2) in a.iter().zip(&b).take(i) {
                    let _ = std::fs::rename(t2, f2);
                }
                return Err(io(format!("rename {} to {}", f.display(), t.display()))(e));
            }
        }
        Ok(())
    }

    /// Writes `pid` into the cgroup `name` (every hierarchy).
    pub fn join(&self, name: &str, pid: i32) -> Result<(), JailError> {
        for f in self.procs_files(name) {
            sys::write_file(&f, &pid.to_string())?;
        }
        Ok(())
    }

    /// Pids in the sandbox's cgroup.
    pub fn pids(&self, id: &str) -> Vec<i32> {
        let mut out = Vec::new();
        for d in self.dirs(id) {
            if let Ok(s) = std::fs::read_to_string(d.join("cgroup.procs")) {
                out.extend(s.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Kills every process of the cgroup, waits until it is empty, removes its directories.
    /// Fine when the cgroup does not exist.
    pub fn destroy(&self, id: &str) -> Result<(), JailError> {
        let deadline = Instant::now() + Duration::from_secs(10);
        // Killed tasks leave the cgroup within microseconds to a few milliseconds: poll with
        // a short, growing nap.
        let mut nap = Duration::from_micros(50);
        let mut snooze = || {
            std::thread::sleep(nap);
            nap = (nap * 2).min(Duration::from_millis(2));
        };
        if self.version == CgroupVersion::V2 {
            let k = self.dirs(id)[0].join("cgroup.kill");
            if k.exists() {
                let _ = std::fs::write(&k, "1");
            }
        }
        loop {
            let pids = self.pids(id);
            if pids.is_empty() {
                break;
            }
            for p in pids {
                // SAFETY: kill(2) with a pid read from the sandbox's own cgroup.
                unsafe { libc::kill(p, libc::SIGKILL) };
            }
            // A frozen (paused) task only acts on its SIGKILL once thawed (cgroup v1); thawed
            // after the kill, it dies before running any more of its own code.
            self.thaw_quiet(id);
            if Instant::now() > deadline {
                return Err(JailError::Sys {
                    step: format!("kill processes of cgroup {id}"),
                    source: std::io::Error::from_raw_os_error(libc::EBUSY),
                });
            }
            snooze();
        }
        for d in self.dirs(id) {
            loop {
                match std::fs::remove_dir(&d) {
                    Ok(()) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                    // A just-killed task can linger in the cgroup for a moment.
                    Err(e)
                        if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline =>
                    {
                        snooze();
                    }
                    Err(e) => return Err(io(format!("rmdir {}", d.display()))(e)),
                }
            }
        }
        Ok(())
    }

    /// Names of the cgroups under the subtree (sandboxes' and pool members').
    pub fn list(&self) -> Vec<String> {
        let mut out = Vec::new();
        for d in self.subtree_dirs() {
            if let Ok(rd) = std::fs::read_dir(&d) {
                for e in rd.flatten() {
                    if e.path().is_dir() {
                        if let Some(n) = e.file_name().to_str() {
                            out.push(n.to_owned());
                        }
                    }
                }
            }
        }
        out.sort();
        out.dedup();
        out
    }

    /// Reads the usage counters.
    pub fn usage(&self, id: &str) -> Result<Usage, JailError> {
        let dirs = self.dirs(id);
        if !dirs[0].exists() {
            return Err(JailError::Sys {
                step: format!("cgroup of {id}"),
                source: std::io::Error::from_raw_os_error(libc::ENOENT),
            });
        }
        let num = |p: PathBuf| {
            read_trim(&p)
                .and_then(|s| s.parse::<u64>().ok())
                .unwrap_or(0)
        };
        Ok(match self.version {
            CgroupVersion::V2 => {
                let d = &dirs[0];
                let cpu = read_trim(&d.join("cpu.stat"))
                    .and_then(|s| {
                        s.lines().find_map(|l| {
                            l.strip_prefix("usage_usec ").and_then(|v| v.parse().ok())
                        })
                    })
                    .unwrap_or(0);
                Usage {
                    memory_bytes: num(d.join("memory.current")),
                    memory_peak_bytes: num(d.join("memory.peak")),
                    cpu_usec: cpu,
                    pids: num(d.join("pids.current")),
                }
            }
            CgroupVersion::V1 => Usage {
                memory_bytes: num(dirs[0].join("memory.usage_in_bytes")),
                memory_peak_bytes: num(dirs[0].join("memory.max_usage_in_bytes")),
                cpu_usec: num(dirs[3].join("cpuacct.usage")) / 1000,
                pids: num(dirs[1].join("pids.current")),
            },
        })
    }
}
