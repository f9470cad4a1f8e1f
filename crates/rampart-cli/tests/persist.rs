//! Snapshots, fork and volumes through a real daemon (see docs/persistence.md): a snapshot
//! then a create from it sees the files (owned as before); a memory snapshot and bad names
//! are refused and leave nothing; fork gives N sandboxes that see the state and then diverge,
//! each with its own host name and machine id; a volume's data outlives its sandbox and a
//! daemon restart, a read-only mount refuses writes, the quota gives ENOSPC, a mounted volume
//! cannot be removed.
//!
//! Needs root and the `rampart-jailer` / `rampart-agent` binaries next to `rampart`; otherwise
//! it prints `skipped: <reason>`.

mod support;

use serde_json::{json, Value};
use support::{client, free_port, post, skip_reason, start, Api as _, Daemon, Sandbox};

fn get(d: &Daemon, path: &str) -> (u16, Value) {
    let r = client().get(format!("{}{path}", d.url)).send().unwrap();
    let s = r.status().as_u16();
    (s, r.json().unwrap_or(Value::Null))
}

fn delete(d: &Daemon, path: &str) -> (u16, Value) {
    let r = client().delete(format!("{}{path}", d.url)).send().unwrap();
    let s = r.status().as_u16();
    (s, r.json().unwrap_or(Value::Null))
}

/// Runs a bash script as `user`; returns (exit code, stdout, stderr).
fn sh(sb: &Sandbox, script: &str) -> (i64, String, String) {
    let v = sb.exec(json!({"cmd": ["bash", "-c", script], "user": "user"}));
    (
        v["exit_code"].as_i64().unwrap_or(-1),
        v["stdout"].as_str().unwrap_or("").to_owned(),
        v["stderr"].as_str().unwrap_or("").to_owned(),
    )
}

fn ok(sb: &Sandbox, script: &str) -> String {
    let (code, out, err) = sh(sb, script);
    assert_eq!(code, 0, "{script:?} in {}: {out} {err}", sb.id);
    out.trim().to_owned()
}

fn snapshots_dir(data: &std::path::Path) -> std::path::PathBuf {
    support::sandboxes_dir(data)
        .parent()
        .unwrap()
        .join("snapshots")
}

fn leftovers(data: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(snapshots_dir(data))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with('.'))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn snapshots_fork_and_volumes() {
    if let Some(why) = skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let port = free_port();
    let d = start(&data, port, &[]);

    let a = Sandbox::create(&d, json!({"timeout_secs": 600}));
    ok(&a, "echo hello > ~/f && mkdir -p ~/dir && echo deep > ~/dir/g && sudo sh -c 'echo r > /root/rf'");
    let a_mid = ok(&a, "cat /etc/machine-id");

    // Refusals leave nothing behind.
    let (s, v) = post(
        &d,
        &format!("/v1/sandboxes/{}/snapshots", a.id),
        json!({"memory": true}),
    );
    assert_eq!(s, 400, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("memory"),
        "{v}"
    );
    let (s, v) = post(
        &d,
        &format!("/v1/sandboxes/{}/snapshots", a.id),
        json!({"name": "../x"}),
    );
    assert_eq!(s, 400, "{v}");
    assert!(leftovers(&data).is_empty(), "{:?}", leftovers(&data));

    // Snapshot, then a sandbox from it.
    let (s, v) = post(
        &d,
        &format!("/v1/sandboxes/{}/snapshots", a.id),
        json!({"name": "s1"}),
    );
    assert_eq!(s, 201, "{v}");
    assert_eq!(v["memory"], false);
    assert_eq!(v["source"], a.id.as_str());
    let (s, _) = post(
        &d,
        &format!("/v1/sandboxes/{}/snapshots", a.id),
        json!({"name": "s1"}),
    );
    assert_eq!(s, 400, "a name in use is refused");
    let (_, list) = get(&d, "/v1/snapshots");
    assert!(list.as_array().unwrap().iter().any(|x| x["name"] == "s1"));
    ok(&a, "echo after > ~/later");
    let b = Sandbox::create(&d, json!({"snapshot": "s1", "timeout_secs": 600}));
    assert_eq!(ok(&b, "cat ~/f ~/dir/g"), "hello\ndeep");
    assert_eq!(ok(&b, "stat -c %U:%G ~/f ~/dir | sort -u"), "user:user");
    assert_eq!(ok(&b, "sudo cat /root/rf"), "r");
    assert_eq!(ok(&b, "test -e ~/later && echo yes || echo no"), "no");
    assert_ne!(ok(&b, "cat /etc/machine-id"), a_mid);
    let (s, v) = post(&d, "/v1/sandboxes", json!({"snapshot": "nope"}));
    assert_eq!(s, 400, "{v}");

    // Fork: the state is shared, then each diverges alone.
    let (s, v) = post(
        &d,
        &format!("/v1/sandboxes/{}/fork", a.id),
        json!({"count": 2}),
    );
    assert_eq!(s, 201, "{v}");
    let forks: Vec<Sandbox> = v["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| Sandbox::adopt(&d, x["id"].as_str().unwrap()))
        .collect();
    assert_eq!(forks.len(), 2);
    // Each fork has a port access token of its own, as a create's answer does.
    let tokens: Vec<&str> = v["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["access_token"].as_str().unwrap_or_default())
        .collect();
    assert!(tokens.iter().all(|t| t.len() == 64), "{v}");
    assert_ne!(tokens[0], tokens[1]);
    let (f1, f2) = (&forks[0], &forks[1]);
    for f in [f1, f2] {
        assert_eq!(ok(f, "cat ~/f ~/later"), "hello\nafter");
        assert_eq!(ok(f, "hostname"), f.id);
    }
    ok(f1, "echo one > ~/mine");
    ok(f2, "echo two > ~/mine");
    assert_eq!(ok(f1, "cat ~/mine"), "one");
    assert_eq!(ok(f2, "cat ~/mine"), "two");
    assert_eq!(ok(&a, "test -e ~/mine && echo yes || echo no"), "no");
    let m1 = ok(f1, "cat /etc/machine-id");
    let m2 = ok(f2, "cat /etc/machine-id");
    assert_ne!(m1, m2);
    assert_ne!(m1, a_mid);
    // Lineage: the fork point is a `snapshot` event in the source's record, and each fork's
    // record begins by naming it (a disk-only point: no digest of saved processes).
    let (_, rec) = get(&d, &format!("/v1/sandboxes/{}/audit", a.id));
    assert!(rec.to_string().contains(r#""forks":2"#), "{rec}");
    for f in [f1, f2] {
        let (_, rec) = get(&d, &format!("/v1/sandboxes/{}/audit", f.id));
        let parent = &rec["events"][0]["body"]["spec"]["parent"];
        assert_eq!(parent["sandbox"], json!(a.id), "{rec}");
        assert_eq!(parent["checkpoint_digest"], Value::Null, "{rec}");
    }
    assert!(leftovers(&data).is_empty(), "{:?}", leftovers(&data));

    // An injected fault (the snapshots directory made immutable): the snapshot fails, the
    // sandbox runs on (thawed), nothing is recorded or left.
    let snaps = snapshots_dir(&data);
    let chattr = |flag: &str| {
        std::process::Command::new("chattr")
            .arg(flag)
            .arg(&snaps)
            .status()
            .is_ok_and(|s| s.success())
    };
    if chattr("+i") {
        let (s, v) = post(
            &d,
            &format!("/v1/sandboxes/{}/snapshots", a.id),
            json!({"name": "s3"}),
        );
        assert!(chattr("-i"));
        assert_eq!(s, 500, "{v}");
        assert_eq!(ok(&a, "cat ~/f"), "hello");
        let (s, _) = get(&d, "/v1/snapshots/s3");
        assert_eq!(s, 404);
        assert!(leftovers(&data).is_empty(), "{:?}", leftovers(&data));
    } else {
        eprintln!("chattr +i not available here: fault injection skipped");
    }
    // A paused sandbox stays paused through a snapshot.
    let (s, _) = post(&d, &format!("/v1/sandboxes/{}/pause", a.id), json!({}));
    assert_eq!(s, 200);
    let (s, v) = post(
        &d,
        &format!("/v1/sandboxes/{}/snapshots", a.id),
        json!({"name": "s4"}),
    );
    assert_eq!(s, 201, "{v}");
    let (_, v) = get(&d, &format!("/v1/sandboxes/{}", a.id));
    assert_eq!(v["state"], "paused", "{v}");
    let (s, _) = post(&d, &format!("/v1/sandboxes/{}/resume", a.id), json!({}));
    assert_eq!(s, 200);
    assert_eq!(ok(&a, "cat ~/f"), "hello");
    let (s, _) = delete(&d, "/v1/snapshots/s4");
    assert_eq!(s, 204);

    // Volumes.
    let (s, v) = post(&d, "/v1/volumes", json!({"name": "v1", "size_mib": 64}));
    assert_eq!(s, 201, "{v}");
    let c = Sandbox::create(
        &d,
        json!({"timeout_secs": 600, "volumes": [{"name": "v1", "path": "/data"}]}),
    );
    assert_eq!(ok(&c, "stat -c %U /data"), "user");
    ok(&c, "echo kept > /data/x && sync");
    let (code, _, err) = sh(
        &c,
        "dd if=/dev/zero of=/data/big bs=1M count=100 2>&1; sync",
    );
    let _ = code;
    let (code, out, _) = sh(&c, "ls -l /data/big; df -m /data | tail -1");
    assert_eq!(code, 0, "{out} {err}");
    let (code, out, err2) = sh(&c, "dd if=/dev/zero of=/data/big2 bs=1M count=100 2>&1");
    assert_ne!(code, 0, "quota not enforced: {out} {err2}");
    assert!(
        out.contains("No space left") || err2.contains("No space left"),
        "{out} {err2}"
    );
    ok(&c, "rm -f /data/big /data/big2");
    let r = Sandbox::create(
        &d,
        json!({"timeout_secs": 600, "volumes": [{"name": "v1", "path": "/ro", "read_only": true}]}),
    );
    assert_eq!(ok(&r, "cat /ro/x"), "kept");
    let (code, _, err) = sh(&r, "touch /ro/y");
    assert_ne!(code, 0);
    assert!(err.contains("Read-only"), "{err}");
    let (s, v) = delete(&d, "/v1/volumes/v1");
    assert_eq!(s, 409, "a mounted volume is not removed: {v}");
    let (s, v) = post(
        &d,
        "/v1/sandboxes",
        json!({"volumes": [{"name": "v1", "path": "/proc/x"}]}),
    );
    assert_eq!(s, 400, "{v}");
    for sb in [&c, &r] {
        let (s, _) = delete(&d, &format!("/v1/sandboxes/{}", sb.id));
        assert_eq!(s, 200);
    }

    // Snapshots and volumes outlive a daemon restart; the volume's data outlives sandboxes.
    drop(d);
    let d = start(&data, free_port(), &[]);
    let (_, list) = get(&d, "/v1/volumes");
    assert!(
        list.as_array().unwrap().iter().any(|x| x["name"] == "v1"),
        "{list}"
    );
    let e = Sandbox::create(
        &d,
        json!({"timeout_secs": 600, "volumes": [{"name": "v1", "path": "/home/user/v"}]}),
    );
    assert_eq!(ok(&e, "cat ~/v/x"), "kept");
    let (s, _) = delete(&d, &format!("/v1/sandboxes/{}", e.id));
    assert_eq!(s, 200);
    let (s, v) = delete(&d, "/v1/volumes/v1");
    assert_eq!(s, 204, "{v}");

    // The CLI: volume create|ls|rm, create --volume, snapshot ID|ls|rm, fork -n.
    let cli = |args: &[&str]| -> String {
        let out = d.cli(args);
        assert!(
            out.status.success(),
            "rampart {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    assert_eq!(cli(&["volume", "create", "cv", "--size", "32M"]), "cv");
    assert!(cli(&["volume", "ls"]).contains("cv"));
    let h = cli(&["create", "--volume", "cv:/cv:ro", "--timeout", "600"]);
    let hs = Sandbox::adopt(&d, &h);
    let (code, _, _) = sh(&hs, "touch /cv/x");
    assert_ne!(code, 0, "read-only from the CLI's :ro");
    assert_eq!(cli(&["snapshot", &h, "--name", "cs"]), "cs");
    assert!(cli(&["snapshot", "ls"]).contains("cs"));
    let forks = cli(&["fork", &h, "-n", "2"]);
    assert_eq!(forks.lines().count(), 2, "{forks}");
    for id in forks.lines().chain([h.as_str()]) {
        cli(&["rm", id]);
    }
    assert_eq!(cli(&["snapshot", "rm", "cs"]), "cs");
    assert_eq!(cli(&["volume", "rm", "cv"]), "cv");

    // Pause to disk: snapshot with stop destroys the source.
    let (s, v) = post(
        &d,
        &format!("/v1/sandboxes/{}/snapshots", b.id),
        json!({"name": "s2", "stop": true}),
    );
    assert_eq!(s, 201, "{v}");
    let (_, v) = get(&d, &format!("/v1/sandboxes/{}", b.id));
    assert_eq!(v["state"], "destroyed", "{v}");
    let g = Sandbox::create(&d, json!({"snapshot": "s2"}));
    assert_eq!(ok(&g, "cat ~/f"), "hello");
    for n in ["s1", "s2"] {
        let (s, v) = delete(&d, &format!("/v1/snapshots/{n}"));
        assert_eq!(s, 204, "{v}");
    }
    let (s, _) = get(&d, "/v1/snapshots/s1");
    assert_eq!(s, 404);
    for sb in [&a, f1, f2, &g] {
        let _ = delete(&d, &format!("/v1/sandboxes/{}", sb.id));
    }
    assert!(leftovers(&data).is_empty(), "{:?}", leftovers(&data));
}

#[test]
fn a_fork_that_fails_midway_leaves_no_fork_and_no_image() {
    if let Some(why) = skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let config = tmp.path().join("rampart.toml");
    std::fs::write(&config, "max_sandboxes = 3\n").unwrap();
    let d = start(
        &data,
        free_port(),
        &[("RAMPART_CONFIG", config.to_str().unwrap())],
    );
    let a = Sandbox::create(&d, json!({"timeout_secs": 600}));
    ok(&a, "echo state > ~/s");
    // Room for two more: the third fork fails, the two made are destroyed.
    let (s, v) = post(
        &d,
        &format!("/v1/sandboxes/{}/fork", a.id),
        json!({"count": 3}),
    );
    assert_eq!(s, 503, "{v}");
    let (_, list) = get(&d, "/v1/sandboxes");
    let alive: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["id"].as_str().unwrap())
        .collect();
    assert_eq!(alive, vec![a.id.as_str()], "only the source is left");
    assert!(leftovers(&data).is_empty(), "{:?}", leftovers(&data));
    let (s, v) = post(
        &d,
        &format!("/v1/sandboxes/{}/fork", a.id),
        json!({"count": 21}),
    );
    assert_eq!(s, 400, "{v}");
    // The source is untouched and can still be forked.
    let (s, v) = post(
        &d,
        &format!("/v1/sandboxes/{}/fork", a.id),
        json!({"count": 2}),
    );
    assert_eq!(s, 201, "{v}");
    for f in v["sandboxes"].as_array().unwrap() {
        let id = f["id"].as_str().unwrap();
        let fork = Sandbox::adopt(&d, id);
        assert_eq!(ok(&fork, "cat ~/s"), "state");
        let _ = delete(&d, &format!("/v1/sandboxes/{id}"));
    }
    let _ = delete(&d, &format!("/v1/sandboxes/{}", a.id));
}
