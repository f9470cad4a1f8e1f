//! Containment against the host's process context, the kernel and the neighbours (issue 10):
//! each `sandbox_blocks_*` test starts a real daemon the way users do (from an interactive
//! shell on a terminal, or holding descriptors its parent had open), runs the real attack in
//! a real sandbox as the plain user and as root inside (`sudo`), and asserts it fails by the
//! mechanism that is meant to stop it.
//!
//! Needs root and the binaries built in the same target directory; otherwise each test
//! prints `skipped: <reason>` and returns.
//!
//! Run: `cargo build --workspace --bins && cargo test -p rampart-cli --test containment`.

mod support;

use serde_json::{json, Value};
use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::{client, token, wait_until, Daemon, Sandbox};

const MIB: u64 = 1 << 20;

/// A temp directory of a test (removed when dropped, unless something is mounted below it).
struct TempRoot(PathBuf);

impl TempRoot {
    fn new(name: &str) -> TempRoot {
        let p = std::env::temp_dir().join(format!("rampart-{name}-{}", token()));
        std::fs::create_dir_all(&p).unwrap();
        TempRoot(p)
    }
}

impl Drop for TempRoot {
    fn drop(&mut self) {
        let mounted = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .contains(&format!(" {}/", self.0.display()));
        if !mounted {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn serve_args(data: &Path, port: u16) -> Vec<String> {
    vec![
        "serve".into(),
        "--listen".into(),
        format!("127.0.0.1:{port}"),
        "--data-dir".into(),
        data.display().to_string(),
        // As support::DAEMON_ENV: a CI machine may have only a few GiB free.
        "--disk-overcommit".into(),
        "1000".into(),
    ]
}

fn wait_health(url: &str, pid: i32, log: &Path) {
    let c = client();
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        if c.get(format!("{url}/health"))
            .send()
            .map(|r| r.status().is_success())
            .unwrap_or(false)
        {
            return;
        }
        let log = std::fs::read_to_string(log).unwrap_or_default();
        assert!(
            support::process_alive(pid),
            "the daemon exited before answering /health\n{log}"
        );
        assert!(Instant::now() < deadline, "no /health within 180 s\n{log}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs `python3 -c code` as `user` in `sb`; its stdout parsed as JSON (the probes print
/// one JSON object).
fn py(sb: &Sandbox, user: &str, code: &str) -> Value {
    let r = sb.exec(json!({
        "cmd": ["python3", "-c", code],
        "user": user,
        "timeout_secs": 120,
    }));
    let out = r["stdout"].as_str().unwrap_or_default();
    serde_json::from_str(out.trim()).unwrap_or_else(|e| {
        panic!(
            "probe as {user} printed no JSON ({e}): exit {} stdout {out:?} stderr {:?}",
            r["exit_code"], r["stderr"]
        )
    })
}

/// Runs `bash -c script` as `user` in `sb`.
fn bash(sb: &Sandbox, user: &str, script: &str) -> Value {
    sb.exec(json!({
        "cmd": ["bash", "-c", script],
        "user": user,
        "timeout_secs": 120,
    }))
}

/// The probe both users run: opens the terminal the sandbox would have, pushes a job-control
/// stop and a command into it with TIOCSTI, and tries every descriptor that is a terminal.
const TTY_PROBE: &str = r#"
import errno, fcntl, json, os, sys, termios
out = {"open_dev_tty": None, "tiocsti": [], "ttys": []}
def push(fd, text):
    for ch in text:
        fcntl.ioctl(fd, termios.TIOCSTI, bytes([ch]))
try:
    fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
    out["open_dev_tty"] = "opened"
    try:
        push(fd, b"\x1a")
        push(fd, ("touch " + MARKER + "; fg\n").encode())
        out["tiocsti"].append("/dev/tty: pushed")
    except OSError as e:
        out["tiocsti"].append("/dev/tty: " + errno.errorcode[e.errno])
except OSError as e:
    out["open_dev_tty"] = errno.errorcode[e.errno]
for n in range(256):
    try:
        if os.isatty(n):
            out["ttys"].append(n)
            try:
                push(n, b"\x1a")
                push(n, ("touch " + MARKER + "; fg\n").encode())
                out["tiocsti"].append("%d: pushed" % n)
            except OSError as e:
                out["tiocsti"].append("%d: %s" % (n, errno.errorcode[e.errno]))
    except OSError:
        pass
st = open("/proc/self/stat").read().rsplit(") ", 1)[1].split()
out["tty_nr"] = int(st[4])
out["sid"] = os.getsid(0)
print(json.dumps(out))
"#;

#[test]
fn sandbox_blocks_keystrokes_into_the_operators_terminal() {
    if let Some(why) = support::skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    if Command::new("script").arg("--version").output().is_err() {
        eprintln!("skipped: `script` (util-linux) is not installed");
        return;
    }
    let root = TempRoot::new("tty");
    let data = root.0.join("data");
    let log = root.0.join("daemon.log");
    let pidfile = root.0.join("daemon.pid");
    let fence = root.0.join("fence");
    let marker = root.0.join("pwned");
    let port = support::free_port();
    let url = format!("http://127.0.0.1:{port}");
    // An interactive bash with job control on a pseudo-terminal of its own (what an operator
    // has in a terminal window), started by `script`, whose stdin is our keyboard.
    let mut term: Child = Command::new("script")
        .args(["-qfec", "bash --norc --noprofile -i", "/dev/null"])
        .env("PS1", "$ ")
        .env("TERM", "dumb")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .expect("spawn script");
    let mut screen = term.stdout.take().unwrap();
    let screen_log = root.0.join("screen");
    let screen_copy = screen_log.clone();
    let reader = std::thread::spawn(move || {
        let mut all = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = screen.read(&mut buf) {
            if n == 0 {
                break;
            }
            all.extend_from_slice(&buf[..n]);
            let _ = std::fs::write(&screen_copy, &all);
        }
        String::from_utf8_lossy(&all).into_owned()
    });
    let mut keyboard = term.stdin.take().unwrap();
    support::provision(&data);
    let args = serve_args(&data, port).join(" ");
    // As the README says: the daemon in the foreground of the operator's shell.
    writeln!(
        keyboard,
        "{} {args} >>{} 2>&1 & echo $! >{}; fg",
        env!("CARGO_BIN_EXE_rampart"),
        log.display(),
        pidfile.display()
    )
    .unwrap();
    keyboard.flush().unwrap();
    wait_until("the shell started the daemon", 60, || pidfile.exists());
    wait_until("the pid file is written", 10, || {
        std::fs::read_to_string(&pidfile)
            .map(|s| s.trim().parse::<i32>().is_ok())
            .unwrap_or(false)
    });
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    wait_health(&url, pid, &log);

    let probe = TTY_PROBE.replace("MARKER", &format!("{:?}", marker.display().to_string()));
    let results = {
        let sb = Sandbox::create(&url, json!({"timeout_secs": 300}));
        let user = py(&sb, "user", &probe);
        let root_inside = py(&sb, "root", &probe);
        // And under a PTY exec: its own terminal, in a session of its own.
        let pty = sb.exec(json!({
            "cmd": ["python3", "-c", probe],
            "tty": [80, 24],
            "timeout_secs": 120,
        }));
        (user, root_inside, pty)
    };

    // Stop the daemon (by pid), then type a fence: once the shell has run it, it has read
    // every byte that was in the terminal's input queue before it, injected ones included.
    // SAFETY: kill(2) on the pid of the daemon this test's shell started.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    wait_until("the daemon exits", 60, || !support::process_alive(pid));
    writeln!(keyboard, "echo fenced >{}; exit", fence.display()).unwrap();
    keyboard.flush().unwrap();
    wait_until("the shell runs the fence", 60, || fence.exists());
    drop(keyboard);
    let _ = term.wait();
    let screen = reader.join().unwrap_or_default();
    support::unmount_store(&data);

    let (user, root_inside, pty) = results;
    assert!(
        !marker.exists(),
        "a command injected from the sandbox ran in the operator's shell\nscreen:\n{screen}"
    );
    for (who, r) in [("user", &user), ("root", &root_inside)] {
        assert_eq!(
            r["open_dev_tty"], "ENXIO",
            "{who}: /dev/tty must name no terminal: {r}"
        );
        assert_eq!(r["ttys"], json!([]), "{who}: a terminal descriptor: {r}");
        assert_eq!(r["tty_nr"], 0, "{who}: a controlling terminal: {r}");
        assert_eq!(r["sid"], 1, "{who}: not in the sandbox's session: {r}");
    }
    // The PTY exec's /dev/tty is its own terminal; pushing input into it is refused by the
    // filter even there.
    let out = pty["stdout"].as_str().unwrap_or_default();
    assert!(
        out.contains("\"open_dev_tty\": \"opened\""),
        "pty exec: {pty}"
    );
    assert!(
        out.contains("/dev/tty: EPERM") && !out.contains("pushed"),
        "pty exec: TIOCSTI must be refused: {pty}"
    );
}

/// Walks every process's descriptors in the sandbox and tries to read through each.
const FD_PROBE: &str = r#"
import json, os, stat, sys
secret, marker = sys.argv[1], sys.argv[2]
seen = []
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    d = "/proc/%s/fd" % pid
    try:
        fds = os.listdir(d)
    except OSError:
        continue
    for fd in fds:
        p = d + "/" + fd
        try:
            target = os.readlink(p)
        except OSError:
            continue
        hit = None
        try:
            mode = os.stat(p).st_mode
            if stat.S_ISDIR(mode):
                if marker in os.listdir(p):
                    hit = "host directory listed"
            elif stat.S_ISREG(mode):
                with open(p, "rb") as f:
                    if secret.encode() in f.read(1 << 16):
                        hit = "host file read"
        except OSError:
            pass
        seen.append({"pid": pid, "fd": fd, "target": target, "hit": hit})
print(json.dumps(seen))
"#;

#[test]
fn sandbox_blocks_descriptors_the_daemon_inherited() {
    if let Some(why) = support::skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let root = TempRoot::new("fds");
    let data = root.0.join("data");
    let secret = format!("host-secret-{}", token());
    let marker = format!("host-marker-{}", token());
    let host_file = root.0.join("host-file");
    std::fs::write(&host_file, &secret).unwrap();
    let host_dir = root.0.join("host-dir");
    std::fs::create_dir(&host_dir).unwrap();
    std::fs::write(host_dir.join(&marker), "x").unwrap();
    let f = std::fs::File::open(&host_file).unwrap();
    let d = std::fs::File::open(&host_dir).unwrap();
    let (pipe_r, pipe_w) = {
        let mut fds = [0; 2];
        // SAFETY: `fds` is a valid 2-element array.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        (fds[0], fds[1])
    };
    let port = support::free_port();
    let log = root.0.join("daemon.log");
    let logf = std::fs::File::create(&log).unwrap();
    let (ffd, dfd) = (
        std::os::fd::AsRawFd::as_raw_fd(&f),
        std::os::fd::AsRawFd::as_raw_fd(&d),
    );
    support::provision(&data);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rampart"));
    cmd.args(serve_args(&data, port))
        .stdin(Stdio::null())
        .stdout(logf.try_clone().unwrap())
        .stderr(logf);
    // SAFETY: the hook only calls dup2, which is async-signal-safe; dup2 leaves the new
    // descriptors without close-on-exec, as a careless parent would.
    unsafe {
        cmd.pre_exec(move || {
            for (from, to) in [(ffd, 7), (pipe_w, 8), (dfd, 9)] {
                if libc::dup2(from, to) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let child = cmd.spawn().expect("spawn rampart serve");
    let daemon = Daemon {
        child,
        url: format!("http://127.0.0.1:{port}"),
        data: data.clone(),
    };
    // SAFETY: closing our copy of the write end; the daemon holds its own at fd 8.
    unsafe { libc::close(pipe_w) };
    wait_health(&daemon.url, daemon.child.id() as i32, &log);
    // The daemon really holds them (the test is only meaningful if it does).
    let held: Vec<String> = [7, 8, 9]
        .iter()
        .filter_map(|n| std::fs::read_link(format!("/proc/{}/fd/{n}", daemon.child.id())).ok())
        .map(|p| p.display().to_string())
        .collect();
    assert_eq!(held.len(), 3, "the daemon does not hold fds 7-9: {held:?}");

    let sb = Sandbox::create(&daemon, json!({"timeout_secs": 300}));
    for user in ["user", "root"] {
        let r = sb.exec(json!({
            "cmd": ["python3", "-c", FD_PROBE, secret, marker],
            "user": user,
            "timeout_secs": 120,
        }));
        let seen: Value = serde_json::from_str(r["stdout"].as_str().unwrap_or("").trim())
            .unwrap_or_else(|e| panic!("probe output ({e}): {r}"));
        let arr = seen.as_array().unwrap();
        assert!(
            !arr.is_empty(),
            "{user}: the probe saw no descriptor at all: {r}"
        );
        for e in arr {
            assert!(e["hit"].is_null(), "{user}: {e}");
            let t = e["target"].as_str().unwrap_or_default();
            assert!(
                !t.contains("host-file") && !t.contains("host-dir"),
                "{user}: a descriptor of the daemon's parent reached the sandbox: {e}"
            );
            assert!(
                !t.contains(&data.display().to_string()),
                "{user}: a descriptor names the host's data directory: {e}"
            );
        }
    }
    drop(sb);
    drop(f);
    drop(d);
    // SAFETY: closing our read end of the pipe.
    unsafe { libc::close(pipe_r) };
    drop(daemon);
}

/// Calls each syscall with harmless arguments through libc's `syscall` and reports the errno.
const SECCOMP_PROBE: &str = r#"
import ctypes, errno, json, os, socket
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    e = ctypes.get_errno()
    return "ok" if r >= 0 else errno.errorcode.get(e, str(e))
me = os.getpid()
pidfd = os.pidfd_open(me)
buf = ctypes.create_string_buffer(64)
out = {
    "kcmp": call(312, me, me, 0, 0, 0),
    "pidfd_getfd": call(438, pidfd, 0, 0),
    "process_madvise": call(440, pidfd, 0, 0, 0, 0),
    "migrate_pages": call(256, 0, 64, ctypes.addressof(buf), ctypes.addressof(buf)),
    "move_pages": call(279, 0, 0, 0, 0, 0, 0),
    "mbind": call(237, 0, 0, 0, 0, 0, 0),
    "statmount": call(457, 0, 0, 0, 0),
    "listmount": call(458, 0, 0, 0, 0),
    "open_tree_attr": call(467, -100, 0, 0, 0, 0),
    "open_tree": call(428, -100, 0, 0),
    "io_uring_setup": call(425, 1, 0),
    "unassigned_600": call(600),
    "future_999": call(999),
    "clone3": call(435, 0, 0),
    "getpid": call(39),
}
try:
    socket.socket(40, socket.SOCK_STREAM)
    out["vsock"] = "ok"
except OSError as e:
    out["vsock"] = errno.errorcode[e.errno]
for fam in (socket.AF_INET, socket.AF_UNIX, socket.AF_INET6):
    try:
        socket.socket(fam, socket.SOCK_STREAM).close()
        out["socket_%d" % fam] = "ok"
    except OSError as e:
        out["socket_%d" % fam] = errno.errorcode[e.errno]
print(json.dumps(out))
"#;

#[test]
fn sandbox_blocks_syscalls_outside_the_allowlist() {
    if let Some(why) = support::skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    if !cfg!(target_arch = "x86_64") {
        eprintln!("skipped: the probe uses x86_64 syscall numbers");
        return;
    }
    let root = TempRoot::new("seccomp");
    let data = root.0.join("data");
    let port = support::free_port();
    let daemon = support::start(&data, port, &[]);
    let sb = Sandbox::create(&daemon, json!({"timeout_secs": 300}));
    for user in ["user", "root"] {
        let r = py(&sb, user, SECCOMP_PROBE);
        for k in [
            "kcmp",
            "pidfd_getfd",
            "process_madvise",
            "migrate_pages",
            "move_pages",
            "mbind",
            "statmount",
            "listmount",
            "open_tree_attr",
            "open_tree",
            "io_uring_setup",
        ] {
            assert_eq!(r[k], "EPERM", "{user}: {k}: {r}");
        }
        for k in ["unassigned_600", "future_999", "clone3"] {
            assert_eq!(r[k], "ENOSYS", "{user}: {k}: {r}");
        }
        assert_eq!(r["vsock"], "EAFNOSUPPORT", "{user}: AF_VSOCK: {r}");
        assert_eq!(r["getpid"], "ok", "{user}: {r}");
        for fam in [libc::AF_INET, libc::AF_UNIX, libc::AF_INET6] {
            assert_eq!(
                r[format!("socket_{fam}")],
                "ok",
                "{user}: family {fam}: {r}"
            );
        }
    }
    drop(sb);
    drop(daemon);
}

#[test]
fn sandbox_blocks_views_of_neighbours_and_host_paths() {
    if let Some(why) = support::skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let root = TempRoot::new("neigh");
    let data = root.0.join("data");
    let port = support::free_port();
    let daemon = support::start(&data, port, &[]);
    let a = Sandbox::create(&daemon, json!({"timeout_secs": 300}));
    let b = Sandbox::create(&daemon, json!({"timeout_secs": 300}));
    let data_s = data.display().to_string();
    // Everything a process inside can read that names block devices, mounts or masked
    // kernel state.
    let script = r#"
        for f in /proc/self/mountinfo /proc/self/mounts /proc/self/mountstats /proc/partitions \
                 /proc/diskstats /proc/swaps; do echo "== $f"; cat "$f" 2>/dev/null; done
        for f in /sys/block/*/loop/backing_file /sys/class/block/*/loop/backing_file \
                 /sys/devices/virtual/block/*/loop/backing_file; do
            [ -e "$f" ] && { echo "== $f"; cat "$f"; }
        done
        echo "== ls"; ls /sys/block /sys/class/block /sys/dev/block /sys/devices/virtual/block \
            /sys/devices/virtual/powercap /sys/firmware /proc/acpi /proc/scsi /proc/asound \
            /sys/fs/ext4 2>/dev/null
        for f in /proc/interrupts /proc/keys /proc/timer_list /proc/latency_stats \
                 /proc/sched_debug /proc/kcore; do
            [ -e "$f" ] && echo "== $f $(head -c 4096 "$f" 2>/dev/null | wc -c)"
        done
        true
    "#;
    for user in ["user", "root"] {
        let r = bash(&a, user, script);
        let out = r["stdout"].as_str().unwrap_or_default();
        assert!(out.contains("== /proc/self/mountinfo"), "{user}: {r}");
        assert!(
            !out.contains(&b.id),
            "{user}: sandbox {} sees its neighbour {}:\n{out}",
            a.id,
            b.id
        );
        assert!(
            !out.contains(&data_s),
            "{user}: the host's data directory {data_s} is named inside:\n{out}"
        );
        assert!(
            !out.contains("backing_file"),
            "{user}: loop devices visible:\n{out}"
        );
        let listed = out.split("== ls").nth(1).unwrap_or_default();
        let listed = listed.split("== ").next().unwrap_or_default();
        for l in listed.lines() {
            let l = l.trim();
            assert!(
                l.is_empty() || l.ends_with(':'),
                "{user}: a masked directory is not empty ({l:?}):\n{out}"
            );
        }
        for f in [
            "/proc/interrupts",
            "/proc/keys",
            "/proc/timer_list",
            "/proc/sched_debug",
            "/proc/kcore",
        ] {
            if let Some(l) = out.lines().find(|l| l.starts_with(&format!("== {f} "))) {
                assert!(l.ends_with(" 0"), "{user}: {f} is readable: {l}");
            }
        }
    }
    drop((a, b));
    drop(daemon);
}

/// Floods its own loopback with TCP connections whose receiver never reads, until the
/// kernel refuses more buffer memory; prints how much it queued.
const TCP_PROBE: &str = r#"
import json, socket, time
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", 0)); srv.listen(512)
port = srv.getsockname()[1]
conns, acc, queued = [], [], 0
chunk = b"x" * (1 << 20)
deadline = time.time() + 60
for i in range(120):
    c = socket.create_connection(("127.0.0.1", port))
    acc.append(srv.accept()[0])
    c.setblocking(False)
    conns.append(c)
    while time.time() < deadline:
        try:
            queued += c.send(chunk)
        except BlockingIOError:
            break
    if time.time() > deadline:
        break
print(json.dumps({"queued": queued, "conns": len(conns)}))
"#;

#[test]
fn sandbox_blocks_socket_memory_beyond_its_limit() {
    if let Some(why) = support::skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let root = TempRoot::new("sockmem");
    let data = root.0.join("data");
    let port = support::free_port();
    let daemon = support::start(&data, port, &[]);
    let limit = 256 * MIB;
    let sb = Sandbox::create(
        &daemon,
        json!({"timeout_secs": 300, "limits": {"memory_bytes": limit}}),
    );
    let v1 = PathBuf::from(format!("/sys/fs/cgroup/memory/rampart/{}", sb.id));
    let v2 = [
        PathBuf::from(format!("/sys/fs/cgroup/unified/rampart/{}", sb.id)),
        PathBuf::from(format!("/sys/fs/cgroup/rampart/{}", sb.id)),
    ]
    .into_iter()
    .find(|p| p.join("memory.max").exists());
    if !v1.is_dir() && v2.is_none() {
        eprintln!("skipped: the sandbox has no memory cgroup on this host");
        return;
    }
    let r = py(&sb, "user", TCP_PROBE);
    let queued = r["queued"].as_u64().unwrap();
    if v1.is_dir() {
        let tcp = std::fs::read_to_string(v1.join("memory.kmem.tcp.limit_in_bytes")).unwrap();
        let tcp: u64 = tcp.trim().parse().unwrap();
        assert!(
            tcp <= limit,
            "cgroup v1: TCP buffers are not bounded by the sandbox's memory: {tcp}"
        );
        let peak: u64 = std::fs::read_to_string(v1.join("memory.kmem.tcp.max_usage_in_bytes"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        eprintln!(
            "v1: queued {queued} bytes in {} connections; TCP peak {peak}, limit {tcp}",
            r["conns"]
        );
        // The kernel lets each socket overshoot by a minimal allocation under pressure.
        let conns = r["conns"].as_u64().unwrap_or(0);
        assert!(
            peak <= tcp + 2 * conns * 256 * 1024,
            "peak TCP memory {peak} far over its limit {tcp}"
        );
    } else if let Some(d) = v2 {
        let stat = std::fs::read_to_string(d.join("memory.stat")).unwrap();
        let sock: u64 = stat
            .lines()
            .find_map(|l| l.strip_prefix("sock "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        assert!(sock <= limit, "socket memory {sock} over the memory limit");
        eprintln!("v2: queued {queued} bytes; sock {sock}");
    }
    // Data queued on sockets (both ends in the sandbox) stays within the sandbox's memory.
    assert!(
        queued <= limit,
        "a 256 MiB sandbox queued {} MiB in TCP buffers",
        queued / MIB
    );
    drop(sb);
    drop(daemon);
}

fn free_bytes(p: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
    // SAFETY: an all-zero statvfs is valid, and `c` is a NUL-terminated path.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above; `s` is written by the call.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut s) }, 0);
    s.f_bavail * s.f_frsize
}

#[test]
fn sandbox_blocks_disk_overcommit() {
    if let Some(why) = support::skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let root = TempRoot::new("disk");
    let data = root.0.join("data");
    let port = support::free_port();
    let daemon = support::start(&data, port, &[("RAMPART_DISK_OVERCOMMIT", "1")]);
    let free = free_bytes(&data);
    // Two big disks fill all but about 6 GiB of the file system (whatever it has free), so
    // a third is refused and a default 2 GiB one still fits after: each admitted one is
    // counted.
    let disk: u64 = (free.saturating_sub(6 << 30) / 2).max(1 << 30);
    let mut made = Vec::new();
    let mut refusal = None;
    for _ in 0..=(free / disk + 1) {
        let r = client()
            .post(format!("{}/v1/sandboxes", daemon.url))
            .json(&json!({"timeout_secs": 300, "limits": {"disk_bytes": disk}}))
            .send()
            .unwrap();
        let status = r.status().as_u16();
        let v: Value = r.json().unwrap_or(Value::Null);
        if status == 201 {
            made.push(Sandbox::adopt(&daemon, v["id"].as_str().unwrap()));
        } else {
            refusal = Some((status, v));
            break;
        }
    }
    let (status, v) = refusal.expect("every create was admitted");
    assert_eq!(status, 503, "{v}");
    let msg = v.to_string();
    assert!(
        msg.contains("capacity") && msg.contains("GiB free on"),
        "{msg}"
    );
    assert!(
        made.len() as u64 * disk <= free,
        "{} disks of {} GiB admitted with {} GiB free",
        made.len(),
        disk >> 30,
        free >> 30
    );
    // Each admitted disk is counted and a destroyed one gives its share back: with one of
    // them gone, one of the same size fits again (whatever the file system had free), and
    // nothing of the refused create is left.
    let Some(gone) = made.pop() else {
        eprintln!("the store could not hold even one disk of {disk} bytes; nothing more to check");
        return;
    };
    gone.destroy();
    let small = Sandbox::create(
        &daemon,
        json!({"timeout_secs": 300, "limits": {"disk_bytes": disk}}),
    );
    let listed: Value = client()
        .get(format!("{}/v1/sandboxes", daemon.url))
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(
        listed.as_array().map(|a| a.len()),
        Some(made.len() + 1),
        "{listed}"
    );
    drop(small);
    drop(made);
    drop(daemon);
}
