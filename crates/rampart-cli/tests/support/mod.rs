//! The daemon harness shared by the CLI's full-stack tests that start their own daemons
//! (`recovery`, `audit`): start `rampart serve` on a port with a data directory, wait for
//! `/health`, SIGKILL it (by pid) when the guard drops.

#![allow(dead_code)]

use reqwest::blocking::Client;
use std::path::Path;
use std::process::{Child, Command, Stdio};
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

/// A daemon a test started; SIGKILLed (by pid) when dropped.
pub struct Daemon {
    pub child: Child,
    pub url: String,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
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

/// Starts `rampart serve` on `port` with `data` (log in `<data>.log`), with extra environment
/// variables, and waits until it answers `/health`.
pub fn start(data: &Path, port: u16, envs: &[(&str, &str)]) -> Daemon {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(data.with_extension("log"))
        .unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_rampart"))
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--data-dir",
        ])
        .arg(data)
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("spawn rampart serve");
    let d = Daemon {
        child,
        url: format!("http://127.0.0.1:{port}"),
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

/// An HTTP client with a generous timeout.
pub fn client() -> Client {
    Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// Polls `f` until it holds, failing the test after `secs`.
pub fn wait_until(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
