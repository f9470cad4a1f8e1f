//! The event stream of one exec: the agent's process events turned into [`ExecEvent`]s,
//! the request's timeout enforced (SIGKILL, then a grace for the agent's end event), output
//! hashed for the record, and the `exit` recorded even when the caller goes away.

use super::{ExecAudit, ExecControl};
use crate::validate;
use futures::stream::{BoxStream, StreamExt};
use prometheus::Histogram;
use rampart_agent::client::{ClientError, ProcessEvent};
use rampart_types::ExecEvent;
use std::pin::Pin;
use std::time::Duration;
use tokio::time::Instant;
use tracing::debug;

/// After core kills a timed-out process, how long it waits for the agent's end event.
const KILL_GRACE: Duration = Duration::from_secs(5);
/// Chunk size for stdin sent to the agent.
const STDIN_CHUNK: usize = 64 * 1024;
/// Sends `data` to a process's stdin in chunks, then closes it if asked.
pub(super) async fn feed(control: ExecControl, data: Vec<u8>, close: bool) {
    let data = bytes::Bytes::from(data);
    let mut off = 0;
    while off < data.len() {
        let end = (off + STDIN_CHUNK).min(data.len());
        let sent = control
            .client
            .send_input(control.pid, data.slice(off..end), control.pty)
            .await;
        if let Err(e) = sent {
            debug!(pid = control.pid, "sending stdin stopped: {e}");
            return;
        }
        off = end;
    }
    if close {
        let closed = if control.pty {
            control
                .client
                .send_input(control.pid, bytes::Bytes::from_static(b"\x04"), true)
                .await
        } else {
            control.client.close_stdin(control.pid).await
        };
        if let Err(e) = closed {
            debug!(pid = control.pid, "closing stdin: {e}");
        }
    }
}

/// State of one exec's event stream.
pub(super) struct ExecState {
    pub(super) inner: BoxStream<'static, Result<ProcessEvent, ClientError>>,
    pub(super) control: ExecControl,
    pub(super) timer: Option<Pin<Box<tokio::time::Sleep>>>,
    pub(super) timeout: Option<Duration>,
    pub(super) killed: bool,
    pub(super) timed_out: bool,
    pub(super) t0: Instant,
    pub(super) done: bool,
    pub(super) hist: Histogram,
    pub(super) audit: Option<ExecAudit>,
}

impl Drop for ExecState {
    /// A stream dropped before the end (the client went away): keep reading the agent's
    /// events in the background so the `exit` is still recorded.
    fn drop(&mut self) {
        if self.done || self.audit.is_none() {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let mut rest = ExecState {
            inner: std::mem::replace(&mut self.inner, futures::stream::empty().boxed()),
            control: self.control.clone(),
            timer: self.timer.take(),
            timeout: self.timeout,
            killed: self.killed,
            timed_out: self.timed_out,
            t0: self.t0,
            done: false,
            hist: self.hist.clone(),
            audit: self.audit.take(),
        };
        self.done = true;
        rt.spawn(async move { while rest.next_event().await.is_some() {} });
    }
}

enum Step {
    Event(Option<Result<ProcessEvent, ClientError>>),
    Timer,
}

impl ExecState {
    fn exit(&mut self, exit_code: Option<i32>, signal: Option<i32>) -> ExecEvent {
        self.done = true;
        let elapsed = self.t0.elapsed();
        self.hist.observe(elapsed.as_secs_f64());
        // The agent's own (backstop) timeout may have killed it first.
        let timed_out =
            self.timed_out || (signal == Some(9) && self.timeout.is_some_and(|t| elapsed >= t));
        if let Some(a) = self.audit.take() {
            a.finish(exit_code, signal, timed_out, elapsed);
        }
        ExecEvent::Exit {
            exit_code,
            signal,
            timed_out,
            duration_ms: elapsed.as_millis() as u64,
        }
    }

    fn lost(&mut self, message: String) -> ExecEvent {
        if self.timed_out {
            return self.exit(None, Some(9));
        }
        self.done = true;
        self.hist.observe(self.t0.elapsed().as_secs_f64());
        if let Some(a) = self.audit.take() {
            a.finish(None, None, false, self.t0.elapsed());
        }
        ExecEvent::Error { message }
    }

    async fn next_event(&mut self) -> Option<ExecEvent> {
        if self.done {
            return None;
        }
        loop {
            let step = {
                let timer = async {
                    match self.timer.as_mut() {
                        Some(t) => t.await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    ev = self.inner.next() => Step::Event(ev),
                    () = timer => Step::Timer,
                }
            };
            match step {
                Step::Timer if !self.killed => {
                    self.killed = true;
                    self.timed_out = true;
                    if let Err(e) = self.control.signal(true).await {
                        debug!(pid = self.control.pid, "killing a timed-out process: {e}");
                    }
                    self.timer = Some(Box::pin(tokio::time::sleep(KILL_GRACE)));
                }
                Step::Timer => {
                    // Killed, but the agent never reported the end.
                    self.timer = None;
                    return Some(self.exit(None, Some(9)));
                }
                Step::Event(None) => {
                    return Some(self.lost(
                        "the process's output ended without an exit status; the sandbox may have stopped"
                            .into(),
                    ));
                }
                Step::Event(Some(Err(e))) => {
                    return Some(self.lost(format!("lost the process: {e}")));
                }
                Step::Event(Some(Ok(ev))) => match ev {
                    ProcessEvent::Start { .. } => {}
                    ProcessEvent::Stdout(b) => {
                        if let Some(a) = self.audit.as_mut() {
                            a.stdout.update(&b);
                        }
                        return Some(ExecEvent::Stdout { data: b.into() });
                    }
                    ProcessEvent::Stderr(b) => {
                        if let Some(a) = self.audit.as_mut() {
                            a.stderr.update(&b);
                        }
                        return Some(ExecEvent::Stderr { data: b.into() });
                    }
                    ProcessEvent::Pty(b) => {
                        if let Some(a) = self.audit.as_mut() {
                            a.stdout.update(&b);
                        }
                        return Some(ExecEvent::Pty { data: b.into() });
                    }
                    ProcessEvent::End {
                        exit_code,
                        exited,
                        status,
                        error,
                    } => {
                        if let Some(err) = error.filter(|e| !e.is_empty()) {
                            debug!(pid = self.control.pid, status, "process ended with: {err}");
                        }
                        let (code, sig) = validate::exit_of(exit_code, exited, &status);
                        return Some(self.exit(code, sig));
                    }
                },
            }
        }
    }
}

pub(super) fn events(st: ExecState) -> BoxStream<'static, ExecEvent> {
    futures::stream::unfold(st, |mut st| async move {
        let ev = st.next_event().await?;
        Some((ev, st))
    })
    .boxed()
}
