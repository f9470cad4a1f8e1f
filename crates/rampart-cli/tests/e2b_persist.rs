//! E2B snapshots and fork (tier 4): the unmodified E2B SDKs (`e2b==2.63.0` from PyPI, sync
//! and async, and `e2b` from npm) run `tests/e2b/persist.py` and `tests/e2b/persist.mjs`
//! against a real daemon: create_snapshot, list_snapshots (paged), delete_snapshot, create
//! from a snapshot, fork. Then, by hand: the E2B face and the native `/v1` face share one
//! implementation (each sees the other's snapshots), and a tenant's E2B key sees, deletes,
//! creates from and forks only its own.
//!
//! Needs root, the binaries, and the SDKs `scripts/test` installs (`target/e2b-venv`,
//! `target/e2b-node`); otherwise it prints `skipped: <reason>`.

mod support;

use reqwest::Method;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use support::{client, start_tidy, target_dir, workspace, Tidy};

fn venv_python() -> PathBuf {
    support::venv_python("RAMPART_E2B_VENV", "e2b-venv")
}

fn node_dir() -> PathBuf {
    std::env::var_os("RAMPART_E2B_NODE")
        .map(PathBuf::from)
        .unwrap_or_else(|| target_dir().join("e2b-node"))
}

/// Runs an SDK script with only the three E2B variables (plus PATH/HOME); returns
/// `(passed, failed)` lines.
fn run_script(
    d: &Tidy,
    key: &str,
    program: &Path,
    script: &Path,
    cwd: &Path,
) -> (Vec<String>, Vec<String>) {
    let r = support::run_sdk_script(
        program,
        script,
        cwd,
        &[
            ("E2B_API_KEY", key),
            ("E2B_API_URL", &d.url),
            ("E2B_SANDBOX_URL", &d.url),
        ],
    );
    (r.passed, r.failed)
}

/// An E2B control-plane call with `key`: (status, JSON body or null).
fn e2b(d: &Tidy, key: &str, m: Method, path: &str, body: Option<Value>) -> (u16, Value) {
    let mut r = client()
        .request(m, format!("{}{path}", d.url))
        .header("x-api-key", key);
    if let Some(b) = body {
        r = r.json(&b);
    }
    let resp = r.send().unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().unwrap_or(Value::Null))
}

/// A native call as the node's administrator.
fn native(d: &Tidy, m: Method, path: &str, body: Option<Value>) -> (u16, Value) {
    let mut r = client().request(m, format!("{}{path}", d.url));
    if let Some(b) = body {
        r = r.json(&b);
    }
    let resp = r.send().unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().unwrap_or(Value::Null))
}

/// Runs `cmd` in an E2B sandbox through the native exec (the node sees every sandbox).
fn sh(d: &Tidy, id: &str, cmd: &str) -> String {
    let (s, v) = native(
        d,
        Method::POST,
        &format!("/v1/sandboxes/{id}/exec"),
        Some(json!({"cmd": ["bash", "-c", cmd], "user": "user"})),
    );
    assert_eq!(s, 200, "exec in {id}: {v}");
    v["stdout"].as_str().unwrap_or_default().trim().to_owned()
}

fn snapshot_ids(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or(&Vec::new())
        .iter()
        .filter_map(|s| s["snapshotID"].as_str().map(str::to_owned))
        .collect()
}

#[test]
fn e2b_snapshots_and_fork() {
    if let Some(why) = support::skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    if let Some(why) = support::venv_lacks(
        &venv_python(),
        "e2b, httpx",
        "scripts/test makes it with `pip install e2b==2.63.0`",
    ) {
        eprintln!("skipped: {why}");
        return;
    }
    let d = start_tidy("e2b-persist");
    let key = std::fs::read_to_string(d.data.join("api-key"))
        .unwrap()
        .trim()
        .to_owned();

    // The SDKs.
    let tests = workspace().join("tests/e2b");
    let (mut passed, mut failed) =
        run_script(&d, &key, &venv_python(), &tests.join("persist.py"), &tests);
    if node_dir().join("node_modules/e2b").is_dir() {
        // ESM resolves `e2b` from the script's own directory: run a copy placed there.
        let script = node_dir().join("rampart-persist-test.mjs");
        std::fs::copy(tests.join("persist.mjs"), &script).unwrap();
        let (p, f) = run_script(&d, &key, Path::new("node"), &script, &node_dir());
        passed.extend(p);
        failed.extend(f);
    } else {
        eprintln!(
            "JS SDK skipped: no {}/node_modules/e2b (scripts/e2b-sdks.sh installs it)",
            node_dir().display()
        );
    }
    // Every script cleaned up after itself.
    let (s, left) = e2b(&d, &key, Method::GET, "/snapshots", None);
    assert_eq!(s, 200, "{left}");
    assert!(
        !failed.is_empty() || snapshot_ids(&left).is_empty(),
        "{left}"
    );

    // One implementation, two faces: an E2B snapshot is a native one and back.
    let (s, sb) = e2b(&d, &key, Method::POST, "/v2/sandboxes", Some(json!({})));
    assert_eq!(s, 201, "{sb}");
    let src = sb["sandboxID"].as_str().unwrap().to_owned();
    sh(&d, &src, "echo two-faces > ~/t.txt");
    let (s, snap) = e2b(
        &d,
        &key,
        Method::POST,
        &format!("/sandboxes/{src}/snapshots"),
        Some(json!({"name": "from-e2b", "memory": false})),
    );
    assert_eq!(s, 201, "{snap}");
    assert_eq!(
        snap,
        json!({"snapshotID": "from-e2b", "names": ["from-e2b"]})
    );
    let (s, n) = native(&d, Method::GET, "/v1/snapshots/from-e2b", None);
    assert_eq!(s, 200, "{n}");
    assert_eq!(n["source"], src.as_str());
    assert_eq!(n["memory"], false);
    let (s, n) = native(
        &d,
        Method::POST,
        &format!("/v1/sandboxes/{src}/snapshots"),
        Some(json!({"name": "from-native"})),
    );
    assert_eq!(s, 201, "{n}");
    let (_, listed) = e2b(
        &d,
        &key,
        Method::GET,
        &format!("/snapshots?sandboxID={src}"),
        None,
    );
    let mut ids = snapshot_ids(&listed);
    ids.sort();
    assert_eq!(ids, ["from-e2b", "from-native"], "{listed}");
    let (s, made) = e2b(
        &d,
        &key,
        Method::POST,
        "/v2/sandboxes",
        Some(json!({"templateID": "from-native", "metadata": {}, "envVars": {}})),
    );
    assert_eq!(s, 201, "{made}");
    assert_eq!(made["templateID"], "from-native");
    let child = made["sandboxID"].as_str().unwrap().to_owned();
    assert_eq!(sh(&d, &child, "cat ~/t.txt"), "two-faces");
    // memory: true is refused, saying why, and makes nothing.
    let (s, e) = e2b(
        &d,
        &key,
        Method::POST,
        &format!("/sandboxes/{src}/snapshots"),
        Some(json!({"name": "with-memory", "memory": true})),
    );
    assert_eq!(s, 400, "{e}");
    assert_eq!(e["code"], 400);
    assert!(e["message"].as_str().unwrap().contains("filesystem"), "{e}");
    let (s, _) = native(&d, Method::GET, "/v1/snapshots/with-memory", None);
    assert_eq!(s, 404);
    // Deleting through E2B removes the native snapshot.
    let (s, _) = e2b(&d, &key, Method::DELETE, "/templates/from-native", None);
    assert_eq!(s, 204);
    let (s, _) = native(&d, Method::GET, "/v1/snapshots/from-native", None);
    assert_eq!(s, 404);
    let (s, _) = e2b(&d, &key, Method::DELETE, "/templates/from-native", None);
    assert_eq!(s, 404);

    // Tenancy: a tenant's E2B key sees only its own snapshots and sandboxes.
    for t in ["acme", "rival"] {
        let (s, v) = native(&d, Method::POST, "/v1/tenants", Some(json!({"name": t})));
        assert_eq!(s, 201, "{v}");
    }
    let ka = support::make_key(&d.data, &["--e2b", "--tenant", "acme"]);
    let kb = support::make_key(&d.data, &["--e2b", "--tenant", "rival"]);
    let (s, sb) = e2b(&d, &ka, Method::POST, "/v2/sandboxes", Some(json!({})));
    assert_eq!(s, 201, "{sb}");
    let sa = sb["sandboxID"].as_str().unwrap().to_owned();
    sh(&d, &sa, "echo acme > ~/a.txt");
    let (s, v) = e2b(
        &d,
        &ka,
        Method::POST,
        &format!("/sandboxes/{sa}/snapshots"),
        Some(json!({"name": "shared-name"})),
    );
    assert_eq!(s, 201, "{v}");
    assert_eq!(
        v["snapshotID"], "shared-name",
        "a tenant sees its own names"
    );
    // Rival: not listed, not deletable, not creatable from, the sandbox not forkable.
    let (s, v) = e2b(&d, &kb, Method::GET, "/snapshots", None);
    assert_eq!(s, 200);
    assert!(snapshot_ids(&v).is_empty(), "{v}");
    let (s, v) = e2b(&d, &kb, Method::DELETE, "/templates/shared-name", None);
    assert_eq!(s, 404, "{v}");
    let (s, v) = e2b(
        &d,
        &kb,
        Method::POST,
        "/v2/sandboxes",
        Some(json!({"templateID": "shared-name"})),
    );
    assert_eq!(s, 404, "{v}");
    for p in [
        format!("/sandboxes/{sa}/fork"),
        format!("/sandboxes/{sa}/snapshots"),
    ] {
        let (s, v) = e2b(&d, &kb, Method::POST, &p, Some(json!({})));
        assert_eq!(s, 404, "{p}: {v}");
        assert_eq!(v["code"], 404);
    }
    // Rival may use the same name for its own.
    let (s, sb) = e2b(&d, &kb, Method::POST, "/v2/sandboxes", Some(json!({})));
    assert_eq!(s, 201, "{sb}");
    let sr = sb["sandboxID"].as_str().unwrap().to_owned();
    let (s, v) = e2b(
        &d,
        &kb,
        Method::POST,
        &format!("/sandboxes/{sr}/snapshots"),
        Some(json!({"name": "shared-name"})),
    );
    assert_eq!(s, 201, "{v}");
    // Acme: its own, listed, forked; the forks are acme's.
    let (_, v) = e2b(&d, &ka, Method::GET, "/snapshots", None);
    assert_eq!(snapshot_ids(&v), ["shared-name"], "{v}");
    let (s, forks) = e2b(
        &d,
        &ka,
        Method::POST,
        &format!("/sandboxes/{sa}/fork"),
        Some(json!({"count": 2, "timeout": 120})),
    );
    assert_eq!(s, 201, "{forks}");
    let fork_ids: Vec<String> = forks
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            assert!(f.get("error").is_none(), "{f}");
            assert!(f["sandbox"]["envdAccessToken"].is_string(), "{f}");
            f["sandbox"]["sandboxID"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(fork_ids.len(), 2);
    for f in &fork_ids {
        assert_eq!(sh(&d, f, "cat ~/a.txt"), "acme");
        let (s, _) = e2b(&d, &ka, Method::GET, &format!("/sandboxes/{f}"), None);
        assert_eq!(s, 200);
        let (s, _) = e2b(&d, &kb, Method::GET, &format!("/sandboxes/{f}"), None);
        assert_eq!(s, 404, "rival sees acme's fork");
    }
    let (s, v) = native(
        &d,
        Method::GET,
        &format!("/v1/sandboxes/{}", fork_ids[0]),
        None,
    );
    assert_eq!(s, 200);
    assert_eq!(v["tenant"], "acme", "{v}");
    // Each fork succeeds or fails on its own (E2B's fork): with room for one more sandbox
    // under acme's quota, a fork of three makes one and answers 429 for the other two.
    let (s, v) = native(
        &d,
        Method::PUT,
        "/v1/tenants/acme/quotas",
        Some(json!({"max_sandboxes": 4})),
    );
    assert_eq!(s, 200, "{v}");
    let (s, forks) = e2b(
        &d,
        &ka,
        Method::POST,
        &format!("/sandboxes/{sa}/fork"),
        Some(json!({"count": 3})),
    );
    assert_eq!(s, 201, "{forks}");
    let items = forks.as_array().unwrap();
    assert_eq!(items.len(), 3, "{forks}");
    assert!(items[0]["sandbox"]["sandboxID"].is_string(), "{forks}");
    for e in &items[1..] {
        assert_eq!(e["error"]["code"], 429, "{forks}");
        assert!(
            e["error"]["message"]
                .as_str()
                .unwrap()
                .contains("max_sandboxes"),
            "{forks}"
        );
        assert!(e.get("sandbox").is_none(), "{forks}");
    }
    let extra = items[0]["sandbox"]["sandboxID"].as_str().unwrap();
    assert_eq!(sh(&d, extra, "cat ~/a.txt"), "acme");
    let (s, _) = e2b(
        &d,
        &ka,
        Method::DELETE,
        &format!("/sandboxes/{extra}"),
        None,
    );
    assert_eq!(s, 204);
    let (s, v) = native(&d, Method::PUT, "/v1/tenants/acme/quotas", Some(json!({})));
    assert_eq!(s, 200, "{v}");
    // Acme's delete removes its own, not rival's of the same name.
    let (s, _) = e2b(&d, &ka, Method::DELETE, "/templates/shared-name", None);
    assert_eq!(s, 204);
    let (_, v) = e2b(&d, &kb, Method::GET, "/snapshots", None);
    assert_eq!(snapshot_ids(&v), ["shared-name"], "{v}");
    let (s, _) = e2b(&d, &kb, Method::DELETE, "/templates/shared-name", None);
    assert_eq!(s, 204);

    eprintln!("passed ({}): {passed:?}", passed.len());
    assert!(
        failed.is_empty(),
        "SDK tests failed:\n{}",
        failed.join("\n")
    );
    assert!(passed.len() >= 8, "{passed:?}");
}
