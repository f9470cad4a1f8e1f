//! The file API of the native REST API (`/v1/sandboxes/{id}/files...`).

use serde::{Deserialize, Serialize};

/// Kind of a filesystem entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FileType {
    /// A regular file.
    File,
    /// A directory.
    Directory,
    /// A symbolic link whose target does not resolve (a resolving link reports its target's
    /// type and its `symlink_target`).
    Symlink,
    /// Anything else (device, socket, fifo).
    Other,
}

/// One filesystem entry inside a sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FileEntry {
    /// Base name.
    pub name: String,
    /// Absolute path inside the sandbox.
    pub path: String,
    /// Kind of entry.
    #[serde(rename = "type")]
    pub file_type: FileType,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits (e.g. 420 = 0o644).
    pub mode: u32,
    /// `ls -l` style permissions, e.g. `-rw-r--r--`.
    pub permissions: String,
    /// Owner name as seen inside the sandbox.
    pub owner: String,
    /// Group name as seen inside the sandbox.
    pub group: String,
    /// Modification time, RFC 3339.
    pub modified_at: String,
    /// Target of the symlink, if the entry is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
}

/// Answer of `GET /v1/sandboxes/{id}/files/list`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FileList {
    /// The entries found, down to the requested depth.
    pub entries: Vec<FileEntry>,
}

/// Body of `POST /v1/sandboxes/{id}/files/mkdir`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MakeDir {
    /// Directory to create, with its parents.
    pub path: String,
    /// User to act as (`user` by default, or `root`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

/// Body of `POST /v1/sandboxes/{id}/files/move`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MoveFile {
    /// Existing path.
    pub from: String,
    /// New path.
    pub to: String,
    /// User to act as (`user` by default, or `root`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

/// One change seen by `GET /v1/sandboxes/{id}/files/watch` (one NDJSON line).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FileWatchEvent {
    /// Path relative to the watched directory, e.g. `nested/file.txt`.
    pub name: String,
    /// `create`, `write`, `remove`, `rename` or `chmod`.
    #[serde(rename = "type")]
    pub kind: String,
}

/// Answer of `GET /health`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Health {
    /// `ok` when the daemon serves requests.
    pub status: String,
    /// The daemon's version.
    pub version: String,
}
