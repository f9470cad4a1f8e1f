//! What core's integration tests share: running a command and collecting what it did.

use futures::StreamExt as _;
use rampart_core::{Exec, Manager};
use rampart_types::{ExecEvent, ExecRequest, SandboxId, SandboxInfo, SandboxState};
use std::time::Duration;

/// The node's principal, as the daemon acts for its administrator.
pub fn node() -> rampart_core::Principal {
    rampart_core::Principal::node("test")
}

/// Sandbox `id` as the node sees it.
pub fn sb<'m>(m: &'m Manager, id: &SandboxId) -> rampart_core::Sandbox<'m> {
    m.sandbox(&node(), id).expect("the node sees every sandbox")
}

/// What an exec did.
#[derive(Debug, Default)]
pub struct Ran {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub pty: Vec<u8>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub error: Option<String>,
}

/// Reads an exec's events to the end; exactly one final event.
pub async fn collect(mut exec: Exec) -> Ran {
    let mut r = Ran::default();
    let mut ended = 0;
    while let Some(ev) = exec.events.next().await {
        match ev {
            ExecEvent::Stdout { data } => r.stdout.extend(data.as_bytes()),
            ExecEvent::Stderr { data } => r.stderr.extend(data.as_bytes()),
            ExecEvent::Pty { data } => r.pty.extend(data.as_bytes()),
            ExecEvent::Start { .. } => panic!("start is consumed into Exec::pid"),
            ExecEvent::Exit {
                exit_code,
                signal,
                timed_out,
                ..
            } => {
                ended += 1;
                r.exit_code = exit_code;
                r.signal = signal;
                r.timed_out = timed_out;
            }
            ExecEvent::Error { message } => {
                ended += 1;
                r.error = Some(message);
            }
            ExecEvent::PendingApproval { .. } | ExecEvent::Denied { .. } => {
                panic!("core's exec stream carries no approval events: {ev:?}")
            }
        }
    }
    assert_eq!(ended, 1, "exactly one final event: {r:?}");
    r
}

/// A request of `args`.
pub fn cmd(args: &[&str]) -> ExecRequest {
    ExecRequest {
        cmd: args.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

/// Runs `req` (waited) in `id`.
pub async fn run(m: &Manager, id: &SandboxId, req: ExecRequest) -> Ran {
    collect(sb(m, id).exec(req, false).await.expect("exec")).await
}

/// Waits until the sandbox is in `want`: re-checked at each audit event (every state change
/// the manager makes is recorded in the transaction of its event), bounded by `within`.
pub async fn wait_state(
    m: &Manager,
    id: &SandboxId,
    want: SandboxState,
    within: Duration,
) -> SandboxInfo {
    let mut events = m.audit_subscribe();
    let deadline = tokio::time::Instant::now() + within;
    loop {
        events.borrow_and_update();
        let info = sb(m, id).info().unwrap();
        if info.state == want {
            return info;
        }
        match tokio::time::timeout_at(deadline, events.changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => panic!("the audit log's channel closed"),
            Err(_) => panic!("sandbox {id} stayed {:?}, wanted {want:?}", info.state),
        }
    }
}
