//! [`FakeTier`]: `rampart-agent` as a plain child process, for tests and development.

use super::{Capabilities, Freeze, Isolation, IsolationError, LaunchSpec, Launched, Usage};
use rampart_types::SandboxId;
use std::collections::{HashMap, HashSet};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The file of a sandbox's directory naming its agent: `<pid> <start time>`.
const INIT_FILE: &str = "init";
/// The agent's socket, in the sandbox's directory.
const SOCKET_FILE: &str = "agent.sock";
/// The agent's stdout and stderr, in the sandbox's directory.
const LOG_FILE: &str = "agent.log";
/// The working directory of the agent and the default one of its processes.
const HOME_DIR: &str = "home";
/// The variable telling the agent which descriptor is its listening socket.
const AGENT_FD_ENV: &str = "RAMPART_AGENT_FD";
/// The descriptor number the agent finds its listening socket at.
const AGENT_FD: i32 = 3;
/// Longest path a Unix socket address holds (`sun_path` less its NUL).
const SOCKET_PATH_MAX: usize = 107;
/// How long stopping (freeze, destroy) or killing every process of a sandbox may take.
const SIGNAL_DEADLINE: Duration = Duration::from_secs(5);

/// Errors of the fake tier.
#[derive(Debug, thiserror::Error)]
pub enum FakeTierError {
    /// A file or process operation failed.
    #[error("{step}: {source}")]
    Io {
        /// What was being done.
        step: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The sandbox has no live agent (never launched, destroyed, or its agent died).
    #[error("sandbox {0} has no running agent in the fake tier")]
    NotRunning(SandboxId),
    /// Not every process of the sandbox stopped in time.
    #[error("sandbox {id}: {left} process(es) did not stop within {} ms", SIGNAL_DEADLINE.as_millis())]
    NotStopped {
        /// The sandbox.
        id: SandboxId,
        /// How many were still running.
        left: usize,
    },
    /// The tier cannot do this.
    #[error("{0}")]
    Unsupported(String),
}

impl From<FakeTierError> for IsolationError {
    fn from(e: FakeTierError) -> Self {
        match e {
            FakeTierError::Unsupported(m) => IsolationError::Unsupported(m),
            other => IsolationError::Fake(other),
        }
    }
}

fn io_err(step: impl Into<String>) -> impl FnOnce(io::Error) -> FakeTierError {
    let step = step.into();
    move |source| FakeTierError::Io { step, source }
}

/// A test and development tier: each sandbox is the real `rampart-agent` binary started as
/// a plain child process of the daemon, with no namespace, cgroup, seccomp filter, uid
/// range or disk of its own. **It isolates nothing**: every process of a sandbox runs as
/// the daemon's user on the host's filesystem. It exists so that the manager's lifecycle
/// (create, exec, the reaper, init watching, restart recovery, the audit record) runs, and
/// is tested, without root ([`crate::Manager::start_with`]). The daemon never uses it
/// (`Manager::start` builds the namespace tier).
///
/// Layout: one directory per sandbox, `<root>/<id>/`, private to the daemon (0700),
/// holding `agent.sock` (the agent's socket, bound and listening before the agent starts),
/// `agent.log` (its stdout and stderr), `home/` (the working directory of every process
/// unless an exec asks for another) and `init` (the agent's pid and start time, which
/// [`Isolation::destroy`] checks before it signals anything).
///
/// - **Launch** starts the agent with exactly the spec's environment,
///   `--default-user <the daemon's uid>` (so the agent never switches users) and
///   `--default-cwd <root>/<id>/home`, in a process group of its own. The pid returned is the
///   agent's own: the daemon's child, which the manager watches and reaps. Built templates
///   (layers), snapshots and volumes are refused (Unsupported); `limits`, `hostname` and
///   `uid_base` are not applied.
/// - **The sandbox's processes** are the agent and its descendants (the agent is a child
///   subreaper, so orphans of its processes stay below it). They are found by walking
///   `/proc` from the agent and signalled through pidfds. Processes that outlive the agent
///   (it died by itself) are out of reach: they are reparented above it and keep running.
/// - **Destroy** stops every process of the sandbox (SIGSTOP, until none is left running and
///   none new appears), kills them all (SIGKILL), waits for them, reaps those that are the
///   daemon's children, and removes the directory. Idempotent.
/// - **Freeze / thaw** are SIGSTOP / SIGCONT of every process of the sandbox. Unlike a
///   cgroup freezer this is visible to them, and a process of the sandbox can SIGCONT
///   another; a process stopped by its own job control is continued by a thaw.
/// - **Usage** reads `/proc`: CPU time is the user + system time of the sandbox's live
///   processes plus that of the children they reaped (clock-tick resolution), memory the
///   sum of their resident sets; peak memory is unknown (0).
/// - No store: no snapshots, fork or volumes (no [`crate::Disks`] capability), no access
///   to a writable layer (so no `fs_diff` records), no counter files.
#[derive(Debug)]
pub struct FakeTier {
    root: PathBuf,
    agent_bin: PathBuf,
}

impl FakeTier {
    /// The agent a test of this workspace runs: `RAMPART_TEST_AGENT`, else the
    /// `rampart-agent` built next to the running test (`target/<profile>/deps/<test>` ->
    /// `target/<profile>/rampart-agent`). Panics, saying how to build it, when it is
    /// missing: for tests only.
    pub fn test_agent() -> PathBuf {
        if let Some(p) = std::env::var_os("RAMPART_TEST_AGENT") {
            return PathBuf::from(p);
        }
        let exe = std::env::current_exe().expect("current exe");
        let bin = exe
            .parent()
            .and_then(Path::parent)
            .expect("target directory")
            .join("rampart-agent");
        assert!(
            bin.exists(),
            "{} is not built: cargo build --workspace --bins (or set RAMPART_TEST_AGENT)",
            bin.display()
        );
        bin
    }

    /// The configuration a workspace test runs core with on this tier, its state under
    /// `data_dir`: the [`FakeTier::test_agent`], no jailer, no sandbox network (the tier has
    /// no network namespace to wire), and disk admission overcommitted (its sandboxes take
    /// no disk, but admission counts their quotas).
    pub fn test_config(data_dir: PathBuf) -> crate::CoreConfig {
        let mut cfg = crate::CoreConfig::with_defaults(
            data_dir,
            PathBuf::from("/nonexistent/rampart-jailer"),
            Self::test_agent(),
        );
        cfg.network.enabled = false;
        cfg.disk_overcommit = 1000.0;
        cfg
    }

    /// A tier keeping its sandboxes' directories under `root` (made, 0700, if missing) and
    /// starting `agent_bin` for each.
    pub fn new(root: PathBuf, agent_bin: PathBuf) -> Result<FakeTier, FakeTierError> {
        use std::os::unix::fs::DirBuilderExt as _;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&root)
            .map_err(io_err(format!("mkdir {}", root.display())))?;
        Ok(FakeTier { root, agent_bin })
    }

    /// The tier for a daemon configuration: sandboxes under `<data_dir>/sandboxes` (the
    /// manager's own sandbox directory when the tier has no store), the agent of
    /// [`crate::CoreConfig::agent_bin`].
    pub fn from_config(cfg: &crate::CoreConfig) -> Result<FakeTier, FakeTierError> {
        FakeTier::new(cfg.data_dir.join("sandboxes"), cfg.agent_bin.clone())
    }

    /// The directory holding the sandboxes' directories.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// A sandbox's directory (which may not exist).
    pub fn sandbox_dir(&self, id: &SandboxId) -> PathBuf {
        self.root.join(id.as_str())
    }

    /// The process the sandbox's `init` file names, if it is still that process (same pid,
    /// same start time; it may be a zombie), and whether it has ended. The pidfd is opened
    /// before the check, so it is that process.
    fn init(&self, id: &SandboxId) -> Option<(Member, bool)> {
        let s = std::fs::read_to_string(self.sandbox_dir(id).join(INIT_FILE)).ok()?;
        let mut f = s.split_whitespace();
        let pid: i32 = f.next()?.parse().ok()?;
        let start: u64 = f.next()?.parse().ok()?;
        let fd = crate::proc::pidfd_open(pid).ok()?;
        let st = stat(pid)?;
        (st.start == start).then_some((Member { pid, fd }, st.gone()))
    }

    /// The sandbox's agent, if it still runs.
    fn agent(&self, id: &SandboxId) -> Option<Member> {
        self.init(id).filter(|(_, ended)| !ended).map(|(m, _)| m)
    }

    fn running(&self, id: &SandboxId) -> Result<Member, FakeTierError> {
        self.agent(id)
            .ok_or_else(|| FakeTierError::NotRunning(id.clone()))
    }

    fn spawn_agent(&self, spec: &LaunchSpec, dir: &Path) -> Result<Launched, FakeTierError> {
        use std::os::unix::fs::DirBuilderExt as _;
        use std::os::unix::process::CommandExt as _;
        let home = dir.join(HOME_DIR);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&home)
            .map_err(io_err(format!("mkdir {}", home.display())))?;
        let sock = dir.join(SOCKET_FILE);
        let len = sock.as_os_str().len();
        if len > SOCKET_PATH_MAX {
            return Err(FakeTierError::Io {
                step: format!("bind {}", sock.display()),
                source: io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{len} bytes, a Unix socket path holds {SOCKET_PATH_MAX}: use a shorter root"),
                ),
            });
        }
        // Bound and listening before the agent runs: a connection made as soon as this
        // returns waits in the backlog until the agent accepts it.
        let listener = rampart_types::sockpath::SocketPath::new(&sock)
            .and_then(|at| std::os::unix::net::UnixListener::bind(at.path()))
            .map_err(io_err(format!("bind {}", sock.display())))?;
        let log_path = dir.join(LOG_FILE);
        let log = std::fs::File::create(&log_path)
            .map_err(io_err(format!("create {}", log_path.display())))?;
        let log2 = log
            .try_clone()
            .map_err(io_err(format!("dup {}", log_path.display())))?;
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc::geteuid() };
        let mut cmd = std::process::Command::new(&self.agent_bin);
        cmd.env_clear()
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .env(AGENT_FD_ENV, AGENT_FD.to_string())
            .arg("--default-user")
            .arg(uid.to_string())
            .arg("--default-cwd")
            .arg(&home)
            .args(&spec.agent_args)
            .current_dir(&home)
            .stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(log2)
            .process_group(0);
        let lfd = listener.as_raw_fd();
        // SAFETY: the closure runs in the forked child before exec and only calls dup2 and
        // fcntl, which are async-signal-safe; `lfd` is the listener's descriptor, open in
        // the parent (and so in the child) for the whole spawn.
        unsafe {
            cmd.pre_exec(move || {
                // The copy at AGENT_FD is inherited by the agent (dup2 clears
                // close-on-exec); if the listener already is that descriptor, clear it.
                let rc = if lfd == AGENT_FD {
                    libc::fcntl(lfd, libc::F_SETFD, 0)
                } else {
                    libc::dup2(lfd, AGENT_FD)
                };
                if rc < 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .map_err(io_err(format!("start {}", self.agent_bin.display())))?;
        let pid = child.id() as i32;
        // Never waited for here: the manager watches and reaps its sandboxes' init.
        drop(child);
        drop(listener);
        let start = stat(pid).map(|s| s.start);
        let written = match start {
            Some(start) => write_init(dir, pid, start),
            // It exited and was reaped already: nothing to signal later.
            None => Ok(()),
        };
        if let Err(e) = written {
            if let Some(st) = start {
                kill_unchecked(pid, st);
            }
            return Err(e);
        }
        Ok(Launched {
            pid,
            agent_socket: sock,
            restored: false,
        })
    }

    /// Stops the agent and all its descendants: returns them all once each is stopped (or
    /// gone) and none is left that was not seen, or `Err` with the members and how many
    /// still ran at the deadline.
    fn stop_all(&self, agent: Member) -> Result<Vec<Member>, (Vec<Member>, usize)> {
        let deadline = Instant::now() + SIGNAL_DEADLINE;
        let mut members = vec![agent];
        signal(&members[0], libc::SIGSTOP);
        let mut pause = Duration::from_micros(200);
        loop {
            // Checked before looking for new members: a process stopped before the look
            // cannot have forked after it.
            let running = members.iter().filter(|m| !is_stopped(m.pid)).count();
            let new = descendants(&members);
            for m in &new {
                signal(m, libc::SIGSTOP);
            }
            let none_new = new.is_empty();
            members.extend(new);
            if running == 0 && none_new {
                return Ok(members);
            }
            if Instant::now() >= deadline {
                let left = members.iter().filter(|m| !is_stopped(m.pid)).count();
                return Err((members, left));
            }
            if none_new {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(20));
            }
        }
    }
}

/// A process of a sandbox: its pid and a pidfd opened while it was known to be it.
#[derive(Debug)]
struct Member {
    pid: i32,
    fd: OwnedFd,
}

/// What the fake tier reads of `/proc/<pid>/stat`.
#[derive(Debug, Clone, Copy)]
struct Stat {
    state: char,
    ppid: i32,
    /// utime + stime + cutime + cstime, clock ticks.
    ticks: u64,
    start: u64,
    /// Resident set, pages.
    rss: u64,
}

impl Stat {
    fn gone(&self) -> bool {
        matches!(self.state, 'Z' | 'X' | 'x')
    }
}

fn parse_stat(s: &str) -> Option<Stat> {
    // The command name (field 2) is in parentheses and may contain anything.
    let rest = &s[s.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_ascii_whitespace().collect();
    // f[0] is field 3 (state): field n is f[n - 3].
    let num = |n: usize| -> Option<u64> { f.get(n - 3)?.parse().ok() };
    Some(Stat {
        state: f.first()?.chars().next()?,
        ppid: f.get(1)?.parse().ok()?,
        ticks: num(14)? + num(15)? + num(16)? + num(17)?,
        start: num(22)?,
        rss: num(24)?,
    })
}

fn stat(pid: i32) -> Option<Stat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Stopped (`T`, `t`) or no longer running.
fn is_stopped(pid: i32) -> bool {
    stat(pid).is_none_or(|s| s.gone() || matches!(s.state, 'T' | 't'))
}

/// Every process of the host by parent pid.
fn children_by_parent() -> HashMap<i32, Vec<i32>> {
    let mut m: HashMap<i32, Vec<i32>> = HashMap::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return m;
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        if let Some(st) = stat(pid) {
            m.entry(st.ppid).or_default().push(pid);
        }
    }
    m
}

/// The descendants of `known` that are not in it, each with a pidfd opened while its
/// parent was one of them (checked after the open, so the fd is that process).
fn descendants(known: &[Member]) -> Vec<Member> {
    let by_parent = children_by_parent();
    let mut seen: HashSet<i32> = known.iter().map(|m| m.pid).collect();
    let mut queue: Vec<i32> = known.iter().map(|m| m.pid).collect();
    let mut out = Vec::new();
    while let Some(parent) = queue.pop() {
        for &pid in by_parent.get(&parent).map(Vec::as_slice).unwrap_or(&[]) {
            if !seen.insert(pid) {
                continue;
            }
            let Ok(fd) = crate::proc::pidfd_open(pid) else {
                continue;
            };
            if stat(pid).is_some_and(|s| s.ppid == parent) {
                out.push(Member { pid, fd });
                queue.push(pid);
            }
        }
    }
    out
}

/// Sends `sig` through the member's pidfd (a process that ended meanwhile is not an error).
fn signal(m: &Member, sig: i32) {
    // SAFETY: pidfd_send_signal takes a pidfd we own, a signal number, a NULL siginfo (the
    // kernel fills in a kill()-like one) and flags 0; no memory of ours is touched.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            m.fd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0u32,
        );
    }
}

/// Waits (at most until `deadline`) until every member has exited.
fn wait_all_exited(members: &[Member], deadline: Instant) {
    let mut fds: Vec<libc::pollfd> = members
        .iter()
        .map(|m| libc::pollfd {
            fd: m.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    while !fds.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        let ms = i32::try_from(left.as_millis()).unwrap_or(i32::MAX).max(1);
        // SAFETY: `fds` is a valid, writable array of `fds.len()` pollfds for the call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if n < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return;
        }
        // A pidfd polls readable once its process has exited.
        fds.retain(|p| p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) == 0);
        for p in &mut fds {
            p.revents = 0;
        }
    }
}

fn write_init(dir: &Path, pid: i32, start: u64) -> Result<(), FakeTierError> {
    let tmp = dir.join(".init.tmp");
    std::fs::write(&tmp, format!("{pid} {start}\n"))
        .map_err(io_err(format!("write {}", tmp.display())))?;
    std::fs::rename(&tmp, dir.join(INIT_FILE)).map_err(io_err(format!("rename {}", tmp.display())))
}

/// Kills a just-started agent that nothing records yet (a failed launch), and reaps it.
fn kill_unchecked(pid: i32, start: u64) {
    let Ok(fd) = crate::proc::pidfd_open(pid) else {
        return;
    };
    if stat(pid).is_some_and(|s| s.start == start) {
        let m = Member { pid, fd };
        signal(&m, libc::SIGKILL);
        wait_all_exited(std::slice::from_ref(&m), Instant::now() + SIGNAL_DEADLINE);
        let _ = crate::proc::try_reap(&m.fd);
    }
}

/// Clock ticks per second and the page size.
fn units() -> (u64, u64) {
    // SAFETY: sysconf only reads a configuration value.
    let (tck, page) = unsafe {
        (
            libc::sysconf(libc::_SC_CLK_TCK),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    (
        u64::try_from(tck).ok().filter(|&t| t > 0).unwrap_or(100),
        u64::try_from(page).ok().filter(|&p| p > 0).unwrap_or(4096),
    )
}

/// Makes the fake tier's template directory `dest`: an empty `rootfs/` and a note. Nothing
/// of it is used by a sandbox (they run on the host's filesystem).
fn make_template(name: &str, dest: &Path) -> Result<(), FakeTierError> {
    let parent = dest.parent().unwrap_or(Path::new("."));
    let tmp = parent.join(format!(".{name}.building.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let r = (|| {
        let rootfs = tmp.join("rootfs");
        std::fs::create_dir_all(&rootfs).map_err(io_err(format!("mkdir {}", rootfs.display())))?;
        let note = tmp.join("FAKE-TIER");
        std::fs::write(
            &note,
            format!(
                "template {name:?} of the fake tier: its sandboxes run on the host's \
                 filesystem as the daemon's user; rootfs/ is not used\n"
            ),
        )
        .map_err(io_err(format!("write {}", note.display())))?;
        std::fs::rename(&tmp, dest).map_err(io_err(format!("rename to {}", dest.display())))
    })();
    if r.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    r
}

impl Isolation for FakeTier {
    fn name(&self) -> &'static str {
        "fake"
    }

    fn prepare_template(&self, name: &str, dest: &Path) -> Result<(), IsolationError> {
        match name {
            "base" | crate::interpreter::TEMPLATE => Ok(make_template(name, dest)?),
            other => Err(IsolationError::UnknownTemplate(other.to_owned())),
        }
    }

    fn launch(&self, spec: &LaunchSpec) -> Result<Launched, IsolationError> {
        if !spec.files.is_empty() {
            return Err(IsolationError::Unsupported(
                "the fake tier has no root filesystem of its own to write files into (it has \
                 no network either)"
                    .into(),
            ));
        }
        if !spec.layers.is_empty() || spec.layers_on_base {
            return Err(FakeTierError::Unsupported(
                "the fake tier runs the built-in templates only (no layered root)".into(),
            )
            .into());
        }
        if !spec.template_dir.is_dir() {
            return Err(IsolationError::TemplateNotBuilt(spec.template_dir.clone()));
        }
        let dir = self.sandbox_dir(&spec.id);
        {
            use std::os::unix::fs::DirBuilderExt as _;
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&dir)
                .map_err(io_err(format!("mkdir {}", dir.display())))?;
        }
        match self.spawn_agent(spec, &dir) {
            Ok(l) => Ok(l),
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                Err(e.into())
            }
        }
    }

    fn destroy(&self, id: &SandboxId) -> Result<(), IsolationError> {
        match self.init(id) {
            Some((agent, false)) => {
                let members = match self.stop_all(agent) {
                    Ok(m) => m,
                    // SIGKILL ends the rest too (a process that could not stop, e.g. waiting
                    // for a vfork child, is still killable).
                    Err((m, _)) => m,
                };
                for m in &members {
                    signal(m, libc::SIGKILL);
                }
                wait_all_exited(&members, Instant::now() + SIGNAL_DEADLINE);
                // The agent's children were reparented to the daemon when it died (the daemon
                // is a child subreaper): reap what is ours, the agent included.
                for m in &members {
                    let _ = crate::proc::try_reap(&m.fd);
                }
            }
            // An agent that died unwatched (it exited at once) is reaped if it is ours.
            Some((agent, true)) => {
                let _ = crate::proc::try_reap(&agent.fd);
            }
            None => {}
        }
        let dir = self.sandbox_dir(id);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err(format!("remove {}", dir.display()))(e).into()),
        }
    }

    fn leftovers(&self) -> Result<Vec<SandboxId>, IsolationError> {
        let rd = std::fs::read_dir(&self.root)
            .map_err(io_err(format!("read {}", self.root.display())))?;
        let mut ids: Vec<SandboxId> = rd
            .flatten()
            .filter_map(|e| SandboxId::parse(e.file_name().to_str()?).ok())
            .collect();
        ids.sort();
        Ok(ids)
    }

    fn usage(&self, id: &SandboxId) -> Result<Usage, IsolationError> {
        let agent = self.running(id)?;
        let mut pids = vec![agent.pid];
        pids.extend(
            descendants(std::slice::from_ref(&agent))
                .iter()
                .map(|m| m.pid),
        );
        let (tck, page) = units();
        let mut u = Usage::default();
        for st in pids.iter().filter_map(|&p| stat(p)) {
            u.cpu_usec += st.ticks * 1_000_000 / tck;
            u.memory_bytes += st.rss * page;
            u.pids += 1;
        }
        Ok(u)
    }

    fn capabilities(&self) -> Capabilities<'_> {
        Capabilities {
            freeze: Some(self),
            ..Capabilities::default()
        }
    }
}

impl Freeze for FakeTier {
    fn freeze(&self, id: &SandboxId) -> Result<(), IsolationError> {
        let agent = self.running(id)?;
        match self.stop_all(agent) {
            Ok(_) => Ok(()),
            Err((members, left)) => {
                for m in &members {
                    signal(m, libc::SIGCONT);
                }
                Err(FakeTierError::NotStopped {
                    id: id.clone(),
                    left,
                }
                .into())
            }
        }
    }

    fn thaw(&self, id: &SandboxId) -> Result<(), IsolationError> {
        let agent = self.running(id)?;
        let rest = descendants(std::slice::from_ref(&agent));
        signal(&agent, libc::SIGCONT);
        for m in &rest {
            signal(m, libc::SIGCONT);
        }
        Ok(())
    }

    fn is_frozen(&self, id: &SandboxId) -> Result<bool, IsolationError> {
        let agent = self.running(id)?;
        let rest = descendants(std::slice::from_ref(&agent));
        Ok(is_stopped(agent.pid) && rest.iter().all(|m| is_stopped(m.pid)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_parse() {
        // Fields 3.. of a real line, with a name holding ") " and spaces.
        let line = "4242 (a) b (c)) S 17 4242 4242 0 -1 4194560 100 0 0 0 7 3 2 1 20 0 1 0 \
                    987654 10000 55 18446744073709551615";
        let st = parse_stat(line).unwrap();
        assert_eq!(st.state, 'S');
        assert_eq!(st.ppid, 17);
        assert_eq!(st.ticks, 7 + 3 + 2 + 1);
        assert_eq!(st.start, 987654);
        assert_eq!(st.rss, 55);
        assert!(parse_stat("1 (x) S 1 2").is_none());
    }

    #[test]
    fn own_stat_is_read() {
        let st = stat(std::process::id() as i32).unwrap();
        assert!(!st.gone());
        assert!(st.start > 0 && st.rss > 0);
        // SAFETY: getppid has no preconditions.
        assert_eq!(st.ppid, unsafe { libc::getppid() });
    }

    #[test]
    fn descendants_are_found_and_stopped_processes_recognised() {
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let me = std::process::id() as i32;
        let fd = crate::proc::pidfd_open(me).unwrap();
        let found = descendants(&[Member { pid: me, fd }]);
        let pid = child.id() as i32;
        let m = found
            .into_iter()
            .find(|m| m.pid == pid)
            .expect("child found");
        assert!(!is_stopped(pid));
        signal(&m, libc::SIGSTOP);
        let deadline = Instant::now() + SIGNAL_DEADLINE;
        while !is_stopped(pid) {
            assert!(Instant::now() < deadline, "not stopped");
            std::thread::yield_now();
        }
        signal(&m, libc::SIGKILL);
        wait_all_exited(std::slice::from_ref(&m), Instant::now() + SIGNAL_DEADLINE);
        assert!(child.wait().is_ok());
    }

    #[test]
    fn a_template_is_a_directory_with_a_rootfs() {
        let d = tempfile::tempdir().unwrap();
        let t = FakeTier::new(d.path().join("sb"), "/nonexistent".into()).unwrap();
        let dest = d.path().join("templates").join("base");
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        t.prepare_template("base", &dest).unwrap();
        assert!(dest.join("rootfs").is_dir());
        assert!(t.prepare_template("nope", &d.path().join("x")).is_err());
        assert_eq!(t.leftovers().unwrap(), Vec::<SandboxId>::new());
        // Destroying what never was is fine.
        t.destroy(&SandboxId::parse("nothing").unwrap()).unwrap();
        assert!(matches!(
            t.usage(&SandboxId::parse("nothing").unwrap()),
            Err(IsolationError::Fake(FakeTierError::NotRunning(_)))
        ));
    }
}
