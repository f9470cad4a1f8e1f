//! Messages of the interactive exec WebSocket (`GET /v1/sandboxes/{id}/exec/ws`).
//!
//! The client's first message is an [`ExecRequest`](crate::ExecRequest) (JSON text); then it
//! sends [`ExecInput`] messages, and the server sends [`ExecEvent`](crate::ExecEvent)s
//! (`start` first, `exit` or `error` last).

use serde::{Deserialize, Serialize};

/// A client message after the exec request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ExecInput {
    /// Bytes for the process's stdin (or its PTY).
    Stdin {
        /// Base64 of the bytes.
        data: String,
    },
    /// Close stdin (for a PTY: send ^D).
    CloseStdin,
    /// Resize the PTY.
    Resize {
        /// Columns.
        cols: u16,
        /// Rows.
        rows: u16,
    },
    /// Signal the process: SIGKILL when `kill`, else SIGTERM.
    Signal {
        /// SIGKILL instead of SIGTERM.
        #[serde(default)]
        kill: bool,
    },
}
