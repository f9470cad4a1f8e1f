//! The gVisor tier, end to end: a real daemon, real `runsc` sandboxes, the API as users call it.
//! Skips (with the reason) where `runsc` is not installed; `scripts/setup-host.sh` installs it.

mod support;

use serde_json::{json, Value};
use std::path::Path;
use support::{client, Sandbox};

/// Why these tests cannot run here, if they cannot.
fn skip() -> Option<String> {
    if let Some(why) = support::skip_reason() {
        return Some(why);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    if !std::env::split_paths(&path).any(|d| d.join("runsc").is_file()) {
        return Some("runsc (gVisor) is not installed: apt-get install runsc".into());
    }
    None
}

/// A small disk: each gVisor sandbox's disk is an image of this size (sparse).
const DISK: u64 = 64 << 20;

fn gvisor_sandbox(api: &support::Tidy) -> Sandbox {
    let s = Sandbox::create(
        api,
        json!({"isolation": "gvisor", "limits": {"disk_bytes": DISK}, "timeout_secs": 600}),
    );
    assert_eq!(s.info["isolation"], "gvisor", "{}", s.info);
    s
}

fn get(url: &str) -> (u16, Value) {
    let r = client().get(url).send().unwrap();
    let status = r.status().as_u16();
    (status, r.json().unwrap_or(Value::Null))
}

fn post(url: &str, body: Value) -> (u16, Value) {
    let r = client().post(url).json(&body).send().unwrap();
    let status = r.status().as_u16();
    (status, r.json().unwrap_or(Value::Null))
}

/// What the tier leaves of a sandbox on the host: its directory and its cgroup directories.
fn traces(data: &Path, id: &str) -> Vec<String> {
    let mut out = Vec::new();
    let dir = data.join("gvisor").join(id);
    if dir.exists() {
        out.push(dir.display().to_string());
    }
    for root in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
        if let Ok(rd) = std::fs::read_dir(root) {
            for h in rd.flatten() {
                for sub in [h.path(), Path::new(root).to_path_buf()] {
                    if let Ok(subs) = std::fs::read_dir(&sub) {
                        for t in subs.flatten() {
                            let p = t.path().join(id);
                            if t.file_name().to_string_lossy().ends_with("-gvisor") && p.exists() {
                                out.push(p.display().to_string());
                            }
                        }
                    }
                }
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Stops the daemon (SIGTERM: its sandboxes keep running) and starts it again on the same
/// data directory and another port.
fn restart(d: &mut support::Tidy) {
    d.daemon.stop();
    let fresh = support::start(&d.data, support::free_port(), &[]);
    // Stopped already; its drop would unmount the store the new daemon has just mounted.
    std::mem::forget(std::mem::replace(&mut d.daemon, fresh));
}

/// Starts a counter in `s` whose state is only in its process's memory (`/tmp/n` shows it,
/// `/tmp/pid` names the process) and waits until it counts.
fn start_counter(s: &Sandbox) {
    // Written aside and renamed: a reader never sees a half-written (empty) file.
    s.sh("nohup sh -c 'echo $$ > /tmp/pid; i=0; while :; do i=$((i+1)); echo $i > /tmp/n.t; mv /tmp/n.t /tmp/n; sleep 0.05; done' >/dev/null 2>&1 &");
    support::wait_until("the counter to run", 60, || count(s) > 2);
}

/// The counter's value (0 before it first wrote it).
fn count(s: &Sandbox) -> u64 {
    s.sh("cat /tmp/n 2>/dev/null")["stdout"]
        .as_str()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Writes `text` to `spec` and runs `rampart template build` of it on the host, into `data`.
fn build_template(data: &Path, spec: &Path, text: &str) -> std::process::Output {
    std::fs::write(spec, text).unwrap();
    std::process::Command::new(env!("CARGO_BIN_EXE_rampart"))
        .args(["template", "build", "--data-dir"])
        .arg(data)
        .arg("-f")
        .arg(spec)
        .output()
        .unwrap()
}

fn host_kernel() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap()
        .trim()
        .to_owned()
}

#[test]
fn a_gvisor_sandbox_runs_every_verb_on_gvisors_kernel_and_leaves_nothing() {
    if let Some(why) = skip() {
        eprintln!("skipped: {why}");
        return;
    }
    let d = support::start_tidy("gvisor-verbs");
    let s = gvisor_sandbox(&d);
    // Its kernel is gVisor's, not the host's.
    let r = s.sh("uname -r; dmesg | head -1");
    assert_eq!(r["exit_code"], 0, "{r}");
    let out = r["stdout"].as_str().unwrap();
    assert_ne!(out.lines().next(), Some(host_kernel().as_str()), "{r}");
    assert!(out.contains("gVisor"), "{r}");
    // Exit codes, stdin, the default user and root.
    let r = s.exec(json!({"cmd": ["sh", "-c", "cat; id -u; exit 3"], "stdin": "in\n"}));
    assert_eq!(r["exit_code"], 3, "{r}");
    assert_eq!(r["stdout"], "in\n1000\n", "{r}");
    let r = s.exec(json!({"cmd": ["id", "-u"], "user": "root"}));
    assert_eq!(r["stdout"], "0\n", "{r}");
    // Files through the API.
    let w = client()
        .put(s.url("/files?path=/home/user/note.txt"))
        .body("through the api")
        .send()
        .unwrap();
    assert!(w.status().is_success(), "{:?}", w.text());
    let body = client()
        .get(s.url("/files?path=/home/user/note.txt"))
        .send()
        .unwrap()
        .text()
        .unwrap();
    assert_eq!(body, "through the api");
    assert_eq!(s.sh("cat /home/user/note.txt")["stdout"], "through the api");
    // The sandbox's JSON and list say which tier.
    let (st, one) = get(&s.url(""));
    assert_eq!(
        (st, one["isolation"].as_str()),
        (200, Some("gvisor")),
        "{one}"
    );
    let (_, all) = get(&format!("{}/v1/sandboxes", d.url));
    let listed = all
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["id"] == s.id.as_str())
        .cloned()
        .unwrap_or_default();
    assert_eq!(listed["isolation"], "gvisor", "{all}");
    // Its disk is its quota: writing past it is ENOSPC inside.
    let r = s.sh("dd if=/dev/zero of=/home/user/big bs=1M count=200 2>&1; echo rc=$?");
    let out = r["stdout"].as_str().unwrap();
    assert!(
        out.contains("No space left") && !out.contains("rc=0"),
        "{r}"
    );
    s.sh("rm -f /home/user/big");
    // Pause keeps its processes: a counter stops while paused and goes on after.
    start_counter(&s);
    let (st, p) = post(&s.url("/pause"), json!({}));
    assert_eq!((st, p["state"].as_str()), (200, Some("paused")), "{p}");
    let (st, _) = post(&s.url("/exec"), json!({"cmd": ["true"]}));
    assert_eq!(st, 409);
    let (st, p) = post(&s.url("/resume"), json!({}));
    assert_eq!((st, p["state"].as_str()), (200, Some("running")), "{p}");
    let after = count(&s);
    support::wait_until("the counter to go on after resume", 60, || {
        count(&s) > after
    });
    // A pause to the filesystem ends its processes and keeps its disk; the resume boots it.
    s.sh("echo kept > /home/user/kept");
    let (st, p) = post(&s.url("/pause"), json!({"memory": false}));
    assert_eq!((st, p["state"].as_str()), (200, Some("paused")), "{p}");
    let (st, p) = post(&s.url("/resume"), json!({}));
    assert_eq!((st, p["state"].as_str()), (200, Some("running")), "{p}");
    assert_eq!(s.sh("cat /home/user/kept")["stdout"], "kept\n");
    // Destroy leaves nothing of it on the host, not even a zombie of the daemon's.
    assert!(!traces(&d.data, &s.id).is_empty());
    s.destroy();
    assert_eq!(traces(&d.data, &s.id), Vec::<String>::new());
    let daemon = d.daemon.child.id() as i32;
    support::wait_until("the daemon to have no zombie children", 60, || {
        zombies_of(daemon).is_empty()
    });
}

/// The zombie children of `parent`.
fn zombies_of(parent: i32) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let f: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, r)| r)
            .unwrap_or("")
            .split_whitespace()
            .collect();
        if f.first() == Some(&"Z") && f.get(1) == Some(&parent.to_string().as_str()) {
            out.push(pid);
        }
    }
    out
}

#[test]
fn a_node_without_runsc_refuses_gvisor_by_name_and_makes_nothing() {
    if let Some(why) = support::skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let conf = support::config_file("[gvisor]\nrunsc = \"/nonexistent/runsc\"\n");
    let d = support::start_tidy_with("gvisor-none", &[("RAMPART_CONFIG", conf.path.as_str())]);
    let (st, v) = post(
        &format!("{}/v1/sandboxes", d.url),
        json!({"isolation": "gvisor"}),
    );
    assert_eq!(st, 400, "{v}");
    let msg = v.to_string();
    assert!(
        msg.contains("isolation") && msg.contains("runsc") && msg.contains("apt-get install runsc"),
        "{msg}"
    );
    let (_, all) = get(&format!("{}/v1/sandboxes", d.url));
    assert_eq!(all.as_array().map(|a| a.len()), Some(0), "{all}");
    // An unknown tier is a 400 naming the known ones; the namespace tier is unaffected.
    let (st, v) = post(
        &format!("{}/v1/sandboxes", d.url),
        json!({"isolation": "vm"}),
    );
    assert_eq!(st, 400, "{v}");
    let s = Sandbox::create(&d, json!({}));
    assert_eq!(s.info["isolation"], "namespace", "{}", s.info);
    assert_eq!(s.sh("uname -r")["stdout"], format!("{}\n", host_kernel()));
}

#[test]
fn gvisor_refuses_what_it_cannot_do_yet_before_making_anything() {
    if let Some(why) = skip() {
        eprintln!("skipped: {why}");
        return;
    }
    let d = support::start_tidy("gvisor-refusals");
    let creates = format!("{}/v1/sandboxes", d.url);
    for body in [
        json!({"isolation": "gvisor", "network": {"mode": "open"}}),
        json!({"isolation": "gvisor", "artifacts": ["/home/user/out"]}),
        json!({"isolation": "gvisor", "volumes": [{"name": "v", "path": "/data"}]}),
    ] {
        let (st, v) = post(&creates, body.clone());
        assert_eq!(st, 400, "{body}: {v}");
        assert!(v.to_string().contains("isolation"), "{body}: {v}");
    }
    let (_, all) = get(&creates);
    assert_eq!(all.as_array().map(|a| a.len()), Some(0), "{all}");
    // A snapshot of a gVisor sandbox (its disk only, here) is taken; it runs on.
    let s = gvisor_sandbox(&d);
    let (st, v) = post(&s.url("/snapshots"), json!({"name": "g"}));
    assert_eq!((st, &v["memory"]), (201, &json!(false)), "{v}");
    assert_eq!(s.sh("echo ok")["stdout"], "ok\n");
    // The CLI, as users call it: `create --isolation`, the ISOLATION column of `ls`, `info`.
    let out = support::cli(
        &d.url,
        &["create", "--isolation", "gvisor", "--disk", "64M"],
        None,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let id = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let c = Sandbox::adopt(&d, &id);
    let ls = support::cli(&d.url, &["ls"], None);
    let ls = String::from_utf8_lossy(&ls.stdout).into_owned();
    assert!(
        ls.lines().next().unwrap_or("").contains("ISOLATION"),
        "{ls}"
    );
    let row = ls.lines().find(|l| l.starts_with(&id)).unwrap_or("");
    assert!(row.contains("gvisor"), "{ls}");
    let info = support::cli(&d.url, &["info", &id], None);
    assert!(
        String::from_utf8_lossy(&info.stdout).contains("isolation:   gvisor"),
        "{info:?}"
    );
    c.destroy();
}

#[test]
fn a_running_gvisor_sandbox_outlives_a_daemon_restart() {
    if let Some(why) = skip() {
        eprintln!("skipped: {why}");
        return;
    }
    let mut d = support::start_tidy("gvisor-restart");
    let mut s = gvisor_sandbox(&d);
    s.sh("echo before > /home/user/f");
    restart(&mut d);
    s.reattach(&d.daemon);
    let (st, v) = get(&s.url(""));
    assert_eq!((st, v["state"].as_str()), (200, Some("running")), "{v}");
    assert_eq!(v["isolation"], "gvisor", "{v}");
    let r = s.sh("cat /home/user/f; dmesg | head -1");
    assert!(
        r["stdout"].as_str().unwrap().starts_with("before\n")
            && r["stdout"].as_str().unwrap().contains("gVisor"),
        "{r}"
    );
    s.destroy();
    assert_eq!(traces(&d.data, &s.id), Vec::<String>::new());
}

#[test]
fn a_gvisor_sandbox_paused_to_disk_keeps_its_processes_across_a_daemon_restart() {
    if let Some(why) = skip() {
        eprintln!("skipped: {why}");
        return;
    }
    let mut d = support::start_tidy("gvisor-memory");
    let mut s = gvisor_sandbox(&d);
    // A process whose state is only in its memory: a counter, and its pid.
    start_counter(&s);
    let pid = s.sh("cat /tmp/pid")["stdout"].as_str().unwrap().to_owned();
    let before = count(&s);
    let (st, p) = post(&s.url("/pause"), json!({"disk": true}));
    assert_eq!((st, p["state"].as_str()), (200, Some("paused")), "{p}");
    // Nothing of it runs while so paused: no process in its cgroup, only its directory.
    assert_eq!(
        traces(&d.data, &s.id).len(),
        1,
        "{:?}",
        traces(&d.data, &s.id)
    );
    restart(&mut d);
    s.reattach(&d.daemon);
    let (st, v) = get(&s.url(""));
    assert_eq!((st, v["state"].as_str()), (200, Some("paused")), "{v}");
    let (st, p) = post(&s.url("/resume"), json!({}));
    assert_eq!((st, p["state"].as_str()), (200, Some("running")), "{p}");
    // The same process goes on counting from where it was.
    let r = s.sh(&format!("kill -0 {}; echo alive=$?", pid.trim()));
    assert!(r["stdout"].as_str().unwrap().contains("alive=0"), "{r}");
    let resumed = count(&s);
    assert!(
        resumed >= before,
        "counter went back: {before} -> {resumed}"
    );
    support::wait_until("the counter to go on after the restore", 60, || {
        count(&s) > resumed
    });
    // The namespace tier keeps memory in RAM only: a pause to disk with memory is a 400.
    let n = Sandbox::create(&d.daemon, json!({}));
    let (st, v) = post(&n.url("/pause"), json!({"disk": true}));
    assert_eq!(st, 400, "{v}");
    assert!(v.to_string().contains("disk"), "{v}");
    assert_eq!(n.sh("echo ok")["stdout"], "ok\n");
    s.destroy();
    assert_eq!(traces(&d.data, &s.id), Vec::<String>::new());
}

#[test]
fn a_template_names_its_tier_and_a_create_can_override_it() {
    if let Some(why) = skip() {
        eprintln!("skipped: {why}");
        return;
    }
    let d = support::start_tidy("gvisor-template");
    let spec = d.root.join("gv.toml");
    let out = build_template(
        &d.data,
        &spec,
        "name = \"gv\"\nfrom = \"template:base\"\nisolation = \"gvisor\"\n\
         [[steps]]\nrun = \"echo built > /home/user/gv-built\"\n",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Its sandboxes run on gVisor, with the template's layers.
    let s = Sandbox::create(
        &d,
        json!({"template": "gv", "limits": {"disk_bytes": DISK}}),
    );
    assert_eq!(s.info["isolation"], "gvisor", "{}", s.info);
    let r = s.sh("cat /home/user/gv-built; dmesg | head -1");
    assert!(
        r["stdout"].as_str().unwrap().starts_with("built\n")
            && r["stdout"].as_str().unwrap().contains("gVisor"),
        "{r}"
    );
    // A create that names a tier wins over the template's.
    let n = Sandbox::create(&d, json!({"template": "gv", "isolation": "namespace"}));
    assert_eq!(n.info["isolation"], "namespace", "{}", n.info);
    assert_eq!(n.sh("cat /home/user/gv-built")["stdout"], "built\n");
    // A spec naming an unknown tier is refused with the field's name.
    let out = build_template(
        &d.data,
        &spec,
        "name = \"bad\"\nfrom = \"template:base\"\nisolation = \"vm\"\n",
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("isolation"), "{err}");
}

#[test]
fn an_idle_gvisor_sandbox_sleeps_to_disk_with_its_memory_and_an_exec_wakes_it() {
    if let Some(why) = skip() {
        eprintln!("skipped: {why}");
        return;
    }
    let d = support::start_tidy("gvisor-idle");
    let s = Sandbox::create(
        &d,
        json!({"isolation": "gvisor", "limits": {"disk_bytes": DISK}, "timeout_secs": 600,
               "idle_pause_secs": 2}),
    );
    assert_eq!(s.info["idle_pause_secs"], 2, "{}", s.info);
    start_counter(&s);
    let pid = s.sh("cat /tmp/pid")["stdout"].as_str().unwrap().to_owned();
    let before = count(&s);
    // Asleep: paused to disk with its memory (nothing of it runs: only its directory).
    support::wait_until("the idle sandbox to sleep", 120, || {
        get(&s.url("")).1["state"] == "paused"
    });
    assert_eq!(
        traces(&d.data, &s.id).len(),
        1,
        "{:?}",
        traces(&d.data, &s.id)
    );
    let (_, events) = get(&s.url("/audit"));
    assert!(
        events.to_string().contains(r#""idle":true"#)
            && events.to_string().contains(r#""memory":true"#),
        "{events}"
    );
    // An exec wakes it: the same process counts on from where it was.
    let r = s.sh(&format!("kill -0 {}; echo alive=$?", pid.trim()));
    assert!(r["stdout"].as_str().unwrap().contains("alive=0"), "{r}");
    let woke = count(&s);
    assert!(woke >= before, "counter went back: {before} -> {woke}");
    assert_eq!(get(&s.url("")).1["state"], "running");
    let (_, events) = get(&s.url("/audit"));
    assert!(events.to_string().contains(r#""woken":true"#), "{events}");
    s.destroy();
    assert_eq!(traces(&d.data, &s.id), Vec::<String>::new());
}

#[test]
fn a_running_gvisor_sandbox_forks_and_snapshots_with_its_memory() {
    if let Some(why) = skip() {
        eprintln!("skipped: {why}");
        return;
    }
    let d = support::start_tidy("gvisor-fork");
    let s = gvisor_sandbox(&d);
    start_counter(&s);
    // State only in a process's memory: a shell variable set once and printed on request.
    s.sh("nohup sh -c 'v=$(head -c 8 /dev/urandom | od -An -tx1 | tr -d \" \"); while :; do echo $v > /tmp/v.t; mv /tmp/v.t /tmp/v; sleep 0.05; done' >/dev/null 2>&1 &");
    support::wait_until("the variable to be written", 60, || {
        s.sh("cat /tmp/v 2>/dev/null")["stdout"]
            .as_str()
            .is_some_and(|v| v.trim().len() == 16)
    });
    s.sh("echo parent > /home/user/f");
    let pid = s.sh("cat /tmp/pid")["stdout"].as_str().unwrap().to_owned();
    let secret = s.sh("cat /tmp/v")["stdout"].as_str().unwrap().to_owned();
    let before = count(&s);

    // Fork into three: each continues the same processes from the same memory, with its
    // own id, host name, disk and record.
    let (st, v) = post(&s.url("/fork"), json!({"count": 3}));
    assert_eq!(st, 201, "{v}");
    let forks: Vec<Sandbox> = v["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| Sandbox::adopt(&d.daemon, x["id"].as_str().unwrap()))
        .collect();
    assert_eq!(forks.len(), 3, "{v}");
    for (i, f) in forks.iter().enumerate() {
        assert_eq!(get(&f.url("")).1["isolation"], "gvisor");
        let r = f.sh(&format!("kill -0 {}; echo alive=$?; hostname", pid.trim()));
        let out = r["stdout"].as_str().unwrap();
        assert!(out.starts_with("alive=0\n"), "{r}");
        assert_eq!(out.lines().nth(1), Some(f.id.as_str()), "{r}");
        assert!(count(f) >= before, "fork {i} went back");
        support::wait_until("a fork's counter to go on", 60, || count(f) > before);
        assert_eq!(f.sh("cat /tmp/v")["stdout"].as_str().unwrap(), secret);
        f.sh(&format!("echo fork{i} > /home/user/f"));
        // Its record begins where its parent's was: the parent, its chain head at the
        // fork point, the digest of the saved processes.
        let (_, rec) = get(&f.url("/audit"));
        let created = rec["events"][0].to_string();
        assert!(
            created.contains(r#""parent":{"#)
                && created.contains(&format!(r#""sandbox":"{}""#, s.id))
                && created.contains(r#""checkpoint_digest":"sha256:"#),
            "{created}"
        );
    }
    for (i, f) in forks.iter().enumerate() {
        assert_eq!(
            f.sh("cat /home/user/f")["stdout"].as_str().unwrap(),
            format!("fork{i}\n")
        );
    }
    // `rampart audit verify FORK --parent SOURCE` proves where the fork's state came from;
    // a fork's bundle against another sandbox's, or with its parent's digest altered, fails.
    let bundle = |id: &str| {
        let b = client()
            .get(format!("{}/v1/sandboxes/{id}/audit/bundle", d.url))
            .send()
            .unwrap()
            .bytes()
            .unwrap();
        let f = d.root.join(format!("{id}.bundle.json"));
        std::fs::write(&f, &b).unwrap();
        f
    };
    let key = get(&format!("{}/v1/audit/key", d.url)).1["public_key"]
        .as_str()
        .unwrap()
        .to_owned();
    let verify = |child: &Path, parent: &Path| {
        std::process::Command::new(env!("CARGO_BIN_EXE_rampart"))
            .args(["audit", "verify"])
            .arg(child)
            .arg("--parent")
            .arg(parent)
            .args(["--key", &key])
            .output()
            .unwrap()
    };
    let (src, child, other) = (bundle(&s.id), bundle(&forks[0].id), bundle(&forks[1].id));
    let o = verify(&child, &src);
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{o:?}");
    assert!(
        text.contains("LINEAGE VERIFIED") && text.contains("with its processes and memory"),
        "{text}"
    );
    // The SDK's independent verifier reads the same bundles.
    for b in [&child, &src] {
        let py = std::process::Command::new("python3")
            .arg(support::workspace().join("sdk/python/rampart/verify.py"))
            .arg(b)
            .output()
            .unwrap();
        assert!(py.status.success(), "{py:?}");
    }
    let o = verify(&child, &other);
    assert!(!o.status.success(), "{o:?}");
    let altered = d.root.join("altered.json");
    let mut v: Value = serde_json::from_slice(&std::fs::read(&child).unwrap()).unwrap();
    v["events"][0]["body"]["spec"]["parent"]["checkpoint_digest"] =
        json!("sha256:0000000000000000000000000000000000000000000000000000000000000000");
    std::fs::write(&altered, serde_json::to_vec(&v).unwrap()).unwrap();
    let o = verify(&altered, &src);
    assert!(!o.status.success(), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("FAILED"),
        "{o:?}"
    );

    // The source runs on, its processes where they were, its disk its own.
    let r = s.sh(&format!(
        "kill -0 {}; echo alive=$?; cat /home/user/f",
        pid.trim()
    ));
    assert_eq!(r["stdout"].as_str().unwrap(), "alive=0\nparent\n", "{r}");
    assert_eq!(get(&s.url("")).1["state"], "running");

    // A snapshot with memory, and a create from it that continues its processes.
    let (st, v) = post(
        &s.url("/snapshots"),
        json!({"name": "gv-mem", "memory": true}),
    );
    assert_eq!((st, &v["memory"]), (201, &json!(true)), "{v}");
    let (_, v) = get(&format!("{}/v1/snapshots/gv-mem", d.url));
    assert_eq!(v["memory"], true, "{v}");
    let c = Sandbox::create(&d.daemon, json!({"snapshot": "gv-mem"}));
    assert_eq!(c.info["isolation"], "gvisor", "{}", c.info);
    let r = c.sh(&format!(
        "kill -0 {}; echo alive=$?; cat /home/user/f",
        pid.trim()
    ));
    assert_eq!(r["stdout"].as_str().unwrap(), "alive=0\nparent\n", "{r}");
    assert_eq!(c.sh("cat /tmp/v")["stdout"].as_str().unwrap(), secret);
    // Made from a gVisor snapshot, it runs on gVisor: the namespace tier is refused.
    let (st, e) = post(
        &format!("{}/v1/sandboxes", d.url),
        json!({"snapshot": "gv-mem", "isolation": "namespace"}),
    );
    assert_eq!(st, 400, "{e}");
    // The snapshot is deleted with its memory.
    let snaps = support::sandboxes_dir(&d.data)
        .parent()
        .unwrap()
        .join("snapshots/gv-mem");
    assert!(snaps.join("checkpoint/checkpoint.img").is_file());
    let r = client()
        .delete(format!("{}/v1/snapshots/gv-mem", d.url))
        .send()
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    assert!(!snaps.exists());
    for f in forks.iter().chain([&c, &s]) {
        f.destroy();
        assert_eq!(traces(&d.data, &f.id), Vec::<String>::new());
    }
}

#[test]
fn a_corrupt_checkpoint_fails_its_resume_clearly_and_leaves_the_sandbox_paused() {
    if let Some(why) = skip() {
        eprintln!("skipped: {why}");
        return;
    }
    let d = support::start_tidy("gvisor-corrupt");
    let s = gvisor_sandbox(&d);
    s.sh("echo kept > /home/user/f");
    start_counter(&s);
    let (st, p) = post(&s.url("/pause"), json!({"disk": true}));
    assert_eq!((st, p["state"].as_str()), (200, Some("paused")), "{p}");
    // Truncated to half: what a full disk or a crash mid-write leaves.
    let image = d
        .data
        .join("gvisor")
        .join(&s.id)
        .join("checkpoint/checkpoint.img");
    let len = std::fs::metadata(&image).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&image)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let (st, e) = post(&s.url("/resume"), json!({}));
    assert!(st >= 400, "{st} {e}");
    let msg = e["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("restore"), "{e}");
    // Still paused, its disk as it was: a reboot (its saved processes dropped) boots it
    // from that disk, the file there.
    let (_, v) = get(&s.url(""));
    assert_eq!(v["state"], "paused", "{v}");
    let (st, v) = post(&s.url("/resume"), json!({"reboot": true}));
    assert_eq!((st, v["state"].as_str()), (200, Some("running")), "{v}");
    assert_eq!(s.sh("cat /home/user/f")["stdout"], "kept\n");
    // No process of before runs after a reboot: the counter's loop is gone.
    let r = s.sh("for p in /proc/[0-9]*; do cat $p/cmdline 2>/dev/null; echo; done | tr '\\0' ' ' | grep -c 'mv /tmp/n[.]t'");
    assert_eq!(r["stdout"], "0\n", "{r}");
    s.destroy();
    assert_eq!(traces(&d.data, &s.id), Vec::<String>::new());
}

#[test]
fn the_e2b_sdk_pauses_and_snapshots_gvisor_sandboxes_with_their_processes() {
    if let Some(why) = skip() {
        eprintln!("skipped: {why}");
        return;
    }
    let conf = support::config_file("default_isolation = \"gvisor\"\n");
    let d = support::start_tidy_with("gvisor-e2b", &[("RAMPART_CONFIG", conf.path.as_str())]);
    let Some(r) = support::e2b_script(&d, "gvisor.py") else {
        return;
    };
    assert!(r.failed.is_empty(), "failed:\n{}", r.failed.join("\n"));
    assert_eq!(r.passed.len(), 2, "passed: {:?}", r.passed);
}

/// What the Python server of [`serve_digest`] answers on port 8000 of `id` (with `token`),
/// or None while nothing answers.
fn digest_answer(d: &support::Tidy, id: &str, token: &str) -> Option<String> {
    let r = client()
        .get(format!("{}/v1/sandboxes/{id}/ports/8000/", d.url))
        .header("X-Rampart-Token", token)
        .send()
        .ok()?;
    if !r.status().is_success() {
        return None;
    }
    r.text().ok().filter(|t| !t.is_empty())
}

/// Waits until the server of [`serve_digest`] in `id` answers, and returns its answer: a
/// restored sandbox's first connection may come before its server is scheduled again.
fn digest_awaited(d: &support::Tidy, id: &str, token: &str) -> String {
    let mut answer = None;
    support::wait_until("the Python server to answer", 120, || {
        answer = digest_answer(d, id, token);
        answer.is_some()
    });
    answer.unwrap()
}

/// Starts, in `s`, a Python server holding 100 MiB of random bytes in memory: it answers
/// the SHA-256 it computed at its start (a variable) and the one of the bytes it holds now.
fn serve_digest(d: &support::Tidy, s: &Sandbox) -> String {
    s.sh("cat > /tmp/srv.py <<'EOF'\nimport hashlib, http.server, os\ndata = os.urandom(100 << 20)\nat_start = hashlib.sha256(data).hexdigest()\nclass H(http.server.BaseHTTPRequestHandler):\n    def do_GET(self):\n        body = (at_start + ' ' + hashlib.sha256(data).hexdigest()).encode()\n        self.send_response(200)\n        self.send_header('Content-Length', str(len(body)))\n        self.end_headers()\n        self.wfile.write(body)\n    def log_message(self, *a):\n        pass\nhttp.server.HTTPServer(('127.0.0.1', 8000), H).serve_forever()\nEOF\nnohup python3 /tmp/srv.py >/dev/null 2>&1 &");
    let token = s.info["access_token"].as_str().unwrap().to_owned();
    let a = digest_awaited(d, &s.id, &token);
    let (x, y) = a.split_once(' ').unwrap();
    assert_eq!(x, y, "{a}");
    a
}

#[test]
fn a_python_server_holding_100_mib_keeps_its_memory_across_pause_fork_and_snapshot() {
    if let Some(why) = skip() {
        eprintln!("skipped: {why}");
        return;
    }
    let d = support::start_tidy("gvisor-python");
    let s = gvisor_sandbox(&d);
    let token = s.info["access_token"].as_str().unwrap().to_owned();
    let digest = serve_digest(&d, &s);
    // Paused to disk and resumed: the same server, the same bytes.
    let (st, p) = post(&s.url("/pause"), json!({"disk": true}));
    assert_eq!((st, p["state"].as_str()), (200, Some("paused")), "{p}");
    let (st, p) = post(&s.url("/resume"), json!({}));
    assert_eq!((st, p["state"].as_str()), (200, Some("running")), "{p}");
    assert_eq!(digest_awaited(&d, &s.id, &token), digest);
    // Forked into two: each fork's server answers the same, through its own token.
    let (st, v) = post(&s.url("/fork"), json!({"count": 2}));
    assert_eq!(st, 201, "{v}");
    let forks: Vec<(Sandbox, String)> = v["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            (
                Sandbox::adopt(&d.daemon, x["id"].as_str().unwrap()),
                x["access_token"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    for (f, t) in &forks {
        assert_eq!(digest_awaited(&d, &f.id, t), digest);
        assert_eq!(
            digest_answer(&d, &f.id, &token),
            None,
            "the source's token opens a fork"
        );
    }
    // A snapshot with memory and a sandbox made from it.
    let (st, v) = post(
        &s.url("/snapshots"),
        json!({"name": "py-mem", "memory": true}),
    );
    assert_eq!(st, 201, "{v}");
    let c = Sandbox::create(&d.daemon, json!({"snapshot": "py-mem"}));
    let ct = c.info["access_token"].as_str().unwrap().to_owned();
    assert_eq!(digest_awaited(&d, &c.id, &ct), digest);
    for f in forks.iter().map(|(f, _)| f).chain([&c, &s]) {
        f.destroy();
        assert_eq!(traces(&d.data, &f.id), Vec::<String>::new());
    }
}
