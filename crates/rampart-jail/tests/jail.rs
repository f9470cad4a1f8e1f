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
        self.jail.close_pool();
        if let Ok(ids) = self.jail.leftovers() {
            for id in ids {
                let _ = self.jail.destroy(&id);
            }
        }
        self.jail.settle();
        for d in self.jail.cgroup_dirs(&SandboxId::parse("x").unwrap()) {
            let _ = std::fs::remove_dir(d.parent().unwrap());
        }
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

fn spec(t: &TestEnv, uid_slot: u32, limits: Limits) -> LaunchSpec {
    LaunchSpec {
        id: SandboxId::generate(),
        tier: rampart_types::Tier::Namespace,
        template_dir: t.template.clone(),
        uid_base: 2_000_000 + ((std::process::id() % 50) * 10 + uid_slot) * 65536,
        limits,
        hostname: "sbx".into(),
        env: vec![("FOO".into(), "bar".into())],
        layers: vec![],
        layers_on_base: false,
        build: None,
        agent_args: vec![],
        files: vec![],
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

/// Polls `f` until it holds, for at most 5 s.
fn eventually(mut f: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        if f() {
            return true;
        }
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

fn assert_gone(j: &Jail, id: &SandboxId, pid: i32) {
    assert!(!j.sandbox_dir(id).exists(), "sandbox dir left");
    for d in j.cgroup_dirs(id) {
        assert!(!d.exists(), "cgroup left: {}", d.display());
    }
    // The rest of the removal (the renamed `dying-<id>` traces) is the janitor's.
    j.settle();
    let dying = SandboxId::parse(&format!("dying{id}")).unwrap();
    let dying_dir = j.config().state_dir.join(format!("dying-{id}"));
    assert!(!dying_dir.exists(), "{} left", dying_dir.display());
    for d in j.cgroup_dirs(&dying) {
        let d = d.with_file_name(format!("dying-{id}"));
        assert!(!d.exists(), "cgroup left: {}", d.display());
    }
    // The loop device detaches itself once the kernel has torn down the dead sandbox's mounts
    // (destroy does not wait for that).
    assert!(
        eventually(
            || !rampart_jail::loop_backing(&j.sandbox_dir(id).join("disk.img"))
                && !rampart_jail::loop_backing(&dying_dir.join("disk.img"))
        ),
        "loop device left"
    );
    // We are the sandbox init's subreaper (as the daemon is): it must be dead and reapable.
    assert!(
        eventually(|| {
            let mut st = 0;
            // SAFETY: waiting for our own (adopted) child.
            let r = unsafe { libc::waitpid(pid, &mut st, libc::WNOHANG) };
            r == pid
        }),
        "sandbox init {pid} still running or not ours"
    );
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
            // PID 1 was born in the sandbox's cgroup, in every hierarchy (the jailer joined
            // it before the clone).
            let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
            let want = format!("/{}/{}", j.config().cgroup_subtree, s.id);
            for c in ["memory", "pids", "cpu", "cpuacct"] {
                assert!(
                    cg.lines().any(|l| {
                        let mut f = l.splitn(3, ':').skip(1);
                        f.next().is_some_and(|k| k.split(',').any(|x| x == c))
                            && f.next() == Some(want.as_str())
                    }),
                    "{c}: {cg}"
                );
            }
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

/// Files written at launch land in the sandbox's root (directories made, owned by its root,
/// with their mode), and a template's symlink cannot lead the write out of the root: an
/// absolute link, resolved as it would be on the host, names a host file.
#[test]
fn init_files_land_inside_and_template_symlinks_cannot_lead_out() {
    if let Some(r) = skip_reason() {
        eprintln!("skipped: {r}");
        return;
    }
    let t = TestEnv::new("files");
    let j = &t.jail;
    let victim = PathBuf::from(format!(
        "/tmp/rampart-jail-test-{}-victim",
        std::process::id()
    ));
    std::fs::write(&victim, "host\n").unwrap();
    let resolv = t.template.join("rootfs/etc/resolv.conf");
    let _ = std::fs::remove_file(&resolv);
    let up = "/..".repeat(8);
    std::os::unix::fs::symlink(format!("{up}{}", victim.display()), &resolv).unwrap();
    let mut s = spec(&t, 6, Limits::default());
    let file = |path: &str, text: &str, mode| rampart_jail::InitFile {
        path: path.into(),
        text: text.into(),
        mode,
    };
    s.files = vec![
        file("/etc/resolv.conf", "nameserver 10.9.9.1\n", 0o644),
        file("/opt/rampart-test/a/b.txt", "made\n", 0o640),
        file("/usr/local/share/ca-certificates/t.crt", "PEM\n", 0o644),
    ];
    let l = j.launch(&s).unwrap();
    let sh = |cmd: &str| run(&l.agent_socket, 0, cmd).0;
    let inside = sh(&format!(
        "cat /etc/resolv.conf {v}; stat -c '%u %a %n' {v} /opt/rampart-test/a/b.txt \
         /opt/rampart-test/a /usr/local/share/ca-certificates/t.crt; cat /opt/rampart-test/a/b.txt",
        v = victim.display()
    ));
    let v = victim.display();
    assert_eq!(
        inside,
        format!(
            "nameserver 10.9.9.1\nnameserver 10.9.9.1\n0 644 {v}\n0 640 /opt/rampart-test/a/b.txt\n\
             0 755 /opt/rampart-test/a\n0 644 /usr/local/share/ca-certificates/t.crt\nmade\n"
        )
    );
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "host\n");
    j.destroy(&s.id).unwrap();
    assert_gone(j, &s.id, l.pid);
    let _ = std::fs::remove_file(&victim);

    // A path that is not a regular file inside (a directory, a FIFO nobody reads: neither
    // waited on) is refused, and the launch leaves nothing.
    let fifo = t.template.join("rootfs/etc/fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    for (path, why) in [("/etc", "Is a directory"), ("/etc/fifo", "os error 6")] {
        let mut s = spec(&t, 7, Limits::default());
        s.files = vec![file(path, "x", 0o644)];
        let e = j.launch(&s).unwrap_err().to_string();
        assert!(
            e.contains(path.trim_start_matches('/')) && e.contains(why),
            "{e}"
        );
        assert!(!j.sandbox_dir(&s.id).exists());
    }
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

fn pooled_env(tag: &str, size: usize, disk_bytes: u64) -> Option<TestEnv> {
    let mut t = TestEnv::new(tag);
    if t.jail.features().cgroup != CgroupVersion::V1 {
        eprintln!("skipped: the jailer pool is for cgroup v1 hosts");
        return None;
    }
    let jail = Jail::new(t.jail.config().clone())
        .unwrap()
        .with_pool(size, disk_bytes)
        .unwrap();
    t.jail = jail;
    let pool = t.jail.pool().expect("a pool on v1");
    assert!(
        pool.wait_full(std::time::Duration::from_secs(20)),
        "pool not filled"
    );
    Some(t)
}

/// Pool members' directories in the state directory.
fn pool_dirs(j: &Jail) -> Vec<PathBuf> {
    std::fs::read_dir(&j.config().state_dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("pool-"))
        .map(|e| e.path())
        .collect()
}

fn proc_alive(pid: i32) -> bool {
    // A zombie still has /proc/<pid>; look at its state.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            let st = s.rsplit_once(") ").map(|(_, r)| r).unwrap_or("");
            !st.starts_with('Z') && !st.starts_with('X')
        })
        .unwrap_or(false)
}

/// Pool cgroup directories under the test's subtree, in every hierarchy.
fn pool_cgroups(j: &Jail) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for d in j.cgroup_dirs(&SandboxId::parse("x").unwrap()) {
        if let Ok(rd) = std::fs::read_dir(d.parent().unwrap()) {
            for e in rd.flatten() {
                if e.file_name().to_string_lossy().starts_with("pool-") {
                    out.push(e.path());
                }
            }
        }
    }
    out
}

#[test]
fn pooled_launch_gets_limits_and_its_cgroup_name() {
    if let Some(r) = skip_reason() {
        eprintln!("skipped: {r}");
        return;
    }
    let Some(t) = pooled_env("pool", 2, 64 << 20) else {
        return;
    };
    let j = &t.jail;
    let pool = j.pool().unwrap();
    let before = pool.member_names();
    let member_pids = pool.member_pids();
    assert_eq!(before.len(), 2);
    let limits = Limits {
        memory_bytes: 200 << 20,
        pids: 123,
        cpus: 0.25,
        disk_bytes: 64 << 20,
        open_files: 1500,
    };
    let s = spec(&t, 7, limits);
    let l = j.launch(&s).unwrap();
    // The first member was used: its cgroup is now the sandbox's (renamed in every hierarchy),
    // and so is its directory, with the disk it had mounted.
    let used = &before[0];
    assert!(!j.config().state_dir.join(used).exists());
    assert!(j.sandbox_dir(&s.id).join("disk.img").is_file());
    for d in j.cgroup_dirs(&s.id) {
        assert!(d.is_dir(), "{} missing", d.display());
        assert!(
            !d.parent().unwrap().join(used).exists(),
            "{used} still there"
        );
    }
    let cg = std::fs::read_to_string(format!("/proc/{}/cgroup", l.pid)).unwrap();
    let want = format!("{}/{}", j.config().cgroup_subtree, s.id);
    let mut controllers = vec!["memory", "pids", "cpu", "cpuacct"];
    if Path::new("/sys/fs/cgroup/freezer/cgroup.procs").exists() {
        controllers.push("freezer");
    }
    for c in controllers {
        assert!(
            cg.lines().any(|line| line
                .split(':')
                .nth(1)
                .is_some_and(|k| k.split(',').any(|x| x == c))
                && line.ends_with(&want)),
            "{c} not in {want}: {cg}"
        );
    }
    let d = j.cgroup_dirs(&s.id);
    let rd = |p: PathBuf| std::fs::read_to_string(p).unwrap().trim().to_owned();
    assert_eq!(
        rd(d[0].join("memory.limit_in_bytes")),
        (200u64 << 20).to_string()
    );
    assert_eq!(rd(d[1].join("pids.max")), "123");
    assert_eq!(rd(d[2].join("cpu.cfs_quota_us")), "25000");
    // Inside: the limits hold for the agent's children, which live in the same cgroup.
    let (o, c) = run(
        &l.agent_socket,
        0,
        "cat /proc/self/cgroup | grep -c ':/$'; ulimit -n",
    );
    assert_eq!(c, 0, "{o}");
    assert!(o.ends_with("1500\n"), "{o}");
    // The used member's jailer exited; the other member is still waiting.
    assert!(
        eventually(|| !proc_alive(member_pids[0])),
        "used jailer still running"
    );
    assert!(proc_alive(member_pids[1]));
    // The pool refills.
    assert!(pool.wait_full(std::time::Duration::from_secs(20)));
    assert!(!pool.member_names().contains(used));
    j.destroy(&s.id).unwrap();
    assert_gone(j, &s.id, l.pid);
}

#[test]
fn pool_leaves_no_cgroup_or_process_when_closed_or_dropped() {
    if let Some(r) = skip_reason() {
        eprintln!("skipped: {r}");
        return;
    }
    let Some(mut t) = pooled_env("poolclose", 3, Limits::default().disk_bytes) else {
        return;
    };
    let pids = t.jail.pool().unwrap().member_pids();
    assert_eq!(pids.len(), 3);
    let hierarchies = t.jail.cgroup_dirs(&SandboxId::parse("x").unwrap()).len();
    assert_eq!(pool_cgroups(&t.jail).len(), 3 * hierarchies);
    t.jail.close_pool();
    for p in &pids {
        assert!(!proc_alive(*p), "pool member {p} survived close");
    }
    assert!(
        pool_cgroups(&t.jail).is_empty(),
        "{:?}",
        pool_cgroups(&t.jail)
    );
    // Launching still works without the pool.
    let s = spec(&t, 8, Limits::default());
    let l = t.jail.launch(&s).unwrap();
    t.jail.destroy(&s.id).unwrap();
    assert_gone(&t.jail, &s.id, l.pid);
    // Dropping a Jail with a pool removes it too.
    let j2 = Jail::new(t.jail.config().clone())
        .unwrap()
        .with_pool(2, Limits::default().disk_bytes)
        .unwrap();
    assert!(j2
        .pool()
        .unwrap()
        .wait_full(std::time::Duration::from_secs(20)));
    let pids = j2.pool().unwrap().member_pids();
    let cfg = j2.config().clone();
    drop(j2);
    for p in &pids {
        assert!(!proc_alive(*p), "pool member {p} survived drop");
    }
    t.jail = Jail::new(cfg).unwrap();
    assert!(pool_cgroups(&t.jail).is_empty());
    assert!(pool_dirs(&t.jail).is_empty());
}

#[test]
fn other_disk_sizes_bypass_the_pool() {
    if let Some(r) = skip_reason() {
        eprintln!("skipped: {r}");
        return;
    }
    let Some(t) = pooled_env("pooldisk", 1, 64 << 20) else {
        return;
    };
    let before = t.jail.pool().unwrap().member_names();
    let s = spec(
        &t,
        10,
        Limits {
            disk_bytes: 48 << 20,
            ..Limits::default()
        },
    );
    let l = t.jail.launch(&s).unwrap();
    assert_eq!(t.jail.pool().unwrap().member_names(), before);
    let md = std::fs::metadata(t.jail.sandbox_dir(&s.id).join("disk.img")).unwrap();
    assert_eq!(md.len(), 48 << 20);
    t.jail.destroy(&s.id).unwrap();
    assert_gone(&t.jail, &s.id, l.pid);
}

#[test]
fn failed_pooled_launch_leaves_nothing() {
    if let Some(r) = skip_reason() {
        eprintln!("skipped: {r}");
        return;
    }
    let Some(mut t) = pooled_env("poolfail", 1, Limits::default().disk_bytes) else {
        return;
    };
    // A pool whose sandboxes fail late in the jailer (agent binary missing).
    t.jail = Jail::new(JailConfig {
        agent_bin: PathBuf::from("/nonexistent/agent"),
        ..t.jail.config().clone()
    })
    .unwrap()
    .with_pool(1, Limits::default().disk_bytes)
    .unwrap();
    let pool = t.jail.pool().unwrap();
    assert!(pool.wait_full(std::time::Duration::from_secs(20)));
    let member = pool.member_pids()[0];
    let s = spec(&t, 9, Limits::default());
    let e = t.jail.launch(&s).unwrap_err();
    assert!(e.to_string().contains("agent"), "{e}");
    assert!(t.jail.leftovers().unwrap().is_empty());
    assert!(!t.jail.sandbox_dir(&s.id).exists());
    for d in t.jail.cgroup_dirs(&s.id) {
        assert!(!d.exists(), "cgroup left: {}", d.display());
    }
    assert!(
        eventually(|| !proc_alive(member)),
        "the used jailer survived"
    );
    // Only the refilled member's cgroups and directory remain.
    assert!(pool.wait_full(std::time::Duration::from_secs(20)));
    // One cgroup per controller hierarchy.
    let hierarchies = t.jail.cgroup_dirs(&s.id).len();
    assert_eq!(pool_cgroups(&t.jail).len(), hierarchies);
    assert_eq!(pool_dirs(&t.jail).len(), 1);
}

#[test]
fn stale_pool_and_dying_traces_are_removed_at_start() {
    if let Some(r) = skip_reason() {
        eprintln!("skipped: {r}");
        return;
    }
    let mut t = TestEnv::new("poolstale");
    if t.jail.features().cgroup != CgroupVersion::V1 {
        eprintln!("skipped: the jailer pool is for cgroup v1 hosts");
        return;
    }
    // A pool cgroup of a daemon that is gone (pid above pid_max), and one of ours (alive).
    let dead = "pool-2147483647-1";
    let ours = format!("pool-{}-1", std::process::id());
    // And a destroyed sandbox whose removal a stopped daemon did not finish.
    let dying = "dying-abc";
    for d in t.jail.cgroup_dirs(&SandboxId::parse("x").unwrap()) {
        let sub = d.parent().unwrap();
        std::fs::create_dir_all(sub.join(dead)).unwrap();
        std::fs::create_dir_all(sub.join(&ours)).unwrap();
        std::fs::create_dir_all(sub.join(dying)).unwrap();
    }
    let dying_dir = t.jail.config().state_dir.join(dying);
    std::fs::create_dir_all(dying_dir.join("mnt")).unwrap();
    t.jail = Jail::new(t.jail.config().clone()).unwrap();
    assert!(!dying_dir.exists());
    for d in t.jail.cgroup_dirs(&SandboxId::parse("x").unwrap()) {
        assert!(!d.parent().unwrap().join(dying).exists());
    }
    let left: Vec<String> = pool_cgroups(&t.jail)
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert!(!left.iter().any(|n| n == dead), "{left:?}");
    let hierarchies = t.jail.cgroup_dirs(&SandboxId::parse("x").unwrap()).len();
    assert_eq!(
        left.iter().filter(|n| **n == ours).count(),
        hierarchies,
        "{left:?}"
    );
    for d in t.jail.cgroup_dirs(&SandboxId::parse("x").unwrap()) {
        std::fs::remove_dir(d.parent().unwrap().join(&ours)).unwrap();
    }
}

#[test]
fn a_jailer_that_never_prepares_does_not_block_close() {
    if let Some(r) = skip_reason() {
        eprintln!("skipped: {r}");
        return;
    }
    let mut t = TestEnv::new("poolhang");
    if t.jail.features().cgroup != CgroupVersion::V1 {
        eprintln!("skipped: the jailer pool is for cgroup v1 hosts");
        return;
    }
    // `tail` reads its stdin and never answers the prepare line.
    let Some(tail) = ["/usr/bin/tail", "/bin/tail"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
    else {
        eprintln!("skipped: no tail");
        return;
    };
    t.jail = Jail::new(JailConfig {
        jailer_bin: tail,
        ..t.jail.config().clone()
    })
    .unwrap()
    .with_pool(2, Limits::default().disk_bytes)
    .unwrap();
    // Wait until the refill has members in preparation.
    assert!(eventually(|| pool_dirs(&t.jail).len() == 2));
    assert_eq!(t.jail.pool().unwrap().ready(), 0);
    t.jail.close_pool();
    assert!(pool_dirs(&t.jail).is_empty(), "{:?}", pool_dirs(&t.jail));
    assert!(
        pool_cgroups(&t.jail).is_empty(),
        "{:?}",
        pool_cgroups(&t.jail)
    );
}

#[test]
fn freeze_stops_a_spinner_thaw_resumes_it_and_destroy_of_a_frozen_sandbox_leaves_nothing() {
    if let Some(r) = skip_reason() {
        eprintln!("skipped: {r}");
        return;
    }
    let t = TestEnv::new("freeze");
    let j = &t.jail;
    if j.features().cgroup == CgroupVersion::V1
        && !Path::new("/sys/fs/cgroup/freezer/cgroup.procs").exists()
    {
        eprintln!("skipped: no v1 freezer controller");
        return;
    }
    let s = spec(&t, 11, Limits::default());
    let l = j.launch(&s).unwrap();
    assert!(!j.is_frozen(&s.id).unwrap());
    let (o, c) = run(
        &l.agent_socket,
        0,
        "sh -c 'while :; do :; done' </dev/null >/dev/null 2>&1 &",
    );
    assert_eq!(c, 0, "{o}");
    let cpu = || j.usage(&s.id).unwrap().cpu_usec;
    let c0 = cpu();
    assert!(
        eventually(|| cpu() > c0 + 50_000),
        "the spinner does not spin"
    );

    let t0 = std::time::Instant::now();
    j.freeze(&s.id).unwrap();
    let took = t0.elapsed();
    assert!(j.is_frozen(&s.id).unwrap());
    // Idempotent.
    j.freeze(&s.id).unwrap();
    let c1 = cpu();
    // A window of real time: a running spinner would use most of it.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let c2 = cpu();
    assert!(
        c2 - c1 < 1_000,
        "frozen sandbox used {} us of CPU in 300 ms",
        c2 - c1
    );
    // Memory is kept: every process is still there.
    assert!(j.usage(&s.id).unwrap().pids >= 2);
    let t1 = std::time::Instant::now();
    j.thaw(&s.id).unwrap();
    let thaw_took = t1.elapsed();
    assert!(!j.is_frozen(&s.id).unwrap());
    assert!(
        eventually(|| cpu() > c2 + 50_000),
        "the spinner did not continue after thaw"
    );
    // The agent (PID 1) answers again.
    let (o, c) = run(&l.agent_socket, 0, "echo back");
    assert_eq!((o.as_str(), c), ("back\n", 0));
    eprintln!("freeze {took:?}, thaw {thaw_took:?}");

    // Destroying a frozen sandbox kills everything and leaves nothing.
    j.freeze(&s.id).unwrap();
    j.destroy(&s.id).unwrap();
    assert_gone(j, &s.id, l.pid);
}

/// CPU ticks (user + system) a process has used.
fn cpu_ticks(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = s.rsplit_once(") ").map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 of stat (utime, stime), counted from after the command name.
    f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
}

#[test]
fn v2_freeze_thaw_and_destroy_of_a_frozen_cgroup() {
    if let Some(r) = skip_reason() {
        eprintln!("skipped: {r}");
        return;
    }
    // The v2 hierarchy: the host's unified mount (this host runs v1 for sandboxes) or /.
    let Some(root) = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
        .into_iter()
        .map(Path::new)
        .find(|r| r.join("cgroup.procs").exists() && r.join("cgroup.subtree_control").exists())
    else {
        eprintln!("skipped: no cgroup v2 hierarchy");
        return;
    };
    let cg = rampart_jail::cgroup::Cgroups {
        version: CgroupVersion::V2,
        root: root.into(),
        subtree: format!("rampart-test-{}-v2freeze", std::process::id()),
        v1_freezer: false,
    };
    let name = "spin";
    let dir = cg.dirs(name).remove(0);
    std::fs::create_dir_all(&dir).unwrap();
    if !dir.join("cgroup.freeze").exists() {
        eprintln!("skipped: no cgroup.freeze (kernel older than 5.2)");
        let _ = std::fs::remove_dir(&dir);
        let _ = std::fs::remove_dir(dir.parent().unwrap());
        return;
    }
    let mut child = std::process::Command::new("sh")
        .args(["-c", "while :; do :; done"])
        .spawn()
        .unwrap();
    std::fs::write(dir.join("cgroup.procs"), child.id().to_string()).unwrap();
    let pid = child.id();
    let t0 = cpu_ticks(pid);
    assert!(
        eventually(|| cpu_ticks(pid) > t0 + 5),
        "the spinner does not spin"
    );
    cg.freeze(name, std::time::Duration::from_secs(5)).unwrap();
    assert_eq!(
        cg.freezer_state(name).unwrap(),
        rampart_jail::cgroup::FreezerState::Frozen
    );
    let t1 = cpu_ticks(pid);
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(cpu_ticks(pid) <= t1 + 1, "a frozen task ran");
    cg.thaw(name).unwrap();
    assert_eq!(
        cg.freezer_state(name).unwrap(),
        rampart_jail::cgroup::FreezerState::Thawed
    );
    let t2 = cpu_ticks(pid);
    assert!(
        eventually(|| cpu_ticks(pid) > t2 + 5),
        "no progress after thaw"
    );
    // Destroy of a frozen cgroup kills its tasks and removes it.
    cg.freeze(name, std::time::Duration::from_secs(5)).unwrap();
    cg.destroy(name).unwrap();
    let st = child.wait().unwrap();
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&st), Some(9));
    assert!(!dir.exists());
    let _ = std::fs::remove_dir(dir.parent().unwrap());
}
