//! The harness shared by the CLI's full-stack tests.
//!
//! Daemons: [`start`] runs `rampart serve` on a port with a data directory, waits for
//! `/health` and stops it (by pid) when the guard drops (`recovery`, `audit`, `ports`);
//! [`start_tidy`] does the same in a temp dir and cleans up everything when dropped
//! (`e2b_sdk`); [`shared`] is one daemon for a whole test binary, cleaned up when the test
//! process exits (`e2e`, `adversarial`).
//!
//! Talking to them: [`client`] is the HTTP client of every test; [`Api`] is what a test
//! knows of a daemon (its URL, its log for failure messages) and runs the CLI against it
//! ([`cli`]); a [`Sandbox`] is created through the API (201 asserted), runs waited execs
//! ([`Sandbox::exec`], [`Sandbox::sh`]) and is destroyed by id when dropped.

#![allow(dead_code)]

use reqwest::blocking::Client;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Why the tests must be skipped on this host, if they must.
pub fn skip_reason() -> Option<String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root (sandboxes need namespaces and cgroups)".into());
    }
    let dir = Path::new(env!("CARGO_BIN_EXE_rampart"))
        .parent()?
        .to_path_buf();
    for b in ["rampart-jailer", "rampart-agent"] {
        if !dir.join(b).is_file() {
            return Some(format!(
                "{b} is not built (run `cargo build --workspace --bins`)"
            ));
        }
    }
    None
}

/// A daemon a test started; stopped (SIGTERM, then SIGKILL; by pid) when dropped.
pub struct Daemon {
    pub child: Child,
    pub url: String,
    /// Its data directory.
    pub data: std::path::PathBuf,
}

impl Daemon {
    /// Stops the daemon as an operator would: SIGTERM, so it closes its warm pool and removes
    /// its nftables table (when no networked sandbox is alive), then SIGKILL if it has not
    /// exited within 20 s. A test that wants a crash kills the daemon itself first.
    pub fn stop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // SAFETY: kill(2) on the pid of the daemon this test spawned; try_wait just said it
            // has not been reaped, so the pid is still its own.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
        unmount_store(&self.data);
    }
}

/// Lazily unmounts the copy-on-write store a daemon mounted at `<data>/store` (when `<data>`
/// has no reflinks, see rampart-jail's `store`), so a test leaves no mount behind. Sandboxes
/// still running keep it alive in their own mount namespaces; a daemon started again on the
/// same data directory mounts it again.
pub fn unmount_store(data: &Path) {
    let mnt = data.join("store");
    let mounted = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(&*mnt.to_string_lossy()));
    if mounted {
        let _ = Command::new("umount").arg("-l").arg(&mnt).status();
    }
}

/// The directory holding the sandboxes' directories under a daemon's data directory.
pub fn sandboxes_dir(data: &Path) -> std::path::PathBuf {
    if data.join("store.img").exists() {
        data.join("store").join("sandboxes")
    } else {
        data.join("sandboxes")
    }
}

/// A free loopback port.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The admin key of every daemon this test process starts: made once (`rampart_` and 40
/// hex digits from `/dev/urandom`) and registered in each daemon's data directory before it
/// starts ([`provision`]), so that [`client`] and [`cli`] are the node's administrator of
/// whichever daemon they talk to over TCP.
pub fn admin_key() -> &'static str {
    static KEY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    KEY.get_or_init(|| format!("rampart_{}{}", token(), token()))
}

/// `Authorization: Bearer <admin key>`, for tests that write requests by hand.
pub fn auth_header() -> String {
    format!("Authorization: Bearer {}", admin_key())
}

/// Registers [`admin_key`] as an admin key in the store of `data` (`rampart keys import`,
/// as an operator provisions a node), before a daemon starts there. A key already there (a
/// daemon started again on the same directory) is fine.
pub fn provision(data: &Path) {
    use std::io::Write as _;
    let mut child = Command::new(env!("CARGO_BIN_EXE_rampart"))
        .args(["keys", "import", "--name", "test-harness", "--data-dir"])
        .arg(data)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn rampart keys import");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(admin_key().as_bytes())
        .expect("write the key");
    let out = child
        .wait_with_output()
        .expect("wait for rampart keys import");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() || err.contains("already in the store"),
        "rampart keys import in {}: {err}",
        data.display()
    );
}

/// The environment every test daemon starts with, before a test's own variables: the suite
/// keeps many sandboxes with 2 GiB sparse disks alive at once, and a CI machine may have only
/// a few GiB free, so disk quotas are overcommitted; the disk admission test sets `1`.
pub const DAEMON_ENV: &[(&str, &str)] = &[("RAMPART_DISK_OVERCOMMIT", "1000")];

/// Starts `rampart serve` on `port` with `data` (log in `<data>.log`), with extra environment
/// variables, and waits until it answers `/health`.
pub fn start(data: &Path, port: u16, envs: &[(&str, &str)]) -> Daemon {
    provision(data);
    spawn_daemon(data, port, envs)
}

/// Starts `rampart serve` on `data` and `port` as an operator does, with no key registered
/// first (its log next to `data`), and waits until `/health` answers.
pub fn spawn_daemon(data: &Path, port: u16, envs: &[(&str, &str)]) -> Daemon {
    spawn_daemon_in(None, data, data, port, envs)
}

/// [`spawn_daemon`] started in `cwd` with `--data-dir data_arg` (which names `data` from
/// there, e.g. a relative path).
pub fn spawn_daemon_in(
    cwd: Option<&Path>,
    data_arg: &Path,
    data: &Path,
    port: u16,
    envs: &[(&str, &str)],
) -> Daemon {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(data.with_extension("log"))
        .unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rampart"));
    if let Some(dir) = cwd {
        cmd.current_dir(dir);
    }
    let child = cmd
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--data-dir",
        ])
        .arg(data_arg)
        .env_remove("RAMPART_SOCKET")
        .envs(DAEMON_ENV.iter().copied())
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("spawn rampart serve");
    let d = Daemon {
        child,
        url: format!("http://127.0.0.1:{port}"),
        data: data.to_path_buf(),
    };
    let c = client();
    wait_until("the daemon answers /health", 180, || {
        c.get(format!("{}/health", d.url))
            .send()
            .map(|r| r.status().is_success())
            .unwrap_or(false)
    });
    d
}

/// The builder of [`client`], for a test that needs more of it (e.g. names resolved to the
/// daemon with `resolve`). It sends [`admin_key`] as `Authorization: Bearer` (a request
/// that sets its own `Authorization` sends that instead).
pub fn client_builder() -> reqwest::blocking::ClientBuilder {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(
        reqwest::header::AUTHORIZATION,
        format!("Bearer {}", admin_key()).parse().unwrap(),
    );
    Client::builder()
        .timeout(Duration::from_secs(120))
        .default_headers(headers)
}

/// The HTTP client of every test: a generous timeout (a request that waits longer, such as
/// a long exec, sets its own).
pub fn client() -> Client {
    client_builder().build().unwrap()
}

/// Runs the CLI on the daemon's host (`rampart ARGS --data-dir DATA`, no stdin): its
/// stdout, or its stderr when it fails.
pub fn cli_local(data: &Path, args: &[&str]) -> Result<String, String> {
    let out = Command::new(env!("CARGO_BIN_EXE_rampart"))
        .args(args)
        .arg("--data-dir")
        .arg(data)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// `rampart keys create --json ARGS` on the daemon's host (its data directory `data`): the
/// new key.
pub fn make_key(data: &Path, args: &[&str]) -> String {
    let args = [&["keys", "create", "--json"], args].concat();
    let out = cli_local(data, &args).unwrap_or_else(|e| panic!("keys create: {e}"));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["key"].as_str().unwrap().to_owned()
}

/// POSTs `body` as JSON to `path` on the daemon: (status, JSON answer or null).
pub fn post(d: &Daemon, path: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
    let r = client()
        .post(format!("{}{path}", d.url))
        .json(&body)
        .send()
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().unwrap_or(serde_json::Value::Null))
}

/// Polls `f` until it holds, failing the test after `secs`.
pub fn wait_until(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Random lowercase hex (10 bytes from `/dev/urandom`): unique names for temp dirs, files,
/// markers.
pub fn token() -> String {
    use std::io::Read as _;
    let mut b = [0u8; 10];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .expect("read /dev/urandom");
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Whether process `pid` exists and is not a zombie.
pub fn process_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => {
            let state = s
                .rsplit_once(") ")
                .and_then(|(_, rest)| rest.chars().next());
            !matches!(state, Some('Z') | Some('X') | None)
        }
        Err(_) => false,
    }
}

/// Destroys, through the API, every alive sandbox of the daemon at `url`.
pub fn destroy_all(url: &str) {
    let c = client();
    if let Ok(r) = c.get(format!("{url}/v1/sandboxes")).send() {
        if let Ok(serde_json::Value::Array(list)) = r.json::<serde_json::Value>() {
            for s in list {
                if let Some(id) = s["id"].as_str() {
                    let _ = c.delete(format!("{url}/v1/sandboxes/{id}")).send();
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// A daemon in a temp dir of its own that leaves nothing behind (`e2b_sdk`)
// ---------------------------------------------------------------------------------------------

/// A daemon in `<tmp>/rampart-<name>-<token>/data` (log in `data.log` next to it). When
/// dropped: its sandboxes are destroyed through the API, it gets SIGTERM (SIGKILL after 20 s),
/// its store is unmounted and the directory removed.
pub struct Tidy {
    /// The daemon.
    pub daemon: Daemon,
    /// The directory holding `data/`.
    pub root: std::path::PathBuf,
    /// Its data directory, `<root>/data`.
    pub data: std::path::PathBuf,
}

impl std::ops::Deref for Tidy {
    type Target = Daemon;
    fn deref(&self) -> &Daemon {
        &self.daemon
    }
}

/// Starts a [`Tidy`] daemon on a free port.
pub fn start_tidy(name: &str) -> Tidy {
    start_tidy_with(name, &[])
}

/// [`start_tidy`] with more environment for the daemon.
pub fn start_tidy_with(name: &str, envs: &[(&str, &str)]) -> Tidy {
    let root = std::env::temp_dir().join(format!("rampart-{name}-{}", token()));
    let data = root.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let daemon = start(&data, free_port(), envs);
    Tidy { daemon, root, data }
}

impl Drop for Tidy {
    fn drop(&mut self) {
        destroy_all(&self.daemon.url);
        self.daemon.stop();
        unmount_store(&self.data);
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

// ---------------------------------------------------------------------------------------------
// One daemon shared by a whole test binary (`e2e`, `adversarial`)
// ---------------------------------------------------------------------------------------------

/// The daemon every test of a test binary shares. It runs under a small shell wrapper whose
/// stdin is a pipe held by this process: when the test process exits (however it exits) the
/// pipe closes and the wrapper destroys the sandboxes a test left behind (through the API),
/// stops the daemon (by its pid), unmounts its store and removes the temp dir.
pub struct Shared {
    /// `127.0.0.1:<port>`.
    pub addr: String,
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    /// The port it listens on.
    pub port: u16,
    /// The daemon's pid.
    pub pid: i32,
    /// The temp dir holding `data/` and `daemon.log`.
    pub root: std::path::PathBuf,
    /// Its data directory.
    pub data_dir: std::path::PathBuf,
    /// Its log.
    pub log: std::path::PathBuf,
    /// The wrapper; its stdin pipe stays open for the life of this process.
    _wrapper: std::sync::Mutex<Child>,
}

/// Why the shared daemon is not there.
pub enum Setup {
    /// The host cannot run sandboxes: the tests print this and return.
    Skip(String),
    /// The daemon should have started and did not: the tests fail with this.
    Fail(String),
}

static SHARED: std::sync::OnceLock<Result<Shared, Setup>> = std::sync::OnceLock::new();

const WRAPPER: &str = r#"
"$RAMPART_BIN" serve --listen "$ADDR" --data-dir "$DATA" </dev/null >>"$LOG" 2>&1 &
pid=$!
echo "$pid"
read -r _ || true
# The test process is gone. Sandboxes outlive their daemon by design, so delete any a test
# left behind (e.g. after an interrupted run) while the daemon still answers.
if command -v curl >/dev/null 2>&1; then
  for id in $(curl -s -m 10 -H "Authorization: Bearer $RAMPART_API_KEY" "http://$ADDR/v1/sandboxes" | grep -o '"id":"[a-z0-9]*"' | cut -d'"' -f4); do
    curl -s -m 60 -o /dev/null -H "Authorization: Bearer $RAMPART_API_KEY" -X DELETE "http://$ADDR/v1/sandboxes/$id"
  done
fi
kill -TERM "$pid" 2>/dev/null
i=0
while kill -0 "$pid" 2>/dev/null && [ "$i" -lt 100 ]; do sleep 0.1; i=$((i+1)); done
kill -KILL "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
if grep -qF " $DATA/store " /proc/self/mountinfo; then
  umount -l "$DATA/store" 2>/dev/null
fi
if grep -qF " $ROOT/" /proc/self/mountinfo; then
  echo "$NAME: mounts left under $ROOT; not removing it" >>"$LOG"
else
  rm -rf --one-file-system "$ROOT"
fi
"#;

/// The daemon shared by this test binary, started at the first call (in
/// `<tmp>/rampart-<name>-<token>`, with `envs` in its environment; later calls get the same
/// one), or `None` after printing `skipped: <why>` when the host cannot run sandboxes.
/// Panics if it should have started and did not.
pub fn shared(name: &str, envs: &[(&str, &str)]) -> Option<&'static Shared> {
    match SHARED.get_or_init(|| start_shared(name, envs)) {
        Ok(d) => Some(d),
        Err(Setup::Skip(why)) => {
            eprintln!("skipped: {why}");
            None
        }
        Err(Setup::Fail(msg)) => panic!("could not start the daemon: {msg}"),
    }
}

fn start_shared(name: &str, envs: &[(&str, &str)]) -> Result<Shared, Setup> {
    use std::io::BufRead as _;
    use std::os::unix::process::CommandExt as _;
    if let Some(why) = skip_reason() {
        return Err(Setup::Skip(why));
    }
    let root = std::env::temp_dir().join(format!("rampart-{name}-{}", token()));
    let data_dir = root.join("data");
    std::fs::create_dir_all(&data_dir)
        .map_err(|e| Setup::Fail(format!("mkdir {}: {e}", data_dir.display())))?;
    let log = root.join("daemon.log");
    provision(&data_dir);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| Setup::Fail(format!("free port: {e}")))?
        .port();
    let addr = format!("127.0.0.1:{port}");
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(WRAPPER)
        .env("RAMPART_BIN", env!("CARGO_BIN_EXE_rampart"))
        .env("ADDR", &addr)
        .env("DATA", &data_dir)
        .env("LOG", &log)
        .env("ROOT", &root)
        .env("NAME", name)
        .env("RAMPART_API_KEY", admin_key())
        .envs(DAEMON_ENV.iter().copied())
        .envs(envs.iter().copied())
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        // Its own process group: a ^C to the test run does not kill the wrapper before it
        // has cleaned up.
        .process_group(0)
        .spawn()
        .map_err(|e| Setup::Fail(format!("spawn the daemon wrapper: {e}")))?;
    let mut line = String::new();
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| Setup::Fail("no wrapper stdout".into()))?;
    std::io::BufReader::new(stdout)
        .read_line(&mut line)
        .map_err(|e| Setup::Fail(format!("read the daemon pid: {e}")))?;
    let pid: i32 = line
        .trim()
        .parse()
        .map_err(|_| Setup::Fail(format!("bad daemon pid line {line:?}")))?;
    let d = Shared {
        url: format!("http://{addr}"),
        addr,
        port,
        pid,
        root,
        data_dir,
        log,
        _wrapper: std::sync::Mutex::new(child),
    };
    // The first start may build the `base` template: give it time, but watch the process.
    let deadline = Instant::now() + Duration::from_secs(180);
    let c = Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .map_err(|e| Setup::Fail(format!("HTTP client: {e}")))?;
    loop {
        if let Ok(r) = c.get(format!("{}/health", d.url)).send() {
            if r.status().as_u16() == 200 {
                eprintln!(
                    "{name}: daemon pid {} on {} ({})",
                    d.pid,
                    d.addr,
                    d.root.display()
                );
                return Ok(d);
            }
        }
        if !process_alive(d.pid) {
            return Err(Setup::Fail(format!(
                "the daemon exited before answering /health\n{}",
                d.log_tail()
            )));
        }
        if Instant::now() > deadline {
            // SAFETY: kill(2) on the pid of the daemon this test started.
            unsafe { libc::kill(d.pid, libc::SIGKILL) };
            return Err(Setup::Fail(format!(
                "the daemon did not answer /health within 180 s\n{}",
                d.log_tail()
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A test host's network: a network namespace `ns` linked to the host by the veth pair
/// `link` (host side, with `host_cidr`) and `eth0` (inside, with each of `inside_cidrs`), all
/// links up. The link and the namespace are removed on drop; whatever runs inside must be
/// ended first (a struct that holds one drops it after its own `Drop` ran).
pub struct TestNetns {
    ns: String,
    link: String,
}

impl TestNetns {
    /// Makes it, or returns `None` when an `ip` step fails (what was made is removed).
    pub fn new(ns: &str, link: &str, host_cidr: &str, inside_cidrs: &[&str]) -> Option<TestNetns> {
        let run = |args: &[&str]| {
            Command::new("ip")
                .args(args)
                .status()
                .is_ok_and(|s| s.success())
        };
        let t = TestNetns {
            ns: ns.to_owned(),
            link: link.to_owned(),
        };
        let ok = run(&["netns", "add", ns])
            && run(&[
                "link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", ns,
            ])
            && run(&["addr", "add", host_cidr, "dev", link])
            && run(&["link", "set", link, "up"])
            && inside_cidrs
                .iter()
                .all(|c| run(&["-n", ns, "addr", "add", c, "dev", "eth0"]))
            && run(&["-n", ns, "link", "set", "eth0", "up"])
            && run(&["-n", ns, "link", "set", "lo", "up"]);
        ok.then_some(t)
    }
}

impl Drop for TestNetns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.link])
            .status();
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
    }
}

/// Removes the daemon's nftables table (`inet <name>`) when the test ends, even by a failure.
pub struct TableGuard(pub String);

impl Drop for TableGuard {
    fn drop(&mut self) {
        let _ = Command::new("nft")
            .args(["delete", "table", "inet", &self.0])
            .stderr(Stdio::null())
            .status();
    }
}

// ---------------------------------------------------------------------------------------------
// A daemon to talk to, the CLI against it, and sandboxes
// ---------------------------------------------------------------------------------------------

/// The last 60 lines of a daemon's log, for failure messages (empty when there is none).
pub fn log_tail(log: &Path) -> String {
    let Ok(s) = std::fs::read_to_string(log) else {
        return String::new();
    };
    let lines: Vec<&str> = s.lines().collect();
    let from = lines.len().saturating_sub(60);
    format!(
        "--- daemon log (last lines) ---\n{}",
        lines[from..].join("\n")
    )
}

/// A daemon a test talks to: its URL and, where known, its log (shown in failure messages).
/// A plain URL (`&str`, `String`) is one too.
pub trait Api {
    /// `http://127.0.0.1:<port>`.
    fn url(&self) -> &str;

    /// Its log file, if the test knows it.
    fn log(&self) -> Option<PathBuf> {
        None
    }

    /// The last lines of its log, for failure messages.
    fn log_tail(&self) -> String {
        self.log().as_deref().map(log_tail).unwrap_or_default()
    }

    /// Runs the `rampart` CLI with `args` against this daemon (`RAMPART_HOST`, stdin empty).
    fn cli(&self, args: &[&str]) -> Output {
        cli(self.url(), args, None)
    }

    /// As [`Api::cli`], with `stdin` (if any) written to its standard input.
    fn cli_stdin(&self, args: &[&str], stdin: Option<&[u8]>) -> Output {
        cli(self.url(), args, stdin)
    }
}

impl Api for str {
    fn url(&self) -> &str {
        self
    }
}

impl Api for String {
    fn url(&self) -> &str {
        self
    }
}

/// Its log is `<data>.log` when [`start`] started it.
impl Api for Daemon {
    fn url(&self) -> &str {
        &self.url
    }
    fn log(&self) -> Option<PathBuf> {
        Some(self.data.with_extension("log"))
    }
}

impl Api for Tidy {
    fn url(&self) -> &str {
        self.daemon.url()
    }
    fn log(&self) -> Option<PathBuf> {
        self.daemon.log()
    }
}

impl Api for Shared {
    fn url(&self) -> &str {
        &self.url
    }
    fn log(&self) -> Option<PathBuf> {
        Some(self.log.clone())
    }
}

/// Runs the `rampart` binary with `args` against the daemon at `url` (`RAMPART_HOST`, which
/// is `--host`'s variable, with [`admin_key`] as `RAMPART_API_KEY`), with `stdin` written to
/// its standard input (else an empty one); waits for it and returns its output.
pub fn cli(url: &str, args: &[&str], stdin: Option<&[u8]>) -> Output {
    use std::io::Write as _;
    let mut child = Command::new(env!("CARGO_BIN_EXE_rampart"))
        .args(args)
        .env("RAMPART_HOST", url)
        .env("RAMPART_API_KEY", admin_key())
        .env_remove("RAMPART_SOCKET")
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn rampart");
    if let Some(data) = stdin {
        let mut i = child.stdin.take().expect("the CLI's stdin");
        i.write_all(data).expect("write the CLI's stdin");
    }
    child.wait_with_output().expect("wait for rampart")
}

/// A sandbox of a test, destroyed (by id, errors ignored) when dropped unless
/// [`Sandbox::destroy`] already did.
pub struct Sandbox {
    /// Its id.
    pub id: String,
    /// The create's answer (`null` for an adopted sandbox).
    pub info: serde_json::Value,
    url: String,
    log: Option<PathBuf>,
    http: Client,
    destroyed: AtomicBool,
}

impl Sandbox {
    /// Creates a sandbox with `body` (the create request) through the API of `api`, asserting
    /// the daemon answered 201 (the message shows the answer and the daemon's log).
    pub fn create(api: &(impl Api + ?Sized), body: serde_json::Value) -> Sandbox {
        let http = client();
        let r = http
            .post(format!("{}/v1/sandboxes", api.url()))
            .json(&body)
            .send()
            .unwrap_or_else(|e| panic!("create {body}: {e}\n{}", api.log_tail()));
        let status = r.status().as_u16();
        let text = r.text().unwrap_or_default();
        assert_eq!(
            status,
            201,
            "create {body}: {status} {text}\n{}",
            api.log_tail()
        );
        let info: serde_json::Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("create {body}: bad JSON ({e}): {text}"));
        let id = info["id"]
            .as_str()
            .unwrap_or_else(|| panic!("create {body}: no id in {info}"))
            .to_owned();
        Sandbox {
            id,
            info,
            url: api.url().to_owned(),
            log: api.log(),
            http,
            destroyed: AtomicBool::new(false),
        }
    }

    /// The guard of a sandbox made another way (the CLI, a fork, a create a test checks
    /// itself).
    pub fn adopt(api: &(impl Api + ?Sized), id: &str) -> Sandbox {
        Sandbox {
            id: id.to_owned(),
            info: serde_json::Value::Null,
            url: api.url().to_owned(),
            log: api.log(),
            http: client(),
            destroyed: AtomicBool::new(false),
        }
    }

    /// Talks to `api` from now on: the daemon was started again on another port (sandboxes
    /// outlive their daemon).
    pub fn reattach(&mut self, api: &(impl Api + ?Sized)) {
        self.url = api.url().to_owned();
        self.log = api.log();
    }

    /// `<daemon>/v1/sandboxes/<id><rest>`.
    pub fn url(&self, rest: &str) -> String {
        format!("{}/v1/sandboxes/{}{rest}", self.url, self.id)
    }

    /// The HTTP client of this sandbox's requests.
    pub fn http(&self) -> &Client {
        &self.http
    }

    /// The last lines of the daemon's log, for failure messages.
    pub fn log_tail(&self) -> String {
        self.log.as_deref().map(log_tail).unwrap_or_default()
    }

    /// A waited exec: `req` is the exec request (`{"cmd": [...]}` and any of `stdin`, `user`,
    /// `timeout_secs`, ...). Asserts the daemon answered 200 and returns the result. The HTTP
    /// request waits 90 s longer than the exec's own timeout (60 s when it has none).
    pub fn exec(&self, req: serde_json::Value) -> serde_json::Value {
        let wait = req["timeout_secs"].as_u64().unwrap_or(60) + 90;
        let r = self
            .http
            .post(self.url("/exec"))
            .json(&req)
            .timeout(Duration::from_secs(wait))
            .send()
            .unwrap_or_else(|e| panic!("exec {req} in {}: {e}\n{}", self.id, self.log_tail()));
        let status = r.status().as_u16();
        let text = r.text().unwrap_or_default();
        assert_eq!(
            status,
            200,
            "exec {req} in {}: {status} {text}\n{}",
            self.id,
            self.log_tail()
        );
        serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("exec {req}: bad result JSON ({e}): {text}"))
    }

    /// `sh -c script` as the sandbox's default user (a waited exec, see [`Sandbox::exec`]).
    pub fn sh(&self, script: &str) -> serde_json::Value {
        self.exec(serde_json::json!({"cmd": ["sh", "-c", script]}))
    }

    /// Destroys the sandbox now, asserting the daemon answered with success; returns its
    /// answer (the final info). The guard then does nothing more.
    pub fn destroy(&self) -> serde_json::Value {
        self.destroyed.store(true, Ordering::SeqCst);
        let r = self
            .http
            .delete(self.url(""))
            .send()
            .unwrap_or_else(|e| panic!("destroy {}: {e}\n{}", self.id, self.log_tail()));
        let status = r.status();
        let text = r.text().unwrap_or_default();
        assert!(
            status.is_success(),
            "destroy {}: {status} {text}\n{}",
            self.id,
            self.log_tail()
        );
        serde_json::from_str(&text).unwrap_or(serde_json::Value::Null)
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        if !self.destroyed.swap(true, Ordering::SeqCst) {
            let _ = self.http.delete(self.url("")).send();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The client environments `scripts/test` makes under the target directory
// ---------------------------------------------------------------------------------------------

/// The repository's root.
#[allow(dead_code)]
pub fn workspace() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Cargo's target directory (`CARGO_TARGET_DIR`, else `<workspace>/target`).
#[allow(dead_code)]
pub fn target_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| workspace().join("target"))
}

/// The Python of a client environment: `$var` if set, else `<target>/<dir>` (as the
/// `scripts/*-sdks.sh` scripts make it), then `bin/python`.
#[allow(dead_code)]
pub fn venv_python(var: &str, dir: &str) -> std::path::PathBuf {
    std::env::var_os(var)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| target_dir().join(dir))
        .join("bin/python")
}

/// Why `python` cannot run a test's SDK scripts, if it cannot: it fails to import `modules`
/// (`"e2b, httpx"`); `how` names what makes the venv.
pub fn venv_lacks(python: &Path, modules: &str, how: &str) -> Option<String> {
    let ok = Command::new(python)
        .args(["-c", &format!("import {modules}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    (!ok).then(|| {
        format!(
            "no Python venv with {modules} at {} ({how}; needs PyPI access)",
            python.display()
        )
    })
}

// ---------------------------------------------------------------------------------------------
// Test hosts: a DNS server and web server in a network namespace
// ---------------------------------------------------------------------------------------------

/// Test hosts at one address: DNS answering every name under a suffix (`argv[2]`) with the
/// address (`argv[1]`), NXDOMAIN for the rest, and plain HTTP answering `hello <host>` (an
/// HTML page for `/page.html`).
const TEST_HOSTS: &str = r#"
import http.server, socket, struct, sys, threading
addr, suffix = sys.argv[1], "." + sys.argv[2]

def dns():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((addr, 53))
    while True:
        q, peer = s.recvfrom(4096)
        try:
            i, labels = 12, []
            while q[i] != 0:
                n = q[i]
                labels.append(q[i + 1:i + 1 + n].decode().lower())
                i += 1 + n
            qtype, _ = struct.unpack(">HH", q[i + 1:i + 5])
            question = q[12:i + 5]
        except Exception:
            continue
        ok = ".".join(labels).endswith(suffix)
        an = 1 if ok and qtype == 1 else 0
        r = q[:2] + struct.pack(">HHHHH", 0x8180 if ok else 0x8183, 1, an, 0, 0) + question
        if an:
            r += b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 60, 4) + socket.inet_aton(addr)
        s.sendto(r, peer)

class Hello(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        host = self.headers.get("Host", "")
        if self.path.startswith("/page.html"):
            b = ("<html><head><title>test host %s</title></head><body><h1 id=greeting>hello %s</h1></body></html>" % (host, host)).encode()
            ctype = "text/html"
        else:
            b = ("hello %s\n" % host).encode()
            ctype = "text/plain"
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)
    def log_message(self, *a):
        pass

threading.Thread(target=dns, daemon=True).start()
http.server.ThreadingHTTPServer((addr, 80), Hello).serve_forever()
"#;

/// Test hosts ([`TEST_HOSTS`]) in a network namespace linked to the host; a daemon sends
/// its DNS to `<addr>:53` (`RAMPART_NET_UPSTREAM_DNS`). Ended and removed on drop.
pub struct TestHosts {
    server: Child,
    _netns: TestNetns,
}

impl Drop for TestHosts {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

impl TestHosts {
    /// Starts them (namespace `rst-<tag>-<pid>`, host side `side` (a CIDR), the hosts at
    /// `addr` in it, names under `suffix`), waiting until HTTP accepts; `None` when the
    /// namespace cannot be made.
    pub fn start(dir: &Path, tag: &str, side: &str, addr: &str, suffix: &str) -> Option<TestHosts> {
        let pid = std::process::id();
        let ns = format!("rst-{tag}-{pid}");
        let netns = TestNetns::new(
            &ns,
            &format!("x{tag}{}", pid % 100_000),
            side,
            &[&format!(
                "{addr}/{}",
                side.rsplit('/').next().unwrap_or("29")
            )],
        )?;
        let script = dir.join(format!("hosts-{tag}.py"));
        std::fs::write(&script, TEST_HOSTS).ok()?;
        let server = Command::new("ip")
            .args(["netns", "exec", &ns, "python3"])
            .arg(&script)
            .args([addr, suffix])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .ok()?;
        let h = TestHosts {
            server,
            _netns: netns,
        };
        let at: std::net::SocketAddr = format!("{addr}:80").parse().ok()?;
        wait_until("the test hosts' HTTP server accepts", 30, || {
            std::net::TcpStream::connect_timeout(&at, Duration::from_millis(200)).is_ok()
        });
        Some(h)
    }
}

/// What an SDK script (`tests/e2b/harness.py` or the JS runner) reported.
#[allow(dead_code)]
pub struct ScriptReport {
    /// The names after `PASS `.
    pub passed: Vec<String>,
    /// The `FAIL ` lines, and a line of its own when the script did not reach `SUMMARY`.
    pub failed: Vec<String>,
}

/// Runs `program script` in `cwd` with only PATH, HOME and `envs` in its environment (so
/// the SDK sees just the variables a test gives it), prints its output, and reads its
/// `PASS`/`FAIL`/`SUMMARY` lines.
#[allow(dead_code)]
pub fn run_sdk_script(
    program: &Path,
    script: &Path,
    cwd: &Path,
    envs: &[(&str, &str)],
) -> ScriptReport {
    let out = Command::new(program)
        .arg(script)
        .current_dir(cwd)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env(
            "HOME",
            std::env::var_os("HOME").unwrap_or_else(|| "/root".into()),
        )
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("run the SDK script");
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!(
        "--- {} ---\n{stdout}{}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let passed = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("PASS "))
        .map(str::to_owned)
        .collect();
    let mut failed: Vec<String> = stdout
        .lines()
        .filter(|l| l.starts_with("FAIL "))
        .map(str::to_owned)
        .collect();
    if !stdout.contains("SUMMARY ") {
        failed.push(format!(
            "{} did not finish: {}",
            script.display(),
            out.status
        ));
    }
    ScriptReport { passed, failed }
}

/// Runs `tests/e2b/<script>` with the unmodified E2B Python SDK (`target/e2b-venv`) against
/// daemon `d`, with its node key; None (after printing why) when the SDK is not installed.
#[allow(dead_code)]
pub fn e2b_script(d: &Tidy, script: &str) -> Option<ScriptReport> {
    let python = venv_python("RAMPART_E2B_VENV", "e2b-venv");
    if let Some(why) = venv_lacks(&python, "e2b", "scripts/e2b-sdks.sh") {
        eprintln!("skipped {script}: {why}");
        return None;
    }
    let key = std::fs::read_to_string(d.data.join("api-key"))
        .unwrap()
        .trim()
        .to_owned();
    let tests = workspace().join("tests/e2b");
    Some(run_sdk_script(
        &python,
        &tests.join(script),
        &tests,
        &[
            ("E2B_API_KEY", &key),
            ("E2B_API_URL", &d.url),
            ("E2B_SANDBOX_URL", &d.url),
        ],
    ))
}

/// An HTTP answer: status and body (JSON, or the text as a JSON string).
#[derive(Debug)]
pub struct Answer {
    /// The status code.
    pub status: u16,
    /// The body.
    pub body: serde_json::Value,
}

/// A client for calls that may wait on a build (5 minutes per request at most).
pub fn slow_client() -> Client {
    Client::builder()
        .timeout(Duration::from_secs(300))
        .build()
        .unwrap()
}

/// Sends `r` and reads its answer.
pub fn send(r: reqwest::blocking::RequestBuilder) -> Answer {
    let resp = r.send().unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().unwrap_or_default();
    Answer {
        status,
        body: serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
    }
}

/// A request to `url` + `path` with the credential header `auth`, and `body` as JSON.
fn call_as(
    auth: (&str, String),
    url: &str,
    method: reqwest::Method,
    path: &str,
    body: Option<serde_json::Value>,
) -> Answer {
    let mut r = slow_client()
        .request(method, format!("{url}{path}"))
        .header(auth.0, auth.1);
    if let Some(b) = body {
        r = r.json(&b);
    }
    send(r)
}

/// A request of the E2B API with E2B key `key`.
pub fn e2b_call(
    url: &str,
    key: &str,
    method: reqwest::Method,
    path: &str,
    body: Option<serde_json::Value>,
) -> Answer {
    call_as(("x-api-key", key.to_owned()), url, method, path, body)
}

/// A request of the native API with key `key`.
pub fn native_call(
    url: &str,
    key: &str,
    method: reqwest::Method,
    path: &str,
    body: Option<serde_json::Value>,
) -> Answer {
    call_as(
        ("authorization", format!("Bearer {key}")),
        url,
        method,
        path,
        body,
    )
}

/// Reserves an E2B build of template `name` (`POST /v3/templates`) with E2B key `key`.
pub fn reserve_build(url: &str, key: &str, name: &str) -> Answer {
    e2b_call(
        url,
        key,
        reqwest::Method::POST,
        "/v3/templates",
        Some(serde_json::json!({"name": name})),
    )
}

/// Builds `name` on `base` with `steps` through the E2B template API with `key`, as the SDK
/// does (reserve, start, poll the status every 200 ms, at most 15 min): the build id and its
/// final status answer (`ready` or `error`, with the build's logs).
pub fn build_on_base(
    url: &str,
    key: &str,
    name: &str,
    steps: serde_json::Value,
) -> (String, serde_json::Value) {
    let r = reserve_build(url, key, name);
    assert_eq!(r.status, 202, "request a build of {name}: {:?}", r.body);
    let bid = r.body["buildID"].as_str().unwrap().to_owned();
    let s = e2b_call(
        url,
        key,
        reqwest::Method::POST,
        &format!("/v2/templates/{name}/builds/{bid}"),
        Some(serde_json::json!({"fromTemplate": "base", "steps": steps})),
    );
    assert_eq!(s.status, 202, "start the build of {name}: {:?}", s.body);
    let deadline = Instant::now() + Duration::from_secs(900);
    loop {
        let st = e2b_call(
            url,
            key,
            reqwest::Method::GET,
            &format!("/templates/{name}/builds/{bid}/status?logsOffset=0"),
            None,
        );
        assert_eq!(st.status, 200, "{:?}", st.body);
        if matches!(st.body["status"].as_str(), Some("ready" | "error")) {
            return (bid, st.body);
        }
        assert!(Instant::now() < deadline, "the build of {name} did not end");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A daemon's config file in a temp directory of its own, removed when dropped.
pub struct ConfigFile {
    /// Its path, for `RAMPART_CONFIG`.
    pub path: String,
    dir: PathBuf,
}

impl Drop for ConfigFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Writes `toml` to a new `rampart.toml` (see [`ConfigFile`]).
pub fn config_file(toml: &str) -> ConfigFile {
    let dir = std::env::temp_dir().join(format!("rampart-config-{}", token()));
    std::fs::create_dir_all(&dir).unwrap();
    let conf = dir.join("rampart.toml");
    std::fs::write(&conf, toml).unwrap();
    ConfigFile {
        path: conf.to_string_lossy().into_owned(),
        dir,
    }
}

/// Makes tenants `names` on the daemon at `url` with the admin key (201 asserted).
pub fn make_tenants(url: &str, names: &[&str]) {
    for t in names {
        let a = native_call(
            url,
            admin_key(),
            reqwest::Method::POST,
            "/v1/tenants",
            Some(serde_json::json!({"name": t})),
        );
        assert_eq!(a.status, 201, "create tenant {t}: {:?}", a.body);
    }
}
