//! Sandbox lifecycle types and the API error body.

use crate::{Limits, LimitsRequest, NetworkPolicy, SandboxId, SecretSpec, VolumeMount};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Body of `POST /v1/sandboxes`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSandbox {
    /// Template name; `base` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// The isolation tier it runs on; when absent, its template's, else the node's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<Tier>,
    /// Resource limits; unset fields take the daemon's defaults.
    #[serde(default)]
    pub limits: LimitsRequest,
    /// Environment variables every process in the sandbox starts with.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Free-form labels, returned as given and usable as list filters.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// Seconds until the sandbox is destroyed; the daemon's default (300) when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_secs: Option<u64>,
    /// What happens at the deadline: `destroy` (the default) or `pause`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_timeout: Option<OnTimeout>,
    /// Seconds without a request after which the sandbox sleeps: it is paused (on the
    /// gVisor tier to disk with its memory; on the namespace tier frozen, and paused to its
    /// filesystem once it has slept the node's `idle_cold_secs`), and the next request that
    /// needs it (an exec, a file call, an envd call, a connection to one of its ports) wakes
    /// it and gets its answer. A request in flight (a command being waited for or streamed,
    /// an open port connection) keeps it awake. Absent: it never sleeps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_pause_secs: Option<u64>,
    /// Network policy; `none` (loopback only) when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkPolicy>,
    /// Secrets the egress proxy injects; the sandbox sees placeholders only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<SecretSpec>,
    /// Snapshot to start from (its files over its template); `template` must be absent or
    /// the snapshot's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// Volumes to mount.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VolumeMount>,
    /// Ports (1-65535) reachable through the daemon without the sandbox's access token
    /// (`/v1/sandboxes/{id}/ports/{port}/...`, `{port}-{id}.<domain>`); other ports need it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub public_ports: Vec<u16>,
    /// Commands held for a person's approval before they run (see `approvals` in the API
    /// reference).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approvals: Option<crate::approval::ApprovalPolicy>,
    /// Names of `env` entries whose values are sensitive: the record keeps every exec's
    /// input and output with them replaced by `[REDACTED:<name>]`, and says so in a
    /// `redacted` event.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secret_env: Vec<String>,
    /// Absolute paths inside the sandbox (files or directories) kept when the sandbox ends,
    /// for any reason, as content-addressed blobs listed in its `destroyed` record and
    /// downloadable from `GET /v1/sandboxes/{id}/artifacts` for the node's retention time.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub artifacts: Vec<String>,
}

/// An isolation tier: what stands between a sandbox's code and the host's kernel.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    /// Namespaces, cgroups, seccomp and Landlock on the host's kernel (the default).
    #[default]
    Namespace,
    /// gVisor (`runsc`): the sandbox's system calls are served by a kernel in user space.
    Gvisor,
}

impl Tier {
    /// Every tier.
    pub const ALL: [Tier; 2] = [Tier::Namespace, Tier::Gvisor];
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Namespace => "namespace",
            Tier::Gvisor => "gvisor",
        }
    }
}

impl std::fmt::Display for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Tier {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Tier::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| format!("unknown isolation tier {s:?} (known: namespace, gvisor)"))
    }
}

/// What the reaper does with a sandbox whose deadline passed.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum OnTimeout {
    /// Destroy it (the default).
    #[default]
    Destroy,
    /// Pause it (its processes are frozen, memory kept); a paused sandbox whose deadline
    /// passes again is destroyed.
    Pause,
    /// Pause it to its filesystem: its processes end, its disk is kept, and a resume boots
    /// it again from that disk (a cold boot).
    PauseFilesystem,
}

impl OnTimeout {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            OnTimeout::Destroy => "destroy",
            OnTimeout::Pause => "pause",
            OnTimeout::PauseFilesystem => "pause_filesystem",
        }
    }

    /// Parses a wire name.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "destroy" => Some(OnTimeout::Destroy),
            "pause" => Some(OnTimeout::Pause),
            "pause_filesystem" => Some(OnTimeout::PauseFilesystem),
            _ => None,
        }
    }
}

impl OnTimeout {
    /// Whether the deadline pauses the sandbox (with or without its memory).
    pub fn pauses(self) -> bool {
        matches!(self, OnTimeout::Pause | OnTimeout::PauseFilesystem)
    }
}

/// Body of `POST /v1/sandboxes/{id}/pause` (optional).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PauseSandbox {
    /// Keep the processes and their memory (frozen; the default). `false`: a pause to the
    /// filesystem: every process ends, the disk is kept, and the resume boots the sandbox
    /// again from it.
    #[serde(default = "yes")]
    pub memory: bool,
    /// Pause to disk: every process ends and nothing of the sandbox stays in RAM; with
    /// `memory` (the gVisor tier only; 400 `disk` on another), its processes' memory and
    /// state are saved beside its disk and the resume restores them where they were.
    /// Survives a daemon restart.
    #[serde(default)]
    pub disk: bool,
}

impl Default for PauseSandbox {
    fn default() -> Self {
        PauseSandbox {
            memory: true,
            disk: false,
        }
    }
}

fn yes() -> bool {
    true
}

/// Body of `POST /v1/sandboxes/{id}/resume` (optional).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResumeSandbox {
    /// Boot the sandbox again from its disk instead of thawing its processes (what a
    /// sandbox paused to its filesystem always does): its memory and processes are dropped.
    #[serde(default)]
    pub reboot: bool,
}

/// Body of `POST /v1/sandboxes/{id}/timeout`: the new deadline, counted from now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetTimeout {
    /// Seconds from now until the sandbox is destroyed.
    pub timeout_secs: u64,
}

/// Where a sandbox is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SandboxState {
    /// Being built; not yet usable.
    Creating,
    /// Its agent answers; commands and files work.
    Running,
    /// Its processes are frozen (no CPU, memory kept); resume continues them. Commands and
    /// files answer 409 until then.
    Paused,
    /// Being torn down.
    Stopping,
    /// Gone; kept in the store for history.
    Destroyed,
    /// Creation failed; nothing of it remains on the host.
    Failed,
}

impl SandboxState {
    /// The state's wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxState::Creating => "creating",
            SandboxState::Running => "running",
            SandboxState::Paused => "paused",
            SandboxState::Stopping => "stopping",
            SandboxState::Destroyed => "destroyed",
            SandboxState::Failed => "failed",
        }
    }

    /// Parses a wire name.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "creating" => SandboxState::Creating,
            "running" => SandboxState::Running,
            "paused" => SandboxState::Paused,
            "stopping" => SandboxState::Stopping,
            "destroyed" => SandboxState::Destroyed,
            "failed" => SandboxState::Failed,
            _ => return None,
        })
    }

    /// All states, in lifecycle order.
    pub const ALL: [SandboxState; 6] = [
        SandboxState::Creating,
        SandboxState::Running,
        SandboxState::Paused,
        SandboxState::Stopping,
        SandboxState::Destroyed,
        SandboxState::Failed,
    ];

    /// Whether a sandbox in this state may still hold host resources.
    pub fn is_alive(self) -> bool {
        matches!(
            self,
            SandboxState::Creating
                | SandboxState::Running
                | SandboxState::Paused
                | SandboxState::Stopping
        )
    }
}

/// A sandbox as the API returns it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SandboxInfo {
    /// Its id.
    pub id: SandboxId,
    /// The template it was made from.
    pub template: String,
    /// The isolation tier it runs on.
    #[serde(default)]
    pub isolation: Tier,
    /// Its state.
    pub state: SandboxState,
    /// The resolved limits it runs with.
    pub limits: Limits,
    /// Labels given at create.
    pub metadata: BTreeMap<String, String>,
    /// Names (never values) of the environment variables given at create.
    pub env_names: Vec<String>,
    /// Creation time, RFC 3339.
    pub created_at: String,
    /// The deadline, RFC 3339; the reaper destroys the sandbox then.
    pub expires_at: String,
    /// When it ended, RFC 3339, if it has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<String>,
    /// Why it failed or ended, if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The token that opens its exposed ports (`X-Rampart-Token`); only in the answers of
    /// create and of `GET /v1/sandboxes/{id}` while it is alive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_token: Option<String>,
    /// The tenant it belongs to (absent: the node's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// Seconds without a request after which it sleeps (see
    /// [`CreateSandbox::idle_pause_secs`]); absent: it never sleeps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_pause_secs: Option<u64>,
}

/// `GET /v1/sandboxes/{id}/stats`: one sample of a running sandbox's resource use, from its
/// cgroup. CPU is cumulative: the rate is the difference of two samples over their times.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SandboxStats {
    /// When it was taken, Unix milliseconds.
    pub taken_at_ms: u64,
    /// CPU time used since it started, microseconds.
    pub cpu_usec: u64,
    /// Its CPU limit, vCPUs.
    pub cpus: f64,
    /// Memory in use, bytes.
    pub memory_bytes: u64,
    /// The most it has used, bytes (0 when the host cannot tell).
    pub memory_peak_bytes: u64,
    /// Its memory limit, bytes.
    pub memory_limit_bytes: u64,
    /// Live processes.
    pub pids: u64,
    /// Its process limit.
    pub pids_limit: u64,
}

/// The error body of every `/v1` endpoint: `{"error": {"code", "message"}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ApiErrorBody {
    /// The error.
    pub error: ApiError,
}

/// One error: a stable machine code and a human message that says what to do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ApiError {
    /// Stable code: `bad_request`, `unauthorized`, `forbidden`, `not_found`, `conflict`,
    /// `too_large`, `limit_exceeded`, `quota_exceeded`, `rate_limited`, `capacity`,
    /// `internal`, `timeout`.
    pub code: String,
    /// What went wrong, naming the field where there is one.
    pub message: String,
    /// With `quota_exceeded` and `rate_limited`: the limit, the use and the most.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<crate::tenant::QuotaRefusal>,
}

/// Body of `GET /v1/sandboxes/{id}/artifacts`: the files kept when the sandbox ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ArtifactList {
    /// The sandbox.
    pub sandbox_id: String,
    /// When they were kept (the sandbox's end), RFC 3339 UTC.
    pub kept_at: String,
    /// When they are removed, RFC 3339 UTC.
    pub expires_at: String,
    /// What was kept, as the `destroyed` record lists it.
    #[schema(value_type = Object)]
    pub artifacts: crate::audit::Artifacts,
}

/// A warm pool of a node: sandboxes of one template and tier launched ahead of the creates
/// that claim them (`GET /v1/pools`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PoolInfo {
    /// Template of its sandboxes.
    pub template: String,
    /// Isolation tier of its sandboxes.
    pub isolation: Tier,
    /// The network mode its sandboxes are wired with (`open`); none: no network.
    pub network: Option<String>,
    /// How many it keeps ready.
    pub size: usize,
    /// How many are ready now.
    pub ready: usize,
    /// Launches under way.
    pub filling: usize,
    /// Ids of the ready sandboxes (nobody's until a create claims one).
    pub ids: Vec<String>,
}
