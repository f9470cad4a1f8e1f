//! Full-stack tests (tier 2): a real `rampart serve` on a free loopback port with a fresh data
//! directory, driven through the real `rampart` CLI binary and plain HTTP. Covers lifecycle,
//! exec (streaming, stdin, timeouts, signals, exit codes, output caps, disconnects), files
//! (`cp` and the file API), `run`, and bad input on every endpoint.
//!
//! One daemon serves the whole test binary (`support::shared`). It runs under a small shell
//! wrapper whose stdin is a pipe held by this process: when the test process exits the pipe
//! closes and the wrapper stops the daemon (by its pid) and removes the temp dir. Every sandbox a test creates is
//! destroyed by a guard when the test ends (also on panic).
//!
//! Needs root and `rampart-jailer`, `rampart-agent` built next to `rampart`; otherwise each test
//! prints `skipped: <reason>` and returns. Run:
//! `cargo build --workspace --bins && cargo test -p rampart-cli --test e2e`.

mod support;

use reqwest::blocking::Response;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use support::{client, free_port, token, wait_until, Api as _, Sandbox};

/// The daemon every test of this binary shares (see `support::shared`).
type Daemon = support::Shared;

fn rampart_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_rampart"))
}

/// The shared daemon, or `None` (after printing why) when the test must be skipped.
fn daemon() -> Option<&'static Daemon> {
    support::shared("e2e", &[])
}

/// `<daemon><path>`.
fn at(d: &Daemon, path: &str) -> String {
    format!("{}{path}", d.url)
}

fn out(o: &Output) -> String {
    format!(
        "code {:?}\n--- stdout\n{}\n--- stderr\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Asserts an API error answer.
fn api_error(r: Response, status: u16, code: &str) -> String {
    let s = r.status().as_u16();
    let text = r.text().unwrap_or_default();
    assert_eq!(s, status, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}"));
    assert_eq!(v["error"]["code"], code, "{v}");
    v["error"]["message"].as_str().unwrap().to_owned()
}

#[test]
fn cli_says_what_to_do_when_the_daemon_is_down() {
    let port = free_port();
    let o = Command::new(rampart_bin())
        .args(["--host", &format!("http://127.0.0.1:{port}"), "ls"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("rampart serve"),
        "{}",
        out(&o)
    );
    let o = Command::new(rampart_bin())
        .args([
            "--host",
            &format!("http://127.0.0.1:{port}"),
            "exec",
            "abc",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(125), "{}", out(&o));
}

#[test]
fn health_metrics_and_openapi() {
    let Some(d) = daemon() else { return };
    let h: Value = client()
        .get(at(d, "/health"))
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(h["status"], "ok");
    let m = client()
        .get(at(d, "/metrics"))
        .send()
        .unwrap()
        .text()
        .unwrap();
    assert!(m.contains("rampart_http_requests_total"), "{m}");
    let o: Value = client()
        .get(at(d, "/v1/openapi.json"))
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert!(o["paths"]["/v1/sandboxes/{id}/exec"].is_object());
}

#[test]
fn lifecycle_through_the_cli() {
    let Some(d) = daemon() else { return };
    let tag = format!("life{}", token());
    let o = d.cli(&[
        "create",
        "--memory",
        "256M",
        "--cpus",
        "0.5",
        "--metadata",
        &format!("t={tag}"),
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let id = v["id"].as_str().unwrap().to_owned();
    let _guard = Sandbox::adopt(d, &id);
    assert_eq!(v["limits"]["memory_bytes"], 256 << 20);
    assert_eq!(v["state"], "running");

    let o = d.cli(&["ls"]);
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(table.starts_with("ID"), "{table}");
    assert!(table.contains(&id), "{table}");
    let o = d.cli(&["ls", "--json", "--metadata", &format!("t={tag}")]);
    let list: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(list.as_array().unwrap().len(), 1, "{list}");

    let o = d.cli(&["info", &id]);
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("running"),
        "{}",
        out(&o)
    );

    let o = d.cli(&["timeout", &id, "600"]);
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));

    let o = d.cli(&["rm", &id]);
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    let o = d.cli(&["ls", "--json", "--metadata", &format!("t={tag}")]);
    let list: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(list.as_array().unwrap().len(), 0, "{list}");
    let o = d.cli(&["exec", &id, "--", "true"]);
    assert_eq!(o.status.code(), Some(125), "{}", out(&o));

    let o = d.cli(&["info", "nosuchsandbox"]);
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("rampart ls"),
        "{}",
        out(&o)
    );
    let o = d.cli(&["create", "--memory", "lots"]);
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
}

#[test]
fn a_sandbox_resolves_its_own_host_name() {
    let Some(d) = daemon() else { return };
    let sb = Sandbox::create(d, json!({}));
    // Its host name is its id, resolved without a network (nss-myhostname, as the base
    // template's nsswitch.conf says), so `sudo` does not warn or stall on the lookup.
    let v = sb.sh("hostname; getent hosts \"$(hostname)\" && sudo -n true 2>&1");
    assert_eq!(v["exit_code"], 0, "{v}");
    let out = v["stdout"].as_str().unwrap_or_default();
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some(sb.id.as_str()), "{out}");
    assert!(
        lines.next().is_some_and(|l| l.contains(sb.id.as_str())),
        "{out}"
    );
    assert!(!out.contains("unable to resolve host"), "{out}");
}

#[test]
fn exec_exit_codes_output_timeouts_and_signals() {
    let Some(d) = daemon() else { return };
    let sb = Sandbox::create(d, json!({}));
    let id = sb.id.as_str();
    let o = d.cli(&[
        "exec",
        id,
        "--",
        "sh",
        "-c",
        "echo out; echo err >&2; exit 7",
    ]);
    assert_eq!(o.status.code(), Some(7), "{}", out(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "out\n");
    assert_eq!(String::from_utf8_lossy(&o.stderr), "err\n");

    let o = d.cli(&[
        "exec",
        id,
        "--env",
        "X=42",
        "--cwd",
        "/tmp",
        "--",
        "sh",
        "-c",
        "echo $X $(pwd) $(id -un)",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "42 /tmp user\n");
    let o = d.cli(&["exec", id, "--user", "root", "--", "id", "-u"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "0\n", "{}", out(&o));

    let o = d.cli(&["exec", id, "--timeout", "1", "--", "sleep", "60"]);
    assert_eq!(o.status.code(), Some(124), "{}", out(&o));
    let o = d.cli(&["exec", id, "--", "sh", "-c", "kill -9 $$"]);
    assert_eq!(o.status.code(), Some(137), "{}", out(&o));
    let o = d.cli(&["exec", id, "--", "no-such-program-here"]);
    assert_ne!(o.status.code(), Some(0), "{}", out(&o));

    let o = d.cli_stdin(
        &["exec", "--stdin", id, "--", "sh", "-c", "cat; echo done"],
        Some(b"hello\n"),
    );
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "hello\ndone\n");
    let o = d.cli_stdin(
        &[
            "exec",
            "--tty",
            id,
            "--",
            "sh",
            "-c",
            "test -t 0 && echo tty",
        ],
        Some(b""),
    );
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("tty"),
        "{}",
        out(&o)
    );

    // Large output through the CLI arrives whole.
    let o = d.cli(&["exec", id, "--", "head", "-c", "3000000", "/dev/zero"]);
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(o.stdout.len(), 3_000_000);
}

#[test]
fn waited_and_streamed_exec_over_http() {
    let Some(d) = daemon() else { return };
    let sb = Sandbox::create(d, json!({}));
    let v = sb.sh("printf abc; printf e >&2; exit 3");
    assert_eq!(v["exit_code"], 3);
    assert_eq!(v["stdout"], "abc");
    assert_eq!(v["stderr"], "e");
    assert_eq!(v["stdout_truncated"], false);

    let v = sb.exec(json!({"cmd": ["head", "-c", "100000", "/dev/zero"], "max_output_bytes": 10}));
    assert_eq!(v["stdout"].as_str().unwrap().len(), 10);
    assert_eq!(v["stdout_truncated"], true);
    assert_eq!(v["exit_code"], 0);

    let v = sb.exec(json!({"cmd": ["cat"], "stdin": "piped"}));
    assert_eq!(v["stdout"].as_str(), Some("piped"), "{v}");
    let v = sb.exec(json!({"cmd": ["sleep", "30"], "timeout_secs": 1}));
    assert_eq!(v["timed_out"], true, "{v}");

    let r = client()
        .post(sb.url("/exec"))
        .json(&json!({"cmd": ["sh", "-c", "echo one; echo two >&2"], "stream": true}))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .contains("ndjson"));
    let text = r.text().unwrap();
    let events: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events.first().unwrap()["type"], "start", "{text}");
    assert_eq!(events.last().unwrap()["type"], "exit", "{text}");
    assert_eq!(events.last().unwrap()["exit_code"], 0, "{text}");
    assert!(events.iter().any(|e| e["type"] == "stdout"), "{text}");
    assert!(events.iter().any(|e| e["type"] == "stderr"), "{text}");
}

#[test]
fn a_client_that_goes_away_takes_its_process_with_it() {
    let Some(d) = daemon() else { return };
    let sb = Sandbox::create(d, json!({}));
    let marker = format!("{}", 100000 + std::process::id() % 100000);
    let body = json!({"cmd": ["sleep", marker], "stream": true}).to_string();
    let addr = d.url.trim_start_matches("http://");
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "POST /v1/sandboxes/{}/exec HTTP/1.1\r\nHost: {addr}\r\n{}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        sb.id,
        support::auth_header(),
        body.len()
    )
    .unwrap();
    let mut first = [0u8; 64];
    let n = s.read(&mut first).unwrap();
    assert!(String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"));
    let running = |sb: &Sandbox| {
        let v = sb.sh(&format!("ps -eo args | grep -c '^sleep {marker}$'"));
        v["stdout"].as_str().unwrap_or("").trim() != "0"
    };
    wait_until("the streamed process starts", 30, || running(&sb));
    drop(s);
    wait_until("the process is killed after the disconnect", 30, || {
        !running(&sb)
    });
}

#[test]
fn files_through_cp_and_the_api() {
    let Some(d) = daemon() else { return };
    let sb = Sandbox::create(d, json!({}));
    let id = sb.id.as_str();
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("blob.bin");
    let data: Vec<u8> = (0..3_000_000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(&src, &data).unwrap();

    let o = d.cli(&[
        "cp",
        src.to_str().unwrap(),
        &format!("{id}:/home/user/deep/er/blob.bin"),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    let back = tmp.path().join("back.bin");
    let o = d.cli(&[
        "cp",
        &format!("{id}:/home/user/deep/er/blob.bin"),
        back.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    assert!(std::fs::read(&back).unwrap() == data, "round trip differs");
    // Into a directory, and to stdout.
    let o = d.cli(&["cp", src.to_str().unwrap(), &format!("{id}:/tmp/")]);
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    let o = d.cli_stdin(
        &["cp", "-", &format!("{id}:/tmp/from-stdin")],
        Some(b"stdin bytes"),
    );
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    let o = d.cli(&["cp", &format!("{id}:/tmp/from-stdin"), "-"]);
    assert_eq!(o.stdout, b"stdin bytes", "{}", out(&o));
    let o = d.cli(&["cp", &format!("{id}:/tmp/nothing-here"), "-"]);
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));

    let http = client();
    let st: Value = http
        .get(sb.url("/files/stat?path=/tmp/blob.bin"))
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(st["size"], 3_000_000, "{st}");
    assert_eq!(st["type"], "file");

    let r = http
        .put(sb.url("/files?path=/tmp/a/b/c.txt"))
        .body("hi")
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    let r = http
        .put(sb.url("/files?path=/tmp/a/b/c.txt"))
        .body("hello")
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(
        http.get(sb.url("/files?path=/tmp/a/b/c.txt"))
            .send()
            .unwrap()
            .text()
            .unwrap(),
        "hello"
    );
    let l: Value = http
        .get(sb.url("/files/list?path=/tmp/a&depth=2"))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let names: Vec<&str> = l["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"b") && names.contains(&"c.txt"), "{l}");
    let r = http
        .post(sb.url("/files/mkdir"))
        .json(&json!({"path": "/tmp/newdir/x"}))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    let r = http
        .post(sb.url("/files/mkdir"))
        .json(&json!({"path": "/tmp/newdir/x"}))
        .send()
        .unwrap();
    api_error(r, 409, "conflict");
    let r = http
        .post(sb.url("/files/move"))
        .json(&json!({"from": "/tmp/a/b/c.txt", "to": "/tmp/newdir/c.txt"}))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let r = http
        .delete(sb.url("/files?path=/tmp/newdir"))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 204);
    api_error(
        http.get(sb.url("/files?path=/tmp/newdir/c.txt"))
            .send()
            .unwrap(),
        404,
        "not_found",
    );
    api_error(
        http.delete(sb.url("/files?path=/tmp/newdir"))
            .send()
            .unwrap(),
        404,
        "not_found",
    );
    api_error(
        http.get(sb.url("/files/stat?path=/nope")).send().unwrap(),
        404,
        "not_found",
    );
}

#[test]
fn run_creates_runs_and_destroys() {
    let Some(d) = daemon() else { return };
    let tag = format!("run{}", token());
    let o = d.cli(&[
        "run",
        "--metadata",
        &format!("t={tag}"),
        "--",
        "sh",
        "-c",
        "echo inside; exit 3",
    ]);
    assert_eq!(o.status.code(), Some(3), "{}", out(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "inside\n");
    let left: Value = client()
        .get(at(d, &format!("/v1/sandboxes?metadata=t%3D{tag}")))
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(
        left.as_array().unwrap().len(),
        0,
        "run left a sandbox: {left}"
    );
}

#[test]
fn bad_input_on_every_endpoint() {
    let Some(d) = daemon() else { return };
    let http = client();
    let sb = Sandbox::create(d, json!({}));
    let post = |path: &str, body: &str| {
        http.post(at(d, path))
            .header("content-type", "application/json")
            .body(body.to_owned())
            .send()
            .unwrap()
    };
    // 400: malformed JSON, unknown fields, wrong types, missing body, bad ids, bad queries.
    api_error(post("/v1/sandboxes", "{"), 400, "bad_request");
    let m = api_error(
        post("/v1/sandboxes", r#"{"limits":{"memory":1}}"#),
        400,
        "bad_request",
    );
    assert!(m.contains("limits"), "{m}");
    api_error(post("/v1/sandboxes", ""), 400, "bad_request");
    api_error(
        post(&format!("/v1/sandboxes/{}/exec", sb.id), r#"{"cmd":"ls"}"#),
        400,
        "bad_request",
    );
    api_error(
        post(&format!("/v1/sandboxes/{}/exec", sb.id), r#"{"cmd":[]}"#),
        400,
        "bad_request",
    );
    api_error(
        post(&format!("/v1/sandboxes/{}/timeout", sb.id), r#"{"secs":1}"#),
        400,
        "bad_request",
    );
    api_error(
        post(&format!("/v1/sandboxes/{}/files/mkdir", sb.id), "{}"),
        400,
        "bad_request",
    );
    api_error(
        post(
            &format!("/v1/sandboxes/{}/files/move", sb.id),
            r#"{"from":"/a"}"#,
        ),
        400,
        "bad_request",
    );
    api_error(
        http.get(at(d, "/v1/sandboxes/BAD..ID")).send().unwrap(),
        400,
        "bad_request",
    );
    api_error(
        http.get(at(d, "/v1/sandboxes?state=zombie"))
            .send()
            .unwrap(),
        400,
        "bad_request",
    );
    api_error(
        http.get(sb.url("/files")).send().unwrap(),
        400,
        "bad_request",
    );
    api_error(
        http.get(sb.url("/files/list?path=/&depth=0"))
            .send()
            .unwrap(),
        400,
        "bad_request",
    );
    // 404: unknown sandbox on every endpoint.
    let gone = "nosuchsandbox0000000";
    for (m, p) in [
        ("GET", format!("/v1/sandboxes/{gone}")),
        ("DELETE", format!("/v1/sandboxes/{gone}")),
        ("GET", format!("/v1/sandboxes/{gone}/files?path=/tmp")),
        ("GET", format!("/v1/sandboxes/{gone}/files/stat?path=/tmp")),
        ("GET", format!("/v1/sandboxes/{gone}/files/list?path=/tmp")),
        ("DELETE", format!("/v1/sandboxes/{gone}/files?path=/tmp/x")),
    ] {
        let r = http.request(m.parse().unwrap(), at(d, &p)).send().unwrap();
        api_error(r, 404, "not_found");
    }
    api_error(
        post(&format!("/v1/sandboxes/{gone}/exec"), r#"{"cmd":["true"]}"#),
        404,
        "not_found",
    );
    api_error(
        post(
            &format!("/v1/sandboxes/{gone}/timeout"),
            r#"{"timeout_secs":5}"#,
        ),
        404,
        "not_found",
    );
    api_error(
        post(
            &format!("/v1/sandboxes/{gone}/files/mkdir"),
            r#"{"path":"/tmp/x"}"#,
        ),
        404,
        "not_found",
    );
    // 413: a JSON body above 1 MiB.
    let big = format!(r#"{{"template":"{}"}}"#, "a".repeat(2 << 20));
    api_error(post("/v1/sandboxes", &big), 413, "too_large");
    // 422: limits above the daemon's maximum.
    api_error(
        post(
            "/v1/sandboxes",
            r#"{"limits":{"memory_bytes":1125899906842624}}"#,
        ),
        422,
        "limit_exceeded",
    );
    api_error(
        post("/v1/sandboxes", r#"{"limits":{"pids":100000000}}"#),
        422,
        "limit_exceeded",
    );
    api_error(
        post("/v1/sandboxes", r#"{"timeout_secs":100000000}"#),
        422,
        "limit_exceeded",
    );
    // 409: a destroyed sandbox.
    let dead = Sandbox::create(d, json!({}));
    let r = http.delete(dead.url("")).send().unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let final_info: Value = r.json().unwrap();
    assert_eq!(final_info["state"], "destroyed", "{final_info}");
    api_error(
        post(
            &format!("/v1/sandboxes/{}/exec", dead.id),
            r#"{"cmd":["true"]}"#,
        ),
        409,
        "conflict",
    );
    api_error(
        http.get(dead.url("/files/stat?path=/tmp")).send().unwrap(),
        409,
        "conflict",
    );
    // The daemon is still fine.
    assert_eq!(
        http.get(at(d, "/health")).send().unwrap().status().as_u16(),
        200
    );
}

#[test]
fn interrupting_an_interactive_exec_signals_the_process() {
    let Some(d) = daemon() else { return };
    let sb = Sandbox::create(d, json!({}));
    let mut child = Command::new(rampart_bin())
        .args([
            "exec",
            "--stdin",
            &sb.id,
            "--",
            "sh",
            "-c",
            "echo ready; exec sleep 100",
        ])
        .env("RAMPART_HOST", &d.url)
        .env("RAMPART_API_KEY", support::admin_key())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    // SAFETY: kill(2) on the CLI process this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = child.wait().unwrap();
    assert_eq!(
        status.code(),
        Some(128 + 15),
        "SIGINT is forwarded as SIGTERM"
    );
}

#[test]
fn watch_streams_changes_and_sse_streams_exec_events() {
    let Some(d) = daemon() else { return };
    let sb = Sandbox::create(d, json!({}));
    let http = client();
    let r = http
        .post(sb.url("/files/mkdir"))
        .json(&json!({"path": "/tmp/watched"}))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    let resp = http
        .get(sb.url("/files/watch?path=/tmp/watched"))
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let (tx, rx) = std::sync::mpsc::channel::<Value>();
    std::thread::spawn(move || {
        for line in BufReader::new(resp).lines() {
            let Ok(line) = line else { break };
            let Ok(v) = serde_json::from_str::<Value>(&line) else {
                break;
            };
            if tx.send(v).is_err() {
                break;
            }
        }
    });
    let r = http
        .put(sb.url("/files?path=/tmp/watched/new.txt"))
        .body("x")
        .send()
        .unwrap();
    assert!(r.status().is_success());
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(v) if v["name"] == "new.txt" => break,
            Ok(v) => seen.push(v),
            Err(_) => panic!("no watch event for new.txt; saw {seen:?}"),
        }
    }

    let text = http
        .post(sb.url("/exec"))
        .header("accept", "text/event-stream")
        .json(&json!({"cmd": ["echo", "sse"]}))
        .send()
        .unwrap()
        .text()
        .unwrap();
    assert!(text.contains("event: start"), "{text}");
    assert!(text.contains("event: exit"), "{text}");
}

#[test]
fn an_interrupted_run_still_destroys_its_sandbox() {
    let Some(d) = daemon() else { return };
    let tag = format!("runint{}", token());
    let mut child = Command::new(rampart_bin())
        .args([
            "run",
            "--metadata",
            &format!("t={tag}"),
            "--",
            "sh",
            "-c",
            "echo ready; exec sleep 100",
        ])
        .env("RAMPART_HOST", &d.url)
        .env("RAMPART_API_KEY", support::admin_key())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    // SAFETY: kill(2) on the CLI process this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    assert_eq!(child.wait().unwrap().code(), Some(130));
    let left: Value = client()
        .get(at(d, &format!("/v1/sandboxes?metadata=t%3D{tag}")))
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(
        left.as_array().unwrap().len(),
        0,
        "run left a sandbox: {left}"
    );
}

#[test]
fn the_file_api_acts_with_the_users_permissions() {
    let Some(d) = daemon() else { return };
    let sb = Sandbox::create(d, json!({}));
    let http = client();
    let v = sb.exec(json!({"cmd": ["sh", "-c",
        "printf secret > /root/secret; chmod 600 /root/secret; ls -ld /etc/shadow; cat /etc/shadow >/dev/null; echo cat=$?"],
        "user": "root"}));
    assert!(
        v["stdout"].as_str().unwrap_or_default().contains("cat=0"),
        "root cannot read /etc/shadow: {v}"
    );
    // The default user cannot read what `cat` as that user could not.
    let v = sb.sh("cat /etc/shadow >/dev/null 2>&1; echo $?");
    assert_eq!(v["stdout"], "1\n", "the user can cat /etc/shadow: {v}");
    api_error(
        http.get(sb.url("/files?path=/etc/shadow")).send().unwrap(),
        403,
        "permission_denied",
    );
    let r = http
        .get(sb.url("/files?path=/etc/shadow&user=root"))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    api_error(
        http.get(sb.url("/files?path=/root/secret")).send().unwrap(),
        403,
        "permission_denied",
    );
    api_error(
        http.get(sb.url("/files/list?path=/root")).send().unwrap(),
        403,
        "permission_denied",
    );
    api_error(
        http.get(sb.url("/files/stat?path=/root/secret"))
            .send()
            .unwrap(),
        403,
        "permission_denied",
    );
    api_error(
        http.put(sb.url("/files?path=/etc/evil"))
            .body("x")
            .send()
            .unwrap(),
        403,
        "permission_denied",
    );
    api_error(
        http.put(sb.url("/files?path=/root/secret"))
            .body("x")
            .send()
            .unwrap(),
        403,
        "permission_denied",
    );
    api_error(
        http.delete(sb.url("/files?path=/root/secret"))
            .send()
            .unwrap(),
        403,
        "permission_denied",
    );
    let r = http
        .post(sb.url("/files/mkdir"))
        .json(&json!({"path": "/etc/evil.d"}))
        .send()
        .unwrap();
    api_error(r, 403, "permission_denied");
    let r = http
        .post(sb.url("/files/move"))
        .json(&json!({"from": "/etc/hostname", "to": "/home/user/hostname"}))
        .send()
        .unwrap();
    api_error(r, 403, "permission_denied");
    api_error(
        http.get(sb.url("/files/watch?path=/root")).send().unwrap(),
        403,
        "permission_denied",
    );
    // Root keeps full access; the user's own files are the user's.
    let r = http
        .get(sb.url("/files?path=/root/secret&user=root"))
        .send()
        .unwrap();
    assert_eq!(r.text().unwrap(), "secret");
    let r = http
        .put(sb.url("/files?path=/home/user/new/mine.txt"))
        .body("mine")
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    let v: Value = r.json().unwrap();
    assert_eq!(
        (v["owner"].as_str(), v["group"].as_str()),
        (Some("user"), Some("user")),
        "{v}"
    );
    let v = sb.exec(json!({"cmd": ["stat", "-c", "%U:%G", "/home/user/new"]}));
    assert_eq!(v["stdout"], "user:user\n", "{v}");
}

#[test]
fn a_put_that_fills_the_disk_is_507_no_space() {
    let Some(d) = daemon() else { return };
    let sb = Sandbox::create(d, json!({"limits": {"disk_bytes": 16u64 << 20}}));
    let http = client();
    for i in 0..3 {
        // 64 MiB streamed (chunked) into a 16 MiB disk: the answer comes while still sending.
        let body = reqwest::blocking::Body::new(std::io::repeat(7).take(64 << 20));
        let r = http
            .put(sb.url(&format!("/files?path=/home/user/big{i}.bin")))
            .body(body)
            .send();
        let r = r.unwrap_or_else(|e| panic!("PUT {i}: no answer: {e}\n{}", d.log_tail()));
        let m = api_error(r, 507, "no_space");
        assert!(m.contains("disk space"), "{m}");
        // With a length, too.
        let body = reqwest::blocking::Body::sized(std::io::repeat(7).take(64 << 20), 64 << 20);
        let r = http
            .put(sb.url(&format!("/files?path=/home/user/sized{i}.bin")))
            .body(body)
            .send();
        let r = r.unwrap_or_else(|e| panic!("sized PUT {i}: no answer: {e}\n{}", d.log_tail()));
        api_error(r, 507, "no_space");
    }
    // The sandbox is fine once the space is back.
    let v = sb.sh("rm -f /home/user/big* /home/user/sized*; echo ok");
    assert_eq!(v["stdout"], "ok\n", "{v}");
    let r = http
        .put(sb.url("/files?path=/home/user/small.txt"))
        .body("fits")
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
}

#[test]
fn put_through_a_dangling_symlink_and_other_user_errors() {
    let Some(d) = daemon() else { return };
    let sb = Sandbox::create(d, json!({}));
    let http = client();
    let v = sb.sh("cd /home/user && ln -s /home/user/target.txt link && ln -s /nope/x.txt broken && ln -s loop loop && echo f > file");
    assert_eq!(v["exit_code"].as_i64(), Some(0), "{v}");
    // The target is created, like `echo > link` would.
    let r = http
        .put(sb.url("/files?path=/home/user/link"))
        .body("through")
        .send()
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().unwrap_or_default());
    let v = sb.exec(json!({"cmd": ["cat", "/home/user/target.txt"]}));
    assert_eq!(v["stdout"], "through", "{v}");
    // Its directory does not exist: 404 with a clear message, never a 500.
    let m = api_error(
        http.put(sb.url("/files?path=/home/user/broken"))
            .body("x")
            .send()
            .unwrap(),
        404,
        "not_found",
    );
    assert!(m.contains("symbolic link"), "{m}");
    // ENOTDIR, ELOOP, ENAMETOOLONG, EISDIR: 400.
    for p in [
        "/home/user/file/x",
        "/home/user/loop",
        &format!("/home/user/{}", "n".repeat(300)),
    ] {
        api_error(
            http.put(sb.url(&format!("/files?path={p}")))
                .body("x")
                .send()
                .unwrap(),
            400,
            "bad_request",
        );
    }
    api_error(
        http.get(sb.url("/files/stat?path=/home/user/file/x"))
            .send()
            .unwrap(),
        400,
        "bad_request",
    );
    api_error(
        http.get(sb.url("/files?path=/home/user/loop/x"))
            .send()
            .unwrap(),
        400,
        "bad_request",
    );
}

#[test]
fn a_recursive_watch_sees_a_file_in_a_brand_new_directory() {
    let Some(d) = daemon() else { return };
    let sb = Sandbox::create(d, json!({}));
    let http = client();
    let r = http
        .post(sb.url("/files/mkdir"))
        .json(&json!({"path": "/tmp/w"}))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    let resp = http
        .get(sb.url("/files/watch?path=/tmp/w&recursive=true"))
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let (tx, rx) = std::sync::mpsc::channel::<Value>();
    std::thread::spawn(move || {
        for line in BufReader::new(resp).lines() {
            let Ok(line) = line else { break };
            let Ok(v) = serde_json::from_str::<Value>(&line) else {
                break;
            };
            if tx.send(v).is_err() {
                break;
            }
        }
    });
    let v = sb
        .sh("for i in 1 2 3 4 5 6 7 8; do mkdir -p /tmp/w/d$i/e && echo x > /tmp/w/d$i/e/f; done");
    assert_eq!(v["exit_code"].as_i64(), Some(0), "{v}");
    let mut want: Vec<String> = (1..=8).map(|i| format!("d{i}/e/f")).collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen = Vec::new();
    while !want.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(v) => {
                if let Some(n) = v["name"].as_str() {
                    want.retain(|w| w != n);
                }
                seen.push(v);
            }
            Err(_) => panic!("no watch event for {want:?}; saw {seen:?}"),
        }
    }
}
