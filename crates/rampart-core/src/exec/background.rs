//! Background processes: an exec started without a client attached. The daemon consumes its
//! events itself (so it is recorded like any exec: `exec` before it starts, `exit` at its
//! end, output digests), keeps the last [`REPLAY_BYTES`] of its output and its end, and
//! fans them out to whoever attaches, now or later. A client that detaches leaves the process
//! running; stdin, resize and signals go to it by pid. A sandbox's processes go with its end
//! (they live in its registry entry); a finished one is kept for [`RETAIN_FINISHED`] so its
//! output and exit can still be read.

use super::{Exec, ExecControl};
use crate::util::lock;
use futures::StreamExt as _;
use rampart_types::{ExecEvent, ProcessInfo};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::broadcast;

/// Output kept for a late attach, per process (older output is dropped, and the attach is
/// told so). With [`MAX_PER_SANDBOX`], what the daemon holds for one sandbox is bounded
/// (4 MiB).
pub const REPLAY_BYTES: usize = 256 << 10;
/// Processes (running or finished) one sandbox keeps; a new one past it is refused while
/// all of them run, else the oldest finished goes.
pub const MAX_PER_SANDBOX: usize = 16;
/// How long a finished process's output and exit stay readable.
pub const RETAIN_FINISHED: Duration = Duration::from_secs(600);
/// Events a slow attached client may fall behind before it is cut off (it can attach again).
const FANOUT: usize = 1024;

#[derive(Debug, Default)]
struct Buffer {
    replay: VecDeque<ExecEvent>,
    bytes: usize,
    dropped_bytes: u64,
    end: Option<ExecEvent>,
    ended_at_ms: Option<i64>,
}

/// One background process.
#[derive(Debug)]
pub struct Process {
    pid: u32,
    cmd: Vec<String>,
    started_at_ms: i64,
    control: ExecControl,
    buf: Mutex<Buffer>,
    tx: broadcast::Sender<ExecEvent>,
}

/// An attach: what was kept, then what comes.
#[derive(Debug)]
pub struct Attach {
    /// Output bytes dropped from the start before the replay (0: the replay is whole).
    pub dropped_bytes: u64,
    /// The kept events, oldest first (the end last, if it ended).
    pub replay: Vec<ExecEvent>,
    /// Events from now on; none when it has ended (the replay holds the end).
    pub live: Option<broadcast::Receiver<ExecEvent>>,
}

fn output_len(ev: &ExecEvent) -> Option<usize> {
    match ev {
        ExecEvent::Stdout { data } | ExecEvent::Stderr { data } | ExecEvent::Pty { data } => {
            Some(data.as_bytes().len())
        }
        _ => None,
    }
}

impl Process {
    /// Takes over `exec` (started from `cmd`): a task consumes its events until its end.
    /// `on_end` runs once it ended (the registry's clean-up after [`RETAIN_FINISHED`]).
    pub(crate) fn spawn(
        exec: Exec,
        cmd: Vec<String>,
        on_end: impl FnOnce(u32) + Send + 'static,
    ) -> Arc<Process> {
        let (tx, _) = broadcast::channel(FANOUT);
        let p = Arc::new(Process {
            pid: exec.pid,
            cmd,
            started_at_ms: rampart_store::now_ms(),
            control: exec.control,
            buf: Mutex::new(Buffer::default()),
            tx,
        });
        let mut events = exec.events;
        let me = p.clone();
        tokio::spawn(async move {
            while let Some(ev) = events.next().await {
                let last = matches!(
                    ev,
                    ExecEvent::Exit { .. } | ExecEvent::Error { .. } | ExecEvent::Denied { .. }
                );
                me.push(ev);
                if last {
                    break;
                }
            }
            if lock(&me.buf).end.is_none() {
                me.push(ExecEvent::Error {
                    message: "the process's output ended without an exit status".into(),
                });
            }
            on_end(me.pid);
        });
        p
    }

    fn push(&self, ev: ExecEvent) {
        let mut b = lock(&self.buf);
        if let Some(n) = output_len(&ev) {
            b.bytes += n;
            while b.bytes > REPLAY_BYTES {
                let Some(old) = b.replay.pop_front() else {
                    break;
                };
                let n = output_len(&old).unwrap_or(0);
                b.bytes -= n;
                b.dropped_bytes += n as u64;
            }
        } else if matches!(ev, ExecEvent::Exit { .. } | ExecEvent::Error { .. }) {
            b.end = Some(ev.clone());
            b.ended_at_ms = Some(rampart_store::now_ms());
        }
        b.replay.push_back(ev.clone());
        // Sent under the lock: an attach sees each event exactly once (replay or live).
        let _ = self.tx.send(ev);
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Control of it (stdin, resize, signals).
    pub fn control(&self) -> &ExecControl {
        &self.control
    }

    /// Attaches: the kept output (and end), then the live events.
    pub fn attach(&self) -> Attach {
        let b = lock(&self.buf);
        Attach {
            dropped_bytes: b.dropped_bytes,
            replay: b.replay.iter().cloned().collect(),
            live: b.end.is_none().then(|| self.tx.subscribe()),
        }
    }

    /// What it is now.
    pub fn status(&self) -> ProcessInfo {
        let b = lock(&self.buf);
        let mut info = ProcessInfo {
            pid: self.pid,
            cmd: self.cmd.clone(),
            started_at: crate::util::rfc3339(self.started_at_ms),
            running: b.end.is_none(),
            exit_code: None,
            signal: None,
            timed_out: false,
            error: None,
            ended_at: b.ended_at_ms.map(crate::util::rfc3339),
        };
        match &b.end {
            Some(ExecEvent::Exit {
                exit_code,
                signal,
                timed_out,
                ..
            }) => {
                info.exit_code = *exit_code;
                info.signal = *signal;
                info.timed_out = *timed_out;
            }
            Some(ExecEvent::Error { message }) => info.error = Some(message.clone()),
            _ => {}
        }
        info
    }

    /// Whether it has ended.
    pub fn ended(&self) -> bool {
        lock(&self.buf).end.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rampart_types::OutputBytes;

    fn out(n: usize) -> ExecEvent {
        ExecEvent::Stdout {
            data: OutputBytes(bytes::Bytes::from(vec![b'x'; n])),
        }
    }

    fn process() -> Process {
        let (tx, _) = broadcast::channel(FANOUT);
        Process {
            pid: 7,
            cmd: vec!["true".into()],
            started_at_ms: 0,
            control: ExecControl {
                client: rampart_agent::client::AgentClient::new("/nonexistent".into()),
                pid: 7,
                pty: false,
                streamed: None,
            },
            buf: Mutex::new(Buffer::default()),
            tx,
        }
    }

    #[test]
    fn replay_is_bounded_and_says_what_it_dropped() {
        let p = process();
        for _ in 0..5 {
            p.push(out(REPLAY_BYTES / 2));
        }
        let a = p.attach();
        assert_eq!(a.replay.len(), 2);
        assert_eq!(a.dropped_bytes, 3 * (REPLAY_BYTES / 2) as u64);
        assert!(a.live.is_some());
    }

    #[test]
    fn an_attach_sees_each_event_once_and_the_end_last() {
        let p = process();
        p.push(out(3));
        let mut early = p.attach();
        p.push(out(4));
        p.push(ExecEvent::Exit {
            exit_code: Some(0),
            signal: None,
            timed_out: false,
            duration_ms: 1,
        });
        let live = early.live.as_mut().unwrap();
        assert_eq!(early.replay.len(), 1);
        assert_eq!(output_len(&live.try_recv().unwrap()), Some(4));
        assert!(matches!(live.try_recv().unwrap(), ExecEvent::Exit { .. }));
        let late = p.attach();
        assert_eq!(late.replay.len(), 3);
        assert!(late.live.is_none(), "ended: nothing more will come");
        let st = p.status();
        assert!(p.ended() && !st.running && st.ended_at.is_some());
        assert_eq!(st.exit_code, Some(0));
    }
}
