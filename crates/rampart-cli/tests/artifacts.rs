//! Artifacts end to end (tier 2): a real daemon, real sandboxes, the real CLI.
//!
//! A sandbox created with `artifacts` leaves those paths behind however it ends: destroyed
//! through the API, at its deadline, when its init (PID 1) is killed with SIGKILL, and when
//! the daemon was killed meanwhile and finds it dead at its restart. Each time the files are
//! listed (size, digest, mode) in the `destroyed` record and downloadable after the sandbox
//! is gone with the same bytes; symlinks out (to the host's `/etc/shadow`) and fifos are
//! not followed or read; the exported bundle verifies with `rampart audit verify` (and the
//! Python verifier) and fails once an artifact blob is altered. Bad paths are refused with a
//! 400 and leave nothing. Artifacts go once their retention passed.
//!
//! Needs root and the `rampart-jailer` / `rampart-agent` binaries next to `rampart`;
//! otherwise it prints `skipped: <reason>`. The tests run one at a time.

mod support;

use base64::Engine as _;
use serde_json::{json, Value};
use sha2::{Digest as _, Sha256};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Mutex;
use std::time::Duration;
use support::{client, skip_reason, wait_until, Api as _, Sandbox, Tidy};

static SERIAL: Mutex<()> = Mutex::new(());

/// The files every test sandbox writes, and what a download must give back.
const SCRIPT: &str = r#"set -e
mkdir -p /home/user/out/sub
printf 'alpha\n' > /home/user/out/a.txt
head -c 70000 /dev/urandom > /home/user/out/sub/b.bin
chmod 0750 /home/user/out/sub/b.bin
ln -s /etc/shadow /home/user/out/shadow
ln -s /etc /home/user/out/etc
mkfifo /home/user/out/fifo
ln /home/user/out/a.txt /home/user/out/hard
printf 'report %s\n' "$(hostname)" > /tmp/report.txt
sha256sum /home/user/out/sub/b.bin | cut -d' ' -f1
"#;

fn sha256_hex(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

/// A daemon whose config file is `config` (TOML), in a temp dir of its own.
fn daemon(name: &str, config: &str) -> (Tidy, tempfile::TempDir) {
    let cfg_dir = tempfile::tempdir().unwrap();
    let cfg = cfg_dir.path().join("rampart.toml");
    std::fs::write(&cfg, config).unwrap();
    let cfg = cfg.to_str().unwrap().to_owned();
    let t = support::start_tidy_with(
        name,
        &[("RAMPART_JAIL_POOL", "1"), ("RAMPART_CONFIG", cfg.as_str())],
    );
    (t, cfg_dir)
}

/// A sandbox with artifacts that wrote [`SCRIPT`]'s files; the digest of its random file.
fn prepared(t: &Tidy) -> (Sandbox, String) {
    let sb = Sandbox::create(
        t,
        json!({"timeout_secs": 600, "artifacts": ["/home/user/out", "/tmp/report.txt"]}),
    );
    let v = sb.sh(SCRIPT);
    assert_eq!(v["exit_code"], 0, "{v}");
    let digest = v["stdout"].as_str().unwrap().trim().to_owned();
    assert_eq!(digest.len(), 64, "{v}");
    (sb, digest)
}

/// Follows the sandbox's audit log until it ends (the stream closes after its last event):
/// its events.
fn follow_to_end(t: &Tidy, id: &str) -> Vec<Value> {
    follow_to_end_at(&t.url, id)
}

/// [`follow_to_end`] on the daemon at `url`.
fn follow_to_end_at(url: &str, id: &str) -> Vec<Value> {
    let text = client()
        .get(format!("{url}/v1/sandboxes/{id}/audit?follow=1"))
        .timeout(Duration::from_secs(120))
        .send()
        .unwrap()
        .text()
        .unwrap();
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The `destroyed` body at the end of `events`.
fn destroyed(events: &[Value]) -> &Value {
    let last = &events.last().expect("no events")["body"];
    assert_eq!(last["type"], "destroyed", "{last}");
    last
}

/// Checks what a sandbox left: the `destroyed` record's list, the API's list and every
/// download (bytes, digest header), against what [`SCRIPT`] wrote. `reason` starts the
/// record's reason.
fn check_kept(t: &Tidy, id: &str, b_digest: &str, reason: &str) {
    let events = follow_to_end(t, id);
    let d = destroyed(&events);
    assert!(
        d["reason"].as_str().unwrap().starts_with(reason),
        "{d}\n{}",
        t.log_tail()
    );
    let a = &d["artifacts"];
    assert_eq!(
        a["paths"],
        json!(["/home/user/out", "/tmp/report.txt"]),
        "{a}"
    );
    assert_eq!(a["truncated"], false, "{a}");
    // The symlinks (to /etc/shadow, to /etc) and the fifo are not kept.
    assert_eq!(a["skipped"], 3, "{a}");
    let files = a["files"].as_array().unwrap();
    let paths: Vec<&str> = files.iter().map(|f| f["path"].as_str().unwrap()).collect();
    assert_eq!(
        paths,
        [
            "/home/user/out/a.txt",
            "/home/user/out/hard",
            "/home/user/out/sub/b.bin",
            "/tmp/report.txt"
        ],
        "{a}"
    );
    assert_eq!(files[0]["digest"], sha256_hex(b"alpha\n"));
    assert_eq!(files[1]["digest"], sha256_hex(b"alpha\n"));
    assert_eq!(files[2]["digest"], b_digest);
    assert_eq!(files[2]["size"], 70000);
    assert_eq!(files[2]["mode"], 0o750);

    // The API lists the same, after the sandbox is gone.
    let c = client();
    let r = c
        .get(format!("{}/v1/sandboxes/{id}/artifacts", t.url))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let list: Value = r.json().unwrap();
    assert_eq!(list["artifacts"], *a, "{list}");
    assert_eq!(list["sandbox_id"], id);
    // Every file downloads with its bytes and its digest.
    for f in files {
        let p = f["path"].as_str().unwrap();
        let r = c
            .get(format!("{}/v1/sandboxes/{id}/artifacts", t.url))
            .query(&[("path", p)])
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "{p}");
        let header = r.headers()["x-rampart-sha256"].to_str().unwrap().to_owned();
        let bytes = r.bytes().unwrap();
        assert_eq!(sha256_hex(&bytes), f["digest"].as_str().unwrap(), "{p}");
        assert_eq!(header, f["digest"].as_str().unwrap(), "{p}");
        assert_eq!(bytes.len() as u64, f["size"].as_u64().unwrap(), "{p}");
        assert!(!bytes.windows(5).any(|w| w == b"root:"), "{p}");
    }
    let r = c
        .get(format!("{}/v1/sandboxes/{id}/artifacts", t.url))
        .query(&[("path", "/home/user/out/shadow")])
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 404, "a symlink is no artifact");
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

/// The independent Python verifier on `bundle`, or None (said why) without python3.
fn python_verify(bundle: &Path, key: &str) -> Option<(bool, String)> {
    let script = support::workspace().join("crates/rampart-audit/tools/verify_bundle.py");
    match std::process::Command::new("python3")
        .arg(script)
        .arg(bundle)
        .arg(key)
        .output()
    {
        Ok(o) => Some((o.status.success(), text(&o))),
        Err(e) => {
            eprintln!("skipped the Python verifier: python3: {e}");
            None
        }
    }
}

/// The console's verifier (`console/verify.js`, WebCrypto) on `bundle` under Node, or None
/// (said why) without `node`.
fn console_verify(bundle: &Path, key: &str) -> Option<(bool, String)> {
    const RUN: &str = r#"
const fs = require("fs");
const src = fs.readFileSync(process.argv[1], "utf8");
const V = new Function(src + "\nreturn RampartVerify;")();
V.verifyBundle(fs.readFileSync(process.argv[2], "utf8"), process.argv[3]).then(
  () => console.log("VERIFIED"),
  (e) => { console.log("FAILED: " + e.message); process.exit(1); });
"#;
    let js = support::workspace().join("crates/rampart-server/console/verify.js");
    match std::process::Command::new("node")
        .arg("-e")
        .arg(RUN)
        .arg(js)
        .arg(bundle)
        .arg(key)
        .output()
    {
        Ok(o) => Some((o.status.success(), text(&o))),
        Err(e) => {
            eprintln!("skipped the console's verifier: node: {e}");
            None
        }
    }
}

/// Host pid of the sandbox's init: the process of its cgroup that is pid 1 of its pid
/// namespace.
fn init_pid(id: &str) -> i32 {
    for cg in [
        format!("/sys/fs/cgroup/pids/rampart/{id}/cgroup.procs"),
        format!("/sys/fs/cgroup/rampart/{id}/cgroup.procs"),
    ] {
        let Ok(s) = std::fs::read_to_string(&cg) else {
            continue;
        };
        for pid in s.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            let ns = status.lines().find_map(|l| l.strip_prefix("NSpid:"));
            if ns.is_some_and(|n| {
                n.split_whitespace().count() >= 2 && n.split_whitespace().last() == Some("1")
            }) {
                return pid;
            }
        }
    }
    panic!("no init found for sandbox {id}");
}

/// Every process of the sandbox's cgroup.
fn sandbox_pids(id: &str) -> Vec<i32> {
    for cg in [
        format!("/sys/fs/cgroup/pids/rampart/{id}/cgroup.procs"),
        format!("/sys/fs/cgroup/rampart/{id}/cgroup.procs"),
    ] {
        if let Ok(s) = std::fs::read_to_string(&cg) {
            return s.lines().filter_map(|l| l.trim().parse().ok()).collect();
        }
    }
    Vec::new()
}

/// Loop devices whose backing file names `id`.
fn loops_of(id: &str) -> Vec<String> {
    std::fs::read_dir("/sys/block")
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| std::fs::read_to_string(e.path().join("loop/backing_file")).ok())
                .filter(|b| b.contains(id))
                .collect()
        })
        .unwrap_or_default()
}

/// Lines of /proc/self/mountinfo that name `id` (a mount left behind).
fn mounts_of(id: &str) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(id))
        .map(str::to_owned)
        .collect()
}

#[test]
fn artifacts_survive_destroy_expiry_and_a_killed_init_and_the_bundle_verifies_them() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(why) = skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let (t, _cfg) = daemon("artifacts", "[artifacts]\nretention_secs = 3600\n");
    let c = client();

    // Bad paths: a 400 naming the field and why; nothing is made.
    let before: Value = c
        .get(format!("{}/v1/sandboxes", t.url))
        .send()
        .unwrap()
        .json()
        .unwrap();
    for (p, why) in [
        ("home/user/out", "absolute"),
        ("/home/user/../../etc/shadow", ".."),
        ("/proc/self/root/etc", "/proc"),
        ("/", "root"),
    ] {
        let r = c
            .post(format!("{}/v1/sandboxes", t.url))
            .json(&json!({"artifacts": [p]}))
            .send()
            .unwrap();
        let status = r.status().as_u16();
        let body = r.text().unwrap();
        assert_eq!(status, 400, "{p}: {body}");
        assert!(
            body.contains("artifacts") && body.contains(why),
            "{p}: {body}"
        );
    }
    let after: Value = c
        .get(format!("{}/v1/sandboxes", t.url))
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(before, after, "a refused create left a sandbox");

    // 1. Destroyed through the API.
    let (sb, digest) = prepared(&t);
    let r = c.get(sb.url("/artifacts")).send().unwrap();
    assert_eq!(r.status().as_u16(), 409, "nothing is kept before the end");
    sb.destroy();
    check_kept(&t, &sb.id, &digest, "api:");
    assert!(mounts_of(&sb.id).is_empty(), "{:?}", mounts_of(&sb.id));

    // The bundle carries the artifact blobs and verifies, with Rust and Python.
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("bundle.json");
    let o = t.cli(&["audit", "export", &sb.id, "-o", bundle.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let key: Value = c
        .get(format!("{}/v1/audit/key", t.url))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let key = key["public_key"].as_str().unwrap().to_owned();
    let o = offline(&["audit", "verify", bundle.to_str().unwrap(), "--key", &key]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("Artifacts kept (4, 3 not regular files, not kept)")
            && text(&o).contains("/home/user/out/sub/b.bin"),
        "{}",
        text(&o)
    );
    let mut b: Value = serde_json::from_slice(&std::fs::read(&bundle).unwrap()).unwrap();
    let b64 = base64::engine::general_purpose::STANDARD;
    let kept = b["blobs"][&digest]
        .as_str()
        .expect("the artifact's blob is in the bundle");
    assert_eq!(b64.decode(kept).unwrap().len(), 70000);
    if let Some((ok, out)) = python_verify(&bundle, &key) {
        assert!(ok && out.contains("VERIFIED"), "{out}");
    }
    if let Some((ok, out)) = console_verify(&bundle, &key) {
        assert!(ok && out.contains("VERIFIED"), "{out}");
    }
    // One artifact altered: both verifiers refuse it, naming the blob.
    b["blobs"][&digest] = Value::String(b64.encode(b"not what the sandbox left"));
    let tampered = dir.path().join("tampered.json");
    std::fs::write(&tampered, serde_json::to_vec(&b).unwrap()).unwrap();
    let o = offline(&["audit", "verify", tampered.to_str().unwrap(), "--key", &key]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(text(&o).contains(&digest[..12]), "{}", text(&o));
    if let Some((ok, out)) = python_verify(&tampered, &key) {
        assert!(!ok && out.contains("does not match its digest"), "{out}");
    }
    if let Some((ok, out)) = console_verify(&tampered, &key) {
        assert!(!ok && out.contains("does not match its digest"), "{out}");
    }
    // The CLI lists them and downloads one, checking its digest.
    let o = t.cli(&["artifacts", &sb.id]);
    assert!(
        o.status.success()
            && text(&o).contains(&format!("{digest}      70000 750 /home/user/out/sub/b.bin")),
        "{}",
        text(&o)
    );
    let got = dir.path().join("b.bin");
    let o = t.cli(&[
        "artifacts",
        &sb.id,
        "/home/user/out/sub/b.bin",
        "-o",
        got.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(sha256_hex(&std::fs::read(&got).unwrap()), digest);
    // The DSSE statement lists them.
    let r = c.get(sb.url("/audit/dsse")).send().unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let env: Value = r.json().unwrap();
    let st: Value =
        serde_json::from_slice(&b64.decode(env["payload"].as_str().unwrap()).unwrap()).unwrap();
    let listed = &st["predicate"]["artifacts"]["files"];
    assert_eq!(listed[2]["sha256"], digest, "{listed}");
    // Each artifact is a subject of the statement, after the record's chain head.
    let subjects = st["subject"].as_array().unwrap();
    assert_eq!(subjects.len(), 5, "{subjects:?}");
    assert_eq!(
        subjects[3]["name"],
        format!("rampart-artifact:{}:/home/user/out/sub/b.bin", sb.id)
    );
    assert_eq!(subjects[3]["digest"]["sha256"], digest);

    // 2. At its deadline (a short timeout set after the files are written).
    let (sb, digest) = prepared(&t);
    let r = c
        .post(sb.url("/timeout"))
        .json(&json!({"timeout_secs": 1}))
        .send()
        .unwrap();
    assert!(r.status().is_success());
    check_kept(&t, &sb.id, &digest, "timeout:");

    // 3. Its init killed with SIGKILL: the daemon sees PID 1 die, mounts what is left of
    // its disk read-only and detached, keeps the artifacts and removes the rest.
    let (sb, digest) = prepared(&t);
    // The loop device of its disk names the image by a path that ends like the daemon's.
    let attached: Vec<String> = std::fs::read_dir("/sys/block")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("loop/backing_file")).ok())
        .filter(|b| b.contains(&sb.id))
        .collect();
    assert_eq!(attached.len(), 1, "{attached:?}");
    assert!(
        attached[0].ends_with(&format!("/{}/disk.img\n", sb.id)),
        "{attached:?}"
    );
    let pid = init_pid(&sb.id);
    // SAFETY: kill(2) on the init of a sandbox this test created (found in its cgroup).
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    check_kept(&t, &sb.id, &digest, "died:");
    let log = std::fs::read_to_string(t.log().unwrap()).unwrap_or_default();
    for l in log.lines().filter(|l| l.contains("mounted detached")) {
        eprintln!("{l}");
    }
    assert!(
        log.lines()
            .any(|l| l.contains(&sb.id) && l.contains("mounted detached")),
        "the disk was read through the detached mount:\n{}",
        t.log_tail()
    );
    // Nothing of the capture stays: no mount, no loop device over its (deleted) disk.
    wait_until(
        "the dead sandbox's mounts and loop devices are gone",
        30,
        || mounts_of(&sb.id).is_empty() && loops_of(&sb.id).is_empty(),
    );
}

#[test]
fn artifacts_survive_a_daemon_restart_that_finds_the_sandbox_dead() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(why) = skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let root = std::env::temp_dir().join(format!("rampart-artifacts-restart-{}", support::token()));
    let data = root.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let config = root.join("rampart.toml");
    std::fs::write(&config, "[artifacts]\nretention_secs = 3600\n").unwrap();
    let config = config.to_str().unwrap().to_owned();
    let envs = [
        ("RAMPART_JAIL_POOL", "1"),
        ("RAMPART_CONFIG", config.as_str()),
    ];
    let port = support::free_port();
    let mut first = support::start(&data, port, &envs);
    let sb = Sandbox::create(
        &first,
        json!({"timeout_secs": 600, "artifacts": ["/home/user/out", "/tmp/report.txt"]}),
    );
    let v = sb.sh(SCRIPT);
    assert_eq!(v["exit_code"], 0, "{v}");
    let digest = v["stdout"].as_str().unwrap().trim().to_owned();
    // kill -9 of the daemon (the child this test started), then of the sandbox's processes
    // while no daemon runs.
    first.child.kill().unwrap();
    drop(first);
    for pid in sandbox_pids(&sb.id) {
        // SAFETY: kill(2) on pids read from the cgroup of a sandbox this test created.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    wait_until("the sandbox's processes are gone", 30, || {
        sandbox_pids(&sb.id).is_empty()
    });
    let second = support::start(&data, port, &envs);
    let events = follow_to_end_at(&second.url, &sb.id);
    let d = destroyed(&events);
    assert!(
        d["reason"].as_str().unwrap().starts_with("recovery:"),
        "{d}"
    );
    let files = d["artifacts"]["files"].as_array().unwrap();
    assert_eq!(files.len(), 4, "{d}");
    assert_eq!(files[2]["digest"], digest.as_str());
    let r = client()
        .get(format!("{}/v1/sandboxes/{}/artifacts", second.url, sb.id))
        .query(&[("path", "/home/user/out/sub/b.bin")])
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(sha256_hex(&r.bytes().unwrap()), digest);
    wait_until("no mount or loop device of the capture is left", 30, || {
        mounts_of(&sb.id).is_empty() && loops_of(&sb.id).is_empty()
    });
    support::destroy_all(&second.url);
    drop(sb);
    drop(second);
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn artifacts_go_once_their_retention_passed() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(why) = skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let (t, _cfg) = daemon("artifacts-retention", "[artifacts]\nretention_secs = 2\n");
    // Made with the CLI's `--artifact`.
    let o = t.cli(&["create", "--artifact", "/tmp/out.txt"]);
    assert!(o.status.success(), "{}", text(&o));
    let sb = Sandbox::adopt(&t, String::from_utf8_lossy(&o.stdout).trim());
    sb.sh("echo kept > /tmp/out.txt");
    sb.destroy();
    let events = follow_to_end(&t, &sb.id);
    assert_eq!(
        destroyed(&events)["artifacts"]["files"][0]["digest"],
        sha256_hex(b"kept\n")
    );
    let kept: PathBuf = t.data.join("artifacts").join(&sb.id);
    wait_until(
        "the artifacts are removed after their retention",
        60,
        || !kept.exists(),
    );
    let r = client().get(sb.url("/artifacts")).send().unwrap();
    assert_eq!(r.status().as_u16(), 404);
}
