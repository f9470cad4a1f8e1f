//! The record of an exec: `exec` before the process starts, `exit` (output digests, CPU
//! time, peak memory) before the caller is told of the end; for the native API and for
//! other roads into a sandbox (the E2B envd proxy streams requests to the agent as they
//! are, and records them here with the same events).

use super::ExecContext;
use crate::audit::{self, Audit};
use crate::isolation::Isolation;
use crate::util::lock;
use crate::validate::ValidExec;
use crate::CoreError;
use rampart_audit::redact::RedactingHasher;
use rampart_audit::EventBody;
use rampart_types::audit::{Exec, Exit};
use rampart_types::{ExecRequest, SandboxId};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::error;

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
    /// The approval it runs under, when the sandbox's policy held it.
    pub approval: Option<String>,
}

/// Where input sent to a recorded exec after its start is hashed (for `exit.streamed_input`).
#[derive(Clone)]
pub struct InputSink(Option<Arc<Mutex<RedactingHasher>>>);

impl std::fmt::Debug for InputSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InputSink").finish_non_exhaustive()
    }
}

impl InputSink {
    /// A sink that counts nothing (an exec recorded with the audit log off; tests).
    #[cfg(test)]
    pub(crate) fn unrecorded() -> InputSink {
        InputSink(None)
    }

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

impl ExecRecorder {
    /// Records the `exec` of `start`, a command about to be started in sandbox `id` by
    /// another road than [`crate::Manager::exec`] (committed before this returns, so before
    /// the command starts). With the record off it records nothing.
    pub(crate) fn start(
        ctx: &ExecContext<'_>,
        id: &SandboxId,
        start: ExecStart,
    ) -> Result<ExecRecorder, CoreError> {
        let t0 = Instant::now();
        if !ctx.audit.enabled() {
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
            caller: None,
            approval: start.approval,
        };
        let audit = record_start(ctx.audit, ctx.iso, id, exec, start.input.as_deref())?;
        Ok(ExecRecorder {
            audit: Some(audit),
            t0,
        })
    }
}

/// Records the `exec` of an API request (before the process starts) and returns what
/// its `exit` needs.
pub(super) fn start_of_request(
    ctx: &ExecContext<'_>,
    id: &SandboxId,
    req: &ExecRequest,
    v: &ValidExec,
    stdin_open: bool,
    approval: Option<String>,
) -> Result<ExecAudit, CoreError> {
    record_start(
        ctx.audit,
        ctx.iso,
        id,
        rampart_types::audit::Exec {
            exec_id: String::new(),
            argv: req.cmd.clone(),
            cwd: req.cwd.clone(),
            user: req.user.clone().unwrap_or_else(|| "user".into()),
            env_names: req.env.keys().cloned().collect(),
            stdin: stdin_open,
            pty: v.pty,
            input: None,
            caller: None,
            approval,
        },
        v.stdin.as_deref(),
    )
}

/// Records `exec` (its `exec_id` and `input` are filled in here, `input` from `stdin`)
/// and returns what its `exit` needs.
pub(crate) fn record_start(
    audit: &Arc<Audit>,
    iso: &Arc<dyn Isolation>,
    id: &SandboxId,
    mut exec: rampart_types::audit::Exec,
    stdin: Option<&[u8]>,
) -> Result<ExecAudit, CoreError> {
    let cap = audit.blob_cap();
    let secrets = audit.secrets(id);
    // What it does on a desktop: typed text leaves the recorded command here.
    let desktop = crate::desktop::read(&exec.argv, exec.cwd.as_deref());
    if let Some(d) = &desktop {
        exec.argv = d.argv.clone();
    }
    let (input, blob, input_hits) = match stdin {
        Some(b) => {
            let (r, blob, hits) = RedactingHasher::record(b, cap, secrets.clone());
            (Some(r), blob, hits)
        }
        None => (None, None, Default::default()),
    };
    exec.input = input;
    exec.caller = Some(crate::principal::current_caller());
    let mut exec_id = String::new();
    audit.append(
        id,
        |seq| {
            exec_id = format!("x{seq}");
            exec.exec_id = exec_id.clone();
            EventBody::Exec(exec)
        },
        blob.into_iter().collect(),
    )?;
    record_redactions(audit, id, &exec_id, "input", &input_hits);
    let screenshots = match desktop {
        Some(d) => {
            for mut a in d.actions {
                a.exec_id = exec_id.clone();
                if let Err(e) = audit.append(id, move |_| EventBody::Desktop(a), Vec::new()) {
                    error!(id = %id, "recording a desktop action: {e}");
                }
            }
            d.screenshots
        }
        None => Vec::new(),
    };
    let meter = audit.meter(id, || iso.counter_files(id));
    let cpu0 = match &meter {
        Some(m) => m.cpu_usec(),
        None => iso.usage(id).ok().map(|u| u.cpu_usec),
    };
    Ok(ExecAudit {
        audit: audit.clone(),
        iso: iso.clone(),
        sandbox: id.clone(),
        exec_id,
        meter,
        cpu0,
        stdout: RedactingHasher::new(cap, secrets.clone()),
        stderr: RedactingHasher::new(cap, secrets.clone()),
        streamed: Arc::new(Mutex::new(RedactingHasher::new(cap, secrets))),
        screenshots,
        started_by: crate::principal::current(),
    })
}

/// What an exec's `exit` record needs.
pub(crate) struct ExecAudit {
    audit: Arc<Audit>,
    iso: Arc<dyn Isolation>,
    sandbox: SandboxId,
    exec_id: String,
    /// The sandbox's counter files (None: read the tier's usage).
    meter: Option<Arc<audit::Meter>>,
    /// The sandbox's CPU time when the exec started, microseconds.
    cpu0: Option<u64>,
    pub(crate) stdout: RedactingHasher,
    pub(crate) stderr: RedactingHasher,
    pub(crate) streamed: Arc<Mutex<RedactingHasher>>,
    /// The files its screenshots are written to (read at a clean exit).
    screenshots: Vec<Result<String, String>>,
    /// Who started it: its `exit` (and screenshots, redactions) are recorded for them,
    /// whoever polls its stream at the end.
    started_by: Option<crate::principal::Principal>,
}

impl ExecAudit {
    /// Records the `exit`. CPU time is the sandbox's (cgroup) CPU time during the exec and
    /// peak memory the sandbox's peak since it started: the cgroup is per sandbox, not per
    /// process.
    pub(crate) fn finish(
        mut self,
        exit_code: Option<i32>,
        signal: Option<i32>,
        timed_out: bool,
        wall: Duration,
    ) {
        match self.started_by.take() {
            Some(p) => crate::principal::sync_scope(p, || {
                self.record_end(exit_code, signal, timed_out, wall)
            }),
            None => self.record_end(exit_code, signal, timed_out, wall),
        }
    }

    fn record_end(
        self,
        exit_code: Option<i32>,
        signal: Option<i32>,
        timed_out: bool,
        wall: Duration,
    ) {
        let (cpu1, peak) = match &self.meter {
            Some(m) => (m.cpu_usec(), m.peak_memory_bytes()),
            None => match self.iso.usage(&self.sandbox) {
                Ok(u) => (
                    Some(u.cpu_usec),
                    Some(u.memory_peak_bytes).filter(|&p| p > 0),
                ),
                Err(_) => (None, None),
            },
        };
        self.record_screenshots(exit_code);
        let cpu_ms = match (self.cpu0, cpu1) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a) / 1000),
            _ => None,
        };
        let (stdout, out_blob, out_hits) = self.stdout.finish();
        let (stderr, err_blob, err_hits) = self.stderr.finish();
        let streamed = std::mem::replace(&mut *lock(&self.streamed), RedactingHasher::new(0, None));
        let (streamed, in_blob, in_hits) = streamed.finish();
        // The edits first: the `exit` that keeps the edited bytes follows them.
        for (field, hits) in [
            ("stdout", &out_hits),
            ("stderr", &err_hits),
            ("streamed_input", &in_hits),
        ] {
            record_redactions(&self.audit, &self.sandbox, &self.exec_id, field, hits);
        }
        let streamed_input = (streamed.size > 0).then_some(streamed);
        let in_blob = if streamed_input.is_some() {
            in_blob
        } else {
            None
        };
        let blobs = [out_blob, err_blob, in_blob]
            .into_iter()
            .flatten()
            .collect();
        let exec_id = self.exec_id;
        if let Err(e) = self.audit.append(
            &self.sandbox,
            |_| {
                EventBody::Exit(Exit {
                    exec_id,
                    exit_code,
                    signal,
                    timed_out,
                    wall_ms: wall.as_millis() as u64,
                    cpu_ms,
                    peak_memory_bytes: peak,
                    stdout,
                    stderr,
                    streamed_input,
                })
            },
            blobs,
        ) {
            error!(id = %self.sandbox, "recording an exit: {e}");
        }
    }
}

impl ExecAudit {
    /// Records the screenshots the command took, each with its image read from the
    /// sandbox's disk (before the `exit`, so before the caller can remove the file).
    fn record_screenshots(&self, exit_code: Option<i32>) {
        for shot in &self.screenshots {
            let mut a = crate::desktop::action("screenshot");
            a.exec_id = self.exec_id.clone();
            let blob = match (shot, exit_code) {
                (Err(why), _) => {
                    a.missing = Some(why.clone());
                    None
                }
                (Ok(_), c) if c != Some(0) => {
                    a.missing = Some(match c {
                        Some(c) => format!("the command exited {c}"),
                        None => "the command did not exit".to_owned(),
                    });
                    None
                }
                (Ok(path), _) => match self.iso.disks().and_then(|d| d.upper_root(&self.sandbox)) {
                    Ok(root) => {
                        crate::desktop::capture(std::os::fd::AsFd::as_fd(&root), path, &mut a)
                    }
                    Err(e) => {
                        a.missing = Some(format!("the sandbox's disk: {e}"));
                        None
                    }
                },
            };
            if let Err(e) = self.audit.append(
                &self.sandbox,
                move |_| EventBody::Desktop(a),
                blob.into_iter().collect(),
            ) {
                error!(id = %self.sandbox, "recording a screenshot: {e}");
            }
        }
    }
}

/// Records a `redacted` event for `field` of exec `exec_id` when values were replaced there.
fn record_redactions(
    audit: &Audit,
    id: &SandboxId,
    exec_id: &str,
    field: &str,
    hits: &std::collections::BTreeMap<String, u64>,
) {
    if hits.is_empty() {
        return;
    }
    let body = EventBody::Redacted(rampart_types::audit::Redacted {
        exec_id: exec_id.to_owned(),
        field: field.to_owned(),
        names: hits.keys().cloned().collect(),
        count: hits.values().sum(),
    });
    if let Err(e) = audit.append(id, move |_| body, Vec::new()) {
        error!(id = %id, "recording a redaction: {e}");
    }
}
