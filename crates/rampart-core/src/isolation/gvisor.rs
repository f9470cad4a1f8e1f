//! The gVisor tier: each sandbox is a `runsc` sandbox (a kernel in user space, the Sentry,
//! serves its system calls; the host sees only the Sentry's small filtered set), running the
//! same agent as PID 1 as the namespace tier does.
//!
//! A sandbox's directory `<data>/gvisor/<id>/` holds:
//! - `disk.img`: its disk, a sparse ext4 image of `disk_bytes` (a clone of a cached empty
//!   one): writing past it is ENOSPC inside, the host's disk untouched;
//! - `config.json`: the OCI bundle `runsc` runs; `rootfs/`, `usr/`, `disk/`: mount points;
//! - `run/`: bound at `/.rampart` inside, where the agent creates its socket
//!   (`/.rampart/agent.sock`, on the host `run/agent.sock`; `runsc --host-uds=create`);
//! - `output.log`: what `runsc` and its sandbox print.
//!
//! The mounts (the disk, an overlay of the template under its `upper/`, and for `/usr` an
//! overlay of the host's `/usr` under `usr-upper/`) are made in a mount namespace of the
//! sandbox's own, by the shell that then execs `runsc`: the host's mount table never sees
//! them, and they go with the sandbox's last process (the loop device detaches itself).
//! Each sandbox has its own cgroup `<subtree>-gvisor/<id>` (the sandbox's memory limit plus
//! the Sentry's overhead, its pids limit times 4 plus the gofer's threads), which `runsc`
//! and everything it starts are in from the first instruction.
//!
//! Pause freezes the cgroup (the Sentry and its tasks stop where they are). A stop (pause to
//! the filesystem) ends the sandbox and keeps its directory; a relaunch boots it again on
//! the same disk.

use super::{
    Capabilities, ColdStop, DiskSource, Freeze, Isolation, IsolationError, LaunchExtras,
    LaunchSpec, Launched, Usage,
};
use rampart_jail::cgroup::Cgroups;
use rampart_types::{SandboxId, Tier};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Memory the Sentry, the gofer and their stubs take beyond the sandbox's own (measured:
/// an idle sandbox's whole cgroup holds about 31 MiB on ptrace).
const OVERHEAD_BYTES: u64 = 128 << 20;
/// How long a sandbox's agent may take to accept connections after `runsc run`.
const AGENT_DEADLINE: Duration = Duration::from_secs(60);
/// How long a stopped sandbox's disk may take to be released by its loop device.
const AT_REST_DEADLINE: Duration = Duration::from_secs(60);
/// How long a freeze may take.
const FREEZE_WITHIN: Duration = Duration::from_secs(10);
/// The directory (under the tier's root) where `runsc` keeps its state (`--root`).
const RUNSC_STATE: &str = ".runsc";
/// The directory of a sandbox's checkpoint, in its directory.
const CHECKPOINT: &str = "checkpoint";
/// The file (in a sandbox's directory) that keeps the sessions of its `runsc` processes.
const SESSIONS: &str = "sessions";
/// The file the agent writes (in `run/`) once it let go of its socket and connections.
const RELEASED: &str = "agent.released";

/// Where `runsc` is and how it runs.
#[derive(Debug, Clone, Default)]
pub struct GvisorConfig {
    /// The `runsc` binary; when unset, `runsc` on the `PATH`.
    pub runsc: Option<PathBuf>,
    /// The platform (`--platform`); when unset, `ptrace`.
    pub platform: Option<String>,
}

/// Errors of the gVisor tier.
#[derive(Debug, thiserror::Error)]
pub enum GvisorError {
    /// A file system step failed.
    #[error("{step}: {source}")]
    Io {
        /// What was being done.
        step: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// `runsc` (or the shell that starts it) failed.
    #[error("{step} failed ({status}): {output}")]
    Runsc {
        /// What was being done.
        step: String,
        /// Its exit status.
        status: String,
        /// What it printed (the end of it).
        output: String,
    },
    /// The sandbox's cgroup.
    #[error(transparent)]
    Cgroup(rampart_jail::JailError),
    /// The sandbox's agent did not come up.
    #[error("the sandbox's agent did not accept connections within {secs} s{log}")]
    AgentTimeout {
        /// The deadline.
        secs: u64,
        /// The end of `runsc`'s log, when there is one.
        log: String,
    },
    /// A path the tier cannot give to overlayfs or to the shell.
    #[error("path {0:?} has a character the gVisor tier cannot pass (':', ',', newline)")]
    BadPath(PathBuf),
}

impl From<GvisorError> for IsolationError {
    fn from(e: GvisorError) -> Self {
        IsolationError::Gvisor(e)
    }
}

fn io(step: impl Into<String>) -> impl FnOnce(std::io::Error) -> GvisorError {
    let step = step.into();
    move |source| GvisorError::Io { step, source }
}

/// The tier.
#[derive(Debug)]
pub struct Gvisor {
    runsc: PathBuf,
    platform: String,
    /// `<data>/gvisor`.
    root: PathBuf,
    agent_bin: PathBuf,
    cgroups: Cgroups,
    /// Where the cached empty disk images are.
    image_cache: PathBuf,
}

/// The `runsc` binary `cfg` names or the `PATH` has; Err: why there is none (the words a
/// gVisor create is refused with).
pub fn find_runsc(cfg: &GvisorConfig) -> Result<PathBuf, String> {
    if let Some(p) = &cfg.runsc {
        return if p.is_file() {
            Ok(p.clone())
        } else {
            Err(format!(
                "runsc is not at {} (the configured path); install gVisor (apt-get install runsc) or fix [gvisor] runsc",
                p.display()
            ))
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into());
    std::env::split_paths(&path)
        .map(|d| d.join("runsc"))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            "runsc is not installed on this node (no runsc on the PATH); install gVisor: apt-get install runsc (scripts/setup-host.sh does)".to_owned()
        })
}

impl Gvisor {
    /// Opens the tier: finds `runsc`, checks that it runs, makes `<data_dir>/gvisor` and
    /// the cgroup subtree `<subtree>-gvisor`. The error says why the tier is not there (it
    /// is what a gVisor create is answered with).
    pub fn open(
        cfg: &GvisorConfig,
        data_dir: &Path,
        agent_bin: &Path,
        subtree: &str,
    ) -> Result<Gvisor, String> {
        let runsc = find_runsc(cfg)?;
        let out = Command::new(&runsc)
            .arg("--version")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run {}: {e}", runsc.display()))?;
        if !out.status.success() {
            return Err(format!(
                "{} --version failed: {}",
                runsc.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let cgroups = rampart_jail::cgroup::probe(&format!("{subtree}-gvisor"))
            .map_err(|e| format!("no cgroups for the gVisor tier: {e}"))?;
        let root = data_dir.join("gvisor");
        std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
            .create(root.join(RUNSC_STATE))
            .map_err(|e| format!("creating {}: {e}", root.display()))?;
        for p in [&root, data_dir, agent_bin] {
            check_path(p).map_err(|e| e.to_string())?;
        }
        Ok(Gvisor {
            runsc,
            platform: cfg.platform.clone().unwrap_or_else(|| "ptrace".into()),
            image_cache: data_dir.join("gvisor").join(".images"),
            root,
            agent_bin: agent_bin.to_owned(),
            cgroups,
        })
    }

    /// The platform `runsc` runs on.
    pub fn platform(&self) -> &str {
        &self.platform
    }

    /// Whether `id` is a sandbox of this tier (its directory is there).
    pub fn holds(&self, id: &SandboxId) -> bool {
        self.dir(id).is_dir()
    }

    fn dir(&self, id: &SandboxId) -> PathBuf {
        self.root.join(id.as_str())
    }

    fn runsc(&self) -> Command {
        let mut c = Command::new(&self.runsc);
        c.arg("--root")
            .arg(self.root.join(RUNSC_STATE))
            .arg("--platform")
            .arg(&self.platform)
            .args([
                "--network",
                "none",
                "--host-uds",
                "create",
                "--ignore-cgroups",
            ])
            .stdin(Stdio::null());
        c
    }

    /// Runs `runsc <args>` and returns what it printed, or why it failed.
    fn run(&self, args: &[&std::ffi::OsStr]) -> Result<String, GvisorError> {
        let out = self
            .runsc()
            .args(args)
            .output()
            .map_err(io(format!("run {}", self.runsc.display())))?;
        if !out.status.success() {
            let words: Vec<_> = args.iter().map(|a| a.to_string_lossy()).collect();
            return Err(GvisorError::Runsc {
                step: format!("runsc {}", words.join(" ")),
                status: out.status.to_string(),
                output: tail(&String::from_utf8_lossy(&out.stderr)),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Sends `sig` (`USR1`) to a sandbox's PID 1, its agent.
    fn signal(&self, id: &SandboxId, sig: &str) -> Result<(), GvisorError> {
        self.run(&["kill".as_ref(), id.as_str().as_ref(), sig.as_ref()])
            .map(drop)
    }

    /// The host pid of a running sandbox's Sentry (what lives as long as the sandbox).
    fn sandbox_pid(&self, id: &SandboxId) -> Result<i32, GvisorError> {
        let out = self.run(&["state".as_ref(), id.as_str().as_ref()])?;
        let v: serde_json::Value = serde_json::from_str(&out).map_err(|e| GvisorError::Runsc {
            step: "runsc state".into(),
            status: "unreadable".into(),
            output: e.to_string(),
        })?;
        v["pid"]
            .as_i64()
            .and_then(|p| i32::try_from(p).ok())
            .filter(|p| *p > 0)
            .ok_or_else(|| GvisorError::Runsc {
                step: "runsc state".into(),
                status: "no pid".into(),
                output: tail(&out),
            })
    }

    /// Writes the bundle of `spec` into `dir` and starts it (the disk made already); with a
    /// checkpoint in `dir/checkpoint`, restores it instead (and removes it once restored).
    fn boot(&self, spec: &LaunchSpec) -> Result<Launched, GvisorError> {
        let dir = self.dir(&spec.id);
        let run = dir.join("run");
        let sock = run.join("agent.sock");
        let _ = std::fs::remove_file(&sock);
        for d in ["rootfs", "usr", "disk", "run"] {
            std::fs::create_dir_all(dir.join(d)).map_err(io(format!("mkdir {d}")))?;
        }
        // The agent's binary is bound over this (empty) file inside `/.rampart`.
        std::fs::write(run.join("rampart-agent"), b"").map_err(io("agent mount point"))?;
        let (lower, usr_lower) = self.lowers(spec)?;
        let config = oci_config(spec, &dir, &self.agent_bin, usr_lower.is_some());
        std::fs::write(
            dir.join("config.json"),
            serde_json::to_vec_pretty(&config).unwrap_or_default(),
        )
        .map_err(io("write config.json"))?;
        // The cgroup first: the shell joins it, and `runsc` and everything it starts are in
        // it from their first instruction.
        let mut limits = spec.limits.clone();
        limits.memory_bytes = limits.memory_bytes.saturating_add(OVERHEAD_BYTES);
        limits.pids = limits.pids.saturating_mul(4).saturating_add(512);
        let name = spec.id.as_str();
        self.cgroups
            .create(name, &limits)
            .map_err(GvisorError::Cgroup)?;
        let procs: Vec<String> = self
            .cgroups
            .procs_files(name)
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("output.log"))
            .map_err(io("open output.log"))?;
        // Where this boot's lines begin (the log keeps every boot's).
        let log_start = log.metadata().map(|m| m.len()).unwrap_or(0);
        let log2 = log.try_clone().map_err(io("dup output.log"))?;
        let image = dir.join(CHECKPOINT);
        let restore = image.join("checkpoint.img").is_file();
        let mut runsc = self.runsc();
        if restore {
            runsc
                .args(["restore", "--detach", "--image-path"])
                .arg(&image);
        } else {
            runsc.args(["run", "--detach"]);
        }
        runsc.arg("--bundle").arg(&dir).arg(name);
        let argv: Vec<String> = std::iter::once(runsc.get_program())
            .chain(runsc.get_args())
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        // Detached `runsc` keeps what it was given as stdout open for the sandbox's life:
        // a file, never a pipe (a pipe would never see its end).
        let status = Command::new("unshare")
            .args([
                "--mount",
                "--propagation",
                "private",
                "--",
                "/bin/sh",
                "-ec",
            ])
            .arg(MOUNT_AND_RUN)
            .arg("rampart-gvisor")
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("PROCS", procs.join("\n"))
            .env("DIR", &dir)
            .env("LOWER", &lower)
            .env("USR_LOWER", usr_lower.as_deref().unwrap_or(""))
            .args(&argv)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .status()
            .map_err(io("run unshare (util-linux)"))?;
        if !status.success() {
            return Err(GvisorError::Runsc {
                step: if restore {
                    "runsc restore (of the sandbox's saved processes)".into()
                } else {
                    "runsc run".into()
                },
                status: status.to_string(),
                output: first_words(&dir.join("output.log"), log_start),
            });
        }
        let pid = self.sandbox_pid(&spec.id)?;
        if restore {
            // The agent let go of its socket before the checkpoint: it binds it again.
            self.signal(&spec.id, "USR1")?;
        }
        wait_for_agent(&sock, &dir)?;
        // The sessions of its processes, for whoever ends it (see `end`).
        let pids = self.cgroups.pids(name);
        let mut text: Vec<String> = sessions(&pids).iter().map(|s| format!("s {s}")).collect();
        text.extend(
            pids.iter()
                .filter_map(|&p| proc_stat(p).map(|(_, _, _, t)| format!("p {p} {t}"))),
        );
        std::fs::write(dir.join(SESSIONS), text.join("\n")).map_err(io("write sessions"))?;
        if restore {
            // Restored: the checkpoint has served (a later stop makes a new one or none).
            std::fs::remove_dir_all(&image).map_err(io("remove the checkpoint"))?;
        }
        Ok(Launched {
            pid,
            agent_socket: sock,
            restored: restore,
        })
    }

    /// The overlay's lower directories of `/` (top first, `:`-separated) and, when `/usr`
    /// is a mount of its own, those of `/usr`.
    fn lowers(&self, spec: &LaunchSpec) -> Result<(String, Option<String>), GvisorError> {
        let join = |ds: Vec<PathBuf>| -> Result<String, GvisorError> {
            let mut out = Vec::new();
            for d in ds {
                check_path(&d)?;
                out.push(d.to_string_lossy().into_owned());
            }
            Ok(out.join(":"))
        };
        let host_usr = PathBuf::from("/usr");
        if spec.layers.is_empty() {
            let rootfs = spec.template_dir.join("rootfs");
            if !rootfs.is_dir() {
                return Err(GvisorError::Io {
                    step: format!("template {}", spec.template_dir.display()),
                    source: std::io::Error::from_raw_os_error(libc::ENOENT),
                });
            }
            return Ok((join(vec![rootfs])?, Some(join(vec![host_usr])?)));
        }
        let mut root: Vec<PathBuf> = spec.layers.iter().rev().cloned().collect();
        if spec.layers_on_base {
            root.push(spec.template_dir.join("rootfs"));
            let mut usr: Vec<PathBuf> = spec
                .layers
                .iter()
                .rev()
                .map(|l| l.join("usr"))
                .filter(|u| u.is_dir())
                .collect();
            usr.push(host_usr);
            return Ok((join(root)?, Some(join(usr)?)));
        }
        Ok((join(root)?, None))
    }

    /// Makes the sandbox's directory and disk (a clone of the cached empty image).
    fn make_disk(&self, spec: &LaunchSpec) -> Result<(), GvisorError> {
        let dir = self.dir(&spec.id);
        std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700)
            .create(&dir)
            .map_err(io(format!("mkdir {}", dir.display())))?;
        let empty = rampart_jail::disk::cached_image(&self.image_cache, spec.limits.disk_bytes)
            .map_err(GvisorError::Cgroup)?;
        rampart_jail::store::clone_file(&empty, &dir.join("disk.img"))
            .map_err(GvisorError::Cgroup)?;
        Ok(())
    }

    /// Launches `spec` from a saved sandbox: a copy of its disk (`disk.image`) and, when one
    /// is beside it (`checkpoint/` in the image's directory), of its memory: the new
    /// sandbox's processes continue from where the saved ones were (`runsc restore` under
    /// the new id, in the new directory; the image is only read). Nothing is left on error.
    pub fn launch_from(
        &self,
        spec: &LaunchSpec,
        disk: &DiskSource,
    ) -> Result<Launched, IsolationError> {
        let dir = self.dir(&spec.id);
        let made = (|| -> Result<Launched, GvisorError> {
            std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700)
                .create(&dir)
                .map_err(io(format!("mkdir {}", dir.display())))?;
            rampart_jail::store::clone_file(&disk.image, &dir.join("disk.img"))
                .map_err(GvisorError::Cgroup)?;
            let saved = disk.image.with_file_name(CHECKPOINT);
            if saved.join("checkpoint.img").is_file() {
                copy_private(&saved, &dir.join(CHECKPOINT))?;
            }
            let launched = self.boot(spec)?;
            if launched.restored {
                // A restore keeps the saved sandbox's host name (runsc takes it from the
                // image, not the bundle): this one gets its own.
                self.run(&[
                    "exec".as_ref(),
                    "--cap".as_ref(),
                    "CAP_SYS_ADMIN".as_ref(),
                    spec.id.as_str().as_ref(),
                    "/bin/hostname".as_ref(),
                    spec.hostname.as_ref(),
                ])?;
            }
            Ok(launched)
        })();
        made.map_err(|e| {
            let _ = Isolation::destroy(self, &spec.id);
            e.into()
        })
    }

    /// Copies sandbox `id`, saved to disk with its memory and at rest ([`ColdStop::checkpoint`]),
    /// to `dest` (its disk) and, with `memory`, `checkpoint/` beside `dest` (its processes):
    /// what [`Gvisor::launch_from`] starts from. Returns the bytes the copy holds.
    pub fn copy_saved(
        &self,
        id: &SandboxId,
        dest: &Path,
        memory: bool,
    ) -> Result<u64, GvisorError> {
        let dir = self.dir(id);
        let image = dir.join(CHECKPOINT);
        if memory && !image.join("checkpoint.img").is_file() {
            return Err(GvisorError::Io {
                step: format!("sandbox {id} has no saved memory to copy"),
                source: std::io::Error::from_raw_os_error(libc::ENOENT),
            });
        }
        wait_loop_released(&dir.join("disk.img"))?;
        rampart_jail::store::clone_file(&dir.join("disk.img"), dest)
            .map_err(GvisorError::Cgroup)?;
        let mut bytes = super::allocated_bytes(dest);
        if memory {
            let to = dest.with_file_name(CHECKPOINT);
            copy_private(&image, &to)?;
            for e in std::fs::read_dir(&to).into_iter().flatten().flatten() {
                bytes += super::allocated_bytes(&e.path());
            }
        }
        Ok(bytes)
    }

    /// [`Gvisor::end`], keeping its directory, and waits until its disk is at rest: the
    /// disk's file system goes with the mount namespace (its writes flushed by the unmount)
    /// and its loop device detaches itself after it.
    fn end_at_rest(&self, id: &SandboxId) -> Result<(), GvisorError> {
        self.end(id)?;
        let dir = self.dir(id);
        let _ = std::fs::remove_file(dir.join("run/agent.sock"));
        wait_loop_released(&dir.join("disk.img"))
    }

    /// Ends a sandbox's processes (its cgroup killed) and forgets it in `runsc`; its
    /// directory stays.
    fn end(&self, id: &SandboxId) -> Result<(), GvisorError> {
        // The cgroup, not `runsc kill`: a frozen (paused) Sentry never answers `runsc`, and
        // the cgroup holds every process of the sandbox, `runsc`'s own included.
        let name = id.as_str();
        let deadline = Instant::now() + Duration::from_secs(10);
        let dir = self.dir(id);
        // The sessions of its processes: those written at its boot (a process that exited
        // by itself, as after a checkpoint, is no longer in the cgroup's list) and those
        // found now.
        let kept = std::fs::read_to_string(dir.join(SESSIONS)).unwrap_or_default();
        let mut sids = std::collections::BTreeSet::new();
        let mut known = Vec::new();
        for l in kept.lines() {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f.as_slice() {
                ["s", sid] => sids.extend(sid.parse::<i32>().ok()),
                ["p", pid, t] => known.extend(pid.parse::<i32>().ok().zip(t.parse::<u64>().ok())),
                _ => {}
            }
        }
        sids.extend(sessions(&self.cgroups.pids(name)));
        loop {
            let pids = self.cgroups.pids(name);
            for &p in &pids {
                let mut status = 0;
                // SAFETY: kill(2) on a pid read from this sandbox's own cgroup, then
                // waitpid(2) with WNOHANG on it: reaped if it is a dead child of ours (the
                // gofer is, and shares the daemon's session), else nothing happens.
                unsafe {
                    libc::kill(p, libc::SIGKILL);
                    libc::waitpid(p, &mut status, libc::WNOHANG);
                }
            }
            // Killed tasks of a frozen (v1) cgroup act on their SIGKILL once thawed.
            self.cgroups.thaw_quiet(name);
            // Zombies stay listed (cgroup v1) until reaped.
            reap_sessions(&sids, &known, Instant::now());
            if pids.is_empty() || Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        reap_sessions(&sids, &known, deadline);
        self.cgroups.destroy(name).map_err(GvisorError::Cgroup)?;
        let _ = std::fs::remove_file(dir.join(SESSIONS));
        // Its state in `runsc`'s root (never `runsc delete`: with the sandbox gone it waits
        // 5 s for an answer that cannot come). A sandbox `runsc` never knew has nothing there.
        let state = self.root.join(RUNSC_STATE);
        if let Ok(rd) = std::fs::read_dir(&state) {
            for e in rd.flatten() {
                let n = e.file_name();
                if n.to_string_lossy().starts_with(id.as_str()) {
                    let p = e.path();
                    let _ = std::fs::remove_dir_all(&p).or_else(|_| std::fs::remove_file(&p));
                }
            }
        }
        Ok(())
    }
}

/// `/proc/<pid>/stat`'s state, parent, session and start time.
fn proc_stat(pid: i32) -> Option<(char, i32, i32, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command's closing parenthesis: state, ppid, pgrp, session, ..., and the
    // start time 19 fields after the state.
    let f: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let state = f.first()?.chars().next()?;
    Some((
        state,
        f.get(1)?.parse().ok()?,
        f.get(3)?.parse().ok()?,
        f.get(19)?.parse().ok()?,
    ))
}

/// The sessions of `pids` (runsc's sandbox and gofer each lead one; their processes share it).
/// The daemon's own session (a gofer may share it) is never one of them.
fn sessions(pids: &[i32]) -> std::collections::BTreeSet<i32> {
    let own = proc_stat(std::process::id() as i32).map(|(_, _, sid, _)| sid);
    pids.iter()
        .filter_map(|&p| proc_stat(p).map(|(_, _, sid, _)| sid))
        .filter(|&sid| sid > 1 && Some(sid) != own)
        .collect()
}

/// Reaps every zombie child of this process in one of `sids`, until no process of those
/// sessions is left or `deadline` passes. The Sentry's and gofer's processes outlive the
/// `runsc` that started them, so they are this daemon's (a child subreaper) once their
/// parents die, one generation at a time.
///
/// `known` are processes seen at its boot (`pid start-time`): the gofer shares the daemon's
/// session, so it is found by its pid (and start time, against reuse).
fn reap_sessions(sids: &std::collections::BTreeSet<i32>, known: &[(i32, u64)], deadline: Instant) {
    let me = std::process::id() as i32;
    for &(pid, start) in known {
        if proc_stat(pid).is_some_and(|(st, ppid, _, t)| st == 'Z' && ppid == me && t == start) {
            let mut status = 0;
            // SAFETY: waitpid(2) with WNOHANG on a zombie child of this process.
            unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        }
    }
    if sids.is_empty() {
        return;
    }
    loop {
        let mut left = 0;
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            let Some((state, ppid, sid, _)) = proc_stat(pid) else {
                continue;
            };
            if !sids.contains(&sid) {
                continue;
            }
            if state == 'Z' && ppid == me {
                let mut status = 0;
                // SAFETY: waitpid(2) with WNOHANG on a zombie child of this process.
                unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            } else {
                left += 1;
            }
        }
        if left == 0 || Instant::now() > deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// What the shell in the sandbox's own mount namespace does before it execs `runsc` (its
/// arguments): joins the cgroup, mounts the disk and the overlays, and makes the root's
/// top directory and `/tmp` what a root file system has.
const MOUNT_AND_RUN: &str = r#"
printf '%s\n' "$PROCS" | while IFS= read -r f; do [ -z "$f" ] || echo $$ > "$f"; done
mount -o loop,nosuid,nodev -t ext4 "$DIR/disk.img" "$DIR/disk"
mkdir -p "$DIR/disk/upper" "$DIR/disk/work" "$DIR/disk/usr-upper" "$DIR/disk/usr-work"
chmod 0755 "$DIR/disk/upper" "$DIR/disk/usr-upper"
mount -t overlay overlay -o "lowerdir=$LOWER,upperdir=$DIR/disk/upper,workdir=$DIR/disk/work" "$DIR/rootfs"
if [ -n "$USR_LOWER" ]; then
  mount -t overlay overlay -o "lowerdir=$USR_LOWER,upperdir=$DIR/disk/usr-upper,workdir=$DIR/disk/usr-work" "$DIR/usr"
fi
mkdir -p "$DIR/rootfs/tmp" "$DIR/rootfs/.rampart"
chmod 1777 "$DIR/rootfs/tmp"
exec "$@"
"#;

/// Copies the files of directory `from` (a checkpoint: plain files) into a new directory
/// `to`, both private to the daemon (0700, files 0600).
fn copy_private(from: &Path, to: &Path) -> Result<(), GvisorError> {
    use std::os::unix::fs::PermissionsExt as _;
    std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700)
        .create(to)
        .map_err(io(format!("mkdir {}", to.display())))?;
    let entries = std::fs::read_dir(from).map_err(io(format!("list {}", from.display())))?;
    for e in entries {
        let e = e.map_err(io(format!("list {}", from.display())))?;
        let (src, dst) = (e.path(), to.join(e.file_name()));
        if !e.file_type().map_err(io("file type"))?.is_file() {
            continue;
        }
        std::fs::copy(&src, &dst).map_err(io(format!("copy {}", src.display())))?;
        std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(0o600))
            .map_err(io(format!("chmod {}", dst.display())))?;
    }
    Ok(())
}

/// A path the tier passes to overlayfs options and the shell.
fn check_path(p: &Path) -> Result<(), GvisorError> {
    let s = p.to_string_lossy();
    if s.contains([':', ',', '\n']) {
        return Err(GvisorError::BadPath(p.to_owned()));
    }
    Ok(())
}

/// Whether a checkpoint of a sandbox using `need` bytes of memory fits in `free` bytes of
/// the node's disk, beside the daemon's reserve: a 400 naming `disk` when it does not.
fn room_for_checkpoint(need: u64, free: u64) -> Result<(), IsolationError> {
    let want = need.saturating_add(crate::capacity::RESERVE_BYTES);
    if free >= want {
        return Ok(());
    }
    Err(IsolationError::Refused {
        field: "disk",
        message: format!(
            "no room to save this sandbox's memory: about {} MiB needed (its memory plus the node's {} MiB reserve), {} MiB free on the node's data disk; pause it with its memory kept in RAM or to its filesystem",
            want >> 20,
            crate::capacity::RESERVE_BYTES >> 20,
            free >> 20
        ),
    })
}

/// What `runsc` said first in the log `path` from byte `from` on: its error, without the
/// Go stack that may follow it.
fn first_words(path: &Path, from: u64) -> String {
    use std::io::{Read as _, Seek as _};
    let mut text = String::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let _ = f.seek(std::io::SeekFrom::Start(from));
        let _ = f.take(64 << 10).read_to_string(&mut text);
    }
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(|l| l.trim_end_matches(':').to_owned())
        .unwrap_or_else(|| "(it printed nothing)".into())
}

/// The last lines of `s` (an error message's worth).
fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.trim().lines().collect();
    lines[lines.len().saturating_sub(8)..].join("\n")
}

/// Waits until the agent accepts on `sock`.
fn wait_for_agent(sock: &Path, dir: &Path) -> Result<(), GvisorError> {
    let t0 = Instant::now();
    let mut pause = Duration::from_millis(1);
    loop {
        if std::os::unix::net::UnixStream::connect(sock).is_ok() {
            return Ok(());
        }
        if t0.elapsed() > AGENT_DEADLINE {
            let log = std::fs::read_to_string(dir.join("output.log")).unwrap_or_default();
            return Err(GvisorError::AgentTimeout {
                secs: AGENT_DEADLINE.as_secs(),
                log: if log.trim().is_empty() {
                    String::new()
                } else {
                    format!(": {}", tail(&log))
                },
            });
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

/// Waits until no loop device is backed by `image` (its last mount is gone, its writes on
/// the image): what makes a stopped disk at rest.
fn wait_loop_released(image: &Path) -> Result<(), GvisorError> {
    let want = image.to_string_lossy().into_owned();
    let held = || {
        std::fs::read_dir("/sys/block")
            .map(|rd| {
                rd.flatten().any(|e| {
                    std::fs::read_to_string(e.path().join("loop/backing_file"))
                        .is_ok_and(|b| b.trim_end() == want)
                })
            })
            .unwrap_or(false)
    };
    let t0 = Instant::now();
    while held() {
        if t0.elapsed() > AT_REST_DEADLINE {
            return Err(GvisorError::Io {
                step: format!("waiting for the loop device of {want} to be released"),
                source: std::io::Error::from_raw_os_error(libc::EBUSY),
            });
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

/// The capabilities the agent (root inside) keeps: Docker's default set (gVisor's own,
/// never the host's).
const CAPS: &[&str] = &[
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_RAW",
    "CAP_SYS_CHROOT",
    "CAP_MKNOD",
    "CAP_AUDIT_WRITE",
    "CAP_SETFCAP",
];

/// The OCI runtime configuration of a sandbox.
fn oci_config(spec: &LaunchSpec, dir: &Path, agent: &Path, usr: bool) -> serde_json::Value {
    use serde_json::json;
    let mut env: Vec<String> = spec
        .env
        .iter()
        .filter(|(k, _)| !k.is_empty() && !k.contains('='))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    if !spec.env.iter().any(|(k, _)| k == "PATH") {
        env.push("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into());
    }
    let mut args = vec![
        "/.rampart/rampart-agent".to_owned(),
        "--listen".into(),
        "/.rampart/agent.sock".into(),
    ];
    args.extend(spec.agent_args.iter().cloned());
    let mut mounts = vec![
        json!({"destination": "/proc", "type": "proc", "source": "proc"}),
        json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
               "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}),
        json!({"destination": "/dev/pts", "type": "devpts", "source": "devpts",
               "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]}),
        json!({"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
               "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]}),
        json!({"destination": "/sys", "type": "sysfs", "source": "sysfs",
               "options": ["nosuid", "noexec", "nodev", "ro"]}),
        // Bound from the root's own /tmp: on its disk, not a tmpfs in the Sentry's memory.
        json!({"destination": "/tmp", "type": "bind", "source": dir.join("rootfs/tmp"),
               "options": ["rbind", "rw"]}),
        json!({"destination": "/.rampart", "type": "bind", "source": dir.join("run"),
               "options": ["rbind", "rw", "nosuid", "nodev"]}),
        json!({"destination": "/.rampart/rampart-agent", "type": "bind", "source": agent,
               "options": ["bind", "ro"]}),
    ];
    if usr {
        mounts.push(
            json!({"destination": "/usr", "type": "bind", "source": dir.join("usr"),
                           "options": ["rbind", "rw", "nosuid", "nodev"]}),
        );
    }
    json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": 0, "gid": 0},
            "args": args,
            "env": env,
            "cwd": "/",
            "capabilities": {
                "bounding": CAPS, "effective": CAPS, "permitted": CAPS,
            },
            "rlimits": [{"type": "RLIMIT_NOFILE",
                         "hard": spec.limits.open_files, "soft": spec.limits.open_files}],
            "noNewPrivileges": false,
        },
        "root": {"path": dir.join("rootfs"), "readonly": false},
        "hostname": spec.hostname,
        "mounts": mounts,
        "linux": {
            "namespaces": [
                {"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"},
            ],
        },
    })
}

impl Isolation for Gvisor {
    fn name(&self) -> &'static str {
        "gvisor"
    }
    fn prepare_template(&self, name: &str, _dest: &Path) -> Result<(), IsolationError> {
        // Templates are the namespace tier's to build; this tier runs them.
        Err(IsolationError::UnknownTemplate(name.to_owned()))
    }
    fn offers(&self, tier: Tier) -> bool {
        tier == Tier::Gvisor
    }
    fn launch(&self, spec: &LaunchSpec) -> Result<Launched, IsolationError> {
        if !spec.files.is_empty() {
            return Err(IsolationError::NotOnTier(
                "the gvisor tier has no sandbox network yet (files written at launch are the network's)".into(),
            ));
        }
        let made = self.make_disk(spec).and_then(|()| self.boot(spec));
        made.map_err(|e| {
            let _ = Isolation::destroy(self, &spec.id);
            e.into()
        })
    }
    fn destroy(&self, id: &SandboxId) -> Result<(), IsolationError> {
        self.end(id)?;
        let dir = self.dir(id);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(GvisorError::Io {
                step: format!("remove {}", dir.display()),
                source: e,
            }
            .into()),
        }
    }
    fn leftovers(&self) -> Result<Vec<SandboxId>, IsolationError> {
        let rd = match std::fs::read_dir(&self.root) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io(format!("list {}", self.root.display()))(e).into()),
        };
        Ok(rd
            .flatten()
            .filter_map(|e| SandboxId::parse(&e.file_name().to_string_lossy()).ok())
            .collect())
    }
    fn usage(&self, id: &SandboxId) -> Result<Usage, IsolationError> {
        Ok(self
            .cgroups
            .usage(id.as_str())
            .map_err(GvisorError::Cgroup)?)
    }
    fn capabilities(&self) -> Capabilities<'_> {
        Capabilities {
            freeze: Some(self),
            cold: Some(self),
            ..Capabilities::default()
        }
    }
}

impl Freeze for Gvisor {
    fn freeze(&self, id: &SandboxId) -> Result<(), IsolationError> {
        self.cgroups
            .freeze(id.as_str(), FREEZE_WITHIN)
            .map_err(|e| GvisorError::Cgroup(e).into())
    }
    fn thaw(&self, id: &SandboxId) -> Result<(), IsolationError> {
        self.cgroups
            .thaw(id.as_str())
            .map_err(|e| GvisorError::Cgroup(e).into())
    }
    fn is_frozen(&self, id: &SandboxId) -> Result<bool, IsolationError> {
        Ok(self
            .cgroups
            .freezer_state(id.as_str())
            .map_err(GvisorError::Cgroup)?
            == rampart_jail::cgroup::FreezerState::Frozen)
    }
}

impl ColdStop for Gvisor {
    fn stop(&self, id: &SandboxId) -> Result<(), IsolationError> {
        Ok(self.end_at_rest(id)?)
    }
    fn relaunch(
        &self,
        spec: &LaunchSpec,
        extras: &LaunchExtras,
    ) -> Result<Launched, IsolationError> {
        if !extras.is_empty() {
            return Err(IsolationError::NotOnTier(
                "the gvisor tier has no volumes or snapshots".into(),
            ));
        }
        // Never two mounts of one disk: the last boot's is gone first.
        wait_loop_released(&self.dir(&spec.id).join("disk.img"))?;
        self.boot(spec).map_err(|e| {
            let _ = self.end(&spec.id);
            e.into()
        })
    }
    fn is_stopped(&self, id: &SandboxId) -> bool {
        self.holds(id) && self.cgroups.pids(id.as_str()).is_empty()
    }
    fn can_checkpoint(&self, id: &SandboxId) -> bool {
        self.holds(id)
    }
    fn copy_saved(&self, id: &SandboxId, dest: &Path, memory: bool) -> Result<u64, IsolationError> {
        Ok(Gvisor::copy_saved(self, id, dest, memory)?)
    }
    fn room_to_checkpoint(&self, id: &SandboxId) -> Result<(), IsolationError> {
        // Its image is about the memory the sandbox uses.
        let need = self
            .cgroups
            .usage(id.as_str())
            .map(|u| u.memory_bytes)
            .unwrap_or(0);
        let (free, _) = crate::capacity::statvfs(&self.root)
            .map_err(io(format!("statvfs {}", self.root.display())))?;
        room_for_checkpoint(need, free)
    }
    fn discard_saved(&self, id: &SandboxId) -> Result<(), IsolationError> {
        match std::fs::remove_dir_all(self.dir(id).join(CHECKPOINT)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(io("remove the saved processes")(e).into())
            }
            _ => Ok(()),
        }
    }
    fn checkpoint(&self, id: &SandboxId) -> Result<(), IsolationError> {
        let dir = self.dir(id);
        let image = dir.join(CHECKPOINT);
        let released = dir.join("run").join(RELEASED);
        let _ = std::fs::remove_file(&released);
        let _ = std::fs::remove_dir_all(&image);
        // A frozen sandbox runs again for the checkpoint (runsc talks to its Sentry).
        self.cgroups
            .thaw(id.as_str())
            .map_err(GvisorError::Cgroup)?;
        // The agent's socket is the host's (`--host-uds`), which gVisor cannot save: the
        // agent closes it and its connections first (its processes run on), and says so.
        self.signal(id, "USR2")?;
        let t0 = Instant::now();
        while !released.exists() {
            if t0.elapsed() > AGENT_DEADLINE {
                let _ = self.signal(id, "USR1");
                return Err(GvisorError::AgentTimeout {
                    secs: AGENT_DEADLINE.as_secs(),
                    log: ": (letting go of its socket for a checkpoint)".into(),
                }
                .into());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = std::fs::remove_file(&released);
        std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700)
            .create(&image)
            .map_err(io("mkdir checkpoint"))?;
        let saved = self.run(&[
            "checkpoint".as_ref(),
            "--image-path".as_ref(),
            image.as_os_str(),
            id.as_str().as_ref(),
        ]);
        if let Err(e) = saved {
            // Nothing saved: the sandbox runs on as it was, its agent listening again.
            let _ = std::fs::remove_dir_all(&image);
            let _ = self.signal(id, "USR1");
            return Err(e.into());
        }
        // The image is the sandbox's memory: private to the daemon.
        for e in std::fs::read_dir(&image).into_iter().flatten().flatten() {
            let _ = std::fs::set_permissions(
                e.path(),
                std::os::unix::fs::PermissionsExt::from_mode(0o600),
            );
        }
        Ok(self.end_at_rest(id)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_that_does_not_fit_the_disk_is_refused_naming_disk() {
        let reserve = crate::capacity::RESERVE_BYTES;
        assert!(room_for_checkpoint(100 << 20, reserve + (100 << 20)).is_ok());
        match room_for_checkpoint(100 << 20, reserve + (99 << 20)) {
            Err(IsolationError::Refused { field, message }) => {
                assert_eq!(field, "disk");
                assert!(message.contains("no room"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn runscs_first_words_are_its_error_without_the_go_stack() {
        let d = tempfile::tempdir().unwrap();
        let log = d.path().join("output.log");
        std::fs::write(
            &log,
            "old boot\n\nrestoring container \"x\": header error: unexpected EOF:\ngoroutine 19 [running]:\n",
        )
        .unwrap();
        assert_eq!(
            first_words(&log, 9),
            "restoring container \"x\": header error: unexpected EOF"
        );
        assert_eq!(
            first_words(&d.path().join("none"), 0),
            "(it printed nothing)"
        );
    }
}
