//! The agent's process service, driven through the client and raw HTTP.

mod common;

use bytes::Bytes;
use common::*;
use futures::StreamExt as _;
use rampart_agent::client::{ClientError, ProcessEvent, StartOptions};
use std::time::Duration;

#[tokio::test]
async fn health_info_and_version_header() {
    let a = Agent::start().await;
    let info = a.client.info().await.expect("info");
    assert_eq!(info.protocol, rampart_agent::proto::PROTOCOL_VERSION);
    assert_eq!(info.version, env!("CARGO_PKG_VERSION"));
    let r = raw(&a.sock(), "GET", "/health", &[], vec![]).await;
    assert_eq!(r.status, 204);
    assert!(r.body.is_empty());
    assert_eq!(
        r.headers
            .get("x-rampart-agent-version")
            .map(|v| v.as_bytes()),
        Some(env!("CARGO_PKG_VERSION").as_bytes())
    );
}

#[tokio::test]
async fn exec_streams_output_and_exit_code() {
    let a = Agent::start().await;
    let o = run(&a.client, sh("echo hello; echo oops >&2; exit 3")).await;
    assert!(o.pid > 0);
    assert_eq!(o.stdout, b"hello\n");
    assert_eq!(o.stderr, b"oops\n");
    assert_eq!(exit_of(&o), (3, true, "exit status 3".to_string()));
    assert!(o.error.is_none());

    let o = run(&a.client, sh("true")).await;
    assert_eq!(exit_of(&o), (0, true, "exit status 0".to_string()));
}

#[tokio::test]
async fn env_cwd_user_basics_and_no_rampart_vars() {
    let a = Agent::start().await;
    let mut opts =
        sh("echo \"$FOO|$HOME|$USER|$LOGNAME\"; pwd; umask; env | grep -c '^RAMPART_' || true");
    opts.envs.insert("FOO".into(), "bar baz".into());
    opts.cwd = Some("/tmp".into());
    let o = run(&a.client, opts).await;
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines,
        vec!["bar baz|/root|root|root", "/tmp", "0022", "0"],
        "{out}"
    );
    // Default cwd is the user's home.
    let o = run(&a.client, sh("pwd")).await;
    assert_eq!(o.stdout, b"/root\n");
}

#[tokio::test]
async fn user_switching_and_unknown_user() {
    let a = Agent::start().await;
    let mut opts = sh("id -u");
    opts.user = Some("no-such-user-xyz".into());
    match a.client.start(opts).await {
        Err(ClientError::Rpc { code, .. }) => assert_eq!(code, "unauthenticated"),
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("unknown user accepted"),
    }
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let Some(nobody) = passwd.lines().find(|l| l.starts_with("nobody:")) else {
        eprintln!("skip: no 'nobody' user on this host");
        return;
    };
    let uid = nobody.split(':').nth(2).unwrap_or_default().to_string();
    let mut opts = sh("id -u; umask");
    opts.user = Some("nobody".into());
    opts.cwd = Some("/".into());
    let o = run(&a.client, opts).await;
    assert_eq!(String::from_utf8_lossy(&o.stdout), format!("{uid}\n0022\n"));
}

#[tokio::test]
async fn stdin_then_close() {
    let a = Agent::start().await;
    let mut opts = sh("cat");
    opts.stdin = true;
    let mut s = a.client.start(opts).await.expect("start");
    let Some(Ok(ProcessEvent::Start { pid })) = s.next().await else {
        panic!("no start")
    };
    a.client
        .send_input(pid, Bytes::from_static(b"abc\n"), false)
        .await
        .expect("input");
    match s.next().await {
        Some(Ok(ProcessEvent::Stdout(b))) => assert_eq!(&b[..], b"abc\n"),
        other => panic!("unexpected {other:?}"),
    }
    a.client.close_stdin(pid).await.expect("close");
    let o = collect(s).await;
    assert_eq!(exit_of(&o), (0, true, "exit status 0".to_string()));
    // The process is gone: input now fails with not_found.
    match a
        .client
        .send_input(pid, Bytes::from_static(b"x"), false)
        .await
    {
        Err(ClientError::Rpc { code, .. }) => assert_eq!(code, "not_found"),
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test]
async fn stdin_disabled_reads_eof() {
    let a = Agent::start().await;
    let o = run(&a.client, sh("cat; echo done")).await; // stdin: false => /dev/null
    assert_eq!(o.stdout, b"done\n");
}

async fn read_pty_until(
    s: &mut futures::stream::BoxStream<'static, Result<ProcessEvent, ClientError>>,
    buf: &mut Vec<u8>,
    needle: &str,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !String::from_utf8_lossy(buf).contains(needle) {
        match tokio::time::timeout_at(deadline, s.next()).await {
            Ok(Some(Ok(ProcessEvent::Pty(b)))) => buf.extend_from_slice(&b),
            Ok(Some(Ok(ProcessEvent::Stdout(_) | ProcessEvent::Stderr(_)))) => {
                panic!("pty output as pipe data")
            }
            Ok(other) => panic!(
                "unexpected {other:?} while waiting for {needle:?}; got {:?}",
                String::from_utf8_lossy(buf)
            ),
            Err(_) => panic!(
                "timeout waiting for {needle:?}; got {:?}",
                String::from_utf8_lossy(buf)
            ),
        }
    }
}

#[tokio::test]
async fn pty_output_input_and_resize() {
    let a = Agent::start().await;
    let mut opts =
        sh("stty size; read line; echo \"got:$line\"; stty size; tty >/dev/null && echo is-a-tty");
    opts.pty = Some((80, 24));
    let mut s = a.client.start(opts).await.expect("start");
    let Some(Ok(ProcessEvent::Start { pid })) = s.next().await else {
        panic!("no start")
    };
    let mut buf = Vec::new();
    read_pty_until(&mut s, &mut buf, "24 80").await;
    a.client.resize(pid, 100, 30).await.expect("resize");
    a.client
        .send_input(pid, Bytes::from_static(b"hi\n"), true)
        .await
        .expect("input");
    read_pty_until(&mut s, &mut buf, "30 100").await;
    let o = collect(s).await;
    buf.extend_from_slice(&o.pty);
    let text = String::from_utf8_lossy(&buf);
    assert!(text.contains("got:hi"), "{text}");
    assert!(text.contains("is-a-tty"), "{text}");
    assert_eq!(exit_of(&o).0, 0);
}

#[tokio::test]
async fn kill_and_term_signals() {
    let a = Agent::start().await;
    let mut s = a.client.start(sh("sleep 100")).await.expect("start");
    let Some(Ok(ProcessEvent::Start { pid })) = s.next().await else {
        panic!("no start")
    };
    a.client.signal(pid, true).await.expect("kill");
    let o = collect(s).await;
    // `sh -c "sleep 100"` may exec sleep directly or fork it; the group is killed either way.
    assert_eq!(exit_of(&o), (-1, false, "signal: killed".to_string()));

    let mut s = a.client.start(sh("exec sleep 100")).await.expect("start");
    let Some(Ok(ProcessEvent::Start { pid })) = s.next().await else {
        panic!("no start")
    };
    a.client.signal(pid, false).await.expect("term");
    let o = collect(s).await;
    assert_eq!(exit_of(&o), (-1, false, "signal: terminated".to_string()));

    match a.client.signal(999_999, true).await {
        Err(ClientError::Rpc { code, .. }) => assert_eq!(code, "not_found"),
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test]
async fn connect_reattaches_after_client_drop() {
    let a = Agent::start().await;
    let mut opts = sh("cat");
    opts.stdin = true;
    let mut s = a.client.start(opts).await.expect("start");
    let Some(Ok(ProcessEvent::Start { pid })) = s.next().await else {
        panic!("no start")
    };
    drop(s); // the client goes away; the process must live on
    let mut c = a.client.connect(pid).await.expect("connect");
    assert!(matches!(c.next().await, Some(Ok(ProcessEvent::Start { pid: p })) if p == pid));
    a.client
        .send_input(pid, Bytes::from_static(b"again\n"), false)
        .await
        .expect("input");
    match c.next().await {
        Some(Ok(ProcessEvent::Stdout(b))) => assert_eq!(&b[..], b"again\n"),
        other => panic!("unexpected {other:?}"),
    }
    a.client.close_stdin(pid).await.expect("close");
    let o = collect(c).await;
    assert_eq!(exit_of(&o).0, 0);
    match a.client.connect(pid).await {
        Err(ClientError::Rpc { code, .. }) => assert_eq!(code, "not_found"),
        other => panic!("unexpected {:?}", other.map(|_| ())),
    }
}

#[tokio::test]
async fn list_shows_tags_and_config() {
    let a = Agent::start().await;
    let mut opts = sh("sleep 100");
    opts.tag = Some("bg-1".into());
    let mut s = a.client.start(opts).await.expect("start");
    let Some(Ok(ProcessEvent::Start { pid })) = s.next().await else {
        panic!("no start")
    };
    let list = a.client.list().await.expect("list");
    let p = list.iter().find(|p| p.pid == pid).expect("listed");
    assert_eq!(p.tag.as_deref(), Some("bg-1"));
    assert_eq!(p.config.as_ref().map(|c| c.cmd.as_str()), Some("/bin/sh"));
    // Connect by tag over raw HTTP.
    let body = envelope(0, br#"{"process":{"tag":"bg-1"}}"#);
    a.client.signal(pid, true).await.expect("kill");
    let _ = collect(s).await;
    let r = raw(
        &a.sock(),
        "POST",
        "/process.Process/Connect",
        &[("content-type", "application/connect+json")],
        body,
    )
    .await;
    let env = split_envelopes(&r.body);
    assert_eq!(env.len(), 1);
    assert_eq!(env[0].0, 2);
    assert!(env[0].1.contains("not_found"), "{}", env[0].1);
    let list = a.client.list().await.expect("list");
    assert!(list.iter().all(|p| p.pid != pid));
}

#[tokio::test]
async fn timeout_kills_and_ends_with_deadline_exceeded() {
    let a = Agent::start().await;
    let mut opts = sh("echo started; sleep 100");
    opts.timeout = Some(Duration::from_millis(300));
    let o = run(&a.client, opts).await;
    assert_eq!(o.stdout, b"started\n");
    assert_eq!(exit_of(&o), (-1, false, "signal: killed".to_string()));
    match o.error {
        Some(ClientError::Rpc { code, .. }) => assert_eq!(code, "deadline_exceeded"),
        other => panic!("expected deadline_exceeded, got {other:?}"),
    }
}

#[tokio::test]
async fn large_output_is_intact() {
    let a = Agent::start().await;
    let o = run(&a.client, sh("seq 1 800000; seq 1 1000 >&2")).await;
    let expected: String = (1..=800_000).map(|i| format!("{i}\n")).collect();
    assert_eq!(o.stdout.len(), expected.len());
    assert!(o.stdout == expected.as_bytes());
    assert_eq!(
        o.stderr.len(),
        (1..=1000)
            .map(|i: i32| i.to_string().len() + 1)
            .sum::<usize>()
    );
    assert_eq!(exit_of(&o).0, 0);
}

#[tokio::test]
async fn start_errors() {
    let a = Agent::start().await;
    let opts = StartOptions {
        cmd: "/no/such/binary".into(),
        ..Default::default()
    };
    match a.client.start(opts).await {
        Err(ClientError::Rpc { code, .. }) => assert_eq!(code, "invalid_argument"),
        other => panic!("unexpected {:?}", other.map(|_| ())),
    }
    let mut opts = sh("true");
    opts.cwd = Some("/no/such/dir".into());
    assert!(a.client.start(opts).await.is_err());
}

#[tokio::test]
async fn orphans_are_reaped() {
    let a = Agent::start().await;
    // The shell leaves a background child behind; the agent (subreaper) must reap it.
    let o = run(&a.client, sh("sleep 0.2 >/dev/null 2>&1 & echo $!")).await;
    let orphan: i32 = String::from_utf8_lossy(&o.stdout)
        .trim()
        .parse()
        .expect("pid");
    let stat = format!("/proc/{orphan}/stat");
    wait_for(
        || match std::fs::read_to_string(&stat) {
            Err(_) => true,
            // Not a zombie under the agent: gone, or someone else's reused pid.
            Ok(s) => !s.contains(" Z ") && !s.contains(&format!(" {} ", a.pid())),
        },
        "orphan reaped",
    )
    .await;
}

#[tokio::test]
async fn wire_format_of_start_stream_and_keepalive() {
    let a = Agent::start().await;
    let body = envelope(
        0,
        br#"{"process":{"cmd":"/bin/sh","args":["-c","sleep 1.2; echo hi"]},"stdin":false}"#,
    );
    let r = raw(
        &a.sock(),
        "POST",
        "/process.Process/Start",
        &[
            ("content-type", "application/connect+json"),
            ("keepalive-ping-interval", "1"),
        ],
        body,
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.headers.get("content-type").map(|v| v.as_bytes()),
        Some(&b"application/connect+json"[..])
    );
    let env = split_envelopes(&r.body);
    assert!(
        env[0].1.starts_with(r#"{"event":{"start":{"pid":"#),
        "{env:?}"
    );
    assert!(
        env.iter().any(|e| e.1 == r#"{"event":{"keepalive":{}}}"#),
        "{env:?}"
    );
    assert!(
        env.iter()
            .any(|e| e.1 == r#"{"event":{"data":{"stdout":"aGkK"}}}"#),
        "{env:?}"
    );
    let n = env.len();
    assert_eq!(
        env[n - 2].1,
        r#"{"event":{"end":{"exited":true,"status":"exit status 0"}}}"#
    );
    assert_eq!(env[n - 1], (2, "{}".to_string()));
}

#[tokio::test]
async fn stream_input_client_streaming() {
    let a = Agent::start().await;
    let mut opts = sh("cat");
    opts.stdin = true;
    let mut s = a.client.start(opts).await.expect("start");
    let Some(Ok(ProcessEvent::Start { pid })) = s.next().await else {
        panic!("no start")
    };
    let mut body = envelope(
        0,
        format!(r#"{{"start":{{"process":{{"pid":{pid}}}}}}}"#).as_bytes(),
    );
    body.extend(envelope(0, br#"{"data":{"input":{"stdin":"eHl6Cg=="}}}"#));
    body.extend(envelope(0, br#"{"keepalive":{}}"#));
    let r = raw(
        &a.sock(),
        "POST",
        "/process.Process/StreamInput",
        &[("content-type", "application/connect+json")],
        body,
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(
        split_envelopes(&r.body),
        vec![(0, "{}".to_string()), (2, "{}".to_string())]
    );
    match s.next().await {
        Some(Ok(ProcessEvent::Stdout(b))) => assert_eq!(&b[..], b"xyz\n"),
        other => panic!("unexpected {other:?}"),
    }
    a.client.signal(pid, true).await.expect("kill");
    let _ = collect(s).await;
}

#[tokio::test]
async fn malformed_requests_get_errors_not_crashes() {
    let a = Agent::start().await;
    let sock = a.sock();
    let r = unary(&sock, "process.Process/SendSignal", "{not json").await;
    assert_eq!(r.status, 400);
    assert!(String::from_utf8_lossy(&r.body).contains("\"code\":\"invalid_argument\""));
    let r = unary(
        &sock,
        "process.Process/SendSignal",
        r#"{"process":{"pid":1},"signal":"SIGNAL_BOGUS"}"#,
    )
    .await;
    assert_eq!(r.status, 400);
    let r = unary(&sock, "process.Process/Nope", "{}").await;
    assert_eq!(r.status, 404);
    assert!(String::from_utf8_lossy(&r.body).contains("unimplemented"));
    let r = raw(
        &sock,
        "POST",
        "/process.Process/List",
        &[("content-type", "text/plain")],
        b"{}".to_vec(),
    )
    .await;
    assert_eq!(r.status, 415);
    // Truncated envelope, compressed flag, end-stream only, bad JSON inside.
    for body in [
        vec![0u8, 0, 0, 0, 50, b'{'],
        envelope(1, b"{}"),
        envelope(2, b"{}"),
        envelope(0, b"[1,2"),
    ] {
        let r = raw(
            &sock,
            "POST",
            "/process.Process/Start",
            &[("content-type", "application/connect+json")],
            body,
        )
        .await;
        assert_eq!(r.status, 200);
        let env = split_envelopes(&r.body);
        assert_eq!(env.len(), 1);
        assert_eq!(env[0].0, 2);
        assert!(
            env[0].1.contains("\"code\":\"invalid_argument\""),
            "{}",
            env[0].1
        );
    }
    // Empty unary body is the empty message.
    let r = unary(&sock, "process.Process/List", "").await;
    assert_eq!((r.status, &r.body[..]), (200, &b"{}"[..]));
    // Still alive.
    a.client.health().await.expect("healthy after garbage");
}

#[tokio::test]
async fn unreachable_when_no_agent() {
    let dir = tempfile::tempdir().expect("tmp");
    let c = rampart_agent::client::AgentClient::new(dir.path().join("none.sock"));
    assert!(matches!(c.health().await, Err(ClientError::Unreachable(_))));
}

#[tokio::test]
async fn sigterm_stops_children_and_agent() {
    let mut a = Agent::start().await;
    let mut s = a.client.start(sh("exec sleep 100")).await.expect("start");
    let Some(Ok(ProcessEvent::Start { pid })) = s.next().await else {
        panic!("no start")
    };
    assert!(alive(pid));
    // SAFETY: signalling the agent child this test started, by its pid.
    unsafe { libc::kill(a.pid() as i32, libc::SIGTERM) };
    let st = a.wait_exit().await;
    assert!(st.success(), "{st:?}");
    wait_for(|| !alive(pid), "child gone").await;
}

#[tokio::test]
async fn inherited_listening_socket_fd() {
    use std::os::fd::AsRawFd as _;
    use std::os::unix::process::CommandExt as _;
    let dir = tempfile::tempdir().expect("tmp");
    let sock = dir.path().join("inherited.sock");
    let l = std::os::unix::net::UnixListener::bind(&sock).expect("bind");
    let fd = l.as_raw_fd();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_rampart-agent"));
    cmd.env("RAMPART_AGENT_FD", fd.to_string())
        .env("RAMPART_OTHER", "x")
        .args(["--default-user", "root"]);
    let clear_cloexec = move || {
        // SAFETY: fcntl on an fd number in the forked child; async-signal-safe.
        if unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    };
    // SAFETY: the closure only calls fcntl (async-signal-safe).
    unsafe { cmd.pre_exec(clear_cloexec) };
    let mut child = cmd.spawn().expect("spawn");
    drop(l);
    let client = rampart_agent::client::AgentClient::new(sock);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while client.health().await.is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "agent on inherited fd not healthy"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let o = run(
        &client,
        sh("env | grep -c '^RAMPART_' || true; ls -l /proc/self/fd | grep -c socket || true"),
    )
    .await;
    assert_eq!(String::from_utf8_lossy(&o.stdout), "0\n0\n");
    let _ = child.kill();
    let _ = child.wait();
}

#[tokio::test]
async fn children_get_default_sigpipe() {
    let a = Agent::start().await;
    let o = run(&a.client, sh("yes | head -c 4")).await;
    assert_eq!(o.stdout, b"y\ny\n");
    // `yes` must die of SIGPIPE, not complain about EPIPE on stderr.
    assert!(
        !String::from_utf8_lossy(&o.stderr).contains("Broken pipe"),
        "{:?}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[tokio::test]
async fn huge_and_short_connect_deadlines() {
    let a = Agent::start().await;
    let body = envelope(
        0,
        br#"{"process":{"cmd":"/bin/sh","args":["-c","echo ok"]},"stdin":false}"#,
    );
    let r = raw(
        &a.sock(),
        "POST",
        "/process.Process/Start",
        &[
            ("content-type", "application/connect+json"),
            ("connect-timeout-ms", "18446744073709551615"),
        ],
        body,
    )
    .await;
    let env = split_envelopes(&r.body);
    assert_eq!(env.last(), Some(&(2, "{}".to_string())), "{env:?}");
    // Connect with a short deadline to a process that keeps running: the stream ends with
    // deadline_exceeded and the process lives on.
    let mut s = a.client.start(sh("exec sleep 100")).await.expect("start");
    let Some(Ok(ProcessEvent::Start { pid })) = s.next().await else {
        panic!("no start")
    };
    let body = envelope(0, format!(r#"{{"process":{{"pid":{pid}}}}}"#).as_bytes());
    let r = raw(
        &a.sock(),
        "POST",
        "/process.Process/Connect",
        &[
            ("content-type", "application/connect+json"),
            ("connect-timeout-ms", "100"),
        ],
        body,
    )
    .await;
    let env = split_envelopes(&r.body);
    assert!(env[0].1.starts_with(r#"{"event":{"start""#));
    assert_eq!(env.last().map(|e| e.0), Some(2));
    assert!(
        env.last()
            .is_some_and(|e| e.1.contains("deadline_exceeded")),
        "{env:?}"
    );
    assert!(alive(pid));
    a.client.signal(pid, true).await.expect("kill");
    let _ = collect(s).await;
}

#[tokio::test]
async fn spawned_children_start_clean_and_search_path_like_execvp() {
    let a = Agent::start().await;
    // No signal blocked; the leader of its own process group.
    let o = run(
        &a.client,
        sh("grep '^SigBlk:' /proc/self/status; cut -d' ' -f5 /proc/$$/stat; echo $$"),
    )
    .await;
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert_eq!(
        lines[0].split_whitespace().nth(1),
        Some("0000000000000000"),
        "{out}"
    );
    assert_eq!(lines[1], lines[2], "not a group leader: {out}");
    // Not SIGPIPE among the ignored signals (the agent ignores it), nothing blocked.
    let o = run(
        &a.client,
        StartOptions {
            cmd: "grep".into(),
            args: vec![
                "-E".into(),
                "^Sig(Blk|Ign):".into(),
                "/proc/self/status".into(),
            ],
            ..Default::default()
        },
    )
    .await;
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let masks: Vec<u64> = out
        .lines()
        .filter_map(|l| u64::from_str_radix(l.split_whitespace().nth(1)?, 16).ok())
        .collect();
    assert_eq!(masks.len(), 2, "{out}");
    assert_eq!(masks[0], 0, "blocked: {out}");
    assert_eq!(
        masks[1] & (1 << (libc::SIGPIPE - 1)),
        0,
        "SIGPIPE ignored: {out}"
    );

    // A script without a `#!` line runs through /bin/sh, found along PATH.
    let dir = a.scratch();
    let bin = format!("{dir}/bin");
    std::fs::create_dir_all(&bin).expect("mkdir");
    let script = format!("{bin}/hello-script");
    std::fs::write(&script, "echo \"script $1\"\n").expect("write");
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let mut opts = StartOptions {
        cmd: "hello-script".into(),
        args: vec!["arg".into()],
        ..Default::default()
    };
    opts.envs
        .insert("PATH".into(), format!("/nonexistent:{bin}:/usr/bin:/bin"));
    let o = run(&a.client, opts.clone()).await;
    assert_eq!(o.stdout, b"script arg\n");

    // Not executable: permission denied, reported as a start error.
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    match a.client.start(opts).await {
        Err(ClientError::Rpc { code, message }) => {
            assert_eq!(code, "invalid_argument");
            assert!(message.contains("Permission denied"), "{message}");
        }
        other => panic!("unexpected {:?}", other.map(|_| ())),
    }
}
