//! Finishing destroys in the background (cgroup v1).
//!
//! After `Jail::destroy` has SIGKILLed a sandbox's processes, the kernel still needs a few
//! milliseconds to end them (tearing down a mount namespace waits for an RCU grace period),
//! and its cgroup cannot be removed before. Instead of waiting, destroy renames the cgroup
//! (in every hierarchy) and the sandbox directory to `dying-<id>` and hands that name to the
//! janitor's thread, which kills again whatever is still in the cgroup, waits until it is
//! empty, removes the cgroup and the directory. Nothing of the sandbox can run meanwhile: its
//! PID 1 got SIGKILL, which ends its whole pid namespace, and every process of its cgroup got
//! one too.
//!
//! Leaks: [`Janitor::settle`] (run when the `Jail` is dropped) waits until the queue is done;
//! `dying-*` traces left by a daemon that died meanwhile are removed by [`remove_stale`] when the
//! next `Jail` starts.

use crate::cgroup::Cgroups;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// Prefix of the names of destroyed sandboxes whose removal is not finished.
pub const DYING_PREFIX: &str = "dying-";

#[derive(Debug, Default)]
struct State {
    queue: VecDeque<String>,
    busy: bool,
    running: bool,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    cv: Condvar,
    cgroups: Cgroups,
    state_dir: PathBuf,
}

/// The janitor.
#[derive(Debug)]
pub struct Janitor {
    shared: Arc<Shared>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Kills what is left in the cgroup `name`, removes it and `<state_dir>/<name>`.
pub fn finish(cgroups: &Cgroups, state_dir: &Path, name: &str) {
    if let Err(e) = cgroups.destroy(name) {
        tracing::error!("removing cgroup {name}: {e}");
    }
    let dir = state_dir.join(name);
    match std::fs::remove_dir_all(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::error!("removing {}: {e}", dir.display()),
    }
}

/// Removes every `dying-*` cgroup and directory (left by a daemon that stopped before its
/// janitor was done).
pub fn remove_stale(cgroups: &Cgroups, state_dir: &Path) {
    let mut names: Vec<String> = cgroups
        .list()
        .into_iter()
        .filter(|n| n.starts_with(DYING_PREFIX))
        .collect();
    if let Ok(rd) = std::fs::read_dir(state_dir) {
        names.extend(
            rd.flatten()
                .filter_map(|e| e.file_name().to_str().map(str::to_owned))
                .filter(|n| n.starts_with(DYING_PREFIX)),
        );
    }
    names.sort();
    names.dedup();
    for n in names {
        finish(cgroups, state_dir, &n);
    }
}

impl Janitor {
    /// A janitor (its thread starts with the first job).
    pub fn new(cgroups: Cgroups, state_dir: PathBuf) -> Janitor {
        Janitor {
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                cv: Condvar::new(),
                cgroups,
                state_dir,
            }),
        }
    }

    /// Queues the removal of `name` (cgroup and directory). If no thread can be started, it
    /// is done at once.
    pub fn push(&self, name: String) {
        let mut st = lock(&self.shared.state);
        st.queue.push_back(name);
        if !st.running {
            let sh = self.shared.clone();
            let spawned = std::thread::Builder::new()
                .name("rampart-jail-janitor".into())
                .spawn(move || work(&sh));
            match spawned {
                Ok(_) => st.running = true,
                Err(e) => {
                    tracing::warn!("cannot start the janitor thread ({e}); cleaning up inline");
                    let names: Vec<String> = st.queue.drain(..).collect();
                    drop(st);
                    for n in names {
                        finish(&self.shared.cgroups, &self.shared.state_dir, &n);
                    }
                    return;
                }
            }
        }
        drop(st);
        self.shared.cv.notify_all();
    }

    /// Waits until every queued removal is done.
    pub fn settle(&self) {
        let mut st = lock(&self.shared.state);
        while st.running && (st.busy || !st.queue.is_empty()) {
            st = self.shared.cv.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }
}

impl Drop for Janitor {
    fn drop(&mut self) {
        self.settle();
    }
}

fn work(sh: &Shared) {
    let mut st = lock(&sh.state);
    loop {
        match st.queue.pop_front() {
            Some(name) => {
                st.busy = true;
                drop(st);
                finish(&sh.cgroups, &sh.state_dir, &name);
                st = lock(&sh.state);
                st.busy = false;
                sh.cv.notify_all();
            }
            None => {
                // Idle: the thread ends; the next push starts another.
                st.running = false;
                sh.cv.notify_all();
                return;
            }
        }
    }
}
