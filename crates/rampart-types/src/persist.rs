//! Snapshots, fork and volumes: the wire types of persistence. See `docs/persistence.md`.

use crate::SandboxInfo;
use serde::{Deserialize, Serialize};

/// Body of `POST /v1/sandboxes/{id}/snapshots`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSnapshot {
    /// Snapshot name (letters, digits, `.`, `_`, `-`); generated when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Whether memory is captured. This tier keeps the filesystem only: `true` is refused.
    #[serde(default)]
    pub memory: bool,
    /// Destroy the sandbox once the snapshot is taken ("pause to disk").
    #[serde(default)]
    pub stop: bool,
}

/// A snapshot as the API returns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SnapshotInfo {
    /// Its name.
    pub name: String,
    /// The sandbox it was taken from.
    pub source: String,
    /// The template it sits on.
    pub template: String,
    /// Whether it kept the sandbox's processes and memory (a gVisor sandbox's snapshot with
    /// `memory: true`): a sandbox made from it continues them. False: its disk only.
    pub memory: bool,
    /// Bytes of its writable layer (allocated).
    pub size_bytes: u64,
    /// RFC 3339 time it was taken.
    pub created_at: String,
}

/// Body of `POST /v1/sandboxes/{id}/fork`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkSandbox {
    /// How many sandboxes to make (1 when absent).
    #[serde(default = "one")]
    pub count: u32,
    /// Seconds until each fork expires; the source's timeout when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_secs: Option<u64>,
}

fn one() -> u32 {
    1
}

/// Answer of `POST /v1/sandboxes/{id}/fork`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ForkResult {
    /// The new sandboxes, each with a fresh identity.
    pub sandboxes: Vec<SandboxInfo>,
}

/// A volume mounted into a sandbox at create.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VolumeMount {
    /// The volume's name.
    pub name: String,
    /// Absolute path inside the sandbox.
    pub path: String,
    /// Mount it read-only.
    #[serde(default)]
    pub read_only: bool,
}

/// Body of `POST /v1/volumes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateVolume {
    /// Name (letters, digits, `.`, `_`, `-`).
    pub name: String,
    /// Size quota in MiB.
    pub size_mib: u64,
}

/// A volume as the API returns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct VolumeInfo {
    /// Its name.
    pub name: String,
    /// Size quota in MiB.
    pub size_mib: u64,
    /// Bytes used.
    pub used_bytes: u64,
    /// RFC 3339 time it was made.
    pub created_at: String,
}
