//! Starting a child without copying the agent: `clone(CLONE_VM | CLONE_VFORK)`.
//!
//! `std::process::Command` with a `pre_exec` hook must `fork`, which copies the agent's page
//! tables and write-protects all of its memory; on a virtualized host every fault that follows
//! (in the child before `exec`, and in the agent afterwards) is expensive. Like `posix_spawn`,
//! this child shares the agent's memory and the calling thread sleeps until the child has
//! called `execve` (or died), so the child may only make raw system calls on data prepared
//! beforehand: no allocation, no locks, no libc wrappers with process-wide side effects
//! (glibc's `setuid` family would broadcast to the *agent's* threads, so the credential calls
//! are raw `syscall`s, which change only the calling process).
//!
//! What the child does, in order: every caught signal back to its default action (the
//! agent's handlers must never run in the child) and `SIGPIPE` to default (the agent ignores
//! it); stdio onto 0, 1, 2; a new process group (`setpgid`) or a new session with the terminal
//! as controlling tty (`setsid` + `TIOCSCTTY`); supplementary groups, gid, uid; `chdir`;
//! `umask(022)`; an empty signal mask; `execve` along `PATH` like `execvp` (scripts without a
//! `#!` line through `/bin/sh`). The same steps, in the same order, as the `pre_exec` hook
//! this replaces. Seccomp and every other limit are inherited from the agent as before.

use std::ffi::{c_int, c_void, CString};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Stack of the child until it execs (it only makes system calls).
const CHILD_STACK: usize = 64 * 1024;

/// What to start.
#[derive(Debug)]
pub struct Spec<'a> {
    /// The program as asked (a name looked up in `PATH`, or a path).
    pub program: &'a str,
    /// Arguments after the program.
    pub args: &'a [String],
    /// The complete environment.
    pub env: &'a [(String, String)],
    /// Working directory.
    pub cwd: &'a CString,
    /// `(uid, gid, supplementary groups)` to switch to, if any.
    pub ids: Option<(libc::uid_t, libc::gid_t, &'a [libc::gid_t])>,
    /// New session with fd 0 (a terminal) as controlling tty, instead of a new process group.
    pub session: bool,
    /// Descriptors to become the child's 0, 1, 2.
    pub stdio: [BorrowedFd<'a>; 3],
}

/// A started child.
#[derive(Debug)]
pub struct Spawned {
    /// Its pid.
    pub pid: u32,
    /// A pidfd of it (readable once it has exited), when the kernel has `CLONE_PIDFD`.
    pub pidfd: Option<OwnedFd>,
}

/// Why a spawn failed: the OS error of the step that failed.
pub type SpawnError = std::io::Error;

fn cstring(s: &str) -> Result<CString, SpawnError> {
    CString::new(s).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "nul byte found in provided data",
        )
    })
}

/// The candidate paths of `program`, in `execvp` order.
fn candidates(program: &str, env: &[(String, String)]) -> Result<Vec<CString>, SpawnError> {
    if program.is_empty() {
        return Err(std::io::Error::from_raw_os_error(libc::ENOENT));
    }
    if program.contains('/') {
        return Ok(vec![cstring(program)?]);
    }
    let path = env
        .iter()
        .rev()
        .find(|(k, _)| k == "PATH")
        .map_or("/bin:/usr/bin", |(_, v)| v.as_str());
    path.split(':')
        .map(|dir| {
            if dir.is_empty() {
                cstring(program)
            } else {
                cstring(&format!("{}/{program}", dir.trim_end_matches('/')))
            }
        })
        .collect()
}

/// Everything the child reads, prepared by the parent; the child writes only `err`.
struct ChildArgs {
    /// Signals to set to `SIG_DFL` (bit n-1 = signal n).
    reset: u64,
    stdio: [RawFd; 3],
    session: bool,
    ids: Option<(libc::uid_t, libc::gid_t, *const libc::gid_t, usize)>,
    cwd: *const libc::c_char,
    paths: *const *const libc::c_char,
    npaths: usize,
    argv: *const *const libc::c_char,
    /// `["/bin/sh", <path>, args..., NULL]`; the child fills slot 1.
    sh_argv: *mut *const libc::c_char,
    envp: *const *const libc::c_char,
    /// errno of the failed step, 0 if none.
    err: c_int,
}

/// Signals with a handler in the agent (bit n-1 = signal n), as of the end of the last spawn.
static CAUGHT: AtomicU64 = AtomicU64::new(0);
/// Whether [`CAUGHT`] was computed yet.
static CAUGHT_KNOWN: AtomicBool = AtomicBool::new(false);

/// The kernel's `struct sigaction` (x86_64 and aarch64 layout), for the raw system call, which
/// unlike glibc's wrapper also reaches glibc's own signals 32 and 33.
#[repr(C)]
struct KernelSigaction {
    handler: usize,
    flags: libc::c_ulong,
    restorer: usize,
    mask: u64,
}

/// `rt_sigaction(sig, new, old)` without glibc in between.
///
/// # Safety
/// `new` and `old` must be null or valid for reads / writes of a `KernelSigaction`.
unsafe fn raw_sigaction(
    sig: c_int,
    new: *const KernelSigaction,
    old: *mut KernelSigaction,
) -> libc::c_long {
    // SAFETY: per this function's contract.
    unsafe { libc::syscall(libc::SYS_rt_sigaction, sig, new, old, 8usize) }
}

/// The signals with a handler installed in this process right now. (A vfork child runs in the
/// agent's memory: such a handler must never run in it, so the child resets these.)
fn caught_now() -> u64 {
    let mut mask = 0u64;
    for sig in 1..=64 {
        let mut old = KernelSigaction {
            handler: 0,
            flags: 0,
            restorer: 0,
            mask: 0,
        };
        // SAFETY: only reads the disposition into a local struct.
        if unsafe { raw_sigaction(sig, std::ptr::null(), &mut old) } != 0 {
            continue;
        }
        if old.handler != libc::SIG_DFL && old.handler != libc::SIG_IGN {
            mask |= 1 << (sig - 1);
        }
    }
    mask
}

/// The child: see the module docs. Returns only on failure (the clone wrapper then exits).
extern "C" fn child_main(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` points at the parent's ChildArgs, which lives (and is not touched by the
    // parent, whose thread is suspended by CLONE_VFORK) until this child execs or exits. All
    // pointers in it are into buffers owned by the parent's frame, alive for the same time.
    // Everything below is a system call on those buffers: no allocation, no locks.
    unsafe {
        let a = &mut *arg.cast::<ChildArgs>();
        let errno = || *libc::__errno_location();
        // Caught signals (and SIGPIPE) back to default; all are blocked in here, so none can
        // run before that.
        let mut reset = a.reset;
        while reset != 0 {
            let sig = reset.trailing_zeros() as c_int + 1;
            reset &= reset - 1;
            let dfl = KernelSigaction {
                handler: libc::SIG_DFL,
                flags: 0,
                restorer: 0,
                mask: 0,
            };
            raw_sigaction(sig, &dfl, std::ptr::null_mut());
        }
        for (target, &fd) in a.stdio.iter().enumerate() {
            // The parent made sure every source is above 2, so none is overwritten here.
            if libc::dup2(fd, target as c_int) < 0 {
                a.err = errno();
                return 127;
            }
        }
        let ok = if a.session {
            libc::setsid() >= 0 && libc::ioctl(0, libc::TIOCSCTTY, 0) >= 0
        } else {
            libc::setpgid(0, 0) >= 0
        };
        if !ok {
            a.err = errno();
            return 127;
        }
        if let Some((uid, gid, groups, ngroups)) = a.ids {
            if libc::syscall(libc::SYS_setgroups, ngroups, groups) < 0
                || libc::syscall(libc::SYS_setgid, gid) < 0
                || libc::syscall(libc::SYS_setuid, uid) < 0
            {
                a.err = errno();
                return 127;
            }
        }
        if libc::chdir(a.cwd) < 0 {
            a.err = errno();
            return 127;
        }
        libc::umask(0o022);
        let empty: libc::sigset_t = std::mem::zeroed();
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &empty as *const libc::sigset_t,
            std::ptr::null_mut::<libc::sigset_t>(),
            std::mem::size_of::<libc::c_ulong>(),
        );
        // execvp's search: EACCES is remembered, "not here" moves on, anything else stops.
        let mut eacces = false;
        let mut err = libc::ENOENT;
        for i in 0..a.npaths {
            let path = *a.paths.add(i);
            libc::execve(path, a.argv, a.envp);
            err = errno();
            if err == libc::ENOEXEC {
                *a.sh_argv.add(1) = path;
                libc::execve(*a.sh_argv, a.sh_argv.cast_const(), a.envp);
                a.err = errno();
                return 127;
            }
            match err {
                libc::EACCES => eacces = true,
                libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENODEV | libc::ETIMEDOUT => {}
                _ => {
                    a.err = err;
                    return 127;
                }
            }
        }
        a.err = if eacces { libc::EACCES } else { err };
        127
    }
}

/// A close-on-exec duplicate above 2 of `fd` when `fd` is 0, 1 or 2, so the child's `dup2`s
/// onto 0..2 never clobber a source.
fn above_stdio(fd: BorrowedFd<'_>) -> Result<Option<OwnedFd>, SpawnError> {
    if fd.as_raw_fd() > 2 {
        return Ok(None);
    }
    let dup = nix::fcntl::fcntl(fd.as_raw_fd(), nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(3))?;
    // SAFETY: F_DUPFD_CLOEXEC just returned this new descriptor, owned by nothing else.
    Ok(Some(unsafe {
        <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(dup)
    }))
}

/// Start the child; returns once it has called `execve`. On failure the child has been reaped
/// already (the caller holds the reaper's lock, so no one else can take its status).
pub fn spawn(spec: &Spec<'_>) -> Result<Spawned, SpawnError> {
    let paths = candidates(spec.program, spec.env)?;
    let mut argv_c = Vec::with_capacity(spec.args.len() + 1);
    argv_c.push(cstring(spec.program)?);
    for a in spec.args {
        argv_c.push(cstring(a)?);
    }
    let env_c = spec
        .env
        .iter()
        .map(|(k, v)| cstring(&format!("{k}={v}")))
        .collect::<Result<Vec<_>, _>>()?;
    let sh = c"/bin/sh";
    let path_ptrs: Vec<*const libc::c_char> = paths.iter().map(|p| p.as_ptr()).collect();
    let mut argv: Vec<*const libc::c_char> = argv_c.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut sh_argv: Vec<*const libc::c_char> = Vec::with_capacity(argv.len() + 1);
    sh_argv.push(sh.as_ptr());
    sh_argv.push(std::ptr::null()); // filled by the child
    sh_argv.extend(argv.iter().skip(1));
    let mut envp: Vec<*const libc::c_char> = env_c.iter().map(|e| e.as_ptr()).collect();
    envp.push(std::ptr::null());

    let mut keep = Vec::new();
    let mut stdio = [0; 3];
    for (slot, fd) in stdio.iter_mut().zip(spec.stdio.iter()) {
        match above_stdio(*fd)? {
            Some(o) => {
                *slot = o.as_raw_fd();
                keep.push(o);
            }
            None => *slot = fd.as_raw_fd(),
        }
    }

    // The handlers to reset in the child: as of the last spawn (queried after it, off the
    // latency path: the agent's handlers are all installed at startup, and one installed since
    // is still blocked in the child until just before its execve), or queried now the first
    // time. SIGPIPE too: the agent ignores it, children get the default.
    let caught = if CAUGHT_KNOWN.load(Ordering::Acquire) {
        CAUGHT.load(Ordering::Acquire)
    } else {
        caught_now()
    };
    let mut args = ChildArgs {
        reset: caught | 1 << (libc::SIGPIPE - 1),
        stdio,
        session: spec.session,
        ids: spec
            .ids
            .map(|(u, g, groups)| (u, g, groups.as_ptr(), groups.len())),
        cwd: spec.cwd.as_ptr(),
        paths: path_ptrs.as_ptr(),
        npaths: path_ptrs.len(),
        argv: argv.as_ptr(),
        sh_argv: sh_argv.as_mut_ptr(),
        envp: envp.as_ptr(),
        err: 0,
    };
    let mut stack: Vec<u8> = Vec::with_capacity(CHILD_STACK);
    // Top of the stack (it grows down), 16-byte aligned.
    let top = ((stack.as_mut_ptr() as usize + CHILD_STACK) & !15) as *mut c_void;

    // SAFETY: sigfillset/pthread_sigmask write to the local sigsets; blocking every signal in
    // this thread keeps the agent's handlers from running in the child before it resets them.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
    }
    let mut pidfd: c_int = -1;
    let clone = |flags: c_int, args: &mut ChildArgs, pidfd: &mut c_int| {
        // SAFETY: `top` is the end of a live, writable CHILD_STACK-byte buffer that outlives
        // the child's use of it (CLONE_VFORK: this call returns only once the child has exec'd
        // or exited); `args` and every buffer it points into live in this frame until then
        // too; `pidfd` is a live int the kernel writes the pidfd to (CLONE_PIDFD).
        let pid = unsafe {
            libc::clone(
                child_main,
                top,
                flags,
                (args as *mut ChildArgs).cast::<c_void>(),
                pidfd as *mut c_int,
            )
        };
        (pid, std::io::Error::last_os_error())
    };
    let base = libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD;
    let (mut pid, mut clone_err) = clone(base | libc::CLONE_PIDFD, &mut args, &mut pidfd);
    if pid < 0 && clone_err.raw_os_error() == Some(libc::EINVAL) {
        // A kernel without CLONE_PIDFD (before 5.2): the exit is then seen through SIGCHLD only.
        pidfd = -1;
        (pid, clone_err) = clone(base, &mut args, &mut pidfd);
    }
    // SAFETY: restores this thread's own signal mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    // For the next spawn, while this child runs.
    CAUGHT.store(caught_now(), Ordering::Release);
    CAUGHT_KNOWN.store(true, Ordering::Release);
    drop(stack);
    if pid < 0 {
        return Err(clone_err);
    }
    let pidfd = (pidfd >= 0).then(|| {
        // SAFETY: the kernel just created this descriptor for us (CLONE_PIDFD); nothing else
        // owns it.
        unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(pidfd) }
    });
    // SAFETY: the child is done with `args` (it exec'd or exited); a volatile read because the
    // compiler cannot see the child's write.
    let err = unsafe { std::ptr::read_volatile(&args.err) };
    if err != 0 {
        let mut st = 0;
        // SAFETY: waits for our own child, whose status no one else can take (see above).
        unsafe { libc::waitpid(pid, &mut st, 0) };
        return Err(std::io::Error::from_raw_os_error(err));
    }
    Ok(Spawned {
        pid: pid as u32,
        pidfd,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_follow_path() {
        let env = vec![("PATH".to_string(), "/a:/b/::/c".to_string())];
        let c = candidates("x", &env).expect("ok");
        let c: Vec<_> = c.iter().map(|s| s.to_str().expect("utf8")).collect();
        assert_eq!(c, ["/a/x", "/b/x", "x", "/c/x"]);
        let c = candidates("./y", &env).expect("ok");
        assert_eq!(c.len(), 1);
        assert!(candidates("", &env).is_err());
        let d = candidates("z", &[]).expect("ok");
        assert_eq!(d.len(), 2);
    }
}
