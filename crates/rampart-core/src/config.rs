//! The daemon's configuration of core, with its documented defaults.

use crate::{AuditConfig, NetworkConfig};
use rampart_types::Limits;
use std::path::PathBuf;

/// Daemon configuration.
#[derive(Debug, Clone)]
pub struct CoreConfig {
    /// Data directory: `state.db`, `templates/`, `sandboxes/`.
    pub data_dir: PathBuf,
    /// `rampart-jailer` binary.
    pub jailer_bin: PathBuf,
    /// `rampart-agent` binary.
    pub agent_bin: PathBuf,
    /// Limits applied when a request leaves a field unset.
    pub default_limits: Limits,
    /// The most a request may ask for.
    pub max_limits: Limits,
    /// Timeout when the request gives none (300 s).
    pub default_timeout_secs: u64,
    /// Longest timeout a request may ask for.
    pub max_timeout_secs: u64,
    /// Most sandboxes alive at once (503 beyond).
    pub max_sandboxes: usize,
    /// First host uid of the sandbox uid ranges; sandbox slot `n` gets
    /// `[uid_range_start + n * 65536, +65536)`.
    pub uid_range_start: u32,
    /// Number of slots (ranges) available.
    pub uid_slots: u32,
    /// The audit record: on/off, blob cap, publication interval.
    pub audit: AuditConfig,
    /// Sandbox networks: address pool, nftables table, egress ports.
    pub network: NetworkConfig,
    /// How far the disk quotas of sandboxes, snapshots and volumes may exceed the space the
    /// store can hold (see [`capacity`]); 1.0, the default, admits no overcommit.
    pub disk_overcommit: f64,
    /// Where each request held for approval, and each decision, is posted (none: nowhere).
    pub approvals_webhook: Option<crate::webhook::WebhookConfig>,
    /// Artifacts: how long they are kept, how much of a sandbox is kept.
    pub artifacts: crate::artifacts::ArtifactConfig,
    /// Lifecycle events: how long they are kept, where webhooks may be posted.
    pub events: crate::events::EventsConfig,
    /// How template builds pull `image:` bases (mirrors, insecure registries, allowed
    /// ranges, a CA).
    pub registry: rampart_image::registry::RegistryConfig,
    /// Template builds through the API: log bounds, reservation expiry, per-tenant caps,
    /// step and build timeouts (see [`crate::template_builds::BuildConfig`] for the defaults).
    pub builds: crate::template_builds::BuildConfig,
    /// Warm pools kept at start: sandboxes launched ahead of the creates that claim them
    /// (none by default; see `sandbox::pool`).
    pub warm: Vec<WarmPool>,
    /// The isolation tier of a sandbox whose request and template name none (`namespace`).
    pub default_isolation: rampart_types::Tier,
    /// The gVisor tier: where `runsc` is and which platform it runs on.
    pub gvisor: crate::isolation::GvisorConfig,
    /// The node's name in a fleet (`rampart serve --fleet --node-name`): each sandbox's
    /// record names it (`created.spec.node`). None: a single host.
    pub node_name: Option<String>,
    /// How long a sandbox asleep for its idleness stays frozen (its memory in RAM) before
    /// it is paused to its filesystem, on a tier that cannot save its memory to disk (the
    /// namespace tier); 3600 s by default, None: it stays frozen.
    pub idle_cold_secs: Option<u64>,
}

impl CoreConfig {
    /// A configuration with the documented defaults: default limits of 1 vCPU, 512 MiB,
    /// 1024 pids, 2 GiB disk; maxima of every host CPU, 8 GiB, 32768 pids, 50 GiB disk;
    /// 300 s default and 24 h maximum timeouts; 1024 sandboxes; uid ranges from host uid
    /// 2^29 (536870912), one of 65536 per sandbox slot.
    pub fn with_defaults(data_dir: PathBuf, jailer_bin: PathBuf, agent_bin: PathBuf) -> Self {
        let cpus = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1) as f64;
        CoreConfig {
            data_dir,
            jailer_bin,
            agent_bin,
            default_limits: Limits::default(),
            max_limits: Limits {
                cpus,
                memory_bytes: 8 << 30,
                pids: 32768,
                disk_bytes: 50 << 30,
                open_files: 1 << 20,
            },
            default_timeout_secs: 300,
            max_timeout_secs: 24 * 3600,
            max_sandboxes: 1024,
            uid_range_start: 1 << 29,
            uid_slots: 1024,
            audit: AuditConfig::default(),
            network: NetworkConfig::default(),
            disk_overcommit: 1.0,
            approvals_webhook: None,
            artifacts: Default::default(),
            events: Default::default(),
            registry: Default::default(),
            builds: Default::default(),
            default_isolation: Default::default(),
            warm: Vec::new(),
            gvisor: Default::default(),
            node_name: None,
            idle_cold_secs: Some(3600),
        }
    }
}

/// A warm pool: `size` sandboxes of `template` (on `isolation`, else the template's or the
/// node's tier) kept launched and healthy, nobody's until a create claims one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WarmPool {
    /// Template of its sandboxes.
    pub template: String,
    /// Tier of its sandboxes (none: as a create of the template without one).
    pub isolation: Option<rampart_types::Tier>,
    /// How many it keeps ready.
    pub size: usize,
    /// The network its sandboxes are launched with: `open` (everything but the always
    /// blocked addresses, as an E2B create without network options gets) or none.
    pub network: Option<rampart_types::network::NetworkMode>,
}

impl std::str::FromStr for WarmPool {
    type Err = String;

    /// `TEMPLATE[:TIER][@NETWORK]=SIZE` (`base=16`, `base:gvisor=4`, `base@open=8`).
    fn from_str(s: &str) -> Result<Self, String> {
        let (what, size) = s
            .rsplit_once('=')
            .ok_or_else(|| format!("{s:?}: expected TEMPLATE=SIZE (e.g. base=16)"))?;
        let (what, network) = match what.split_once('@') {
            Some((w, "open")) => (w, Some(rampart_types::network::NetworkMode::Open)),
            Some((w, "none")) => (w, None),
            Some((_, n)) => {
                return Err(format!(
                    "{s:?}: a pool's network is `open` or `none`, not {n:?}"
                ))
            }
            None => (what, None),
        };
        let size: usize = size
            .trim()
            .parse()
            .map_err(|_| format!("{s:?}: the size {size:?} is not a whole number"))?;
        let (template, isolation) = match what.split_once(':') {
            Some((t, tier)) => (
                t,
                Some(
                    tier.trim()
                        .parse::<rampart_types::Tier>()
                        .map_err(|e| format!("{s:?}: {e}"))?,
                ),
            ),
            None => (what, None),
        };
        let template = template.trim();
        if template.is_empty() {
            return Err(format!("{s:?}: no template named"));
        }
        Ok(WarmPool {
            template: template.to_owned(),
            isolation,
            size,
            network,
        })
    }
}
