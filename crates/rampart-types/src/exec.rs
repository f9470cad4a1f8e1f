//! Running a command in a sandbox through the native API.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Default cap on captured stdout and on stderr, each, for a waited exec (1 MiB).
pub const DEFAULT_OUTPUT_CAP: u64 = 1 << 20;

/// Body of `POST /v1/sandboxes/{id}/exec`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    /// The program and its arguments; `cmd[0]` is looked up in `PATH`.
    pub cmd: Vec<String>,
    /// Extra environment variables for this process.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory; the user's home when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// User to run as (`user` by default, or `root`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Bytes given on stdin (UTF-8 text), then stdin is closed. Absent: stdin is closed at start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
    /// Same as `stdin` but base64, for binary input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin_base64: Option<String>,
    /// Run under a pseudo-terminal of this size (`[cols, rows]`); output arrives as `pty`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tty: Option<[u16; 2]>,
    /// Seconds before the process is killed (SIGKILL) and the exec reports `timed_out`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_secs: Option<u64>,
    /// Stream events as NDJSON instead of waiting for the result.
    #[serde(default)]
    pub stream: bool,
    /// Cap in bytes on captured stdout and on stderr (each) when waiting; default 1 MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_bytes: Option<u64>,
}

/// The result of a waited exec.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ExecResult {
    /// Exit code; `None` if the process was killed by a signal.
    pub exit_code: Option<i32>,
    /// The signal that ended it, if any (e.g. 9).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Captured stdout, UTF-8 (invalid sequences replaced).
    pub stdout: String,
    /// Captured stderr, UTF-8 (invalid sequences replaced).
    pub stderr: String,
    /// Whether stdout was cut at the output cap.
    pub stdout_truncated: bool,
    /// Whether stderr was cut at the output cap.
    pub stderr_truncated: bool,
    /// Whether the exec's timeout killed it.
    pub timed_out: bool,
    /// Wall time in milliseconds.
    pub duration_ms: u64,
}

/// Output bytes of a process. In core they are bytes; on the wire (JSON) they are standard
/// base64, encoded and decoded only where JSON is written or read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutputBytes(pub bytes::Bytes);

impl OutputBytes {
    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl From<bytes::Bytes> for OutputBytes {
    fn from(b: bytes::Bytes) -> Self {
        OutputBytes(b)
    }
}

impl From<&[u8]> for OutputBytes {
    fn from(b: &[u8]) -> Self {
        OutputBytes(bytes::Bytes::copy_from_slice(b))
    }
}

impl Serialize for OutputBytes {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use base64::Engine as _;
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(&self.0))
    }
}

impl<'de> Deserialize<'de> for OutputBytes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use base64::Engine as _;
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(text.as_bytes())
            .map(|v| OutputBytes(v.into()))
            .map_err(|e| serde::de::Error::custom(format!("output data is not base64: {e}")))
    }
}

/// One event of a streamed exec (one NDJSON line).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ExecEvent {
    /// The process started with this pid (inside the sandbox).
    Start {
        /// Pid inside the sandbox.
        pid: u32,
    },
    /// Bytes on stdout (base64).
    Stdout {
        /// The bytes (base64 in JSON).
        #[schema(value_type = String, format = Byte)]
        data: OutputBytes,
    },
    /// Bytes on stderr (base64).
    Stderr {
        /// The bytes (base64 in JSON).
        #[schema(value_type = String, format = Byte)]
        data: OutputBytes,
    },
    /// Bytes from the pseudo-terminal (base64).
    Pty {
        /// The bytes (base64 in JSON).
        #[schema(value_type = String, format = Byte)]
        data: OutputBytes,
    },
    /// The process ended.
    Exit {
        /// Exit code, if it exited.
        exit_code: Option<i32>,
        /// The signal that ended it, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signal: Option<i32>,
        /// Whether the exec's timeout killed it.
        timed_out: bool,
        /// Wall time in milliseconds.
        duration_ms: u64,
    },
    /// The exec failed (the process could not start, or the sandbox went away).
    Error {
        /// What happened.
        message: String,
    },
    /// The sandbox's approval policy holds the request until a person decides (sent first;
    /// the process has not started).
    PendingApproval {
        /// The approval (`POST /v1/approvals/{id}/approve` or `/deny`).
        approval_id: String,
        /// The command line held.
        request: String,
    },
    /// The held request was denied, or nobody decided in time: it never started (last).
    Denied {
        /// The approval.
        approval_id: String,
        /// Who decided and why.
        reason: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_is_base64_on_the_wire_and_bytes_inside() {
        let ev = ExecEvent::Stdout {
            data: (&b"hi\xff\n"[..]).into(),
        };
        let line = serde_json::to_string(&ev).unwrap();
        assert_eq!(line, r#"{"type":"stdout","data":"aGn/Cg=="}"#);
        let back: ExecEvent = serde_json::from_str(&line).unwrap();
        assert_eq!(back, ev);
        let bad = serde_json::from_str::<ExecEvent>(r#"{"type":"stderr","data":"%%"}"#)
            .unwrap_err()
            .to_string();
        assert!(bad.contains("not base64"), "{bad}");
    }
}

/// A background process (`POST /v1/sandboxes/{id}/processes`): started with no client
/// attached, recorded like any exec; attach to its output (`.../processes/{pid}/events`)
/// any time, send it input and signals by pid.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ProcessInfo {
    /// Its pid inside the sandbox.
    pub pid: u32,
    /// Its command line.
    pub cmd: Vec<String>,
    /// When it started, RFC 3339.
    pub started_at: String,
    /// Whether it still runs.
    pub running: bool,
    /// Its exit code, once it exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The signal that ended it, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Whether its timeout killed it.
    #[serde(default)]
    pub timed_out: bool,
    /// Why it failed, if it did (the sandbox went away, its output ended without a status).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// When it ended, RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<String>,
}
