//! `process.Process`: start, supervise, stream, reap.

mod spawn;

use super::{users, Body, Ctx, State};
use crate::connect::{self, Code, RpcError};
use crate::proto::{
    DataEvent, Empty, EndEvent, ListResponse, ProcessConfig, ProcessEvent, ProcessEventResponse,
    ProcessInfo, ProcessInput, ProcessSelector, SelectorRequest, SendInputRequest,
    SendSignalRequest, Signal, StartEvent, StartRequest, StreamInputRequest, UpdateRequest,
};
use bytes::{Bytes, BytesMut};
use hyper::body::Incoming;
use hyper::Response;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use std::collections::HashMap;
use std::ffi::CString;
use std::os::fd::{AsFd as _, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;
use tokio::io::unix::AsyncFd;
use tokio::io::AsyncWriteExt;
use tokio::net::unix::pipe;
use tokio::sync::{mpsc, oneshot};

/// Output read size.
const CHUNK: usize = 32 * 1024;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One event for subscribers of a process.
#[derive(Debug, Clone)]
pub enum Ev {
    /// Output.
    Data(DataEvent),
    /// The end; `true` when the agent killed it at its deadline.
    End(EndEvent, bool),
}

/// The supervised processes, and the waiters of the reaper.
#[derive(Debug, Default)]
pub struct Table {
    procs: Mutex<HashMap<u32, Arc<Proc>>>,
    waiters: Mutex<HashMap<u32, oneshot::Sender<WaitStatus>>>,
}

/// A supervised process.
#[derive(Debug)]
pub struct Proc {
    pid: u32,
    tag: Option<String>,
    config: ProcessConfig,
    pty: Option<Arc<AsyncFd<OwnedFd>>>,
    stdin: tokio::sync::Mutex<Option<pipe::Sender>>,
    /// `None` once ended.
    subs: Mutex<Option<Vec<mpsc::Sender<Ev>>>>,
    timed_out: AtomicBool,
}

impl Table {
    /// Reap every exited child; statuses of supervised ones go to their waiters.
    pub fn reap(&self) {
        let mut waiters = lock(&self.waiters);
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) => break,
                Ok(st) => {
                    if let Some(pid) = st.pid() {
                        if let Some(tx) = waiters.remove(&(pid.as_raw() as u32)) {
                            let _ = tx.send(st);
                        }
                    }
                }
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => break,
            }
        }
    }

    /// `List`.
    pub fn list(&self) -> ListResponse {
        let procs = lock(&self.procs);
        let mut v: Vec<ProcessInfo> = procs
            .values()
            .map(|p| ProcessInfo {
                config: Some(p.config.clone()),
                pid: p.pid,
                tag: p.tag.clone(),
            })
            .collect();
        v.sort_by_key(|p| p.pid);
        ListResponse { processes: v }
    }

    fn find(&self, sel: Option<&ProcessSelector>) -> Result<Arc<Proc>, RpcError> {
        let sel = sel
            .ok_or_else(|| RpcError::new(Code::InvalidArgument, "process selector is required"))?;
        let procs = lock(&self.procs);
        if let Some(pid) = sel.pid {
            return procs.get(&pid).cloned().ok_or_else(|| {
                RpcError::new(Code::NotFound, format!("process with pid {pid} not found"))
            });
        }
        if let Some(tag) = &sel.tag {
            return procs
                .values()
                .find(|p| p.tag.as_deref() == Some(tag))
                .cloned()
                .ok_or_else(|| {
                    RpcError::new(Code::NotFound, format!("process with tag {tag} not found"))
                });
        }
        Err(RpcError::new(
            Code::InvalidArgument,
            "process selector needs a pid or a tag",
        ))
    }

    /// Send `sig` to every supervised process group (used at shutdown).
    pub fn signal_all(&self, sig: i32) {
        for pid in lock(&self.procs).keys() {
            kill_group(*pid, sig);
        }
    }

    /// Number of supervised processes.
    pub fn len(&self) -> usize {
        lock(&self.procs).len()
    }

    /// Whether no process is supervised.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn kill_group(pid: u32, sig: i32) -> bool {
    let Ok(pid) = i32::try_from(pid) else {
        return false;
    };
    // SAFETY: kill has no memory-safety preconditions; a negative pid names the process group
    // that the child leads (it called setsid or setpgid before exec).
    let r = unsafe { libc::kill(-pid, sig) };
    if r == 0 {
        return true;
    }
    // SAFETY: as above, the process itself.
    unsafe { libc::kill(pid, sig) == 0 }
}

/// Go's `ProcessState.String()` for a wait status; `(exit_code, exited, status)`.
pub fn describe(st: &WaitStatus) -> (i32, bool, String) {
    match *st {
        WaitStatus::Exited(_, code) => (code, true, format!("exit status {code}")),
        WaitStatus::Signaled(_, sig, core) => {
            let name = match sig as i32 {
                libc::SIGHUP => "hangup".to_string(),
                libc::SIGINT => "interrupt".to_string(),
                libc::SIGQUIT => "quit".to_string(),
                libc::SIGILL => "illegal instruction".to_string(),
                libc::SIGTRAP => "trace/breakpoint trap".to_string(),
                libc::SIGABRT => "aborted".to_string(),
                libc::SIGBUS => "bus error".to_string(),
                libc::SIGFPE => "floating point exception".to_string(),
                libc::SIGKILL => "killed".to_string(),
                libc::SIGUSR1 => "user defined signal 1".to_string(),
                libc::SIGSEGV => "segmentation fault".to_string(),
                libc::SIGUSR2 => "user defined signal 2".to_string(),
                libc::SIGPIPE => "broken pipe".to_string(),
                libc::SIGALRM => "alarm clock".to_string(),
                libc::SIGTERM => "terminated".to_string(),
                n => format!("signal {n}"),
            };
            let core = if core { " (core dumped)" } else { "" };
            (-1, false, format!("signal: {name}{core}"))
        }
        _ => (-1, false, "unknown".to_string()),
    }
}

impl Proc {
    fn subscribe(&self) -> Option<mpsc::Receiver<Ev>> {
        let (tx, rx) = mpsc::channel(16);
        lock(&self.subs).as_mut()?.push(tx);
        Some(rx)
    }

    async fn broadcast(&self, ev: Ev) {
        let subs: Vec<_> = match &*lock(&self.subs) {
            Some(v) => v.clone(),
            None => return,
        };
        let mut dead = false;
        for s in &subs {
            if s.send(ev.clone()).await.is_err() {
                dead = true;
            }
        }
        if dead {
            if let Some(v) = lock(&self.subs).as_mut() {
                v.retain(|s| !s.is_closed());
            }
        }
    }

    async fn write_input(&self, input: &ProcessInput) -> Result<(), RpcError> {
        let data = input.pty.as_ref().or(input.stdin.as_ref());
        let Some(data) = data else { return Ok(()) };
        if let Some(pty) = &self.pty {
            return write_pty(pty, data)
                .await
                .map_err(|e| RpcError::new(Code::Internal, format!("writing to pty: {e}")));
        }
        if input.stdin.is_none() {
            return Err(RpcError::new(
                Code::FailedPrecondition,
                "the process has no pty",
            ));
        }
        let mut stdin = self.stdin.lock().await;
        let Some(w) = stdin.as_mut() else {
            return Err(RpcError::new(
                Code::FailedPrecondition,
                "stdin is not enabled or was closed",
            ));
        };
        match w.write_all(data).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(RpcError::new(
                Code::FailedPrecondition,
                "stdin was closed by the process",
            )),
            Err(e) => Err(RpcError::new(Code::Internal, format!("writing stdin: {e}"))),
        }
    }
}

async fn write_pty(fd: &AsyncFd<OwnedFd>, mut data: &[u8]) -> std::io::Result<()> {
    while !data.is_empty() {
        let mut guard = fd.writable().await?;
        match guard
            .try_io(|inner| nix::unistd::write(inner.get_ref(), data).map_err(std::io::Error::from))
        {
            Ok(Ok(n)) => data = &data[n..],
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => continue,
        }
    }
    Ok(())
}

/// Build a child's environment: the agent's, the user's basics, then the request's.
fn child_env(
    state: &State,
    user: &users::User,
    extra: &std::collections::BTreeMap<String, String>,
) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = state
        .config
        .base_env
        .iter()
        .filter_map(|(k, v)| Some((k.to_str()?.to_string(), v.to_str()?.to_string())))
        .filter(|(k, _)| !k.starts_with("RAMPART_"))
        .collect();
    let mut set = |k: &str, v: String| {
        env.retain(|(ek, _)| ek != k);
        env.push((k.to_string(), v));
    };
    set("HOME", user.home.clone());
    set("USER", user.name.clone());
    set("LOGNAME", user.name.clone());
    set(
        "SHELL",
        if user.shell.is_empty() {
            "/bin/sh".into()
        } else {
            user.shell.clone()
        },
    );
    let has_path = state.config.base_env.iter().any(|(k, _)| k == "PATH");
    if !has_path {
        set(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
        );
    }
    for (k, v) in extra {
        set(k, v.clone());
    }
    env
}

fn set_cloexec_nonblock(fd: &OwnedFd, nonblock: bool) -> std::io::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg, FdFlag, OFlag};
    fcntl(fd.as_raw_fd(), FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))?;
    if nonblock {
        let fl = OFlag::from_bits_truncate(fcntl(fd.as_raw_fd(), FcntlArg::F_GETFL)?);
        fcntl(fd.as_raw_fd(), FcntlArg::F_SETFL(fl | OFlag::O_NONBLOCK))?;
    }
    Ok(())
}

fn winsize(size: Option<crate::proto::PtySize>) -> libc::winsize {
    let s = size.unwrap_or(crate::proto::PtySize { cols: 80, rows: 24 });
    libc::winsize {
        ws_row: u16::try_from(s.rows).unwrap_or(u16::MAX).max(1),
        ws_col: u16::try_from(s.cols).unwrap_or(u16::MAX).max(1),
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

enum Outputs {
    Pipes(Option<pipe::Receiver>, Option<pipe::Receiver>),
    Pty(Arc<AsyncFd<OwnedFd>>),
}

/// Spawn a process as asked; returns it and its first subscription.
fn spawn(
    state: &Arc<State>,
    ctx: &Ctx,
    req: StartRequest,
) -> Result<(Arc<Proc>, mpsc::Receiver<Ev>), RpcError> {
    let config = req.process.unwrap_or_default();
    if config.cmd.is_empty() {
        return Err(RpcError::new(
            Code::InvalidArgument,
            "process.cmd is required",
        ));
    }
    let user = users::resolve(ctx.user.as_deref(), &state.config.default_user)?;
    let cwd = super::resolve_path(
        config
            .cwd
            .as_deref()
            .or(state.config.default_cwd.as_deref())
            .unwrap_or(""),
        &user.home,
    );
    let cwd_c = CString::new(cwd.as_os_str().as_encoded_bytes())
        .map_err(|_| RpcError::new(Code::InvalidArgument, "cwd contains a NUL byte"))?;
    match std::fs::metadata(&cwd) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(RpcError::new(
                Code::InvalidArgument,
                format!("cwd '{}' is not a directory", cwd.display()),
            ))
        }
        Err(_) => {
            return Err(RpcError::new(
                Code::InvalidArgument,
                format!("cwd '{}' does not exist", cwd.display()),
            ))
        }
    }
    let env = child_env(state, &user, &config.envs);

    // SAFETY: geteuid has no preconditions.
    let switch = unsafe { libc::geteuid() } == 0;

    let err = |what: &str, e: std::io::Error| RpcError::new(Code::Internal, format!("{what}: {e}"));
    let mut pty_master = None;
    // The child's ends (kept until it has exec'd), the agent's ends of the pipes.
    let child_ends: [OwnedFd; 3];
    let mut stdin_w = None;
    let mut pipe_ends = None;
    if let Some(pty) = &req.pty {
        let ws = winsize(pty.size);
        let r = nix::pty::openpty(Some(&ws), None)
            .map_err(|e| RpcError::new(Code::Internal, format!("openpty: {e}")))?;
        set_cloexec_nonblock(&r.master, true).map_err(|e| err("pty", e))?;
        set_cloexec_nonblock(&r.slave, false).map_err(|e| err("pty", e))?;
        let dup = |fd: &OwnedFd| fd.try_clone().map_err(|e| err("dup", e));
        child_ends = [dup(&r.slave)?, dup(&r.slave)?, r.slave];
        // SAFETY: the AsyncFd takes ownership of the OwnedFd, so the fd stays open and the same
        // for the AsyncFd's whole life.
        let master = unsafe { AsyncFd::register(r.master) }
            .map_err(|e| RpcError::new(Code::Internal, format!("pty: {e}")))?;
        let master = Arc::new(master);
        pty_master = Some(master);
    } else {
        let pipe = || {
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
                .map_err(|e| err("pipe", std::io::Error::from(e)))
        };
        let stdin_end = if req.stdin.unwrap_or(true) {
            let (r, w) = pipe()?;
            stdin_w = Some(w);
            r
        } else {
            std::fs::File::open("/dev/null")
                .map_err(|e| err("/dev/null", e))?
                .into()
        };
        let (out_r, out_w) = pipe()?;
        let (err_r, err_w) = pipe()?;
        child_ends = [stdin_end, out_w, err_w];
        pipe_ends = Some((out_r, err_r));
    }
    let spec = spawn::Spec {
        program: &config.cmd,
        args: &config.args,
        env: &env,
        cwd: &cwd_c,
        ids: switch.then_some((user.uid, user.gid, user.groups.as_slice())),
        session: req.pty.is_some(),
        stdio: [
            child_ends[0].as_fd(),
            child_ends[1].as_fd(),
            child_ends[2].as_fd(),
        ],
    };

    // Hold the waiters lock across spawn + registration so the reaper cannot take the status first.
    let (exit_tx, exit_rx) = oneshot::channel();
    let spawned = {
        let mut waiters = lock(&state.procs.waiters);
        let spawned = spawn::spawn(&spec).map_err(|e| {
            RpcError::new(
                Code::InvalidArgument,
                format!("error starting process '{}': {e}", config.cmd),
            )
        })?;
        waiters.insert(spawned.pid, exit_tx);
        spawned
    };
    let pid = spawned.pid;
    // Readable once the child has exited: the status is taken then, without waiting for
    // SIGCHLD to go round the signal handler and the reaper task.
    let pidfd = spawned.pidfd.and_then(|fd| {
        // SAFETY: the AsyncFd takes ownership of the OwnedFd, so the fd stays open and the
        // same for the AsyncFd's whole life.
        unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }.ok()
    });
    drop(child_ends);
    let outputs = match (&pty_master, pipe_ends) {
        (Some(master), _) => Outputs::Pty(master.clone()),
        (None, Some((out, err))) => {
            let conv = |fd: OwnedFd| pipe::Receiver::from_owned_fd(fd).ok();
            Outputs::Pipes(conv(out), conv(err))
        }
        (None, None) => Outputs::Pipes(None, None),
    };
    let stdin_w = stdin_w.and_then(|fd| pipe::Sender::from_owned_fd(fd).ok());

    let proc = Arc::new(Proc {
        pid,
        tag: req.tag.clone(),
        config,
        pty: pty_master,
        stdin: tokio::sync::Mutex::new(stdin_w),
        subs: Mutex::new(Some(Vec::new())),
        timed_out: AtomicBool::new(false),
    });
    let first = proc
        .subscribe()
        .ok_or_else(|| RpcError::new(Code::Internal, "process ended at once"))?;
    lock(&state.procs.procs).insert(pid, proc.clone());

    let timer = ctx.timeout.map(|t| {
        let weak: Weak<Proc> = Arc::downgrade(&proc);
        tokio::spawn(async move {
            tokio::time::sleep(t).await;
            if let Some(p) = weak.upgrade() {
                if lock(&p.subs).is_some() {
                    p.timed_out.store(true, Ordering::SeqCst);
                    kill_group(p.pid, libc::SIGKILL);
                }
            }
        })
    });
    let table = state.procs.clone();
    let exit = Exit { rx: exit_rx, pidfd };
    tokio::spawn(supervise(proc.clone(), table, outputs, exit, timer));
    Ok((proc, first))
}

/// Read one chunk (up to 32 KiB); `None` at EOF. No buffer is held while waiting.
async fn read_pipe(r: &Option<pipe::Receiver>) -> Option<Bytes> {
    let p = r.as_ref()?;
    loop {
        p.readable().await.ok()?;
        let mut tmp = [0u8; CHUNK];
        match p.try_read(&mut tmp) {
            Ok(0) => return None,
            Ok(n) => return Some(Bytes::copy_from_slice(&tmp[..n])),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return None,
        }
    }
}

async fn read_pty(fd: &AsyncFd<OwnedFd>) -> Option<Bytes> {
    loop {
        let mut guard = fd.readable().await.ok()?;
        let mut tmp = [0u8; CHUNK];
        match guard.try_io(|inner| {
            nix::unistd::read(inner.as_raw_fd(), &mut tmp).map_err(std::io::Error::from)
        }) {
            Ok(Ok(0)) | Ok(Err(_)) => return None, // EIO: every slave fd is closed.
            Ok(Ok(n)) => return Some(Bytes::copy_from_slice(&tmp[..n])),
            Err(_would_block) => continue,
        }
    }
}

/// Read what is buffered right now, without waiting.
fn drain_now(fd: i32) -> Vec<Bytes> {
    let mut out = Vec::new();
    let mut tmp = vec![0u8; CHUNK];
    loop {
        match nix::unistd::read(fd, &mut tmp) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.push(Bytes::copy_from_slice(&tmp[..n])),
        }
    }
    out
}

fn data(kind: u8, b: Bytes) -> Ev {
    let mut d = DataEvent::default();
    match kind {
        0 => d.stdout = Some(b),
        1 => d.stderr = Some(b),
        _ => d.pty = Some(b),
    }
    Ev::Data(d)
}

/// How a supervisor learns of its process's exit.
struct Exit {
    /// The status, from whoever reaps it.
    rx: oneshot::Receiver<WaitStatus>,
    /// The process's pidfd, readable once it has exited.
    pidfd: Option<AsyncFd<OwnedFd>>,
}

impl Exit {
    /// The exit status (`None` if it was lost).
    async fn wait(&mut self, table: &Table) -> Option<WaitStatus> {
        if let Some(fd) = &self.pidfd {
            tokio::select! {
                biased;
                st = &mut self.rx => return st.ok(),
                r = fd.readable() => {
                    if r.is_ok() {
                        // Exited: reap now (this sends its status to `rx`).
                        table.reap();
                    }
                }
            }
        }
        (&mut self.rx).await.ok()
    }
}

async fn supervise(
    proc: Arc<Proc>,
    table: Arc<Table>,
    mut outputs: Outputs,
    mut exit: Exit,
    timer: Option<tokio::task::JoinHandle<()>>,
) {
    let status = loop {
        match &mut outputs {
            Outputs::Pipes(out, err) => {
                if out.is_none() && err.is_none() {
                    break exit.wait(&table).await;
                }
                tokio::select! {
                    r = read_pipe(out), if out.is_some() => match r {
                        Some(b) => proc.broadcast(data(0, b)).await,
                        None => *out = None,
                    },
                    r = read_pipe(err), if err.is_some() => match r {
                        Some(b) => proc.broadcast(data(1, b)).await,
                        None => *err = None,
                    },
                    st = exit.wait(&table) => break st,
                }
            }
            Outputs::Pty(fd) => {
                let fd = fd.clone();
                tokio::select! {
                    r = read_pty(&fd) => match r {
                        Some(b) => proc.broadcast(data(2, b)).await,
                        None => break exit.wait(&table).await,
                    },
                    st = exit.wait(&table) => break st,
                }
            }
        }
    };
    // The process is gone: what it wrote is buffered; take it and end.
    match &outputs {
        Outputs::Pipes(out, err) => {
            for (kind, r) in [(0u8, out), (1u8, err)] {
                if let Some(r) = r {
                    for b in drain_now(r.as_raw_fd()) {
                        proc.broadcast(data(kind, b)).await;
                    }
                }
            }
        }
        Outputs::Pty(fd) => {
            for b in drain_now(fd.as_raw_fd()) {
                proc.broadcast(data(2, b)).await;
            }
        }
    }
    if let Some(t) = timer {
        t.abort();
    }
    let timed_out = proc.timed_out.load(Ordering::SeqCst);
    let end = match status {
        Some(st) => {
            let (exit_code, exited, status) = describe(&st);
            EndEvent {
                exit_code,
                exited,
                status,
                error: None,
            }
        }
        None => EndEvent {
            exit_code: -1,
            exited: false,
            status: "unknown".into(),
            error: Some("lost the exit status".into()),
        },
    };
    let subs = {
        let mut procs = lock(&table.procs);
        procs.remove(&proc.pid);
        lock(&proc.subs).take().unwrap_or_default()
    };
    *proc.stdin.lock().await = None;
    for s in subs {
        let _ = s.send(Ev::End(end.clone(), timed_out)).await;
    }
}

fn event_envelope(ev: ProcessEvent) -> Bytes {
    connect::message_envelope(&ProcessEventResponse { event: Some(ev) })
}

/// Pump a subscription into a server stream.
fn pump(
    pid: u32,
    mut rx: mpsc::Receiver<Ev>,
    keepalive: Duration,
    deadline: Option<Duration>,
) -> Response<Body> {
    let (tx, body) = mpsc::channel(8);
    // The start event is queued before the response is returned, so it leaves with the
    // response head in one write (a fresh channel has room for it).
    let start = ProcessEvent {
        start: Some(StartEvent { pid }),
        ..Default::default()
    };
    let _ = tx.try_send(event_envelope(start));
    tokio::spawn(async move {
        let deadline = deadline.and_then(|d| tokio::time::Instant::now().checked_add(d));
        loop {
            let until_deadline = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                ev = rx.recv() => match ev {
                    Some(Ev::Data(d)) => {
                        if tx.send(event_envelope(ProcessEvent { data: Some(d), ..Default::default() })).await.is_err() {
                            return;
                        }
                    }
                    Some(Ev::End(e, timed_out)) => {
                        let _ = tx.send(event_envelope(ProcessEvent { end: Some(e), ..Default::default() })).await;
                        let err = timed_out.then(|| RpcError::new(Code::DeadlineExceeded, "process killed: its deadline (connect-timeout-ms) elapsed"));
                        let _ = tx.send(connect::end_envelope(err.as_ref())).await;
                        return;
                    }
                    None => {
                        let err = RpcError::new(Code::Internal, "process supervision ended without an end event");
                        let _ = tx.send(connect::end_envelope(Some(&err))).await;
                        return;
                    }
                },
                _ = tokio::time::sleep(keepalive) => {
                    let ka = ProcessEvent { keepalive: Some(Empty {}), ..Default::default() };
                    if tx.send(event_envelope(ka)).await.is_err() {
                        return;
                    }
                }
                _ = until_deadline => {
                    let err = RpcError::new(Code::DeadlineExceeded, "stream deadline (connect-timeout-ms) elapsed");
                    let _ = tx.send(connect::end_envelope(Some(&err))).await;
                    return;
                }
                _ = tx.closed() => return,
            }
        }
    });
    super::stream_response(body)
}

/// `Start`.
pub fn start(state: &Arc<State>, ctx: &Ctx, req: StartRequest) -> Result<Response<Body>, RpcError> {
    let (proc, rx) = spawn(state, ctx, req)?;
    // The deadline is the process's lifetime (enforced by its timer), not the stream's.
    Ok(pump(proc.pid, rx, ctx.keepalive, None))
}

/// `Connect`.
pub fn connect(
    state: &Arc<State>,
    ctx: &Ctx,
    req: SelectorRequest,
) -> Result<Response<Body>, RpcError> {
    let proc = state.procs.find(req.process.as_ref())?;
    let rx = proc.subscribe().ok_or_else(|| {
        RpcError::new(
            Code::NotFound,
            format!("process with pid {} not found", proc.pid),
        )
    })?;
    Ok(pump(proc.pid, rx, ctx.keepalive, ctx.timeout))
}

/// `SendInput`.
pub async fn send_input(state: &Arc<State>, req: SendInputRequest) -> Result<Empty, RpcError> {
    let proc = state.procs.find(req.process.as_ref())?;
    proc.write_input(&req.input.unwrap_or_default()).await?;
    Ok(Empty {})
}

/// `CloseStdin`.
pub async fn close_stdin(state: &Arc<State>, req: SelectorRequest) -> Result<Empty, RpcError> {
    let proc = state.procs.find(req.process.as_ref())?;
    if let Some(pty) = &proc.pty {
        // A terminal has no separate stdin to close: send end-of-file (^D).
        write_pty(pty, b"\x04")
            .await
            .map_err(|e| RpcError::new(Code::Internal, format!("writing to pty: {e}")))?;
        return Ok(Empty {});
    }
    *proc.stdin.lock().await = None;
    Ok(Empty {})
}

/// `SendSignal`.
pub fn send_signal(state: &Arc<State>, req: SendSignalRequest) -> Result<Empty, RpcError> {
    let proc = state.procs.find(req.process.as_ref())?;
    let sig = match req.signal {
        Signal::Sigkill => libc::SIGKILL,
        Signal::Sigterm => libc::SIGTERM,
        Signal::Unspecified => {
            return Err(RpcError::new(Code::InvalidArgument, "signal is required"))
        }
    };
    if !kill_group(proc.pid, sig) {
        return Err(RpcError::new(
            Code::NotFound,
            format!("process with pid {} not found", proc.pid),
        ));
    }
    Ok(Empty {})
}

/// `Update` (PTY resize).
pub fn update(state: &Arc<State>, req: UpdateRequest) -> Result<Empty, RpcError> {
    let proc = state.procs.find(req.process.as_ref())?;
    let Some(pty) = req.pty else {
        return Ok(Empty {});
    };
    let Some(master) = &proc.pty else {
        return Err(RpcError::new(
            Code::FailedPrecondition,
            "the process has no pty",
        ));
    };
    let ws = winsize(pty.size);
    // SAFETY: TIOCSWINSZ reads one winsize from a valid pointer; the fd is an open pty master.
    let r = unsafe {
        libc::ioctl(
            master.as_raw_fd(),
            libc::TIOCSWINSZ,
            &ws as *const libc::winsize,
        )
    };
    if r < 0 {
        return Err(RpcError::new(
            Code::Internal,
            format!("resize: {}", std::io::Error::last_os_error()),
        ));
    }
    Ok(Empty {})
}

/// `StreamInput` (client streaming).
pub async fn stream_input(state: &Arc<State>, mut body: Incoming) -> Response<Body> {
    use http_body_util::BodyExt;
    let mut buf = BytesMut::new();
    let mut proc: Option<Arc<Proc>> = None;
    let result: Result<(), RpcError> = async {
        loop {
            while let Some((flags, payload)) = connect::take_envelope(&mut buf)
                .map_err(|e| RpcError::new(Code::InvalidArgument, e.to_string()))?
            {
                if flags & connect::FLAG_END_STREAM != 0 {
                    return Ok(());
                }
                let msg: StreamInputRequest = super::parse(&payload)?;
                if let Some(s) = msg.start {
                    proc = Some(state.procs.find(s.process.as_ref())?);
                } else if let Some(d) = msg.data {
                    let p = proc.as_ref().ok_or_else(|| {
                        RpcError::new(Code::FailedPrecondition, "the first message must be start")
                    })?;
                    p.write_input(&d.input.unwrap_or_default()).await?;
                }
            }
            match body.frame().await {
                None => {
                    if !buf.is_empty() {
                        return Err(RpcError::new(Code::InvalidArgument, "truncated envelope"));
                    }
                    return Ok(());
                }
                Some(Err(e)) => {
                    return Err(RpcError::new(
                        Code::Canceled,
                        format!("reading request: {e}"),
                    ))
                }
                Some(Ok(f)) => {
                    if let Ok(d) = f.into_data() {
                        buf.extend_from_slice(&d);
                    }
                }
            }
        }
    }
    .await;
    match result {
        Ok(()) => {
            let mut b = BytesMut::new();
            b.extend_from_slice(&connect::message_envelope(&Empty {}));
            b.extend_from_slice(&connect::end_envelope(None));
            super::full(200, "application/connect+json", b.freeze())
        }
        Err(e) => super::stream_error(&e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_like_go() {
        let p = Pid::from_raw(1);
        assert_eq!(
            describe(&WaitStatus::Exited(p, 3)),
            (3, true, "exit status 3".into())
        );
        assert_eq!(
            describe(&WaitStatus::Signaled(
                p,
                nix::sys::signal::Signal::SIGKILL,
                false
            )),
            (-1, false, "signal: killed".into())
        );
        assert_eq!(
            describe(&WaitStatus::Signaled(
                p,
                nix::sys::signal::Signal::SIGSEGV,
                true
            )),
            (-1, false, "signal: segmentation fault (core dumped)".into())
        );
    }
}
