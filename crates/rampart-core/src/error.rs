//! The manager's errors. Each variant maps to one HTTP status in the server; failures of
//! the daemon's own machinery (store, tier, file system, tasks) keep their source.

use crate::isolation::IsolationError;
use rampart_agent::client::ClientError;
use rampart_store::journal::JournalError;
use rampart_store::StoreError;
use rampart_types::LimitError;

/// Errors of the manager. Each maps to one HTTP status in the server.
#[derive(Debug, thiserror::Error)]
pub enum CoreError {
    /// 404: no such sandbox.
    #[error("sandbox {0} not found")]
    NotFound(String),
    /// 404: the sandbox has no background process with this pid (or no longer: a finished
    /// one is kept a while).
    #[error("sandbox {id} has no background process {pid}")]
    NoProcess {
        /// The sandbox.
        id: String,
        /// The pid asked for.
        pid: u32,
    },
    /// 409: the sandbox runs as many background processes as it may.
    #[error("sandbox {id} runs {max} background processes, the most it may; end one first")]
    TooManyProcesses {
        /// The sandbox.
        id: String,
        /// The most.
        max: usize,
    },
    /// 403: the sandbox's approval policy held the request and it was denied (or nobody
    /// decided in time); it never started.
    #[error("denied: {reason} (approval {approval})")]
    Denied {
        /// The approval.
        approval: String,
        /// Why: the decider's reason, or the timeout.
        reason: String,
    },
    /// 404: no template of this name the caller may see (another tenant's template answers
    /// exactly so).
    #[error("template \"{0}\" not found")]
    NoTemplate(String),
    /// 404: no webhook with this id (or not the caller's).
    #[error("no webhook {0}")]
    NoWebhook(String),
    /// 404: no pending approval with this id.
    #[error("no pending approval {0}")]
    NoApproval(String),
    /// 409: the operation conflicts with what is (an approval already decided).
    #[error("{0}")]
    Conflict(String),
    /// 403: the caller may not do this.
    #[error("{0}")]
    Forbidden(String),
    /// 400: bad input; `field` names the offending field.
    #[error("{field}: {message}")]
    BadRequest {
        /// The field.
        field: String,
        /// Why.
        message: String,
    },
    /// 409: the sandbox is not in a state that allows this.
    #[error("sandbox {id} is {state}, not running")]
    WrongState {
        /// The sandbox.
        id: String,
        /// Its state.
        state: String,
    },
    /// 422: a limit above the daemon's maximum (or below the minimum).
    #[error(transparent)]
    Limit(#[from] LimitError),
    /// 503: the host is out of capacity (sandbox count, uid ranges).
    #[error("out of capacity: {0}")]
    Capacity(String),
    /// 413: input too large.
    #[error("too large: {0}")]
    TooLarge(String),
    /// 502: a desktop command (xdotool, scrot, the browser) failed in the sandbox.
    #[error("desktop: {0}")]
    Desktop(String),
    /// The agent answered an error (mapped by its Connect code) or is unreachable (502).
    #[error(transparent)]
    Agent(#[from] ClientError),
    /// The host lacks a kernel feature the isolation tier needs (the message names it).
    #[error("this host cannot run sandboxes: {0}")]
    Unsupported(String),
    /// 500: the state store failed.
    #[error("state store: {0}")]
    Store(#[from] StoreError),
    /// 500: the isolation tier failed at `what` (a host that lacks a feature is
    /// [`CoreError::Unsupported`] instead).
    #[error("{what}: {source}")]
    Isolation {
        /// What the tier was doing.
        what: String,
        /// How it failed.
        #[source]
        source: IsolationError,
    },
    /// 500: a file system operation of the daemon's failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done (names the path).
        what: String,
        /// How it failed.
        #[source]
        source: std::io::Error,
    },
    /// 500: a blocking task of the daemon's panicked or was cancelled.
    #[error("{what}: task failed: {source}")]
    Task {
        /// What the task was doing.
        what: String,
        /// How it ended.
        #[source]
        source: tokio::task::JoinError,
    },
    /// 500: the audit journal failed.
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// 500: a part of the daemon's machinery failed at `what` (the egress proxy, the
    /// template store, an encoding); its cause is kept.
    #[error("{what}: {source}")]
    Failed {
        /// What was being done.
        what: String,
        /// How it failed.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// 500: an invariant of the daemon's own does not hold (a bug); the message says which.
    #[error("internal error: {0}")]
    Internal(String),
}

impl CoreError {
    /// A failure of the tier at `what`; a host that lacks a feature stays `Unsupported`.
    pub(crate) fn isolation(what: impl Into<String>, source: IsolationError) -> CoreError {
        match source {
            IsolationError::Unsupported(m) => CoreError::Unsupported(m),
            IsolationError::NotOnTier(message) => CoreError::BadRequest {
                field: "isolation".into(),
                message,
            },
            IsolationError::Refused { field, message } => CoreError::BadRequest {
                field: field.into(),
                message,
            },
            source => CoreError::Isolation {
                what: what.into(),
                source,
            },
        }
    }
    /// A failed file system operation (`what` names the path).
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> CoreError {
        let what = what.into();
        move |source| CoreError::Io { what, source }
    }
    /// A failure of the daemon's machinery at `what`, keeping its cause.
    pub(crate) fn failed<E>(what: impl Into<String>) -> impl FnOnce(E) -> CoreError
    where
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let what = what.into();
        move |e| CoreError::Failed {
            what,
            source: e.into(),
        }
    }
    /// A blocking task that did not finish.
    pub(crate) fn task(
        what: impl Into<String>,
    ) -> impl FnOnce(tokio::task::JoinError) -> CoreError {
        let what = what.into();
        move |source| CoreError::Task { what, source }
    }
}
