//! Restart recovery (tier 2): `kill -9` of a real daemon with sandboxes alive, one of which dies
//! while the daemon is down; a new daemon on the same data directory must re-attach the live
//! one (files and processes intact) and remove every trace of the dead one: no directory,
//! cgroup, loop device, mount or process. The traces are listed before and after.
//!
//! Needs root and the `rampart-jailer` / `rampart-agent` binaries next to `rampart`; otherwise
//! it prints `skipped: <reason>`.

mod support;

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use support::{client, free_port, post, skip_reason, start, wait_until, Daemon};

const SUBTREE: &str = "rampart";

fn create(d: &Daemon) -> String {
    let r = client()
        .post(format!("{}/v1/sandboxes", d.url))
        .json(&json!({"timeout_secs": 600}))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    r.json::<Value>().unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

fn exec(d: &Daemon, id: &str, script: &str) -> Value {
    let r = client()
        .post(format!("{}/v1/sandboxes/{id}/exec", d.url))
        .json(&json!({"cmd": ["bash", "-c", script]}))
        .send()
        .unwrap();
    let status = r.status().as_u16();
    let v: Value = r.json().unwrap();
    assert_eq!(status, 200, "exec {script:?}: {v}");
    v
}

fn state(d: &Daemon, id: &str) -> String {
    let v: Value = client()
        .get(format!("{}/v1/sandboxes/{id}", d.url))
        .send()
        .unwrap()
        .json()
        .unwrap();
    v["state"].as_str().unwrap_or("?").to_owned()
}

/// Every host-side trace of a sandbox, as human-readable strings. A destroyed sandbox's
/// directory and cgroups are renamed `dying-<id>` until the jail's janitor has reaped its
/// killed processes and removed them: those count as traces too.
fn traces(data: &Path, id: &str) -> Vec<String> {
    let mut t = Vec::new();
    let names = [id.to_owned(), format!("dying-{id}")];
    for name in &names {
        let dir = support::sandboxes_dir(data).join(name);
        if dir.exists() {
            t.push(format!("dir {}", dir.display()));
        }
    }
    for root in [
        Path::new("/sys/fs/cgroup"),
        Path::new("/sys/fs/cgroup/unified"),
    ] {
        let Ok(entries) = std::fs::read_dir(root) else {
            continue;
        };
        for (e, name) in entries
            .flatten()
            .flat_map(|e| names.iter().map(move |n| (e.path(), n)))
        {
            let cg = e.join(SUBTREE).join(name);
            if cg.is_dir() {
                t.push(format!("cgroup {}", cg.display()));
                for pid in std::fs::read_to_string(cg.join("cgroup.procs"))
                    .unwrap_or_default()
                    .lines()
                {
                    t.push(format!("process {pid} in {}", cg.display()));
                }
            }
        }
    }
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for l in mountinfo.lines().filter(|l| l.contains(id)) {
        t.push(format!("mount {l}"));
    }
    if let Ok(entries) = std::fs::read_dir("/sys/block") {
        for e in entries.flatten() {
            let bf = e.path().join("loop/backing_file");
            if let Ok(s) = std::fs::read_to_string(&bf) {
                if s.contains(id) {
                    t.push(format!(
                        "loop {} -> {}",
                        e.file_name().to_string_lossy(),
                        s.trim()
                    ));
                }
            }
        }
    }
    t
}

/// Host pids of a sandbox's processes (from its pids-controller cgroup, v1 or v2).
fn sandbox_pids(id: &str) -> Vec<i32> {
    for cg in [
        format!("/sys/fs/cgroup/pids/{SUBTREE}/{id}/cgroup.procs"),
        format!("/sys/fs/cgroup/{SUBTREE}/{id}/cgroup.procs"),
    ] {
        if let Ok(s) = std::fs::read_to_string(&cg) {
            return s.lines().filter_map(|l| l.trim().parse().ok()).collect();
        }
    }
    Vec::new()
}

#[test]
fn kill_9_then_restart_reattaches_the_live_and_cleans_the_dead() {
    if let Some(why) = skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let root: PathBuf =
        std::env::temp_dir().join(format!("rampart-recovery-{}", std::process::id()));
    let data = root.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let port = free_port();

    let first = start(&data, port, &[]);
    let live = create(&first);
    let dead = create(&first);
    exec(
        &first,
        &live,
        "echo kept > /home/user/state.txt; setsid sleep 1000 >/dev/null 2>&1 < /dev/null &",
    );
    let before_live = traces(&data, &live);
    let before_dead = traces(&data, &dead);
    eprintln!("before: live {before_live:#?}\nbefore: dead {before_dead:#?}");
    assert!(
        before_live.iter().any(|t| t.starts_with("cgroup")),
        "no cgroup for a live sandbox?"
    );
    assert!(before_dead.iter().any(|t| t.starts_with("dir")));

    // kill -9 the daemon: its sandboxes keep running.
    drop(first);
    // While it is down, the `dead` sandbox's processes die (we kill them by pid: they are the
    // processes this test made).
    for pid in sandbox_pids(&dead) {
        // SAFETY: kill(2) on pids read from the cgroup of a sandbox this test created.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    wait_until("the dead sandbox's processes are gone", 30, || {
        sandbox_pids(&dead).is_empty()
    });

    let second = start(&data, port, &[]);
    wait_until("the dead sandbox is cleaned", 30, || {
        traces(&data, &dead).is_empty()
    });
    let after_dead = traces(&data, &dead);
    eprintln!("after: dead {after_dead:#?}");
    assert!(after_dead.is_empty(), "leaked: {after_dead:#?}");
    assert_eq!(state(&second, &dead), "destroyed");

    assert_eq!(state(&second, &live), "running");
    let v = exec(
        &second,
        &live,
        "cat /home/user/state.txt; pgrep -x sleep >/dev/null && echo sleeping",
    );
    assert_eq!(v["stdout"], "kept\nsleeping\n", "{v}");

    let r = client()
        .delete(format!("{}/v1/sandboxes/{live}", second.url))
        .send()
        .unwrap();
    assert!(r.status().is_success());
    // Destroy returns once every process is SIGKILLed; the janitor then removes the rest.
    wait_until("the destroyed sandbox's traces are gone", 30, || {
        traces(&data, &live).is_empty()
    });
    let after_live = traces(&data, &live);
    assert!(
        after_live.is_empty(),
        "leaked after destroy: {after_live:#?}"
    );
    drop(second);
    let _ = std::fs::remove_dir_all(&root);
}

fn count(d: &Daemon, id: &str) -> u64 {
    exec(d, id, "cat /tmp/count")["stdout"]
        .as_str()
        .unwrap_or("")
        .trim()
        .parse()
        .unwrap_or(0)
}

#[test]
fn a_paused_sandbox_survives_kill_9_and_resumes_where_it_was() {
    if let Some(why) = skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let root: PathBuf = std::env::temp_dir().join(format!("rampart-pause-{}", std::process::id()));
    let data = root.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let port = free_port();

    let first = start(&data, port, &[]);
    let id = create(&first);
    exec(
        &first,
        &id,
        "setsid bash -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.05; done' \
         >/dev/null 2>&1 < /dev/null &",
    );
    wait_until("the counter starts", 30, || count(&first, &id) > 0);
    let (s, v) = post(&first, &format!("/v1/sandboxes/{id}/pause"), json!({}));
    assert_eq!((s, v["state"].as_str()), (200, Some("paused")), "{v}");
    let before = traces(&data, &id);
    // exec and files answer 409 while paused.
    let (s, v) = post(
        &first,
        &format!("/v1/sandboxes/{id}/exec"),
        json!({"cmd": ["true"]}),
    );
    assert_eq!(s, 409, "{v}");
    assert_eq!(v["error"]["code"], "conflict", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("paused"),
        "{v}"
    );

    // kill -9 the daemon; a new one re-attaches the sandbox, still paused.
    drop(first);
    let second = start(&data, port, &[]);
    assert_eq!(state(&second, &id), "paused");
    assert_eq!(traces(&data, &id), before, "the paused sandbox changed");
    let (s, _) = post(
        &second,
        &format!("/v1/sandboxes/{id}/exec"),
        json!({"cmd": ["true"]}),
    );
    assert_eq!(s, 409);

    // `rampart resume` (the CLI) continues every process where it was.
    let out = Command::new(env!("CARGO_BIN_EXE_rampart"))
        .args(["--host", &second.url, "resume", &id])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{id} running\n")
    );
    let n = count(&second, &id);
    assert!(n > 0);
    wait_until("the counter goes on after resume", 30, || {
        count(&second, &id) > n
    });

    // `rampart pause` and expiry with on_timeout=pause.
    let out = Command::new(env!("CARGO_BIN_EXE_rampart"))
        .args(["--host", &second.url, "pause", &id])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{id} paused\n")
    );
    let (s, v) = post(
        &second,
        "/v1/sandboxes",
        json!({"timeout_secs": 1, "on_timeout": "pause"}),
    );
    assert_eq!(s, 201, "{v}");
    let auto = v["id"].as_str().unwrap().to_owned();
    wait_until("on_timeout=pause pauses at expiry", 30, || {
        state(&second, &auto) == "paused"
    });
    let (s, v) = post(&second, &format!("/v1/sandboxes/{auto}/resume"), json!({}));
    assert_eq!((s, v["state"].as_str()), (200, Some("running")), "{v}");
    assert_eq!(exec(&second, &auto, "echo ok")["stdout"], "ok\n");
    // Unknown fields stay refused.
    let (s, _) = post(&second, "/v1/sandboxes", json!({"on_timeout": "hibernate"}));
    assert_eq!(s, 400);

    for sid in [&id, &auto] {
        let r = client()
            .delete(format!("{}/v1/sandboxes/{sid}", second.url))
            .send()
            .unwrap();
        assert!(r.status().is_success());
        wait_until("the destroyed sandbox's traces are gone", 30, || {
            traces(&data, sid).is_empty()
        });
    }
    drop(second);
    let _ = std::fs::remove_dir_all(&root);
}
