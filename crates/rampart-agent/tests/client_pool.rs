//! The client's connection pool: reuse, half-read answers, agents that went away.

mod common;

use common::*;
use futures::StreamExt as _;
use rampart_agent::client::{AgentClient, ProcessEvent};
use std::time::{Duration, Instant};

/// Unix sockets the agent (pid) holds open (its listener included).
fn sockets_of(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| {
                    std::fs::read_link(e.path())
                        .map(|l| l.to_string_lossy().starts_with("socket:"))
                        .unwrap_or(false)
                })
                .count()
        })
        .unwrap_or(0)
}

#[tokio::test]
async fn sequential_calls_reuse_one_connection() {
    let a = Agent::start().await;
    for _ in 0..3 {
        let o = run(&a.client, sh("true")).await;
        assert_eq!(exit_of(&o).0, 0);
    }
    let before = sockets_of(a.pid());
    for _ in 0..20 {
        let o = run(&a.client, sh("echo hi")).await;
        assert_eq!(o.stdout, b"hi\n");
        a.client.health().await.expect("health");
        a.client.list().await.expect("list");
    }
    assert_eq!(sockets_of(a.pid()), before, "calls opened new connections");
    // Callers that stop reading at the end event (as the daemon does) free it as well.
    for _ in 0..10 {
        let mut s = a.client.start(sh("echo x")).await.expect("start");
        loop {
            match s.next().await {
                Some(Ok(ProcessEvent::End { exit_code, .. })) => {
                    assert_eq!(exit_code, 0);
                    break;
                }
                Some(Ok(_)) => {}
                other => panic!("unexpected {other:?}"),
            }
        }
    }
    assert_eq!(
        sockets_of(a.pid()),
        before,
        "stopping at the end event leaked it"
    );
    // Clones share the pool.
    let c2 = a.client.clone();
    c2.health().await.expect("health");
    assert_eq!(sockets_of(a.pid()), before);
}

#[tokio::test]
async fn half_read_streams_do_not_poison_the_pool() {
    let a = Agent::start().await;
    // Read only the start event, then drop the stream: that connection must not be reused.
    let mut s = a
        .client
        .start(sh("echo one; sleep 0.2; echo two"))
        .await
        .expect("start");
    assert!(s.next().await.is_some());
    drop(s);
    for _ in 0..5 {
        let o = run(&a.client, sh("echo ok")).await;
        assert_eq!(o.stdout, b"ok\n");
        assert_eq!(exit_of(&o).0, 0);
    }
    // Concurrent calls each get a working connection.
    let runs = (0..4).map(|i| {
        let c = a.client.clone();
        async move { run(&c, sh(&format!("echo {i}"))).await }
    });
    let outs = futures::future::join_all(runs).await;
    for (i, o) in outs.iter().enumerate() {
        assert_eq!(o.stdout, format!("{i}\n").as_bytes());
    }
}

#[tokio::test]
async fn a_restarted_agent_is_reached_through_new_connections() {
    let mut a = Agent::start().await;
    let client = a.client.clone();
    let o = run(&client, sh("true")).await;
    assert_eq!(exit_of(&o).0, 0);
    let sock = a.sock();
    // SAFETY: kill(2) on the pid of the agent this test started.
    unsafe { libc::kill(a.pid() as i32, libc::SIGKILL) };
    a.wait_exit().await;
    // Its pooled connections are dead now; a new agent on the same path must be reached.
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_rampart-agent"))
        .arg("--listen")
        .arg(&sock)
        .args(["--default-user", "root"])
        .spawn()
        .expect("spawn agent");
    let fresh = AgentClient::new(sock);
    let deadline = Instant::now() + Duration::from_secs(10);
    while fresh.health().await.is_err() {
        assert!(Instant::now() < deadline, "second agent not healthy");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let o = run(&client, sh("echo again")).await;
    assert_eq!(o.stdout, b"again\n");
    client
        .health()
        .await
        .expect("health through the old client");
    let _ = child.kill();
    let _ = child.wait();
}
