//! Tenants, their quotas and their usage (`/v1/tenants`, `/v1/usage`; see `docs/tenants.md`).

use serde::{Deserialize, Serialize};

/// The most sandboxes (running, or paused) a quota may name.
pub const MAX_SANDBOXES_QUOTA: u64 = 1_000_000;
/// The most vCPUs a quota may name.
pub const MAX_VCPUS_QUOTA: f64 = 65_536.0;
/// The most bytes (memory, disk) a quota may name: 1 PiB.
pub const MAX_BYTES_QUOTA: u64 = 1 << 50;
/// The most creates per minute a quota may name.
pub const MAX_CREATES_PER_MINUTE: u64 = 1_000_000;

/// What a tenant may hold at once, and how fast it may create. A limit left out (or `null`)
/// is no limit.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Quotas {
    /// Sandboxes that are not paused (creating, running, stopping).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_sandboxes: Option<u64>,
    /// Paused sandboxes (counted apart, as E2B does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_paused: Option<u64>,
    /// vCPUs of the sandboxes that are not paused, summed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_vcpus: Option<f64>,
    /// Memory limits of the alive sandboxes (paused ones keep their memory), summed, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_memory_bytes: Option<u64>,
    /// Disk: the alive sandboxes' disk limits, the tenant's snapshots and volumes, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_disk_bytes: Option<u64>,
    /// Sandbox creates (and forks) per minute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creates_per_minute: Option<u64>,
}

/// Why a quota value was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct QuotaError {
    /// The quota's name.
    pub field: &'static str,
    /// Why.
    pub message: String,
}

impl Quotas {
    /// Checks each given value is within what a node can mean (negative values do not parse).
    pub fn check(&self) -> Result<(), QuotaError> {
        let count = |field: &'static str, v: Option<u64>, max: u64| match v {
            Some(n) if n > max => Err(QuotaError {
                field,
                message: format!("{n} is absurd (at most {max})"),
            }),
            _ => Ok(()),
        };
        count("max_sandboxes", self.max_sandboxes, MAX_SANDBOXES_QUOTA)?;
        count("max_paused", self.max_paused, MAX_SANDBOXES_QUOTA)?;
        count("max_memory_bytes", self.max_memory_bytes, MAX_BYTES_QUOTA)?;
        count("max_disk_bytes", self.max_disk_bytes, MAX_BYTES_QUOTA)?;
        count(
            "creates_per_minute",
            self.creates_per_minute,
            MAX_CREATES_PER_MINUTE,
        )?;
        if let Some(v) = self.max_vcpus {
            if !v.is_finite() || v < 0.0 {
                return Err(QuotaError {
                    field: "max_vcpus",
                    message: format!("{v} is not a number of vCPUs (0 or more)"),
                });
            }
            if v > MAX_VCPUS_QUOTA {
                return Err(QuotaError {
                    field: "max_vcpus",
                    message: format!("{v} is absurd (at most {MAX_VCPUS_QUOTA})"),
                });
            }
        }
        Ok(())
    }
}

/// Why a tenant name was refused (names are 1 to 64 of `a-z`, `0-9`, `.`, `_`, `-`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TenantNameError {
    /// Empty, or longer than 64 bytes.
    #[error("tenant name {name:?}: 1 to 64 characters of a-z, 0-9, '.', '_', '-'")]
    Length {
        /// The name as given.
        name: String,
    },
    /// A character outside the allowed set.
    #[error("tenant name {name:?}: {found:?} is not allowed (only a-z, 0-9, '.', '_', '-')")]
    Char {
        /// The name as given.
        name: String,
        /// The first character not allowed.
        found: char,
    },
}

/// The message, for callers that carry it as text (`rampart-core`'s persist checks).
impl From<TenantNameError> for String {
    fn from(e: TenantNameError) -> String {
        e.to_string()
    }
}

/// Checks a tenant name: 1 to 64 of `a-z`, `0-9`, `.`, `_`, `-`.
pub fn check_tenant_name(name: &str) -> Result<(), TenantNameError> {
    if name.is_empty() || name.len() > 64 {
        return Err(TenantNameError::Length { name: name.into() });
    }
    if let Some(found) = name
        .chars()
        .find(|c| !matches!(c, 'a'..='z' | '0'..='9' | '.' | '_' | '-'))
    {
        return Err(TenantNameError::Char {
            name: name.into(),
            found,
        });
    }
    Ok(())
}

/// `POST /v1/tenants`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTenant {
    /// Its name (`[a-z0-9._-]{1,64}`).
    pub name: String,
    /// Its quotas (none: no limit).
    #[serde(default)]
    pub quotas: Quotas,
    /// The approval policy every sandbox of the tenant is held to, at least (none: only
    /// what each sandbox asks for).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approvals: Option<crate::ApprovalPolicy>,
}

/// A tenant, with what it holds now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TenantInfo {
    /// Its name.
    pub name: String,
    /// Its quotas.
    pub quotas: Quotas,
    /// Creation time, RFC 3339.
    pub created_at: String,
    /// Its default approval policy (a floor: a sandbox's own policy adds to it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approvals: Option<crate::ApprovalPolicy>,
    /// What it holds now (counted as its quotas are).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holds: Option<Holdings>,
}

/// What a tenant holds at one moment, counted as its quotas count.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Holdings {
    /// Sandboxes that are not paused.
    pub sandboxes: u64,
    /// Paused sandboxes.
    pub paused: u64,
    /// vCPUs of the sandboxes that are not paused.
    pub vcpus: f64,
    /// Memory limits of the alive sandboxes, bytes.
    pub memory_bytes: u64,
    /// Disk limits of the alive sandboxes plus snapshots, volumes and what it keeps on the
    /// host (`stored_bytes`), bytes.
    pub disk_bytes: u64,
    /// What it keeps on the host besides (its templates' layers, `COPY` uploads, artifacts),
    /// bytes, as last measured; part of `disk_bytes`.
    #[serde(default)]
    pub stored_bytes: u64,
}

/// A quota that a request would pass: which, what is used, what the request adds, the most.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct QuotaRefusal {
    /// The quota (`max_sandboxes`, `max_paused`, `max_vcpus`, `max_memory_bytes`,
    /// `max_disk_bytes`, `creates_per_minute`).
    pub limit: String,
    /// What the tenant holds (or made this minute).
    pub used: f64,
    /// What the request adds.
    pub requested: f64,
    /// The quota.
    pub max: f64,
}

impl std::fmt::Display for QuotaRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "quota {} exceeded: the tenant uses {}, this asks for {} more, the most is {}",
            self.limit, self.used, self.requested, self.max
        )
    }
}

/// The usage of one sandbox within a report's time range.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SandboxUsage {
    /// The sandbox.
    pub id: String,
    /// Its tenant (none: the node's own).
    #[serde(default)]
    pub tenant: Option<String>,
    /// Its template.
    pub template: String,
    /// When it was created, RFC 3339.
    pub started_at: String,
    /// When it ended, RFC 3339; none while it is alive.
    #[serde(default)]
    pub ended_at: Option<String>,
    /// CPU time used, in vCPU-seconds (from its cgroup's CPU usage).
    pub vcpu_seconds: f64,
    /// Its memory limit times the time it was alive within the range, GiB-seconds.
    pub memory_gib_seconds: f64,
    /// The most memory it used, bytes (as its cgroup measured it).
    pub memory_peak_bytes: u64,
    /// Its disk limit times the time it was alive within the range, GiB-seconds.
    pub disk_gib_seconds: f64,
    /// Bytes it sent out through its network (connections that ended).
    pub egress_bytes: u64,
    /// Commands it ran (its record's `exec` events).
    pub exec_count: u64,
    /// Seconds it ran within the range.
    pub running_seconds: f64,
    /// Seconds it was paused within the range.
    pub paused_seconds: f64,
    /// Hash of the record before this one in the report (hex; zeros for the first).
    pub prev: String,
    /// Hash of this record: SHA-256 over `prev` and this record's canonical JSON without
    /// `prev` and `hash` (hex).
    pub hash: String,
}

/// The sums of a report's records.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct UsageTotals {
    /// Sandboxes in the report.
    pub sandboxes: u64,
    /// vCPU-seconds.
    pub vcpu_seconds: f64,
    /// Memory GiB-seconds.
    pub memory_gib_seconds: f64,
    /// The highest peak of any one sandbox, bytes.
    pub memory_peak_bytes: u64,
    /// Disk GiB-seconds.
    pub disk_gib_seconds: f64,
    /// Egress bytes.
    pub egress_bytes: u64,
    /// Commands.
    pub exec_count: u64,
    /// Seconds running.
    pub running_seconds: f64,
    /// Seconds paused.
    pub paused_seconds: f64,
}

/// `GET /v1/usage`: a tenant's (or the node's) usage over a time range, hash-chained and
/// signed by the node's key, so that whoever holds it can verify it offline
/// (`rampart usage verify`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct UsageReport {
    /// Format version (1).
    pub version: u32,
    /// The tenant it covers; none: every sandbox of the node (an admin's report).
    #[serde(default)]
    pub tenant: Option<String>,
    /// Start of the range, RFC 3339.
    pub from: String,
    /// End of the range, RFC 3339.
    pub to: String,
    /// When the node made it, RFC 3339.
    pub generated_at: String,
    /// The sums of `sandboxes`.
    pub totals: UsageTotals,
    /// One record per sandbox alive at some time in the range, oldest first.
    pub sandboxes: Vec<SandboxUsage>,
    /// The hash of the last record (zeros when there is none).
    pub head: String,
    /// The node's signature over the report's header and head.
    pub signature: UsageSignature,
}

/// A node's signature of a usage report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct UsageSignature {
    /// The node's public key, `ed25519:<hex>`.
    pub key: String,
    /// Its key id (hex).
    pub key_id: String,
    /// Ed25519 signature (hex) over the canonical JSON of
    /// `{"version", "tenant", "from", "to", "generated_at", "totals", "count", "head"}`.
    pub sig: String,
}
