//! Template builds through the E2B API do not let one tenant starve another (issue 33): a
//! daemon started as operators start it (build limits set small through its `RAMPART_BUILD_*`
//! environment), tenants `acme` (A) and `rival` (B) with E2B keys made with the CLI, the
//! template API driven by hand (the requests the SDK's `Template.build` sends).
//!
//! - `sandbox_blocks_build_logs_filling_memory`: a build printing a 64 MiB line without a
//!   newline and 512 lines of 1 MiB ends, its log on disk (0600, within its bound, the long
//!   lines cut with the count of bytes dropped, the middle of the log dropped with a note),
//!   and the daemon's resident memory grows by less than 64 MiB.
//! - `sandbox_blocks_reservation_flood`: a tenant's reservations beyond its cap are refused
//!   (429, with the reason), another tenant still reserves, and reservations never started
//!   are forgotten after their TTL.
//! - `sandbox_blocks_tenant_holding_the_build_slot`: while B's builds run `sleep infinity`
//!   (B queued three), A's build still ends `ready` before B's third ran (tenants take the
//!   slot in turn); B's build ends `error` by its step timeout, with the reason; B's started
//!   builds beyond its cap are refused; a queued build and a running one are cancelled.
//! - `sandbox_blocks_build_running_after_cancel`: cancelling a running build ends it `error`
//!   (`cancelled by the API`) and kills its build sandbox (its processes are gone).
//!
//! Needs root, the jailer and the agent (template builds need the namespace tier);
//! otherwise it prints `skipped: <reason>`.

mod support;

use reqwest::Method;
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use support::{e2b_call as e2b, make_key, reserve_build as reserve, start_tidy_with, Answer, Tidy};

/// A daemon with tenants `acme` (A) and `rival` (B), each with an E2B key.
struct World {
    d: Tidy,
    a: String,
    b: String,
}

fn world(name: &str, envs: &[(&str, &str)]) -> Option<World> {
    if let Some(why) = support::skip_reason() {
        eprintln!("skipped: {why}");
        return None;
    }
    let d = start_tidy_with(name, envs);
    support::make_tenants(&d.url, &["acme", "rival"]);
    Some(World {
        a: make_key(&d.data, &["--e2b", "--tenant", "acme"]),
        b: make_key(&d.data, &["--e2b", "--tenant", "rival"]),
        d,
    })
}

/// Starts reserved build `bid` of `name` on `base` with `steps` (`POST /v2/.../builds/{bid}`).
fn start(url: &str, key: &str, name: &str, bid: &str, steps: Value) -> Answer {
    e2b(
        url,
        key,
        Method::POST,
        &format!("/v2/templates/{name}/builds/{bid}"),
        Some(json!({"fromTemplate": "base", "steps": steps})),
    )
}

/// Reserves and starts a build of `name` running `cmd` as root: its build id.
fn launch(url: &str, key: &str, name: &str, cmd: &str) -> String {
    let r = reserve(url, key, name);
    assert_eq!(r.status, 202, "reserve {name}: {:?}", r.body);
    let bid = r.body["buildID"].as_str().unwrap().to_owned();
    let s = start(url, key, name, &bid, run(cmd));
    assert_eq!(s.status, 202, "start {name}: {:?}", s.body);
    bid
}

fn run(cmd: &str) -> Value {
    json!([{"type": "RUN", "args": [cmd, "root"]}])
}

/// The status of build `bid` of `name` (with log entries from `offset`).
fn status(url: &str, key: &str, name: &str, bid: &str, offset: usize) -> Answer {
    e2b(
        url,
        key,
        Method::GET,
        &format!("/templates/{name}/builds/{bid}/status?logsOffset={offset}"),
        None,
    )
}

/// Every log entry's message of build `bid` (paging through the status answers).
fn messages(url: &str, key: &str, name: &str, bid: &str) -> Vec<String> {
    let mut out = Vec::new();
    loop {
        let s = status(url, key, name, bid, out.len());
        assert_eq!(s.status, 200, "{:?}", s.body);
        let page: Vec<String> = s.body["logEntries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["message"].as_str().unwrap_or_default().to_owned())
            .collect();
        if page.is_empty() {
            return out;
        }
        out.extend(page);
    }
}

/// Polls the status of build `bid` until `done` holds for it, failing after `secs`: the last
/// answer's body.
fn wait_status(
    url: &str,
    key: &str,
    name: &str,
    bid: &str,
    secs: u64,
    what: &str,
    done: impl Fn(&Answer) -> bool,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let s = status(url, key, name, bid, 0);
        if done(&s) {
            return s.body;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {} {:?}",
            s.status,
            s.body
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn is(s: &Answer, st: &str) -> bool {
    s.status == 200 && s.body["status"] == st
}

/// Whether build `bid`'s log shows a step running `cmd` (the builder's step line).
fn step_running(url: &str, key: &str, name: &str, bid: &str, cmd: &str) -> bool {
    messages(url, key, name, bid)
        .iter()
        .any(|m| m.starts_with("[builder ") && m.contains(cmd))
}

/// Whether build `bid` ran any step (the builder's step lines).
fn ran(url: &str, key: &str, name: &str, bid: &str) -> bool {
    messages(url, key, name, bid)
        .iter()
        .any(|m| m.starts_with("[builder "))
}

/// The daemon's resident memory, KiB (`VmRSS` of `/proc/<pid>/status`).
fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Pids of processes whose command line contains `marker`.
fn processes_with(marker: &str) -> Vec<u32> {
    let mut v = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return v;
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if let Ok(c) = std::fs::read(e.path().join("cmdline")) {
            if String::from_utf8_lossy(&c).contains(marker) {
                v.push(pid);
            }
        }
    }
    v
}

#[test]
fn sandbox_blocks_build_logs_filling_memory() {
    let Some(w) = world("build-logs-memory", &[]) else {
        return;
    };
    let url = &w.d.url;
    let pid = w.d.daemon.child.id();
    // A first small build: what any build makes the daemon load is loaded before measuring.
    let warm = launch(url, &w.a, "warm", "echo warm");
    wait_status(url, &w.a, "warm", &warm, 300, "the warm-up build", |s| {
        is(s, "ready")
    });
    let before = rss_kib(pid);
    let steps = json!([
        {"type": "RUN", "args": ["head -c 67108864 /dev/zero | tr '\\0' a", "root"]},
        {"type": "RUN", "args": [
            "i=0; while [ $i -lt 512 ]; do head -c 1048576 /dev/zero | tr '\\0' b; echo; i=$((i+1)); done",
            "root"
        ]},
    ]);
    let r = reserve(url, &w.a, "noisy");
    assert_eq!(r.status, 202, "{:?}", r.body);
    let bid = r.body["buildID"].as_str().unwrap().to_owned();
    let s = start(url, &w.a, "noisy", &bid, steps);
    assert_eq!(s.status, 202, "{:?}", s.body);
    let t0 = Instant::now();
    let end = wait_status(url, &w.a, "noisy", &bid, 600, "the noisy build", |s| {
        is(s, "ready") || is(s, "error")
    });
    let secs = t0.elapsed().as_secs_f64();
    assert_eq!(end["status"], "ready", "{end:?}");
    let after = rss_kib(pid);
    let grown = after.saturating_sub(before);
    eprintln!(
        "noisy build: {secs:.1} s; daemon VmRSS {before} KiB before, {after} KiB after \
         (+{grown} KiB)"
    );
    assert!(
        grown < 64 * 1024,
        "the daemon grew by {grown} KiB ({before} -> {after})"
    );

    // The log: on disk, 0600, within its bound; long lines cut with the count dropped; the
    // middle dropped with a note; its end kept.
    let file = w.d.data.join("build-logs").join(format!("{bid}.jsonl"));
    let md = std::fs::metadata(&file).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(md.permissions().mode() & 0o777, 0o600);
    assert!(
        md.len() <= (8 << 20) + (64 << 10),
        "log of {} bytes",
        md.len()
    );
    let dir_mode = std::fs::metadata(file.parent().unwrap())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(dir_mode & 0o777, 0o700);
    let all = messages(url, &w.a, "noisy", &bid);
    let long = all
        .iter()
        .find(|m| m.starts_with("aaaa"))
        .expect("the long line");
    assert!(
        long.ends_with(&format!(
            "[line cut: {} bytes dropped]",
            67108864 - (16 << 10)
        )),
        "{}",
        &long[long.len().saturating_sub(80)..]
    );
    assert!(long.len() < (16 << 10) + 64);
    assert!(
        all.iter().any(|m| m.starts_with("log cut: ")),
        "no note of the dropped middle"
    );
    assert_eq!(all.last().map(String::as_str), Some("Template is ready"));
    // The logs endpoint reads the same file, newest first when asked.
    let l = e2b(
        url,
        &w.a,
        Method::GET,
        &format!("/templates/noisy/builds/{bid}/logs?direction=backward&limit=1"),
        None,
    );
    assert_eq!(l.status, 200, "{:?}", l.body);
    assert_eq!(l.body["logs"][0]["message"], "Template is ready");
}

#[test]
fn sandbox_blocks_reservation_flood() {
    let Some(w) = world(
        "build-reservations",
        &[
            ("RAMPART_BUILD_RESERVATION_TTL_SECS", "3"),
            ("RAMPART_BUILD_MAX_RESERVED", "4"),
        ],
    ) else {
        return;
    };
    let url = &w.d.url;
    let mut held = Vec::new();
    for i in 0..4 {
        let r = reserve(url, &w.a, &format!("flood{i}"));
        assert_eq!(r.status, 202, "{:?}", r.body);
        held.push((
            format!("flood{i}"),
            r.body["buildID"].as_str().unwrap().to_owned(),
        ));
    }
    let r = reserve(url, &w.a, "flood4");
    assert_eq!(r.status, 429, "{:?}", r.body);
    let msg = r.body["message"].as_str().unwrap_or_default();
    assert!(msg.contains("reserved and not started"), "{msg}");
    // Another tenant is not refused for A's reservations.
    let rb = reserve(url, &w.b, "mine");
    assert_eq!(rb.status, 202, "{:?}", rb.body);
    // Never started: forgotten after the TTL.
    for (name, bid) in &held {
        wait_status(url, &w.a, name, bid, 60, "the reservation to expire", |s| {
            s.status == 404
        });
    }
    let r = reserve(url, &w.a, "flood5");
    assert_eq!(r.status, 202, "after expiry: {:?}", r.body);
}

#[test]
fn sandbox_blocks_tenant_holding_the_build_slot() {
    let Some(w) = world(
        "build-slot",
        &[
            ("RAMPART_BUILD_STEP_TIMEOUT_SECS", "8"),
            ("RAMPART_BUILD_MAX_ACTIVE", "3"),
        ],
    ) else {
        return;
    };
    let url = &w.d.url;
    // B takes the slot with a step that never ends, and queues two more.
    let b1 = launch(url, &w.b, "hog1", "sleep infinity");
    let deadline = Instant::now() + Duration::from_secs(300);
    while !step_running(url, &w.b, "hog1", &b1, "sleep infinity") {
        assert!(Instant::now() < deadline, "B's first build did not start");
        std::thread::sleep(Duration::from_millis(200));
    }
    let b2 = launch(url, &w.b, "hog2", "sleep infinity");
    let b3 = launch(url, &w.b, "hog3", "sleep infinity");
    // B's fourth started build is beyond its cap.
    let r = reserve(url, &w.b, "hog4");
    assert_eq!(r.status, 202, "{:?}", r.body);
    let b4 = r.body["buildID"].as_str().unwrap().to_owned();
    let s = start(url, &w.b, "hog4", &b4, run("true"));
    assert_eq!(s.status, 429, "{:?}", s.body);
    let msg = s.body["message"].as_str().unwrap_or_default();
    assert!(msg.contains("started and not ended"), "{msg}");

    // A's build, started after B queued three, is served before B's third.
    let a1 = launch(url, &w.a, "quick", "echo quick");
    let t0 = Instant::now();
    wait_status(url, &w.a, "quick", &a1, 300, "A's build", |s| {
        assert!(!is(s, "error"), "A's build failed: {:?}", s.body);
        is(s, "ready")
    });
    eprintln!(
        "A's build ready {:.1} s after it was started",
        t0.elapsed().as_secs_f64()
    );
    assert!(
        !ran(url, &w.b, "hog3", &b3),
        "B's third build ran before A's"
    );
    assert!(is(&status(url, &w.b, "hog3", &b3, 0), "building"));

    // B's first ended by its step timeout, with the reason.
    let s1 = status(url, &w.b, "hog1", &b1, 0);
    assert!(is(&s1, "error"), "{:?}", s1.body);
    let why = s1.body["reason"]["message"].as_str().unwrap_or_default();
    assert!(
        why.contains("timed out") && why.contains("step timeout"),
        "{why}"
    );

    // Cancel: B's queued third ends at once; its running second ends shortly.
    let c = e2b(
        url,
        &w.b,
        Method::DELETE,
        &format!("/v2/templates/hog3/builds/{b3}"),
        None,
    );
    assert_eq!(c.status, 202, "{:?}", c.body);
    assert_eq!(c.body["status"], "error");
    let s3 = status(url, &w.b, "hog3", &b3, 0);
    assert!(
        s3.body["reason"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("cancelled"),
        "{:?}",
        s3.body
    );
    // A cannot cancel B's build (it does not exist for A).
    let c = e2b(
        url,
        &w.a,
        Method::DELETE,
        &format!("/v2/templates/hog2/builds/{b2}"),
        None,
    );
    assert_eq!(c.status, 404, "{:?}", c.body);
    let c = e2b(
        url,
        &w.b,
        Method::DELETE,
        &format!("/v2/templates/hog2/builds/{b2}"),
        None,
    );
    assert_eq!(c.status, 202, "{:?}", c.body);
    let end = wait_status(url, &w.b, "hog2", &b2, 60, "B's second build to end", |s| {
        is(s, "error")
    });
    let why = end["reason"]["message"].as_str().unwrap_or_default();
    assert!(
        why.contains("cancelled") || why.contains("timed out"),
        "{why}"
    );
    // An ended build is not cancelled again.
    let c = e2b(
        url,
        &w.b,
        Method::DELETE,
        &format!("/v2/templates/hog1/builds/{b1}"),
        None,
    );
    assert_eq!(c.status, 409, "{:?}", c.body);
}

#[test]
fn sandbox_blocks_build_running_after_cancel() {
    let Some(w) = world("build-cancel", &[]) else {
        return;
    };
    let url = &w.d.url;
    let marker = format!("rampart-cancel-{}", support::token());
    let bid = launch(
        url,
        &w.a,
        "endless",
        &format!("sleep 3600 && echo {marker}"),
    );
    let deadline = Instant::now() + Duration::from_secs(300);
    while processes_with(&marker).is_empty() {
        assert!(
            Instant::now() < deadline,
            "the build's step did not start: {:?}",
            status(url, &w.a, "endless", &bid, 0).body
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let c = e2b(
        url,
        &w.a,
        Method::DELETE,
        &format!("/v2/templates/endless/builds/{bid}"),
        None,
    );
    assert_eq!(c.status, 202, "{:?}", c.body);
    let end = wait_status(url, &w.a, "endless", &bid, 60, "the cancelled build", |s| {
        is(s, "error")
    });
    assert_eq!(end["reason"]["message"], "cancelled by the API", "{end:?}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = processes_with(&marker);
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the build sandbox's processes live on: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The slot is free: the next build runs.
    let next = launch(url, &w.a, "after", "echo after");
    wait_status(url, &w.a, "after", &next, 300, "the next build", |s| {
        is(s, "ready")
    });
}
