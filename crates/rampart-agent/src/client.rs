//! Host-side client of the agent, over its Unix socket.
//!
//! CONTRACT (used by rampart-core; keep these signatures).

use bytes::Bytes;
use futures::stream::BoxStream;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// Errors talking to an agent.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Could not reach the agent's socket (the sandbox is gone or not started).
    #[error("agent unreachable: {0}")]
    Unreachable(String),
    /// The agent answered with a Connect/HTTP error.
    #[error("{code}: {message}")]
    Rpc {
        /// Connect code string: `not_found`, `invalid_argument`, `already_exists`,
        /// `unauthenticated`, `resource_exhausted`, `deadline_exceeded`, `internal`, ...
        code: String,
        /// The agent's message.
        message: String,
    },
    /// The agent's answer could not be decoded.
    #[error("bad answer from agent: {0}")]
    Protocol(String),
}

/// How to start a process.
#[derive(Debug, Clone, Default)]
pub struct StartOptions {
    /// Program (looked up in PATH).
    pub cmd: String,
    /// Arguments after the program.
    pub args: Vec<String>,
    /// Extra environment.
    pub envs: BTreeMap<String, String>,
    /// Working directory (user's home when None).
    pub cwd: Option<String>,
    /// User name (`user` when None).
    pub user: Option<String>,
    /// Keep stdin open for [`AgentClient::send_stdin`].
    pub stdin: bool,
    /// Run under a PTY of (cols, rows).
    pub pty: Option<(u16, u16)>,
    /// Tag to find the process again by.
    pub tag: Option<String>,
    /// Process lifetime: the agent kills it when this elapses (sent as connect-timeout-ms).
    pub timeout: Option<Duration>,
}

/// One event of a process's output stream.
#[derive(Debug, Clone, PartialEq)]
pub enum ProcessEvent {
    /// Started, with its pid inside the sandbox.
    Start {
        /// Pid.
        pid: u32,
    },
    /// Stdout bytes.
    Stdout(Bytes),
    /// Stderr bytes.
    Stderr(Bytes),
    /// PTY bytes.
    Pty(Bytes),
    /// Ended.
    End {
        /// Exit code (0 when killed by a signal; see `status`).
        exit_code: i32,
        /// Whether it exited normally.
        exited: bool,
        /// e.g. "exit status 1", "signal: killed".
        status: String,
        /// Error text if the agent reported one.
        error: Option<String>,
    },
}

/// Kind of a filesystem entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// Regular file.
    File,
    /// Directory.
    Directory,
    /// Symbolic link (only when its target does not resolve).
    Symlink,
    /// Anything else.
    Other,
}

/// A filesystem entry as the agent reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct EntryInfo {
    /// Base name.
    pub name: String,
    /// Kind (of the target, for a symlink that resolves).
    pub kind: FileKind,
    /// Absolute path inside the sandbox.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    /// `ls -l` style permissions.
    pub permissions: String,
    /// Owner name.
    pub owner: String,
    /// Group name.
    pub group: String,
    /// Modification time, RFC 3339.
    pub modified_time: String,
    /// Symlink target if the entry is a symlink.
    pub symlink_target: Option<String>,
}

/// A filesystem change seen by a watch.
#[derive(Debug, Clone, PartialEq)]
pub struct FsEvent {
    /// Path relative to the watched directory, e.g. `nested/file.txt`.
    pub name: String,
    /// `create`, `write`, `remove`, `rename` or `chmod`.
    pub kind: String,
}

/// Client of one agent.
#[derive(Debug, Clone)]
pub struct AgentClient {
    socket: PathBuf,
}

impl AgentClient {
    /// A client for the agent listening on `socket`. Does not connect yet.
    pub fn new(socket: PathBuf) -> Self {
        AgentClient { socket }
    }
    /// The socket path.
    pub fn socket(&self) -> &std::path::Path {
        &self.socket
    }
    /// `GET /health`; Ok when the agent answers 2xx.
    pub async fn health(&self) -> Result<(), ClientError> {
        unimplemented!()
    }
    /// `process.Process/Start`: the returned stream yields `Start` first, then output, then `End`.
    pub async fn start(
        &self,
        opts: StartOptions,
    ) -> Result<BoxStream<'static, Result<ProcessEvent, ClientError>>, ClientError> {
        let _ = opts;
        unimplemented!()
    }
    /// `process.Process/SendInput` (stdin, or PTY input when the process has a PTY).
    pub async fn send_input(&self, pid: u32, data: Bytes, pty: bool) -> Result<(), ClientError> {
        let _ = (pid, data, pty);
        unimplemented!()
    }
    /// `process.Process/CloseStdin`.
    pub async fn close_stdin(&self, pid: u32) -> Result<(), ClientError> {
        let _ = pid;
        unimplemented!()
    }
    /// `process.Process/SendSignal` with SIGKILL (`kill = true`) or SIGTERM.
    pub async fn signal(&self, pid: u32, kill: bool) -> Result<(), ClientError> {
        let _ = (pid, kill);
        unimplemented!()
    }
    /// `process.Process/Update`: resize a PTY.
    pub async fn resize(&self, pid: u32, cols: u16, rows: u16) -> Result<(), ClientError> {
        let _ = (pid, cols, rows);
        unimplemented!()
    }
    /// `filesystem.Filesystem/Stat`.
    pub async fn stat(&self, path: &str, user: Option<&str>) -> Result<EntryInfo, ClientError> {
        let _ = (path, user);
        unimplemented!()
    }
    /// `filesystem.Filesystem/ListDir` with a depth (>= 1).
    pub async fn list_dir(
        &self,
        path: &str,
        depth: u32,
        user: Option<&str>,
    ) -> Result<Vec<EntryInfo>, ClientError> {
        let _ = (path, depth, user);
        unimplemented!()
    }
    /// `filesystem.Filesystem/MakeDir` (creates parents; `already_exists` if it exists).
    pub async fn make_dir(&self, path: &str, user: Option<&str>) -> Result<EntryInfo, ClientError> {
        let _ = (path, user);
        unimplemented!()
    }
    /// `filesystem.Filesystem/Move`.
    pub async fn rename(
        &self,
        from: &str,
        to: &str,
        user: Option<&str>,
    ) -> Result<EntryInfo, ClientError> {
        let _ = (from, to, user);
        unimplemented!()
    }
    /// `filesystem.Filesystem/Remove` (recursive; no error if missing).
    pub async fn remove(&self, path: &str, user: Option<&str>) -> Result<(), ClientError> {
        let _ = (path, user);
        unimplemented!()
    }
    /// `GET /files?path=`: the file's bytes as a stream (never buffered whole).
    pub async fn read_file(
        &self,
        path: &str,
        user: Option<&str>,
    ) -> Result<BoxStream<'static, Result<Bytes, ClientError>>, ClientError> {
        let _ = (path, user);
        unimplemented!()
    }
    /// `POST /files?path=` with `application/octet-stream`: writes the stream to the file,
    /// creating parent directories. Returns the written entry's path.
    pub async fn write_file(
        &self,
        path: &str,
        user: Option<&str>,
        body: BoxStream<'static, Result<Bytes, std::io::Error>>,
    ) -> Result<String, ClientError> {
        let _ = (path, user, body);
        unimplemented!()
    }
    /// `filesystem.Filesystem/WatchDir`: a stream of changes under `path` (recursive if asked),
    /// which ends when dropped.
    pub async fn watch(
        &self,
        path: &str,
        recursive: bool,
        user: Option<&str>,
    ) -> Result<BoxStream<'static, Result<FsEvent, ClientError>>, ClientError> {
        let _ = (path, recursive, user);
        unimplemented!()
    }
}
