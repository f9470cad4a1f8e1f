//! Approvals against a real daemon: a sandbox whose policy holds `rm` and `git push`; the
//! held exec waits (waited, streamed, background, WebSocket-free roads all go through the
//! same gate) until a second key with the `approve` scope decides; approved runs exactly the
//! request, denied and timed out answer 403 `denied` and never start; a caller may not
//! approve its own request; the CLI lists and decides; every step is in the record, which
//! verifies.

mod support;

use reqwest::Method;
use serde_json::{json, Value};
use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

fn http() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(std::time::Duration::from_secs(120))
        .build()
        .unwrap()
}

fn call(url: &str, key: &str, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
    let mut r = http()
        .request(method, format!("{url}{path}"))
        .header("authorization", format!("Bearer {key}"));
    if let Some(b) = body {
        r = r.json(&b);
    }
    let resp = r.send().unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// A waited exec on its own thread (it blocks while the policy holds it): its answer.
fn exec_in_background(
    url: &str,
    key: &str,
    id: &str,
    cmd: Value,
) -> std::thread::JoinHandle<(u16, Value)> {
    let (url, key, path) = (
        url.to_owned(),
        key.to_owned(),
        format!("/v1/sandboxes/{id}/exec"),
    );
    std::thread::spawn(move || call(&url, &key, Method::POST, &path, Some(json!({"cmd": cmd}))))
}

fn make_key(data: &Path, scopes: &[&str]) -> String {
    let mut args = vec!["--native", "--name", "test"];
    for s in scopes {
        args.extend(["--scope", s]);
    }
    support::make_key(data, &args)
}

/// Fetches sandbox `id`'s bundle (with `key`) into `dir/bundle.json` and checks that both
/// `rampart audit verify` and the Python SDK's verifier accept it: the file and what the
/// CLI printed.
fn verify_bundle(url: &str, key: &str, id: &str, dir: &Path) -> (std::path::PathBuf, String) {
    let bundle = http()
        .get(format!("{url}/v1/sandboxes/{id}/audit/bundle"))
        .header("authorization", format!("Bearer {key}"))
        .send()
        .unwrap()
        .bytes()
        .unwrap();
    let file = dir.join("bundle.json");
    std::fs::write(&file, &bundle).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_rampart"))
        .args(["audit", "verify"])
        .arg(&file)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    let py = Command::new("python3")
        .arg(support::workspace().join("sdk/python/rampart/verify.py"))
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        py.status.success(),
        "{}{}",
        String::from_utf8_lossy(&py.stdout),
        String::from_utf8_lossy(&py.stderr)
    );
    (file, text)
}

/// Waits until exactly one approval of `sandbox` is pending, and returns it.
fn pending(url: &str, key: &str, sandbox: &str) -> Value {
    let mut found = Value::Null;
    support::wait_until("the request to be held for approval", 30, || {
        let (st, list) = call(url, key, Method::GET, "/v1/approvals", None);
        assert_eq!(st, 200, "{list}");
        let mine: Vec<&Value> = list
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a["sandbox_id"] == sandbox)
            .collect();
        if let [one] = mine.as_slice() {
            found = (*one).clone();
            return true;
        }
        false
    });
    found
}

#[test]
fn held_commands_wait_for_a_person() {
    if let Some(why) = support::skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let daemon = support::start_tidy("approvals");
    let d = &daemon;
    let url = d.url.clone();
    let agent = make_key(&d.data, &["sandboxes", "exec", "files", "audit"]);
    let approver = make_key(&d.data, &["approve", "audit"]);
    let both = make_key(&d.data, &["sandboxes", "exec", "approve"]);

    // Bad policies: 400 naming the pattern; nothing made.
    let before = call(&url, &agent, Method::GET, "/v1/sandboxes", None).1;
    for (policy, what) in [
        (json!({"commands": ["(unclosed"]}), "commands[0]"),
        (
            json!({"commands": ["ok"], "timeout_secs": 0}),
            "timeout_secs",
        ),
        (json!({"commands": ["ok"], "hostz": []}), "hostz"),
    ] {
        let (st, body) = call(
            &url,
            &agent,
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"approvals": policy})),
        );
        assert_eq!(st, 400, "{policy}: {body}");
        assert!(body.to_string().contains(what), "{policy}: {body}");
    }
    assert_eq!(
        call(&url, &agent, Method::GET, "/v1/sandboxes", None).1,
        before
    );

    let (st, sb) = call(
        &url,
        &agent,
        Method::POST,
        "/v1/sandboxes",
        Some(json!({
            "timeout_secs": 300,
            "approvals": {"commands": ["^rm( |$)", "^git push"], "timeout_secs": 20},
        })),
    );
    assert_eq!(st, 201, "{sb}");
    let id = sb["id"].as_str().unwrap().to_owned();
    let exec = |key: &str, cmd: Value| {
        call(
            &url,
            key,
            Method::POST,
            &format!("/v1/sandboxes/{id}/exec"),
            Some(json!({"cmd": cmd})),
        )
    };
    // Not matching: runs at once.
    let (st, r) = exec(
        &agent,
        json!(["sh", "-c", "touch /tmp/a /tmp/b /tmp/c; echo made"]),
    );
    assert_eq!((st, r["stdout"].as_str()), (200, Some("made\n")), "{r}");

    // Approved: the waited exec runs, exactly as asked.
    let waiter = exec_in_background(&url, &agent, &id, json!(["rm", "-v", "/tmp/a"]));
    let held = pending(&url, &approver, &id);
    assert_eq!(held["kind"], "command");
    assert_eq!(held["request"], "rm -v /tmp/a");
    assert_eq!(held["rule"], "^rm( |$)");
    assert!(
        held["requested_by"].as_str().unwrap().starts_with("key:"),
        "{held}"
    );
    let ap = held["id"].as_str().unwrap().to_owned();
    // A key without the approve scope may neither list nor decide.
    let (st, _) = call(&url, &agent, Method::GET, "/v1/approvals", None);
    assert_eq!(st, 403);
    let (st, _) = call(
        &url,
        &agent,
        Method::POST,
        &format!("/v1/approvals/{ap}/approve"),
        None,
    );
    assert_eq!(st, 403);
    let (st, dec) = call(
        &url,
        &approver,
        Method::POST,
        &format!("/v1/approvals/{ap}/approve"),
        Some(json!({"reason": "cleanup is fine"})),
    );
    assert_eq!(
        (st, dec["decision"].as_str()),
        (200, Some("approved")),
        "{dec}"
    );
    let (st, r) = waiter.join().unwrap();
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["stdout"], "removed '/tmp/a'\n", "{r}");
    // Decided: a second decision is a conflict; an unknown id is not found.
    let (st, _) = call(
        &url,
        &approver,
        Method::POST,
        &format!("/v1/approvals/{ap}/deny"),
        None,
    );
    assert_eq!(st, 409);
    let (st, _) = call(
        &url,
        &approver,
        Method::GET,
        "/v1/approvals/ap_000000000000000000000000",
        None,
    );
    assert_eq!(st, 404);

    // Denied, through the CLI: 403 `denied` with the reason; it never started.
    let waiter = exec_in_background(&url, &agent, &id, json!(["bash", "-lc", "rm /tmp/b"]));
    let held = pending(&url, &approver, &id);
    let ap2 = held["id"].as_str().unwrap().to_owned();
    let cli = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_rampart"))
            .args(args)
            .env("RAMPART_HOST", &url)
            .env("RAMPART_API_KEY", &approver)
            .env_remove("RAMPART_SOCKET")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let ls = cli(&["approvals"]);
    assert!(String::from_utf8_lossy(&ls.stdout).contains(&ap2), "{ls:?}");
    let out = cli(&["deny", &ap2, "--reason", "not today"]);
    assert!(out.status.success(), "{out:?}");
    let (st, r) = waiter.join().unwrap();
    assert_eq!(
        (st, r["error"]["code"].as_str()),
        (403, Some("denied")),
        "{r}"
    );
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not today"),
        "{r}"
    );
    let (_, r) = exec(&agent, json!(["ls", "/tmp/b"]));
    assert_eq!(r["exit_code"], 0, "denied, so /tmp/b is still there: {r}");

    // A caller may not approve its own request.
    let waiter = exec_in_background(&url, &both, &id, json!(["git", "push"]));
    let held = pending(&url, &approver, &id);
    let ap3 = held["id"].as_str().unwrap().to_owned();
    let (st, body) = call(
        &url,
        &both,
        Method::POST,
        &format!("/v1/approvals/{ap3}/approve"),
        None,
    );
    assert_eq!(st, 403, "{body}");
    assert!(body.to_string().contains("its own request"), "{body}");
    call(
        &url,
        &approver,
        Method::POST,
        &format!("/v1/approvals/{ap3}/deny"),
        None,
    );
    assert_eq!(waiter.join().unwrap().0, 403);

    // Streamed: `pending_approval` comes first, then the events once approved.
    let resp = http()
        .post(format!("{url}/v1/sandboxes/{id}/exec"))
        .header("authorization", format!("Bearer {agent}"))
        .header("accept", "application/x-ndjson")
        .json(&json!({"cmd": ["rm", "-v", "/tmp/c"]}))
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let mut lines = BufReader::new(resp).lines();
    let first: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(first["type"], "pending_approval", "{first}");
    let ap4 = first["approval_id"].as_str().unwrap().to_owned();
    call(
        &url,
        &approver,
        Method::POST,
        &format!("/v1/approvals/{ap4}/approve"),
        None,
    );
    let rest: Vec<Value> = lines
        .map(|l| serde_json::from_str(&l.unwrap()).unwrap())
        .collect();
    assert_eq!(rest.first().unwrap()["type"], "start", "{rest:?}");
    assert_eq!(rest.last().unwrap()["type"], "exit", "{rest:?}");

    // Nobody decides: refused when the policy's timeout passes (a background process: the
    // create call itself waits).
    let (st, body) = call(
        &url,
        &agent,
        Method::POST,
        "/v1/sandboxes",
        Some(json!({"approvals": {"commands": ["^rm"], "timeout_secs": 1}})),
    );
    assert_eq!(st, 201, "{body}");
    let quick = body["id"].as_str().unwrap().to_owned();
    let (st, r) = call(
        &url,
        &agent,
        Method::POST,
        &format!("/v1/sandboxes/{quick}/processes"),
        Some(json!({"cmd": ["rm", "-rf", "/tmp"]})),
    );
    assert_eq!(
        (st, r["error"]["code"].as_str()),
        (403, Some("denied")),
        "{r}"
    );
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no decision within 1 s"),
        "{r}"
    );

    // The record: each request, each decision, and the exec that ran under its approval.
    let (_, page) = call(
        &url,
        &approver,
        Method::GET,
        &format!("/v1/sandboxes/{id}/audit?limit=1000"),
        None,
    );
    let events = page["events"].as_array().unwrap();
    let of = |t: &str| -> Vec<&Value> {
        events
            .iter()
            .filter(|e| e["body"]["type"] == t)
            .map(|e| &e["body"])
            .collect()
    };
    assert_eq!(of("approval_requested").len(), 4, "{page}");
    let decided: Vec<(&str, &str)> = of("approval_decided")
        .iter()
        .map(|b| {
            (
                b["approval_id"].as_str().unwrap(),
                b["decision"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        decided,
        vec![
            (ap.as_str(), "approved"),
            (ap2.as_str(), "denied"),
            (ap3.as_str(), "denied"),
            (ap4.as_str(), "approved")
        ]
    );
    let ran: Vec<&Value> = of("exec")
        .into_iter()
        .filter(|b| b.get("approval").is_some())
        .collect();
    assert_eq!(ran.len(), 2, "two ran under an approval: {ran:?}");
    // Each is recorded as asked by the agent's key, whether its client waited or streamed.
    for r in &ran {
        let by = r["caller"].as_str().unwrap_or_default();
        assert!(
            by.starts_with("key:") && by.contains("(audit,exec,files,sandboxes)"),
            "{r}"
        );
    }
    assert_eq!(ran[0]["approval"], ap.as_str());
    assert_eq!(ran[0]["argv"], json!(["rm", "-v", "/tmp/a"]));
    assert!(
        !of("exec")
            .iter()
            .any(|b| b["argv"] == json!(["bash", "-lc", "rm /tmp/b"])),
        "the denied one never ran"
    );
    // Both verifiers accept it (the Python one checks the approvals too), and the CLI says
    // who authorized what: the principal that asked, and the approval.
    let (file, text) = verify_bundle(&url, &approver, &id, &d.root);
    assert!(
        text.contains(&format!("approved [{ap}]")) && text.contains("asked by key:"),
        "{text}"
    );
    // The DSSE export: `rampart audit export --format dsse`, verified by the CLI and by a
    // standard library (securesystemslib) with the node key; one byte changed fails both.
    let (_, key) = call(&url, &approver, Method::GET, "/v1/audit/key", None);
    let (pubkey, keyid) = (
        key["public_key"].as_str().unwrap().to_owned(),
        key["key_id"].as_str().unwrap().to_owned(),
    );
    let env_file = d.root.join("session.dsse.json");
    let out = Command::new(env!("CARGO_BIN_EXE_rampart"))
        .args(["audit", "export", &id, "--format", "dsse", "-o"])
        .arg(&env_file)
        .env("RAMPART_HOST", &url)
        .env("RAMPART_API_KEY", &approver)
        .env_remove("RAMPART_SOCKET")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let envelope: Value = serde_json::from_slice(&std::fs::read(&env_file).unwrap()).unwrap();
    assert_eq!(envelope["payloadType"], "application/vnd.in-toto+json");
    let verify_cli = |f: &Path| {
        Command::new(env!("CARGO_BIN_EXE_rampart"))
            .args(["audit", "verify"])
            .arg(f)
            .args(["--key", &pubkey])
            .output()
            .unwrap()
    };
    let ok = verify_cli(&env_file);
    let text = String::from_utf8_lossy(&ok.stdout).into_owned();
    assert!(
        ok.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(
        text.contains("VERIFIED DSSE envelope") && text.contains(&format!("approved [{ap}]")),
        "{text}"
    );
    let py = support::venv_python("RAMPART_SDK_VENV", "sdk-venv");
    let sslib = Command::new(&py)
        .args(["-c", "import securesystemslib.dsse"])
        .status()
        .is_ok_and(|s| s.success());
    let standard = |f: &Path| {
        Command::new(&py)
            .arg(support::workspace().join("tests/dsse/verify_dsse.py"))
            .arg(f)
            .args([&pubkey, &keyid])
            .output()
            .unwrap()
    };
    if sslib {
        let r = standard(&env_file);
        let text = String::from_utf8_lossy(&r.stdout).into_owned();
        assert!(
            r.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&r.stderr)
        );
        assert!(text.starts_with("VERIFIED rampart-sandbox:"), "{text}");
        eprintln!("securesystemslib: {text}");
    } else {
        eprintln!("securesystemslib is not in {} (scripts/python-sdk.sh installs it): only the CLI checked the envelope", py.display());
    }
    // The node log's head as a C2SP checkpoint (signed note), checked against the spec.
    let cp = http()
        .get(format!("{url}/v1/audit/checkpoint"))
        .header("authorization", format!("Bearer {approver}"))
        .send()
        .unwrap();
    assert_eq!(cp.status().as_u16(), 200);
    let vkey = cp.headers()["x-rampart-note-key"]
        .to_str()
        .unwrap()
        .to_owned();
    let note = cp.text().unwrap();
    let note_file = d.root.join("checkpoint.txt");
    std::fs::write(&note_file, &note).unwrap();
    if sslib {
        let check = |f: &Path| {
            Command::new(&py)
                .arg(support::workspace().join("tests/dsse/verify_checkpoint.py"))
                .arg(f)
                .arg(&vkey)
                .output()
                .unwrap()
        };
        let r = check(&note_file);
        let text = String::from_utf8_lossy(&r.stdout).into_owned();
        assert!(
            r.status.success() && text.starts_with("VERIFIED rampart/"),
            "{text}{note}"
        );
        eprintln!("checkpoint: {text}");
        std::fs::write(&note_file, note.replacen('\n', "\n9", 1)).unwrap();
        assert!(
            !check(&note_file).status.success(),
            "a changed checkpoint must not verify"
        );
    }
    // One byte of the payload changed (a command's exit code in the statement).
    let mut bad = envelope.clone();
    let payload = base64_decode(bad["payload"].as_str().unwrap());
    let text =
        String::from_utf8(payload)
            .unwrap()
            .replacen("\"exit_code\":0", "\"exit_code\":1", 1);
    bad["payload"] = json!(base64_encode(text.as_bytes()));
    let bad_file = d.root.join("bad.dsse.json");
    std::fs::write(&bad_file, serde_json::to_vec(&bad).unwrap()).unwrap();
    assert!(
        !verify_cli(&bad_file).status.success(),
        "a changed statement must not verify"
    );
    if sslib {
        let r = standard(&bad_file);
        assert!(
            !r.status.success(),
            "{}",
            String::from_utf8_lossy(&r.stdout)
        );
        assert!(String::from_utf8_lossy(&r.stdout).starts_with("NOT VERIFIED"));
    }

    // An exec that claims an approval nobody gave is caught by the verifier.
    let mut b: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let first_decided = b["events"]
        .as_array()
        .unwrap()
        .iter()
        .position(|e| e["body"]["type"] == "approval_decided")
        .unwrap();
    b["events"][first_decided]["body"]["decision"] = json!("denied");
    std::fs::write(&file, serde_json::to_vec(&b).unwrap()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_rampart"))
        .args(["audit", "verify"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(!out.status.success(), "a changed decision must not verify");
}

fn base64_decode(s: &str) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.decode(s).unwrap()
}

fn base64_encode(b: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(b)
}

/// The policy is kept with the sandbox: after the daemon is killed and restarted, the
/// re-attached sandbox still holds what its policy names (read back from its create request).
#[test]
fn the_policy_survives_a_daemon_restart() {
    if let Some(why) = support::skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let mut d = support::start_tidy("approvals-restart");
    let agent = make_key(&d.data, &["sandboxes", "exec"]);
    let (st, sb) = call(
        &d.url,
        &agent,
        Method::POST,
        "/v1/sandboxes",
        Some(json!({"timeout_secs": 300, "approvals": {"commands": ["^rm "], "timeout_secs": 1}})),
    );
    assert_eq!(st, 201, "{sb}");
    let id = sb["id"].as_str().unwrap().to_owned();
    let port: u16 = d.url.rsplit(':').next().unwrap().parse().unwrap();
    // SAFETY: kill(2) on the pid of the daemon this test spawned, not yet reaped.
    unsafe { libc::kill(d.daemon.child.id() as i32, libc::SIGKILL) };
    let _ = d.daemon.child.wait();
    d.daemon = support::start(&d.data, port, &[]);
    let (st, info) = call(
        &d.url,
        &agent,
        Method::GET,
        &format!("/v1/sandboxes/{id}"),
        None,
    );
    assert_eq!(
        (st, info["state"].as_str()),
        (200, Some("running")),
        "{info}"
    );
    let (st, r) = call(
        &d.url,
        &agent,
        Method::POST,
        &format!("/v1/sandboxes/{id}/exec"),
        Some(json!({"cmd": ["rm", "-f", "/tmp/x"]})),
    );
    assert_eq!(
        (st, r["error"]["code"].as_str()),
        (403, Some("denied")),
        "{r}"
    );
    let (st, r) = call(
        &d.url,
        &agent,
        Method::POST,
        &format!("/v1/sandboxes/{id}/exec"),
        Some(json!({"cmd": ["true"]})),
    );
    assert_eq!(st, 200, "not held: {r}");
    // Every event names who it was for and the policy in force; the restarted daemon read
    // the policy back from the record, so its events name the same digest, and it verifies.
    let admin = support::admin_key();
    let (st, log) = call(
        &d.url,
        admin,
        Method::GET,
        &format!("/v1/sandboxes/{id}/audit?limit=10000"),
        None,
    );
    assert_eq!(st, 200, "{log}");
    let events = log["events"].as_array().unwrap();
    let digests: std::collections::BTreeSet<&str> = events
        .iter()
        .map(|e| {
            e["auth"]["policy"]
                .as_str()
                .unwrap_or_else(|| panic!("{e}"))
        })
        .collect();
    assert_eq!(digests.len(), 1, "one policy all along: {digests:?}");
    assert_eq!(
        events[0]["body"]["spec"]["approvals"]["commands"],
        json!(["^rm "]),
        "the record holds the approval policy its digests name"
    );
    for e in events {
        let who = e["auth"]["principal"].as_str().unwrap();
        match e["body"]["type"].as_str().unwrap() {
            "created" | "exec" | "exit" | "approval_requested" => {
                assert!(who.starts_with("key:"), "{e}")
            }
            _ => {}
        }
    }
    verify_bundle(&d.url, admin, &id, &d.root);
}

/// The test internet of [`held_connections_wait_for_a_person`]: DNS for the names of
/// The test hosts (`*.approvals.test`): [`support::TestHosts`].
struct Hosts;

const HOSTS_SIDE: &str = "203.0.113.17/29";
const HOSTS_ADDR: &str = "203.0.113.18";

impl Hosts {
    fn start(dir: &Path) -> Option<support::TestHosts> {
        support::TestHosts::start(dir, "apr", HOSTS_SIDE, HOSTS_ADDR, "approvals.test")
    }
}

/// A webhook receiver on loopback: each POST's headers and body, answered 200.
/// A request the webhook receiver got: its headers (names lowercase) and body.
type Delivery = (Vec<(String, String)>, Vec<u8>);

fn webhook_receiver() -> (u16, std::sync::mpsc::Receiver<Delivery>) {
    use std::io::{Read as _, Write as _};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let mut r = BufReader::new(s.try_clone().unwrap());
            let mut line = String::new();
            if r.read_line(&mut line).unwrap_or(0) == 0 {
                continue;
            }
            let mut headers = Vec::new();
            loop {
                let mut h = String::new();
                r.read_line(&mut h).unwrap_or(0);
                let h = h.trim_end();
                if h.is_empty() {
                    break;
                }
                if let Some((k, v)) = h.split_once(':') {
                    headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
                }
            }
            let len: usize = headers
                .iter()
                .find(|(k, _)| k == "content-length")
                .and_then(|(_, v)| v.parse().ok())
                .unwrap_or(0);
            let mut body = vec![0; len];
            let _ = r.read_exact(&mut body);
            let _ =
                s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
            if tx.send((headers, body)).is_err() {
                return;
            }
        }
    });
    (port, rx)
}

/// HMAC-SHA256 (RFC 2104) of `msg` under `key`, hex.
fn hmac_sha256(key: &[u8], msg: &[u8]) -> String {
    use sha2::{Digest as _, Sha256};
    let mut k = [0u8; 64];
    k[..key.len()].copy_from_slice(key);
    let pad = |b: u8| k.iter().map(|x| x ^ b).collect::<Vec<u8>>();
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(msg)
        .finalize();
    let outer = Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize();
    outer.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn held_connections_wait_for_a_person() {
    if let Some(why) = support::skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let Some(_hosts) = Hosts::start(tmp.path()) else {
        eprintln!("skipped: could not make the test hosts (ip netns)");
        return;
    };
    let (hook_port, hooks) = webhook_receiver();
    let secret = "whsec-test-1";
    let config = tmp.path().join("rampart.toml");
    std::fs::write(
        &config,
        format!(
            "[approvals]\nwebhook_url = \"http://127.0.0.1:{hook_port}/hook\"\nwebhook_secret = \"{secret}\"\n"
        ),
    )
    .unwrap();
    let t = (std::process::id().wrapping_mul(11) + 5) % 250;
    let table = format!("rampart_apr_{}", std::process::id());
    let _table = support::TableGuard(table.clone());
    let pool = format!("10.252.{t}.0/24");
    let prefix = format!("ra{t}z");
    let upstream = format!("{HOSTS_ADDR}:53");
    let d = support::start_tidy_with(
        "approvals-hosts",
        &[
            ("RAMPART_CONFIG", config.to_str().unwrap()),
            ("RAMPART_NET_POOL", pool.as_str()),
            ("RAMPART_NET_LINK_PREFIX", prefix.as_str()),
            ("RAMPART_NET_TABLE", table.as_str()),
            ("RAMPART_NET_DNS_PORT", "0"),
            ("RAMPART_NET_PROXY_PORT", "0"),
            ("RAMPART_NET_UPSTREAM_DNS", upstream.as_str()),
        ],
    );
    let url = d.url.clone();
    let agent = make_key(&d.data, &["sandboxes", "exec", "audit"]);
    let approver = make_key(&d.data, &["approve", "audit"]);

    // A host pattern that is an address, or not a host: 400 naming it.
    for bad in ["10.0.0.0/8", "not a host!"] {
        let (st, body) = call(
            &url,
            &agent,
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"network": {"mode": "allowlist"}, "approvals": {"hosts": [bad]}})),
        );
        assert_eq!(st, 400, "{bad}: {body}");
        assert!(body.to_string().contains("hosts[0]"), "{bad}: {body}");
    }

    let (st, sb) = call(
        &url,
        &agent,
        Method::POST,
        "/v1/sandboxes",
        Some(json!({
            "timeout_secs": 300,
            "network": {"mode": "allowlist", "deny": ["blocked.approvals.test"]},
            "approvals": {"hosts": ["*.approvals.test"], "timeout_secs": 60},
        })),
    );
    assert_eq!(st, 201, "{sb}");
    let id = sb["id"].as_str().unwrap().to_owned();
    let curl = |host: &str| {
        json!([
            "sh",
            "-c",
            format!("curl -s -m 100 -w ' %{{http_code}}' http://{host}/")
        ])
    };

    // Held: the connection waits (nothing reached the host) until approved.
    let waiter = exec_in_background(&url, &agent, &id, curl("a.approvals.test"));
    let held = pending(&url, &approver, &id);
    assert_eq!(held["kind"], "host", "{held}");
    assert_eq!(held["request"], "a.approvals.test:80", "{held}");
    assert_eq!(held["rule"], "*.approvals.test", "{held}");
    assert!(
        held["requested_by"].as_str().unwrap().contains(&id),
        "the sandbox asked: {held}"
    );
    let ap = held["id"].as_str().unwrap().to_owned();
    // The webhook was told, signed over the time and the body.
    let (headers, body) = hooks
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("the webhook is told of the held connection");
    let header = |k: &str| {
        headers
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    assert_eq!(header("x-rampart-event"), "approval.requested");
    let notice: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(notice["type"], "approval.requested", "{notice}");
    assert_eq!(notice["approval"]["id"], ap.as_str(), "{notice}");
    let sig = header("x-rampart-signature");
    let (t, v1) = sig
        .strip_prefix("t=")
        .and_then(|r| r.split_once(",v1="))
        .unwrap_or_else(|| panic!("signature {sig:?}"));
    let mut signed = format!("{t}.").into_bytes();
    signed.extend_from_slice(&body);
    assert_eq!(v1, hmac_sha256(secret.as_bytes(), &signed), "{sig}");
    assert_ne!(
        v1,
        hmac_sha256(b"another secret", &signed),
        "the check can fail"
    );

    let (st, dec) = call(
        &url,
        &approver,
        Method::POST,
        &format!("/v1/approvals/{ap}/approve"),
        Some(json!({"reason": "our test host"})),
    );
    assert_eq!(
        (st, dec["decision"].as_str()),
        (200, Some("approved")),
        "{dec}"
    );
    let (st, r) = waiter.join().unwrap();
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["stdout"], "hello a.approvals.test\n 200", "{r}");
    let (_, body) = hooks
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("the webhook is told of the decision");
    let notice: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(notice["type"], "approval.decided", "{notice}");
    assert_eq!(notice["decision"]["decision"], "approved", "{notice}");

    // The decision holds for the host: the next connection is not asked about.
    let (st, r) = call(
        &url,
        &agent,
        Method::POST,
        &format!("/v1/sandboxes/{id}/exec"),
        Some(json!({"cmd": curl("a.approvals.test")})),
    );
    assert_eq!(
        (st, r["stdout"].as_str()),
        (200, Some("hello a.approvals.test\n 200")),
        "{r}"
    );

    // Denied: refused (the proxy answers 403 to plain HTTP), and stays refused.
    let waiter = exec_in_background(&url, &agent, &id, curl("b.approvals.test"));
    let held = pending(&url, &approver, &id);
    assert_eq!(held["request"], "b.approvals.test:80", "{held}");
    let bp = held["id"].as_str().unwrap().to_owned();
    let (st, _) = call(
        &url,
        &approver,
        Method::POST,
        &format!("/v1/approvals/{bp}/deny"),
        Some(json!({"reason": "not this one"})),
    );
    assert_eq!(st, 200);
    let (st, r) = waiter.join().unwrap();
    assert_eq!(st, 200, "{r}");
    let out = r["stdout"].as_str().unwrap();
    assert!(out.ends_with(" 403") && !out.contains("hello"), "{r}");
    let (_, r) = call(
        &url,
        &agent,
        Method::POST,
        &format!("/v1/sandboxes/{id}/exec"),
        Some(json!({"cmd": curl("b.approvals.test")})),
    );
    assert!(r["stdout"].as_str().unwrap().ends_with(" 403"), "{r}");
    // A deny rule is never asked about; neither is a name outside the patterns.
    for host in ["blocked.approvals.test", "example.org"] {
        let (_, r) = call(
            &url,
            &agent,
            Method::POST,
            &format!("/v1/sandboxes/{id}/exec"),
            Some(json!({"cmd": curl(host)})),
        );
        assert!(
            !r["stdout"].as_str().unwrap().contains("hello"),
            "{host}: {r}"
        );
    }
    let (_, list) = call(&url, &approver, Method::GET, "/v1/approvals", None);
    assert_eq!(list, json!([]), "nothing else was asked about");

    // The record: each request and decision, and the connections named by their approval.
    let (st, log) = call(
        &url,
        &approver,
        Method::GET,
        &format!("/v1/sandboxes/{id}/audit?limit=10000"),
        None,
    );
    assert_eq!(st, 200, "{log}");
    let events = log["events"].as_array().unwrap_or_else(|| panic!("{log}"));
    let bodies: Vec<&Value> = events.iter().map(|e| &e["body"]).collect();
    let asked: Vec<&&Value> = bodies
        .iter()
        .filter(|b| b["type"] == "approval_requested")
        .collect();
    assert_eq!(asked.len(), 2, "{bodies:?}");
    assert!(asked.iter().all(|b| b["kind"] == "host"), "{asked:?}");
    let decided: Vec<(String, String)> = bodies
        .iter()
        .filter(|b| b["type"] == "approval_decided")
        .map(|b| {
            (
                b["approval_id"].as_str().unwrap().to_owned(),
                b["decision"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        decided,
        vec![
            (ap.clone(), "approved".into()),
            (bp.clone(), "denied".into())
        ]
    );
    // Both verifiers accept it (each checks that a connection let through names an
    // approval of its host: see the chain's unit tests for the records they refuse).
    verify_bundle(&url, &approver, &id, tmp.path());
}

#[test]
fn a_tenants_policy_holds_every_sandbox_of_it() {
    if let Some(why) = support::skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let d = support::start_tidy("approvals-tenant");
    let url = d.url.clone();
    let admin = support::admin_key();
    // A bad default is refused with the reason, and no tenant is made.
    let (st, body) = call(
        &url,
        admin,
        Method::POST,
        "/v1/tenants",
        Some(json!({"name": "acme", "approvals": {"commands": ["(bad"]}})),
    );
    assert_eq!(st, 400, "{body}");
    assert!(body.to_string().contains("commands[0]"), "{body}");
    assert_eq!(
        call(&url, admin, Method::GET, "/v1/tenants", None).1,
        json!([])
    );
    let (st, t) = call(
        &url,
        admin,
        Method::POST,
        "/v1/tenants",
        Some(json!({"name": "acme", "approvals": {"commands": ["^rm "], "timeout_secs": 1}})),
    );
    assert_eq!(st, 201, "{t}");
    assert_eq!(t["approvals"]["commands"], json!(["^rm "]), "{t}");
    let key = support::make_key(&d.data, &["--tenant", "acme"]);
    // A sandbox with no policy of its own, and one with its own: both are held to `^rm `.
    for own in [
        Value::Null,
        json!({"commands": ["^git push"], "allow_self_approval": true}),
    ] {
        let mut body = json!({"timeout_secs": 120});
        if !own.is_null() {
            body["approvals"] = own.clone();
        }
        let (st, sb) = call(&url, &key, Method::POST, "/v1/sandboxes", Some(body));
        assert_eq!(st, 201, "{sb}");
        let id = sb["id"].as_str().unwrap();
        let (st, r) = call(
            &url,
            &key,
            Method::POST,
            &format!("/v1/sandboxes/{id}/exec"),
            Some(json!({"cmd": ["rm", "-f", "/tmp/x"]})),
        );
        assert_eq!(
            (st, r["error"]["code"].as_str()),
            (403, Some("denied")),
            "{own}: {r}"
        );
        assert!(r.to_string().contains("timed_out"), "{r}");
        let (st, _) = call(
            &url,
            &key,
            Method::POST,
            &format!("/v1/sandboxes/{id}/exec"),
            Some(json!({"cmd": ["true"]})),
        );
        assert_eq!(st, 200);
    }
    // The E2B face is held to it too: a tenant's E2B key, a sandbox made through the E2B
    // API, a command started through envd (as `commands.run` does) is refused.
    let e2b_key = support::make_key(&d.data, &["--e2b", "--tenant", "acme"]);
    let r = http()
        .post(format!("{url}/sandboxes"))
        .header("x-api-key", &e2b_key)
        .json(&json!({"templateID": "base", "timeout": 120}))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    let v: Value = r.json().unwrap();
    let start = |args: Value| {
        let msg =
            serde_json::to_vec(&json!({"process": {"cmd": "/bin/sh", "args": args}})).unwrap();
        let mut body = vec![0u8];
        body.extend_from_slice(&(msg.len() as u32).to_be_bytes());
        body.extend_from_slice(&msg);
        let r = http()
            .post(format!("{url}/process.Process/Start"))
            .header("e2b-sandbox-id", v["sandboxID"].as_str().unwrap())
            .header("x-access-token", v["envdAccessToken"].as_str().unwrap())
            .header("content-type", "application/connect+json")
            .body(body)
            .send()
            .unwrap();
        (
            r.status().as_u16(),
            String::from_utf8_lossy(&r.bytes().unwrap()).into_owned(),
        )
    };
    let (_, text) = start(json!(["-c", "rm -f /tmp/x"]));
    assert!(
        text.contains("permission_denied") && text.contains("timed_out"),
        "{text}"
    );
    let (st, text) = start(json!(["-c", "true"]));
    assert!(
        st == 200 && !text.contains("permission_denied"),
        "{st} {text}"
    );
    // The node's own sandboxes are not the tenant's: not held.
    let (st, sb) = call(&url, admin, Method::POST, "/v1/sandboxes", Some(json!({})));
    assert_eq!(st, 201, "{sb}");
    let (st, r) = call(
        &url,
        admin,
        Method::POST,
        &format!("/v1/sandboxes/{}/exec", sb["id"].as_str().unwrap()),
        Some(json!({"cmd": ["rm", "-f", "/tmp/x"]})),
    );
    assert_eq!(st, 200, "{r}");
    // Removed (DELETE): new sandboxes of the tenant are no longer held.
    let (st, t) = call(
        &url,
        admin,
        Method::DELETE,
        "/v1/tenants/acme/approvals",
        None,
    );
    assert_eq!(st, 200, "{t}");
    assert!(t.get("approvals").is_none(), "{t}");
    let (st, sb) = call(&url, &key, Method::POST, "/v1/sandboxes", Some(json!({})));
    assert_eq!(st, 201, "{sb}");
    let (st, r) = call(
        &url,
        &key,
        Method::POST,
        &format!("/v1/sandboxes/{}/exec", sb["id"].as_str().unwrap()),
        Some(json!({"cmd": ["rm", "-f", "/tmp/x"]})),
    );
    assert_eq!(st, 200, "{r}");
    let (st, _) = call(
        &url,
        admin,
        Method::PUT,
        "/v1/tenants/nosuch/approvals",
        Some(json!({"commands": ["x"]})),
    );
    assert_eq!(st, 404);
}
