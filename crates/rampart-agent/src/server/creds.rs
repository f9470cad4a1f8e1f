//! Acting as a sandbox user for filesystem work.
//!
//! Every filesystem operation runs on a thread of its own. For a user other than the agent's
//! own, that thread first takes the user's supplementary groups, gid and uid with the raw
//! `setgroups`/`setresgid`/`setresuid` system calls. On Linux credentials belong to a thread
//! and the raw calls change only the calling one (libc's wrappers would broadcast the change to
//! every thread of the process), so the rest of the agent keeps running as root. With all of
//! its uids non-zero the thread also loses every capability, so the kernel checks permissions
//! exactly as it would for the user's own processes (`EACCES` instead of root's override), and
//! new files are owned by the user. The thread ends with the operation, and its credentials
//! with it.

use super::users::User;
use crate::connect::{Code, RpcError};

/// The credentials of a user an operation acts as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Creds {
    /// Uid.
    pub uid: u32,
    /// Primary gid.
    pub gid: u32,
    /// Supplementary gids.
    pub groups: Vec<u32>,
}

impl Creds {
    /// The credentials to switch to for `user`, or `None` when the agent already is that user
    /// (root acting as root keeps full access).
    pub fn of(user: &User) -> Option<Creds> {
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        if user.uid == euid {
            return None;
        }
        let mut groups = user.groups.clone();
        if !groups.contains(&user.gid) {
            groups.insert(0, user.gid);
        }
        Some(Creds {
            uid: user.uid,
            gid: user.gid,
            groups,
        })
    }

    /// Take these credentials on the calling thread (for good: the thread cannot return to
    /// root afterwards).
    fn assume(&self) -> std::io::Result<()> {
        let n = self.groups.len().min(65536);
        // SAFETY: the raw system calls take plain integers and a pointer to `n` live gids;
        // they change the credentials of the calling thread only.
        unsafe {
            if libc::syscall(libc::SYS_setgroups, n, self.groups.as_ptr()) < 0
                || libc::syscall(libc::SYS_setresgid, self.gid, self.gid, self.gid) < 0
                || libc::syscall(libc::SYS_setresuid, self.uid, self.uid, self.uid) < 0
            {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }

    fn assume_rpc(&self) -> Result<(), RpcError> {
        self.assume().map_err(|e| {
            RpcError::new(
                Code::Internal,
                format!("cannot act as uid {} gid {}: {e}", self.uid, self.gid),
            )
        })
    }
}

fn panicked() -> RpcError {
    RpcError::new(Code::Internal, "a filesystem worker thread panicked")
}

/// Run `f` with `creds` (or the agent's own credentials) on a thread of its own, without
/// blocking the async runtime.
pub async fn run<T, F>(creds: Option<Creds>, f: F) -> Result<T, RpcError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    match creds {
        None => tokio::task::spawn_blocking(f).await.map_err(|_| panicked()),
        Some(c) => {
            let (tx, rx) = tokio::sync::oneshot::channel();
            std::thread::Builder::new()
                .name("rampart-fs-as-user".into())
                .spawn(move || {
                    let _ = tx.send(c.assume_rpc().map(|()| f()));
                })
                .map_err(|e| {
                    RpcError::new(Code::Internal, format!("cannot start a filesystem worker thread (is the sandbox at its process limit?): {e}"))
                })?;
            rx.await.map_err(|_| panicked())?
        }
    }
}

/// Run `f` with `creds` and wait for it (blocking the caller): inline when no switch is needed,
/// else on a scoped thread that may borrow from the caller. For short work only.
pub fn run_blocking<T, F>(creds: Option<&Creds>, f: F) -> Result<T, RpcError>
where
    T: Send,
    F: FnOnce() -> T + Send,
{
    let Some(c) = creds else { return Ok(f()) };
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .name("rampart-fs-as-user".into())
            .spawn_scoped(s, move || c.assume_rpc().map(|()| f()))
            .map_err(|e| RpcError::new(Code::Internal, format!("cannot start a filesystem worker thread (is the sandbox at its process limit?): {e}")))?
            .join()
            .map_err(|_| panicked())?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(uid: u32) -> User {
        User {
            name: "u".into(),
            uid,
            gid: uid,
            home: "/".into(),
            shell: "/bin/sh".into(),
            groups: vec![uid, 27],
        }
    }

    #[test]
    fn the_agents_own_user_needs_no_switch() {
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        assert_eq!(Creds::of(&user(me)), None);
        let other = Creds::of(&user(me.wrapping_add(4242))).expect("creds");
        assert_eq!(other.groups, vec![me.wrapping_add(4242), 27]);
    }

    #[test]
    fn a_switched_thread_leaves_the_others_alone() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skip: needs root");
            return;
        }
        let c = Creds::of(&user(65534)).expect("creds");
        // SAFETY: geteuid/getegid have no preconditions.
        let inside =
            run_blocking(Some(&c), || unsafe { (libc::geteuid(), libc::getegid()) }).expect("run");
        assert_eq!(inside, (65534, 65534));
        // SAFETY: as above.
        assert_eq!(unsafe { libc::geteuid() }, 0);
        let denied = run_blocking(Some(&c), || std::fs::read("/etc/shadow")).expect("run");
        if std::path::Path::new("/etc/shadow").exists() {
            assert_eq!(
                denied.map(|_| ()).map_err(|e| e.kind()),
                Err(std::io::ErrorKind::PermissionDenied)
            );
        }
    }
}
