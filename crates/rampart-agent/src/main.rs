//! `rampart-agent`: PID 1 of a sandbox.
//!
//! Usage: `rampart-agent [--listen <socket path>] [--default-user <name>]`.
//! With `RAMPART_AGENT_FD=<n>` in the environment, fd `n` is an already bound and listening
//! Unix stream socket (inherited from the jailer) and is used instead of `--listen`.

use rampart_agent::server::{self, process::Table, watch::Watchers, Config, State};
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

/// What is wrong with the command line.
#[derive(Debug, thiserror::Error)]
enum UsageError {
    /// An option given last, without its value.
    #[error("{option} needs a {what}")]
    MissingValue {
        /// The option.
        option: &'static str,
        /// What it takes (`path`, `name`).
        what: &'static str,
    },
    /// An argument that is not an option of the agent.
    #[error("unknown argument {arg:?}")]
    Unknown {
        /// The argument.
        arg: String,
    },
}

/// Startup failures.
#[derive(Debug, thiserror::Error)]
enum StartError {
    /// Bad command line.
    #[error("usage: rampart-agent [--listen <socket path>] [--default-user <name>] ({0})")]
    Usage(#[from] UsageError),
    /// RAMPART_AGENT_FD is not a number.
    #[error("RAMPART_AGENT_FD is not a file descriptor number: {value:?}")]
    BadFd {
        /// The variable's value.
        value: String,
    },
    /// Neither RAMPART_AGENT_FD nor --listen.
    #[error("no socket: set RAMPART_AGENT_FD or pass --listen <path>")]
    NoSocket,
    /// Socket setup failed.
    #[error("socket: {0}")]
    Socket(#[from] std::io::Error),
    /// Marking inherited descriptors close-on-exec failed.
    #[error("mark descriptors close-on-exec: {0}")]
    Descriptors(std::io::Error),
}

struct Args {
    listen: Option<String>,
    default_user: String,
    default_cwd: Option<String>,
}

fn parse_args() -> Result<Args, StartError> {
    let mut args = std::env::args().skip(1);
    let mut out = Args {
        listen: None,
        default_user: "user".into(),
        default_cwd: None,
    };
    while let Some(a) = args.next() {
        match a.as_str() {
            "--listen" => {
                out.listen = Some(args.next().ok_or(UsageError::MissingValue {
                    option: "--listen",
                    what: "path",
                })?)
            }
            "--default-user" => {
                out.default_user = args.next().ok_or(UsageError::MissingValue {
                    option: "--default-user",
                    what: "name",
                })?
            }
            "--default-cwd" => {
                out.default_cwd = Some(args.next().ok_or(UsageError::MissingValue {
                    option: "--default-cwd",
                    what: "path",
                })?)
            }
            "--version" => {
                println!(
                    "rampart-agent {} (protocol {})",
                    server::VERSION,
                    rampart_agent::proto::PROTOCOL_VERSION
                );
                std::process::exit(0);
            }
            other => return Err(UsageError::Unknown { arg: other.into() }.into()),
        }
    }
    Ok(out)
}

fn listener(args: &Args) -> Result<std::os::unix::net::UnixListener, StartError> {
    if let Some(v) = std::env::var_os("RAMPART_AGENT_FD") {
        let s = v.to_string_lossy().into_owned();
        let fd: i32 = s
            .trim()
            .parse()
            .map_err(|_| StartError::BadFd { value: s.clone() })?;
        if fd < 3 {
            return Err(StartError::BadFd { value: s });
        }
        // SAFETY: the jailer hands this fd over to us by contract; nothing else in this process
        // owns it, and it is wrapped exactly once.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        nix::fcntl::fcntl(
            fd,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        )
        .map_err(std::io::Error::from)?;
        let l = std::os::unix::net::UnixListener::from(owned);
        l.set_nonblocking(true)?;
        return Ok(l);
    }
    let path = args.listen.as_ref().ok_or(StartError::NoSocket)?;
    let _ = std::fs::remove_file(path);
    let l = std::os::unix::net::UnixListener::bind(path)?;
    l.set_nonblocking(true)?;
    Ok(l)
}

/// The jailer hands PID 1 a descriptor of the sandbox's disk root (`RAMPART_DISK_FD`) for
/// the host to reach through `/proc/1/fd` (see rampart-jail's `persist`). The agent keeps it
/// open, never uses it, and marks it close-on-exec so no process it starts inherits it.
fn keep_disk_fd() {
    let Some(fd) = std::env::var("RAMPART_DISK_FD")
        .ok()
        .and_then(|v| v.trim().parse::<i32>().ok())
        .filter(|fd| *fd > 2)
    else {
        return;
    };
    let _ = nix::fcntl::fcntl(
        fd,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    );
}

/// Marks every open descriptor above 2 close-on-exec, reading `/proc/self/fd`.
fn cloexec_each() -> std::io::Result<()> {
    let fds: Vec<i32> = std::fs::read_dir("/proc/self/fd")?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|fd| *fd > 2)
        .collect();
    for fd in fds {
        // The directory's own descriptor is gone by now (EBADF): nothing to mark.
        let _ = nix::fcntl::fcntl(
            fd,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        );
    }
    Ok(())
}

fn main() {
    if let Err(e) = real_main() {
        eprintln!("rampart-agent: {e}");
        std::process::exit(2);
    }
}

fn real_main() -> Result<(), StartError> {
    // No descriptor of PID 1 reaches a process it starts unless it is passed on purpose (the
    // jailer already closed everything but the socket and the disk's root; this covers
    // whatever a future launcher leaves open).
    // SAFETY: close_range(2) with CLOSE_RANGE_CLOEXEC only sets flags on our descriptors.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        // A kernel without the flag (gVisor's, older hosts): each open descriptor, one by one.
        if !matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS)) {
            return Err(StartError::Descriptors(e));
        }
        cloexec_each().map_err(StartError::Descriptors)?;
    }
    let args = parse_args()?;
    let std_listener = listener(&args)?;
    keep_disk_fd();
    // Children must not see the jailer's variables.
    let base_env: Vec<_> = std::env::vars_os()
        .filter(|(k, _)| !k.to_string_lossy().starts_with("RAMPART_"))
        .collect();
    let rampart_vars: Vec<_> = std::env::vars_os()
        .map(|(k, _)| k)
        .filter(|k| k.to_string_lossy().starts_with("RAMPART_"))
        .collect();
    for k in rampart_vars {
        std::env::remove_var(k);
    }
    // SAFETY: umask and getpid have no preconditions.
    let is_pid1 = unsafe {
        libc::umask(0o022);
        libc::getpid() == 1
    };
    // Non-dumpable on purpose, and from the start: processes in the sandbox, even its root,
    // cannot ptrace the agent or read its memory, environment or descriptors through
    // /proc/1/*. (Switching credentials in a CLONE_VM child would make it so anyway after the
    // first exec as another user; this keeps the behaviour the same from the first request.)
    // SAFETY: prctl with PR_SET_DUMPABLE takes an integer argument only.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    if !is_pid1 {
        // Orphans of our children come to us, as they would to PID 1.
        // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes an integer argument only.
        unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    }
    let listen = args.listen.clone();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let mut sigchld = signal(SignalKind::child())?;
        let mut sigterm = signal(SignalKind::terminate())?;
        let mut sigint = signal(SignalKind::interrupt())?;
        let first = tokio::net::UnixListener::from_std(std_listener)?;
        let procs = Arc::new(Table::default());
        let state = Arc::new(State {
            config: Config {
                default_user: args.default_user,
                default_cwd: args.default_cwd,
                base_env,
            },
            procs: procs.clone(),
            watchers: Watchers::default(),
        });
        let reaper = procs.clone();
        tokio::spawn(async move {
            reaper.reap(); // anything that exited before the handler was installed
            while sigchld.recv().await.is_some() {
                reaper.reap();
            }
        });
        // With `--listen` (a tier whose sandbox can be checkpointed, gVisor): SIGUSR2 lets
        // go of the socket and every connection (a host socket cannot be saved) and writes
        // `agent.released` beside the socket; SIGUSR1 binds the socket again.
        let mut release = signal(SignalKind::user_defined2())?;
        let mut rebind = signal(SignalKind::user_defined1())?;
        let mut server = Some(tokio::spawn(server::serve(first, state.clone())));
        loop {
            tokio::select! {
                _ = sigterm.recv() => break,
                _ = sigint.recv() => break,
                _ = release.recv(), if listen.is_some() => {
                    if let (Some(s), Some(path)) = (server.take(), listen.as_deref()) {
                        s.abort();
                        let _ = s.await;
                        let _ = std::fs::remove_file(path);
                        let marker = std::path::Path::new(path).with_file_name("agent.released");
                        if let Err(e) = std::fs::write(&marker, b"") {
                            eprintln!("rampart-agent: {}: {e}", marker.display());
                        }
                    }
                }
                _ = rebind.recv(), if listen.is_some() => {
                    if let (None, Some(path)) = (&server, listen.as_deref()) {
                        let _ = std::fs::remove_file(path);
                        match tokio::net::UnixListener::bind(path) {
                            Ok(l) => server = Some(tokio::spawn(server::serve(l, state.clone()))),
                            Err(e) => eprintln!("rampart-agent: bind {path}: {e}"),
                        }
                    }
                }
            }
        }
        shutdown(&procs, is_pid1).await;
        Ok::<(), StartError>(())
    })?;
    Ok(())
}

/// Ask every process to end, give them a moment, then kill what is left.
async fn shutdown(procs: &Table, is_pid1: bool) {
    procs.signal_all(libc::SIGTERM);
    if is_pid1 {
        // SAFETY: kill(-1) signals every process we may signal (all of the sandbox but us).
        unsafe { libc::kill(-1, libc::SIGTERM) };
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    while !procs.is_empty() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    procs.signal_all(libc::SIGKILL);
    if is_pid1 {
        // SAFETY: as above.
        unsafe { libc::kill(-1, libc::SIGKILL) };
    }
}
