//! The records the fleet keeps in etcd.

use rampart_types::tenant::Quotas;
use serde::{Deserialize, Serialize};

/// What a node has free, as it last said.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Capacity {
    /// `MemAvailable` of the node's host, bytes.
    pub memory_available_bytes: u64,
    /// The host's memory, bytes.
    pub memory_total_bytes: u64,
    /// The host's CPUs.
    pub cpus: u32,
    /// Free bytes in the node's data directory's file system.
    pub disk_free_bytes: u64,
    /// Sandboxes alive on it (paused ones included).
    pub sandboxes: u64,
    /// The most it runs at once.
    pub max_sandboxes: u64,
}

/// A node of the fleet, under its lease: gone from etcd within the lease's TTL of its last
/// renewal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeRecord {
    /// Its name (unique in the fleet).
    pub name: String,
    /// The URL gateways reach its API at.
    pub url: String,
    /// The isolation tiers it can run (`namespace`, `gvisor`).
    pub tiers: Vec<String>,
    /// What it has free.
    pub capacity: Capacity,
    /// The templates it holds (built or built in).
    pub templates: Vec<String>,
    /// Its audit key (`ed25519:<hex>`): what its sandboxes' records are signed with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit_key: Option<String>,
    /// Whether new sandboxes may be placed on it (`false` while it drains).
    #[serde(default = "yes")]
    pub schedulable: bool,
    /// Its version.
    pub version: String,
    /// When it joined, unix ms.
    pub started_ms: i64,
    /// When it last wrote this record, unix ms.
    pub updated_ms: i64,
}

fn yes() -> bool {
    true
}

/// Where a sandbox runs: the catalog's entry, keyed by the sandbox's id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CatalogEntry {
    /// The node's name.
    pub node: String,
    /// The tenant that owns it; none: the fleet's administrator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// When the entry was written, unix ms.
    pub recorded_ms: i64,
}

/// A tenant of the fleet and its quotas (`max_sandboxes` counts every node).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TenantDef {
    /// Its name.
    pub name: String,
    /// Its quotas.
    #[serde(default)]
    pub quotas: Quotas,
    /// When it was made, unix ms.
    pub created_at_ms: i64,
}
