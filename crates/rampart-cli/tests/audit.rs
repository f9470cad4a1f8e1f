//! The audit record end to end (tier 2): a real daemon, real sandboxes, the real CLI.
//!
//! - a session (create, exec with stdin, file write/move/remove/mkdir, timeout change,
//!   destroy) is exported and verified by `rampart audit verify` with the key the daemon
//!   serves; one flipped byte makes verification fail, naming the record;
//! - `kill -9` of the daemon during a burst of execs: after a restart on the same data
//!   directory every acknowledged exec is in the log and the bundle verifies;
//! - replay: deterministic steps match; a step printing `date +%N` is divergent.
//!
//! Needs root and the `rampart-jailer` / `rampart-agent` binaries next to `rampart`; otherwise
//! it prints `skipped: <reason>`. The tests run one at a time (each starts its own daemon).

mod support;

use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::Output;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use support::{client, free_port, skip_reason, start, Api as _, Daemon, Sandbox};

static SERIAL: Mutex<()> = Mutex::new(());

/// One warm jailer is enough for these tests.
const POOL: &[(&str, &str)] = &[("RAMPART_JAIL_POOL", "1")];

fn temp(name: &str) -> PathBuf {
    let root = std::env::temp_dir().join(format!("rampart-audit-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(root.join("data")).unwrap();
    root
}

fn create(d: &Daemon) -> Sandbox {
    Sandbox::create(
        d,
        json!({"timeout_secs": 600, "env": {"SECRET_TOKEN": "do-not-record"}}),
    )
}

/// A sandbox whose network allows only `api.example.com`, or `None` (skip, said why) where
/// sandbox networks are unavailable.
fn create_allowlisted(d: &Daemon) -> Option<Sandbox> {
    let r = client()
        .post(format!("{}/v1/sandboxes", d.url))
        .json(&json!({"timeout_secs": 600,
            "network": {"mode": "allowlist", "allow": ["api.example.com"]}}))
        .send()
        .unwrap();
    let status = r.status().as_u16();
    if status != 201 {
        let body = r.text().unwrap();
        // Only the daemon's own "unsupported" answer is a reason to skip; anything else is a
        // failure, not a silent pass.
        assert!(
            status == 503 && body.contains("unsupported"),
            "create with a network: {status} {body}"
        );
        eprintln!("skipped: sandbox networks unavailable here: {body}");
        return None;
    }
    Some(Sandbox::adopt(
        d,
        r.json::<Value>().unwrap()["id"].as_str().unwrap(),
    ))
}

/// A sandbox's whole audit log, as `GET /v1/sandboxes/{id}/audit` answers it.
fn audit_log(d: &Daemon, id: &str) -> Value {
    client()
        .get(format!("{}/v1/sandboxes/{id}/audit", d.url))
        .send()
        .unwrap()
        .json()
        .unwrap()
}

fn key(d: &Daemon) -> String {
    let v: Value = client()
        .get(format!("{}/v1/audit/key", d.url))
        .send()
        .unwrap()
        .json()
        .unwrap();
    v["public_key"].as_str().unwrap().to_owned()
}

/// The CLI where no daemon answers (commands that need none).
fn offline(args: &[&str]) -> Output {
    support::cli("http://127.0.0.1:9", args, None)
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn a_session_exports_verifies_and_a_flipped_byte_is_named() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(why) = skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let root = temp("session");
    let d = start(&root.join("data"), free_port(), POOL);
    let sb = create(&d);
    let id = sb.id.clone();
    let v =
        sb.exec(json!({"cmd": ["sh", "-c", "tr a-z A-Z; echo err >&2"], "stdin": "hello audit\n"}));
    assert_eq!(v["stdout"], "HELLO AUDIT\n");
    let c = client();
    let put = c
        .put(format!("{}/v1/sandboxes/{id}/files?path=/tmp/a.txt", d.url))
        .body("file content")
        .send()
        .unwrap();
    assert!(put.status().is_success());
    let mv = c
        .post(format!("{}/v1/sandboxes/{id}/files/move", d.url))
        .json(&json!({"from": "/tmp/a.txt", "to": "/tmp/b.txt"}))
        .send()
        .unwrap();
    assert!(mv.status().is_success());
    let mk = c
        .post(format!("{}/v1/sandboxes/{id}/files/mkdir", d.url))
        .json(&json!({"path": "/tmp/dir"}))
        .send()
        .unwrap();
    assert!(mk.status().is_success());
    let rm = c
        .delete(format!("{}/v1/sandboxes/{id}/files?path=/tmp/b.txt", d.url))
        .send()
        .unwrap();
    assert!(rm.status().is_success());
    let t = c
        .post(format!("{}/v1/sandboxes/{id}/timeout", d.url))
        .json(&json!({"timeout_secs": 900}))
        .send()
        .unwrap();
    assert!(t.status().is_success());
    sb.destroy();

    // The paged log holds each kind of record, and never an env value.
    let page = audit_log(&d, &id);
    let types: Vec<String> = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["body"]["type"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        types,
        [
            "created",
            "exec",
            "exit",
            "file",
            "file",
            "file",
            "file",
            "timeout_changed",
            "fs_diff",
            "destroyed"
        ],
        "{page}"
    );
    // At destroy, the writable layer against the template lists the directory made.
    let diff = &page["events"][8]["body"];
    assert!(
        diff["added"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["path"] == "/tmp/dir"),
        "{diff}"
    );
    let all = page.to_string();
    assert!(all.contains("SECRET_TOKEN") && !all.contains("do-not-record"));
    let second: Value = c
        .get(format!("{}/v1/sandboxes/{id}/audit?after=7&limit=1", d.url))
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(second["events"][0]["seq"], 8);

    let bundle = root.join("bundle.json");
    let o = d.cli(&["audit", "export", &id, "-o", bundle.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let k = key(&d);
    let o = offline(&["audit", "verify", bundle.to_str().unwrap(), "--key", &k]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains("VERIFIED") && out.contains("tr a-z A-Z"),
        "{out}"
    );
    let shown = d.cli(&["audit", "show", &id]);
    assert!(
        shown.status.success() && text(&shown).contains("/tmp/b.txt"),
        "{}",
        text(&shown)
    );

    // Another key: refused.
    let other = "ed25519:".to_owned() + &"11".repeat(32);
    let o = offline(&["audit", "verify", bundle.to_str().unwrap(), "--key", &other]);
    assert!(!o.status.success());

    // One flipped byte inside a record: refused, naming the record.
    let mut bytes = std::fs::read(&bundle).unwrap();
    let s = String::from_utf8(bytes.clone()).unwrap();
    let at = s.find("tr a-z A-Z").unwrap();
    bytes[at] = b'T';
    let tampered = root.join("tampered.json");
    std::fs::write(&tampered, &bytes).unwrap();
    let o = offline(&["audit", "verify", tampered.to_str().unwrap(), "--key", &k]);
    let out = text(&o);
    assert!(!o.status.success(), "{out}");
    assert!(out.contains("seq 1"), "the failing record is named: {out}");
    drop(d); // unmounts its store, so the directory can go
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn kill_9_mid_burst_keeps_every_acknowledged_exec() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(why) = skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let root = temp("crash");
    let data = root.join("data");
    let port = free_port();
    let mut d = start(&data, port, POOL);
    let sb = create(&d);
    let id = sb.id.clone();
    let url = d.url.clone();
    let acked = std::sync::Arc::new(Mutex::new(Vec::<String>::new()));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let (url, id, acked) = (url.clone(), id.clone(), acked.clone());
            std::thread::spawn(move || {
                let c = client();
                for i in 0..1000 {
                    let marker = format!("marker-{t}-{i}");
                    let r = c
                        .post(format!("{url}/v1/sandboxes/{id}/exec"))
                        .json(&json!({"cmd": ["echo", marker]}))
                        .send();
                    match r {
                        Ok(r) if r.status().as_u16() == 200 => {
                            if r.json::<Value>().is_ok() {
                                acked.lock().unwrap().push(marker);
                            }
                        }
                        _ => return,
                    }
                }
            })
        })
        .collect();
    // Let the burst run, then kill the daemon in the middle of it.
    let deadline = Instant::now() + Duration::from_secs(60);
    while acked.lock().unwrap().len() < 40 {
        assert!(Instant::now() < deadline, "the burst did not get going");
        std::thread::sleep(Duration::from_millis(5));
    }
    d.child.kill().unwrap(); // SIGKILL
    d.child.wait().unwrap();
    for t in threads {
        t.join().unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    eprintln!("{} execs acknowledged before the kill", acked.len());
    drop(d);

    let d = start(&data, port, POOL);
    let page: Value = client()
        .get(format!("{}/v1/sandboxes/{id}/audit?limit=10000", d.url))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let events = page["events"].as_array().unwrap();
    let mut exited = std::collections::HashSet::new();
    let mut argv_of = std::collections::HashMap::new();
    for e in events {
        let b = &e["body"];
        match b["type"].as_str().unwrap() {
            "exec" => {
                argv_of.insert(
                    b["exec_id"].as_str().unwrap().to_owned(),
                    b["argv"][1].as_str().unwrap_or("").to_owned(),
                );
            }
            "exit" => {
                exited.insert(argv_of[b["exec_id"].as_str().unwrap()].clone());
            }
            _ => {}
        }
    }
    for m in &acked {
        assert!(
            exited.contains(m),
            "acknowledged exec {m} has no exit record"
        );
    }
    // Still recording after the restart (the sandbox was re-attached), and the chain verifies.
    sb.exec(json!({"cmd": ["echo", "after-restart"]}));
    let bundle = root.join("bundle.json");
    let o = d.cli(&["audit", "export", &id, "-o", bundle.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let o = offline(&[
        "audit",
        "verify",
        bundle.to_str().unwrap(),
        "--key",
        &key(&d),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    sb.destroy();
    drop(d); // unmounts its store, so the directory can go
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn replay_matches_deterministic_steps_and_names_the_divergent_one() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(why) = skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let root = temp("replay");
    let d = start(&root.join("data"), free_port(), POOL);
    let sb = create(&d);
    let id = sb.id.clone();
    sb.exec(json!({"cmd": ["sh", "-c", "echo one; seq 1 5 | sort -r"]}));
    sb.exec(json!({"cmd": ["sha256sum"], "stdin": "recorded input\n"}));
    sb.exec(json!({"cmd": ["sh", "-c", "exit 3"]}));
    let bundle_ok = root.join("ok.json");
    let o = d.cli(&["audit", "export", &id, "-o", bundle_ok.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let k = key(&d);
    let o = d.cli(&["replay", bundle_ok.to_str().unwrap(), "--key", &k]);
    let out = text(&o);
    assert!(o.status.success(), "all deterministic steps match: {out}");
    assert!(out.contains("3 of 3 steps match"), "{out}");

    sb.exec(json!({"cmd": ["sh", "-c", "date +%N"]}));
    sb.destroy();
    let bundle = root.join("divergent.json");
    let o = d.cli(&["audit", "export", &id, "-o", bundle.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let o = d.cli(&["replay", bundle.to_str().unwrap(), "--key", &k]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    let line = out
        .lines()
        .find(|l| l.contains("date +%N"))
        .unwrap_or_default();
    assert!(line.contains("DIVERGENT"), "{out}");
    assert!(out.contains("3 of 4 steps match"), "{out}");
    drop(d); // unmounts its store, so the directory can go
    let _ = std::fs::remove_dir_all(&root);
}

/// One Connect envelope around `msg`.
fn envelope(msg: &Value) -> Vec<u8> {
    let payload = serde_json::to_vec(msg).unwrap();
    let mut out = vec![0u8];
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(&payload);
    out
}

fn sha(b: &[u8]) -> String {
    rampart_audit::content_digest(b).to_hex()
}

#[test]
fn e2b_execs_and_file_operations_are_recorded_with_the_key_as_caller() {
    if let Some(why) = skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let root = temp("e2b");
    let d = start(&root.join("data"), free_port(), POOL);
    let api_key = std::fs::read_to_string(root.join("data/api-key"))
        .unwrap()
        .trim()
        .to_owned();
    let c = client();

    // A native create names its caller by its API key (id, name, scopes) and address.
    let native = create(&d);
    let evs: Value = c
        .get(format!("{}/v1/sandboxes/{}/audit", d.url, native.id))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let caller = evs["events"][0]["body"]["caller"].as_str().unwrap();
    assert!(
        caller.starts_with("key:") && caller.contains(":test-harness (admin) from 127.0.0.1:"),
        "{caller}"
    );
    native.destroy();

    let r = c
        .post(format!("{}/sandboxes", d.url))
        .header("x-api-key", &api_key)
        .json(&json!({"templateID": "base", "timeout": 300}))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    let v: Value = r.json().unwrap();
    let id = v["sandboxID"].as_str().unwrap().to_owned();
    let token = v["envdAccessToken"].as_str().unwrap().to_owned();
    let envd = |path: &str| {
        c.post(format!("{}{path}", d.url))
            .header("e2b-sandbox-id", &id)
            .header("x-access-token", &token)
    };

    // A command through envd's process.Process/Start, as the SDK sends it.
    let start_req = json!({"process": {"cmd": "/bin/bash",
        "args": ["-c", "echo out; echo err >&2; exit 3"], "envs": {"SECRET_NAME": "value-not-recorded"},
        "cwd": "/tmp"}, "stdin": false});
    let r = envd("/process.Process/Start")
        .header("content-type", "application/connect+json")
        .body(envelope(&start_req))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let answer = r.bytes().unwrap();
    assert!(
        String::from_utf8_lossy(&answer).contains("\"exitCode\":3"),
        "{}",
        String::from_utf8_lossy(&answer)
    );

    // Uploads (raw and multipart), a move, a directory, a removal.
    let r = envd("/files?path=/home/user/raw.txt")
        .header("content-type", "application/octet-stream")
        .body("raw bytes")
        .send()
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().unwrap());
    let multipart = "--XyZ\r\nContent-Disposition: form-data; name=\"file\"; \
                     filename=\"/home/user/mp.txt\"\r\nContent-Type: application/octet-stream\r\n\r\n\
                     multi part\r\n--XyZ--\r\n";
    let r = envd("/files?path=/home/user/mp.txt")
        .header("content-type", "multipart/form-data; boundary=XyZ")
        .body(multipart)
        .send()
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().unwrap());
    for (rpc, body) in [
        (
            "Move",
            json!({"source": "/home/user/raw.txt", "destination": "/home/user/moved.txt"}),
        ),
        ("MakeDir", json!({"path": "/home/user/newdir"})),
        ("Remove", json!({"path": "/home/user/moved.txt"})),
    ] {
        let r = envd(&format!("/filesystem.Filesystem/{rpc}"))
            .header("content-type", "application/json")
            .json(&body)
            .send()
            .unwrap();
        assert!(r.status().is_success(), "{rpc}: {}", r.text().unwrap());
    }

    let log = c
        .get(format!("{}/v1/sandboxes/{id}/audit", d.url))
        .send()
        .unwrap()
        .text()
        .unwrap();
    assert!(!log.contains(&api_key), "the API key is never recorded");
    assert!(!log.contains("value-not-recorded"));
    let evs: Value = serde_json::from_str(&log).unwrap();
    let bodies: Vec<&Value> = evs["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| &e["body"])
        .collect();
    let caller = bodies[0]["caller"].as_str().unwrap();
    assert!(caller.starts_with("e2b-key:"), "{caller}");
    assert!(caller.contains(" from 127.0.0.1:"), "{caller}");
    let exec = bodies.iter().find(|b| b["type"] == "exec").unwrap();
    assert_eq!(
        exec["argv"],
        json!(["/bin/bash", "-c", "echo out; echo err >&2; exit 3"])
    );
    assert_eq!(exec["env_names"], json!(["SECRET_NAME"]));
    assert_eq!(exec["cwd"], "/tmp");
    assert_eq!(exec["user"], "user");
    assert_eq!(exec["stdin"], false);
    let exit = bodies.iter().find(|b| b["type"] == "exit").unwrap();
    assert_eq!(exit["exec_id"], exec["exec_id"]);
    assert_eq!(exit["exit_code"], 3);
    assert_eq!(exit["stdout"]["digest"], sha(b"out\n"));
    assert_eq!(exit["stderr"]["digest"], sha(b"err\n"));
    let files: Vec<&&Value> = bodies.iter().filter(|b| b["type"] == "file").collect();
    let ops: Vec<(&str, &str)> = files
        .iter()
        .map(|f| (f["op"].as_str().unwrap(), f["path"].as_str().unwrap()))
        .collect();
    assert_eq!(
        ops,
        vec![
            ("write", "/home/user/raw.txt"),
            ("write", "/home/user/mp.txt"),
            ("move", "/home/user/raw.txt"),
            ("mkdir", "/home/user/newdir"),
            ("remove", "/home/user/moved.txt"),
        ]
    );
    assert_eq!(files[0]["digest"], sha(b"raw bytes"));
    assert_eq!(files[0]["size"], 9);
    assert_eq!(files[1]["digest"], sha(b"multi part"));
    assert_eq!(files[2]["to"], "/home/user/moved.txt");

    // The whole record verifies offline.
    let bundle = root.join("e2b-bundle.json");
    let o = d.cli(&["audit", "export", &id, "-o", bundle.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let o = offline(&[
        "audit",
        "verify",
        bundle.to_str().unwrap(),
        "--key",
        &key(&d),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    // A snapshot records the writable layer (reason snapshot), then its name.
    let r = c
        .post(format!("{}/v1/sandboxes/{id}/snapshots", d.url))
        .json(&json!({"name": format!("audit-{id}")}))
        .send()
        .unwrap();
    if r.status().as_u16() == 201 {
        let evs = audit_log(&d, &id);
        let evs = evs["events"].as_array().unwrap();
        let n = evs.len();
        assert_eq!(evs[n - 1]["body"]["type"], "snapshot");
        assert_eq!(evs[n - 1]["body"]["name"], format!("audit-{id}"));
        assert_eq!(evs[n - 2]["body"]["type"], "fs_diff");
        assert_eq!(evs[n - 2]["body"]["reason"], "snapshot");
        assert!(evs[n - 2]["body"]["added"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["path"] == "/home/user/mp.txt"));
        // The sandbox still runs after the walk (it was frozen, then thawed).
        let r = envd("/process.Process/Start")
            .header("content-type", "application/connect+json")
            .body(envelope(&json!({"process": {"cmd": "/bin/true"}})))
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
        assert!(String::from_utf8_lossy(&r.bytes().unwrap()).contains("\"end\""));
    } else {
        let status = r.status().as_u16();
        let body = r.text().unwrap();
        assert!(
            status == 503 && body.contains("unsupported"),
            "snapshot: {status} {body}"
        );
        eprintln!("snapshot not available here: {body}");
    }
    let r = c
        .delete(format!("{}/sandboxes/{id}", d.url))
        .header("x-api-key", &api_key)
        .send()
        .unwrap();
    assert!(r.status().is_success());

    // At destroy, the writable layer against the template: the files left by the session.
    let evs = audit_log(&d, &id);
    let evs = evs["events"].as_array().unwrap();
    let last = &evs[evs.len() - 1]["body"];
    assert_eq!(last["type"], "destroyed");
    let diff = &evs[evs.len() - 2]["body"];
    assert_eq!(diff["type"], "fs_diff", "{diff}");
    assert_eq!(diff["reason"], "destroy");
    assert_eq!(last["manifest_digest"], evs[evs.len() - 2]["hash"]);
    let listed = |kind: &str, path: &str| {
        diff[kind]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["path"] == path)
            .cloned()
    };
    let mp = listed("added", "/home/user/mp.txt").expect("mp.txt added");
    assert_eq!(mp["digest"], sha(b"multi part"));
    assert_eq!(mp["size"], 10);
    assert!(listed("added", "/home/user/newdir").is_some(), "{diff}");
    assert!(listed("added", "/home/user/moved.txt").is_none(), "{diff}");
    assert!(listed("added", "/home/user/raw.txt").is_none(), "{diff}");
    drop(d);
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn network_decisions_are_recorded() {
    if let Some(why) = skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let root = temp("net");
    let d = start(&root.join("data"), free_port(), POOL);
    let Some(sb) = create_allowlisted(&d) else {
        return;
    };
    let id = sb.id.clone();
    // A name outside the allowlist: the resolver refuses it, the decision is recorded.
    sb.exec(json!({"cmd": ["sh", "-c", "getent hosts denied.example.org; true"]}));
    let mut found = None;
    wait_until_recorded(&d, &id, |evs| {
        found = evs
            .iter()
            .find(|e| e["body"]["type"] == "network" && e["body"]["host"] == "denied.example.org")
            .cloned();
        found.is_some()
    });
    let ev = found.unwrap();
    assert_eq!(ev["body"]["kind"], "dns", "{ev}");
    assert_eq!(ev["body"]["verdict"], "denied", "{ev}");
    let evs = audit_log(&d, &id);
    assert_eq!(evs["events"][0]["body"]["type"], "created");
    sb.destroy();
    drop(d);
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn a_flood_of_denied_dns_queries_is_counted_not_recorded_one_by_one() {
    if let Some(why) = skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let root = temp("netflood");
    const BURST: usize = 20;
    let config = root.join("config.toml");
    // A refill so slow that nothing comes back during the test: the summary is written at
    // destroy.
    std::fs::write(
        &config,
        format!("[audit]\nnetwork_events_burst = {BURST}\nnetwork_events_per_sec = 0.0001\n"),
    )
    .unwrap();
    let mut envs = POOL.to_vec();
    envs.push(("RAMPART_CONFIG", config.to_str().unwrap()));
    let d = start(&root.join("data"), free_port(), &envs);
    let c = client();
    let Some(sb) = create_allowlisted(&d) else {
        return;
    };
    let id = sb.id.clone();
    sb.exec(json!({"cmd": ["sh", "-c",
            "i=0; while [ $i -lt 2000 ]; do getent hosts q$i.denied.example.org; i=$((i+1)); done; true"],
            "timeout_secs": 300}),
    );
    // Every entry the egress tier logged (its seq numbers count them all).
    let log: Value = c
        .get(format!(
            "{}/v1/sandboxes/{id}/network/log?limit=10000",
            d.url
        ))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let logged = log["entries"]
        .as_array()
        .unwrap()
        .last()
        .map(|e| e["seq"].as_u64().unwrap())
        .unwrap_or(0);
    assert!(logged >= 2000, "{logged} entries logged");
    wait_until_recorded(&d, &id, |evs| {
        evs.iter()
            .filter(|e| e["body"]["type"] == "network")
            .count()
            >= BURST
    });
    sb.destroy();
    let evs = audit_log(&d, &id);
    let evs = evs["events"].as_array().unwrap();
    let network: Vec<&Value> = evs
        .iter()
        .filter(|e| e["body"]["type"] == "network")
        .collect();
    let (summaries, single): (Vec<&Value>, Vec<&Value>) = network
        .iter()
        .partition(|e| e["body"]["kind"] == "suppressed");
    assert_eq!(single.len(), BURST, "one by one: {single:?}");
    assert_eq!(summaries.len(), 1, "{summaries:?}");
    let s = &summaries[0]["body"];
    let total = s["detail"]["total"].as_u64().unwrap();
    assert_eq!(s["verdict"], "suppressed");
    assert_eq!(
        s["detail"]["counts"]["dns"]["denied"].as_u64(),
        Some(total),
        "{s}"
    );
    assert_eq!(BURST as u64 + total, logged, "{s}");
    // The summary comes before the end, and the bundle verifies and reports it.
    assert_eq!(evs.last().unwrap()["body"]["type"], "destroyed");
    let bundle = root.join("bundle.json");
    let o = d.cli(&["audit", "export", &id, "-o", bundle.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let k = key(&d);
    let o = offline(&["audit", "verify", bundle.to_str().unwrap(), "--key", &k]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains(&format!("{total} network log entries left out")),
        "{}",
        text(&o)
    );
    drop(d);
    let _ = std::fs::remove_dir_all(&root);
}

/// Polls a sandbox's audit log until `f` holds (network events arrive from the egress
/// tier's hook, a moment after the decision).
fn wait_until_recorded(d: &Daemon, id: &str, mut f: impl FnMut(&[Value]) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let evs = audit_log(d, id);
        if f(evs["events"].as_array().unwrap()) {
            return;
        }
        assert!(Instant::now() < deadline, "not recorded: {evs}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Values declared sensitive at create (`secret_env`) reach the process and the caller, but
/// the record keeps every exec's input and output with them redacted, and says where in
/// `redacted` events; the bundle holds the value nowhere and verifies.
#[test]
fn declared_secrets_are_redacted_from_the_record_and_each_edit_is_an_event() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(why) = skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let root = temp("redact");
    let d = start(&root.join("data"), free_port(), POOL);
    let value = format!("tok-{}", support::token());
    let c = client();
    // Bad declarations: 400 with the reason, nothing made.
    for (body, what) in [
        (
            json!({"env": {"A": "long-enough"}, "secret_env": ["B"]}),
            "not a variable of env",
        ),
        (
            json!({"env": {"A": "short"}, "secret_env": ["A"]}),
            "too short",
        ),
    ] {
        let r = c
            .post(format!("{}/v1/sandboxes", d.url))
            .json(&body)
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 400);
        let t = r.text().unwrap();
        assert!(t.contains(what), "{t}");
    }
    let sb = Sandbox::create(
        &d,
        json!({"timeout_secs": 600, "env": {"API_TOKEN": value, "PLAIN": "visible"},
               "secret_env": ["API_TOKEN"]}),
    );
    let id = sb.id.clone();
    // The process has the value and the caller gets it back as the process wrote it.
    let v = sb.exec(json!({
        "cmd": ["sh", "-c", "cat; echo \"out $API_TOKEN $PLAIN\"; echo \"err $API_TOKEN$API_TOKEN\" >&2"],
        "stdin": format!("in {value}\n"),
    }));
    assert_eq!(
        v["stdout"],
        format!("in {value}\nout {value} visible\n"),
        "{v}"
    );
    let log: Value = c
        .get(format!("{}/v1/sandboxes/{id}/audit?limit=1000", d.url))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let events = log["events"].as_array().unwrap();
    let edits: Vec<(String, u64)> = events
        .iter()
        .filter(|e| e["body"]["type"] == "redacted")
        .map(|e| {
            assert_eq!(e["body"]["names"], json!(["API_TOKEN"]), "{e}");
            (
                e["body"]["field"].as_str().unwrap().to_owned(),
                e["body"]["count"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        edits,
        vec![
            ("input".to_owned(), 1),
            ("stdout".to_owned(), 2),
            ("stderr".to_owned(), 2)
        ]
    );
    // The kept output is the edited one (its digest is of the edited bytes); no blob and
    // no other byte of the bundle holds the value.
    let bundle = root.join("bundle.json");
    let o = d.cli(&["audit", "export", &id, "-o", bundle.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let bytes = std::fs::read(&bundle).unwrap();
    let holds = |b: &[u8]| b.windows(value.len()).any(|w| w == value.as_bytes());
    assert!(!holds(&bytes), "the value is in the bundle");
    let b: Value = serde_json::from_slice(&bytes).unwrap();
    let exit = events.iter().find(|e| e["body"]["type"] == "exit").unwrap();
    let blob = |digest: &str| {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD
            .decode(b["blobs"][digest].as_str().unwrap())
            .unwrap()
    };
    assert_eq!(
        blob(exit["body"]["stdout"]["blob"].as_str().unwrap()),
        b"in [REDACTED:API_TOKEN]\nout [REDACTED:API_TOKEN] visible\n"
    );
    for (digest, _) in b["blobs"].as_object().unwrap() {
        assert!(!holds(&blob(digest)), "blob {digest} holds the value");
    }
    let o = offline(&[
        "audit",
        "verify",
        bundle.to_str().unwrap(),
        "--key",
        &key(&d),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let o = d.cli(&["audit", "show", &id]);
    assert!(
        text(&o).contains("stdout of x1 edited: 2 value(s) of API_TOKEN redacted"),
        "{}",
        text(&o)
    );
    sb.destroy();
    drop(d);
    let _ = std::fs::remove_dir_all(&root);
}
