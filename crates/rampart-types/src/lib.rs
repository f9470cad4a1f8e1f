//! Wire and domain types shared by every Rampart crate.
//!
//! Everything here is plain data, with one exception: [`sockpath`], which opens a directory
//! so a socket at a long path can be bound and reached. Request bodies refuse unknown fields
//! (`deny_unknown_fields`) so a typo in a policy fails closed instead of being ignored.

pub mod approval;
pub mod audit;
pub mod desktop;
pub mod exec;
pub mod files;
pub mod id;
pub mod interactive;
pub mod launch;
pub mod limits;
pub mod network;
pub mod persist;
pub mod ports;
pub mod sandbox;
pub mod sockpath;
pub mod template;
pub mod tenant;

pub use approval::{ApprovalInfo, ApprovalPolicy, Decide, Decision};
pub use exec::{ExecEvent, ExecRequest, ExecResult, OutputBytes, ProcessInfo};
pub use files::{FileEntry, FileList, FileType, FileWatchEvent, Health, MakeDir, MoveFile};
pub use id::{IdError, SandboxId};
pub use interactive::ExecInput;
pub use limits::{LimitError, Limits, LimitsRequest};
pub use network::{
    NetEventKind, NetLogEntry, NetworkLimits, NetworkMode, NetworkPolicy, Precedence, SecretInfo,
    SecretInjection, SecretSpec, UpstreamProxy, UpstreamProxyError, Verdict,
};
pub use persist::{
    CreateSnapshot, CreateVolume, ForkResult, ForkSandbox, SnapshotInfo, VolumeInfo, VolumeMount,
};
pub use ports::{PortInfo, PortList};
pub use sandbox::{
    ApiError, ApiErrorBody, ArtifactList, CreateSandbox, OnTimeout, PauseSandbox, PoolInfo,
    ResumeSandbox, SandboxInfo, SandboxState, SandboxStats, SetTimeout, Tier,
};
pub use template::TemplateInfo;
