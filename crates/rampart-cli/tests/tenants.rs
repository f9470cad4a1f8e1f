//! Tenants, attacked from where their users stand: a daemon started as operators start it,
//! tenants and keys made with the CLI on its host, then
//! - **isolation**: for every endpoint that takes an id (sandboxes, exec, files, network,
//!   ports, snapshots, fork, volumes, secrets, audit, usage, the E2B API), tenant B with
//!   tenant A's id gets exactly what an id that does not exist gets (404), and nothing of A's
//!   changes; lists never show it; the unmodified E2B SDK with B's key sees only B's;
//! - **scopes and revocation**: a key without `exec` cannot exec, a tenant's key cannot
//!   administer, a revoked key is refused on its next request;
//! - **quotas and rates**: concurrent creates at `max_sandboxes` pass exactly as many as
//!   allowed, the refusals name the limit, use and most; `max_memory_bytes`;
//!   `creates_per_minute` answers 429 with `X-RateLimit-*` and `Retry-After`;
//! - **metering**: a sandbox spinning one CPU for 3 s is billed the CPU time it used (within
//!   15%); the signed report verifies offline and a changed record is named;
//! - **who did it**: the change log and the audit record name the tenant's key.
//!
//! Needs root and the kernel features of the namespace tier; otherwise it prints
//! `skipped: <reason>`.

mod support;

use reqwest::blocking::Client;
use reqwest::Method;
use serde_json::{json, Value};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;
use support::cli_local;

fn http() -> Client {
    Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap()
}

/// An answer: status, body (JSON or null), headers.
struct Answer {
    status: u16,
    body: Value,
    headers: reqwest::header::HeaderMap,
}

fn call(url: &str, key: &str, method: Method, path: &str, body: Option<Value>) -> Answer {
    let mut r = http()
        .request(method, format!("{url}{path}"))
        .header("authorization", format!("Bearer {key}"));
    if let Some(b) = body {
        r = r.json(&b);
    }
    let resp = r.send().unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let text = resp.text().unwrap_or_default();
    Answer {
        status,
        body: serde_json::from_str(&text).unwrap_or(Value::Null),
        headers,
    }
}

/// A key made with `rampart keys create ... --json`: (id, key).
fn make_key(data: &Path, args: &[&str]) -> (String, String) {
    let mut a = vec!["keys", "create", "--json"];
    a.extend_from_slice(args);
    let out = cli_local(data, &a).expect("rampart keys create");
    let v: Value = serde_json::from_str(out.trim()).unwrap();
    (
        v["id"].as_str().unwrap().to_owned(),
        v["key"].as_str().unwrap().to_owned(),
    )
}

fn create(url: &str, key: &str, body: Value) -> Answer {
    call(url, key, Method::POST, "/v1/sandboxes", Some(body))
}

/// Every endpoint that takes a sandbox id or a named object, as (method, path, body).
fn id_endpoints(id: &str) -> Vec<(Method, String, Option<Value>)> {
    let s = |p: &str| format!("/v1/sandboxes/{id}{p}");
    vec![
        (Method::GET, s(""), None),
        (
            Method::POST,
            s("/timeout"),
            Some(json!({"timeout_secs": 5})),
        ),
        (Method::POST, s("/pause"), None),
        (Method::POST, s("/resume"), None),
        (Method::POST, s("/snapshots"), Some(json!({"name": "x1"}))),
        (Method::POST, s("/fork"), Some(json!({"count": 1}))),
        (Method::POST, s("/exec"), Some(json!({"cmd": ["true"]}))),
        (
            Method::POST,
            s("/processes"),
            Some(json!({"cmd": ["sleep", "1"]})),
        ),
        (Method::GET, s("/processes"), None),
        (Method::GET, s("/processes/1"), None),
        (Method::GET, s("/processes/1/events"), None),
        (
            Method::POST,
            s("/processes/1/input"),
            Some(json!({"type": "close_stdin"})),
        ),
        (Method::DELETE, s("/processes/1"), None),
        (Method::GET, s("/stats"), None),
        (Method::GET, s("/files?path=/etc/hostname"), None),
        (Method::DELETE, s("/files?path=/tmp/mark"), None),
        (Method::GET, s("/files/stat?path=/tmp"), None),
        (Method::GET, s("/files/list?path=/tmp"), None),
        (
            Method::POST,
            s("/files/mkdir"),
            Some(json!({"path": "/tmp/x"})),
        ),
        (
            Method::POST,
            s("/files/move"),
            Some(json!({"from": "/tmp/mark", "to": "/tmp/moved"})),
        ),
        (Method::GET, s("/network"), None),
        (Method::PUT, s("/network"), Some(json!({"mode": "none"}))),
        (Method::GET, s("/network/log"), None),
        (Method::GET, s("/audit"), None),
        (Method::GET, s("/audit/bundle"), None),
        (Method::GET, s("/ports"), None),
        (Method::POST, s("/ports/8080/public"), None),
        (Method::DELETE, s("/ports/8080/public"), None),
        (Method::DELETE, s(""), None),
    ]
}

#[test]
fn tenants_see_only_their_own_on_every_endpoint() {
    if let Some(why) = support::skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let d = support::start_tidy("tenants");
    let url = d.url.clone();
    let admin = support::admin_key();

    // Bad input: each a 400 naming the reason, and nothing made.
    for (body, what) in [
        (json!({"name": "Acme Corp"}), "not allowed"),
        (json!({"name": "a:b"}), "not allowed"),
        (
            json!({"name": "ok", "quotas": {"max_sandboxes": -1}}),
            "max_sandboxes",
        ),
        (
            json!({"name": "ok", "quotas": {"max_vcpus": 1e9}}),
            "absurd",
        ),
        (json!({"name": "ok", "quotas": {"max_pets": 3}}), "max_pets"),
    ] {
        let a = call(&url, admin, Method::POST, "/v1/tenants", Some(body.clone()));
        assert_eq!(a.status, 400, "{body}: {}", a.body);
        assert!(a.body.to_string().contains(what), "{body}: {}", a.body);
    }
    let listed = call(&url, admin, Method::GET, "/v1/tenants", None);
    assert_eq!(listed.body, json!([]), "a refused tenant was made");
    for t in ["acme", "rival"] {
        let a = call(
            &url,
            admin,
            Method::POST,
            "/v1/tenants",
            Some(json!({"name": t})),
        );
        assert_eq!(a.status, 201, "{}", a.body);
    }
    let dup = call(
        &url,
        admin,
        Method::POST,
        "/v1/tenants",
        Some(json!({"name": "acme"})),
    );
    assert_eq!(dup.status, 409, "{}", dup.body);

    // Keys, made on the daemon's host; a bad scope or tenant is refused.
    let err = cli_local(
        &d.data,
        &["keys", "create", "--tenant", "acme", "--scope", "root"],
    )
    .unwrap_err();
    assert!(err.contains("unknown scope"), "{err}");
    let err = cli_local(&d.data, &["keys", "create", "--tenant", "nosuch"]).unwrap_err();
    assert!(err.contains("no tenant"), "{err}");
    let err = cli_local(
        &d.data,
        &["keys", "create", "--tenant", "acme", "--scope", "admin"],
    )
    .unwrap_err();
    assert!(err.contains("admin"), "{err}");
    // Pointed at the daemon (RAMPART_HOST) without --data-dir, the command acts on that
    // endpoint or says why not; it never writes this host's default data directory.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rampart"))
        .args(["keys", "create", "--tenant", "acme"])
        .env("RAMPART_HOST", &d.url)
        .env("RAMPART_API_KEY", admin)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("no key API"), "{err}");
    let out = cli_local(&d.data, &["keys", "create", "--tenant", "acme", "--json"]).unwrap();
    let made: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(made["tenant"], "acme");
    let scopes: Vec<&str> = made["scopes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    assert!(
        scopes.contains(&"exec") && !scopes.contains(&"admin"),
        "{scopes:?}"
    );
    let ka = made["key"].as_str().unwrap().to_owned();
    let (kb_id, kb) = make_key(&d.data, &["--tenant", "rival"]);
    let listed = cli_local(&d.data, &["keys", "ls", "--tenant", "rival", "--json"]).unwrap();
    assert!(listed.contains(&kb_id) && !listed.contains(&kb), "{listed}");

    // A's things: a sandbox, a snapshot, a volume, a stored secret.
    let a = create(&url, &ka, json!({"timeout_secs": 600}));
    assert_eq!(a.status, 201, "{}", a.body);
    let sa = a.body["id"].as_str().unwrap().to_owned();
    assert_eq!(a.body["tenant"], "acme");
    let w = http()
        .put(format!("{url}/v1/sandboxes/{sa}/files?path=/tmp/mark"))
        .header("authorization", format!("Bearer {ka}"))
        .body("a's")
        .send()
        .unwrap();
    assert!(w.status().is_success(), "{}", w.status());
    let snap = call(
        &url,
        &ka,
        Method::POST,
        &format!("/v1/sandboxes/{sa}/snapshots"),
        Some(json!({"name": "snap1"})),
    );
    assert_eq!(snap.status, 201, "{}", snap.body);
    assert_eq!(snap.body["name"], "snap1");
    let vol = call(
        &url,
        &ka,
        Method::POST,
        "/v1/volumes",
        Some(json!({"name": "vol1", "size_mib": 16})),
    );
    assert_eq!(vol.status, 201, "{}", vol.body);
    let sec = call(
        &url,
        &ka,
        Method::POST,
        "/v1/secrets",
        Some(json!({"name": "tok", "value": "s3cret", "hosts": ["api.example.com"]})),
    );
    assert!(sec.status == 200 || sec.status == 201, "{}", sec.body);

    // B, with A's ids and names, gets exactly what it gets for ids that do not exist.
    // Well formed, never made.
    let ghost = format!("z{}", "0".repeat(sa.len() - 1));
    let named: Vec<(Method, String, Option<Value>)> = vec![
        (Method::GET, "/v1/snapshots/snap1".into(), None),
        (Method::DELETE, "/v1/snapshots/snap1".into(), None),
        (Method::DELETE, "/v1/volumes/vol1".into(), None),
        (Method::DELETE, "/v1/secrets/tok".into(), None),
    ];
    for ((m, path, body), (_, ghost_path, _)) in id_endpoints(&sa)
        .into_iter()
        .zip(id_endpoints(&ghost))
        .chain(named.clone().into_iter().zip(named.clone()))
    {
        let theirs = call(&url, &kb, m.clone(), &path, body.clone());
        assert_eq!(theirs.status, 404, "B {m} {path}: {}", theirs.body);
        if path.contains(&sa) {
            let none = call(&url, &kb, m.clone(), &ghost_path, body.clone());
            assert_eq!(none.status, 404, "B {m} {ghost_path}: {}", none.body);
            assert_eq!(
                theirs.body["error"]["message"]
                    .as_str()
                    .map(|s| s.replace(&sa, "ID")),
                none.body["error"]["message"]
                    .as_str()
                    .map(|s| s.replace(&ghost, "ID")),
                "{m} {path}: another tenant's id must answer as one that does not exist"
            );
        }
    }
    // Lists never show A's.
    for path in [
        "/v1/sandboxes",
        "/v1/snapshots",
        "/v1/volumes",
        "/v1/secrets",
    ] {
        let l = call(&url, &kb, Method::GET, path, None);
        assert_eq!(l.status, 200, "{path}: {}", l.body);
        assert_eq!(l.body, json!([]), "B lists {path}");
    }
    let usage = call(&url, &kb, Method::GET, "/v1/usage?tenant=acme", None);
    assert_eq!(usage.status, 200, "{}", usage.body);
    assert_eq!(
        usage.body["tenant"], "rival",
        "a tenant's report is its own"
    );
    assert_eq!(usage.body["sandboxes"], json!([]));
    // Nothing of A's changed: running, its file, its snapshot, volume and secret.
    let mine = call(&url, &ka, Method::GET, &format!("/v1/sandboxes/{sa}"), None);
    assert_eq!(mine.body["state"], "running", "{}", mine.body);
    let r = http()
        .get(format!("{url}/v1/sandboxes/{sa}/files?path=/tmp/mark"))
        .header("authorization", format!("Bearer {ka}"))
        .send()
        .unwrap();
    assert_eq!(r.text().unwrap(), "a's");
    for (path, name) in [
        ("/v1/snapshots", "snap1"),
        ("/v1/volumes", "vol1"),
        ("/v1/secrets", "tok"),
    ] {
        let l = call(&url, &ka, Method::GET, path, None);
        assert!(l.body.to_string().contains(name), "{path}: {}", l.body);
    }
    // Names are per tenant: B may have its own snap1, which is not A's.
    let sb = create(&url, &kb, json!({}));
    assert_eq!(sb.status, 201, "{}", sb.body);
    let sb = sb.body["id"].as_str().unwrap().to_owned();
    let s2 = call(
        &url,
        &kb,
        Method::POST,
        &format!("/v1/sandboxes/{sb}/snapshots"),
        Some(json!({"name": "snap1"})),
    );
    assert_eq!(s2.status, 201, "{}", s2.body);
    assert_eq!(s2.body["source"], sb.as_str());
    let a1 = call(&url, &ka, Method::GET, "/v1/snapshots/snap1", None);
    assert_eq!(a1.body["source"], sa.as_str(), "{}", a1.body);
    // The admin sees both, tenants' names qualified.
    let all = call(&url, admin, Method::GET, "/v1/snapshots", None)
        .body
        .to_string();
    assert!(
        all.contains("acme:snap1") && all.contains("rival:snap1"),
        "{all}"
    );
    let all = call(&url, admin, Method::GET, "/v1/sandboxes", None)
        .body
        .to_string();
    assert!(all.contains(&sa) && all.contains(&sb), "{all}");

    // The node's metrics carry the tenant.
    let m = http()
        .get(format!("{url}/metrics"))
        .header("authorization", format!("Bearer {admin}"))
        .send()
        .unwrap()
        .text()
        .unwrap();
    assert!(
        m.lines().any(|l| l.starts_with("rampart_tenant_sandboxes{")
            && l.contains("tenant=\"acme\"")
            && l.contains("state=\"running\"")),
        "{m}"
    );
    // Scopes: a tenant's key cannot administer; a key without `exec` cannot exec.
    for (m, path) in [
        (Method::GET, "/v1/tenants"),
        (Method::GET, "/metrics"),
        (Method::POST, "/v1/tenants"),
    ] {
        let a = call(&url, &ka, m, path, Some(json!({"name": "x"})));
        assert_eq!(a.status, 403, "{path}: {}", a.body);
    }
    let (_, narrow) = make_key(&d.data, &["--tenant", "acme", "--scope", "sandboxes"]);
    let e = call(
        &url,
        &narrow,
        Method::POST,
        &format!("/v1/sandboxes/{sa}/exec"),
        Some(json!({"cmd": ["true"]})),
    );
    assert_eq!(e.status, 403, "{}", e.body);
    assert!(e.body.to_string().contains("`exec`"), "{}", e.body);
    let ok = call(
        &url,
        &narrow,
        Method::GET,
        &format!("/v1/sandboxes/{sa}"),
        None,
    );
    assert_eq!(ok.status, 200, "{}", ok.body);

    // The E2B API with B's key (E2B's team): A's sandbox is not there.
    let (_, eb) = make_key(&d.data, &["--e2b", "--tenant", "rival"]);
    let e2b = |m: Method, path: &str| {
        let r = http()
            .request(m, format!("{url}{path}"))
            .header("x-api-key", &eb)
            .send()
            .unwrap();
        (r.status().as_u16(), r.text().unwrap_or_default())
    };
    let (st, list) = e2b(Method::GET, "/v2/sandboxes");
    assert_eq!(st, 200, "{list}");
    assert!(!list.contains(&sa), "{list}");
    for (m, p) in [
        (Method::GET, format!("/sandboxes/{sa}")),
        (Method::POST, format!("/sandboxes/{sa}/pause")),
        (Method::DELETE, format!("/sandboxes/{sa}")),
    ] {
        let (st, body) = e2b(m.clone(), &p);
        assert_eq!(st, 404, "E2B {m} {p}: {body}");
    }
    e2b_sdk_sees_only_its_tenant(&url, &eb, &sa);

    // Still A's, still running.
    let mine = call(&url, &ka, Method::GET, &format!("/v1/sandboxes/{sa}"), None);
    assert_eq!(mine.body["state"], "running", "{}", mine.body);

    // Who did it: the change log and the record name the tenant's key.
    let changes = call(&url, admin, Method::GET, "/v1/changes?limit=1000", None);
    let text = changes.body.to_string();
    assert!(
        text.contains("\"tenant\":\"acme\"") && text.contains("\"status\":201"),
        "{text}"
    );
    assert!(
        text.contains("\"status\":404"),
        "B's refused calls are logged: {text}"
    );
    let own = call(&url, &kb, Method::GET, "/v1/changes?limit=1000", None);
    assert!(
        !own.body.to_string().contains("\"tenant\":\"acme\""),
        "B reads only its own changes"
    );
    let events = call(
        &url,
        &ka,
        Method::GET,
        &format!("/v1/sandboxes/{sa}/audit"),
        None,
    );
    let evs = events.body["events"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for kind in ["created", "file"] {
        let caller = evs
            .iter()
            .find(|e| e["body"]["type"] == kind)
            .and_then(|e| e["body"]["caller"].as_str())
            .unwrap_or_default()
            .to_owned();
        assert!(
            caller.starts_with("key:") && caller.contains("tenant acme"),
            "{kind} names {caller:?}: {}",
            events.body
        );
    }

    // Revocation is immediate.
    cli_local(&d.data, &["keys", "rm", &kb_id]).unwrap();
    let gone = call(&url, &kb, Method::GET, "/v1/sandboxes", None);
    assert_eq!(gone.status, 401, "{}", gone.body);
    assert!(gone.body.to_string().contains("revoked"), "{}", gone.body);
    // A tenant with sandboxes cannot be removed; removing one revokes its keys.
    let busy = call(&url, admin, Method::DELETE, "/v1/tenants/acme", None);
    assert_eq!(busy.status, 409, "{}", busy.body);
    call(
        &url,
        &ka,
        Method::DELETE,
        &format!("/v1/sandboxes/{sa}"),
        None,
    );
    let rm = call(&url, admin, Method::DELETE, "/v1/tenants/acme", None);
    assert_eq!(rm.status, 204, "{}", rm.body);
    let after = call(&url, &ka, Method::GET, "/v1/sandboxes", None);
    assert_eq!(after.status, 401, "{}", after.body);
}

/// The unmodified E2B SDK with a tenant's key: it creates and runs in its own sandbox, lists
/// only its tenant's, and cannot reach `other` (another tenant's sandbox). Skipped (with a
/// line) when the SDK's virtual environment is missing.
fn e2b_sdk_sees_only_its_tenant(url: &str, key: &str, other: &str) {
    let py = support::venv_python("RAMPART_E2B_VENV", "e2b-venv");
    let has = Command::new(&py)
        .args(["-c", "import e2b"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !has {
        eprintln!(
            "skipped the E2B SDK part: no venv with e2b at {}",
            py.display()
        );
        return;
    }
    let script = r#"
import os, sys
from e2b import Sandbox
other = os.environ["OTHER"]
s = Sandbox.create(timeout=120)
r = s.commands.run("echo tenant-ok")
assert r.stdout.strip() == "tenant-ok", r
listed = Sandbox.list()
items = listed.next_items() if hasattr(listed, "next_items") else listed
ids = [i.sandbox_id for i in items]
assert s.sandbox_id in ids, ids
assert other not in ids, ids
try:
    Sandbox.connect(other)
    print("FAIL connected to another tenant's sandbox")
    sys.exit(1)
except Exception as e:
    assert "not found" in str(e).lower() or "doesn't exist" in str(e).lower(), repr(e)
assert Sandbox.kill(other) is False
s.kill()
print("SDK-OK")
"#;
    let out = Command::new(&py)
        .args(["-c", script])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", "/root")
        .env("E2B_API_KEY", key)
        .env("E2B_API_URL", url)
        .env("E2B_SANDBOX_URL", url)
        .env("OTHER", other)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success() && text.contains("SDK-OK"), "{text}");
}

#[test]
fn quotas_rates_and_metering_hold() {
    if let Some(why) = support::skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let d = support::start_tidy("quotas");
    let url = d.url.clone();
    for args in [
        vec![
            "tenant",
            "create",
            "capped",
            "--max-sandboxes",
            "2",
            "--max-memory",
            "768MiB",
        ],
        vec!["tenant", "create", "paced", "--creates-per-minute", "3"],
        vec!["tenant", "create", "metered"],
        vec!["tenant", "create", "forky", "--creates-per-minute", "3"],
    ] {
        cli_local(&d.data, &args).unwrap();
    }
    let bad = cli_local(&d.data, &["tenant", "create", "neg", "--max-vcpus=-1"]).unwrap_err();
    assert!(
        bad.contains("max-vcpus") || bad.contains("max_vcpus"),
        "{bad}"
    );
    let (_, kc) = make_key(&d.data, &["--tenant", "capped"]);
    let (_, kp) = make_key(&d.data, &["--tenant", "paced"]);
    let (_, km) = make_key(&d.data, &["--tenant", "metered"]);

    // Six creates at once against max_sandboxes 2: exactly two pass.
    let results: Vec<Answer> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..6)
            .map(|_| {
                let (url, kc) = (url.clone(), kc.clone());
                s.spawn(move || create(&url, &kc, json!({"limits": {"memory_bytes": 268435456}})))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let made: Vec<&Answer> = results.iter().filter(|a| a.status == 201).collect();
    assert_eq!(
        made.len(),
        2,
        "statuses: {:?}",
        results.iter().map(|a| a.status).collect::<Vec<_>>()
    );
    for a in results.iter().filter(|a| a.status != 201) {
        assert_eq!(a.status, 403, "{}", a.body);
        assert_eq!(a.body["error"]["code"], "quota_exceeded", "{}", a.body);
        assert_eq!(
            a.body["error"]["quota"]["limit"], "max_sandboxes",
            "{}",
            a.body
        );
        assert_eq!(a.body["error"]["quota"]["used"], 2.0);
        assert_eq!(a.body["error"]["quota"]["max"], 2.0);
    }
    // Memory: with one place free, 256 MiB held and 640 MiB more passes 768 MiB.
    let first = made[0].body["id"].as_str().unwrap().to_owned();
    call(
        &url,
        &kc,
        Method::DELETE,
        &format!("/v1/sandboxes/{first}"),
        None,
    );
    let big = create(&url, &kc, json!({"limits": {"memory_bytes": 671088640}}));
    assert_eq!(big.status, 403, "{}", big.body);
    assert_eq!(
        big.body["error"]["quota"]["limit"], "max_memory_bytes",
        "{}",
        big.body
    );
    let holds = call(
        &url,
        support::admin_key(),
        Method::GET,
        "/v1/tenants/capped",
        None,
    );
    assert_eq!(holds.body["holds"]["sandboxes"], 1, "{}", holds.body);

    // Rate: three creates a minute, the fourth is 429 with the headers.
    let mut remaining = Vec::new();
    for _ in 0..3 {
        let a = create(&url, &kp, json!({}));
        assert_eq!(a.status, 201, "{}", a.body);
        assert_eq!(a.headers["x-ratelimit-limit"], "3");
        remaining.push(
            a.headers["x-ratelimit-remaining"]
                .to_str()
                .unwrap()
                .to_owned(),
        );
        let id = a.body["id"].as_str().unwrap();
        call(
            &url,
            &kp,
            Method::DELETE,
            &format!("/v1/sandboxes/{id}"),
            None,
        );
    }
    assert_eq!(remaining, ["2", "1", "0"]);
    let refused = create(&url, &kp, json!({}));
    assert_eq!(refused.status, 429, "{}", refused.body);
    assert_eq!(refused.body["error"]["code"], "rate_limited");
    assert_eq!(
        refused.body["error"]["quota"]["limit"],
        "creates_per_minute"
    );
    assert_eq!(refused.headers["x-ratelimit-remaining"], "0");
    let retry: u64 = refused.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry), "{retry}");
    // A fork of N is N creates against the rate, all or none: with 2 of 3 left, a fork of
    // 3 (one counted by the guard, the 2 more asked for by the handler) is refused and
    // makes nothing.
    let (_, kf) = make_key(&d.data, &["--tenant", "forky"]);
    let src = create(&url, &kf, json!({}));
    assert_eq!(src.status, 201, "{}", src.body);
    let src = src.body["id"].as_str().unwrap().to_owned();
    let fork = call(
        &url,
        &kf,
        Method::POST,
        &format!("/v1/sandboxes/{src}/fork"),
        Some(json!({"count": 3})),
    );
    assert_eq!(fork.status, 429, "{}", fork.body);
    assert_eq!(
        fork.body["error"]["quota"]["requested"], 2.0,
        "{}",
        fork.body
    );
    let alive = call(&url, &kf, Method::GET, "/v1/sandboxes", None);
    assert_eq!(
        alive.body.as_array().map(Vec::len),
        Some(1),
        "{}",
        alive.body
    );
    call(
        &url,
        &kf,
        Method::DELETE,
        &format!("/v1/sandboxes/{src}"),
        None,
    );

    // Metering: one CPU spun for 3 s is billed what it used.
    let m = create(&url, &km, json!({"limits": {"cpus": 1.0}}));
    assert_eq!(m.status, 201, "{}", m.body);
    let mid = m.body["id"].as_str().unwrap().to_owned();
    let spin = call(
        &url,
        &km,
        Method::POST,
        &format!("/v1/sandboxes/{mid}/exec"),
        Some(json!({"cmd": ["sh", "-c", "timeout 3 sh -c 'while :; do :; done'; times"]})),
    );
    assert_eq!(spin.status, 200, "{}", spin.body);
    // `times`: the shell's own user/sys, then its children's.
    let out = spin.body["stdout"].as_str().unwrap().to_owned();
    let children = out.lines().nth(1).unwrap_or_default();
    let secs: f64 = children
        .split_whitespace()
        .map(|t| {
            let (m, s) = t.trim_end_matches('s').split_once('m').unwrap();
            m.parse::<f64>().unwrap() * 60.0 + s.parse::<f64>().unwrap()
        })
        .sum();
    assert!(secs > 1.5, "the spinner got {secs} s of CPU: {out}");
    let del = call(
        &url,
        &km,
        Method::DELETE,
        &format!("/v1/sandboxes/{mid}"),
        None,
    );
    assert_eq!(del.status, 200, "{}", del.body);
    let rep = call(&url, &km, Method::GET, "/v1/usage", None);
    assert_eq!(rep.status, 200, "{}", rep.body);
    let recs = rep.body["sandboxes"].as_array().unwrap();
    assert_eq!(recs.len(), 1, "{}", rep.body);
    let billed = recs[0]["vcpu_seconds"].as_f64().unwrap();
    eprintln!("spun {secs:.3} s of CPU (3 s of wall time); billed {billed:.3} vCPU-seconds");
    assert!(
        (billed - secs).abs() <= 0.15 * secs,
        "billed {billed} vCPU-s for {secs} s of CPU"
    );
    assert!(recs[0]["exec_count"].as_u64().unwrap() >= 1, "{}", rep.body);
    let audit = call(
        &url,
        &km,
        Method::GET,
        &format!("/v1/sandboxes/{mid}/audit"),
        None,
    );
    let exec_caller = audit.body["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["body"]["type"] == "exec")
        .and_then(|e| e["body"]["caller"].as_str())
        .unwrap_or_default()
        .to_owned();
    assert!(
        exec_caller.contains("tenant metered"),
        "exec caller {exec_caller:?}"
    );
    assert!(recs[0]["memory_gib_seconds"].as_f64().unwrap() > 0.0);
    assert!(recs[0]["ended_at"].is_string());

    // The report verifies offline; a changed record is named.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bill.json");
    std::fs::write(&file, serde_json::to_vec_pretty(&rep.body).unwrap()).unwrap();
    let key = call(&url, &km, Method::GET, "/v1/audit/key", None);
    let node_key = key.body["public_key"]
        .as_str()
        .or(key.body["key"].as_str())
        .unwrap_or_default()
        .to_owned();
    let verify = |f: &Path, with_key: bool| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_rampart"));
        c.args(["usage", "verify"]).arg(f);
        if with_key && !node_key.is_empty() {
            c.args(["--key", &node_key]);
        }
        c.output().unwrap()
    };
    let ok = verify(&file, true);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(String::from_utf8_lossy(&ok.stdout).starts_with("OK"));
    let mut tampered = rep.body.clone();
    tampered["sandboxes"][0]["vcpu_seconds"] = json!(billed / 2.0);
    let bad_file = dir.path().join("bill-tampered.json");
    std::fs::write(&bad_file, serde_json::to_vec_pretty(&tampered).unwrap()).unwrap();
    let bad = verify(&bad_file, false);
    assert_eq!(bad.status.code(), Some(1));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains(&format!("record 0 (sandbox {mid})")), "{err}");
}
