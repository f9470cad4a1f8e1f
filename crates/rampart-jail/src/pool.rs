//! A warm pool of jailers (cgroup v1 only).
//!
//! On cgroup v1, the first write of a pid into a `cgroup.procs` waits for an RCU grace
//! period (about 10 ms on a quiet host, more under load), which dominated the launch. A pool
//! member is a `rampart-jailer` process spawned ahead of time, already moved into a cgroup of
//! its own, `<subtree>/pool-<daemon pid>-<n>` (created with no limits), and blocked reading its
//! spec on stdin. A launch takes one, writes the sandbox's limits into its cgroup, renames the
//! cgroup directory to `<subtree>/<id>` in every hierarchy (`rename(2)` within one parent works
//! on cgroup v1, and the processes inside stay in it), and only then sends the spec: the jailer
//! and PID 1 (its child, which inherits the cgroup at clone) run inside the limited cgroup from
//! the start, with no migration on the launch path. A background thread refills the pool.
//!
//! Leaks: members are spawned by the refill thread with `PR_SET_PDEATHSIG` = SIGKILL, so they
//! die with the daemon (that thread lives as long as the pool). [`Pool::close`] (also run on
//! drop) kills them and removes their cgroups; [`remove_stale`] removes the pool cgroups of a
//! dead daemon. The daemon's pid in the name keeps two daemons sharing a subtree apart.
//!
//! cgroup v2 needs no pool: its directories cannot be renamed, and PID 1 is cloned straight
//! into the sandbox's cgroup instead (`CLONE_INTO_CGROUP`).

use crate::cgroup::Cgroups;
use crate::JailError;
use std::collections::VecDeque;
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
    /// Its cgroup's name under the subtree.
    pub name: String,
    /// The jailer process (stdin, stdout and stderr piped).
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
    size: usize,
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

/// Kills a member and removes its cgroup (by whatever name it has now).
pub fn discard(cgroups: &Cgroups, mut m: Member) {
    let _ = m.child.kill();
    let _ = m.child.wait();
    if let Err(e) = cgroups.destroy(&m.name) {
        tracing::warn!("removing the cgroup of pool member {}: {e}", m.name);
    }
}

/// Removes pool cgroups left by daemons that are gone (their members died with them; any
/// process still inside is killed). Cgroups of a live daemon are left alone.
pub fn remove_stale(cgroups: &Cgroups) {
    for name in cgroups.list() {
        let Some(rest) = name.strip_prefix(POOL_PREFIX) else {
            continue;
        };
        let owner = rest.split('-').next().and_then(|p| p.parse::<i32>().ok());
        let alive = owner.is_some_and(|p| Path::new(&format!("/proc/{p}")).exists());
        if alive {
            continue;
        }
        if let Err(e) = cgroups.destroy(&name) {
            tracing::warn!("removing stale pool cgroup {name}: {e}");
        }
    }
}

impl Pool {
    /// Starts a pool of `size` members, filled in the background.
    pub fn start(cgroups: Cgroups, jailer_bin: PathBuf, size: usize) -> Result<Pool, JailError> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
            cgroups,
            jailer_bin,
            size,
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

    /// Takes a live member, if one is ready (never waits for one), and wakes the refill.
    pub fn take(&self) -> Option<Member> {
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

/// Makes the member's cgroup and spawns its jailer (not yet inside the cgroup).
fn spawn_member(sh: &Shared, n: u64) -> Result<Member, JailError> {
    let name = format!("{POOL_PREFIX}{}-{n}", std::process::id());
    sh.cgroups.mkdirs(&name)?;
    match spawn_jailer(&sh.jailer_bin) {
        Ok(child) => Ok(Member { name, child }),
        Err(e) => {
            let _ = sh.cgroups.destroy(&name);
            Err(e)
        }
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
        // Spawn the missing members first, then move them into their cgroups one after the
        // other: only the first write waits for a full RCU grace period (the kernel keeps the
        // fast path off for a moment after a migration), and that wait is off the launch path.
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
        for m in spawned {
            if let Err(e) = sh.cgroups.join(&m.name, m.child.id() as i32) {
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
