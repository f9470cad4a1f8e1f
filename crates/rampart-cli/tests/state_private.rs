//! The daemon's state is private: its data directory and every file in it are the daemon's
//! alone (0700 directories, 0600 files), so no other host user reads secret values, access
//! tokens, keys or sandbox environments; a data directory others could tamper with is
//! refused at start; template content sandboxes read keeps its modes (a sandbox's `user`
//! reads and runs it).
//!
//! Needs root (sandboxes, `setpriv` to become `nobody`); skipped with a reason otherwise.

mod support;

use serde_json::json;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::Sandbox;

/// The host user the attacks run as.
const NOBODY: u32 = 65534;

/// Runs `args` as host user `nobody` (no groups): (exit status ok, stdout, stderr).
fn as_nobody(args: &[&str]) -> (bool, String, String) {
    let out = Command::new("setpriv")
        .args([
            &format!("--reuid={NOBODY}"),
            &format!("--regid={NOBODY}"),
            "--clear-groups",
            "--",
        ])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run setpriv");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Why these tests cannot run here, if they cannot.
fn skip() -> Option<String> {
    if let Some(why) = support::skip_reason() {
        return Some(why);
    }
    // setpriv works and nobody can read what everyone may (else a refusal below proves
    // nothing).
    match Command::new("setpriv").arg("--version").output() {
        Ok(o) if o.status.success() => {}
        _ => return Some("setpriv (util-linux) is not installed".into()),
    }
    let (ok, _, err) = as_nobody(&["cat", "/etc/hostname"]);
    if !ok {
        return Some(format!("cannot run a command as uid {NOBODY}: {err}"));
    }
    None
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

/// Whether `p` is a mount point (another file system than its parent's).
fn is_mount(p: &Path) -> bool {
    let (Ok(a), Some(Ok(b))) = (
        std::fs::symlink_metadata(p),
        p.parent().map(std::fs::symlink_metadata),
    ) else {
        return false;
    };
    a.dev() != b.dev()
}

/// Content sandboxes read through their mounts, which keeps the modes it was given: a
/// template's directory (made by the template's builder, 0755 like its `rootfs/`; no other
/// user reaches it, `templates/` is 0700) and `rootfs/`, a layer's `fs/`.
fn is_template_content(data: &Path, p: &Path) -> bool {
    let rel = p.strip_prefix(data).unwrap_or(p);
    let c: Vec<&str> = rel.iter().filter_map(|s| s.to_str()).collect();
    matches!(c.as_slice(), ["templates", _, ..])
        || matches!(c.as_slice(), ["images", "layers", _, "fs", ..])
}

/// Every path under `data` (not following symlinks, entering the store's mount) whose mode
/// lets another user in, but template content: (path, mode).
fn open_to_others(data: &Path) -> Vec<(PathBuf, u32)> {
    let mut bad = Vec::new();
    let mut todo = vec![data.to_path_buf()];
    while let Some(p) = todo.pop() {
        let Ok(md) = std::fs::symlink_metadata(&p) else {
            continue; // gone meanwhile
        };
        if is_template_content(data, &p) {
            continue;
        }
        let m = md.mode() & 0o7777;
        let ft = md.file_type();
        if ft.is_symlink() {
            continue;
        }
        // The root of a mounted file system (the store's XFS image) is the directory's
        // own business below; a sandbox's directory may be searchable (0711, the jailer
        // enters it as the sandbox's root uid) but never readable or writable.
        let searchable_ok = ft.is_dir()
            && p.parent().and_then(Path::file_name) == Some("sandboxes".as_ref())
            && m & 0o066 == 0;
        // The daemon's socket is its group's too (0660), never others'.
        let socket_ok =
            ft.is_socket() && p.file_name() == Some("rampart.sock".as_ref()) && m & 0o007 == 0;
        if m & 0o077 != 0 && !searchable_ok && !socket_ok {
            bad.push((p.clone(), m));
        }
        if ft.is_dir() {
            if let Ok(rd) = std::fs::read_dir(&p) {
                for e in rd.flatten() {
                    todo.push(e.path());
                }
            }
        }
    }
    bad
}

/// The daemon's own state files in its data directory.
const STATE_FILES: [&str; 6] = [
    "state.db",
    "state.db-wal",
    "state.db-shm",
    "audit.journal",
    "node.key",
    "api-key",
];

/// `sandbox_blocks_state_read_by_host_users`: with a secret stored and a sandbox with an
/// environment and a secret, host user `nobody` can read none of the daemon's state, list
/// nothing of its data directory, and every file and directory in it is private (but
/// template content, which a sandbox's `user` still reads and runs).
#[test]
fn sandbox_blocks_state_read_by_host_users() {
    if let Some(why) = skip() {
        eprintln!("skipped: {why}");
        return;
    }
    let d = support::start_tidy("state-private");
    let data = d.data.clone();
    let c = support::client();
    let secret_value = format!("rampart-state-secret-{}", support::token());
    let env_value = format!("rampart-state-env-{}", support::token());
    let r = c
        .post(format!("{}/v1/secrets", d.url))
        .json(&json!({"name": "api_token", "value": secret_value, "hosts": ["example.com"]}))
        .send()
        .unwrap();
    assert!(r.status().is_success(), "store a secret: {}", r.status());
    // With the secret when this daemon has sandbox networks (a secret needs one).
    let mut body = json!({"env": {"MY_ENV": env_value}, "timeout_secs": 600});
    let networked = {
        let mut b = body.clone();
        b["network"] = json!({"mode": "allowlist", "allow": ["example.com"]});
        b["secrets"] = json!([{"name": "api_token"}]);
        b
    };
    let (s, mut v) = support::post(&d, "/v1/sandboxes", networked);
    if s == 503 {
        eprintln!("note: no sandbox networks here ({v}); the sandbox has no secret");
        (_, v) = support::post(&d, "/v1/sandboxes", body.take());
    }
    assert_eq!(v["state"], "running", "create: {v}");
    let sb = Sandbox::adopt(&d, v["id"].as_str().unwrap());
    let token = v["access_token"].as_str().unwrap().to_owned();

    // The sandbox's user reads and runs template content (the daemon's umask is 0077; what
    // sandboxes read keeps its modes).
    let v = sb.exec(json!({"cmd": ["bash", "-c",
            "set -e; id -un; cat /etc/passwd /etc/hostname /etc/hosts /etc/resolv.conf \
             /etc/machine-id >/dev/null; ls / /etc /usr/bin >/dev/null; python3 -c 'import json'; \
             printf %s \"$MY_ENV\" | wc -c"],
            "user": "user"}));
    assert_eq!(&v["exit_code"], &json!(0), "as user inside: {v}");
    assert_eq!(
        v["stdout"].as_str().unwrap_or_default().lines().next(),
        Some("user")
    );
    let (s, v) = support::post(
        &d,
        "/v1/sandboxes",
        json!({"template": "code-interpreter-v1", "timeout_secs": 600}),
    );
    if s == 201 {
        let ci = Sandbox::adopt(&d, v["id"].as_str().unwrap());
        let v = ci.exec(
            json!({"cmd": ["cat", "/opt/rampart/code-interpreter/server.py"], "user": "user"}),
        );
        assert_eq!(&v["exit_code"], &json!(0), "code interpreter: {v}");
    } else {
        eprintln!("note: no code-interpreter sandbox here ({s} {v})");
    }

    // What holds the secrets is there, and holds them (so that the refusals below matter).
    let state = std::fs::read(data.join("state.db")).unwrap();
    let wal = std::fs::read(data.join("state.db-wal")).unwrap_or_default();
    let has = |hay: &[u8], needle: &str| hay.windows(needle.len()).any(|w| w == needle.as_bytes());
    assert!(
        has(&state, &token) || has(&wal, &token),
        "state.db holds the sandbox's access token"
    );

    // 1. Host user nobody reads nothing of it and lists nothing.
    let sandboxes = support::sandboxes_dir(&data);
    let mut targets: Vec<PathBuf> = STATE_FILES.iter().map(|f| data.join(f)).collect();
    targets.push(data.join("templates/base/rootfs/etc/passwd"));
    targets.push(sandboxes.join(&sb.id).join("disk.img"));
    for t in &targets {
        let (ok, out, _) = as_nobody(&["head", "-c", "64", &t.to_string_lossy()]);
        assert!(
            !ok && out.is_empty(),
            "uid {NOBODY} read {} ({} bytes)",
            t.display(),
            out.len()
        );
    }
    for dir in [data.clone(), data.join("templates"), sandboxes.clone()] {
        let (ok, out, _) = as_nobody(&["ls", "-a", &dir.to_string_lossy()]);
        assert!(
            !ok && out.is_empty(),
            "uid {NOBODY} listed {}: {out}",
            dir.display()
        );
    }
    let (ok, out, _) = as_nobody(&["grep", "-rl", "--", &secret_value, &data.to_string_lossy()]);
    assert!(
        !ok && out.is_empty(),
        "uid {NOBODY} found the secret: {out}"
    );

    // 2. Every file and directory is the daemon's alone: 0700 / 0600.
    assert_eq!(mode(&data), 0o700, "the data directory");
    for f in STATE_FILES {
        let p = data.join(f);
        if p.exists() {
            assert_eq!(mode(&p), 0o600, "{}", p.display());
        }
    }
    let bad = open_to_others(&data);
    assert!(
        bad.is_empty(),
        "open to other users (path, mode):\n{}",
        bad.iter()
            .map(|(p, m)| format!(
                "  {:04o} {}{}",
                m,
                p.display(),
                if is_mount(p) { " (a mount)" } else { "" }
            ))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // Template content keeps its modes, for sandboxes to read.
    assert_eq!(mode(&data.join("templates/base/rootfs")), 0o755);
    assert_eq!(mode(&data.join("templates/base/rootfs/etc/passwd")), 0o644);
}

/// Runs `rampart serve` on `data` and returns its exit status and output if it exits within
/// a minute (None: it is still running, then killed).
fn serve_refusal(data: &Path) -> Option<(bool, String)> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rampart"))
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{}", support::free_port()),
            "--data-dir",
        ])
        .arg(data)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn rampart serve");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            let out = child.wait_with_output().unwrap();
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            return Some((out.status.success(), text));
        }
        if Instant::now() > deadline {
            // It started (the test fails): leave no mount of its store behind.
            let _ = child.kill();
            let _ = child.wait();
            support::unmount_store(data);
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `sandbox_blocks_unsafe_data_dir`: a data directory other users could tamper with is
/// refused at start with a message naming the path and the fix (world-writable, owned by
/// another user, under a parent others may write); one only readable by others is made
/// 0700, with a log line saying so.
#[test]
fn sandbox_blocks_unsafe_data_dir() {
    if let Some(why) = skip() {
        eprintln!("skipped: {why}");
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let refused = |data: &Path, why: &str, fix: &str| {
        let Some((ok, text)) = serve_refusal(data) else {
            panic!("the daemon started on {} ({why})", data.display());
        };
        assert!(!ok, "{why}: exit status success: {text}");
        assert!(
            text.contains(&data.display().to_string()) && text.contains(fix),
            "{why}: the message names the path and the fix ({fix:?}):\n{text}"
        );
        // Nothing was made in it.
        assert!(!data.join("state.db").exists(), "{why}: state.db made");
    };

    // World-writable.
    let ww = root.path().join("world-writable");
    std::fs::create_dir(&ww).unwrap();
    std::fs::set_permissions(&ww, std::fs::Permissions::from_mode(0o777)).unwrap();
    refused(&ww, "a world-writable data directory", "chmod 700");
    // Group-writable too.
    std::fs::set_permissions(&ww, std::fs::Permissions::from_mode(0o770)).unwrap();
    refused(&ww, "a group-writable data directory", "chmod 700");

    // Owned by another user (one that could have planted a state.db).
    let other = root.path().join("other-user");
    std::fs::create_dir(&other).unwrap();
    std::os::unix::fs::chown(&other, Some(NOBODY), Some(NOBODY)).unwrap();
    std::fs::set_permissions(&other, std::fs::Permissions::from_mode(0o700)).unwrap();
    refused(&other, "a data directory of another user", "chown");

    // Under a parent others may write, without the sticky bit (they could swap it).
    let open_parent = root.path().join("open-parent");
    std::fs::create_dir(&open_parent).unwrap();
    std::fs::set_permissions(&open_parent, std::fs::Permissions::from_mode(0o777)).unwrap();
    let under = open_parent.join("data");
    refused(
        &under,
        "a data directory under a world-writable parent",
        "chmod go-w",
    );
    assert!(
        !under.exists(),
        "the data directory was made under the open parent"
    );

    // Only readable by others (mkdir with umask 022): made 0700, said in the log.
    let readable = root.path().join("readable");
    std::fs::create_dir(&readable).unwrap();
    std::fs::set_permissions(&readable, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut d = support::start(&readable, support::free_port(), &[]);
    assert_eq!(mode(&readable), 0o700);
    d.stop();
    let log = std::fs::read_to_string(readable.with_extension("log")).unwrap();
    assert!(
        log.contains(&format!(
            "the data directory {} was mode 0755",
            readable.display()
        )) && log.contains("made it 0700"),
        "the log says the mode was fixed:\n{log}"
    );
    drop(d);
    support::unmount_store(&readable);
}

/// A daemon on a data directory made by `mktemp -d` (mode 0700 from the start) runs
/// sandboxes: the sandbox's setup does not need its uid to walk the data directory.
#[test]
fn sandbox_runs_with_a_private_mktemp_data_dir() {
    if let Some(why) = support::skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let out = Command::new("mktemp")
        .args(["-d", "-t", "rampart-mktemp-XXXXXXXX"])
        .output()
        .expect("mktemp");
    assert!(out.status.success());
    let data = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert_eq!(mode(&data), 0o700);
    let g = Guard(
        Some(support::start(&data, support::free_port(), &[])),
        data.clone(),
    );
    let d = g.0.as_ref().unwrap();
    let sb = Sandbox::create(d, json!({"timeout_secs": 300}));
    let v = sb.exec(json!({"cmd": ["true"]}));
    assert_eq!(&v["exit_code"], &json!(0), "exec true: {v}");
}

/// `rampart serve --data-dir data`, a path relative to where the operator stands: the daemon
/// works with it (it makes the path absolute; the tier opens paths under it from elsewhere).
#[test]
fn sandbox_runs_with_a_relative_data_dir() {
    if let Some(why) = support::skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let root = std::env::temp_dir().join(format!("rampart-reldir-{}", support::token()));
    let data = root.join("data");
    std::fs::create_dir_all(&data).unwrap();
    support::provision(&data);
    let d = support::spawn_daemon_in(
        Some(&root),
        Path::new("data"),
        &data,
        support::free_port(),
        &[],
    );
    let g = Guard(Some(d), root.clone());
    let d = g.0.as_ref().unwrap();
    let sb = Sandbox::create(d, json!({"timeout_secs": 300}));
    let v = sb.exec(json!({"cmd": ["true"]}));
    assert_eq!(&v["exit_code"], &json!(0), "exec true: {v}");
}

/// A data directory deep enough that the daemon's and the agents' socket paths are longer
/// than a socket address may be (108 bytes; a CI checkout's target directory is such a
/// place): sandboxes start, and the CLI reaches the daemon over its Unix socket there.
#[test]
fn sandbox_runs_with_a_data_dir_past_the_socket_path_limit() {
    if let Some(why) = support::skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let root = std::env::temp_dir().join(format!("rampart-deepdir-{}", support::token()));
    let data = root.join("a".repeat(50)).join("b".repeat(50));
    std::fs::create_dir_all(&data).unwrap();
    let socket = data.join("rampart.sock");
    assert!(socket.as_os_str().len() > 108, "{}", socket.display());
    let g = Guard(
        Some(support::start(&data, support::free_port(), &[])),
        root.clone(),
    );
    let d = g.0.as_ref().unwrap();
    let sb = Sandbox::create(d, json!({"timeout_secs": 300}));
    let v = sb.exec(json!({"cmd": ["echo", "deep"]}));
    assert_eq!(&v["exit_code"], &json!(0), "exec: {v}");

    // The CLI as root on the host finds no key and uses the socket it is pointed at.
    let out = Command::new(env!("CARGO_BIN_EXE_rampart"))
        .args(["exec", &sb.id, "--", "echo", "over-the-socket"])
        .env("RAMPART_SOCKET", &socket)
        .env_remove("RAMPART_HOST")
        .env_remove("RAMPART_API_KEY")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run rampart");
    assert!(
        out.status.success(),
        "rampart exec over {}: {}",
        socket.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "over-the-socket\n");
}

/// Destroys a test daemon's sandboxes, stops it, unmounts its store, removes its directory.
struct Guard(Option<support::Daemon>, PathBuf);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(d) = self.0.take() {
            support::destroy_all(&d.url);
            drop(d);
        }
        support::unmount_store(&self.1);
        let _ = std::fs::remove_dir_all(&self.1);
        let _ = std::fs::remove_file(self.1.with_extension("log"));
    }
}
