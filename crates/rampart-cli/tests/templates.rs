//! Templates end to end (tier 2): `rampart template build` from a spec whose base is an OCI
//! image layout this test makes by hand (the host's dash, coreutils and their libraries, plus
//! a second layer with a whiteout and an opaque directory), with copy and run steps; a
//! daemon on the same data directory creates a sandbox of it and sees its files, env, user,
//! workdir and start command; a rebuild after changing one step reuses the earlier layers;
//! a failed and an interrupted (SIGINT) build leave nothing behind. One more test builds
//! `debian:bookworm` with mmdebstrap (skipped, with the reason, when deb.debian.org or
//! mmdebstrap is not available).
//!
//! Needs root and the `rampart-jailer` / `rampart-agent` binaries next to `rampart`;
//! otherwise it prints `skipped: <reason>`.

mod support;

use serde_json::{json, Value};
use sha2::Digest as _;
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, Command, Stdio};
use std::time::Duration;
use support::{client, free_port, skip_reason, start, wait_until, Sandbox};

fn rampart() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rampart"))
}

fn token() -> String {
    format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0)
    )
}

/// Host files of the hand-made image: programs and the libraries they load.
const PROGRAMS: &[&str] = &[
    "/usr/bin/dash",
    "/usr/bin/cat",
    "/usr/bin/id",
    "/usr/bin/env",
    "/usr/bin/ls",
    "/usr/bin/echo",
    "/usr/bin/mkdir",
    "/usr/bin/chown",
    "/usr/bin/sleep",
    "/usr/bin/pwd",
    "/usr/bin/true",
    "/usr/bin/test",
];

fn libraries(progs: &[&str]) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    for p in progs {
        let o = Command::new("ldd").arg(p).output().unwrap();
        for l in String::from_utf8_lossy(&o.stdout).lines() {
            // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or "/lib64/ld-linux... (0x...)"
            let path = l
                .split("=>")
                .nth(1)
                .unwrap_or(l)
                .split_whitespace()
                .next()
                .unwrap_or("");
            if path.starts_with('/') {
                // Store by the canonical /usr path (the image is usr-merged).
                let real = std::fs::canonicalize(path).unwrap();
                out.insert(PathBuf::from(path));
                out.insert(real);
            }
        }
    }
    out
}

fn usr_path(p: &Path) -> String {
    let s = p.to_string_lossy();
    let s = s.trim_start_matches('/');
    if s.starts_with("usr/") {
        s.to_owned()
    } else {
        format!("usr/{s}")
    }
}

struct Tar(tar::Builder<Vec<u8>>);

impl Tar {
    fn new() -> Tar {
        Tar(tar::Builder::new(Vec::new()))
    }
    fn header(kind: tar::EntryType, mode: u32, uid: u64, size: u64) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_uid(uid);
        h.set_gid(uid);
        h.set_size(size);
        h.set_mtime(1_700_000_000);
        h
    }
    fn dir(&mut self, p: &str, mode: u32, uid: u64) {
        let mut h = Tar::header(tar::EntryType::Directory, mode, uid, 0);
        self.0.append_data(&mut h, p, &[][..]).unwrap();
    }
    fn file(&mut self, p: &str, data: &[u8], mode: u32) {
        let mut h = Tar::header(tar::EntryType::Regular, mode, 0, data.len() as u64);
        self.0.append_data(&mut h, p, data).unwrap();
    }
    fn symlink(&mut self, p: &str, target: &str) {
        let mut h = Tar::header(tar::EntryType::Symlink, 0o777, 0, 0);
        self.0.append_link(&mut h, p, target).unwrap();
    }
    fn finish(self) -> Vec<u8> {
        self.0.into_inner().unwrap()
    }
}

fn sha(b: &[u8]) -> String {
    sha2::Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

/// Writes the OCI image layout: layer 1 = a tiny usr-merged system from host files; layer
/// 2 = a whiteout of `/etc/removed.txt` and `/opt/data` made opaque with one new file.
fn make_image(dir: &Path) {
    let mut t = Tar::new();
    for d in [
        "usr/",
        "usr/bin/",
        "usr/lib/",
        "usr/lib/x86_64-linux-gnu/",
        "usr/lib64/",
        "etc/",
        "opt/",
        "opt/data/",
        "tmp/",
        "root/",
        "home/",
    ] {
        t.dir(d, if d == "tmp/" { 0o1777 } else { 0o755 }, 0);
    }
    t.dir("home/user/", 0o755, 1000);
    t.symlink("bin", "usr/bin");
    t.symlink("lib", "usr/lib");
    t.symlink("lib64", "usr/lib64");
    let mut seen = BTreeSet::new();
    for p in PROGRAMS {
        let data = std::fs::read(p).unwrap();
        let name = usr_path(Path::new(p));
        seen.insert(name.clone());
        t.file(&name, &data, 0o755);
    }
    t.symlink("usr/bin/sh", "dash");
    // The agent (PID 1 of every sandbox) is dynamically linked: its libraries too.
    let agent = Path::new(env!("CARGO_BIN_EXE_rampart"))
        .parent()
        .unwrap()
        .join("rampart-agent");
    let agent = agent.to_string_lossy().into_owned();
    let mut progs = PROGRAMS.to_vec();
    progs.push(&agent);
    for l in libraries(&progs) {
        let name = usr_path(&l);
        if !seen.insert(name.clone()) {
            continue;
        }
        let md = std::fs::symlink_metadata(&l).unwrap();
        if md.file_type().is_symlink() {
            let target = std::fs::read_link(&l).unwrap();
            t.symlink(&name, &target.to_string_lossy());
        } else {
            t.file(&name, &std::fs::read(&l).unwrap(), 0o755);
        }
    }
    t.file(
        "etc/passwd",
        b"root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh\n",
        0o644,
    );
    t.file("etc/group", b"root:x:0:\nuser:x:1000:\n", 0o644);
    t.file("etc/removed.txt", b"should be whited out\n", 0o644);
    t.file("opt/data/old.txt", b"hidden by the opaque dir\n", 0o644);
    let l1 = t.finish();
    let mut t = Tar::new();
    t.file("etc/.wh.removed.txt", b"", 0o644);
    t.dir("opt/data/", 0o755, 0);
    t.file("opt/data/.wh..wh..opq", b"", 0o644);
    t.file("opt/data/new.txt", b"from layer 2\n", 0o644);
    let l2 = t.finish();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &l1).unwrap();
    let l1 = gz.finish().unwrap();

    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    let put = |b: &[u8]| {
        let h = sha(b);
        std::fs::write(blobs.join(&h), b).unwrap();
        (format!("sha256:{h}"), b.len())
    };
    let (d1, n1) = put(&l1);
    let (d2, n2) = put(&l2);
    let cfg = serde_json::to_vec(&json!({
        "architecture": "amd64", "os": "linux",
        "config": {"Env": ["PATH=/usr/bin:/bin", "IMG_ENV=from-image"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": []}
    }))
    .unwrap();
    let (cd, cn) = put(&cfg);
    let man = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": cn},
        "layers": [
            {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": d1, "size": n1},
            {"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": d2, "size": n2},
        ],
    }))
    .unwrap();
    let (md, mn) = put(&man);
    std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    std::fs::write(
        dir.join("index.json"),
        serde_json::to_vec(&json!({"schemaVersion": 2, "manifests": [
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": md, "size": mn}]}))
        .unwrap(),
    )
    .unwrap();
}

fn spec(name: &str, run: &str) -> String {
    format!(
        r#"name = "{name}"
from = "oci:image"
[[steps]]
copy = {{ src = "files/greeting.txt", dest = "/srv/greeting.txt" }}
[[steps]]
run = "{run}"
[[steps]]
env = {{ APP = "demo" }}
[[steps]]
user = "user"
[[steps]]
workdir = "/home/user/work"
[start]
cmd = ["/bin/sh", "-c", "echo started-as-$(id -un) > /tmp/started; exec sleep 1000"]
ready = {{ cmd = "test -s /tmp/started" }}
"#
    )
}

/// Starts `rampart template build --json` of `spec_file` and reads its stderr until its run
/// step has printed `sleeping`: the build is then inside that step.
fn build_until_sleeping(
    data: &Path,
    spec_file: &Path,
) -> (Child, std::io::Lines<BufReader<ChildStderr>>) {
    let mut child = rampart()
        .args(["template", "build", "--json", "--data-dir"])
        .arg(data)
        .arg("-f")
        .arg(spec_file)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    loop {
        let l = lines
            .next()
            .expect("build ended before its run step")
            .unwrap();
        if l.contains("\"event\":\"output\"") && l.contains("sleeping") {
            break;
        }
    }
    (child, lines)
}

/// Runs `rampart template build --json`; (exit code, report or null, stderr).
fn build(data: &Path, spec_file: &Path) -> (i32, Value, String) {
    let o = rampart()
        .args(["template", "build", "--json", "--data-dir"])
        .arg(data)
        .arg("-f")
        .arg(spec_file)
        .output()
        .unwrap();
    let report = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    (
        o.status.code().unwrap_or(-1),
        report,
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn cached(report: &Value) -> Vec<(String, bool)> {
    report["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["kind"].as_str().unwrap().to_owned(),
                s["cached"].as_bool().unwrap(),
            )
        })
        .collect()
}

/// Removes a test's directory when dropped (also when the test fails); declared before the
/// daemon so that it drops after it.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn count(p: &Path) -> usize {
    std::fs::read_dir(p).map(|r| r.count()).unwrap_or(0)
}

/// What a build must never leave: temp layers, build sandbox directories, build cgroups.
fn assert_clean(data: &Path) {
    let images = data.join("images");
    assert_eq!(count(&images.join("tmp")), 0, "images/tmp is not empty");
    let build = images.join("build");
    let left: Vec<_> = std::fs::read_dir(&build)
        .map(|r| r.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "build sandboxes left: {left:?}");
    for h in ["memory", "pids", "cpu,cpuacct", "freezer", "unified"] {
        let d = Path::new("/sys/fs/cgroup").join(h).join("rampart-build");
        if let Ok(rd) = std::fs::read_dir(&d) {
            let subs: Vec<_> = rd
                .flatten()
                .filter(|e| e.path().is_dir())
                .map(|e| e.file_name())
                .collect();
            assert!(
                subs.is_empty(),
                "build cgroups left in {}: {subs:?}",
                d.display()
            );
        }
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(&images.to_string_lossy().into_owned()),
        "a mount under {} is left",
        images.display()
    );
}

#[test]
fn build_create_rebuild_fail_interrupt() {
    if let Some(r) = skip_reason() {
        eprintln!("skipped: {r}");
        return;
    }
    let root = std::env::temp_dir().join(format!("rampart-templates-{}", token()));
    let _cleanup = RemoveOnDrop(root.clone());
    let data = root.join("data");
    let ctx = root.join("ctx");
    std::fs::create_dir_all(ctx.join("files")).unwrap();
    std::fs::create_dir_all(&data).unwrap();
    make_image(&ctx.join("image"));
    std::fs::write(ctx.join("files/greeting.txt"), "hello from the spec\n").unwrap();
    let name = format!("t{}", token().replace('-', ""));
    let spec_file = ctx.join("spec.toml");
    let run1 = "echo built-1 > /srv/built.txt && mkdir -p /home/user/work && chown 1000:1000 /home/user/work";
    std::fs::write(&spec_file, spec(&name, run1)).unwrap();

    // 1. Build.
    let (code, rep, err) = build(&data, &spec_file);
    assert_eq!(code, 0, "build failed: {err}");
    assert_eq!(
        cached(&rep),
        [
            ("base".into(), false),
            ("copy".into(), false),
            ("run".into(), false),
            ("env".into(), true),
            ("user".into(), true),
            ("workdir".into(), true),
        ]
    );
    assert!(err.contains("\"event\":\"step\""), "{err}");
    assert_clean(&data);
    let first_layers: Vec<String> =
        serde_json::from_value(rep["manifest"]["layers"].clone()).unwrap();

    // ls / inspect.
    let o = rampart()
        .args(["template", "ls", "--json", "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    let ls: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(ls
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t["name"] == name.as_str()));
    let o = rampart()
        .args(["template", "inspect", &name, "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    let ins: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(ins["config"]["user"], "user");
    assert_eq!(ins["config"]["env"]["APP"], "demo");

    // 2. A sandbox of it.
    let port = free_port();
    let d = start(&data, port, &[]);
    let sb = Sandbox::create(
        &d,
        json!({"template": name, "timeout_secs": 300, "env": {"REQ": "1"}}),
    );
    let id = sb.id.clone();
    // Its layers are pinned against gc while it lives.
    assert!(data.join(format!("images/pins/{id}.json")).is_file());
    // The API lists it next to the built-in ones.
    let ts: Value = client()
        .get(format!("{}/v1/templates", d.url))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let names: Vec<&str> = ts
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"base") && names.contains(&name.as_str()),
        "{ts}"
    );
    let t: Value = client()
        .get(format!("{}/v1/templates/{name}", d.url))
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(t["kind"], "built");
    assert_eq!(t["user"], "user");
    assert_eq!(t["id"], rep["id"]);
    let out = sb.exec(json!({"cmd": [
        "/bin/sh",
        "-c",
        "id -un; pwd; cat /srv/greeting.txt /srv/built.txt /tmp/started; echo $APP $IMG_ENV $REQ; \
         test -e /etc/removed.txt && echo removed-visible; ls /opt/data; \
         test -e /usr/bin/apt-get && echo host-usr-visible; echo end",
    ]}));
    assert_eq!(
        out["stdout"],
        "user\n/home/user/work\nhello from the spec\nbuilt-1\nstarted-as-user\ndemo from-image 1\nnew.txt\nend\n",
        "{out}"
    );
    // Root still works when asked for, and a write stays in the sandbox.
    let v = sb.exec(
        json!({"cmd": ["/bin/sh", "-c", "id -u; echo x > /srv/greeting.txt"], "user": "root"}),
    );
    assert_eq!(v["stdout"], "0\n", "{v}");
    sb.destroy();
    let layer_copy = data
        .join("images/layers")
        .join(&first_layers[first_layers.len() - 2]);
    assert_eq!(
        std::fs::read_to_string(layer_copy.join("fs/srv/greeting.txt")).unwrap(),
        "hello from the spec\n",
        "layers are read-only to sandboxes"
    );

    // 3. Rebuild after changing the run step: base and copy come from the cache.
    let run2 = run1.replace("built-1", "built-2");
    std::fs::write(&spec_file, spec(&name, &run2)).unwrap();
    let (code, rep2, err) = build(&data, &spec_file);
    assert_eq!(code, 0, "rebuild failed: {err}");
    let c = cached(&rep2);
    assert_eq!(c[0], ("base".into(), true));
    assert_eq!(c[1], ("copy".into(), true));
    assert_eq!(c[2], ("run".into(), false));
    let second_layers: Vec<String> =
        serde_json::from_value(rep2["manifest"]["layers"].clone()).unwrap();
    assert_eq!(
        first_layers[..first_layers.len() - 1],
        second_layers[..second_layers.len() - 1]
    );
    assert_ne!(first_layers.last(), second_layers.last());
    assert_clean(&data);

    // 4. A failing step: error, nothing kept, the name still points at the last build.
    let layers_before = count(&data.join("images/layers"));
    std::fs::write(&spec_file, spec(&name, "echo about to fail; exit 3")).unwrap();
    let (code, _, err) = build(&data, &spec_file);
    assert_ne!(code, 0);
    assert!(err.contains("exited with status 3"), "{err}");
    assert!(
        err.contains("about to fail"),
        "the step's output is streamed: {err}"
    );
    assert_eq!(count(&data.join("images/layers")), layers_before);
    assert_clean(&data);
    let o = rampart()
        .args(["template", "inspect", &name, "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    let ins: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(ins["id"], rep2["id"]);

    // 5. Interrupted (SIGINT) while a step runs: exit 130, nothing kept.
    std::fs::write(&spec_file, spec(&name, "echo sleeping; sleep 60")).unwrap();
    let (mut child, lines) = build_until_sleeping(&data, &spec_file);
    // SAFETY: kill(2) of our own child, by pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let st = child.wait().unwrap();
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    assert_eq!(st.code(), Some(130), "{st:?}: {rest:?}");
    assert_eq!(count(&data.join("images/layers")), layers_before);
    assert_clean(&data);

    // 5b. SIGKILL while a step runs leaves the step's sandbox and temp layer behind; the
    // next build removes them before it starts.
    // (stderr stays open until the end: the build is killed, not broken by a closed pipe)
    let (mut child, _lines) = build_until_sleeping(&data, &spec_file);
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        count(&data.join("images/build")) > 0,
        "the killed build left its sandbox"
    );
    std::fs::write(&spec_file, spec(&name, &run2)).unwrap();
    let (code, rep3, err) = build(&data, &spec_file);
    assert_eq!(code, 0, "{err}");
    assert!(cached(&rep3).iter().all(|(_, c)| *c));
    assert_clean(&data);

    // 6. rm + gc: the template's layers go.
    let o = rampart()
        .args(["template", "rm", &name, "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(o.status.success());
    let o = rampart()
        .args(["template", "gc", "--json", "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    let g: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(g["layers"].as_array().unwrap().len() >= second_layers.len());
    assert_eq!(count(&data.join("images/layers")), 0);
    let r = client()
        .post(format!("{}/v1/sandboxes", d.url))
        .json(&json!({"template": name}))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 400, "a removed template is unknown");
    let r = client()
        .get(format!("{}/v1/templates/{name}", d.url))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    drop(d);
    let _ = std::fs::remove_dir_all(&root);
}

fn debian_reachable() -> Result<(), String> {
    use std::net::ToSocketAddrs;
    let addrs = ("deb.debian.org", 80)
        .to_socket_addrs()
        .map_err(|e| format!("deb.debian.org does not resolve: {e}"))?;
    for a in addrs {
        if std::net::TcpStream::connect_timeout(&a, Duration::from_secs(5)).is_ok() {
            return Ok(());
        }
    }
    Err("deb.debian.org:80 is unreachable".into())
}

#[test]
fn debian_bookworm_with_mmdebstrap() {
    if let Some(r) = skip_reason() {
        eprintln!("skipped: {r}");
        return;
    }
    if Command::new("mmdebstrap")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: mmdebstrap is not installed (scripts/setup-host.sh installs it)");
        return;
    }
    if let Err(r) = debian_reachable() {
        eprintln!("skipped: {r}");
        return;
    }
    let root = std::env::temp_dir().join(format!("rampart-templates-deb-{}", token()));
    let _cleanup = RemoveOnDrop(root.clone());
    let data = root.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let spec_file = root.join("spec.toml");
    std::fs::write(
        &spec_file,
        "name = \"deb-test\"\nfrom = \"debian:bookworm\"\n[debian]\nvariant = \"minbase\"\n\
         [[steps]]\nrun = \"useradd -m -u 1000 -s /bin/bash user && echo ok > /etc/built\"\n\
         [[steps]]\nuser = \"user\"\n",
    )
    .unwrap();
    let (code, rep, err) = build(&data, &spec_file);
    assert_eq!(code, 0, "{err}");
    assert_eq!(cached(&rep)[0], ("base".into(), false));
    assert_clean(&data);
    let d = start(&data, free_port(), &[]);
    let sb = Sandbox::create(&d, json!({"template": "deb-test"}));
    let id = sb.id.clone();
    let out = sb.exec(json!({"cmd": ["bash", "-c", "id -un; cat /etc/built /etc/debian_version"]}));
    assert!(
        out["stdout"].as_str().unwrap().starts_with("user\nok\n12."),
        "{out}"
    );
    drop(sb); // destroys it (errors ignored)
    wait_until("the sandbox is gone", 30, || {
        client()
            .get(format!("{}/v1/sandboxes/{id}", d.url))
            .send()
            .map(|r| {
                r.json::<Value>()
                    .map(|v| v["state"] != "running")
                    .unwrap_or(true)
            })
            .unwrap_or(true)
    });
    drop(d);
    let _ = std::fs::remove_dir_all(&root);
}
