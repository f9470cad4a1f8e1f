//! Idle sleep and wake on the namespace tier, through a real daemon as users reach it: a
//! sandbox made with `rampart create --idle-pause 2` sleeps (is paused) after two seconds
//! without a request, and the next request wakes it and gets its answer: an exec through
//! the CLI, an HTTP request through an exposed port, and (with `[e2b] idle_pause_secs`) the
//! unmodified `e2b` SDK's calls (`tests/e2b/idle.py`).
//!
//! Needs root and the binaries; the SDK part needs `target/e2b-venv` (`scripts/test`
//! installs it), otherwise each prints `skipped: <reason>`.

mod support;

use serde_json::{json, Value};
use support::{client, Sandbox};

fn state(s: &Sandbox) -> String {
    let v: Value = client().get(s.url("")).send().unwrap().json().unwrap();
    v["state"].as_str().unwrap_or_default().to_owned()
}

fn asleep(s: &Sandbox) {
    support::wait_until("the idle sandbox to sleep", 60, || state(s) == "paused");
}

/// The sandbox's record: its event bodies as JSON text.
fn record(s: &Sandbox) -> String {
    client()
        .get(s.url("/audit"))
        .send()
        .unwrap()
        .text()
        .unwrap()
}

#[test]
fn a_sleeping_sandbox_wakes_for_an_exec_a_port_request_and_the_e2b_sdk() {
    if let Some(why) = support::skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let conf = support::config_file("[e2b]\nidle_pause_secs = 2\n");
    let d = support::start_tidy_with("idle", &[("RAMPART_CONFIG", conf.path.as_str())]);

    // Made as a user would, with the CLI against this daemon.
    let o = support::cli(
        &d.url,
        &["create", "--idle-pause", "2", "--timeout", "600", "--json"],
        None,
    );
    assert!(o.status.success(), "{o:?}");
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let s = Sandbox::adopt(&d.daemon, v["id"].as_str().unwrap());
    assert_eq!(v["idle_pause_secs"], 2, "{v}");
    // A server that outlives the exec that started it (no client holds the sandbox awake).
    s.sh("mkdir -p /tmp/www && echo served > /tmp/www/index.txt && cd /tmp/www && nohup python3 -m http.server 8000 >/dev/null 2>&1 &");
    let token = v["access_token"].as_str().unwrap().to_owned();
    let page = || {
        client()
            .get(s.url("/ports/8000/index.txt"))
            .header("X-Rampart-Token", &token)
            .send()
            .unwrap()
    };
    support::wait_until("the server to listen", 60, || page().status() == 200);

    // Asleep; an exec through the CLI wakes it and gets its answer.
    asleep(&s);
    let o = support::cli(&d.url, &["exec", &s.id, "--", "echo", "woke"], None);
    assert!(o.status.success(), "{o:?}");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "woke\n");
    assert_eq!(state(&s), "running");

    // Asleep again; an HTTP request through the exposed port wakes it: the server froze
    // with it and answers.
    asleep(&s);
    let r = page();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().unwrap(), "served\n");
    assert_eq!(state(&s), "running");
    let rec = record(&s);
    assert_eq!(rec.matches(r#""idle":true"#).count(), 2, "{rec}");
    assert_eq!(rec.matches(r#""woken":true"#).count(), 2, "{rec}");

    // `info` shows the setting; a port request without the sandbox's token is refused
    // (401) and wakes nothing.
    let o = support::cli(&d.url, &["info", &s.id, "--json"], None);
    let info: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(info["idle_pause_secs"], 2, "{info}");
    asleep(&s);
    let r = reqwest::blocking::Client::new()
        .get(s.url("/ports/8000/index.txt"))
        .send()
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(state(&s), "paused");

    // Bad input: 0 seconds is refused with the field's name.
    let (st, e) = support::post(&d.daemon, "/v1/sandboxes", json!({"idle_pause_secs": 0}));
    assert_eq!(st, 400, "{e}");
    assert!(e.to_string().contains("idle_pause_secs"), "{e}");
    s.destroy();

    // The E2B face: `[e2b] idle_pause_secs` puts every E2B sandbox to sleep; the SDK's next
    // call wakes it.
    let Some(r) = support::e2b_script(&d, "idle.py") else {
        return;
    };
    assert!(r.failed.is_empty(), "failed:\n{}", r.failed.join("\n"));
    assert_eq!(r.passed.len(), 3, "passed: {:?}", r.passed);
}
