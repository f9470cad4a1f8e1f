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
use support::{client, free_port, post, skip_reason, start, wait_until, Api as _, Daemon, Sandbox};

const SUBTREE: &str = "rampart";

fn create(d: &Daemon) -> Sandbox {
    Sandbox::create(d, json!({"timeout_secs": 600}))
}

/// Runs `bash -c script` in `sb`.
fn bash(sb: &Sandbox, script: &str) -> Value {
    sb.exec(json!({"cmd": ["bash", "-c", script]}))
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
    bash(
        &live,
        "echo kept > /home/user/state.txt; setsid sleep 1000 >/dev/null 2>&1 < /dev/null &",
    );
    let before_live = traces(&data, &live.id);
    let before_dead = traces(&data, &dead.id);
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
    for pid in sandbox_pids(&dead.id) {
        // SAFETY: kill(2) on pids read from the cgroup of a sandbox this test created.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    wait_until("the dead sandbox's processes are gone", 30, || {
        sandbox_pids(&dead.id).is_empty()
    });

    let second = start(&data, port, &[]);
    wait_until("the dead sandbox is cleaned", 30, || {
        traces(&data, &dead.id).is_empty()
    });
    let after_dead = traces(&data, &dead.id);
    eprintln!("after: dead {after_dead:#?}");
    assert!(after_dead.is_empty(), "leaked: {after_dead:#?}");
    assert_eq!(state(&second, &dead.id), "destroyed");

    assert_eq!(state(&second, &live.id), "running");
    let v = bash(
        &live,
        "cat /home/user/state.txt; pgrep -x sleep >/dev/null && echo sleeping",
    );
    assert_eq!(v["stdout"], "kept\nsleeping\n", "{v}");

    live.destroy();
    // Destroy returns once every process is SIGKILLed; the janitor then removes the rest.
    wait_until("the destroyed sandbox's traces are gone", 30, || {
        traces(&data, &live.id).is_empty()
    });
    let after_live = traces(&data, &live.id);
    assert!(
        after_live.is_empty(),
        "leaked after destroy: {after_live:#?}"
    );
    drop(second);
    let _ = std::fs::remove_dir_all(&root);
}

fn count(sb: &Sandbox) -> u64 {
    bash(sb, "cat /tmp/count")["stdout"]
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
    let paused = create(&first);
    bash(
        &paused,
        "setsid bash -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.05; done' \
         >/dev/null 2>&1 < /dev/null &",
    );
    wait_until("the counter starts", 30, || count(&paused) > 0);
    let (s, v) = post(
        &first,
        &format!("/v1/sandboxes/{}/pause", paused.id),
        json!({}),
    );
    assert_eq!((s, v["state"].as_str()), (200, Some("paused")), "{v}");
    let before = traces(&data, &paused.id);
    // exec and files answer 409 while paused.
    let (s, v) = post(
        &first,
        &format!("/v1/sandboxes/{}/exec", paused.id),
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
    assert_eq!(state(&second, &paused.id), "paused");
    assert_eq!(
        traces(&data, &paused.id),
        before,
        "the paused sandbox changed"
    );
    let (s, _) = post(
        &second,
        &format!("/v1/sandboxes/{}/exec", paused.id),
        json!({"cmd": ["true"]}),
    );
    assert_eq!(s, 409);

    // `rampart resume` (the CLI) continues every process where it was.
    let out = second.cli(&["resume", &paused.id]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{} running\n", paused.id)
    );
    let n = count(&paused);
    assert!(n > 0);
    wait_until("the counter goes on after resume", 30, || {
        count(&paused) > n
    });

    // `rampart pause` and expiry with on_timeout=pause.
    let out = second.cli(&["pause", &paused.id]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{} paused\n", paused.id)
    );
    let auto = Sandbox::create(&second, json!({"timeout_secs": 1, "on_timeout": "pause"}));
    wait_until("on_timeout=pause pauses at expiry", 30, || {
        state(&second, &auto.id) == "paused"
    });
    let (s, v) = post(
        &second,
        &format!("/v1/sandboxes/{}/resume", auto.id),
        json!({}),
    );
    assert_eq!((s, v["state"].as_str()), (200, Some("running")), "{v}");
    assert_eq!(bash(&auto, "echo ok")["stdout"], "ok\n");
    // Unknown fields stay refused.
    let (s, _) = post(&second, "/v1/sandboxes", json!({"on_timeout": "hibernate"}));
    assert_eq!(s, 400);

    for sb in [&paused, &auto] {
        sb.destroy();
        wait_until("the destroyed sandbox's traces are gone", 30, || {
            traces(&data, &sb.id).is_empty()
        });
    }
    drop(second);
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn a_sandbox_paused_to_its_filesystem_survives_kill_9_and_boots_from_its_disk() {
    if let Some(why) = skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let root: PathBuf =
        std::env::temp_dir().join(format!("rampart-fspause-{}", std::process::id()));
    let data = root.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let port = free_port();

    let first = start(&data, port, &[]);
    let sb = create(&first);
    bash(
        &sb,
        "echo kept > /home/user/f; setsid bash -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.05; done' \
         >/dev/null 2>&1 < /dev/null &",
    );
    wait_until("the counter starts", 30, || count(&sb) > 0);
    let running = traces(&data, &sb.id);
    assert!(
        running.iter().any(|t| t.starts_with("process")),
        "{running:?}"
    );
    // A pause to the filesystem: every process ends, the disk stays (its directory only: no
    // cgroup, process, mount or loop device).
    let out = first.cli(&["pause", "--filesystem", &sb.id]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{} paused\n", sb.id)
    );
    let at_rest = traces(&data, &sb.id);
    assert_eq!(at_rest.len(), 1, "{at_rest:?}");
    assert!(at_rest[0].starts_with("dir "), "{at_rest:?}");
    let (s, v) = post(
        &first,
        &format!("/v1/sandboxes/{}/exec", sb.id),
        json!({"cmd": ["true"]}),
    );
    assert_eq!(s, 409, "{v}");
    // Pausing it again changes nothing.
    let (s, v) = post(
        &first,
        &format!("/v1/sandboxes/{}/pause", sb.id),
        json!({"memory": false}),
    );
    assert_eq!((s, v["state"].as_str()), (200, Some("paused")), "{v}");

    // kill -9 the daemon as if during a boot from the disk: the disk moved aside
    // (`.relaunch-<id>`), no new sandbox yet (the store is the daemon's mount: moved while it
    // runs). A new daemon puts the disk back, keeps the sandbox paused, and boots it later.
    let dir = support::sandboxes_dir(&data);
    std::fs::rename(dir.join(&sb.id), dir.join(format!(".relaunch-{}", sb.id))).unwrap();
    drop(first);
    let second = start(&data, port, &[]);
    assert_eq!(state(&second, &sb.id), "paused");
    assert_eq!(
        traces(&data, &sb.id),
        at_rest,
        "recovery touched the kept disk"
    );

    // `rampart resume` boots it from its disk: the file is there, the counter is not.
    let out = second.cli(&["resume", &sb.id]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{} running\n", sb.id)
    );
    assert_eq!(bash(&sb, "cat /home/user/f")["stdout"], "kept\n");
    let n = count(&sb);
    assert!(n > 0, "the counter's file was kept");
    assert_eq!(
        bash(&sb, "pgrep -f 'echo [$]i' || echo none")["stdout"],
        "none\n",
        "a process of before the pause runs"
    );
    // The record says what happened.
    let show = second.cli(&["audit", "show", &sb.id]);
    let text = String::from_utf8_lossy(&show.stdout);
    assert!(text.contains("paused to its filesystem"), "{text}");
    assert!(
        text.contains("resumed: booted again from its disk"),
        "{text}"
    );

    // A frozen pause resumed with a reboot drops the processes too.
    bash(&sb, "setsid sleep 4242 >/dev/null 2>&1 < /dev/null &");
    let (s, _) = post(
        &second,
        &format!("/v1/sandboxes/{}/pause", sb.id),
        json!({}),
    );
    assert_eq!(s, 200);
    let out = second.cli(&["resume", "--reboot", &sb.id]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        bash(&sb, "pgrep -x sleep || echo none")["stdout"],
        "none\n",
        "the frozen process came back"
    );

    // Expiry with on_timeout=pause_filesystem.
    let auto = Sandbox::create(
        &second,
        json!({"timeout_secs": 1, "on_timeout": "pause_filesystem"}),
    );
    bash(&auto, "echo at-expiry > /home/user/g");
    wait_until("on_timeout=pause_filesystem pauses at expiry", 30, || {
        state(&second, &auto.id) == "paused"
    });
    wait_until("its processes end", 30, || {
        sandbox_pids(&auto.id).is_empty()
    });
    let (s, v) = post(
        &second,
        &format!("/v1/sandboxes/{}/resume", auto.id),
        json!({}),
    );
    assert_eq!((s, v["state"].as_str()), (200, Some("running")), "{v}");
    assert_eq!(bash(&auto, "cat /home/user/g")["stdout"], "at-expiry\n");

    // Destroyed while paused to its filesystem: nothing is left.
    let out = second.cli(&["pause", "--filesystem", &auto.id]);
    assert!(out.status.success(), "{out:?}");
    for s in [&sb, &auto] {
        s.destroy();
        wait_until("the destroyed sandbox's traces are gone", 30, || {
            traces(&data, &s.id).is_empty()
        });
    }
    let leftovers: Vec<_> = std::fs::read_dir(support::sandboxes_dir(&data))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(&sb.id) || n.contains(&auto.id))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    drop(second);
    let _ = std::fs::remove_dir_all(&root);
}
