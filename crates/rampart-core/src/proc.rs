//! Host process helpers: subreaper, pid identity, pidfds.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// Makes this process a child subreaper: orphans below it (sandbox PID 1s whose launcher
/// exited) are reparented to it, so it can reap them and learn at once when they die.
pub(crate) fn set_child_subreaper() -> io::Result<()> {
    // SAFETY: prctl(PR_SET_CHILD_SUBREAPER, 1) takes no pointers and only sets a flag on
    // this process.
    let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// What `/proc/<pid>/stat` says about a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProcStat {
    /// State letter (`R`, `S`, `Z`, ...).
    pub state: char,
    /// Start time in clock ticks after boot (field 22).
    pub start_time: u64,
}

/// Parses the contents of `/proc/<pid>/stat`.
pub(crate) fn parse_stat(s: &str) -> Option<ProcStat> {
    // The command name (field 2) is in parentheses and may itself contain ") ".
    let rest = &s[s.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    // After the state (field 3), field 22 is 19 further on.
    let start_time = fields.nth(18)?.parse().ok()?;
    Some(ProcStat { state, start_time })
}

/// Reads `/proc/<pid>/stat`; None if the process does not exist.
pub(crate) fn proc_stat(pid: i32) -> Option<ProcStat> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&s)
}

/// Whether `pid` is a live (not zombie) process started at `start_time`.
pub(crate) fn is_same_live_process(pid: i32, start_time: u64) -> bool {
    matches!(proc_stat(pid), Some(st) if st.start_time == start_time && !matches!(st.state, 'Z' | 'X' | 'x'))
}

/// Opens a pidfd for `pid`.
pub(crate) fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags; no pointers. The result is checked.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, libc::PIDFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this new fd, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// How a process ended, if we could reap it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ExitStatus {
    /// Exited with a code.
    Code(i32),
    /// Killed by a signal.
    Signal(i32),
}

impl std::fmt::Display for ExitStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExitStatus::Code(c) => write!(f, "exit status {c}"),
            ExitStatus::Signal(s) => write!(f, "killed by signal {s}"),
        }
    }
}

/// Reaps the process behind `fd` if it is our child and has exited (never blocks).
/// None if it is not our child or has not exited.
pub(crate) fn try_reap(fd: &OwnedFd) -> Option<ExitStatus> {
    // SAFETY: siginfo_t is plain data; all-zero is a valid value.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is a valid, writable siginfo_t; the fd is a pidfd we own.
    let rc = unsafe {
        libc::waitid(
            libc::P_PIDFD,
            fd.as_raw_fd() as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG,
        )
    };
    if rc != 0 {
        return None;
    }
    // SAFETY: waitid filled `info` (or left it zeroed with WNOHANG); reading si_pid and
    // si_status of a SIGCHLD siginfo is what the accessors are for.
    let (pid, code, status) = unsafe { (info.si_pid(), info.si_code, info.si_status()) };
    if pid == 0 {
        return None;
    }
    Some(if code == libc::CLD_EXITED {
        ExitStatus::Code(status)
    } else {
        ExitStatus::Signal(status)
    })
}

/// Waits until the process behind `fd` has exited, then reaps it if it is our child.
pub(crate) async fn wait_exit(fd: OwnedFd) -> io::Result<Option<ExitStatus>> {
    // SAFETY: an OwnedFd is a valid open fd that stays open, unchanged, until the AsyncFd
    // that owns it is dropped.
    let afd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
        .map_err(|e| io::Error::other(e.to_string()))?;
    loop {
        let mut guard = afd.readable().await?;
        // A pidfd polls readable once the process has exited; confirm with a non-blocking
        // check so a spurious wakeup does not count as an exit.
        let mut pfd = libc::pollfd {
            fd: afd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, zero timeout.
        let n = unsafe { libc::poll(&mut pfd, 1, 0) };
        if n > 0 && pfd.revents & libc::POLLIN != 0 {
            return Ok(try_reap(afd.get_ref()));
        }
        guard.clear_ready();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_parses_even_with_odd_names() {
        let line = "1234 (a) b (c)) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 \
                    987654 10000 100 18446744073709551615";
        assert_eq!(
            parse_stat(line),
            Some(ProcStat {
                state: 'S',
                start_time: 987654
            })
        );
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("1 (x) S 1 2"), None);
    }

    #[test]
    fn own_process_is_live_and_start_time_is_checked() {
        let me = std::process::id() as i32;
        let st = proc_stat(me).unwrap();
        assert!(is_same_live_process(me, st.start_time));
        assert!(!is_same_live_process(me, st.start_time + 1));
    }

    #[tokio::test]
    async fn pidfd_reports_and_reaps_a_child_exit() {
        let child = std::process::Command::new("sh")
            .args(["-c", "exit 7"])
            .spawn()
            .unwrap();
        let fd = pidfd_open(child.id() as i32).unwrap();
        let st = wait_exit(fd).await.unwrap();
        assert_eq!(st, Some(ExitStatus::Code(7)));
        std::mem::forget(child);
    }
}
