//! Test harness: the agent binary as a child process, a client, raw HTTP.
#![allow(dead_code)]

use bytes::Bytes;
use futures::StreamExt as _;
use http_body_util::{BodyExt as _, Full};
use rampart_agent::client::{AgentClient, ClientError, ProcessEvent, StartOptions};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// A running agent, killed (by pid) when dropped.
pub struct Agent {
    child: std::process::Child,
    pub dir: tempfile::TempDir,
    pub client: AgentClient,
}

impl Agent {
    pub async fn start() -> Agent {
        let dir = tempfile::tempdir().expect("tempdir");
        let sock = dir.path().join("agent.sock");
        // SAFETY-free: tests run as root; `root` is the default user so HOME is /root.
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_rampart-agent"))
            .arg("--listen")
            .arg(&sock)
            .arg("--default-user")
            .arg("root")
            .env("RAMPART_SECRET_TEST", "must-not-leak")
            .spawn()
            .expect("spawn agent");
        let client = AgentClient::new(sock);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if client.health().await.is_ok() {
                break;
            }
            assert!(Instant::now() < deadline, "agent did not become healthy");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Agent { child, dir, client }
    }

    pub fn sock(&self) -> PathBuf {
        self.client.socket().to_path_buf()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Wait (polling, with a deadline) for the agent to exit.
    pub async fn wait_exit(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(st) = self.child.try_wait().expect("try_wait") {
                return st;
            }
            assert!(Instant::now() < deadline, "agent did not exit");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// A scratch directory for a test's files.
    pub fn scratch(&self) -> String {
        let p = self.dir.path().join("work");
        std::fs::create_dir_all(&p).expect("scratch");
        p.to_string_lossy().into_owned()
    }
}

/// Make `dir` (under the agent's temp dir) reachable by every user and give it a
/// world-writable, sticky subdirectory `pub`, which is returned.
pub fn open_to_everyone(a: &Agent, dir: &str) -> String {
    use std::os::unix::fs::PermissionsExt as _;
    let mut p = std::path::PathBuf::from(dir);
    while p.starts_with(a.dir.path()) {
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        if !p.pop() {
            break;
        }
    }
    let public = format!("{dir}/pub");
    std::fs::create_dir_all(&public).expect("mkdir pub");
    std::fs::set_permissions(&public, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    public
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn sh(cmd: &str) -> StartOptions {
    StartOptions {
        cmd: "/bin/sh".into(),
        args: vec!["-c".into(), cmd.into()],
        ..Default::default()
    }
}

/// Everything a process printed and how it ended.
#[derive(Debug, Default)]
pub struct Output {
    pub pid: u32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub pty: Vec<u8>,
    pub end: Option<ProcessEvent>,
    pub error: Option<ClientError>,
}

pub async fn collect(
    mut s: futures::stream::BoxStream<'static, Result<ProcessEvent, ClientError>>,
) -> Output {
    let mut o = Output::default();
    while let Some(ev) = s.next().await {
        match ev {
            Ok(ProcessEvent::Start { pid }) => o.pid = pid,
            Ok(ProcessEvent::Stdout(b)) => o.stdout.extend_from_slice(&b),
            Ok(ProcessEvent::Stderr(b)) => o.stderr.extend_from_slice(&b),
            Ok(ProcessEvent::Pty(b)) => o.pty.extend_from_slice(&b),
            Ok(e @ ProcessEvent::End { .. }) => o.end = Some(e),
            Err(e) => {
                o.error = Some(e);
                break;
            }
        }
    }
    o
}

pub async fn run(c: &AgentClient, opts: StartOptions) -> Output {
    collect(c.start(opts).await.expect("start")).await
}

pub fn exit_of(o: &Output) -> (i32, bool, String) {
    match &o.end {
        Some(ProcessEvent::End {
            exit_code,
            exited,
            status,
            ..
        }) => (*exit_code, *exited, status.clone()),
        other => panic!("no end event: {other:?} (error {:?})", o.error),
    }
}

/// A raw HTTP/1.1 exchange over the socket.
pub struct Raw {
    pub status: u16,
    pub headers: hyper::HeaderMap,
    pub body: Bytes,
}

pub async fn raw(
    sock: &std::path::Path,
    method: &str,
    uri: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> Raw {
    let stream = tokio::net::UnixStream::connect(sock)
        .await
        .expect("connect");
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("handshake");
    tokio::spawn(conn);
    let mut b = hyper::Request::builder()
        .method(method)
        .uri(uri)
        .header("host", "agent");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let resp = sender
        .send_request(b.body(Full::new(Bytes::from(body))).expect("req"))
        .await
        .expect("send");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    Raw {
        status,
        headers,
        body,
    }
}

/// A unary Connect call with a JSON body.
pub async fn unary(sock: &std::path::Path, procedure: &str, json: &str) -> Raw {
    raw(
        sock,
        "POST",
        &format!("/{procedure}"),
        &[
            ("content-type", "application/json"),
            ("connect-protocol-version", "1"),
        ],
        json.as_bytes().to_vec(),
    )
    .await
}

pub fn envelope(flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut v = vec![flags];
    v.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    v.extend_from_slice(payload);
    v
}

/// Split a streaming body into `(flags, payload)` envelopes.
pub fn split_envelopes(mut b: &[u8]) -> Vec<(u8, String)> {
    let mut out = Vec::new();
    while b.len() >= 5 {
        let len = u32::from_be_bytes([b[1], b[2], b[3], b[4]]) as usize;
        out.push((b[0], String::from_utf8_lossy(&b[5..5 + len]).into_owned()));
        b = &b[5 + len..];
    }
    assert!(b.is_empty(), "trailing bytes in stream");
    out
}

/// Whether a pid names a live (non-zombie) process.
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        Ok(s) => s
            .rsplit_once(") ")
            .map(|(_, rest)| !rest.starts_with('Z'))
            .unwrap_or(false),
    }
}

/// Wait until `f` holds, polling, with a deadline.
pub async fn wait_for<F: FnMut() -> bool>(mut f: F, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
