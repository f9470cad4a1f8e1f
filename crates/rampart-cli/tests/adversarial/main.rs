//! Adversarial tests (tier 3): each `sandbox_blocks_*` test creates its own sandbox in a real
//! daemon, runs a real escape or exhaustion attempt inside it, asserts the attempt fails the
//! expected way, and then checks that the host is still healthy (the daemon answers `/health`
//! and a fresh exec in another sandbox works).
//!
//! One test binary, its tests grouped by attack surface: [`fs`] (host files by path and
//! through the file API), [`procs`] (`/proc`, ptrace, kill of host processes), [`kernel`]
//! (mount, namespaces, modules, raw sockets), [`net`] (host ports), [`resources`]
//! (exhaustion: processes, memory, disk, tmpfs, output, CPU) and [`privileges`] (identity and
//! privileges as seen from the host).
//!
//! One daemon serves the whole test binary (`support::shared`): it listens on a free loopback
//! port with a data directory under a fresh temp dir. It is started through a small shell
//! wrapper whose stdin is a pipe held by this process; when the test process exits the pipe
//! closes and the wrapper stops the daemon (by pid) and removes the temp dir if nothing is
//! mounted under it. Every sandbox is deleted by its guard (`support::Sandbox`) when its test
//! ends (also on panic).
//!
//! Needs root and the binaries `rampart`, `rampart-jailer`, `rampart-agent` built in the same
//! target directory; otherwise each test prints `skipped: <reason>` and returns.
//!
//! Run: `cargo build --workspace --bins && cargo test -p rampart-cli --test adversarial`.

#[path = "../support/mod.rs"]
mod support;

mod fs;
mod kernel;
mod net;
mod privileges;
mod procs;
mod resources;

use rampart_types::{CreateSandbox, ExecRequest, ExecResult, LimitsRequest};
use serde_json::Value;
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use support::{process_alive, token, Api as _, Sandbox};

const MIB: u64 = 1 << 20;

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
// The daemon and its API
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

/// An API answer: status and body.
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

/// A request body for [`SandboxExt::files`].
enum Body<'a> {
    None,
    Bytes(&'a [u8]),
    /// `n` zero bytes, streamed.
    Zeros(u64),
}

/// Sends `req` (`what` names it in a failure message, with the daemon's log): its answer.
fn send(req: reqwest::blocking::RequestBuilder, what: &str, log: impl Fn() -> String) -> Resp {
    let r = req
        .send()
        .unwrap_or_else(|e| panic!("{what}: {e}\n{}", log()));
    let status = r.status().as_u16();
    let body = r
        .bytes()
        .unwrap_or_else(|e| panic!("{what}: reading the answer: {e}\n{}", log()));
    Resp {
        status,
        body: body.to_vec(),
    }
}

/// `GET <path>` on the daemon.
fn get(d: &Daemon, path: &str) -> Resp {
    send(
        support::client().get(format!("{}{path}", d.url)),
        &format!("GET {path}"),
        || d.log_tail(),
    )
}

// ---------------------------------------------------------------------------------------------
// Sandboxes
// ---------------------------------------------------------------------------------------------

/// A sandbox with `limits` (and a 600 s timeout).
fn sandbox_with(d: &'static Daemon, limits: LimitsRequest) -> Sandbox {
    let req = CreateSandbox {
        limits,
        timeout_secs: Some(600),
        ..Default::default()
    };
    Sandbox::create(
        d,
        serde_json::to_value(&req).expect("serialize CreateSandbox"),
    )
}

/// A sandbox with the default limits.
fn sandbox(d: &'static Daemon) -> Sandbox {
    sandbox_with(d, LimitsRequest::default())
}

/// What the attacks do in a sandbox, on top of `support::Sandbox`.
trait SandboxExt {
    /// A waited exec of `req`: its result.
    fn run(&self, req: &ExecRequest) -> ExecResult;
    /// Runs `bash -c script` as `user` (`user` or `root`).
    fn bash(&self, user: &str, script: &str, timeout_secs: u64) -> ExecResult;
    /// Runs `python3 -c code args...` as `user`.
    fn py(&self, user: &str, code: &str, args: &[String], timeout_secs: u64) -> ExecResult;
    /// `method` on the file API's `endpoint` (`""`, `/stat`, `/list`) for `path`.
    fn files(&self, method: &str, endpoint: &str, path: &str, body: Body<'_>) -> Resp;
    /// `POST` of `v` to the sandbox's `endpoint` (e.g. `/files/mkdir`).
    fn post_json(&self, endpoint: &str, v: &Value) -> Resp;
}

impl SandboxExt for Sandbox {
    fn run(&self, req: &ExecRequest) -> ExecResult {
        let v = self.exec(serde_json::to_value(req).expect("serialize ExecRequest"));
        serde_json::from_value(v.clone())
            .unwrap_or_else(|e| panic!("exec: bad result JSON {e}: {v}"))
    }

    fn bash(&self, user: &str, script: &str, timeout_secs: u64) -> ExecResult {
        self.run(&ExecRequest {
            cmd: vec!["bash".into(), "-c".into(), script.into()],
            user: Some(user.into()),
            timeout_secs: Some(timeout_secs),
            ..Default::default()
        })
    }

    fn py(&self, user: &str, code: &str, args: &[String], timeout_secs: u64) -> ExecResult {
        let mut cmd = vec!["python3".to_string(), "-c".into(), code.into()];
        cmd.extend(args.iter().cloned());
        self.run(&ExecRequest {
            cmd,
            user: Some(user.into()),
            timeout_secs: Some(timeout_secs),
            ..Default::default()
        })
    }

    fn files(&self, method: &str, endpoint: &str, path: &str, body: Body<'_>) -> Resp {
        use std::io::Read as _;
        let url = self.url(&format!("/files{endpoint}?path={}", pct_encode(path)));
        let m: reqwest::Method = method.parse().expect("an HTTP method");
        let req = self.http().request(m, &url);
        let octets = "application/octet-stream";
        let req = match body {
            Body::None => req,
            Body::Bytes(b) => req.header("content-type", octets).body(b.to_vec()),
            Body::Zeros(n) => {
                req.header("content-type", octets)
                    .body(reqwest::blocking::Body::sized(
                        std::io::repeat(0).take(n),
                        n,
                    ))
            }
        };
        send(req, &format!("{method} {url}"), || self.log_tail())
    }

    fn post_json(&self, endpoint: &str, v: &Value) -> Resp {
        let url = self.url(endpoint);
        send(
            self.http()
                .post(&url)
                .json(v)
                .timeout(Duration::from_secs(60)),
            &format!("POST {url}"),
            || self.log_tail(),
        )
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
    let r = get(d, "/health");
    assert_eq!(
        r.status,
        200,
        "/health: {} {}\n{}",
        r.status,
        r.text(),
        d.log_tail()
    );
    let sb = sandbox(d);
    let r = sb.bash("user", "echo healthy", 30);
    assert!(
        r.exit_code == Some(0) && r.stdout == "healthy\n",
        "exec in a fresh sandbox after the attack:\n{}",
        show(&r)
    );
}
