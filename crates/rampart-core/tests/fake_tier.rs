//! The manager's lifecycle on the fake tier (`rampart_core::FakeTier`: the real
//! `rampart-agent` as a plain child process): create, exec, destroy, the reaper, a dying init,
//! restart recovery, pause, the audit record. Needs no root and no kernel feature beyond
//! pidfds: run it as any user. Needs the built agent (`cargo build --workspace --bins`;
//! `RAMPART_TEST_AGENT` names another binary). Nothing here skips.

mod common;

use common::{cmd, node, run, wait_state};
use rampart_core::{CoreConfig, CoreError, CreateOptions, ExecRef, ExecStart, FakeTier, Manager};
use rampart_store::SandboxStore as _;
use rampart_types::audit::EventBody;
use rampart_types::{CreateSandbox, SandboxId, SandboxState};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// How long any awaited change may take (a bound, never a pause).
const WITHIN: Duration = Duration::from_secs(30);

/// One test's data directory and configuration.
struct World {
    dir: tempfile::TempDir,
    cfg: CoreConfig,
}

impl World {
    fn new() -> World {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "info".into()),
            )
            .with_test_writer()
            .try_init();
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cfg = FakeTier::test_config(dir.path().to_path_buf());
        cfg.max_timeout_secs = 3600;
        World { dir, cfg }
    }

    async fn start(&self) -> Arc<Manager> {
        let tier = FakeTier::from_config(&self.cfg).expect("fake tier");
        Manager::start_with(self.cfg.clone(), Arc::new(tier))
            .await
            .expect("manager start on the fake tier")
    }

    fn sandbox_dir(&self, id: &SandboxId) -> PathBuf {
        self.dir.path().join("sandboxes").join(id.as_str())
    }

    /// The agent's host pid, as the manager recorded it.
    fn pid(&self, id: &SandboxId) -> i32 {
        rampart_store::SqliteStore::open(&self.dir.path().join("state.db"))
            .unwrap()
            .get(id)
            .unwrap()
            .unwrap()
            .pid
            .expect("a running sandbox has a pid")
    }
}

impl Drop for World {
    /// A failed test's sandboxes are killed, not left running (the tier checks each agent's
    /// identity before it signals).
    fn drop(&mut self) {
        use rampart_core::Isolation as _;
        if let Ok(tier) = FakeTier::from_config(&self.cfg) {
            for id in tier.leftovers().unwrap_or_default() {
                let _ = tier.destroy(&id);
            }
        }
    }
}

/// A process: its pid and start time (`/proc/<pid>/stat` field 22).
#[derive(Debug, Clone, Copy)]
struct Proc {
    pid: i32,
    start: u64,
}

/// `(state, ppid, start time)` of a process.
fn stat(pid: i32) -> Option<(char, i32, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_ascii_whitespace().collect();
    Some((
        f.first()?.chars().next()?,
        f.get(1)?.parse().ok()?,
        f.get(19)?.parse().ok()?,
    ))
}

impl Proc {
    fn of(pid: i32) -> Proc {
        let (_, _, start) = stat(pid).unwrap_or_else(|| panic!("no process {pid}"));
        Proc { pid, start }
    }
    /// Still this process, in any state (a zombie included: not reaped).
    fn exists(&self) -> bool {
        stat(self.pid).is_some_and(|(_, _, s)| s == self.start)
    }
    fn state(&self) -> Option<char> {
        stat(self.pid)
            .filter(|(_, _, s)| *s == self.start)
            .map(|(st, _, _)| st)
    }
}

/// Waits, bounded, until a process has exited (its pidfd polls readable).
fn wait_exited(pid: i32) {
    // SAFETY: pidfd_open takes a pid and flags, no pointers; the result is checked.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return; // gone already
    }
    // SAFETY: the kernel just returned this descriptor; nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the call.
    let n = unsafe { libc::poll(&mut p, 1, WITHIN.as_millis() as i32) };
    assert_eq!(n, 1, "process {pid} did not exit");
}

fn kinds(m: &Manager, id: &SandboxId) -> Vec<&'static str> {
    common::sb(m, id)
        .audit_events(None, 1000)
        .unwrap()
        .iter()
        .map(|e| e.body.type_name())
        .collect()
}

fn destroyed_reason(m: &Manager, id: &SandboxId) -> String {
    common::sb(m, id)
        .audit_events(None, 1000)
        .unwrap()
        .into_iter()
        .find_map(|e| match e.body {
            EventBody::Destroyed(d) => Some(d.reason),
            _ => None,
        })
        .expect("a destroyed record")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_exec_destroy() {
    let w = World::new();
    let m = w.start().await;
    let info = m
        .create(
            &node(),
            CreateSandbox {
                env: [("GREETING".to_string(), "hello".to_string())].into(),
                ..Default::default()
            },
        )
        .await
        .expect("create");
    let id = info.id.clone();
    assert_eq!(info.state, SandboxState::Running);
    assert!(w.sandbox_dir(&id).is_dir());

    // The pid the manager watches is the agent itself, a child of this (the daemon's)
    // process.
    let agent = Proc::of(w.pid(&id));
    let (_, ppid, _) = stat(agent.pid).unwrap();
    assert_eq!(ppid, std::process::id() as i32);
    // (Its `exe` link is not readable: the agent makes itself non-dumpable.)
    assert_eq!(
        std::fs::read_to_string(format!("/proc/{}/comm", agent.pid))
            .unwrap()
            .trim_end(),
        "rampart-agent"
    );

    let r = run(&m, &id, cmd(&["echo", "hi"])).await;
    assert_eq!((r.exit_code, r.signal), (Some(0), None), "{r:?}");
    assert_eq!(r.stdout, b"hi\n");
    let r = run(
        &m,
        &id,
        cmd(&["sh", "-c", "echo $GREETING; echo oops >&2; exit 3"]),
    )
    .await;
    assert_eq!(r.exit_code, Some(3), "{r:?}");
    assert_eq!(r.stdout, b"hello\n");
    assert_eq!(r.stderr, b"oops\n");
    // Its processes work in the sandbox's own directory.
    let r = run(&m, &id, cmd(&["pwd"])).await;
    assert_eq!(
        String::from_utf8_lossy(&r.stdout).trim_end(),
        w.sandbox_dir(&id).join("home").to_string_lossy()
    );

    // A process left running in the background (orphaned: the agent adopts it).
    let r = run(
        &m,
        &id,
        cmd(&["sh", "-c", "sleep 300 </dev/null >/dev/null 2>&1 & echo $!"]),
    )
    .await;
    let bg = Proc::of(String::from_utf8_lossy(&r.stdout).trim().parse().unwrap());

    let usage = common::sb(&m, &id).usage().await.expect("usage");
    assert!(usage.pids >= 2, "the agent and the sleep: {usage:?}");
    assert!(usage.memory_bytes > 0, "{usage:?}");

    let done = common::sb(&m, &id).destroy().await.expect("destroy");
    assert_eq!(done.state, SandboxState::Destroyed);
    assert_eq!(done.reason.as_deref(), Some("destroyed by request"));
    assert!(
        !w.sandbox_dir(&id).exists(),
        "the sandbox's directory is left"
    );
    // Every process is gone and reaped: the agent and the one it adopted.
    assert!(!agent.exists(), "agent left: {:?}", agent.state());
    assert!(!bg.exists(), "background process left: {:?}", bg.state());

    // Idempotent; a destroyed sandbox refuses work.
    assert_eq!(
        common::sb(&m, &id).destroy().await.unwrap().state,
        SandboxState::Destroyed
    );
    assert!(matches!(
        common::sb(&m, &id).exec(cmd(&["true"]), false).await,
        Err(CoreError::WrongState { .. })
    ));
    assert!(m
        .metrics_text()
        .contains("rampart_sandboxes_destroyed_total{reason=\"request\"} 1"));
    m.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reaper_destroys_an_expired_sandbox() {
    let w = World::new();
    let m = w.start().await;
    let short = m
        .create(
            &node(),
            CreateSandbox {
                timeout_secs: Some(1),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let long = m
        .create(
            &node(),
            CreateSandbox {
                timeout_secs: Some(600),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let agent = Proc::of(w.pid(&short.id));
    let gone = wait_state(&m, &short.id, SandboxState::Destroyed, WITHIN).await;
    assert_eq!(gone.reason.as_deref(), Some("timeout expired"));
    assert!(destroyed_reason(&m, &short.id).starts_with("timeout:"));
    assert!(!w.sandbox_dir(&short.id).exists());
    assert!(!agent.exists(), "agent left: {:?}", agent.state());
    // Only the expired one.
    assert_eq!(
        common::sb(&m, &long.id).info().unwrap().state,
        SandboxState::Running
    );
    assert_eq!(run(&m, &long.id, cmd(&["true"])).await.exit_code, Some(0));
    // Shortening a deadline wakes the reaper.
    common::sb(&m, &long.id).set_timeout(1).await.unwrap();
    wait_state(&m, &long.id, SandboxState::Destroyed, WITHIN).await;
    assert!(!w.sandbox_dir(&long.id).exists());
    m.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2b_facts_and_recorded_execs_live_and_end_with_their_sandbox() {
    let w = World::new();
    let m = w.start().await;
    let e2b = |template: &str| CreateOptions {
        e2b_template: Some(template.to_owned()),
        ..Default::default()
    };
    let killed = m
        .create_with(&node(), CreateSandbox::default(), e2b("base"))
        .await
        .unwrap();
    let expiring = m
        .create_with(
            &node(),
            CreateSandbox {
                timeout_secs: Some(1),
                ..Default::default()
            },
            e2b("code-interpreter"),
        )
        .await
        .unwrap();
    let plain = m.create(&node(), CreateSandbox::default()).await.unwrap();
    let access = m.access();
    let facts = killed.e2b.clone().expect("asked for E2B facts");
    assert_eq!(facts.template, "base");
    assert_eq!(facts.access_token.len(), 64);
    assert_ne!(Some(&facts.access_token), killed.info.access_token.as_ref());
    // What create answered is what is recorded, in the same transaction as the sandbox.
    assert_eq!(
        access.e2b(killed.info.id.as_str()).unwrap(),
        Some(facts.clone())
    );
    assert!(access.is_e2b_token(&facts.access_token).unwrap());
    let soon = expiring.e2b.clone().unwrap();
    assert_eq!(soon.template, "code-interpreter");
    assert_eq!(
        access.e2b(expiring.info.id.as_str()).unwrap(),
        Some(soon.clone())
    );
    // A sandbox made otherwise has none.
    assert_eq!(access.e2b(plain.id.as_str()).unwrap(), None);
    // The envd proxy's recorded execs live in core with them, by pid and tag.
    let recorded = |id: &SandboxId, pid: u32| {
        let rec = common::sb(&m, id)
            .record_exec_start(ExecStart {
                argv: vec!["sleep".into(), "60".into()],
                user: "user".into(),
                stdin: true,
                ..Default::default()
            })
            .unwrap();
        let ticket = common::sb(&m, id).add_exec_input(pid, Some("bg"), rec.input_sink());
        (rec, ticket.expect("a running sandbox takes it"))
    };
    let (_k, kt) = recorded(&killed.info.id, 7);
    let (_e, _) = recorded(&expiring.info.id, 7);
    assert!(common::sb(&m, &killed.info.id)
        .exec_input(ExecRef::Tag("bg"))
        .is_some());
    assert!(common::sb(&m, &expiring.info.id)
        .exec_input(ExecRef::Pid(7))
        .is_some());
    assert!(common::sb(&m, &plain.id)
        .exec_input(ExecRef::Pid(7))
        .is_none());

    // Killed: gone with it.
    common::sb(&m, &killed.info.id).destroy().await.unwrap();
    assert_eq!(access.e2b(killed.info.id.as_str()).unwrap(), None);
    assert!(!access.is_e2b_token(&facts.access_token).unwrap());
    assert!(common::sb(&m, &killed.info.id)
        .exec_input(ExecRef::Pid(7))
        .is_none());
    assert!(common::sb(&m, &killed.info.id)
        .exec_input(ExecRef::Tag("bg"))
        .is_none());
    common::sb(&m, &killed.info.id).remove_exec_input(&kt);
    // Expired (the reaper): gone with it too.
    wait_state(&m, &expiring.info.id, SandboxState::Destroyed, WITHIN).await;
    assert_eq!(access.e2b(expiring.info.id.as_str()).unwrap(), None);
    assert!(!access.is_e2b_token(&soon.access_token).unwrap());
    assert!(common::sb(&m, &expiring.info.id)
        .exec_input(ExecRef::Pid(7))
        .is_none());
    common::sb(&m, &plain.id).destroy().await.unwrap();
    m.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_killed_from_outside_destroys_its_sandbox() {
    let w = World::new();
    let m = w.start().await;
    let s = m.create(&node(), CreateSandbox::default()).await.unwrap();
    let agent = Proc::of(w.pid(&s.id));
    // SAFETY: kill of the agent this test's manager started.
    assert_eq!(unsafe { libc::kill(agent.pid, libc::SIGKILL) }, 0);
    let info = wait_state(&m, &s.id, SandboxState::Destroyed, WITHIN).await;
    let reason = info.reason.unwrap_or_default();
    assert!(
        reason.contains("exited unexpectedly") && reason.contains("signal 9"),
        "{reason}"
    );
    assert!(destroyed_reason(&m, &s.id).starts_with("died:"));
    assert!(!w.sandbox_dir(&s.id).exists());
    // Reaped by the manager's watcher: no zombie.
    assert!(!agent.exists(), "agent left: {:?}", agent.state());
    m.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_reattaches_the_living_and_cleans_the_dead() {
    let w = World::new();
    let m = w.start().await;
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
    let r = run(&m, &alive.id, cmd(&["sh", "-c", "echo kept > mark"])).await;
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    let alive_agent = Proc::of(w.pid(&alive.id));
    let dead_agent = Proc::of(w.pid(&dead.id));
    m.shutdown().await;
    drop(m);

    // While no manager runs: one sandbox's agent dies, and a directory no record knows
    // appears.
    // SAFETY: kill of an agent this test's manager started.
    assert_eq!(unsafe { libc::kill(dead_agent.pid, libc::SIGKILL) }, 0);
    wait_exited(dead_agent.pid);
    let stray = SandboxId::parse("strayleftover1").unwrap();
    std::fs::create_dir(w.sandbox_dir(&stray)).unwrap();

    let m = w.start().await;
    // The living one: the same process, re-attached, and it works.
    assert_eq!(
        common::sb(&m, &alive.id).info().unwrap().state,
        SandboxState::Running
    );
    assert_eq!(w.pid(&alive.id), alive_agent.pid);
    assert!(alive_agent.exists());
    let r = run(&m, &alive.id, cmd(&["cat", "mark"])).await;
    assert_eq!(r.stdout, b"kept\n", "{r:?}");
    // The dead one: destroyed, cleaned and reaped.
    let d = common::sb(&m, &dead.id).info().unwrap();
    assert_eq!(d.state, SandboxState::Destroyed);
    assert_eq!(
        d.reason.as_deref(),
        Some("daemon restarted; sandbox was not running")
    );
    assert!(!w.sandbox_dir(&dead.id).exists());
    assert!(
        !dead_agent.exists(),
        "zombie left: {:?}",
        dead_agent.state()
    );
    assert!(destroyed_reason(&m, &dead.id).starts_with("recovery:"));
    // The stray directory is removed.
    assert!(!w.sandbox_dir(&stray).exists());

    // The re-attached sandbox is watched again: its death is noticed.
    // SAFETY: kill of an agent this test's manager started.
    assert_eq!(unsafe { libc::kill(alive_agent.pid, libc::SIGKILL) }, 0);
    let info = wait_state(&m, &alive.id, SandboxState::Destroyed, WITHIN).await;
    assert!(info.reason.unwrap_or_default().contains("unexpectedly"));
    assert!(!w.sandbox_dir(&alive.id).exists());
    m.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_stops_every_process_and_resume_continues() {
    let w = World::new();
    let m = w.start().await;
    let s = m.create(&node(), CreateSandbox::default()).await.unwrap();
    let agent = Proc::of(w.pid(&s.id));
    let r = run(
        &m,
        &s.id,
        cmd(&["sh", "-c", "sleep 300 </dev/null >/dev/null 2>&1 & echo $!"]),
    )
    .await;
    let bg = Proc::of(String::from_utf8_lossy(&r.stdout).trim().parse().unwrap());

    assert_eq!(
        common::sb(&m, &s.id).pause().await.unwrap().state,
        SandboxState::Paused
    );
    assert_eq!(agent.state(), Some('T'));
    assert_eq!(bg.state(), Some('T'));
    let e = common::sb(&m, &s.id)
        .exec(cmd(&["true"]), false)
        .await
        .unwrap_err();
    assert!(
        matches!(&e, CoreError::WrongState { state, .. } if state == "paused"),
        "{e}"
    );

    assert_eq!(
        common::sb(&m, &s.id).resume().await.unwrap().state,
        SandboxState::Running
    );
    assert_ne!(agent.state(), Some('T'));
    assert_ne!(bg.state(), Some('T'));
    assert_eq!(
        run(&m, &s.id, cmd(&["echo", "back"])).await.stdout,
        b"back\n"
    );

    // A tier that cannot keep a disk without its processes refuses a pause to the
    // filesystem, and a reboot, with the reason; the sandbox is left as it was.
    let e = common::sb(&m, &s.id).pause_with(false).await.unwrap_err();
    assert!(
        matches!(&e, CoreError::Unsupported(m) if m.contains("filesystem")),
        "{e}"
    );
    assert_eq!(
        common::sb(&m, &s.id).info().unwrap().state,
        SandboxState::Running
    );
    assert_eq!(
        run(&m, &s.id, cmd(&["echo", "still"])).await.stdout,
        b"still\n"
    );
    common::sb(&m, &s.id).pause().await.unwrap();
    let e = common::sb(&m, &s.id).resume_with(true).await.unwrap_err();
    assert!(matches!(&e, CoreError::Unsupported(_)), "{e}");
    assert_eq!(
        common::sb(&m, &s.id).info().unwrap().state,
        SandboxState::Paused
    );
    assert_eq!(bg.state(), Some('T'));

    // A paused sandbox is destroyed like any other.
    common::sb(&m, &s.id).destroy().await.unwrap();
    assert!(!agent.exists() && !bg.exists());
    assert!(!w.sandbox_dir(&s.id).exists());
    m.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_record_has_the_lifecycle_and_its_bundle_verifies() {
    let w = World::new();
    let m = w.start().await;
    let s = m.create(&node(), CreateSandbox::default()).await.unwrap();
    let r = run(&m, &s.id, cmd(&["echo", "hi"])).await;
    assert_eq!(r.stdout, b"hi\n");
    common::sb(&m, &s.id).destroy().await.unwrap();

    assert_eq!(
        kinds(&m, &s.id),
        ["created", "exec", "exit", "destroyed"],
        "the fake tier records no fs_diff (no writable layer)"
    );
    let events = common::sb(&m, &s.id).audit_events(None, 1000).unwrap();
    match &events[1].body {
        EventBody::Exec(x) => assert_eq!(x.argv, ["echo", "hi"]),
        other => panic!("not an exec: {other:?}"),
    }
    match &events[2].body {
        EventBody::Exit(x) => {
            assert_eq!(x.exit_code, Some(0));
            assert_eq!(x.stdout.size, 3);
            assert_eq!(x.stdout.digest, rampart_audit::content_digest(b"hi\n"));
            assert_eq!(x.stderr.size, 0);
            assert!(x.cpu_ms.is_some(), "CPU time from the tier's usage: {x:?}");
        }
        other => panic!("not an exit: {other:?}"),
    }
    assert!(destroyed_reason(&m, &s.id).starts_with("api:"));

    let bundle = common::sb(&m, &s.id).audit_bundle().await.expect("bundle");
    let key = rampart_audit::PublicKey::parse(&m.audit_key().0).unwrap();
    let report = rampart_audit::verify_bundle(&bundle, Some(&key)).expect("the bundle verifies");
    assert!(report.key_pinned);
    assert_eq!(report.sandbox, s.id);
    assert_eq!(report.events, 4);
    assert_eq!(report.activity.commands.len(), 1);
    assert_eq!(report.activity.commands[0].argv, ["echo", "hi"]);
    assert_eq!(report.activity.commands[0].exit_code, Some(0));

    // The record binds what ran: the same bundle claiming another command does not verify.
    let text = String::from_utf8(bundle).unwrap();
    assert!(text.contains("\"hi\""));
    let forged = text.replacen("\"hi\"", "\"ho\"", 1);
    assert!(rampart_audit::verify_bundle(forged.as_bytes(), Some(&key)).is_err());
    m.shutdown().await;
}

/// A tier that gives no access to a sandbox's disk (the fake tier) keeps no artifacts, and
/// says so: `destroyed.artifacts` names the paths, lists no file and is `truncated`; the
/// API has nothing to serve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn artifacts_on_a_tier_without_disk_access_are_recorded_as_not_kept() {
    let w = World::new();
    let m = w.start().await;
    let s = m
        .create(
            &node(),
            CreateSandbox {
                artifacts: vec!["/tmp/out".into()],
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(matches!(
        common::sb(&m, &s.id).artifacts(),
        Err(rampart_core::CoreError::WrongState { .. })
    ));
    common::sb(&m, &s.id).destroy().await.unwrap();
    let events = common::sb(&m, &s.id).audit_events(None, 1000).unwrap();
    let EventBody::Destroyed(d) = &events.last().unwrap().body else {
        panic!("no destroyed record")
    };
    let a = d.artifacts.as_ref().expect("artifacts were asked for");
    assert_eq!(a.paths, ["/tmp/out"]);
    assert!(a.files.is_empty() && a.truncated, "{a:?}");
    match &events[0].body {
        EventBody::Created(c) => assert_eq!(c.spec["artifacts"], serde_json::json!(["/tmp/out"])),
        other => panic!("not created: {other:?}"),
    }
    assert!(matches!(
        common::sb(&m, &s.id).artifacts(),
        Err(rampart_core::CoreError::NotFound(_))
    ));
    // A sandbox that asked for none has no `artifacts` member at all.
    let plain = m.create(&node(), CreateSandbox::default()).await.unwrap();
    common::sb(&m, &plain.id).destroy().await.unwrap();
    let events = common::sb(&m, &plain.id).audit_events(None, 1000).unwrap();
    let EventBody::Destroyed(d) = &events.last().unwrap().body else {
        panic!("no destroyed record")
    };
    assert!(d.artifacts.is_none());
    // Bad paths are refused before anything is made.
    let e = m
        .create(
            &node(),
            CreateSandbox {
                artifacts: vec!["/tmp/../etc".into()],
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert!(e.to_string().contains("artifacts"), "{e}");
}
