//! Recording what reaches a sandbox by other roads than [`Manager::exec`] and the file
//! methods: the E2B envd proxy streams requests to the agent as they are, and records them
//! here, with the same events as the native API (`exec`, `exit`, `file`).

use crate::manager::lock;
use crate::manager::ExecAudit;
use crate::{CoreError, Manager};
use rampart_audit::ContentHasher;
use rampart_types::audit::{Exec, FileChange};
use rampart_types::SandboxId;
use std::sync::{Arc, Mutex};
use std::time::Instant;

tokio::task_local! {
    /// Who made the request being served (see [`with_caller`]).
    static CALLER: String;
}

/// Runs `f` on behalf of `caller`: events recorded for requests it makes (`created.caller`)
/// name them. The API server wraps each request in this; see `docs/proof.md` for the
/// spellings (`local from 127.0.0.1:5000`, `e2b-key:<id>:<name> from ...`).
pub async fn with_caller<F: std::future::Future>(caller: String, f: F) -> F::Output {
    CALLER.scope(caller, f).await
}

/// The caller of the request being served: what [`with_caller`] set, else `local` (a call
/// made in the daemon's own process, or by a server that does not say).
pub(crate) fn current_caller() -> String {
    CALLER
        .try_with(|c| c.clone())
        .unwrap_or_else(|_| "local".into())
}

/// A command about to be started in a sandbox, as its caller asked for it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecStart {
    /// Program and arguments.
    pub argv: Vec<String>,
    /// Working directory asked for (None: the user's home).
    pub cwd: Option<String>,
    /// The user it runs as.
    pub user: String,
    /// Names of the environment variables given (never their values).
    pub env_names: Vec<String>,
    /// Whether its stdin is kept open for input.
    pub stdin: bool,
    /// Whether it runs on a PTY.
    pub pty: bool,
    /// Input given with the request, if any.
    pub input: Option<Vec<u8>>,
}

/// Where input sent to a recorded exec after its start is hashed (for `exit.streamed_input`).
#[derive(Clone)]
pub struct InputSink(Option<Arc<Mutex<ContentHasher>>>);

impl std::fmt::Debug for InputSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InputSink").finish_non_exhaustive()
    }
}

impl InputSink {
    /// Counts `data` as sent to the process.
    pub fn update(&self, data: &[u8]) {
        if let Some(h) = &self.0 {
            lock(h).update(data);
        }
    }
}

/// The `exit` half of a recorded exec: output is hashed as it passes, and the `exit` event
/// is written by [`ExecRecorder::finish`] (or, if it is dropped unfinished, as lost: exit
/// code and signal `null`).
pub struct ExecRecorder {
    audit: Option<ExecAudit>,
    t0: Instant,
}

impl std::fmt::Debug for ExecRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecRecorder")
            .field("recording", &self.audit.is_some())
            .finish_non_exhaustive()
    }
}

impl ExecRecorder {
    /// Output on stdout (or the PTY).
    pub fn stdout(&mut self, data: &[u8]) {
        if let Some(a) = self.audit.as_mut() {
            a.stdout.update(data);
        }
    }

    /// Output on stderr.
    pub fn stderr(&mut self, data: &[u8]) {
        if let Some(a) = self.audit.as_mut() {
            a.stderr.update(data);
        }
    }

    /// Where input sent after the start is counted.
    pub fn input_sink(&self) -> InputSink {
        InputSink(self.audit.as_ref().map(|a| a.streamed.clone()))
    }

    /// Records the `exit` (before the caller is told of it).
    pub fn finish(mut self, exit_code: Option<i32>, signal: Option<i32>, timed_out: bool) {
        if let Some(a) = self.audit.take() {
            a.finish(exit_code, signal, timed_out, self.t0.elapsed());
        }
    }
}

impl Drop for ExecRecorder {
    fn drop(&mut self) {
        if let Some(a) = self.audit.take() {
            a.finish(None, None, false, self.t0.elapsed());
        }
    }
}

impl Manager {
    /// Records the `exec` of a command that is about to be started in a running sandbox by
    /// another road than [`Manager::exec`] (committed before this returns, so before the
    /// command starts), and returns its recorder. With the audit log off it records nothing.
    pub fn record_exec_start(
        &self,
        id: &SandboxId,
        start: ExecStart,
    ) -> Result<ExecRecorder, CoreError> {
        let t0 = Instant::now();
        if !self.inner.audit.enabled() {
            return Ok(ExecRecorder { audit: None, t0 });
        }
        let exec = Exec {
            exec_id: String::new(),
            argv: start.argv,
            cwd: start.cwd,
            user: start.user,
            env_names: start.env_names,
            stdin: start.stdin,
            pty: start.pty,
            input: None,
        };
        let audit = self
            .inner
            .record_exec_of(id, exec, start.input.as_deref())?;
        Ok(ExecRecorder {
            audit: Some(audit),
            t0,
        })
    }

    /// Records a file operation made in a sandbox by another road than the file methods.
    pub fn record_file_change(&self, id: &SandboxId, change: FileChange) -> Result<(), CoreError> {
        self.inner.record_file(id, change)
    }
}
