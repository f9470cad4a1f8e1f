//! A warm pool of jailers (cgroup v1 only).
//!
//! A pool member is a `rampart-jailer` process started ahead of time that has done every step
//! of a launch that needs no spec: it moved itself into a cgroup of its own,
//! `<subtree>/pool-<daemon pid>-<n>` (created with no limits), entered its private mount
//! namespace and mounted a copy of the empty disk image (of the pool's disk size) in
//! `<state_dir>/pool-<daemon pid>-<n>/` ([`crate::jailer::prepare`], asked for by a
//! [`crate::JailerPrepare`] line); it then blocks reading its spec. A launch asking for that
//! disk size takes one, writes the sandbox's limits into its cgroup, renames the cgroup (in
//! every hierarchy: `rename(2)` within one parent works on cgroup v1, and the processes inside
//! stay in it) and the directory (the mounts follow it) to the sandbox's id, and only then
//! sends the spec: the jailer and PID 1 (its child, born in its cgroup) run inside the limited
//! cgroup, and the launch skips the jailer's start, the image copy, the loop device, the ext4
//! mount and the cgroup creation. Other disk sizes get a fresh jailer. A background thread
//! refills the pool.
//!
//! Leaks: members are spawned by the refill thread with `PR_SET_PDEATHSIG` = SIGKILL, so they
//! die with the daemon (that thread lives as long as the pool). [`Pool::close`] (also run on
//! drop) kills them and removes their cgroups and directories; [`remove_stale`] removes those
//! of a dead daemon. The daemon's pid in the name keeps two daemons sharing a subtree apart.
//!
//! cgroup v2 gets no pool: its directories cannot be renamed, and PID 1 is cloned straight
//! into the sandbox's cgroup instead (`CLONE_INTO_CGROUP`).

use crate::cgroup::Cgroups;
use crate::{disk, JailError, JailerPrepare};
use std::collections::VecDeque;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

/// Prefix of the pool members' cgroup names.
pub const POOL_PREFIX: &str = "pool-";

/// One warm jailer, in its cgroup, waiting for its spec.
#[derive(Debug)]
pub struct Member {
    /// Its cgroup's name under the subtree (and its directory's under the state directory).
    pub name: String,
    /// Its directory, `<state_dir>/<name>`, with the disk mounted (in the jailer's namespace).
    pub dir: PathBuf,
    /// Size of its disk.
    pub disk_bytes: u64,
    /// The jailer process (stdin, stdout and stderr piped; stdin still open for the spec).
    pub child: Child,
}

#[derive(Debug, Default)]
struct State {
    ready: VecDeque<Member>,
    closed: bool,
    next: u64,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    cv: Condvar,
    cgroups: Cgroups,
    jailer_bin: PathBuf,
    state_dir: PathBuf,
    cache_dir: PathBuf,
    disk_bytes: u64,
    size: usize,
}

/// Where and what a pool prepares.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Members kept ready.
    pub size: usize,
    /// The `rampart-jailer` binary.
    pub jailer_bin: PathBuf,
    /// The sandboxes' state directory (members' directories go there too).
    pub state_dir: PathBuf,
    /// Where the formatted empty disk images are cached.
    pub cache_dir: PathBuf,
    /// Disk size of the members.
    pub disk_bytes: u64,
}

/// The pool.
#[derive(Debug)]
pub struct Pool {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Spawns `rampart-jailer` with piped stdio; it dies with the spawning thread.
pub fn spawn_jailer(bin: &Path) -> Result<Child, JailError> {
    let mut cmd = Command::new(bin);
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: the pre-exec hook only calls prctl, which is async-signal-safe.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    cmd.spawn().map_err(|source| JailError::Sys {
        step: format!("spawn {}", bin.display()),
        source,
    })
}

/// Kills a member and removes its cgroup and directory (its disk's loop device detaches
/// itself once the jailer's mount namespace is gone).
pub fn discard(cgroups: &Cgroups, mut m: Member) {
    let _ = m.child.kill();
    let _ = m.child.wait();
    if let Err(e) = cgroups.destroy(&m.name) {
        tracing::warn!("removing the cgroup of pool member {}: {e}", m.name);
    }
    match std::fs::remove_dir_all(&m.dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!("removing {}: {e}", m.dir.display()),
    }
}

/// Removes the pool cgroups and directories left by daemons that are gone (their members
/// died with them; any process still inside is killed). Those of a live daemon are left
/// alone.
pub fn remove_stale(cgroups: &Cgroups, state_dir: &Path) {
    let stale = |name: &str| {
        let Some(rest) = name.strip_prefix(POOL_PREFIX) else {
            return false;
        };
        let owner = rest.split('-').next().and_then(|p| p.parse::<i32>().ok());
        !owner.is_some_and(|p| Path::new(&format!("/proc/{p}")).exists())
    };
    for name in cgroups.list() {
        if stale(&name) {
            if let Err(e) = cgroups.destroy(&name) {
                tracing::warn!("removing stale pool cgroup {name}: {e}");
            }
        }
    }
    if let Ok(rd) = std::fs::read_dir(state_dir) {
        for e in rd.flatten() {
            if e.file_name().to_str().is_some_and(stale) {
                if let Err(err) = std::fs::remove_dir_all(e.path()) {
                    tracing::warn!("removing stale {}: {err}", e.path().display());
                }
            }
        }
    }
}

impl Pool {
    /// Starts a pool of `size` members, filled in the background.
    pub fn start(cgroups: Cgroups, cfg: PoolConfig) -> Result<Pool, JailError> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
            cgroups,
            jailer_bin: cfg.jailer_bin,
            state_dir: cfg.state_dir,
            cache_dir: cfg.cache_dir,
            disk_bytes: cfg.disk_bytes,
            size: cfg.size,
        });
        let s2 = shared.clone();
        let thread = std::thread::Builder::new()
            .name("rampart-jail-pool".into())
            .spawn(move || refill(&s2))
            .map_err(|source| JailError::Sys {
                step: "start the jailer pool thread".into(),
                source,
            })?;
        Ok(Pool {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Takes a live member with a disk of `disk_bytes`, if one is ready (never waits for
    /// one), and wakes the refill.
    pub fn take(&self, disk_bytes: u64) -> Option<Member> {
        if disk_bytes != self.shared.disk_bytes {
            return None;
        }
        let mut dead = Vec::new();
        let got = {
            let mut st = lock(&self.shared.state);
            let mut got = None;
            while let Some(mut m) = st.ready.pop_front() {
                match m.child.try_wait() {
                    Ok(None) => {
                        got = Some(m);
                        break;
                    }
                    _ => dead.push(m),
                }
            }
            got
        };
        self.shared.cv.notify_all();
        for m in dead {
            tracing::warn!("pool member {} died while waiting", m.name);
            discard(&self.shared.cgroups, m);
        }
        got
    }

    /// Members ready now.
    pub fn ready(&self) -> usize {
        lock(&self.shared.state).ready.len()
    }

    /// Names of the cgroups of the members ready now.
    pub fn member_names(&self) -> Vec<String> {
        lock(&self.shared.state)
            .ready
            .iter()
            .map(|m| m.name.clone())
            .collect()
    }

    /// Pids of the members ready now.
    pub fn member_pids(&self) -> Vec<i32> {
        lock(&self.shared.state)
            .ready
            .iter()
            .map(|m| m.child.id() as i32)
            .collect()
    }

    /// Waits (up to `within`) until the pool is full; returns whether it is.
    pub fn wait_full(&self, within: Duration) -> bool {
        let deadline = std::time::Instant::now() + within;
        let mut st = lock(&self.shared.state);
        while st.ready.len() < self.shared.size && !st.closed {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            st = match self.shared.cv.wait_timeout(st, left) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
        st.ready.len() >= self.shared.size
    }

    /// Stops the refill and removes every member (processes and cgroups). Idempotent.
    pub fn close(&self) {
        lock(&self.shared.state).closed = true;
        self.shared.cv.notify_all();
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
        let left: Vec<Member> = lock(&self.shared.state).ready.drain(..).collect();
        for m in left {
            discard(&self.shared.cgroups, m);
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.close();
    }
}

/// Makes the member's cgroup and directory (with a copy of the disk image) and spawns its
/// jailer (not yet inside the cgroup), asking it to prepare.
fn spawn_member(sh: &Shared, n: u64) -> Result<Member, JailError> {
    let name = format!("{POOL_PREFIX}{}-{n}", std::process::id());
    sh.cgroups.mkdirs(&name)?;
    let child = match spawn_jailer(&sh.jailer_bin) {
        Ok(c) => c,
        Err(e) => {
            let _ = sh.cgroups.destroy(&name);
            return Err(e);
        }
    };
    let mut m = Member {
        dir: sh.state_dir.join(&name),
        name,
        disk_bytes: sh.disk_bytes,
        child,
    };
    let r = (|| {
        std::fs::create_dir(&m.dir).map_err(|source| JailError::Sys {
            step: format!("mkdir {}", m.dir.display()),
            source,
        })?;
        let image = m.dir.join("disk.img");
        let cached = disk::cached_image(&sh.cache_dir, sh.disk_bytes)?;
        crate::store::clone_file(&cached, &image)?;
        let prep = JailerPrepare {
            prepare_dir: m.dir.clone(),
            prepare_disk: image,
            prepare_cgroup: sh.cgroups.procs_files(&m.name),
        };
        let mut line = serde_json::to_vec(&prep)
            .map_err(|e| JailError::Init(format!("encode prepare: {e}")))?;
        line.push(b'\n');
        let sin = m
            .child
            .stdin
            .as_mut()
            .ok_or_else(|| JailError::Init("pool jailer without stdin".into()))?;
        sin.write_all(&line).map_err(|source| JailError::Sys {
            step: "send prepare to a pool jailer".into(),
            source,
        })
    })();
    match r {
        Ok(()) => Ok(m),
        Err(e) => {
            discard(&sh.cgroups, m);
            Err(e)
        }
    }
}

/// How long a new member may take to prepare.
const PREPARE_DEADLINE: Duration = Duration::from_secs(10);

/// Reads the member's `{"ready":true}` line (byte by byte: nothing after it may be consumed),
/// for at most [`PREPARE_DEADLINE`], giving up at once when the pool closes.
fn wait_ready(sh: &Shared, m: &mut Member) -> Result<(), JailError> {
    let so = m
        .child
        .stdout
        .as_mut()
        .ok_or_else(|| JailError::Init("pool jailer without stdout".into()))?;
    let deadline = std::time::Instant::now() + PREPARE_DEADLINE;
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    loop {
        if lock(&sh.state).closed {
            return Err(JailError::Init("the pool closed".into()));
        }
        if std::time::Instant::now() > deadline {
            return Err(JailError::Init(format!(
                "pool jailer did not prepare within {} s (an outdated rampart-jailer?)",
                PREPARE_DEADLINE.as_secs()
            )));
        }
        let mut pfd = libc::pollfd {
            fd: std::os::fd::AsRawFd::as_raw_fd(so),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, 100) };
        if n <= 0 {
            continue; // timeout or EINTR: check again
        }
        match so.read(&mut b) {
            Ok(0) => break,
            Ok(_) if b[0] == b'\n' => break,
            Ok(_) => line.push(b[0]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(source) => {
                return Err(JailError::Sys {
                    step: "read a pool jailer's answer".into(),
                    source,
                })
            }
        }
        if line.len() > 64 * 1024 {
            break;
        }
    }
    match serde_json::from_slice::<crate::JailerResult>(&line) {
        Ok(r) if r.ready == Some(true) => Ok(()),
        Ok(crate::JailerResult { error: Some(e), .. }) => {
            Err(JailError::Init(format!("pool jailer: {e}")))
        }
        _ => Err(JailError::Init(format!(
            "pool jailer answered {:?}",
            String::from_utf8_lossy(&line)
        ))),
    }
}

fn refill(sh: &Shared) {
    let mut failures: u32 = 0;
    loop {
        let (first, missing) = {
            let mut st = lock(&sh.state);
            while !st.closed && st.ready.len() >= sh.size {
                st = sh.cv.wait(st).unwrap_or_else(|p| p.into_inner());
            }
            if st.closed {
                return;
            }
            let missing = (sh.size - st.ready.len()) as u64;
            st.next += missing;
            (st.next - missing + 1, missing)
        };
        // Spawn the missing members first, then collect their answers: they join their
        // cgroups and prepare their disks in parallel.
        let mut spawned = Vec::new();
        let mut failed = None;
        for n in first..first + missing {
            match spawn_member(sh, n) {
                Ok(m) => spawned.push(m),
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        for mut m in spawned {
            let r = wait_ready(sh, &mut m);
            if let Err(e) = r {
                discard(&sh.cgroups, m);
                failed.get_or_insert(e);
                continue;
            }
            let mut st = lock(&sh.state);
            if st.closed {
                drop(st);
                discard(&sh.cgroups, m);
                continue;
            }
            st.ready.push_back(m);
            drop(st);
            sh.cv.notify_all();
        }
        match failed {
            None => failures = 0,
            Some(e) => {
                failures = failures.saturating_add(1);
                tracing::warn!("refilling the jailer pool: {e}");
                // Back off (launches fall back to a fresh jailer meanwhile).
                let nap = Duration::from_millis(50u64 << failures.min(7));
                let st = lock(&sh.state);
                if st.closed {
                    return;
                }
                let _ = sh.cv.wait_timeout(st, nap);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_names_parse() {
        let n = format!("{POOL_PREFIX}123-4");
        let rest = n.strip_prefix(POOL_PREFIX).unwrap();
        assert_eq!(rest.split('-').next().unwrap().parse::<i32>().unwrap(), 123);
        // Pool names are never sandbox ids.
        assert!(rampart_types::SandboxId::parse(&n).is_err());
    }
}
