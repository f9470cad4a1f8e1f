//! Integration tests of the namespace tier: real sandboxes (needs root).
use rampart_jail::{template, CgroupVersion, Jail, JailConfig, LaunchSpec};
use rampart_types::{Limits, SandboxId};
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

fn skip_reason() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("needs root".into());
    }
    None
}

fn agent_bin() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples/test_agent")
}

/// One test's world: a template, a state dir and a cgroup subtree, all removed on drop.
struct TestEnv {
    base: PathBuf,
    template: PathBuf,
    jail: Jail,
}

impl TestEnv {
    fn new(tag: &str) -> TestEnv {
        // SAFETY: plain prctl; like the daemon, adopt the sandbox inits when the jailer exits.
        unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) };
        let base = PathBuf::from(format!(
            "/var/tmp/rampart-jail-test-{}-{tag}",
            std::process::id()
        ));
        std::fs::create_dir_all(&base).unwrap();
        let template = base.join("templates/base");
        template::build_base(&template).unwrap();
        let jail = Jail::new(JailConfig {
            state_dir: base.join("sandboxes"),
            jailer_bin: PathBuf::from(env!("CARGO_BIN_EXE_rampart-jailer")),
            agent_bin: agent_bin(),
            cgroup_subtree: format!("rampart-test-{}-{tag}", std::process::id()),
        })
        .unwrap();
        TestEnv {
            base,
            template,
            jail,
        }
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        if let Ok(ids) = self.jail.leftovers() {
            for id in ids {
                let _ = self.jail.destroy(&id);
            }
        }
        for d in self.jail.cgroup_dirs(&SandboxId::parse("x").unwrap()) {
            let _ = std::fs::remove_dir(d.parent().unwrap());
        }
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

fn spec(t: &TestEnv, uid_slot: u32, limits: Limits) -> LaunchSpec {
    LaunchSpec {
        id: SandboxId::generate(),
        template_dir: t.template.clone(),
        uid_base: 2_000_000 + ((std::process::id() % 50) * 10 + uid_slot) * 65536,
        limits,
        hostname: "sbx".into(),
        env: vec![("FOO".into(), "bar".into())],
    }
}

fn run(sock: &Path, uid: u32, cmd: &str) -> (String, i32) {
    let mut c = std::os::unix::net::UnixStream::connect(sock).unwrap();
    c.write_all(format!("{uid} {cmd}\n").as_bytes()).unwrap();
    let mut out = String::new();
    c.read_to_string(&mut out).unwrap();
    let (body, code) = out.rsplit_once("\nEXIT ").unwrap_or((&out, "-1"));
    (body.to_owned(), code.trim().parse().unwrap_or(-1))
}

fn status_field(pid: i32, key: &str) -> String {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix(key))
        .unwrap_or("")
        .trim()
        .to_owned()
}

fn assert_gone(j: &Jail, id: &SandboxId, pid: i32) {
    assert!(!j.sandbox_dir(id).exists(), "sandbox dir left");
    for d in j.cgroup_dirs(id) {
        assert!(!d.exists(), "cgroup left: {}", d.display());
    }
    assert!(
        !rampart_jail::loop_backing(&j.sandbox_dir(id).join("disk.img")),
        "loop device left"
    );
    // We are the sandbox init's subreaper (as the daemon is): it must be dead, reapable now.
    let mut st = 0;
    // SAFETY: waiting for our own (adopted) child.
    let r = unsafe { libc::waitpid(pid, &mut st, libc::WNOHANG) };
    assert_eq!(r, pid, "sandbox init {pid} still running or not ours");
    assert!(!j.leftovers().unwrap().contains(id));
}

#[test]
fn launch_isolates_and_destroy_leaves_nothing() {
    if let Some(r) = skip_reason() {
        eprintln!("skipped: {r}");
        return;
    }
    let t = TestEnv::new("basic");
    let j = &t.jail;
    let limits = Limits {
        memory_bytes: 256 << 20,
        pids: 200,
        cpus: 0.5,
        disk_bytes: 64 << 20,
        open_files: 2048,
    };
    let s = spec(&t, 0, limits.clone());
    let l = j.launch(&s).unwrap();
    let pid = l.pid;
    // PID 1 and root inside, mapped to the asked range outside.
    assert_eq!(
        status_field(pid, "NSpid:").split_whitespace().last(),
        Some("1")
    );
    let uid_map = std::fs::read_to_string(format!("/proc/{pid}/uid_map")).unwrap();
    let f: Vec<&str> = uid_map.split_whitespace().collect();
    assert_eq!(f, ["0", &s.uid_base.to_string(), "65536"]);
    assert_eq!(
        status_field(pid, "Uid:").split_whitespace().next(),
        Some(s.uid_base.to_string().as_str())
    );
    // Inside view.
    let (o, c) = run(&l.agent_socket, 0, "id -u; echo $$; hostname; cat /proc/1/cmdline | tr '\\0' ' '; echo; ls /; ulimit -n; ulimit -c; echo FOO=$FOO");
    assert_eq!(c, 0, "{o}");
    let lines: Vec<&str> = o.lines().collect();
    assert_eq!(lines[0], "0");
    assert_eq!(lines[2], "sbx");
    assert!(lines[3].starts_with("rampart-agent"), "{o}");
    assert!(o.contains("\n2048\n0\n"), "rlimits: {o}");
    assert!(o.contains("FOO=bar"));
    // Root-owned files of the host stay root-owned inside (idmapped), user home is the user's.
    let (o, c) = run(&l.agent_socket, 0, "stat -c '%u %n' /usr/bin/sudo /etc/passwd /home/user /; touch /usr/probe && echo usr-writable");
    assert_eq!(c, 0, "{o}");
    assert!(
        o.contains("0 /usr/bin/sudo\n0 /etc/passwd\n1000 /home/user\n0 /\n"),
        "{o}"
    );
    assert!(o.contains("usr-writable"));
    assert!(
        !Path::new("/usr/probe").exists(),
        "write reached the host's /usr"
    );
    // Limits files.
    match j.features().cgroup {
        CgroupVersion::V1 => {
            let d = j.cgroup_dirs(&s.id);
            let rd = |p: PathBuf| std::fs::read_to_string(p).unwrap().trim().to_owned();
            assert_eq!(
                rd(d[0].join("memory.limit_in_bytes")),
                (256u64 << 20).to_string()
            );
            assert_eq!(rd(d[1].join("pids.max")), "200");
            assert_eq!(rd(d[2].join("cpu.cfs_quota_us")), "50000");
        }
        CgroupVersion::V2 => {
            let d = &j.cgroup_dirs(&s.id)[0];
            assert_eq!(
                std::fs::read_to_string(d.join("pids.max")).unwrap().trim(),
                "200"
            );
        }
    }
    let u = j.usage(&s.id).unwrap();
    assert!(u.pids >= 1 && u.memory_bytes > 0, "{u:?}");
    // The image is sparse on the host.
    let img = j.sandbox_dir(&s.id).join("disk.img");
    let md = std::fs::metadata(&img).unwrap();
    assert_eq!(md.len(), 64 << 20);
    assert!(md.blocks() * 512 < md.len() / 2);
    // No mount of the sandbox is visible on the host.
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(s.id.as_str()),
        "a sandbox mount leaked to the host"
    );
    j.destroy(&s.id).unwrap();
    assert_gone(j, &s.id, pid);
    j.destroy(&s.id).unwrap();
}

#[test]
fn disk_quota_gives_enospc_and_sudo_works() {
    if let Some(r) = skip_reason() {
        eprintln!("skipped: {r}");
        return;
    }
    let t = TestEnv::new("disk");
    let j = &t.jail;
    let s = spec(
        &t,
        1,
        Limits {
            disk_bytes: 32 << 20,
            ..Limits::default()
        },
    );
    let l = j.launch(&s).unwrap();
    let (o, c) = run(
        &l.agent_socket,
        1000,
        "dd if=/dev/zero of=/home/user/big bs=1M count=64 2>&1; echo rc=$?",
    );
    assert!(o.contains("No space left on device"), "{o}");
    assert!(o.contains("rc=1"), "{o} {c}");
    let (o, c) = run(&l.agent_socket, 1000, "id -u; sudo -n id -u");
    assert_eq!(c, 0, "{o}");
    assert_eq!(o.trim(), "1000\n0", "{o}");
    j.destroy(&s.id).unwrap();
    assert_gone(j, &s.id, l.pid);
}

#[test]
fn failed_launch_leaves_nothing() {
    if let Some(r) = skip_reason() {
        eprintln!("skipped: {r}");
        return;
    }
    let t = TestEnv::new("fail");
    let j = &t.jail;
    let mut s = spec(&t, 2, Limits::default());
    s.template_dir = PathBuf::from("/nonexistent/template");
    assert!(j.launch(&s).is_err());
    assert!(j.leftovers().unwrap().is_empty());
    // A failure late in the jailer (agent binary missing) also cleans up.
    let j2 = Jail::new(JailConfig {
        agent_bin: PathBuf::from("/nonexistent/agent"),
        ..j.config().clone()
    })
    .unwrap();
    let s = spec(&t, 3, Limits::default());
    let e = j2.launch(&s).unwrap_err();
    assert!(e.to_string().contains("agent"), "{e}");
    assert!(j2.leftovers().unwrap().is_empty());
    assert!(!j2.sandbox_dir(&s.id).exists());
}

#[test]
fn sandbox_blocks_escapes_from_inside() {
    if let Some(r) = skip_reason() {
        eprintln!("skipped: {r}");
        return;
    }
    let t = TestEnv::new("contain");
    let j = &t.jail;
    let s = spec(&t, 4, Limits::default());
    let l = j.launch(&s).unwrap();
    let sh = |cmd: &str| run(&l.agent_socket, 0, cmd).0;
    // Seccomp filter on, capability bounding set cut (no SYS_ADMIN, NET_RAW, SYS_MODULE...).
    let st = sh("grep -E '^(Seccomp|CapBnd|CapEff|NoNewPrivs):' /proc/self/status");
    assert!(st.contains("Seccomp:\t2"), "{st}");
    assert!(st.contains("CapBnd:\t00000000a80405fb"), "{st}");
    assert!(st.contains("CapEff:\t00000000a80405fb"), "{st}");
    // Denied syscalls.
    let o = sh("unshare -U true; echo userns=$?; unshare -m true; echo mountns=$?; mount -t tmpfs x /mnt; echo mount=$?");
    assert!(
        o.contains("userns=1") && o.contains("mountns=1") && o.contains("mount=32"),
        "{o}"
    );
    // Masked /proc, read-only /proc/sys and /sys, no host files, loopback only.
    let o = sh("echo 1 > /proc/sys/kernel/hostname; echo procsys=$?; touch /sys/x; echo sys=$?; ls /sys/firmware | wc -l; cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '; ls /proc/1/root/ | head -3; cat /proc/mounts | wc -l");
    assert!(!o.contains("procsys=0") && o.contains("sys=1"), "{o}");
    assert!(o.contains("\n0\nlo\n"), "only loopback: {o}");
    // Masked files read as empty (bound over by /dev/null).
    let o = sh("for f in kcore keys timer_list sched_debug; do [ -e /proc/$f ] && echo $f=$(wc -c < /proc/$f); done; true");
    for l in o.lines().filter(|l| l.contains('=')) {
        assert!(l.ends_with("=0"), "{o}");
    }
    // Raw sockets need CAP_NET_RAW, which is gone.
    let o = sh("python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, 1)' 2>&1; echo raw=$?");
    assert!(o.contains("raw=1") && o.contains("PermissionError"), "{o}");
    // No host path outside the template is reachable.
    assert!(
        sh("ls /var/tmp /work 2>&1").contains("No such file"),
        "host dirs visible"
    );
    j.destroy(&s.id).unwrap();
    assert_gone(j, &s.id, l.pid);
}

#[test]
fn relaunching_a_live_id_is_refused_and_keeps_it() {
    if let Some(r) = skip_reason() {
        eprintln!("skipped: {r}");
        return;
    }
    let t = TestEnv::new("dup");
    let j = &t.jail;
    let s = spec(&t, 5, Limits::default());
    let l = j.launch(&s).unwrap();
    assert!(j.launch(&s).is_err());
    assert_eq!(run(&l.agent_socket, 0, "echo alive").0.trim(), "alive");
    j.destroy(&s.id).unwrap();
    assert_gone(j, &s.id, l.pid);
}

#[test]
fn real_agent_serves_health_as_pid1() {
    if let Some(r) = skip_reason() {
        eprintln!("skipped: {r}");
        return;
    }
    let bin = agent_bin()
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("rampart-agent");
    if !bin.exists() {
        eprintln!(
            "skipped: {} not built (cargo build -p rampart-agent)",
            bin.display()
        );
        return;
    }
    let mut t = TestEnv::new("agent");
    t.jail = Jail::new(JailConfig {
        agent_bin: bin,
        ..t.jail.config().clone()
    })
    .unwrap();
    let s = spec(&t, 6, Limits::default());
    let l = t.jail.launch(&s).unwrap();
    let mut c = std::os::unix::net::UnixStream::connect(&l.agent_socket).unwrap();
    c.write_all(b"GET /health HTTP/1.1\r\nHost: sandbox\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    let _ = c.read_to_string(&mut out);
    assert!(out.starts_with("HTTP/1.1 2"), "{out}");
    t.jail.destroy(&s.id).unwrap();
    assert_gone(&t.jail, &s.id, l.pid);
}
