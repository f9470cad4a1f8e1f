//! Adversarial tests (tier 3): each `sandbox_blocks_*` test creates its own sandbox in a real
//! daemon, runs a real escape or exhaustion attempt inside it, asserts the attempt fails the
//! expected way, and then checks that the host is still healthy (the daemon answers `/health`
//! and a fresh exec in another sandbox works).
//!
//! One daemon serves the whole test binary (`support::shared`): it listens on a free loopback
//! port with a data directory under a fresh temp dir. It is started through a small shell
//! wrapper whose stdin is a pipe held by this process; when the test process exits the pipe
//! closes and the wrapper stops the daemon (by pid) and removes the temp dir if nothing is
//! mounted under it. Every sandbox is deleted by a guard when its test ends (also on panic).
//!
//! Needs root and the binaries `rampart`, `rampart-jailer`, `rampart-agent` built in the same
//! target directory; otherwise each test prints `skipped: <reason>` and returns.
//!
//! Run: `cargo build --workspace --bins && cargo test -p rampart-cli --test adversarial`.

mod support;

use rampart_types::{CreateSandbox, ExecRequest, ExecResult, LimitsRequest};
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use support::{process_alive, token};

const MIB: u64 = 1 << 20;

/// Capabilities a container's root may keep (Docker's default set without CAP_NET_RAW):
/// CHOWN, DAC_OVERRIDE, FOWNER, FSETID, KILL, SETGID, SETUID, SETPCAP, NET_BIND_SERVICE,
/// SYS_CHROOT, MKNOD, AUDIT_WRITE, SETFCAP.
const ALLOWED_CAPS: [u32; 13] = [0, 1, 3, 4, 5, 6, 7, 8, 10, 18, 27, 29, 31];

const CAP_NAMES: [&str; 41] = [
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
    "PERFMON",
    "BPF",
    "CHECKPOINT_RESTORE",
];

// ---------------------------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------------------------

fn digits() -> String {
    token()
        .bytes()
        .map(|c| char::from(b'0' + c % 10))
        .take(9)
        .collect()
}

/// A field of /proc/<pid>/status, e.g. `status_field(pid, "VmRSS")`.
fn status_field(pid: i32, field: &str) -> Option<String> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find(|l| l.starts_with(&format!("{field}:")))
        .map(|l| l[field.len() + 1..].trim().to_string())
}

/// Resident memory of a process in bytes.
fn rss_bytes(pid: i32, field: &str) -> u64 {
    status_field(pid, field)
        .and_then(|v| {
            v.split_whitespace()
                .next()
                .and_then(|n| n.parse::<u64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

/// Bytes available to root on the filesystem holding `dir`.
fn free_bytes(dir: &Path) -> u64 {
    let out = Command::new("df")
        .arg("-B1")
        .arg("--output=avail")
        .arg(dir)
        .output()
        .expect("run df");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .nth(1)
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("cannot parse df output: {:?}", out))
}

/// Bytes allocated under `dir` on its own filesystem (mounts under it are not crossed).
fn allocated_bytes(dir: &Path) -> u64 {
    let out = Command::new("du")
        .arg("-x")
        .arg("-s")
        .arg("-B1")
        .arg(dir)
        .output()
        .expect("run du");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("cannot parse du output: {:?}", out))
}

fn pct_encode(s: &str) -> String {
    let mut o = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~/".contains(&b) {
            o.push(b as char);
        } else {
            o.push_str(&format!("%{b:02X}"));
        }
    }
    o
}

/// Shows an exec result for a failure message.
fn show(r: &ExecResult) -> String {
    fn cut(s: &str) -> &str {
        if s.len() <= 6000 {
            s
        } else {
            let mut i = 6000;
            while !s.is_char_boundary(i) {
                i -= 1;
            }
            &s[..i]
        }
    }
    format!(
        "exit_code={:?} signal={:?} timed_out={} duration_ms={} stdout_truncated={} \
         stderr_truncated={}\n--- stdout ({} bytes) ---\n{}\n--- stderr ({} bytes) ---\n{}",
        r.exit_code,
        r.signal,
        r.timed_out,
        r.duration_ms,
        r.stdout_truncated,
        r.stderr_truncated,
        r.stdout.len(),
        cut(&r.stdout),
        r.stderr.len(),
        cut(&r.stderr)
    )
}

/// Parses the last non-empty stdout line as JSON (probe scripts print one JSON object).
fn probe_json(r: &ExecResult) -> Value {
    let line = r
        .stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    serde_json::from_str(line)
        .unwrap_or_else(|e| panic!("probe did not print JSON ({e}):\n{}", show(r)))
}

/// Removes host files on drop.
struct RemoveOnDrop(Vec<PathBuf>);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        for p in &self.0 {
            if p.is_dir() {
                let _ = std::fs::remove_dir_all(p);
            } else {
                let _ = std::fs::remove_file(p);
            }
        }
    }
}

/// A host process started by a test; killed by pid on drop.
struct HostProc(Child);

impl HostProc {
    fn pid(&self) -> i32 {
        self.0.id() as i32
    }
}

impl Drop for HostProc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

// ---------------------------------------------------------------------------------------------
// HTTP/1.1 client (std only, `Connection: close`)
// ---------------------------------------------------------------------------------------------

#[derive(Debug)]
struct Resp {
    status: u16,
    body: Vec<u8>,
}

impl Resp {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    fn ok(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

enum Body<'a> {
    None,
    Json(&'a [u8]),
    Bytes(&'a [u8]),
    /// `n` zero bytes, streamed in 1 MiB pieces.
    Zeros(u64),
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(i) = b.windows(2).position(|w| w == b"\r\n") {
        let line = String::from_utf8_lossy(&b[..i]);
        let size_str = line.split(';').next().unwrap_or("").trim();
        let Ok(size) = usize::from_str_radix(size_str, 16) else {
            break;
        };
        b = &b[i + 2..];
        if size == 0 || b.len() < size {
            out.extend_from_slice(&b[..size.min(b.len())]);
            break;
        }
        out.extend_from_slice(&b[..size]);
        b = &b[size..];
        if b.starts_with(b"\r\n") {
            b = &b[2..];
        }
    }
    out
}

fn http(
    addr: &str,
    method: &str,
    path: &str,
    body: Body<'_>,
    timeout: Duration,
) -> std::io::Result<Resp> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    let (ctype, len) = match &body {
        Body::None => (None, 0u64),
        Body::Json(b) => (Some("application/json"), b.len() as u64),
        Body::Bytes(b) => (Some("application/octet-stream"), b.len() as u64),
        Body::Zeros(n) => (Some("application/octet-stream"), *n),
    };
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if let Some(c) = ctype {
        head.push_str(&format!("Content-Type: {c}\r\n"));
    }
    if ctype.is_some() || method != "GET" {
        head.push_str(&format!("Content-Length: {len}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes())?;
    // A server may answer (e.g. 507) and close before reading a large body: a write error is
    // not the end, the response may still be readable.
    let write_res = match body {
        Body::None => Ok(()),
        Body::Json(b) | Body::Bytes(b) => s.write_all(b),
        Body::Zeros(mut n) => {
            let chunk = vec![0u8; MIB as usize];
            let mut r = Ok(());
            while n > 0 {
                let k = n.min(MIB) as usize;
                if let Err(e) = s.write_all(&chunk[..k]) {
                    r = Err(e);
                    break;
                }
                n -= k as u64;
            }
            r
        }
    };
    let mut raw = Vec::new();
    let read_res = s.read_to_end(&mut raw);
    if raw.is_empty() {
        write_res?;
        read_res?;
        return Err(std::io::Error::other("empty response"));
    }
    let Some(hend) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Err(std::io::Error::other(format!(
            "malformed response: {:?}",
            String::from_utf8_lossy(&raw[..raw.len().min(200)])
        )));
    };
    let head = String::from_utf8_lossy(&raw[..hend]).to_string();
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line: {head}")))?;
    let chunked = head.lines().any(|l| {
        l.to_ascii_lowercase().starts_with("transfer-encoding:")
            && l.to_ascii_lowercase().contains("chunked")
    });
    let rest = &raw[hend + 4..];
    let body = if chunked {
        dechunk(rest)
    } else {
        rest.to_vec()
    };
    Ok(Resp { status, body })
}

// ---------------------------------------------------------------------------------------------
// The daemon
// ---------------------------------------------------------------------------------------------

/// The daemon every test of this binary shares (see `support::shared`); its environment
/// holds [`env_secret`].
type Daemon = support::Shared;

/// A value in the daemon's own environment that must never show up inside a sandbox.
fn env_secret() -> &'static str {
    static SECRET: OnceLock<String> = OnceLock::new();
    SECRET.get_or_init(|| format!("RAMPART-DAEMON-ENV-SECRET-{}", token()))
}

/// The shared daemon, or `None` (after printing why) when the test must be skipped.
fn daemon() -> Option<&'static Daemon> {
    support::shared("adv", &[("RAMPART_ADV_DAEMON_SECRET", env_secret())])
}

impl Daemon {
    fn req(&self, method: &str, path: &str, body: Body<'_>, timeout: Duration) -> Resp {
        http(&self.addr, method, path, body, timeout)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}\n{}", self.log_tail()))
    }

    fn get(&self, path: &str) -> Resp {
        self.req("GET", path, Body::None, Duration::from_secs(60))
    }
}

// ---------------------------------------------------------------------------------------------
// Sandboxes
// ---------------------------------------------------------------------------------------------

/// A sandbox created by a test; deleted (by id) on drop.
struct Sandbox {
    d: &'static Daemon,
    id: String,
    deleted: AtomicBool,
}

impl Sandbox {
    fn create(d: &'static Daemon, limits: LimitsRequest) -> Sandbox {
        let req = CreateSandbox {
            limits,
            timeout_secs: Some(600),
            ..Default::default()
        };
        let body = serde_json::to_vec(&req).expect("serialize CreateSandbox");
        let r = d.req(
            "POST",
            "/v1/sandboxes",
            Body::Json(&body),
            Duration::from_secs(120),
        );
        assert_eq!(
            r.status,
            201,
            "create sandbox with {req:?}: {} {}\n{}",
            r.status,
            r.text(),
            d.log_tail()
        );
        let v: Value = serde_json::from_slice(&r.body)
            .unwrap_or_else(|e| panic!("create: bad JSON {e}: {}", r.text()));
        let id = v["id"]
            .as_str()
            .unwrap_or_else(|| panic!("create: no id in {v}"))
            .to_string();
        Sandbox {
            d,
            id,
            deleted: AtomicBool::new(false),
        }
    }

    fn default(d: &'static Daemon) -> Sandbox {
        Sandbox::create(d, LimitsRequest::default())
    }

    fn exec(&self, req: &ExecRequest) -> ExecResult {
        let body = serde_json::to_vec(req).expect("serialize ExecRequest");
        let t = Duration::from_secs(req.timeout_secs.unwrap_or(60) + 90);
        let r = self.d.req(
            "POST",
            &format!("/v1/sandboxes/{}/exec", self.id),
            Body::Json(&body),
            t,
        );
        assert_eq!(
            r.status,
            200,
            "exec {:?} in {}: {} {}\n{}",
            req.cmd,
            self.id,
            r.status,
            r.text(),
            self.d.log_tail()
        );
        serde_json::from_slice(&r.body)
            .unwrap_or_else(|e| panic!("exec: bad result JSON {e}: {}", r.text()))
    }

    /// Runs `bash -c script` as `user` (`user` or `root`).
    fn sh(&self, user: &str, script: &str, timeout_secs: u64) -> ExecResult {
        self.exec(&ExecRequest {
            cmd: vec!["bash".into(), "-c".into(), script.into()],
            user: Some(user.into()),
            timeout_secs: Some(timeout_secs),
            ..Default::default()
        })
    }

    /// Runs `python3 -c code args...` as `user`.
    fn py(&self, user: &str, code: &str, args: &[String], timeout_secs: u64) -> ExecResult {
        let mut cmd = vec!["python3".to_string(), "-c".into(), code.into()];
        cmd.extend(args.iter().cloned());
        self.exec(&ExecRequest {
            cmd,
            user: Some(user.into()),
            timeout_secs: Some(timeout_secs),
            ..Default::default()
        })
    }

    fn files(&self, method: &str, endpoint: &str, path: &str, body: Body<'_>) -> Resp {
        let url = format!(
            "/v1/sandboxes/{}/files{endpoint}?path={}",
            self.id,
            pct_encode(path)
        );
        self.d.req(method, &url, body, Duration::from_secs(120))
    }

    fn post_json(&self, endpoint: &str, v: &Value) -> Resp {
        let body = serde_json::to_vec(v).expect("json");
        self.d.req(
            "POST",
            &format!("/v1/sandboxes/{}{endpoint}", self.id),
            Body::Json(&body),
            Duration::from_secs(60),
        )
    }

    /// Deletes the sandbox now and returns the response.
    fn delete(&self) -> Resp {
        self.deleted.store(true, Ordering::SeqCst);
        self.d.req(
            "DELETE",
            &format!("/v1/sandboxes/{}", self.id),
            Body::None,
            Duration::from_secs(120),
        )
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        if self.deleted.swap(true, Ordering::SeqCst) {
            return;
        }
        match http(
            &self.d.addr,
            "DELETE",
            &format!("/v1/sandboxes/{}", self.id),
            Body::None,
            Duration::from_secs(120),
        ) {
            Ok(r) if r.ok() || r.status == 404 => {}
            Ok(r) => eprintln!(
                "warning: DELETE sandbox {}: {} {}",
                self.id,
                r.status,
                r.text()
            ),
            Err(e) => eprintln!("warning: DELETE sandbox {}: {e}", self.id),
        }
    }
}

/// The host is fine: the daemon process lives, answers `/health`, and a fresh sandbox runs a
/// command.
fn assert_host_healthy(d: &'static Daemon) {
    assert!(
        process_alive(d.pid),
        "the daemon (pid {}) is gone\n{}",
        d.pid,
        d.log_tail()
    );
    let r = d.get("/health");
    assert_eq!(
        r.status,
        200,
        "/health: {} {}\n{}",
        r.status,
        r.text(),
        d.log_tail()
    );
    let sb = Sandbox::default(d);
    let r = sb.sh("user", "echo healthy", 30);
    assert!(
        r.exit_code == Some(0) && r.stdout == "healthy\n",
        "exec in a fresh sandbox after the attack:\n{}",
        show(&r)
    );
}

// ---------------------------------------------------------------------------------------------
// Host-side views of a sandbox
// ---------------------------------------------------------------------------------------------

/// The cgroup directory of a sandbox for a v1 controller, or the v2 directory.
fn cgroup_dir(controller: &str, id: &str) -> Option<PathBuf> {
    let cands = [
        PathBuf::from(format!("/sys/fs/cgroup/{controller}/rampart/{id}")),
        PathBuf::from(format!("/sys/fs/cgroup/unified/rampart/{id}")),
        PathBuf::from(format!("/sys/fs/cgroup/rampart/{id}")),
    ];
    cands.into_iter().find(|p| p.is_dir())
}

fn read_u64(p: &Path) -> Option<u64> {
    std::fs::read_to_string(p).ok()?.trim().parse().ok()
}

/// CPU time used by the sandbox's cgroup, nanoseconds.
fn cg_cpu_ns(id: &str) -> Option<u64> {
    let d = cgroup_dir("cpuacct", id)?;
    if let Some(v) = read_u64(&d.join("cpuacct.usage")) {
        return Some(v);
    }
    let stat = std::fs::read_to_string(d.join("cpu.stat")).ok()?;
    stat.lines()
        .find_map(|l| {
            l.strip_prefix("usage_usec ")
                .and_then(|v| v.trim().parse::<u64>().ok())
        })
        .map(|us| us * 1000)
}

/// Host pids of the processes whose cmdline contains `marker`.
fn host_pids_with_cmdline(marker: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if let Ok(c) = std::fs::read(format!("/proc/{pid}/cmdline")) {
            if String::from_utf8_lossy(&c)
                .replace('\0', " ")
                .contains(marker)
            {
                out.push(pid);
            }
        }
    }
    out
}

/// Waits until `f` returns `Some`, polling, up to `secs`.
fn wait_for<T>(secs: u64, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

// ---------------------------------------------------------------------------------------------
// Host files
// ---------------------------------------------------------------------------------------------

/// Secret files planted on the host for one test.
struct Secrets {
    /// The content that must never come back.
    content: String,
    /// Their common file name.
    name: String,
    /// In the daemon's temp dir (the parent of its data dir).
    in_tmp: PathBuf,
    /// In /root.
    in_root: PathBuf,
    _cleanup: RemoveOnDrop,
}

fn plant_secrets(d: &Daemon) -> Secrets {
    let content = format!("RAMPART-HOST-SECRET-{}", token());
    let name = format!("rampart-test-secret-{}", token());
    let in_tmp = d.root.join(&name);
    let in_root = PathBuf::from("/root").join(&name);
    std::fs::write(&in_tmp, &content).expect("write secret in temp dir");
    std::fs::write(&in_root, &content).expect("write secret in /root");
    Secrets {
        content,
        name,
        in_tmp: in_tmp.clone(),
        in_root: in_root.clone(),
        _cleanup: RemoveOnDrop(vec![in_tmp, in_root]),
    }
}

impl Secrets {
    fn paths(&self) -> [String; 2] {
        [
            self.in_tmp.display().to_string(),
            self.in_root.display().to_string(),
        ]
    }
    fn assert_intact(&self) {
        for p in [&self.in_tmp, &self.in_root] {
            let now = std::fs::read_to_string(p)
                .unwrap_or_else(|e| panic!("host secret {} is gone: {e}", p.display()));
            assert_eq!(
                now,
                self.content,
                "host secret {} was modified from inside",
                p.display()
            );
        }
    }
}

#[test]
fn sandbox_blocks_host_file_read_by_path() {
    let Some(d) = daemon() else { return };
    let s = plant_secrets(d);
    let sb = Sandbox::default(d);
    let mut script = String::new();
    for p in s.paths() {
        for prefix in [
            "",
            "/proc/1/root",
            "/proc/self/root",
            "/proc/thread-self/root",
            "/../../..",
            "/proc/1/cwd/../../..",
        ] {
            script.push_str(&format!("cat '{prefix}{p}' 2>&1; "));
        }
    }
    // Every process's root and cwd, as seen from inside.
    for p in s.paths() {
        script.push_str(&format!(
            "for r in /proc/[0-9]*/root /proc/[0-9]*/cwd; do cat \"$r{p}\" 2>/dev/null; done; "
        ));
    }
    script.push_str("echo done");
    for user in ["user", "root"] {
        let r = sb.sh(user, &script, 60);
        assert!(
            !r.stdout.contains(&s.content) && !r.stderr.contains(&s.content),
            "reading a host file by path from inside (as {user}) returned the secret:\n{}",
            show(&r)
        );
        assert!(
            r.stdout.contains("done"),
            "the probe did not run to its end:\n{}",
            show(&r)
        );
    }
    // Look for the file by name anywhere in the sandbox (except /proc and /sys).
    let r = sb.sh(
        "root",
        &format!("find / \\( -path /proc -o -path /sys \\) -prune -o -name '{}' -print 2>/dev/null; echo end", s.name),
        120,
    );
    assert_eq!(
        r.stdout.trim(),
        "end",
        "the host secret file is visible inside the sandbox:\n{}",
        show(&r)
    );

    // Writes to paths shared with the template (/usr is the host's /usr, read-only) land in
    // the sandbox's own layer, never on the host.
    let probe = format!("rampart-adv-{}", token());
    let _cleanup = RemoveOnDrop(vec![
        PathBuf::from("/usr").join(&probe),
        PathBuf::from("/usr/bin").join(&probe),
    ]);
    let r = sb.sh(
        "root",
        &format!("touch /usr/{probe} /usr/bin/{probe} 2>&1; echo x >> /usr/bin/env 2>&1; echo end"),
        30,
    );
    assert!(
        !Path::new("/usr").join(&probe).exists() && !Path::new("/usr/bin").join(&probe).exists(),
        "a file created inside under /usr appeared on the host:\n{}",
        show(&r)
    );
    let env_tail = std::fs::read("/usr/bin/env").expect("read host /usr/bin/env");
    assert!(
        !env_tail.ends_with(b"x\n"),
        "appending to /usr/bin/env inside modified the host's file:\n{}",
        show(&r)
    );
    s.assert_intact();
    assert_host_healthy(d);
}

/// Paths that try to reach `secret` (absolute host path `abs`) through `..` sequences.
fn dotdot_variants(abs: &str, name: &str) -> Vec<String> {
    let rel = abs.trim_start_matches('/');
    let mut v = vec![
        abs.to_string(),
        format!("/proc/1/root{abs}"),
        format!("/proc/self/root{abs}"),
    ];
    for n in 1..=12 {
        let up = "../".repeat(n);
        v.push(format!("{up}{rel}"));
        v.push(format!("/{up}{rel}"));
        v.push(format!("/home/user/{up}{rel}"));
        // Relative to wherever the sandbox's root lives under the daemon's data dir, the
        // secret sits next to `data/`.
        v.push(format!("{up}{name}"));
        v.push(format!("/{up}{name}"));
        v.push(format!("/home/user/{up}{name}"));
        v.push(format!("/home/user/{}{}", "..%2f".repeat(n), name));
    }
    v
}

/// Asserts a file API response does not carry the secret; a 200 list must not name it.
fn assert_no_leak(what: &str, r: &Resp, s: &Secrets) {
    assert!(
        !r.text().contains(&s.content),
        "{what} returned the host secret: {} {}",
        r.status,
        r.text()
    );
    if r.status == 200 {
        if let Ok(v) = serde_json::from_slice::<Value>(&r.body) {
            // The host directory holds `daemon.log`, `data/` and the secret; a decoy inside
            // the sandbox may share the secret's name but not its size.
            let leaked: Vec<&Value> = v["entries"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter(|e| {
                            let name = e["name"].as_str().unwrap_or("");
                            let size = e["size"].as_u64().unwrap_or(0);
                            name == "daemon.log"
                                || (name == s.name && size == s.content.len() as u64)
                        })
                        .collect()
                })
                .unwrap_or_default();
            assert!(
                leaked.is_empty(),
                "{what} listed the host directory holding the secret: {}",
                r.text()
            );
        }
    }
}

#[test]
fn sandbox_blocks_file_api_dotdot_and_absolute_symlinks() {
    let Some(d) = daemon() else { return };
    let s = plant_secrets(d);
    let sb = Sandbox::default(d);
    let host_dir = d.root.display().to_string();

    // `..` sequences and host paths straight through the API.
    let mut statuses = BTreeMap::<u16, usize>::new();
    for p in s.paths() {
        for v in dotdot_variants(&p, &s.name) {
            for ep in ["", "/stat"] {
                let r = sb.files("GET", ep, &v, Body::None);
                *statuses.entry(r.status).or_default() += 1;
                assert_no_leak(&format!("GET files{ep}?path={v}"), &r, &s);
            }
        }
    }
    for v in dotdot_variants(&host_dir, "") {
        let r = sb.files("GET", "/list", &v, Body::None);
        assert_no_leak(&format!("GET files/list?path={v}"), &r, &s);
    }
    eprintln!("dotdot requests by status: {statuses:?}");

    // Absolute and relative symlinks made inside, pointing at the host paths.
    let mut script = String::from("set -e; cd /home/user; ");
    script.push_str(&format!(
        "ln -s '{}' abs_tmp; ln -s '{}' abs_root; ln -s '{host_dir}' absdir; ",
        s.paths()[0],
        s.paths()[1]
    ));
    script.push_str(&format!("ln -s '/proc/1/root{}' proc_root; ", s.paths()[0]));
    for n in 1..=10 {
        script.push_str(&format!(
            "ln -s '{}{}' rel{n}; ",
            "../".repeat(n),
            s.paths()[0].trim_start_matches('/')
        ));
        script.push_str(&format!("ln -s '{}' reldir{n}; ", "../".repeat(n)));
    }
    script.push_str("echo 'inside' > mv-src; ls -la");
    let r = sb.sh("user", &script, 30);
    assert_eq!(
        r.exit_code,
        Some(0),
        "making symlinks inside failed:\n{}",
        show(&r)
    );

    let mut links = vec![
        "abs_tmp".to_string(),
        "abs_root".into(),
        "proc_root".into(),
        format!("absdir/{}", s.name),
    ];
    for n in 1..=10 {
        links.push(format!("rel{n}"));
        links.push(format!("reldir{n}/{}", s.name));
        links.push(format!(
            "reldir{n}/{}/{}",
            host_dir.trim_start_matches('/'),
            s.name
        ));
    }
    for l in &links {
        let p = format!("/home/user/{l}");
        for ep in ["", "/stat"] {
            let r = sb.files("GET", ep, &p, Body::None);
            assert_no_leak(&format!("GET files{ep}?path={p}"), &r, &s);
        }
    }
    for p in ["/home/user/absdir".to_string(), "/home/user/reldir3".into()] {
        for depth in ["1", "3"] {
            let url = format!(
                "/v1/sandboxes/{}/files/list?path={}&depth={depth}",
                sb.id,
                pct_encode(&p)
            );
            let r = d.get(&url);
            assert_no_leak(&format!("GET files/list?path={p}&depth={depth}"), &r, &s);
        }
    }

    // Writes, mkdir, move and delete through the symlinks must not touch the host.
    let pw = format!("pwned-{}", token());
    let r = sb.files(
        "PUT",
        "",
        &format!("/home/user/absdir/{pw}"),
        Body::Bytes(b"pwned"),
    );
    assert!(
        !d.root.join(&pw).exists(),
        "PUT through an absolute dir symlink created a host file: {} {}",
        r.status,
        r.text()
    );
    let r = sb.files("PUT", "", "/home/user/abs_tmp", Body::Bytes(b"overwritten"));
    s.assert_intact();
    eprintln!(
        "PUT through a file symlink to a host path: {} {}",
        r.status,
        r.text()
    );
    for n in 1..=10 {
        let _ = sb.files(
            "PUT",
            "",
            &format!(
                "/home/user/reldir{n}/{}/{pw}",
                host_dir.trim_start_matches('/')
            ),
            Body::Bytes(b"pwned"),
        );
        let _ = sb.files(
            "PUT",
            "",
            &format!(
                "/home/user/{}{}/{pw}",
                "../".repeat(n),
                host_dir.trim_start_matches('/')
            ),
            Body::Bytes(b"pwned"),
        );
    }
    assert!(
        !d.root.join(&pw).exists(),
        "PUT through a relative symlink or `..` created a host file"
    );
    let pd = format!("pwndir-{}", token());
    let r = sb.post_json(
        "/files/mkdir",
        &serde_json::json!({"path": format!("/home/user/absdir/{pd}")}),
    );
    assert!(
        !d.root.join(&pd).exists(),
        "mkdir through a dir symlink created a host directory: {} {}",
        r.status,
        r.text()
    );
    let mv = format!("moved-{}", token());
    let r = sb.post_json(
        "/files/move",
        &serde_json::json!({"from": "/home/user/mv-src", "to": format!("/home/user/absdir/{mv}")}),
    );
    assert!(
        !d.root.join(&mv).exists(),
        "move through a dir symlink put a file on the host: {} {}",
        r.status,
        r.text()
    );
    let r = sb.post_json("/files/move", &serde_json::json!({"from": format!("/home/user/absdir/{}", s.name), "to": "/home/user/stolen"}));
    s.assert_intact();
    let got = sb.files("GET", "", "/home/user/stolen", Body::None);
    assert_no_leak("GET of a file moved in from a host path", &got, &s);
    eprintln!("move from a host path: {} {}", r.status, r.text());
    for p in [
        format!("/home/user/absdir/{}", s.name),
        "/home/user/abs_tmp".into(),
        s.paths()[0].clone(),
        format!("../../../../../../{}", s.name),
    ] {
        let _ = sb.files("DELETE", "", &p, Body::None);
    }
    s.assert_intact();
    assert_host_healthy(d);
}

const SWAPPER: &str = r#"
import ctypes, os, sys, time
host_dir, host_file, name = sys.argv[1], sys.argv[2], sys.argv[3]
libc = ctypes.CDLL(None, use_errno=True)
os.chdir('/home/user')
os.makedirs('d_real', exist_ok=True)
open('d_real/' + name, 'w').write('decoy\n')
open('f_real', 'w').write('decoy\n')
os.symlink(host_dir, 'race')
os.symlink(host_file, 'racefile')
def xchg(a, b):
    if libc.renameat2(-100, a, -100, b, 2) != 0:
        e = ctypes.get_errno()
        raise OSError(e, 'renameat2 RENAME_EXCHANGE: ' + os.strerror(e))
n = 0
open('started', 'w').write('1')
end = time.time() + 60
while not os.path.exists('stop') and time.time() < end:
    for _ in range(200):
        xchg(b'race', b'd_real')
        xchg(b'racefile', b'f_real')
        n += 1
print('swaps', n)
"#;

#[test]
fn sandbox_blocks_file_api_symlink_race() {
    let Some(d) = daemon() else { return };
    let s = plant_secrets(d);
    let sb = Sandbox::default(d);
    let host_dir = d.root.display().to_string();
    let pw = format!("pwned-{}", token());
    let (swapper, counts) = std::thread::scope(|scope| {
        let args = vec![host_dir.clone(), s.paths()[0].clone(), s.name.clone()];
        let sbr = &sb;
        let h = scope.spawn(move || sbr.py("user", SWAPPER, &args, 90));
        let started = wait_for(60, || {
            (sb.files("GET", "", "/home/user/started", Body::None).status == 200).then_some(())
        });
        let mut counts = BTreeMap::<String, usize>::new();
        if started.is_some() {
            let t0 = Instant::now();
            let mut i = 0usize;
            while i < 3000 && t0.elapsed() < Duration::from_secs(8) {
                for p in [
                    format!("/home/user/race/{}", s.name),
                    "/home/user/racefile".into(),
                ] {
                    let r = sb.files("GET", "", &p, Body::None);
                    assert_no_leak(
                        &format!("GET files?path={p} during a symlink swap race"),
                        &r,
                        &s,
                    );
                    let kind = if r.status == 200 && r.text() == "decoy\n" {
                        "decoy".to_string()
                    } else {
                        r.status.to_string()
                    };
                    *counts.entry(kind).or_default() += 1;
                }
                if i.is_multiple_of(10) {
                    let r = sb.files("GET", "/list", "/home/user/race", Body::None);
                    assert_no_leak(
                        "GET files/list?path=/home/user/race during the race",
                        &r,
                        &s,
                    );
                    let _ = sb.files(
                        "PUT",
                        "",
                        &format!("/home/user/race/{pw}"),
                        Body::Bytes(b"pwned"),
                    );
                    assert!(
                        !d.root.join(&pw).exists(),
                        "PUT during a symlink swap race created a host file"
                    );
                }
                i += 1;
            }
        }
        let _ = sb.files("PUT", "", "/home/user/stop", Body::Bytes(b"1"));
        let res = h.join().expect("swapper thread");
        assert!(
            started.is_some(),
            "the in-sandbox swapper never started:\n{}",
            show(&res)
        );
        (res, counts)
    });
    assert!(
        swapper.exit_code == Some(0) && swapper.stdout.contains("swaps "),
        "the in-sandbox swapper failed:\n{}",
        show(&swapper)
    );
    eprintln!(
        "symlink race: swapper {}; API reads by outcome {counts:?}",
        swapper.stdout.trim()
    );
    s.assert_intact();
    assert!(
        !d.root.join(&pw).exists(),
        "a PUT during the race created a host file"
    );
    assert_host_healthy(d);
}

// ---------------------------------------------------------------------------------------------
// /proc, ptrace, kill
// ---------------------------------------------------------------------------------------------

const PROC_PROBE: &str = r#"
import errno, json, os, sys
secrets = [a[::-1].encode() for a in sys.argv[1:3]]
hp = int(sys.argv[3])
pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())
hits, cmdlines = [], {}
for p in pids:
    for f in ('environ', 'cmdline'):
        try:
            data = open('/proc/%d/%s' % (p, f), 'rb').read()
        except OSError:
            continue
        if f == 'cmdline':
            cmdlines[p] = data.replace(b'\0', b' ').decode(errors='replace')
        for s in secrets:
            if s in data:
                hits.append('%d/%s' % (p, f))
def err(fn):
    try:
        fn()
        return 'ok'
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
kill0 = err(lambda: os.kill(hp, 0))
def kcore():
    with open('/proc/kcore', 'rb') as f:
        if f.read(16):
            return
    raise OSError(errno.ENODATA, 'empty')
def sysrq():
    with open('/proc/sysrq-trigger', 'w') as f:
        f.write('h')
def agent_environ():
    with open('/proc/1/environ', 'rb') as f:
        f.read()
def keys():
    with open('/proc/keys') as f:
        if f.read():
            return
    raise OSError(errno.ENODATA, 'empty')
try:
    proc1_root = os.readlink('/proc/1/root')
except OSError as e:
    proc1_root = errno.errorcode.get(e.errno, str(e.errno))
try:
    proc1_root_is_root = sorted(os.listdir('/proc/1/root')) == sorted(os.listdir('/'))
except OSError as e:
    proc1_root_is_root = errno.errorcode.get(e.errno, str(e.errno))
print(json.dumps({
    'pids': pids, 'hits': hits, 'cmdlines': cmdlines, 'kill0': kill0,
    'proc1_root': proc1_root, 'proc1_root_is_root': proc1_root_is_root,
    'env_has_secret': any(s.decode() in ''.join(os.environ.values()) for s in secrets),
    'kcore': err(kcore), 'sysrq': err(sysrq), 'keys': err(keys),
    'agent_environ': err(agent_environ),
}))
"#;

#[test]
fn sandbox_blocks_proc_view_of_host_processes() {
    let Some(d) = daemon() else { return };
    let secret = format!("RAMPART-HOST-PROC-ENV-{}", token());
    let marker = format!("600.{}", digits());
    let host = HostProc(
        Command::new("sleep")
            .arg(&marker)
            .env("RAMPART_ADV_PROC_SECRET", &secret)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn host sleep"),
    );
    let hp = host.pid();
    let sb = Sandbox::default(d);
    for user in ["user", "root"] {
        let r = sb.py(
            user,
            PROC_PROBE,
            // Reversed, so that the probe's own argv does not hold the secrets.
            &[
                secret.chars().rev().collect(),
                env_secret().chars().rev().collect(),
                hp.to_string(),
            ],
            60,
        );
        assert_eq!(
            r.exit_code,
            Some(0),
            "the /proc probe failed as {user}:\n{}",
            show(&r)
        );
        let v = probe_json(&r);
        assert!(
            !r.stdout.contains(&secret) && !r.stdout.contains(env_secret()),
            "a host process's environment is readable inside (as {user}):\n{}",
            show(&r)
        );
        assert_eq!(
            v["hits"],
            serde_json::json!([]),
            "host secrets found in /proc/*/environ|cmdline inside as {user}:\n{}",
            show(&r)
        );
        assert_eq!(
            v["env_has_secret"],
            false,
            "the daemon's environment leaked into the sandbox (as {user}):\n{}",
            show(&r)
        );
        let pids: Vec<i64> = v["pids"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_i64).collect())
            .unwrap_or_default();
        assert!(
            pids.contains(&1),
            "no PID 1 in the sandbox's /proc: {pids:?}"
        );
        assert!(
            pids.len() < 40,
            "the sandbox sees {} processes; only its own should be visible: {pids:?}",
            pids.len()
        );
        let cmds = v["cmdlines"].to_string();
        assert!(
            !cmds.contains(&marker),
            "the host process `sleep {marker}` is visible inside (as {user}): {cmds}"
        );
        if !pids.contains(&(hp as i64)) {
            assert_eq!(
                v["kill0"], "ESRCH",
                "kill(host pid {hp}, 0) from inside as {user}: {}",
                v["kill0"]
            );
        }
        // The agent (PID 1) is non-dumpable by design, so /proc/1/root may be refused
        // (EACCES) to anyone inside; where it resolves, it must be the sandbox's own root.
        let p1 = v["proc1_root"].as_str().unwrap_or("");
        let p1_ok = p1 == "/" || p1.starts_with('E');
        assert!(
            p1_ok,
            "/proc/1/root inside is {p1:?}, not the sandbox root:\n{}",
            show(&r)
        );
        let same = &v["proc1_root_is_root"];
        let same_ok = *same == true || same.is_string();
        assert!(
            same_ok,
            "/proc/1/root lists differently from / ({same}):\n{}",
            show(&r)
        );
        assert_ne!(
            v["agent_environ"], "ok",
            "the agent's /proc/1/environ is readable inside as {user}"
        );
        assert_ne!(v["kcore"], "ok", "/proc/kcore is readable inside as {user}");
        assert_ne!(
            v["sysrq"], "ok",
            "/proc/sysrq-trigger is writable inside as {user}"
        );
        assert_ne!(v["keys"], "ok", "/proc/keys shows keys inside as {user}");
        eprintln!(
            "as {user}: pids {pids:?}, kill0 {}, kcore {}, sysrq {}, keys {}",
            v["kill0"], v["kcore"], v["sysrq"], v["keys"]
        );
    }
    assert!(process_alive(hp), "the host process {hp} died");
    assert_host_healthy(d);
}

const PTRACE_PROBE: &str = r#"
import ctypes, errno, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.restype = ctypes.c_long
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
hp = int(sys.argv[1])
out = {}
for name, req in (('attach', 16), ('seize', 0x4206)):
    r = libc.ptrace(req, hp, None, None)
    e = ctypes.get_errno()
    out[name] = [r, errno.errorcode.get(e, str(e)) if r != 0 else 'ok']
try:
    os.kill(hp, 9)
    out['kill'] = 'ok'
except OSError as ex:
    out['kill'] = errno.errorcode.get(ex.errno, str(ex.errno))
print(json.dumps(out))
"#;

#[test]
fn sandbox_blocks_ptrace_of_host_process() {
    let Some(d) = daemon() else { return };
    let host = HostProc(
        Command::new("sleep")
            .arg(format!("600.{}", digits()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn host sleep"),
    );
    let hp = host.pid();
    let sb = Sandbox::default(d);
    // As the default user, as root (the exec's user), and via sudo.
    let runs = [
        ("user", sb.py("user", PTRACE_PROBE, &[hp.to_string()], 30)),
        ("root", sb.py("root", PTRACE_PROBE, &[hp.to_string()], 30)),
        ("sudo", {
            let code = PTRACE_PROBE.replace('\'', "'\\''");
            sb.sh("user", &format!("sudo python3 -c '{code}' {hp}"), 30)
        }),
    ];
    for (who, r) in &runs {
        assert_eq!(
            r.exit_code,
            Some(0),
            "the ptrace probe failed ({who}):\n{}",
            show(r)
        );
        let v = probe_json(r);
        for k in ["attach", "seize"] {
            assert_eq!(
                v[k][0],
                -1,
                "ptrace {k} of host pid {hp} succeeded ({who}):\n{}",
                show(r)
            );
            let e = v[k][1].as_str().unwrap_or("");
            assert!(e == "ESRCH" || e == "EPERM", "ptrace {k} of host pid {hp} ({who}) failed with {e}, expected ESRCH (pid not visible) or EPERM");
        }
        assert_ne!(
            v["kill"], "ok",
            "kill -9 of host pid {hp} from inside ({who}) succeeded"
        );
        eprintln!("{who}: {v}");
    }
    assert!(
        process_alive(hp),
        "the host process {hp} was killed from inside"
    );
    assert_eq!(
        status_field(hp, "TracerPid").as_deref(),
        Some("0"),
        "the host process {hp} is being traced"
    );
    assert_host_healthy(d);
}

// ---------------------------------------------------------------------------------------------
// mount, namespaces, modules, raw sockets
// ---------------------------------------------------------------------------------------------

#[test]
fn sandbox_blocks_mount() {
    let Some(d) = daemon() else { return };
    let sb = Sandbox::default(d);
    let script = r#"
sudo mount -t tmpfs x /mnt 2>&1; echo "mount_tmpfs=$?"
sudo mount --bind /home /mnt 2>&1; echo "mount_bind=$?"
sudo mount -t proc proc /mnt 2>&1; echo "mount_proc=$?"
sudo mount -o remount,rw /usr 2>&1; echo "remount_usr=$?"
sudo umount -l /proc 2>&1; echo "umount_proc=$?"
sudo python3 -c '
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
r = libc.mount(b"x", b"/mnt", b"tmpfs", 0, None)
print("ctypes_mount=%d %s" % (r, errno.errorcode.get(ctypes.get_errno(), "")))
' 2>&1
echo "mnt_mounts=$(awk '$5 == "/mnt"' /proc/self/mountinfo | wc -l)"
"#;
    for user in ["user", "root"] {
        let r = sb.sh(user, script, 60);
        let out = &r.stdout;
        for k in [
            "mount_tmpfs",
            "mount_bind",
            "mount_proc",
            "remount_usr",
            "umount_proc",
        ] {
            let line = out
                .lines()
                .find(|l| l.starts_with(&format!("{k}=")))
                .unwrap_or_else(|| panic!("no {k} in output:\n{}", show(&r)));
            assert_ne!(
                line,
                format!("{k}=0"),
                "`{k}` succeeded inside (exec user {user}):\n{}",
                show(&r)
            );
        }
        assert!(
            out.contains("ctypes_mount=-1"),
            "mount(2) did not fail (exec user {user}):\n{}",
            show(&r)
        );
        assert!(
            out.contains("mnt_mounts=0"),
            "something got mounted on /mnt (exec user {user}):\n{}",
            show(&r)
        );
        eprintln!("mount attempts as {user}:\n{}", r.stdout);
    }
    assert_host_healthy(d);
}

#[test]
fn sandbox_blocks_new_user_namespace() {
    let Some(d) = daemon() else { return };
    let sb = Sandbox::default(d);
    let script = r#"
unshare -U true 2>&1; echo "unshare_U=$?"
unshare -Ur true 2>&1; echo "unshare_Ur=$?"
sudo unshare -U true 2>&1; echo "sudo_unshare_U=$?"
sudo unshare -m true 2>&1; echo "sudo_unshare_m=$?"
sudo unshare -n true 2>&1; echo "sudo_unshare_n=$?"
sudo unshare -p -f true 2>&1; echo "sudo_unshare_p=$?"
python3 -c '
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
r = libc.unshare(0x10000000)
print("ctypes_unshare_user=%d %s" % (r, errno.errorcode.get(ctypes.get_errno(), "")))
' 2>&1
"#;
    let r = sb.sh("user", script, 60);
    for k in [
        "unshare_U",
        "unshare_Ur",
        "sudo_unshare_U",
        "sudo_unshare_m",
        "sudo_unshare_n",
        "sudo_unshare_p",
    ] {
        let line = r
            .stdout
            .lines()
            .find(|l| l.starts_with(&format!("{k}=")))
            .unwrap_or_else(|| panic!("no {k} in output:\n{}", show(&r)));
        assert_ne!(
            line,
            format!("{k}=0"),
            "`{k}` succeeded inside:\n{}",
            show(&r)
        );
    }
    assert!(
        r.stdout.contains("ctypes_unshare_user=-1"),
        "unshare(CLONE_NEWUSER) did not fail:\n{}",
        show(&r)
    );
    eprintln!("namespace attempts:\n{}", r.stdout);
    assert_host_healthy(d);
}

const MODULE_PROBE: &str = r#"
import ctypes, errno, json, os, platform
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
nrs = {'x86_64': (175, 313, 176), 'aarch64': (105, 273, 106)}[platform.machine()]
def call(*a):
    r = libc.syscall(*a)
    e = ctypes.get_errno()
    return [r, errno.errorcode.get(e, str(e)) if r != 0 else 'ok']
img = b'\x7fELF' + b'\0' * 60
buf = ctypes.create_string_buffer(img, len(img))
fd = os.open('/dev/null', os.O_RDONLY)
print(json.dumps({
    'init_module': call(ctypes.c_long(nrs[0]), buf, ctypes.c_ulong(len(img)), ctypes.c_char_p(b'')),
    'finit_module': call(ctypes.c_long(nrs[1]), ctypes.c_int(fd), ctypes.c_char_p(b''), ctypes.c_int(0)),
    'delete_module': call(ctypes.c_long(nrs[2]), ctypes.c_char_p(b'rampart_no_such_module'), ctypes.c_uint(0o4000)),
}))
"#;

#[test]
fn sandbox_blocks_module_load() {
    let Some(d) = daemon() else { return };
    let sb = Sandbox::default(d);
    let code = MODULE_PROBE.replace('\'', "'\\''");
    let runs = [
        ("root", sb.py("root", MODULE_PROBE, &[], 30)),
        (
            "sudo",
            sb.sh("user", &format!("sudo python3 -c '{code}'"), 30),
        ),
    ];
    for (who, r) in &runs {
        if r.signal == Some(31) || r.exit_code == Some(128 + 31) {
            eprintln!("{who}: the module probe was killed by SIGSYS (seccomp kill): contained");
            continue;
        }
        assert_eq!(
            r.exit_code,
            Some(0),
            "the module probe failed ({who}):\n{}",
            show(r)
        );
        let v = probe_json(r);
        for k in ["init_module", "finit_module", "delete_module"] {
            assert_eq!(v[k][0], -1, "{k} succeeded inside ({who}):\n{}", show(r));
            let e = v[k][1].as_str().unwrap_or("");
            assert!(
                e == "EPERM" || e == "ENOSYS",
                "{k} inside ({who}) failed with {e}: the kernel looked at the request, so the caller had the privilege \
                 (expected EPERM from the missing capability or the seccomp deny list)\n{}",
                show(r)
            );
        }
        eprintln!("{who}: {v}");
    }
    let r = sb.sh(
        "user",
        "sudo modprobe -q dummy 2>&1; echo \"modprobe=$?\"",
        30,
    );
    assert!(
        !r.stdout.contains("modprobe=0\n"),
        "modprobe succeeded inside:\n{}",
        show(&r)
    );
    assert_host_healthy(d);
}

const RAW_SOCKET_PROBE: &str = r#"
import errno, json, socket
out = {}
for name, args in (
    ('inet_raw_icmp', (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)),
    ('inet_raw_raw', (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)),
    ('inet6_raw_icmp', (socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)),
    ('packet_raw', (socket.AF_PACKET, socket.SOCK_RAW, 0x0300)),
    ('packet_dgram', (socket.AF_PACKET, socket.SOCK_DGRAM, 0x0300)),
):
    try:
        socket.socket(*args).close()
        out[name] = 'created'
    except OSError as e:
        out[name] = errno.errorcode.get(e.errno, str(e.errno))
print(json.dumps(out))
"#;

#[test]
fn sandbox_blocks_raw_sockets() {
    let Some(d) = daemon() else { return };
    let sb = Sandbox::default(d);
    let code = RAW_SOCKET_PROBE.replace('\'', "'\\''");
    let runs = [
        ("user", sb.py("user", RAW_SOCKET_PROBE, &[], 30)),
        ("root", sb.py("root", RAW_SOCKET_PROBE, &[], 30)),
        (
            "sudo",
            sb.sh("user", &format!("sudo python3 -c '{code}'"), 30),
        ),
    ];
    for (who, r) in &runs {
        assert_eq!(
            r.exit_code,
            Some(0),
            "the raw socket probe failed ({who}):\n{}",
            show(r)
        );
        let v = probe_json(r);
        for (k, res) in v.as_object().into_iter().flatten() {
            assert_ne!(
                res,
                "created",
                "a {k} socket was created inside ({who}):\n{}",
                show(r)
            );
        }
        assert_eq!(
            v["inet_raw_icmp"],
            "EPERM",
            "SOCK_RAW/ICMP inside ({who}):\n{}",
            show(r)
        );
        eprintln!("{who}: {v}");
    }
    assert_host_healthy(d);
}

// ---------------------------------------------------------------------------------------------
// Network: host ports
// ---------------------------------------------------------------------------------------------

/// A listener on the host that counts connections.
struct HostListener {
    addr: std::net::SocketAddr,
    hits: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HostListener {
    fn bind(ip: &str) -> std::io::Result<HostListener> {
        let l = TcpListener::bind(format!("{ip}:0"))?;
        l.set_nonblocking(true)?;
        let addr = l.local_addr()?;
        let hits = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (h, s) = (hits.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                match l.accept() {
                    Ok((mut c, _)) => {
                        h.fetch_add(1, Ordering::SeqCst);
                        let _ = c.write_all(b"HOST-LISTENER-REACHED\n");
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        Ok(HostListener {
            addr,
            hits,
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for HostListener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The host's first global IPv4 address, if any.
fn host_global_ipv4() -> Option<String> {
    let out = Command::new("ip")
        .args(["-4", "-o", "addr", "show", "scope", "global"])
        .output()
        .ok()?;
    let s = String::from_utf8_lossy(&out.stdout).to_string();
    s.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        it.position(|w| w == "inet")?;
        it.next()?.split('/').next().map(String::from)
    })
}

const CONNECT_PROBE: &str = r#"
import errno, json, socket, sys
out = {}
for t in sys.argv[1:]:
    host, port = t.rsplit(':', 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect((host, int(port)))
        out[t] = 'connected'
    except socket.timeout:
        out[t] = 'timeout'
    except OSError as e:
        out[t] = errno.errorcode.get(e.errno, str(e.errno))
    finally:
        s.close()
print(json.dumps(out))
"#;

#[test]
fn sandbox_blocks_reaching_host_ports() {
    let Some(d) = daemon() else { return };
    let mut listeners = vec![HostListener::bind("127.0.0.1").expect("bind 127.0.0.1")];
    match host_global_ipv4() {
        Some(ip) => {
            listeners.push(HostListener::bind(&ip).unwrap_or_else(|e| panic!("bind {ip}: {e}")))
        }
        None => eprintln!("note: the host has no global IPv4 address; only loopback is tried"),
    }
    let mut targets: Vec<String> = listeners.iter().map(|l| l.addr.to_string()).collect();
    targets.push(format!("127.0.0.1:{}", d.port)); // the daemon's own API
    if let Some(ip) = host_global_ipv4() {
        targets.push(format!("{ip}:{}", d.port));
    }
    targets.push("169.254.169.254:80".into()); // cloud metadata
    let sb = Sandbox::default(d);
    for user in ["user", "root"] {
        let r = sb.py(user, CONNECT_PROBE, &targets, 60);
        assert_eq!(
            r.exit_code,
            Some(0),
            "the connect probe failed ({user}):\n{}",
            show(&r)
        );
        let v = probe_json(&r);
        for t in &targets {
            assert!(v[t].is_string(), "no result for {t}:\n{}", show(&r));
            assert_ne!(
                v[t],
                "connected",
                "connected from inside to host {t} ({user}):\n{}",
                show(&r)
            );
        }
        eprintln!("{user}: {v}");
    }
    let r = sb.sh(
        "user",
        &format!(
            "curl -sS -m 3 http://127.0.0.1:{}/health 2>&1; echo \"curl=$?\"",
            d.port
        ),
        30,
    );
    assert!(
        !r.stdout.contains("curl=0"),
        "curl reached the daemon's API from inside:\n{}",
        show(&r)
    );
    for l in &listeners {
        assert_eq!(
            l.hits.load(Ordering::SeqCst),
            0,
            "the host listener on {} accepted a connection from the sandbox",
            l.addr
        );
    }
    assert_host_healthy(d);
}

// ---------------------------------------------------------------------------------------------
// Resource exhaustion
// ---------------------------------------------------------------------------------------------

#[test]
fn sandbox_blocks_fork_bomb() {
    let Some(d) = daemon() else { return };
    let limit = 64u64;
    let sb = Sandbox::create(
        d,
        LimitsRequest {
            pids: Some(limit),
            cpus: Some(0.5),
            ..Default::default()
        },
    );
    let cg = cgroup_dir("pids", &sb.id);
    if cg.is_none() {
        eprintln!("note: no pids cgroup found for {} (looked under /sys/fs/cgroup/pids/rampart and the v2 tree); the host-side count is skipped", sb.id);
    }
    // Detached from the exec's stdout so the exec returns while the bomb runs.
    let r = sb.sh(
        "user",
        "bomb() { bomb | bomb & }; bomb >/dev/null 2>&1 </dev/null & echo started",
        30,
    );
    eprintln!("fork bomb exec: {}", show(&r));
    let mut max_seen = 0u64;
    let mut hit_limit = false;
    if let Some(cg) = &cg {
        // Watch until the limit has been hit (pids.events counts refused forks), with a deadline.
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            max_seen = max_seen.max(read_u64(&cg.join("pids.current")).unwrap_or(0));
            let events = std::fs::read_to_string(cg.join("pids.events")).unwrap_or_default();
            let refused: u64 = events
                .split_whitespace()
                .nth(1)
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            if refused > 0 {
                hit_limit = true;
                // A few more samples while the bomb pushes against the limit.
                for _ in 0..20 {
                    max_seen = max_seen.max(read_u64(&cg.join("pids.current")).unwrap_or(0));
                    std::thread::sleep(Duration::from_millis(10));
                }
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        eprintln!(
            "fork bomb: max pids.current seen {max_seen} (limit {limit}), limit hit: {hit_limit}"
        );
        assert!(
            max_seen <= limit,
            "the sandbox ran {max_seen} processes, above its pids limit {limit}"
        );
        assert!(
            hit_limit,
            "the fork bomb never hit the pids limit in 20 s (max seen {max_seen}); did it run?\n{}",
            show(&r)
        );
    }
    // While the bomb is still going: the host and other sandboxes are fine.
    assert_host_healthy(d);
    let del = sb.delete();
    assert!(
        del.ok(),
        "destroying the fork-bombed sandbox failed: {} {}\n{}",
        del.status,
        del.text(),
        d.log_tail()
    );
    if let Some(cg) = &cg {
        let gone = wait_for(30, || (!cg.exists()).then_some(()));
        assert!(
            gone.is_some(),
            "the cgroup {} still exists after destroy",
            cg.display()
        );
    }
    assert_host_healthy(d);
}

#[test]
fn sandbox_blocks_memory_bomb() {
    let Some(d) = daemon() else { return };
    let sb = Sandbox::create(
        d,
        LimitsRequest {
            memory_bytes: Some(64 * MIB),
            ..Default::default()
        },
    );
    let r = sb.exec(&ExecRequest {
        cmd: vec![
            "python3".into(),
            "-c".into(),
            "b = b'x' * (512 << 20); print('allocated', len(b))".into(),
        ],
        timeout_secs: Some(120),
        ..Default::default()
    });
    assert!(
        !r.stdout.contains("allocated"),
        "512 MiB was allocated under a 64 MiB limit:\n{}",
        show(&r)
    );
    assert!(
        !r.timed_out,
        "the memory bomb was not stopped before the exec timeout (swapping?):\n{}",
        show(&r)
    );
    assert!(
        r.signal == Some(9) || r.exit_code == Some(137),
        "the memory bomb was not OOM-killed (signal 9 / exit 137):\n{}",
        show(&r)
    );
    if let Some(cg) = cgroup_dir("memory", &sb.id) {
        let peak = read_u64(&cg.join("memory.max_usage_in_bytes"))
            .or_else(|| read_u64(&cg.join("memory.peak")));
        let oom = std::fs::read_to_string(cg.join("memory.oom_control"))
            .or_else(|_| std::fs::read_to_string(cg.join("memory.events")));
        eprintln!(
            "memory bomb: cgroup peak {peak:?}; {}",
            oom.unwrap_or_default().replace('\n', ", ")
        );
        if let Some(p) = peak {
            assert!(
                p <= 64 * MIB + MIB,
                "the sandbox's memory peaked at {p} bytes, above its 64 MiB limit"
            );
        }
    }
    let after = sb.sh("user", "echo alive", 30);
    eprintln!("the same sandbox after the OOM kill: {}", show(&after));
    assert_host_healthy(d);
}

#[test]
fn sandbox_blocks_disk_fill() {
    let Some(d) = daemon() else { return };
    let quota = 64 * MIB;
    let sb = Sandbox::create(
        d,
        LimitsRequest {
            disk_bytes: Some(quota),
            ..Default::default()
        },
    );
    let free_before = free_bytes(&d.data_dir);
    let alloc_before = allocated_bytes(&d.data_dir);
    let r = sb.sh("user", "dd if=/dev/zero of=/home/user/fill bs=1M count=200 2>&1; echo \"dd=$?\"; sync; stat -c 'size=%s' /home/user/fill", 120);
    let free_after = free_bytes(&d.data_dir);
    let alloc_after = allocated_bytes(&d.data_dir);
    assert!(
        !r.stdout.contains("dd=0"),
        "dd of 200 MiB succeeded under a 64 MiB disk:\n{}",
        show(&r)
    );
    assert!(
        r.stdout.contains("No space left on device"),
        "dd did not fail with ENOSPC:\n{}",
        show(&r)
    );
    let size: u64 = r
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("size=").and_then(|n| n.trim().parse().ok()))
        .unwrap_or_else(|| panic!("no size line:\n{}", show(&r)));
    assert!(
        size <= quota,
        "the file inside grew to {size} bytes, past the {quota} byte disk"
    );
    let freed = free_before.saturating_sub(free_after);
    let grown = alloc_after.saturating_sub(alloc_before);
    eprintln!(
        "disk fill: file inside {} MiB; host free {} -> {} MiB (-{} MiB); data dir allocation +{} MiB",
        size / MIB,
        free_before / MIB,
        free_after / MIB,
        freed / MIB,
        grown / MIB
    );
    assert!(
        grown <= quota + 48 * MIB,
        "the daemon's data dir grew by {grown} bytes for a {quota} byte disk"
    );
    // Other work shares this disk (builds, other tests): allow the quota plus a margin.
    assert!(
        freed <= quota + 128 * MIB,
        "the host lost {freed} bytes of free disk for a {quota} byte sandbox disk"
    );

    // The file API cannot write past the quota either.
    let put = sb.files("PUT", "", "/home/user/fill2", Body::Zeros(100 * MIB));
    assert!(
        !put.ok(),
        "a 100 MiB PUT succeeded on a full 64 MiB disk: {} {}",
        put.status,
        put.text()
    );
    eprintln!("PUT on a full disk: {} {}", put.status, put.text());
    // The sandbox recovers once the file is gone.
    let r = sb.sh("user", "rm -f /home/user/fill /home/user/fill2 && echo ok > /home/user/after && cat /home/user/after", 60);
    assert_eq!(
        r.stdout,
        "ok\n",
        "the sandbox did not recover after removing the fill:\n{}",
        show(&r)
    );
    assert_host_healthy(d);
}

#[test]
fn sandbox_blocks_tmpfs_fill() {
    let Some(d) = daemon() else { return };
    let sb = Sandbox::create(
        d,
        LimitsRequest {
            memory_bytes: Some(128 * MIB),
            ..Default::default()
        },
    );
    // Every writable memory-backed mount inside (tmpfs, ramfs), as root.
    let script = r#"
awk '($3 == "tmpfs" || $3 == "ramfs") && $4 ~ /(^|,)rw(,|$)/ {print $2}' /proc/self/mounts | sort -u > /tmp/memfs
echo "memfs: $(tr '\n' ' ' < /tmp/memfs)"
while read -r m; do
  case "$m" in /proc*|/sys*) continue;; esac
  [ -d "$m" ] || continue
  dd if=/dev/zero of="$m/rampart-fill" bs=1M count=400 2>&1 | tail -1
  echo "fill $m=${PIPESTATUS[0]}"
  rm -f "$m/rampart-fill"
done < /tmp/memfs
echo end
"#;
    let r = sb.sh("root", script, 120);
    eprintln!("tmpfs fill:\n{}", show(&r));
    assert!(
        r.stdout.contains("end") || r.signal.is_some(),
        "the tmpfs probe did not finish:\n{}",
        show(&r)
    );
    let filled: Vec<&str> = r
        .stdout
        .lines()
        .filter(|l| l.starts_with("fill ") && l.ends_with("=0"))
        .collect();
    assert!(
        filled.is_empty(),
        "400 MiB was written to memory-backed mounts {filled:?} under a 128 MiB memory limit:\n{}",
        show(&r)
    );
    assert_host_healthy(d);
}

#[test]
fn sandbox_blocks_output_flood() {
    let Some(d) = daemon() else { return };
    let sb = Sandbox::default(d);
    let cap = MIB;
    let rss_before = rss_bytes(d.pid, "VmRSS");
    let r = sb.exec(&ExecRequest {
        cmd: vec![
            "bash".into(),
            "-c".into(),
            "yes | head -c 200M; yes e | head -c 200M >&2; echo done >&2".into(),
        ],
        timeout_secs: Some(120),
        max_output_bytes: Some(cap),
        ..Default::default()
    });
    let rss_after = rss_bytes(d.pid, "VmRSS");
    eprintln!(
        "output flood: stdout {} bytes (truncated {}), stderr {} bytes (truncated {}), {} ms, exit {:?}; daemon VmRSS {} -> {} MiB, VmHWM {} MiB",
        r.stdout.len(),
        r.stdout_truncated,
        r.stderr.len(),
        r.stderr_truncated,
        r.duration_ms,
        r.exit_code,
        rss_before / MIB,
        rss_after / MIB,
        rss_bytes(d.pid, "VmHWM") / MIB
    );
    assert!(
        r.stdout.len() as u64 <= cap,
        "stdout of {} bytes exceeds the {cap} byte cap",
        r.stdout.len()
    );
    assert!(
        r.stderr.len() as u64 <= cap,
        "stderr of {} bytes exceeds the {cap} byte cap",
        r.stderr.len()
    );
    assert!(
        r.stdout_truncated && r.stderr_truncated,
        "the flood was not reported as truncated: {}",
        show(&r)
    );
    assert!(
        r.stdout.len() as u64 >= cap / 2,
        "stdout holds only {} bytes, expected about the cap",
        r.stdout.len()
    );
    assert!(
        r.stdout.starts_with("y\ny\n"),
        "stdout does not hold the command's output"
    );
    assert!(
        rss_after <= rss_before + 100 * MIB,
        "the daemon's RSS grew from {} to {} MiB during a 400 MiB output flood",
        rss_before / MIB,
        rss_after / MIB
    );

    // A streamed exec whose client stops reading: the daemon must not buffer the flood.
    let req = ExecRequest {
        cmd: vec!["cat".into(), "/dev/zero".into()],
        timeout_secs: Some(30),
        stream: true,
        ..Default::default()
    };
    let body = serde_json::to_vec(&req).expect("json");
    let mut s = TcpStream::connect(&d.addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let head = format!(
        "POST /v1/sandboxes/{}/exec HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        sb.id,
        d.addr,
        body.len()
    );
    s.write_all(head.as_bytes())
        .and_then(|_| s.write_all(&body))
        .expect("send streamed exec");
    let mut got = 0usize;
    let mut buf = vec![0u8; 64 * 1024];
    let mut first = Vec::new();
    while got < 4 * MIB as usize {
        let n = s.read(&mut buf).expect("read stream");
        if n == 0 {
            break;
        }
        if first.len() < 512 {
            first.extend_from_slice(&buf[..n.min(512)]);
        }
        got += n;
    }
    assert!(
        got >= 4 * MIB as usize,
        "the stream ended after {got} bytes: {}",
        String::from_utf8_lossy(&first)
    );
    let base = rss_bytes(d.pid, "VmRSS");
    let mut peak = base;
    // Stop reading for a while: sample the daemon's memory meanwhile (a measurement window).
    for _ in 0..40 {
        std::thread::sleep(Duration::from_millis(100));
        peak = peak.max(rss_bytes(d.pid, "VmRSS"));
    }
    drop(s);
    eprintln!(
        "stalled stream reader: daemon VmRSS {} MiB at the stall, peak {} MiB over 4 s",
        base / MIB,
        peak / MIB
    );
    assert!(
        peak <= base + 100 * MIB,
        "the daemon's RSS grew from {} to {} MiB while a stream client stopped reading an endless output",
        base / MIB,
        peak / MIB
    );
    let r = sb.sh("user", "echo alive", 30);
    assert_eq!(
        r.stdout,
        "alive\n",
        "the sandbox is unusable after the flood:\n{}",
        show(&r)
    );
    assert_host_healthy(d);
}

#[test]
fn sandbox_blocks_cpu_spin() {
    let Some(d) = daemon() else { return };
    let a = Sandbox::create(
        d,
        LimitsRequest {
            cpus: Some(0.5),
            ..Default::default()
        },
    );
    let b = Sandbox::default(d);
    let spin =
        "for i in 1 2 3 4; do timeout 15 sh -c 'while :; do :; done' & done; wait; echo spun";
    std::thread::scope(|scope| {
        let ar = &a;
        let spinner = scope.spawn(move || ar.sh("user", spin, 60));
        let usage0 = cg_cpu_ns(&a.id);
        if usage0.is_none() {
            eprintln!(
                "note: no cpuacct.usage or cpu.stat for {}; the CPU cap sub-check is skipped",
                a.id
            );
        }
        // Wait until the spinners are burning CPU.
        if let Some(u0) = usage0 {
            let busy = wait_for(30, || cg_cpu_ns(&a.id).filter(|u| *u > u0 + 100_000_000));
            assert!(busy.is_some(), "the spinners in sandbox A never used CPU");
        }
        let t0 = Instant::now();
        let u_start = cg_cpu_ns(&a.id);
        let mut lat = Vec::new();
        for i in 0..20 {
            let t = Instant::now();
            let r = b.sh("user", "true", 30);
            lat.push(t.elapsed());
            assert_eq!(
                r.exit_code,
                Some(0),
                "exec {i} in sandbox B failed while A spins:\n{}",
                show(&r)
            );
        }
        // Make the measurement window at least 2 s.
        while t0.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(50));
        }
        let window = t0.elapsed();
        let u_end = cg_cpu_ns(&a.id);
        lat.sort();
        eprintln!(
            "cpu spin: sandbox B exec latency p50 {:?}, max {:?} (not asserted)",
            lat[lat.len() / 2],
            lat[lat.len() - 1]
        );
        if let (Some(u0), Some(u1)) = (u_start, u_end) {
            let cpus = (u1 - u0) as f64 / window.as_nanos() as f64;
            eprintln!("cpu spin: sandbox A used {cpus:.3} cpus over {window:?} (limit 0.5)");
            assert!(
                cpus <= 0.75,
                "sandbox A used {cpus:.3} cpus with a 0.5 cpu limit (4 spinners)"
            );
        }
        let r = spinner.join().expect("spinner thread");
        assert!(
            r.stdout.contains("spun"),
            "the spinner exec did not finish normally:\n{}",
            show(&r)
        );
    });
    assert_host_healthy(d);
}

// ---------------------------------------------------------------------------------------------
// Identity and privileges as seen from the host
// ---------------------------------------------------------------------------------------------

fn decode_caps(hex: &str) -> Vec<u32> {
    let v = u64::from_str_radix(hex.trim(), 16).unwrap_or(u64::MAX);
    (0..64).filter(|b| v & (1u64 << b) != 0).collect()
}

fn cap_names(caps: &[u32]) -> Vec<String> {
    caps.iter()
        .map(|c| {
            CAP_NAMES
                .get(*c as usize)
                .map(|n| n.to_string())
                .unwrap_or_else(|| format!("cap{c}"))
        })
        .collect()
}

#[test]
fn sandbox_blocks_host_privileges() {
    let Some(d) = daemon() else { return };
    let sb = Sandbox::default(d);
    let marker = format!("600.{}", digits());
    let r = sb.sh("root", &format!("sleep {marker} >/dev/null 2>&1 </dev/null & id -u; grep -E '^(Cap|Seccomp|NoNewPrivs)' /proc/self/status"), 30);
    assert_eq!(
        r.stdout.lines().next(),
        Some("0"),
        "root inside is not uid 0:\n{}",
        show(&r)
    );
    let r2 = sb.sh(
        "user",
        "id -u; sudo -n id -u; sudo grep -E '^(Cap|Seccomp|NoNewPrivs)' /proc/self/status",
        30,
    );
    assert!(
        r2.stdout.starts_with("1000\n0\n"),
        "`user` is not uid 1000 or sudo does not give uid 0:\n{}",
        show(&r2)
    );

    for (who, out) in [("exec as root", &r.stdout), ("sudo", &r2.stdout)] {
        let field = |k: &str| {
            out.lines()
                .find_map(|l| {
                    l.strip_prefix(&format!("{k}:"))
                        .map(|v| v.trim().to_string())
                })
                .unwrap_or_else(|| panic!("no {k} line in /proc/self/status ({who}):\n{out}"))
        };
        let bnd = decode_caps(&field("CapBnd"));
        let eff = decode_caps(&field("CapEff"));
        let extra: Vec<u32> = bnd
            .iter()
            .copied()
            .filter(|c| !ALLOWED_CAPS.contains(c))
            .collect();
        eprintln!(
            "{who}: CapBnd {:?}; CapEff {:?}; Seccomp {}; NoNewPrivs {}",
            cap_names(&bnd),
            cap_names(&eff),
            field("Seccomp"),
            field("NoNewPrivs")
        );
        assert!(
            extra.is_empty(),
            "root's bounding set inside ({who}) holds {:?} beyond a container's default",
            cap_names(&extra)
        );
        for must_not in [12u32, 13, 16, 17, 19, 21, 22, 25] {
            assert!(
                !bnd.contains(&must_not),
                "the bounding set ({who}) holds CAP_{}",
                CAP_NAMES[must_not as usize]
            );
        }
        assert_eq!(
            field("Seccomp"),
            "2",
            "processes inside ({who}) run without a seccomp filter"
        );
    }

    // From the host: the sandbox's processes run as unprivileged host uids in their own
    // namespaces.
    let pids = wait_for(10, || {
        Some(host_pids_with_cmdline(&format!("sleep {marker}"))).filter(|p| !p.is_empty())
    })
    .unwrap_or_else(|| panic!("cannot find the sandbox's `sleep {marker}` among host processes"));
    let mut chain = vec![pids[0]];
    // Walk up to the sandbox's PID 1 (NSpid ends in 1).
    loop {
        let p = *chain.last().expect("chain");
        let nspid = status_field(p, "NSpid").unwrap_or_default();
        if nspid.split_whitespace().last() == Some("1") || chain.len() > 10 {
            break;
        }
        let Some(pp) = status_field(p, "PPid").and_then(|v| v.parse::<i32>().ok()) else {
            break;
        };
        chain.push(pp);
    }
    for p in &chain {
        let uid = status_field(*p, "Uid").unwrap_or_default();
        let gid = status_field(*p, "Gid").unwrap_or_default();
        let nspid = status_field(*p, "NSpid").unwrap_or_default();
        let cmd = std::fs::read(format!("/proc/{p}/cmdline"))
            .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
            .unwrap_or_default();
        eprintln!("host pid {p} ({cmd}): Uid {uid}; Gid {gid}; NSpid {nspid}");
        for (what, ids) in [("Uid", &uid), ("Gid", &gid)] {
            for id in ids.split_whitespace() {
                let n: u64 = id.parse().unwrap_or(0);
                assert!(n >= 65536, "host pid {p} ({cmd}) runs with host {what} {n}: root inside must be an unprivileged uid outside");
            }
        }
        assert!(
            nspid.split_whitespace().count() >= 2,
            "host pid {p} ({cmd}) is not in a child pid namespace: NSpid {nspid}"
        );
        for ns in ["user", "pid", "mnt", "net", "ipc", "uts", "cgroup"] {
            let theirs = std::fs::read_link(format!("/proc/{p}/ns/{ns}")).ok();
            let ours = std::fs::read_link(format!("/proc/self/ns/{ns}")).ok();
            assert!(
                theirs.is_some() && theirs != ours,
                "host pid {p} ({cmd}) shares the host's {ns} namespace ({theirs:?})"
            );
        }
        let map = std::fs::read_to_string(format!("/proc/{p}/uid_map")).unwrap_or_default();
        for line in map.lines() {
            let f: Vec<u64> = line
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            assert!(
                f.len() == 3 && f[1] >= 65536,
                "host pid {p}'s uid_map maps to a privileged host range: {map}"
            );
        }
    }
    assert!(
        status_field(*chain.last().expect("chain"), "NSpid")
            .unwrap_or_default()
            .split_whitespace()
            .last()
            == Some("1"),
        "did not reach the sandbox's PID 1 from its `sleep` (chain {chain:?})"
    );
    assert_host_healthy(d);
}
