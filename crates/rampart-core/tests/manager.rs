//! Integration tests of the manager with the real namespace tier and agent (needs root and
//! the built `rampart-jailer` and `rampart-agent` binaries: `cargo build -p rampart-agent -p
//! rampart-jail`). Each test prints why it skips when something is missing.

mod common;

use common::{cmd, collect, node, run, wait_state};
use rampart_core::{CoreConfig, CoreError, Manager};
use rampart_store::SandboxStore;
use rampart_types::{CreateSandbox, ExecRequest, SandboxId, SandboxState};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One test's world: a data dir, a cgroup subtree and a uid range of its own.
struct World {
    dir: PathBuf,
    subtree: String,
    cfg: CoreConfig,
}

fn bins() -> Result<(PathBuf, PathBuf), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    // target/debug/deps/<test> -> target/debug
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .ok_or("cannot locate the target directory")?
        .to_path_buf();
    let jailer = dir.join("rampart-jailer");
    let agent = dir.join("rampart-agent");
    for b in [&jailer, &agent] {
        if !b.exists() {
            return Err(format!(
                "{} is not built (cargo build -p rampart-agent -p rampart-jail)",
                b.display()
            ));
        }
    }
    Ok((jailer, agent))
}

impl World {
    fn new(tag: &str, index: u32) -> Result<World, String> {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "info".into()),
            )
            .with_test_writer()
            .try_init();
        if !nix_is_root() {
            return Err("needs root".into());
        }
        let (jailer, agent) = bins()?;
        let pid = std::process::id();
        let dir = PathBuf::from(format!("/var/tmp/rampart-core-test-{pid}-{tag}"));
        let _ = std::fs::remove_dir_all(&dir);
        let mut cfg = CoreConfig::with_defaults(dir.clone(), jailer, agent);
        // Ranges of their own, away from other test binaries' (jail tests use 2_000_000+).
        cfg.uid_slots = 4;
        cfg.uid_range_start = 1_000_000_000 + ((pid % 200) * 10 + index) * 4 * 65536;
        cfg.max_timeout_secs = 3600;
        // A CI machine may have only a few GiB free: the sparse 2 GiB disks of the tests'
        // sandboxes are overcommitted (disk admission has tests of its own).
        cfg.disk_overcommit = 1000.0;
        Ok(World {
            dir,
            subtree: format!("rampart-coretest-{pid}-{tag}"),
            cfg,
        })
    }

    async fn start(&self) -> Result<Arc<Manager>, String> {
        match Manager::start_with_cgroup_subtree(self.cfg.clone(), &self.subtree).await {
            Ok(m) => Ok(m),
            Err(e) if e.to_string().contains("missing a required kernel feature") => {
                Err(format!("host lacks a feature: {e}"))
            }
            Err(e) => panic!("manager start failed: {e}"),
        }
    }

    fn store(&self) -> rampart_store::SqliteStore {
        rampart_store::SqliteStore::open(&self.dir.join("state.db")).unwrap()
    }

    /// The sandboxes' directories: on the copy-on-write store when the daemon made one
    /// (`<dir>/store`, see rampart_jail::store), else `<dir>/sandboxes`.
    fn sandboxes_dir(&self) -> PathBuf {
        if self.dir.join("store.img").exists() {
            self.dir.join("store").join("sandboxes")
        } else {
            self.dir.join("sandboxes")
        }
    }

    /// Every host trace of a sandbox: its directory, its cgroups, mounts naming it.
    fn traces(&self, id: &SandboxId) -> Vec<String> {
        let mut out = Vec::new();
        let sdir = self.sandboxes_dir().join(id.as_str());
        if sdir.exists() {
            out.push(sdir.display().to_string());
        }
        if let Ok(rd) = std::fs::read_dir("/sys/fs/cgroup") {
            for c in rd.flatten() {
                let p = c.path().join(&self.subtree).join(id.as_str());
                if p.exists() {
                    out.push(p.display().to_string());
                }
            }
        }
        if let Ok(m) = std::fs::read_to_string("/proc/self/mountinfo") {
            out.extend(
                m.lines()
                    .filter(|l| l.contains(id.as_str()))
                    .map(str::to_owned),
            );
        }
        out
    }
}

impl Drop for World {
    fn drop(&mut self) {
        // Remove whatever a failed test left, with a jail of the same configuration.
        if let Ok(jail) = rampart_jail::Jail::new(rampart_jail::JailConfig {
            state_dir: self.sandboxes_dir(),
            jailer_bin: self.cfg.jailer_bin.clone(),
            agent_bin: self.cfg.agent_bin.clone(),
            cgroup_subtree: self.subtree.clone(),
        }) {
            for id in jail.leftovers().unwrap_or_default() {
                let _ = jail.destroy(&id);
            }
        }
        if let Ok(rd) = std::fs::read_dir("/sys/fs/cgroup") {
            for c in rd.flatten() {
                let _ = std::fs::remove_dir(c.path().join(&self.subtree));
            }
        }
        // The store the manager mounted (its sandboxes are gone; lazily, in case).
        let store = self.dir.join("store");
        if std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .any(|l| l.split(' ').nth(4) == Some(&*store.to_string_lossy()))
        {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&store)
                .status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn nix_is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

macro_rules! world_or_skip {
    ($tag:expr, $index:expr) => {
        match World::new($tag, $index) {
            Ok(w) => w,
            Err(why) => {
                eprintln!("SKIP {}: {why}", $tag);
                return;
            }
        }
    };
}

macro_rules! start_or_skip {
    ($w:expr) => {
        match $w.start().await {
            Ok(m) => m,
            Err(why) => {
                eprintln!("SKIP: {why}");
                return;
            }
        }
    };
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_exec_and_destroy_leave_nothing() {
    let w = world_or_skip!("life", 0);
    let m = start_or_skip!(w);
    let info = m
        .create(
            &node(),
            CreateSandbox {
                env: [("GREETING".to_string(), "hello".to_string())].into(),
                metadata: [("team".to_string(), "core".to_string())].into(),
                ..Default::default()
            },
        )
        .await
        .expect("create");
    let id = info.id.clone();
    assert_eq!(info.state, SandboxState::Running);
    assert_eq!(info.env_names, vec!["GREETING"]);

    let r = run(&m, &id, cmd(&["echo", "hi"])).await;
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    assert_eq!(r.stdout, b"hi\n");

    let r = run(
        &m,
        &id,
        cmd(&["sh", "-c", "echo $GREETING; echo oops >&2; exit 3"]),
    )
    .await;
    assert_eq!(r.exit_code, Some(3), "{r:?}");
    assert_eq!(r.signal, None);
    assert_eq!(r.stdout, b"hello\n");
    assert_eq!(r.stderr, b"oops\n");

    let r = run(
        &m,
        &id,
        ExecRequest {
            stdin: Some("abc".into()),
            ..cmd(&["cat"])
        },
    )
    .await;
    assert_eq!(r.stdout, b"abc", "{r:?}");
    let r = run(
        &m,
        &id,
        ExecRequest {
            stdin_base64: Some("AAEC/w==".into()),
            ..cmd(&["od", "-An", "-tx1"])
        },
    )
    .await;
    assert_eq!(
        String::from_utf8_lossy(&r.stdout).trim(),
        "00 01 02 ff",
        "{r:?}"
    );

    // Interactive stdin, then a signal.
    let exec = common::sb(&m, &id)
        .exec(cmd(&["cat"]), true)
        .await
        .expect("exec cat");
    let control = exec.control.clone();
    control
        .send_stdin(bytes::Bytes::from_static(b"ping\n"))
        .await
        .unwrap();
    control.close_stdin().await.unwrap();
    let r = collect(exec).await;
    assert_eq!(r.stdout, b"ping\n");
    assert_eq!(r.exit_code, Some(0));

    let exec = common::sb(&m, &id)
        .exec(cmd(&["sleep", "60"]), false)
        .await
        .expect("exec sleep");
    exec.control.signal(false).await.unwrap();
    let r = collect(exec).await;
    assert_eq!(
        (r.exit_code, r.signal, r.timed_out),
        (None, Some(15), false),
        "{r:?}"
    );

    // Core's own timeout.
    let r = run(
        &m,
        &id,
        ExecRequest {
            timeout_secs: Some(1),
            ..cmd(&["sleep", "60"])
        },
    )
    .await;
    assert!(r.timed_out, "{r:?}");
    assert_eq!(r.signal, Some(9));
    assert_eq!(r.exit_code, None);

    // A PTY.
    let r = run(
        &m,
        &id,
        ExecRequest {
            tty: Some([80, 24]),
            ..cmd(&["tty"])
        },
    )
    .await;
    assert!(
        String::from_utf8_lossy(&r.pty).contains("/dev/pts/"),
        "{r:?}"
    );

    // Bad input.
    assert!(matches!(
        common::sb(&m, &id).exec(cmd(&[]), false).await,
        Err(CoreError::BadRequest { field, .. }) if field == "cmd"
    ));
    let missing = SandboxId::parse("nosuchsandbox").unwrap();
    assert!(matches!(
        common::sb(&m, &missing).exec(cmd(&["true"]), false).await,
        Err(CoreError::NotFound(_))
    ));

    // Listing and metadata filters.
    let team: BTreeMap<_, _> = [("team".to_string(), "core".to_string())].into();
    assert_eq!(m.list(&node(), None, &team).unwrap().len(), 1);
    let other: BTreeMap<_, _> = [("team".to_string(), "x".to_string())].into();
    assert!(m.list(&node(), None, &other).unwrap().is_empty());

    let usage = common::sb(&m, &id).usage().await.expect("usage");
    assert!(usage.pids >= 1, "{usage:?}");

    let init_pid = w.store().get(&id).unwrap().unwrap().pid.unwrap();
    let done = common::sb(&m, &id).destroy().await.expect("destroy");
    assert_eq!(done.state, SandboxState::Destroyed);
    assert!(done.ended_at.is_some());
    assert_eq!(w.traces(&id), Vec::<String>::new());
    // Its init is reaped (by the watcher, just after the destroy).
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::read_to_string(format!("/proc/{init_pid}/stat"))
        .is_ok_and(|s| s.contains(") Z "))
    {
        assert!(Instant::now() < deadline, "init {init_pid} left a zombie");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Idempotent, and a destroyed sandbox refuses work with 409.
    assert_eq!(
        common::sb(&m, &id).destroy().await.unwrap().state,
        SandboxState::Destroyed
    );
    assert!(matches!(
        common::sb(&m, &id).exec(cmd(&["true"]), false).await,
        Err(CoreError::WrongState { .. })
    ));
    assert!(matches!(
        common::sb(&m, &id).set_timeout(10).await,
        Err(CoreError::WrongState { .. })
    ));

    let text = m.metrics_text();
    for name in [
        "rampart_sandboxes{state=\"destroyed\"} 1",
        "rampart_sandbox_creates_total{result=\"ok\"} 1",
        "rampart_sandbox_create_seconds",
        "rampart_execs_total",
        "rampart_exec_seconds",
        "rampart_sandboxes_destroyed_total{reason=\"request\"} 1",
    ] {
        assert!(text.contains(name), "metrics lack {name}:\n{text}");
    }
    m.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_destroys_and_timeout_extends() {
    let w = world_or_skip!("expiry", 1);
    let m = start_or_skip!(w);
    let a = m
        .create(
            &node(),
            CreateSandbox {
                timeout_secs: Some(1),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let b = m
        .create(
            &node(),
            CreateSandbox {
                timeout_secs: Some(1),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    // Extend b before it expires; a expires.
    common::sb(&m, &b.id).set_timeout(600).await.unwrap();
    let gone = wait_state(&m, &a.id, SandboxState::Destroyed, Duration::from_secs(30)).await;
    assert_eq!(gone.reason.as_deref(), Some("timeout expired"));
    assert_eq!(w.traces(&a.id), Vec::<String>::new());
    assert_eq!(
        common::sb(&m, &b.id).info().unwrap().state,
        SandboxState::Running
    );
    assert_eq!(run(&m, &b.id, cmd(&["true"])).await.exit_code, Some(0));
    // Shortening it wakes the reaper.
    common::sb(&m, &b.id).set_timeout(1).await.unwrap();
    wait_state(&m, &b.id, SandboxState::Destroyed, Duration::from_secs(30)).await;
    assert_eq!(w.traces(&b.id), Vec::<String>::new());
    assert!(matches!(
        common::sb(&m, &b.id).set_timeout(100_000).await,
        Err(CoreError::Limit(_))
    ));
    m.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dying_init_is_noticed_and_cleaned() {
    let w = world_or_skip!("died", 2);
    let m = start_or_skip!(w);
    let s = m.create(&node(), CreateSandbox::default()).await.unwrap();
    let pid = w.store().get(&s.id).unwrap().unwrap().pid.unwrap();
    // SAFETY: kill of the sandbox's init, a process this test's manager started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let info = wait_state(&m, &s.id, SandboxState::Destroyed, Duration::from_secs(30)).await;
    assert!(info.reason.unwrap_or_default().contains("unexpectedly"));
    assert_eq!(w.traces(&s.id), Vec::<String>::new());
    // Reaped: no zombie left behind.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    assert!(!stat.contains(") Z "), "zombie left: {stat}");
    m.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_and_bad_requests_are_refused() {
    let mut w = world_or_skip!("cap", 3);
    w.cfg.max_sandboxes = 1;
    let m = start_or_skip!(w);
    assert!(matches!(
        m.create(&node(), CreateSandbox { template: Some("nope".into()), ..Default::default() }).await,
        Err(CoreError::BadRequest { field, .. }) if field == "template"
    ));
    let s = m.create(&node(), CreateSandbox::default()).await.unwrap();
    assert!(matches!(
        m.create(&node(), CreateSandbox::default()).await,
        Err(CoreError::Capacity(_))
    ));
    common::sb(&m, &s.id).destroy().await.unwrap();
    let s2 = m.create(&node(), CreateSandbox::default()).await.unwrap();
    common::sb(&m, &s2.id).destroy().await.unwrap();
    m.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_reattaches_the_living_and_cleans_the_dead() {
    let w = world_or_skip!("restart", 4);
    let m = start_or_skip!(w);
    let alive = m
        .create(
            &node(),
            CreateSandbox {
                timeout_secs: Some(600),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let dead = m
        .create(
            &node(),
            CreateSandbox {
                timeout_secs: Some(600),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    // Leave a process running in the living one to see it survive.
    let r = run(&m, &alive.id, cmd(&["sh", "-c", "echo kept > /tmp/mark"])).await;
    assert_eq!(r.exit_code, Some(0));
    m.shutdown().await;
    drop(m);

    // While no daemon runs, one sandbox dies.
    let dead_pid = w.store().get(&dead.id).unwrap().unwrap().pid.unwrap();
    // SAFETY: kill of a sandbox init this test's manager started.
    assert_eq!(unsafe { libc::kill(dead_pid, libc::SIGKILL) }, 0);

    // And a half-made sandbox no record knows: a directory and a cgroup.
    let stray = SandboxId::parse("strayleftover1").unwrap();
    std::fs::create_dir(w.sandboxes_dir().join(stray.as_str())).unwrap();
    let stray_cg = PathBuf::from("/sys/fs/cgroup/pids")
        .join(&w.subtree)
        .join(stray.as_str());
    let _ = std::fs::create_dir(&stray_cg);
    assert!(!w.traces(&stray).is_empty());

    let m = start_or_skip!(w);
    assert_eq!(w.traces(&stray), Vec::<String>::new());
    assert_eq!(
        common::sb(&m, &alive.id).info().unwrap().state,
        SandboxState::Running
    );
    let r = run(&m, &alive.id, cmd(&["cat", "/tmp/mark"])).await;
    assert_eq!(r.stdout, b"kept\n", "{r:?}");
    let d = common::sb(&m, &dead.id).info().unwrap();
    assert_eq!(d.state, SandboxState::Destroyed);
    assert_eq!(
        d.reason.as_deref(),
        Some("daemon restarted; sandbox was not running")
    );
    assert_eq!(w.traces(&dead.id), Vec::<String>::new());
    let stat = std::fs::read_to_string(format!("/proc/{dead_pid}/stat")).unwrap_or_default();
    assert!(!stat.contains(") Z "), "zombie left: {stat}");

    common::sb(&m, &alive.id).destroy().await.unwrap();
    assert_eq!(w.traces(&alive.id), Vec::<String>::new());
    m.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creates_get_their_own_uid_ranges() {
    let w = world_or_skip!("conc", 5);
    let m = start_or_skip!(w);
    // The world has 4 uid slots: 4 concurrent creates succeed, a fifth gets 503.
    let creates: Vec<_> = (0..4)
        .map(|_| {
            let m = m.clone();
            tokio::spawn(async move { m.create(&node(), CreateSandbox::default()).await })
        })
        .collect();
    let mut ids = Vec::new();
    for c in creates {
        ids.push(c.await.unwrap().expect("create").id);
    }
    assert!(matches!(
        m.create(&node(), CreateSandbox::default()).await,
        Err(CoreError::Capacity(_))
    ));
    let store = w.store();
    let mut slots: Vec<u32> = ids
        .iter()
        .map(|id| store.get(id).unwrap().unwrap().uid_slot)
        .collect();
    slots.sort();
    assert_eq!(slots, vec![0, 1, 2, 3]);
    // Each sees root inside as a different host uid.
    let mut host_uids = Vec::new();
    for id in &ids {
        let pid = store.get(id).unwrap().unwrap().pid.unwrap();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let uid = status
            .lines()
            .find(|l| l.starts_with("Uid:"))
            .unwrap()
            .to_owned();
        host_uids.push(uid);
        let r = run(
            &m,
            id,
            ExecRequest {
                user: Some("root".into()),
                ..cmd(&["id", "-u"])
            },
        )
        .await;
        assert_eq!(r.stdout, b"0\n", "{r:?}");
    }
    host_uids.sort();
    host_uids.dedup();
    assert_eq!(host_uids.len(), 4);
    assert_eq!(
        m.list(&node(), Some(SandboxState::Running), &BTreeMap::new())
            .unwrap()
            .len(),
        4
    );
    let destroys: Vec<_> = ids
        .iter()
        .cloned()
        .map(|id| {
            let m = m.clone();
            tokio::spawn(async move { common::sb(&m, &id).destroy().await })
        })
        .collect();
    for d in destroys {
        assert_eq!(
            d.await.unwrap().expect("destroy").state,
            SandboxState::Destroyed
        );
    }
    for id in &ids {
        assert_eq!(w.traces(id), Vec::<String>::new());
    }
    m.shutdown().await;
}

/// Reads the counter a background loop in the sandbox keeps in /tmp/count.
async fn counter(m: &Manager, id: &SandboxId) -> u64 {
    let r = run(m, id, cmd(&["cat", "/tmp/count"])).await;
    String::from_utf8_lossy(&r.stdout)
        .trim()
        .parse()
        .unwrap_or(0)
}

/// Waits (polling, bounded) until the counter is above `above`; returns it.
async fn counter_above(m: &Manager, id: &SandboxId, above: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let c = counter(m, id).await;
        if c > above {
            return c;
        }
        assert!(Instant::now() < deadline, "counter stuck at {c}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_freezes_resume_continues_and_a_paused_sandbox_survives_a_restart() {
    let w = world_or_skip!("pause", 6);
    let m = start_or_skip!(w);
    let s = m
        .create(
            &node(),
            CreateSandbox {
                timeout_secs: Some(600),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let bg = "i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.02; done";
    let r = run(
        &m,
        &s.id,
        cmd(&["sh", "-c", &format!("({bg}) </dev/null >/dev/null 2>&1 &")]),
    )
    .await;
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    let c0 = counter_above(&m, &s.id, 0).await;

    let info = common::sb(&m, &s.id).pause().await.unwrap();
    assert_eq!(info.state, SandboxState::Paused);
    assert_eq!(
        common::sb(&m, &s.id).info().unwrap().state,
        SandboxState::Paused
    );
    // Pausing again changes nothing.
    assert_eq!(
        common::sb(&m, &s.id).pause().await.unwrap().state,
        SandboxState::Paused
    );
    let e = common::sb(&m, &s.id)
        .exec(cmd(&["true"]), false)
        .await
        .unwrap_err();
    assert!(
        matches!(&e, CoreError::WrongState { state, .. } if state == "paused"),
        "{e}"
    );
    assert!(matches!(
        common::sb(&m, &s.id).running(),
        Err(CoreError::WrongState { .. })
    ));
    // No CPU used while paused.
    let u1 = common::sb(&m, &s.id).usage().await.unwrap().cpu_usec;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let u2 = common::sb(&m, &s.id).usage().await.unwrap().cpu_usec;
    assert!(u2 - u1 < 1000, "paused sandbox used {} us of CPU", u2 - u1);

    // The daemon goes away and comes back: the sandbox is re-attached as paused (the CLI's
    // recovery test does this with kill -9).
    m.shutdown().await;
    drop(m);
    let m = start_or_skip!(w);
    assert_eq!(
        common::sb(&m, &s.id).info().unwrap().state,
        SandboxState::Paused
    );
    assert!(common::sb(&m, &s.id)
        .exec(cmd(&["true"]), false)
        .await
        .is_err());

    let info = common::sb(&m, &s.id).resume().await.unwrap();
    assert_eq!(info.state, SandboxState::Running);
    // Resuming a running sandbox changes nothing.
    assert_eq!(
        common::sb(&m, &s.id).resume().await.unwrap().state,
        SandboxState::Running
    );
    // The loop went on from where it was (not restarted).
    let c1 = counter(&m, &s.id).await;
    assert!(c1 >= c0, "counter went back: {c0} -> {c1}");
    counter_above(&m, &s.id, c1).await;

    let kinds: Vec<&str> = common::sb(&m, &s.id)
        .audit_events(None, 1000)
        .unwrap()
        .iter()
        .map(|e| e.body.type_name())
        .collect();
    let p = kinds.iter().position(|k| *k == "paused").expect("paused");
    let r = kinds.iter().position(|k| *k == "resumed").expect("resumed");
    assert!(p < r, "{kinds:?}");

    // Destroying a paused sandbox leaves nothing.
    common::sb(&m, &s.id).pause().await.unwrap();
    common::sb(&m, &s.id).destroy().await.unwrap();
    assert_eq!(w.traces(&s.id), Vec::<String>::new());
    m.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_timeout_pause_pauses_at_expiry_and_a_paused_sandbox_still_expires() {
    let w = world_or_skip!("pauseexp", 7);
    let m = start_or_skip!(w);
    let a = m
        .create(
            &node(),
            CreateSandbox {
                timeout_secs: Some(1),
                on_timeout: Some(rampart_types::OnTimeout::Pause),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let b = m
        .create(
            &node(),
            CreateSandbox {
                timeout_secs: Some(2),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    common::sb(&m, &b.id).pause().await.unwrap();
    wait_state(&m, &a.id, SandboxState::Paused, Duration::from_secs(30)).await;
    // b was paused by hand and its deadline destroys it.
    let gone = wait_state(&m, &b.id, SandboxState::Destroyed, Duration::from_secs(30)).await;
    assert_eq!(gone.reason.as_deref(), Some("timeout expired"));
    assert_eq!(w.traces(&b.id), Vec::<String>::new());
    // a stays paused (its record survives a restart with on_timeout).
    assert_eq!(
        w.store().get(&a.id).unwrap().unwrap().on_timeout,
        rampart_types::OnTimeout::Pause
    );
    assert_eq!(
        common::sb(&m, &a.id).info().unwrap().state,
        SandboxState::Paused
    );
    // Resumed, it gets a fresh deadline and works.
    let info = common::sb(&m, &a.id).resume().await.unwrap();
    assert_eq!(info.state, SandboxState::Running);
    assert!(info.expires_at > common::sb(&m, &a.id).info().unwrap().created_at);
    assert_eq!(run(&m, &a.id, cmd(&["true"])).await.exit_code, Some(0));
    common::sb(&m, &a.id).destroy().await.unwrap();
    assert_eq!(w.traces(&a.id), Vec::<String>::new());
    m.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_records_carry_fresh_cpu_and_peak_memory() {
    use rampart_types::audit::EventBody;
    let w = world_or_skip!("meter", 8);
    let m = start_or_skip!(w);
    let s = m.create(&node(), CreateSandbox::default()).await.unwrap();
    // Two execs that burn CPU: the second's CPU time is read afresh from the kept-open
    // counter files, not the first's value again.
    let burn = "i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done";
    for _ in 0..2 {
        assert_eq!(
            run(&m, &s.id, cmd(&["sh", "-c", burn])).await.exit_code,
            Some(0)
        );
    }
    let exits: Vec<_> = common::sb(&m, &s.id)
        .audit_events(None, 1000)
        .unwrap()
        .into_iter()
        .filter_map(|e| match e.body {
            EventBody::Exit(x) => Some(x),
            _ => None,
        })
        .collect();
    assert_eq!(exits.len(), 2);
    for x in &exits {
        assert!(x.cpu_ms.is_some_and(|c| c > 0), "{x:?}");
        assert!(x.peak_memory_bytes.is_some_and(|p| p > 0), "{x:?}");
    }
    common::sb(&m, &s.id).destroy().await.unwrap();
    m.shutdown().await;
}

/// Waits until `id`'s record has `n` events that `pred` accepts; returns the record.
async fn wait_events(
    m: &Manager,
    id: &SandboxId,
    n: usize,
    pred: impl Fn(&rampart_types::audit::EventBody) -> bool,
) -> Vec<rampart_types::audit::EventBody> {
    let mut events = m.audit_subscribe();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        events.borrow_and_update();
        let all: Vec<_> = common::sb(m, id)
            .audit_events(None, 10_000)
            .unwrap()
            .into_iter()
            .map(|e| e.body)
            .collect();
        if all.iter().filter(|b| pred(b)).count() >= n {
            return all;
        }
        match tokio::time::timeout_at(deadline, events.changed()).await {
            Ok(Ok(())) => {}
            _ => panic!("sandbox {id}: fewer than {n} such events in {all:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_sandbox_sleeps_and_the_next_request_wakes_it() {
    use rampart_types::audit::{EventBody, Pause, Resume};
    let mut w = world_or_skip!("idle", 9);
    w.cfg.idle_cold_secs = Some(2);
    let m = start_or_skip!(w);
    let idle = |b: &EventBody| {
        matches!(
            b,
            EventBody::Paused(Pause {
                idle: Some(true),
                ..
            })
        )
    };
    let woken = |b: &EventBody| {
        matches!(
            b,
            EventBody::Resumed(Resume {
                woken: Some(true),
                ..
            })
        )
    };
    // Bad input first: 0 seconds is refused, naming the field.
    let e = m
        .create(
            &node(),
            CreateSandbox {
                idle_pause_secs: Some(0),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert!(e.to_string().contains("idle_pause_secs"), "{e}");
    let s = m
        .create(
            &node(),
            CreateSandbox {
                idle_pause_secs: Some(1),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(s.idle_pause_secs, Some(1));
    // A command being waited for keeps it awake past its idle time.
    let r = run(
        &m,
        &s.id,
        cmd(&["sh", "-c", "echo kept > /tmp/f; sleep 2.5"]),
    )
    .await;
    assert_eq!(r.exit_code, Some(0));
    let before = wait_events(&m, &s.id, 1, idle).await;
    let exit_at = before
        .iter()
        .position(|b| matches!(b, EventBody::Exit(_)))
        .unwrap();
    let slept_at = before.iter().position(idle).unwrap();
    assert!(exit_at < slept_at, "slept while a command ran: {before:?}");
    assert_eq!(
        common::sb(&m, &s.id).info().unwrap().state,
        SandboxState::Paused
    );
    // The next request wakes it and gets its answer.
    let r = run(&m, &s.id, cmd(&["cat", "/tmp/f"])).await;
    assert_eq!(
        (r.exit_code, r.stdout.as_slice()),
        (Some(0), &b"kept\n"[..])
    );
    assert_eq!(
        common::sb(&m, &s.id).info().unwrap().state,
        SandboxState::Running
    );
    wait_events(&m, &s.id, 1, woken).await;
    // Asleep again, frozen; after `idle_cold_secs` it is paused to its filesystem, and a
    // file request boots it again from its disk.
    wait_events(&m, &s.id, 2, idle).await;
    let cold = |b: &EventBody| {
        matches!(
            b,
            EventBody::Paused(Pause {
                memory: Some(false),
                idle: Some(true)
            })
        )
    };
    wait_events(&m, &s.id, 1, cold).await;
    let got = common::sb(&m, &s.id)
        .stat("/tmp/f", None)
        .await
        .expect("stat wakes it");
    assert_eq!(got.size, 5);
    let all = wait_events(&m, &s.id, 2, woken).await;
    assert!(
        all.iter().any(|b| matches!(
            b,
            EventBody::Resumed(Resume {
                reboot: Some(true),
                woken: Some(true)
            })
        )),
        "{all:?}"
    );
    // A background process (no client reads it) does not keep it awake.
    common::sb(&m, &s.id)
        .spawn_process(cmd(&["sleep", "600"]))
        .await
        .unwrap();
    wait_events(&m, &s.id, 3, idle).await;
    // A sandbox without an idle sleep, paused, still answers 409 (nothing wakes it).
    let plain = m.create(&node(), CreateSandbox::default()).await.unwrap();
    common::sb(&m, &plain.id).pause().await.unwrap();
    let e = common::sb(&m, &plain.id)
        .exec(cmd(&["true"]), false)
        .await
        .unwrap_err();
    assert!(matches!(e, CoreError::WrongState { .. }), "{e:?}");
    for id in [&s.id, &plain.id] {
        common::sb(&m, id).destroy().await.unwrap();
        assert_eq!(w.traces(id), Vec::<String>::new());
    }
    m.shutdown().await;
}
