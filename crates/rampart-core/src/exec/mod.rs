//! Exec: a process started in a sandbox through its agent, the stream of its events (with
//! the request's timeout: kill, grace, lost agent) and its audit record (`exec` committed
//! before the process starts, `exit` before the caller hears of the end).
//!
//! Other roads into a sandbox (the E2B envd proxy) record through [`ExecRecorder`] with the
//! same events, and keep the execs they record in the sandbox's table of [`inputs`] (where
//! input sent to them later is counted).

pub mod background;
pub(crate) mod inputs;
mod record;
mod stream;

pub use inputs::{ExecRef, ExecTicket};

pub(crate) use record::ExecAudit;
pub use record::{ExecRecorder, ExecStart, InputSink};

use crate::audit::Audit;
use crate::isolation::Isolation;
use crate::validate::ValidExec;
use crate::CoreError;
use futures::StreamExt as _;
use prometheus::Histogram;
use rampart_agent::client::{AgentClient, ClientError, ProcessEvent};
use rampart_types::{ExecEvent, ExecRequest, SandboxId};
use std::sync::Arc;
use tokio::time::Instant;

/// What an exec needs of the rest of core: the record, the tier (CPU and memory counters
/// for `exit`) and the latency histogram.
pub(crate) struct ExecContext<'a> {
    pub(crate) audit: &'a Arc<Audit>,
    pub(crate) iso: &'a Arc<dyn Isolation>,
    pub(crate) hist: &'a Histogram,
}

/// A started process.
pub struct Exec {
    /// Its pid inside the sandbox.
    pub pid: u32,
    /// Output and the final event.
    pub events: futures::stream::BoxStream<'static, ExecEvent>,
    /// Control of the running process.
    pub control: ExecControl,
}

impl std::fmt::Debug for Exec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exec")
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

/// Control of a started process: input, resize, kill.
#[derive(Debug, Clone)]
pub struct ExecControl {
    client: AgentClient,
    pid: u32,
    pty: bool,
    /// Input sent after start, hashed for the `exit` record (None when not audited).
    streamed: Option<Arc<std::sync::Mutex<rampart_audit::redact::RedactingHasher>>>,
}

impl ExecControl {
    /// Sends bytes to its stdin (or PTY).
    pub async fn send_stdin(&self, data: bytes::Bytes) -> Result<(), CoreError> {
        if let Some(h) = &self.streamed {
            h.lock().unwrap_or_else(|p| p.into_inner()).update(&data);
        }
        Ok(self.client.send_input(self.pid, data, self.pty).await?)
    }
    /// Closes its stdin (for a PTY: sends EOT, ^D).
    pub async fn close_stdin(&self) -> Result<(), CoreError> {
        if self.pty {
            return self.send_stdin(bytes::Bytes::from_static(b"\x04")).await;
        }
        Ok(self.client.close_stdin(self.pid).await?)
    }
    /// Resizes its PTY.
    pub async fn resize(&self, cols: u16, rows: u16) -> Result<(), CoreError> {
        Ok(self.client.resize(self.pid, cols, rows).await?)
    }
    /// Sends SIGKILL (`kill`) or SIGTERM.
    pub async fn signal(&self, kill: bool) -> Result<(), CoreError> {
        Ok(self.client.signal(self.pid, kill).await?)
    }
}

/// Starts the validated request `v` (of `req`) on `client`, the agent of sandbox `id`:
/// records `exec` first (when the record is on), then the process; a start that fails is
/// recorded as lost.
pub(crate) async fn start(
    ctx: &ExecContext<'_>,
    client: AgentClient,
    id: &SandboxId,
    req: &ExecRequest,
    v: ValidExec,
    keep_stdin_open: bool,
    approval: Option<String>,
) -> Result<Exec, CoreError> {
    let t0 = Instant::now();
    let feed_stdin = v.opts.stdin;
    let mut audit = if ctx.audit.enabled() {
        Some(record::start_of_request(
            ctx, id, req, &v, feed_stdin, approval,
        )?)
    } else {
        None
    };
    let started = async {
        let mut stream = client.start(v.opts).await?;
        match stream.next().await {
            Some(Ok(ProcessEvent::Start { pid })) => Ok((stream, pid)),
            Some(Ok(other)) => Err(CoreError::Agent(ClientError::Protocol(format!(
                "expected the process's start event, got {other:?}"
            )))),
            Some(Err(e)) => Err(e.into()),
            None => Err(CoreError::Agent(ClientError::Protocol(
                "the agent ended the stream before the process started".into(),
            ))),
        }
    }
    .await;
    let (stream, pid) = match started {
        Ok(s) => s,
        Err(e) => {
            if let Some(a) = audit.take() {
                a.finish(None, None, false, t0.elapsed());
            }
            return Err(e);
        }
    };
    let control = ExecControl {
        client,
        pid,
        pty: v.pty,
        streamed: audit.as_ref().map(|a| a.streamed.clone()),
    };
    if feed_stdin && (v.stdin.is_some() || !keep_stdin_open) {
        tokio::spawn(stream::feed(
            control.clone(),
            v.stdin.unwrap_or_default(),
            !keep_stdin_open,
        ));
    }
    let events = stream::events(stream::ExecState {
        inner: stream,
        control: control.clone(),
        timer: v
            .timeout
            .map(|t| Box::pin(tokio::time::sleep_until(t0 + t))),
        timeout: v.timeout,
        killed: false,
        timed_out: false,
        t0,
        done: false,
        hist: ctx.hist.clone(),
        audit,
    });
    Ok(Exec {
        pid,
        events,
        control,
    })
}
